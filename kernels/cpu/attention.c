/* attention.c — causal multi-head self-attention, llm.c's layout, on sgemm.
 *
 * Per (batch, head), the query rows are taken in blocks of ATT_BLOCK: a block
 * of rows [r0,r1) attends only to keys [0,r1), so each GEMM covers the causal
 * triangle plus at most one block's overhang (about 5/8 of the square at
 * T=256) instead of all T×T scores.  The (b,h) pairs are split statically
 * over the OpenMP threads, each calling single-threaded sgemm. */
#include <cblas.h>
#include <math.h>
#include <omp.h>

#include "cpu_kernels.h"

#define ATT_BLOCK 64

/* Below this much work (B·T·T·C) attention runs on one thread. */
#define ATT_PAR_MIN ((size_t)1 << 17)

/* ---- row softmax ------------------------------------------------------------------- */

/* att[0,n) = softmax(pre[0,n)); att[n,w) = 0.  att may be pre (the decode
 * step works in place): no restrict, each element is read before it is
 * written, and omp simd says the loops carry no dependence. */
KCPU_CLONES static void softmax_row(float *att, const float *pre, int n, int w)
{
    float maxv = -INFINITY;
    KCPU_SIMD_MAX(maxv)
    for (int j = 0; j < n; j++)
        maxv = pre[j] > maxv ? pre[j] : maxv;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n; j++) {
        float e = kcpu_expf(pre[j] - maxv);
        att[j] = e;
        sum += e;
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int j = 0; j < n; j++)
        att[j] *= inv;
    for (int j = n; j < w; j++)
        att[j] = 0.0f;
}

KCPU_CLONES static void softmax_row_backward(float *restrict dpre, const float *restrict att,
                                             const float *restrict datt, int n, int w)
{
    if (datt) {
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int j = 0; j < n; j++)
            dot += att[j] * datt[j];
#pragma omp simd
        for (int j = 0; j < n; j++)
            dpre[j] = att[j] * (datt[j] - dot);
    } else {
        memcpy(dpre, att, (size_t)n * sizeof *dpre);
    }
    for (int j = n; j < w; j++)
        dpre[j] = 0.0f;
}

/* ---- forward ----------------------------------------------------------------------
 * inp (B,T,3C) = q,k,v; out (B,T,C); preatt, att (B,NH,T,T).
 * preatt = q·kᵀ/sqrt(hs) (rows r, columns < the end of r's block);
 * att = causal softmax, zero above the diagonal; out = att·v. */
void kcpu_attention_forward(kern_ctx *k, float *out, float *preatt, float *att, const float *inp, int B, int T,
                            int C, int NH)
{
    kcpu_blas_single();
    int nt = k->threads;
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    const int pairs = B * NH;
    size_t work = (size_t)B * T * T * C;
#pragma omp parallel for num_threads(nt) schedule(static) if (work >= ATT_PAR_MIN)
    for (int bh = 0; bh < pairs; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *q = inp + (size_t)b * T * C3 + (size_t)h * hs;
        const float *kk = q + C, *v = q + 2 * C;
        float *pre = preatt + (size_t)bh * T * T;
        float *a = att + (size_t)bh * T * T;
        float *o = out + (size_t)b * T * C + (size_t)h * hs;
        for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
            int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T, nr = r1 - r0;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, r1, hs, scale, q + (size_t)r0 * C3, C3, kk,
                        C3, 0.0f, pre + (size_t)r0 * T, T);
            for (int t = r0; t < r1; t++)
                softmax_row(a + (size_t)t * T, pre + (size_t)t * T, t + 1, T);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, hs, r1, 1.0f, a + (size_t)r0 * T, T, v, C3,
                        0.0f, o + (size_t)r0 * C, C);
        }
    }
}

/* ---- backward ---------------------------------------------------------------------
 * dout (B,T,C), inp (B,T,3C), att (B,NH,T,T) -> dinp (B,T,3C) +=.
 * dpreatt, datt (B,NH,T,T) are scratch.  att above the diagonal is not read
 * (it is unspecified for other backends): the masked copy for dv goes
 * through dpreatt first. */
void kcpu_attention_backward(kern_ctx *k, float *dinp, float *dpreatt, float *datt, const float *dout,
                             const float *inp, const float *att, int B, int T, int C, int NH)
{
    kcpu_blas_single();
    int nt = k->threads;
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    const int pairs = B * NH;
    size_t work = (size_t)B * T * T * C;
#pragma omp parallel for num_threads(nt) schedule(static) if (work >= ATT_PAR_MIN)
    for (int bh = 0; bh < pairs; bh++) {
        int b = bh / NH, h = bh % NH;
        size_t base = (size_t)b * T * C3 + (size_t)h * hs;
        const float *q = inp + base, *kk = q + C, *v = q + 2 * C;
        float *dq = dinp + base, *dk = dq + C, *dv = dq + 2 * C;
        const float *a = att + (size_t)bh * T * T;
        float *dpre = dpreatt + (size_t)bh * T * T;
        float *da = datt + (size_t)bh * T * T;
        const float *g = dout + (size_t)b * T * C + (size_t)h * hs;
        for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
            int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T, nr = r1 - r0;
            /* dv[0,r1) += att[r0,r1)ᵀ · dout[r0,r1), att masked. */
            for (int t = r0; t < r1; t++)
                softmax_row_backward(dpre + (size_t)t * T, a + (size_t)t * T, NULL, t + 1, r1);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, nr, 1.0f, dpre + (size_t)r0 * T, T,
                        g + (size_t)r0 * C, C, 1.0f, dv, C3);
            /* datt[r0,r1) = dout[r0,r1) · v[0,r1)ᵀ */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, r1, hs, 1.0f, g + (size_t)r0 * C, C, v, C3,
                        0.0f, da + (size_t)r0 * T, T);
            /* through the softmax */
            for (int t = r0; t < r1; t++)
                softmax_row_backward(dpre + (size_t)t * T, a + (size_t)t * T, da + (size_t)t * T, t + 1, r1);
            /* dq[r0,r1) += scale · dpre · k[0,r1);  dk[0,r1) += scale · dpreᵀ · q[r0,r1) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, hs, r1, scale, dpre + (size_t)r0 * T, T, kk,
                        C3, 1.0f, dq + (size_t)r0 * C3, C3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, nr, scale, dpre + (size_t)r0 * T, T,
                        q + (size_t)r0 * C3, C3, 1.0f, dk, C3);
        }
    }
}

/* ---- incremental decoding ---------------------------------------------------------
 * qkv (B,3C): q,k,v of position t = Tc-1 of each sequence; kcache, vcache
 * (B,Tmax,C) hold positions 0..Tc-2 and get the new k, v in row Tc-1;
 * att (B,NH,Tc) scratch; out (B,C).  The scores are one sgemv per (b,h), the
 * weighted sum of v another: the last row of attention_forward, with the
 * causal mask implicit in stopping at Tc. */

void kcpu_attention_decode(kern_ctx *k, float *out, float *att, float *kcache, float *vcache, const float *qkv,
                           int B, int Tc, int Tmax, int C, int NH)
{
    kcpu_blas_single();
    int nt = k->threads;
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    const int pairs = B * NH;
    size_t work = (size_t)B * Tc * C;
    /* Each (b,h) writes only its own head's slice of the new cache rows and
     * reads only its own slices: no thread sees another's writes. */
#pragma omp parallel for num_threads(nt) schedule(static) if (work >= KCPU_PAR_MIN)
    for (int bh = 0; bh < pairs; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *q = qkv + (size_t)b * C3 + (size_t)h * hs;
        float *kk = kcache + (size_t)b * Tmax * C + (size_t)h * hs;
        float *v = vcache + (size_t)b * Tmax * C + (size_t)h * hs;
        size_t last = (size_t)(Tc - 1) * C;
        memcpy(kk + last, q + C, (size_t)hs * sizeof *kk);
        memcpy(v + last, q + 2 * C, (size_t)hs * sizeof *v);
        float *a = att + (size_t)bh * Tc;
        float *o = out + (size_t)b * C + (size_t)h * hs;
        /* a (Tc) = scale · k[0,Tc) · q;  o (hs) = v[0,Tc)ᵀ · softmax(a) */
        cblas_sgemv(CblasRowMajor, CblasNoTrans, Tc, hs, scale, kk, C, q, 1, 0.0f, a, 1);
        softmax_row(a, a, Tc, Tc); /* in place: softmax_row allows att == pre */
        cblas_sgemv(CblasRowMajor, CblasTrans, Tc, hs, 1.0f, v, C, a, 1, 0.0f, o, 1);
    }
}
