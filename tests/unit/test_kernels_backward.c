/* test_kernels_backward.c — what holds across the CPU kernels' backward
 * passes: gradients that accumulate double when backward runs twice, the
 * ones that overwrite give the same bits whatever the buffer held (also in
 * place), and a whole transformer block, forward and backward, is bitwise
 * deterministic for a thread count and within fp32 reassociation across
 * thread counts. */
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

/* ---- accumulation: backward twice doubles every gradient that accumulates ---------------------
 * (matmul's dweight and dbias, layernorm, attention, encoder, accumulate);
 * the activation gradients that are overwritten come out the same twice
 * and may be computed in place (test_overwrites). */

static void assert_doubled(const char *what, const float *once, const float *twice, size_t n)
{
    /* x + x = 2x exactly when the second increment repeats the first; sgemm
     * with beta 1 may add in K-blocks, so allow an fp32 rounding. */
    for (size_t i = 0; i < n; i++)
        if (!(fabs(twice[i] - 2.0 * once[i]) <= 1e-6 * fabs(2.0 * once[i]) + 1e-30)) {
            print_error("%s[%zu]: once %.9g, twice %.9g\n", what, i, once[i], twice[i]);
            fail();
        }
}

static void test_accumulates(void **state)
{
    (void)state;
    kern_ctx *k = ctx(2);
    enum { B = 2, T = 9, C = 8, NH = 2, N = B * T, OC = 12, V = 10 };
    float *inp = randv(N * 3 * C, 1), *dout = randv(N * OC, 1), *w = randv(OC * C, 1);
    float *d1[3], *d2[3];
    /* matmul */
    for (int i = 0; i < 3; i++)
        d1[i] = zerov(OC * C + N * C), d2[i] = zerov(OC * C + N * C);
    for (int r = 0; r < 2; r++)
        ops->matmul_backward(k, d2[0], d2[1], d2[2], dout, inp, w, N, C, OC);
    ops->matmul_backward(k, d1[0], d1[1], d1[2], dout, inp, w, N, C, OC);
    assert_memory_equal(d1[0], d2[0], N * C * sizeof(float)); /* dinp: overwritten */
    assert_doubled("matmul dweight", d1[1], d2[1], OC * C);
    assert_doubled("matmul dbias", d1[2], d2[2], OC);
    /* layernorm */
    float *mean = zerov(N), *rstd = zerov(N), *lo = zerov(N * C), *lw = randv(C, 1), *lb = randv(C, 1);
    ops->layernorm_forward(k, lo, mean, rstd, inp, lw, lb, N, C);
    for (int i = 0; i < 3; i++)
        memset(d1[i], 0, (OC * C + N * C) * sizeof(float)), memset(d2[i], 0, (OC * C + N * C) * sizeof(float));
    ops->layernorm_backward(k, d1[0], d1[1], d1[2], dout, inp, lw, mean, rstd, N, C);
    for (int r = 0; r < 2; r++)
        ops->layernorm_backward(k, d2[0], d2[1], d2[2], dout, inp, lw, mean, rstd, N, C);
    assert_doubled("layernorm dinp", d1[0], d2[0], N * C);
    assert_doubled("layernorm dweight", d1[1], d2[1], C);
    assert_doubled("layernorm dbias", d1[2], d2[2], C);
    /* attention */
    size_t na = (size_t)B * NH * T * T;
    float *pre = zerov(na), *att = zerov(na), *out = zerov(N * C), *s1 = zerov(na), *s2 = zerov(na);
    float *a1 = zerov(N * 3 * C), *a2 = zerov(N * 3 * C);
    ops->attention_forward(k, out, pre, att, inp, B, T, C, NH);
    ops->attention_backward(k, a1, s1, s2, dout, inp, att, B, T, C, NH);
    for (int r = 0; r < 2; r++)
        ops->attention_backward(k, a2, s1, s2, dout, inp, att, B, T, C, NH);
    assert_doubled("attention dinp", a1, a2, N * 3 * C);
    /* encoder */
    int32_t tok[N];
    for (int i = 0; i < N; i++)
        tok[i] = i % 3;
    float *e1 = zerov(V * C + T * C), *e2 = zerov(V * C + T * C);
    ops->encoder_backward(k, e1, e1 + V * C, dout, tok, B, T, C);
    for (int r = 0; r < 2; r++)
        ops->encoder_backward(k, e2, e2 + V * C, dout, tok, B, T, C);
    assert_doubled("encoder", e1, e2, V * C + T * C);
    /* pointwise */
    memset(a1, 0, N * 3 * C * sizeof(float)), memset(a2, 0, N * 3 * C * sizeof(float));
    ops->accumulate(k, a1, dout, N * C);
    for (int r = 0; r < 2; r++)
        ops->accumulate(k, a2, dout, N * C);
    assert_doubled("accumulate", a1, a2, N * C);
    /* (cross-entropy backward overwrites: test_crossentropy_in_place) */

    for (int i = 0; i < 3; i++)
        free(d1[i]), free(d2[i]);
    free(inp), free(dout), free(w), free(mean), free(rstd), free(lo), free(lw), free(lb), free(pre), free(att);
    free(out), free(s1), free(s2), free(a1), free(a2), free(e1), free(e2);
    ops->ctx_destroy(k);
}

/* The activation gradients that backward overwrites: the same bits
 * whatever the buffer held, and for gelu/relu also when computed in place
 * over dout (as the models do), at sizes on both sides of the threading
 * threshold and at unaligned offsets. */
static void test_overwrites(void **state)
{
    (void)state;
    kern_ctx *k = ctx(3);
    static const size_t sizes[] = {37, 300001};
    for (size_t s = 0; s < 2; s++) {
        size_t n = sizes[s];
        float *x = randv(n + 1, 2), *d = randv(n + 1, 1), *a = randv(n + 1, 1), *b = randv(n + 1, 1);
        for (int op = 0; op < 2; op++) {
            void (*bw)(kern_ctx *, float *, const float *, const float *, size_t) =
                op ? ops->relu_backward : ops->gelu_backward;
            for (int off = 0; off < 2; off++) {
                bw(k, a + off, x + off, d + off, n - off);
                bw(k, b + off, x + off, d + off, n - off);
                assert_memory_equal(a + off, b + off, (n - off) * sizeof(float));
                memcpy(b, d, (n + 1) * sizeof(float));
                bw(k, b + off, x + off, b + off, n - off); /* in place over dout */
                assert_memory_equal(a + off, b + off, (n - off) * sizeof(float));
            }
        }
        free(x), free(d), free(a), free(b);
    }
    /* matmul_backward's dinp: a buffer full of garbage gives the same bits as a zeroed one. */
    enum { N = 70, C = 33, OC = 50 };
    float *inp = randv(N * C, 1), *dout = randv(N * OC, 1), *w = randv(OC * C, 1);
    float *z = zerov(N * C), *g = randv(N * C, 1), *dw = zerov(OC * C);
    ops->matmul_backward(k, z, dw, NULL, dout, inp, w, N, C, OC);
    ops->matmul_backward(k, g, dw, NULL, dout, inp, w, N, C, OC);
    assert_memory_equal(z, g, N * C * sizeof(float));
    free(inp), free(dout), free(w), free(z), free(g), free(dw);
    ops->ctx_destroy(k);
}

/* ---- determinism: a transformer block, forward and backward ------------------------------------ */

enum { GB = 2, GT = 70, GC = 64, GNH = 4, GV = 100, GVp = 112, GN = GB * GT };

/* The parameter tensors, carved from one buffer; gradients use the same layout. */
enum { P_WTE, P_WPE, P_LNW, P_LNB, P_WQKV, P_BQKV, P_WPROJ, P_BPROJ, P_WFC, P_BFC, P_WOUT, P_BOUT, P_COUNT };
static const size_t gpt_sizes[P_COUNT] = {GV * GC, GT * GC, GC, GC, 3 * GC * GC, 3 * GC,
                                          GC * GC, GC, 4 * GC * GC, 4 * GC, GC * 4 * GC, GC};
#define GPT_NPARAMS                                                                                           \
    (GV * GC + GT * GC + 2 * GC + 3 * GC * GC + 3 * GC + GC * GC + GC + 4 * GC * GC + 4 * GC + GC * 4 * GC + GC)

static void gpt_carve(float *t[P_COUNT], float *base)
{
    for (int i = 0; i < P_COUNT; i++) {
        t[i] = base;
        base += gpt_sizes[i];
    }
}

/* One block: x = enc; ln; attention (qkv, proj) + residual; MLP (fc, gelu,
 * proj) + residual; tied logits; loss.  Returns the mean loss, writes the
 * gradients of all parameters into grads (zeroed first). */
static double gpt_step(kern_ctx *k, const float *params, float *grads, const int32_t *tok, const int32_t *tgt)
{
    float *P[P_COUNT], *G[P_COUNT];
    gpt_carve(P, (float *)params);
    gpt_carve(G, grads);
    ops->zero(k, grads, GPT_NPARAMS);
    size_t N = GN, na = (size_t)GB * GNH * GT * GT;
    float *x = zerov(N * GC), *ln = zerov(N * GC), *mean = zerov(N), *rstd = zerov(N), *qkv = zerov(N * 3 * GC);
    float *pre = zerov(na), *att = zerov(na), *ao = zerov(N * GC), *pr = zerov(N * GC), *x2 = zerov(N * GC);
    float *fc = zerov(N * 4 * GC), *ge = zerov(N * 4 * GC), *mo = zerov(N * GC), *x3 = zerov(N * GC);
    float *logits = zerov(N * GVp), *lse = zerov(N), *losses = zerov(N), *dloss = zerov(N);
    ops->encoder_forward(k, x, tok, P[P_WTE], P[P_WPE], GB, GT, GC);
    ops->layernorm_forward(k, ln, mean, rstd, x, P[P_LNW], P[P_LNB], GN, GC);
    ops->matmul_forward(k, qkv, ln, P[P_WQKV], P[P_BQKV], GN, GC, 3 * GC);
    ops->attention_forward(k, ao, pre, att, qkv, GB, GT, GC, GNH);
    ops->matmul_forward(k, pr, ao, P[P_WPROJ], P[P_BPROJ], GN, GC, GC);
    ops->residual_forward(k, x2, x, pr, N * GC);
    ops->matmul_forward(k, fc, x2, P[P_WFC], P[P_BFC], GN, GC, 4 * GC);
    ops->gelu_forward(k, ge, fc, N * 4 * GC);
    ops->matmul_forward(k, mo, ge, P[P_WOUT], P[P_BOUT], GN, 4 * GC, GC);
    ops->residual_forward(k, x3, x2, mo, N * GC);
    ops->matmul_forward(k, logits, x3, P[P_WTE], NULL, GN, GC, GV); /* tied, Vp = GV rows of wte... */
    /* ...then spread into the padded layout */
    for (int n = GN - 1; n >= 0; n--)
        memmove(logits + (size_t)n * GVp, logits + (size_t)n * GV, GV * sizeof(float));
    ops->crossentropy_forward(k, losses, lse, logits, tgt, GN, GV, GVp);
    double loss = 0;
    for (size_t i = 0; i < N; i++) {
        loss += losses[i];
        dloss[i] = 1.0f / GN;
    }
    /* backward */
    float *dlogits = logits, *dx3 = zerov(N * GC), *dge = zerov(N * 4 * GC), *dfc = zerov(N * 4 * GC);
    float *dx2 = zerov(N * GC), *dao = zerov(N * GC), *dqkv = zerov(N * 3 * GC), *dln = zerov(N * GC);
    float *dx = zerov(N * GC), *s1 = zerov(na), *s2 = zerov(na);
    ops->crossentropy_backward(k, dlogits, logits, lse, tgt, dloss, GN, GV, GVp); /* in place, as the model */
    for (size_t n = 0; n < N; n++)
        memmove(dlogits + n * GV, dlogits + n * GVp, GV * sizeof(float));
    ops->matmul_backward(k, dx3, G[P_WTE], NULL, dlogits, x3, P[P_WTE], GN, GC, GV);
    ops->accumulate(k, dx2, dx3, N * GC);
    ops->matmul_backward(k, dge, G[P_WOUT], G[P_BOUT], dx3, ge, P[P_WOUT], GN, 4 * GC, GC);
    ops->gelu_backward(k, dfc, fc, dge, N * 4 * GC);
    ops->matmul_backward(k, dx2, G[P_WFC], G[P_BFC], dfc, x2, P[P_WFC], GN, GC, 4 * GC);
    ops->accumulate(k, dx, dx2, N * GC);
    ops->matmul_backward(k, dao, G[P_WPROJ], G[P_BPROJ], dx2, ao, P[P_WPROJ], GN, GC, GC);
    ops->attention_backward(k, dqkv, s1, s2, dao, qkv, att, GB, GT, GC, GNH);
    ops->matmul_backward(k, dln, G[P_WQKV], G[P_BQKV], dqkv, ln, P[P_WQKV], GN, GC, 3 * GC);
    ops->layernorm_backward(k, dx, G[P_LNW], G[P_LNB], dln, x, P[P_LNW], mean, rstd, GN, GC);
    ops->encoder_backward(k, G[P_WTE], G[P_WPE], dx, tok, GB, GT, GC);
    float *bufs[] = {x, ln, mean, rstd, qkv, pre, att, ao, pr, x2, fc, ge, mo, x3, logits, lse, losses, dloss,
                     dx3, dge, dfc, dx2, dao, dqkv, dln, dx, s1, s2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    return loss / GN;
}

static void test_determinism_and_threads(void **state)
{
    (void)state;
    float *params = randv(GPT_NPARAMS, 0.1f);
    int32_t tok[GN], tgt[GN];
    for (int i = 0; i < GN; i++)
        tok[i] = (int32_t)(rng_u32() % GV), tgt[i] = (int32_t)(rng_u32() % GV);
    float *g1 = zerov(GPT_NPARAMS), *g2 = zerov(GPT_NPARAMS), *g3 = zerov(GPT_NPARAMS);
    kern_ctx *k2 = ctx(2), *k1 = ctx(1);
    double l1 = gpt_step(k2, params, g1, tok, tgt);
    double l2 = gpt_step(k2, params, g2, tok, tgt);
    assert_memory_equal(&l1, &l2, sizeof l1);
    assert_memory_equal(g1, g2, GPT_NPARAMS * sizeof(float)); /* bitwise, same thread count */
    double l3 = gpt_step(k1, params, g3, tok, tgt);
    assert_true(fabs(l1 - l3) <= 1e-6 * fabs(l1));
    assert_true(fabs(l1 - log((double)GV)) < 0.5); /* small random weights: near uniform */
    /* 1 vs 2 threads: the same sums in another order, fp32 reassociation
     * only: per tensor, ||g2 - g1|| < 1e-5·||g1||. */
    float *ta[P_COUNT], *tb[P_COUNT];
    gpt_carve(ta, g1);
    gpt_carve(tb, g3);
    for (int t = 0; t < P_COUNT; t++) {
        size_t len = gpt_sizes[t];
        double num = 0, den = 0;
        for (size_t i = 0; i < len; i++) {
            num += ((double)ta[t][i] - tb[t][i]) * ((double)ta[t][i] - tb[t][i]);
            den += (double)tb[t][i] * tb[t][i];
        }
        if (!(den > 0 && sqrt(num / den) < 1e-5)) {
            print_error("gradient tensor %d: 1 vs 2 threads differ by %.3g (norm %.3g)\n", t, sqrt(num), sqrt(den));
            fail();
        }
    }
    free(params), free(g1), free(g2), free(g3);
    ops->ctx_destroy(k1);
    ops->ctx_destroy(k2);
}

int main(void)
{
    ops = kern_cpu_ops();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accumulates),
        cmocka_unit_test(test_overwrites),
        cmocka_unit_test(test_determinism_and_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
