/* llama.c — the Llama layers on the CPU: RMSNorm, rotary embeddings
 * (transformers' rotate_half convention), SwiGLU, and fused causal
 * grouped-query attention with per-token sample starts (packed samples).
 *
 * Threading as the rest of kernels/cpu: static partitions over rows or
 * heads, per-thread partials summed in thread order, so results are
 * bitwise reproducible for a fixed thread count. */
#include <cblas.h>
#include <math.h>
#include <omp.h>

#include "cpu_kernels.h"

/* ---- RMSNorm ----------------------------------------------------------------------
 * inp (N,C), weight (C) -> out (N,C) = inp·rstd·weight, rstd (N). */
KCPU_CLONES static void rms_rows(float *restrict out, float *restrict rstd, const float *restrict inp,
                                 const float *restrict w, size_t lo, size_t hi, int C, float eps)
{
    for (size_t n = lo; n < hi; n++) {
        const float *x = inp + n * C;
        float *y = out + n * C;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int i = 0; i < C; i++)
            s += x[i] * x[i];
        float r = 1.0f / sqrtf(s / C + eps);
#pragma omp simd
        for (int i = 0; i < C; i++)
            y[i] = x[i] * r * w[i];
        rstd[n] = r;
    }
}

void kcpu_rmsnorm_forward(kern_ctx *k, float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                          float eps)
{
    int nt = k->threads;
#pragma omp parallel num_threads(nt) if ((size_t)N * C >= KCPU_PAR_MIN)
    {
        size_t lo, hi;
        kcpu_split((size_t)N, omp_get_thread_num(), omp_get_num_threads(), 1, &lo, &hi);
        rms_rows(out, rstd, inp, weight, lo, hi, C, eps);
    }
}

/* y_i = x_i·r·w_i with r = (mean(x²) + eps)^-1/2, so
 * dx_j = r·w_j·g_j - x_j·r³/C · Σ_i g_i·w_i·x_i and dw_i = Σ_rows g_i·x_i·r.
 * pw NULL (a frozen norm, no dweight): dinp alone, the very same expression. */
static inline float rms_dx(float g, float x, float w, float r, float c)
{
    return r * w * g - x * c;
}

KCPU_CLONES static void rms_rows_backward(float *restrict dinp, float *restrict pw, const float *restrict dout,
                                          const float *restrict inp, const float *restrict w,
                                          const float *restrict rstd, size_t lo, size_t hi, int C)
{
    for (size_t n = lo; n < hi; n++) {
        const float *x = inp + n * C, *g = dout + n * C;
        float *dx = dinp + n * C;
        const float r = rstd[n];
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int i = 0; i < C; i++)
            dot += g[i] * w[i] * x[i];
        const float c = dot * r * r * r / C;
        if (!pw) {
#pragma omp simd
            for (int i = 0; i < C; i++)
                dx[i] += rms_dx(g[i], x[i], w[i], r, c);
            continue;
        }
#pragma omp simd
        for (int i = 0; i < C; i++) {
            pw[i] += g[i] * x[i] * r;
            dx[i] += rms_dx(g[i], x[i], w[i], r, c);
        }
    }
}

void kcpu_rmsnorm_backward(kern_ctx *k, float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, const float *rstd, int N, int C)
{
    int nt = (size_t)N * C >= KCPU_PAR_MIN ? k->threads : 1;
    if (!dweight) {
#pragma omp parallel num_threads(nt)
        {
            size_t lo, hi;
            kcpu_split((size_t)N, omp_get_thread_num(), omp_get_num_threads(), 1, &lo, &hi);
            rms_rows_backward(dinp, NULL, dout, inp, weight, rstd, lo, hi, C);
        }
        return;
    }
    size_t Cp = ((size_t)C + 15) & ~(size_t)15; /* partials on separate cache lines */
    float *part = kcpu_work(k, (size_t)nt * Cp * sizeof(float));
    if (!part) {
        rms_rows_backward(dinp, dweight, dout, inp, weight, rstd, 0, (size_t)N, C);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        float *pw = part + (size_t)tid * Cp;
        memset(pw, 0, Cp * sizeof *pw);
        size_t lo, hi;
        kcpu_split((size_t)N, tid, nth, 1, &lo, &hi);
        rms_rows_backward(dinp, pw, dout, inp, weight, rstd, lo, hi, C);
#pragma omp barrier
        kcpu_split((size_t)C, tid, nth, 16, &lo, &hi);
        for (size_t i = lo; i < hi; i++) {
            float s = 0.0f;
            for (int t = 0; t < nth; t++)
                s += part[(size_t)t * Cp + i];
            dweight[i] += s;
        }
    }
}

/* ---- rotary position embedding ----------------------------------------------------
 * x (N,stride), in place: in each row, heads 0..NHR-1 of HS floats; element
 * i < HS/2 of a head pairs with i + HS/2 and the pair turns by
 * pos·inv_freq[i] (forward) or back by it (backward, dir = -1).  The angle
 * and its cos and sin are fp32, as transformers computes them. */
static void rope_run(kern_ctx *k, float *x, const float *inv_freq, const int32_t *pos, int N, int T, int NHR, int HS,
                     int stride, float dir)
{
    int nt = k->threads;
    const int half = HS / 2;
#pragma omp parallel num_threads(nt) if ((size_t)N * NHR * HS >= KCPU_PAR_MIN)
    {
        size_t lo, hi;
        kcpu_split((size_t)N, omp_get_thread_num(), omp_get_num_threads(), 1, &lo, &hi);
        for (size_t r = lo; r < hi; r++) {
            float p = (float)(pos ? pos[r] : (int32_t)(r % (size_t)T));
            float *row = x + r * (size_t)stride;
            for (int i = 0; i < half; i++) {
                float a = p * inv_freq[i], c = cosf(a), s = dir * sinf(a);
                for (int h = 0; h < NHR; h++) {
                    float *e = row + (size_t)h * HS + i;
                    float x1 = e[0], x2 = e[half];
                    e[0] = x1 * c - x2 * s;
                    e[half] = x2 * c + x1 * s;
                }
            }
        }
    }
}

void kcpu_rope_forward(kern_ctx *k, float *x, const float *inv_freq, const int32_t *pos, int N, int T, int NHR, int HS,
                       int stride)
{
    rope_run(k, x, inv_freq, pos, N, T, NHR, HS, stride, 1.0f);
}

void kcpu_rope_backward(kern_ctx *k, float *dx, const float *inv_freq, const int32_t *pos, int N, int T, int NHR,
                        int HS, int stride)
{
    rope_run(k, dx, inv_freq, pos, N, T, NHR, HS, stride, -1.0f);
}

/* ---- SwiGLU -----------------------------------------------------------------------
 * gu (N,2F) = [gate | up] -> out (N,F) = silu(gate)·up.
 * silu'(g) = σ(g)·(1 + g·(1 - σ(g))). */
KCPU_CLONES static void swiglu_rows(float *restrict out, const float *restrict gu, size_t lo, size_t hi, int F)
{
    for (size_t n = lo; n < hi; n++) {
        const float *g = gu + n * 2 * F, *u = g + F;
        float *o = out + n * F;
#pragma omp simd
        for (int i = 0; i < F; i++)
            o[i] = g[i] / (1.0f + kcpu_expf(-g[i])) * u[i];
    }
}

KCPU_CLONES static void swiglu_rows_backward(float *restrict dgu, const float *restrict gu,
                                             const float *restrict dout, size_t lo, size_t hi, int F)
{
    for (size_t n = lo; n < hi; n++) {
        const float *g = gu + n * 2 * F, *u = g + F, *d = dout + n * F;
        float *dg = dgu + n * 2 * F, *du = dg + F;
#pragma omp simd
        for (int i = 0; i < F; i++) {
            float s = 1.0f / (1.0f + kcpu_expf(-g[i]));
            du[i] = d[i] * g[i] * s;
            dg[i] = d[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
        }
    }
}

void kcpu_swiglu_forward(kern_ctx *k, float *out, const float *gu, int N, int F)
{
    int nt = k->threads;
#pragma omp parallel num_threads(nt) if ((size_t)N * F >= KCPU_PAR_MIN)
    {
        size_t lo, hi;
        kcpu_split((size_t)N, omp_get_thread_num(), omp_get_num_threads(), 1, &lo, &hi);
        swiglu_rows(out, gu, lo, hi, F);
    }
}

void kcpu_swiglu_backward(kern_ctx *k, float *dgu, const float *gu, const float *dout, int N, int F)
{
    int nt = k->threads;
#pragma omp parallel num_threads(nt) if ((size_t)N * F >= KCPU_PAR_MIN)
    {
        size_t lo, hi;
        kcpu_split((size_t)N, omp_get_thread_num(), omp_get_num_threads(), 1, &lo, &hi);
        swiglu_rows_backward(dgu, gu, dout, lo, hi, F);
    }
}

/* ---- grouped-query attention -------------------------------------------------------
 * qkv (B,T,W), W = (NH + 2·KVH)·HS.  Per (batch, head) the query rows go in
 * blocks of GQA_BLOCK; a block's scores cover the key columns from the
 * smallest start in the block to the block's end, in a per-thread scratch
 * of GQA_BLOCK × T (the (T,T) matrix is never stored).  Backward
 * recomputes the probabilities from lse and runs per (batch, key/value
 * head), that head's query heads in order, so the dk and dv sums of a
 * group have one writer and a fixed order. */

#define GQA_BLOCK 64

/* Below this much work (B·T·T·NH·HS) attention runs on one thread. */
#define GQA_PAR_MIN ((size_t)1 << 17)

static inline int row_start(const int32_t *start, int b, int T, int t)
{
    return start ? start[(size_t)b * T + t] : 0;
}

/* The first key column any row of [r0,r1) sees. */
static int block_first(const int32_t *start, int b, int T, int r0, int r1)
{
    int c0 = r0;
    for (int t = r0; t < r1; t++) {
        int s = row_start(start, b, T, t);
        c0 = s < c0 ? s : c0;
    }
    return c0 > 0 ? c0 : 0;
}

/* s[0,n) scaled scores of columns c0.. for a row that sees [s0, t]: the
 * probabilities in place (0 outside the row's span); returns the lse. */
KCPU_CLONES static float softmax_span(float *s, int n, int lo, int hi)
{
    float maxv = -INFINITY;
    KCPU_SIMD_MAX(maxv)
    for (int j = lo; j < hi; j++)
        maxv = s[j] > maxv ? s[j] : maxv;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = lo; j < hi; j++) {
        float e = kcpu_expf(s[j] - maxv);
        s[j] = e;
        sum += e;
    }
    float inv = 1.0f / sum;
    for (int j = 0; j < lo; j++)
        s[j] = 0.0f;
#pragma omp simd
    for (int j = lo; j < hi; j++)
        s[j] *= inv;
    for (int j = hi; j < n; j++)
        s[j] = 0.0f;
    return maxv + logf(sum);
}

/* Out of host memory for scratch: the outputs become NaN, which the
 * trainer's non-finite check reports, rather than stale values. */
static void poison(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
}

void kcpu_attention_gqa_forward(kern_ctx *k, float *out, float *lse, const float *qkv, const int32_t *start, int B,
                                int T, int NH, int KVH, int HS)
{
    kcpu_blas_single();
    const int W = (NH + 2 * KVH) * HS, C = NH * HS, group = NH / KVH;
    const float scale = 1.0f / sqrtf((float)HS);
    const int pairs = B * NH;
    size_t work = (size_t)B * T * T * C;
    int nt = work >= GQA_PAR_MIN ? k->threads : 1;
    size_t per = (size_t)GQA_BLOCK * T;
    float *scratch = kcpu_work(k, (size_t)nt * per * sizeof(float));
    if (!scratch) {
        poison(out, (size_t)B * T * C);
        poison(lse, (size_t)B * NH * T);
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int bh = 0; bh < pairs; bh++) {
        int b = bh / NH, h = bh % NH, g = h / group;
        float *s = scratch + (size_t)omp_get_thread_num() * per;
        const float *row0 = qkv + (size_t)b * T * W;
        const float *q = row0 + (size_t)h * HS, *kk = row0 + (size_t)(NH + g) * HS,
                    *v = row0 + (size_t)(NH + KVH + g) * HS;
        float *o = out + (size_t)b * T * C + (size_t)h * HS;
        float *l = lse + (size_t)bh * T;
        for (int r0 = 0; r0 < T; r0 += GQA_BLOCK) {
            int r1 = r0 + GQA_BLOCK < T ? r0 + GQA_BLOCK : T, nr = r1 - r0;
            int c0 = block_first(start, b, T, r0, r1), nc = r1 - c0;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, nc, HS, scale, q + (size_t)r0 * W, W,
                        kk + (size_t)c0 * W, W, 0.0f, s, nc);
            for (int t = r0; t < r1; t++)
                l[t] = softmax_span(s + (size_t)(t - r0) * nc, nc, row_start(start, b, T, t) - c0, t + 1 - c0);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, HS, nc, 1.0f, s, nc, v + (size_t)c0 * W, W,
                        0.0f, o + (size_t)r0 * C, C);
        }
    }
}

void kcpu_attention_gqa_backward(kern_ctx *k, float *dqkv, const float *dout, const float *out, const float *lse,
                                 const float *qkv, const int32_t *start, int B, int T, int NH, int KVH, int HS)
{
    kcpu_blas_single();
    const int W = (NH + 2 * KVH) * HS, C = NH * HS, group = NH / KVH;
    const float scale = 1.0f / sqrtf((float)HS);
    const int pairs = B * KVH;
    size_t work = (size_t)B * T * T * C;
    int nt = work >= GQA_PAR_MIN ? k->threads : 1;
    size_t per = 2 * (size_t)GQA_BLOCK * T + GQA_BLOCK;
    float *scratch = kcpu_work(k, (size_t)nt * per * sizeof(float));
    if (!scratch) {
        poison(dqkv, (size_t)B * T * W);
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int bg = 0; bg < pairs; bg++) {
        int b = bg / KVH, g = bg % KVH;
        float *p = scratch + (size_t)omp_get_thread_num() * per, *dp = p + (size_t)GQA_BLOCK * T,
              *dsum = dp + (size_t)GQA_BLOCK * T;
        const float *row0 = qkv + (size_t)b * T * W;
        float *drow0 = dqkv + (size_t)b * T * W;
        const float *kk = row0 + (size_t)(NH + g) * HS, *v = row0 + (size_t)(NH + KVH + g) * HS;
        float *dk = drow0 + (size_t)(NH + g) * HS, *dv = drow0 + (size_t)(NH + KVH + g) * HS;
        /* This pair owns its key/value slices and its group's query slices. */
        for (int t = 0; t < T; t++) {
            memset(dk + (size_t)t * W, 0, (size_t)HS * sizeof *dk);
            memset(dv + (size_t)t * W, 0, (size_t)HS * sizeof *dv);
            memset(drow0 + (size_t)t * W + (size_t)g * group * HS, 0, (size_t)group * HS * sizeof *dk);
        }
        for (int h = g * group; h < (g + 1) * group; h++) {
            const float *q = row0 + (size_t)h * HS, *o = out + (size_t)b * T * C + (size_t)h * HS;
            const float *go = dout + (size_t)b * T * C + (size_t)h * HS;
            const float *l = lse + ((size_t)b * NH + h) * T;
            float *dq = drow0 + (size_t)h * HS;
            for (int r0 = 0; r0 < T; r0 += GQA_BLOCK) {
                int r1 = r0 + GQA_BLOCK < T ? r0 + GQA_BLOCK : T, nr = r1 - r0;
                int c0 = block_first(start, b, T, r0, r1), nc = r1 - c0;
                /* p = exp(scale·q·kᵀ - lse) on each row's span, 0 elsewhere */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, nc, HS, scale, q + (size_t)r0 * W, W,
                            kk + (size_t)c0 * W, W, 0.0f, p, nc);
                for (int t = r0; t < r1; t++) {
                    float *pr = p + (size_t)(t - r0) * nc;
                    int lo = row_start(start, b, T, t) - c0, hi = t + 1 - c0;
                    const float m = l[t];
                    for (int j = 0; j < lo; j++)
                        pr[j] = 0.0f;
#pragma omp simd
                    for (int j = lo; j < hi; j++)
                        pr[j] = kcpu_expf(pr[j] - m);
                    for (int j = hi; j < nc; j++)
                        pr[j] = 0.0f;
                    /* D_t = Σ dout_t·out_t = Σ_j p_tj·(dout_t·v_j) */
                    float d = 0.0f;
                    for (int i = 0; i < HS; i++)
                        d += go[(size_t)t * C + i] * o[(size_t)t * C + i];
                    dsum[t - r0] = d;
                }
                /* dv[c0,r1) += pᵀ·dout[r0,r1) */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nc, HS, nr, 1.0f, p, nc, go + (size_t)r0 * C, C,
                            1.0f, dv + (size_t)c0 * W, W);
                /* dp = dout·vᵀ, then ds = p·(dp - D) into dp */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, nc, HS, 1.0f, go + (size_t)r0 * C, C,
                            v + (size_t)c0 * W, W, 0.0f, dp, nc);
                for (int t = 0; t < nr; t++) {
                    float *pr = p + (size_t)t * nc, *dr = dp + (size_t)t * nc;
                    const float d = dsum[t];
#pragma omp simd
                    for (int j = 0; j < nc; j++)
                        dr[j] = pr[j] * (dr[j] - d);
                }
                /* dq[r0,r1) += scale·ds·k;  dk[c0,r1) += scale·dsᵀ·q[r0,r1) */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, HS, nc, scale, dp, nc,
                            kk + (size_t)c0 * W, W, 1.0f, dq + (size_t)r0 * W, W);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nc, HS, nr, scale, dp, nc, q + (size_t)r0 * W,
                            W, 1.0f, dk + (size_t)c0 * W, W);
            }
        }
    }
}

bool kcpu_attention_gqa_ok(kern_ctx *k, int NH, int KVH, int HS)
{
    (void)k;
    return NH > 0 && KVH > 0 && NH % KVH == 0 && HS > 0;
}

/* ---- incremental decoding ----------------------------------------------------------
 * qkv (B,W) of position Tc-1; kcache, vcache (B,Tmax,KVH·HS) get row Tc-1
 * first (a group's query heads all read it, so it is written once, before
 * they run); att (B,NH,Tc) scratch; out (B,NH·HS). */
void kcpu_attention_gqa_decode(kern_ctx *k, float *out, float *att, float *kcache, float *vcache, const float *qkv,
                               int B, int Tc, int Tmax, int NH, int KVH, int HS)
{
    kcpu_blas_single();
    int nt = (size_t)B * Tc * NH * HS >= KCPU_PAR_MIN ? k->threads : 1;
    const int W = (NH + 2 * KVH) * HS, KC = KVH * HS, group = NH / KVH;
    const float scale = 1.0f / sqrtf((float)HS);
    const int pairs = B * NH;
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(static)
        for (int b = 0; b < B; b++) {
            size_t last = ((size_t)b * Tmax + Tc - 1) * KC;
            memcpy(kcache + last, qkv + (size_t)b * W + (size_t)NH * HS, (size_t)KC * sizeof *kcache);
            memcpy(vcache + last, qkv + (size_t)b * W + (size_t)(NH + KVH) * HS, (size_t)KC * sizeof *vcache);
        }
#pragma omp for schedule(static)
        for (int bh = 0; bh < pairs; bh++) {
            int b = bh / NH, h = bh % NH, g = h / group;
            const float *q = qkv + (size_t)b * W + (size_t)h * HS;
            const float *kk = kcache + (size_t)b * Tmax * KC + (size_t)g * HS;
            const float *v = vcache + (size_t)b * Tmax * KC + (size_t)g * HS;
            float *a = att + (size_t)bh * Tc;
            cblas_sgemv(CblasRowMajor, CblasNoTrans, Tc, HS, scale, kk, KC, q, 1, 0.0f, a, 1);
            softmax_span(a, Tc, 0, Tc);
            cblas_sgemv(CblasRowMajor, CblasTrans, Tc, HS, 1.0f, v, KC, a, 1, 0.0f, out + (size_t)b * NH * HS +
                        (size_t)h * HS, 1);
        }
    }
}
