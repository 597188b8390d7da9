/* test_kernels_llama.c — the CPU Llama kernels against references in
 * double written here: RMSNorm, RoPE (explicit positions and pos NULL),
 * SwiGLU, and grouped-query attention with packed samples (values, lse,
 * gradients by central finite differences, the start mask, KVH < NH,
 * decode as the last row of the forward), plus the encoder without a
 * position embedding.  Tolerances: forwards 1e-5 relative to the largest
 * reference value (fp32 sums of O(1) terms over at most a few hundred
 * elements); gradients as kern_check.h states. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels.h"
#include "kern_check.h"

static double maxabs(const double *v, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(v[i]));
    return m;
}

/* ---- RMSNorm -------------------------------------------------------------------------- */

typedef struct {
    kern_ctx *k;
    float *out, *rstd, *inp, *w, *wt;
    int N, C;
} rms_case;

static double rms_loss(void *p)
{
    rms_case *c = p;
    ops->rmsnorm_forward(c->k, c->out, c->rstd, c->inp, c->w, c->N, c->C, 1e-5f);
    return dotd(c->wt, c->out, (size_t)c->N * c->C);
}

static void test_rmsnorm(void **state)
{
    (void)state;
    for (int threads = 1; threads <= 2; threads++) {
        const int N = threads == 1 ? 7 : 300, C = threads == 1 ? 24 : 96; /* 2 threads: over KCPU_PAR_MIN */
        size_t n = (size_t)N * C;
        rms_case c = {ctx(threads), zerov(n), zerov(N), randv(n, 2), randv(C, 1.5), randv(n, 1), N, C};
        rms_loss(&c);
        double *want = malloc(n * sizeof *want), *wr = malloc(N * sizeof *wr);
        for (int r = 0; r < N; r++) {
            double s = 0;
            for (int i = 0; i < C; i++)
                s += (double)c.inp[r * C + i] * c.inp[r * C + i];
            wr[r] = 1.0 / sqrt(s / C + 1e-5);
            for (int i = 0; i < C; i++)
                want[r * C + i] = c.inp[r * C + i] * wr[r] * c.w[i];
        }
        assert_close("rmsnorm out", c.out, want, n, 1e-5, 1e-5 * maxabs(want, n));
        assert_close("rmsnorm rstd", c.rstd, wr, N, 1e-5, 0);
        if (threads == 1) {
            float *dinp = zerov(n), *dw = zerov(C);
            ops->rmsnorm_backward(c.k, dinp, dw, c.wt, c.inp, c.w, c.rstd, N, C);
            check_grad("rmsnorm dinp", c.inp, dinp, n, rms_loss, &c, NULL);
            check_grad("rmsnorm dweight", c.w, dw, C, rms_loss, &c, NULL);
            /* += semantics: a second backward doubles both */
            float *d2 = dupv(dinp, n), *w2 = dupv(dw, C);
            ops->rmsnorm_backward(c.k, dinp, dw, c.wt, c.inp, c.w, c.rstd, N, C);
            for (size_t i = 0; i < n; i++)
                assert_true(fabsf(dinp[i] - 2 * d2[i]) <= 1e-6f * fabsf(d2[i]) + 1e-7f);
            for (int i = 0; i < C; i++)
                assert_true(fabsf(dw[i] - 2 * w2[i]) <= 1e-5f * fabsf(w2[i]) + 1e-6f);
            free(dinp), free(dw), free(d2), free(w2);
        } else {
            /* bitwise reproducible for a fixed thread count */
            float *dinp = zerov(n), *dw = zerov(C), *dinp2 = zerov(n), *dw2 = zerov(C);
            ops->rmsnorm_backward(c.k, dinp, dw, c.wt, c.inp, c.w, c.rstd, N, C);
            ops->rmsnorm_backward(c.k, dinp2, dw2, c.wt, c.inp, c.w, c.rstd, N, C);
            assert_memory_equal(dinp, dinp2, n * sizeof *dinp);
            assert_memory_equal(dw, dw2, C * sizeof *dw);
            free(dinp), free(dw), free(dinp2), free(dw2);
        }
        free(want), free(wr), free(c.out), free(c.rstd), free(c.inp), free(c.w), free(c.wt);
        ops->ctx_destroy(c.k);
    }
}

/* ---- RoPE ----------------------------------------------------------------------------- */

typedef struct {
    kern_ctx *k;
    float *x, *y, *inv, *wt;
    const int32_t *pos;
    int N, T, NHR, HS, stride;
} rope_case;

static double rope_loss(void *p)
{
    rope_case *c = p;
    size_t n = (size_t)c->N * c->stride;
    memcpy(c->y, c->x, n * sizeof *c->y);
    ops->rope_forward(c->k, c->y, c->inv, c->pos, c->N, c->T, c->NHR, c->HS, c->stride);
    return dotd(c->wt, c->y, n);
}

/* Rows of 3 heads of 8 plus 5 floats the op must leave alone; two
 * sequences of T = 6, the second packed as samples [0,2) and [2,6). */
static void test_rope(void **state)
{
    (void)state;
    const int N = 12, T = 6, NHR = 3, HS = 8, stride = NHR * HS + 5;
    size_t n = (size_t)N * stride;
    int32_t seq[12] = {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5}, packed[12] = {0, 1, 2, 3, 4, 5, 0, 1, 0, 1, 2, 3};
    float inv[4];
    for (int i = 0; i < HS / 2; i++)
        inv[i] = (float)pow(10000.0, -2.0 * i / HS);
    for (int threads = 1; threads <= 2; threads++) {
        rope_case c = {ctx(threads), randv(n, 1), zerov(n), inv, randv(n, 1), packed, N, T, NHR, HS, stride};
        rope_loss(&c);
        double *want = malloc(n * sizeof *want);
        for (int r = 0; r < N; r++)
            for (int j = 0; j < stride; j++) {
                size_t e = (size_t)r * stride + j;
                want[e] = c.x[e];
                if (j >= NHR * HS)
                    continue;
                int i = j % HS, half = HS / 2;
                double a = (double)packed[r] * inv[i % half], x1, x2;
                if (i < half) {
                    x1 = c.x[e], x2 = c.x[e + half];
                    want[e] = x1 * cos(a) - x2 * sin(a);
                } else {
                    x1 = c.x[e - half], x2 = c.x[e];
                    want[e] = x2 * cos(a) + x1 * sin(a);
                }
            }
        assert_close("rope out", c.y, want, n, 1e-5, 1e-6);
        for (int r = 0; r < N; r++) /* the floats past the heads are untouched */
            assert_memory_equal(c.y + (size_t)r * stride + NHR * HS, c.x + (size_t)r * stride + NHR * HS,
                                5 * sizeof(float));
        /* pos NULL is position r % T, bitwise */
        float *y2 = dupv(c.x, n), *y3 = dupv(c.x, n);
        ops->rope_forward(c.k, y2, inv, NULL, N, T, NHR, HS, stride);
        ops->rope_forward(c.k, y3, inv, seq, N, T, NHR, HS, stride);
        assert_memory_equal(y2, y3, n * sizeof *y2);
        /* backward: the gradient of Σ wt·rope(x) */
        float *g = dupv(c.wt, n);
        ops->rope_backward(c.k, g, inv, packed, N, T, NHR, HS, stride);
        check_grad("rope dx", c.x, g, n, rope_loss, &c, NULL);
        /* and it undoes the forward */
        double *back = malloc(n * sizeof *back);
        for (size_t i = 0; i < n; i++)
            back[i] = c.x[i];
        ops->rope_backward(c.k, c.y, inv, packed, N, T, NHR, HS, stride);
        assert_close("rope backward(forward(x))", c.y, back, n, 1e-5, 1e-6);
        free(want), free(y2), free(y3), free(g), free(back), free(c.x), free(c.y), free(c.wt);
        ops->ctx_destroy(c.k);
    }
}

/* ---- SwiGLU --------------------------------------------------------------------------- */

typedef struct {
    kern_ctx *k;
    float *out, *gu, *wt;
    int N, F;
} swiglu_case;

static double swiglu_loss(void *p)
{
    swiglu_case *c = p;
    ops->swiglu_forward(c->k, c->out, c->gu, c->N, c->F);
    return dotd(c->wt, c->out, (size_t)c->N * c->F);
}

static void test_swiglu(void **state)
{
    (void)state;
    const int N = 9, F = 20;
    size_t n = (size_t)N * F;
    swiglu_case c = {ctx(1), zerov(n), randv(2 * n, 4), randv(n, 1), N, F};
    swiglu_loss(&c);
    double *want = malloc(n * sizeof *want);
    for (int r = 0; r < N; r++)
        for (int i = 0; i < F; i++) {
            double g = c.gu[r * 2 * F + i], u = c.gu[r * 2 * F + F + i];
            want[r * F + i] = g / (1 + exp(-g)) * u;
        }
    assert_close("swiglu out", c.out, want, n, 1e-5, 1e-6);
    float *dgu = randv(2 * n, 1); /* overwritten */
    ops->swiglu_backward(c.k, dgu, c.gu, c.wt, N, F);
    check_grad("swiglu dgu", c.gu, dgu, 2 * n, swiglu_loss, &c, NULL);
    free(want), free(dgu), free(c.out), free(c.gu), free(c.wt);
    ops->ctx_destroy(c.k);
}

/* ---- grouped-query attention ----------------------------------------------------------- */

typedef struct {
    kern_ctx *k;
    float *out, *lse, *qkv, *wt;
    const int32_t *start;
    int B, T, NH, KVH, HS;
} gqa_case;

static double gqa_loss(void *p)
{
    gqa_case *c = p;
    ops->attention_gqa_forward(c->k, c->out, c->lse, c->qkv, c->start, c->B, c->T, c->NH, c->KVH, c->HS);
    return dotd(c->wt, c->out, (size_t)c->B * c->T * c->NH * c->HS);
}

/* Attention in double, row by row: query head h reads key/value head
 * h / (NH/KVH); row t sees keys start[t]..t. */
static void gqa_reference(double *out, double *lse, const float *qkv, const int32_t *start, int B, int T, int NH,
                          int KVH, int HS)
{
    const int W = (NH + 2 * KVH) * HS, C = NH * HS;
    double *s = malloc(T * sizeof *s);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            int g = h / (NH / KVH);
            for (int t = 0; t < T; t++) {
                int s0 = start ? start[b * T + t] : 0;
                const float *q = qkv + ((size_t)b * T + t) * W + h * HS;
                double mx = -INFINITY, sum = 0;
                for (int u = s0; u <= t; u++) {
                    const float *kk = qkv + ((size_t)b * T + u) * W + (NH + g) * HS;
                    double d = 0;
                    for (int i = 0; i < HS; i++)
                        d += (double)q[i] * kk[i];
                    s[u] = d / sqrt(HS);
                    mx = fmax(mx, s[u]);
                }
                for (int u = s0; u <= t; u++)
                    sum += exp(s[u] - mx);
                lse[((size_t)b * NH + h) * T + t] = mx + log(sum);
                double *o = out + ((size_t)b * T + t) * C + h * HS;
                for (int i = 0; i < HS; i++)
                    o[i] = 0;
                for (int u = s0; u <= t; u++) {
                    const float *v = qkv + ((size_t)b * T + u) * W + (NH + KVH + g) * HS;
                    for (int i = 0; i < HS; i++)
                        o[i] += exp(s[u] - mx) / sum * v[i];
                }
            }
        }
    free(s);
}

/* Samples of the given lengths one after another in each sequence. */
static int32_t *packed_starts(int B, int T, const int *lens)
{
    int32_t *st = malloc((size_t)B * T * sizeof *st);
    for (int b = 0; b < B; b++) {
        int t = 0;
        for (int s = 0; t < T; s++) {
            int len = lens[s] ? lens[s] : T - t;
            for (int i = 0; i < len && t < T; i++)
                st[b * T + t + i] = t;
            t += len;
        }
    }
    return st;
}

typedef struct {
    int B, T, NH, KVH, HS;
    int lens[4]; /* packed sample lengths, 0 ends; all 0: start NULL */
} gqa_shape;

/* T = 70 crosses the 64-row blocks; a packed sample starts inside the
 * second block. */
static const gqa_shape shapes[] = {
    {2, 5, 4, 2, 4, {0}},   {2, 9, 4, 1, 6, {3, 4, 0}}, {1, 70, 6, 2, 8, {40, 26, 0}},
    {2, 70, 2, 2, 4, {0}},  {1, 70, 4, 4, 8, {66, 0}},
};

static void test_gqa_forward(void **state)
{
    (void)state;
    for (int threads = 1; threads <= 2; threads++) {
        kern_ctx *k = ctx(threads);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const gqa_shape *sh = &shapes[s];
            int B = sh->B, T = sh->T, NH = sh->NH, KVH = sh->KVH, HS = sh->HS;
            size_t nq = (size_t)B * T * (NH + 2 * KVH) * HS, no = (size_t)B * T * NH * HS, nl = (size_t)B * NH * T;
            int32_t *st = sh->lens[0] ? packed_starts(B, T, sh->lens) : NULL;
            float *qkv = randv(nq, 2), *out = zerov(no), *lse = zerov(nl);
            double *wo = malloc(no * sizeof *wo), *wl = malloc(nl * sizeof *wl);
            ops->attention_gqa_forward(k, out, lse, qkv, st, B, T, NH, KVH, HS);
            gqa_reference(wo, wl, qkv, st, B, T, NH, KVH, HS);
            assert_close("gqa out", out, wo, no, 1e-5, 1e-5 * maxabs(wo, no));
            assert_close("gqa lse", lse, wl, nl, 1e-5, 1e-5);
            /* bitwise reproducible */
            float *out2 = zerov(no), *lse2 = zerov(nl);
            ops->attention_gqa_forward(k, out2, lse2, qkv, st, B, T, NH, KVH, HS);
            assert_memory_equal(out, out2, no * sizeof *out);
            assert_memory_equal(lse, lse2, nl * sizeof *lse);
            if (!st) { /* start all 0 is start NULL, bitwise */
                int32_t *z = calloc((size_t)B * T, sizeof *z);
                ops->attention_gqa_forward(k, out2, lse2, qkv, z, B, T, NH, KVH, HS);
                assert_memory_equal(out, out2, no * sizeof *out);
                free(z);
            }
            free(st), free(qkv), free(out), free(lse), free(wo), free(wl), free(out2), free(lse2);
        }
        ops->ctx_destroy(k);
    }
}

/* Packed samples never see each other: changing every token of the other
 * samples leaves a sample's outputs bitwise as they were (their
 * probabilities are exact zeros). */
static void test_gqa_mask(void **state)
{
    (void)state;
    const int B = 1, T = 70, NH = 4, KVH = 2, HS = 8, W = (NH + 2 * KVH) * HS, lens[] = {20, 30, 0};
    size_t nq = (size_t)B * T * W, no = (size_t)B * T * NH * HS;
    int32_t *st = packed_starts(B, T, lens);
    kern_ctx *k = ctx(2);
    float *qkv = randv(nq, 2), *out = zerov(no), *lse = zerov((size_t)NH * T), *out2 = zerov(no);
    ops->attention_gqa_forward(k, out, lse, qkv, st, B, T, NH, KVH, HS);
    for (int t = 0; t < T; t++)
        if (t < 20 || t >= 50)
            for (int i = 0; i < W; i++)
                qkv[(size_t)t * W + i] = 100.0f * rng_f();
    ops->attention_gqa_forward(k, out2, lse, qkv, st, B, T, NH, KVH, HS);
    assert_memory_equal(out + 20 * NH * HS, out2 + 20 * NH * HS, 30 * NH * HS * sizeof *out);
    free(st), free(qkv), free(out), free(lse), free(out2);
    ops->ctx_destroy(k);
}

static void test_gqa_grad(void **state)
{
    (void)state;
    for (size_t s = 0; s < 3; s++) {
        const gqa_shape *sh = &shapes[s];
        int B = sh->B, T = sh->T, NH = sh->NH, KVH = sh->KVH, HS = sh->HS;
        size_t nq = (size_t)B * T * (NH + 2 * KVH) * HS, no = (size_t)B * T * NH * HS, nl = (size_t)B * NH * T;
        int32_t *st = sh->lens[0] ? packed_starts(B, T, sh->lens) : NULL;
        gqa_case c = {ctx(2), zerov(no), zerov(nl), randv(nq, 1.5), randv(no, 1), st, B, T, NH, KVH, HS};
        gqa_loss(&c);
        float *dqkv = randv(nq, 1); /* overwritten */
        ops->attention_gqa_backward(c.k, dqkv, c.wt, c.out, c.lse, c.qkv, st, B, T, NH, KVH, HS);
        check_grad("gqa dqkv", c.qkv, dqkv, nq, gqa_loss, &c, NULL);
        float *d2 = randv(nq, 1);
        ops->attention_gqa_backward(c.k, d2, c.wt, c.out, c.lse, c.qkv, st, B, T, NH, KVH, HS);
        assert_memory_equal(dqkv, d2, nq * sizeof *d2);
        free(st), free(dqkv), free(d2), free(c.out), free(c.lse), free(c.qkv), free(c.wt);
        ops->ctx_destroy(c.k);
    }
}

/* attention_gqa_decode at Tc is the last row of the forward over Tc
 * positions; it writes cache row Tc-1 and nothing past it. */
static void test_gqa_decode(void **state)
{
    (void)state;
    static const int tcs[] = {1, 2, 7, 65, 70};
    const int B = 2, NH = 6, KVH = 2, HS = 8, W = (NH + 2 * KVH) * HS, KC = KVH * HS, C = NH * HS, Tmax = 72;
    for (int threads = 1; threads <= 2; threads++) {
        kern_ctx *k = ctx(threads);
        for (size_t i = 0; i < sizeof tcs / sizeof tcs[0]; i++) {
            int Tc = tcs[i];
            size_t nq = (size_t)B * Tc * W, nc = (size_t)B * Tmax * KC;
            float *qkv = randv(nq, 2), *out = zerov((size_t)B * Tc * C), *lse = zerov((size_t)B * NH * Tc);
            float *kc = malloc(nc * sizeof *kc), *vc = malloc(nc * sizeof *vc), *last = zerov((size_t)B * W);
            float *dout = zerov((size_t)B * C), *att = zerov((size_t)B * NH * Tc);
            for (size_t j = 0; j < nc; j++)
                kc[j] = vc[j] = NAN;
            for (int b = 0; b < B; b++) {
                const float *rows = qkv + (size_t)b * Tc * W;
                for (int t = 0; t < Tc - 1; t++) {
                    memcpy(kc + ((size_t)b * Tmax + t) * KC, rows + (size_t)t * W + C, KC * sizeof(float));
                    memcpy(vc + ((size_t)b * Tmax + t) * KC, rows + (size_t)t * W + C + KC, KC * sizeof(float));
                }
                memcpy(last + (size_t)b * W, rows + (size_t)(Tc - 1) * W, W * sizeof(float));
            }
            ops->attention_gqa_forward(k, out, lse, qkv, NULL, B, Tc, NH, KVH, HS);
            ops->attention_gqa_decode(k, dout, att, kc, vc, last, B, Tc, Tmax, NH, KVH, HS);
            double *want = malloc((size_t)B * C * sizeof *want);
            for (int b = 0; b < B; b++)
                for (int j = 0; j < C; j++)
                    want[b * C + j] = out[((size_t)b * Tc + Tc - 1) * C + j];
            assert_close("gqa decode out", dout, want, (size_t)B * C, 1e-5, 1e-5 * maxabs(want, (size_t)B * C));
            for (int b = 0; b < B; b++) {
                assert_memory_equal(kc + ((size_t)b * Tmax + Tc - 1) * KC, last + (size_t)b * W + C,
                                    KC * sizeof(float));
                assert_memory_equal(vc + ((size_t)b * Tmax + Tc - 1) * KC, last + (size_t)b * W + C + KC,
                                    KC * sizeof(float));
                for (size_t j = ((size_t)b * Tmax + Tc) * KC; j < (size_t)(b + 1) * Tmax * KC; j++)
                    assert_true(isnan(kc[j]) && isnan(vc[j]));
            }
            free(qkv), free(out), free(lse), free(kc), free(vc), free(last), free(dout), free(att), free(want);
        }
        ops->ctx_destroy(k);
    }
}

/* ---- encoder without a position embedding ---------------------------------------------- */

static void test_encoder_no_wpe(void **state)
{
    (void)state;
    const int B = 2, T = 3, C = 8, V = 5;
    int32_t inp[6] = {4, 0, 4, 1, 2, 4};
    kern_ctx *k = ctx(1);
    float *wte = randv((size_t)V * C, 1), *out = zerov((size_t)B * T * C), *dout = randv((size_t)B * T * C, 1);
    float *dwte = zerov((size_t)V * C);
    ops->encoder_forward(k, out, inp, wte, NULL, B, T, C);
    for (int r = 0; r < B * T; r++)
        assert_memory_equal(out + r * C, wte + inp[r] * C, C * sizeof(float));
    ops->encoder_backward(k, dwte, NULL, dout, inp, B, T, C);
    double want[40] = {0};
    for (int r = 0; r < B * T; r++)
        for (int i = 0; i < C; i++)
            want[inp[r] * C + i] += dout[r * C + i];
    assert_close("encoder dwte", dwte, want, (size_t)V * C, 1e-6, 1e-7);
    free(wte), free(out), free(dout), free(dwte);
    ops->ctx_destroy(k);
}

int main(void)
{
    ops = kern_cpu_ops();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm),     cmocka_unit_test(test_rope),      cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_gqa_forward), cmocka_unit_test(test_gqa_mask),  cmocka_unit_test(test_gqa_grad),
        cmocka_unit_test(test_gqa_decode),  cmocka_unit_test(test_encoder_no_wpe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
