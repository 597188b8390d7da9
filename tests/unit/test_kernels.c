/* test_kernels.c — the CPU kernels: forward against naive references,
 * backward against central finite differences, accumulation, AdamW, casts,
 * and bitwise determinism for a fixed thread count.
 *
 * Gradient checks.  For an op f and random weights w, the scalar loss is
 * L = Σ w ⊙ f(x), summed in double; the analytic gradient is the op's
 * backward with dout = w.  The numeric one is (L(x+h) - L(x-h)) / (2h) with
 * h = 1e-2 (the actual float difference of the perturbed inputs is used).
 * With fp32 forwards of O(1) values, rounding in L is ~1e-7 relative, i.e.
 * ~1e-5 in the quotient, and the O(h²) truncation is ~1e-5 relative; the
 * worst errors measured are 2e-5·max|g| and 1.5e-4 relative.  An element
 * passes when |analytic - numeric| <= 1e-3·max(|a|,|n|) + 2e-4·max_j |n_j|,
 * tight enough to catch a 0.5% error in a derivative term. */
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

#define FD_H 1e-2
#define FD_RTOL 1e-3
#define FD_ATOL_FRAC 2e-4

static const kern_ops *ops;

/* ---- helpers ---------------------------------------------------------------------- */

static uint64_t rng_state = 0x243F6A8885A308D3ull;

static uint32_t rng_u32(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}

/* uniform in [-1, 1) */
static float rng_f(void)
{
    return (float)((rng_u32() >> 8) * (1.0 / 8388608.0) - 1.0);
}

static float *randv(size_t n, float scale)
{
    float *p = malloc(n * sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = scale * rng_f();
    return p;
}

static float *zerov(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}

static float *dupv(const float *src, size_t n)
{
    float *p = malloc(n * sizeof *p);
    assert_non_null(p);
    memcpy(p, src, n * sizeof *p);
    return p;
}

static double dotd(const float *a, const float *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

/* max_i |got - want| <= atol + rtol·|want| */
static void assert_close(const char *what, const float *got, const double *want, size_t n, double rtol,
                         double atol)
{
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        if (!(err <= atol + rtol * fabs(want[i]))) {
            print_error("%s[%zu]: got %.9g want %.9g (err %.3g)\n", what, i, got[i], want[i], err);
            fail();
        }
    }
}

/* ---- finite differences -------------------------------------------------------------- */

typedef double (*loss_fn)(void *c);

/* Compares analytic (n) with the central difference of loss over x (n).
 * `skip` (may be NULL) marks elements where the loss is not differentiable. */
static void check_grad(const char *what, float *x, const float *analytic, size_t n, loss_fn loss, void *c,
                       const unsigned char *skip)
{
    double *num = malloc(n * sizeof *num);
    assert_non_null(num);
    double scale = 0.0;
    for (size_t i = 0; i < n; i++) {
        float x0 = x[i];
        float xp = (float)(x0 + FD_H), xm = (float)(x0 - FD_H);
        x[i] = xp;
        double lp = loss(c);
        x[i] = xm;
        double lm = loss(c);
        x[i] = x0;
        num[i] = (lp - lm) / ((double)xp - (double)xm);
        if (fabs(num[i]) > scale)
            scale = fabs(num[i]);
    }
    loss(c); /* leave the forward state as it was */
    double atol = FD_ATOL_FRAC * scale;
    for (size_t i = 0; i < n; i++) {
        if (skip && skip[i])
            continue;
        double a = analytic[i], err = fabs(a - num[i]);
        double tol = FD_RTOL * fmax(fabs(a), fabs(num[i])) + atol;
        if (!(err <= tol)) {
            print_error("%s: d[%zu] analytic %.7g numeric %.7g (err %.3g > tol %.3g)\n", what, i, a, num[i], err,
                        tol);
            free(num);
            fail();
        }
    }
    free(num);
}

static kern_ctx *ctx(int threads)
{
    kern_ctx *k = ops->ctx_create(threads, 0, KERN_FP32, NULL);
    assert_non_null(k);
    return k;
}

/* ---- matmul ------------------------------------------------------------------------- */

typedef struct {
    kern_ctx *k;
    float *out, *inp, *w, *b, *wt;
    int N, C, OC;
} mm_case;

static double mm_loss(void *p)
{
    mm_case *c = p;
    ops->matmul_forward(c->k, c->out, c->inp, c->w, c->b, c->N, c->C, c->OC);
    return dotd(c->wt, c->out, (size_t)c->N * c->OC);
}

static void mm_reference(double *out, const float *inp, const float *w, const float *b, int N, int C, int OC)
{
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = b ? b[o] : 0.0;
            for (int i = 0; i < C; i++)
                s += (double)inp[n * C + i] * w[o * C + i];
            out[n * OC + o] = s;
        }
}

/* Forward against the triple loop, on shapes that take each path: serial,
 * split by rows, split by columns (few rows), with and without bias. */
static void test_matmul_forward(void **state)
{
    (void)state;
    static const int shapes[][3] = {{5, 7, 6}, {128, 64, 96}, {3, 300, 200}, {257, 33, 65}};
    for (int threads = 1; threads <= 3; threads++) {
        kern_ctx *k = ctx(threads);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int N = shapes[s][0], C = shapes[s][1], OC = shapes[s][2];
            float *inp = randv((size_t)N * C, 1), *w = randv((size_t)OC * C, 1), *b = randv(OC, 1);
            float *out = zerov((size_t)N * OC);
            double *want = malloc((size_t)N * OC * sizeof *want);
            for (int withb = 0; withb < 2; withb++) {
                ops->matmul_forward(k, out, inp, w, withb ? b : NULL, N, C, OC);
                mm_reference(want, inp, w, withb ? b : NULL, N, C, OC);
                /* fp32 dot products of length C <= 300 of O(1) terms */
                assert_close("matmul out", out, want, (size_t)N * OC, 1e-5, 1e-4);
            }
            free(inp), free(w), free(b), free(out), free(want);
        }
        ops->ctx_destroy(k);
    }
}

static void matmul_grad_case(int N, int C, int OC, int with_bias, int with_dinp)
{
    kern_ctx *k = ctx(2);
    mm_case c = {k, zerov((size_t)N * OC), randv((size_t)N * C, 1), randv((size_t)OC * C, 1),
                 with_bias ? randv(OC, 1) : NULL, randv((size_t)N * OC, 1), N, C, OC};
    float *dinp = with_dinp ? zerov((size_t)N * C) : NULL, *dw = zerov((size_t)OC * C);
    float *db = with_bias ? zerov(OC) : NULL;
    mm_loss(&c);
    ops->matmul_backward(k, dinp, dw, db, c.wt, c.inp, c.w, N, C, OC);
    if (dinp)
        check_grad("matmul dinp", c.inp, dinp, (size_t)N * C, mm_loss, &c, NULL);
    check_grad("matmul dweight", c.w, dw, (size_t)OC * C, mm_loss, &c, NULL);
    if (db)
        check_grad("matmul dbias", c.b, db, OC, mm_loss, &c, NULL);
    free(c.out), free(c.inp), free(c.w), free(c.b), free(c.wt), free(dinp), free(dw), free(db);
    ops->ctx_destroy(k);
}

static void test_matmul_grad(void **state)
{
    (void)state;
    matmul_grad_case(5, 7, 6, 1, 1);
    matmul_grad_case(4, 9, 3, 0, 1); /* no bias */
    matmul_grad_case(6, 5, 8, 1, 0); /* no dinp */
}

/* Backward on shapes large enough to be split over threads, against the
 * formulas in double. */
static void test_matmul_backward_reference(void **state)
{
    (void)state;
    static const int shapes[][3] = {{128, 64, 96}, {3, 300, 200}, {200, 200, 5}};
    kern_ctx *k = ctx(2);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], C = shapes[s][1], OC = shapes[s][2];
        float *inp = randv((size_t)N * C, 1), *w = randv((size_t)OC * C, 1), *dout = randv((size_t)N * OC, 1);
        float *dinp = randv((size_t)N * C, 1), *dw = randv((size_t)OC * C, 1), *db = randv(OC, 1);
        double *wi = malloc((size_t)N * C * sizeof *wi), *ww = malloc((size_t)OC * C * sizeof *ww);
        double *wb = malloc(OC * sizeof *wb);
        for (int n = 0; n < N; n++)
            for (int i = 0; i < C; i++) {
                double s2 = 0; /* dinp is overwritten: what it held must not show */
                for (int o = 0; o < OC; o++)
                    s2 += (double)dout[n * OC + o] * w[o * C + i];
                wi[n * C + i] = s2;
            }
        for (int o = 0; o < OC; o++) {
            for (int i = 0; i < C; i++) {
                double s2 = dw[o * C + i];
                for (int n = 0; n < N; n++)
                    s2 += (double)dout[n * OC + o] * inp[n * C + i];
                ww[o * C + i] = s2;
            }
            double s3 = db[o];
            for (int n = 0; n < N; n++)
                s3 += dout[n * OC + o];
            wb[o] = s3;
        }
        ops->matmul_backward(k, dinp, dw, db, dout, inp, w, N, C, OC);
        assert_close("matmul dinp", dinp, wi, (size_t)N * C, 1e-5, 1e-4);
        assert_close("matmul dweight", dw, ww, (size_t)OC * C, 1e-5, 1e-4);
        assert_close("matmul dbias", db, wb, OC, 1e-5, 1e-4);
        free(inp), free(w), free(dout), free(dinp), free(dw), free(db), free(wi), free(ww), free(wb);
    }
    ops->ctx_destroy(k);
}

/* ---- encoder ------------------------------------------------------------------------- */

typedef struct {
    kern_ctx *k;
    float *out, *wte, *wpe, *wt;
    int32_t *inp;
    int B, T, C;
} enc_case;

static double enc_loss(void *p)
{
    enc_case *c = p;
    ops->encoder_forward(c->k, c->out, c->inp, c->wte, c->wpe, c->B, c->T, c->C);
    return dotd(c->wt, c->out, (size_t)c->B * c->T * c->C);
}

static void test_encoder(void **state)
{
    (void)state;
    enum { B = 2, T = 3, C = 4, V = 5 };
    kern_ctx *k = ctx(2);
    int32_t inp[B * T] = {1, 4, 1, 1, 0, 4}; /* repeated tokens collide in dwte */
    enc_case c = {k, zerov(B * T * C), randv(V * C, 1), randv(T * C, 1), randv(B * T * C, 1), inp, B, T, C};
    enc_loss(&c);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < C; i++)
                assert_true(c.out[(b * T + t) * C + i] == c.wte[inp[b * T + t] * C + i] + c.wpe[t * C + i]);
    float *dwte = zerov(V * C), *dwpe = zerov(T * C);
    ops->encoder_backward(k, dwte, dwpe, c.wt, inp, B, T, C);
    check_grad("encoder dwte", c.wte, dwte, V * C, enc_loss, &c, NULL);
    check_grad("encoder dwpe", c.wpe, dwpe, T * C, enc_loss, &c, NULL);
    free(c.out), free(c.wte), free(c.wpe), free(c.wt), free(dwte), free(dwpe);
    ops->ctx_destroy(k);
}

/* Large enough to split the channels over threads; against sums in double. */
static void test_encoder_backward_reference(void **state)
{
    (void)state;
    enum { B = 4, T = 64, C = 96, V = 7 };
    kern_ctx *k = ctx(3);
    int32_t *inp = malloc(B * T * sizeof *inp);
    for (int i = 0; i < B * T; i++)
        inp[i] = (int32_t)(rng_u32() % V);
    float *dout = randv(B * T * C, 1), *dwte = randv(V * C, 1), *dwpe = randv(T * C, 1);
    double *wte = malloc(V * C * sizeof *wte), *wpe = malloc(T * C * sizeof *wpe);
    for (int i = 0; i < V * C; i++)
        wte[i] = dwte[i];
    for (int i = 0; i < T * C; i++)
        wpe[i] = dwpe[i];
    for (int bt = 0; bt < B * T; bt++)
        for (int i = 0; i < C; i++) {
            wte[inp[bt] * C + i] += dout[bt * C + i];
            wpe[(bt % T) * C + i] += dout[bt * C + i];
        }
    ops->encoder_backward(k, dwte, dwpe, dout, inp, B, T, C);
    assert_close("encoder dwte", dwte, wte, V * C, 1e-5, 1e-5);
    assert_close("encoder dwpe", dwpe, wpe, T * C, 1e-5, 1e-5);
    free(inp), free(dout), free(dwte), free(dwpe), free(wte), free(wpe);
    ops->ctx_destroy(k);
}

/* ---- layernorm ------------------------------------------------------------------------ */

typedef struct {
    kern_ctx *k;
    float *out, *mean, *rstd, *inp, *w, *b, *wt;
    int N, C;
} ln_case;

static double ln_loss(void *p)
{
    ln_case *c = p;
    ops->layernorm_forward(c->k, c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C);
    return dotd(c->wt, c->out, (size_t)c->N * c->C);
}

static void test_layernorm_forward(void **state)
{
    (void)state;
    static const int shapes[][2] = {{4, 10}, {300, 96}};
    kern_ctx *k = ctx(2);
    for (size_t s = 0; s < 2; s++) {
        int N = shapes[s][0], C = shapes[s][1];
        float *inp = randv((size_t)N * C, 2), *w = randv(C, 1), *b = randv(C, 1);
        for (int i = 0; i < N * C; i++)
            inp[i] += 3.0f; /* an offset: the two-pass variance must cope */
        float *out = zerov((size_t)N * C), *mean = zerov(N), *rstd = zerov(N);
        ops->layernorm_forward(k, out, mean, rstd, inp, w, b, N, C);
        double *want = malloc((size_t)N * C * sizeof *want), *wm = malloc(N * sizeof *wm);
        double *wr = malloc(N * sizeof *wr);
        for (int n = 0; n < N; n++) {
            double m = 0, v = 0;
            for (int i = 0; i < C; i++)
                m += inp[n * C + i];
            m /= C;
            for (int i = 0; i < C; i++)
                v += (inp[n * C + i] - m) * (inp[n * C + i] - m);
            v /= C;
            double r = 1.0 / sqrt(v + 1e-5);
            for (int i = 0; i < C; i++)
                want[n * C + i] = (inp[n * C + i] - m) * r * w[i] + b[i];
            wm[n] = m;
            wr[n] = r;
        }
        assert_close("layernorm out", out, want, (size_t)N * C, 1e-5, 1e-5);
        assert_close("layernorm mean", mean, wm, N, 1e-6, 1e-6);
        assert_close("layernorm rstd", rstd, wr, N, 1e-5, 0);
        free(inp), free(w), free(b), free(out), free(mean), free(rstd), free(want), free(wm), free(wr);
    }
    ops->ctx_destroy(k);
}

static void test_layernorm_grad(void **state)
{
    (void)state;
    enum { N = 4, C = 10 };
    kern_ctx *k = ctx(2);
    ln_case c = {k, zerov(N * C), zerov(N), zerov(N), randv(N * C, 2), randv(C, 1), randv(C, 1), randv(N * C, 1),
                 N, C};
    ln_loss(&c);
    float *dinp = zerov(N * C), *dw = zerov(C), *db = zerov(C);
    ops->layernorm_backward(k, dinp, dw, db, c.wt, c.inp, c.w, c.mean, c.rstd, N, C);
    check_grad("layernorm dinp", c.inp, dinp, N * C, ln_loss, &c, NULL);
    check_grad("layernorm dweight", c.w, dw, C, ln_loss, &c, NULL);
    check_grad("layernorm dbias", c.b, db, C, ln_loss, &c, NULL);
    free(c.out), free(c.mean), free(c.rstd), free(c.inp), free(c.w), free(c.b), free(c.wt);
    free(dinp), free(dw), free(db);
    ops->ctx_destroy(k);
}

/* Large enough to split rows over threads (and combine partials); against
 * the backward formulas in double. */
static void test_layernorm_backward_reference(void **state)
{
    (void)state;
    enum { N = 300, C = 96 };
    for (int threads = 1; threads <= 3; threads++) {
        kern_ctx *k = ctx(threads);
        float *inp = randv(N * C, 2), *w = randv(C, 1), *b = randv(C, 1), *dout = randv(N * C, 1);
        float *out = zerov(N * C), *mean = zerov(N), *rstd = zerov(N);
        float *dinp = randv(N * C, 1), *dw = randv(C, 1), *db = randv(C, 1);
        double *wi = malloc(N * C * sizeof *wi), ww[C], wb[C];
        ops->layernorm_forward(k, out, mean, rstd, inp, w, b, N, C);
        for (int i = 0; i < C; i++)
            ww[i] = dw[i], wb[i] = db[i];
        for (int n = 0; n < N; n++) {
            const float *x = inp + n * C, *g = dout + n * C;
            double m = 0, v = 0, dm = 0, dnm = 0;
            for (int i = 0; i < C; i++)
                m += x[i];
            m /= C;
            for (int i = 0; i < C; i++)
                v += (x[i] - m) * (x[i] - m);
            double r = 1.0 / sqrt(v / C + 1e-5);
            for (int i = 0; i < C; i++) {
                dm += (double)w[i] * g[i];
                dnm += (double)w[i] * g[i] * (x[i] - m) * r;
            }
            dm /= C, dnm /= C;
            for (int i = 0; i < C; i++) {
                double norm = (x[i] - m) * r;
                wi[n * C + i] = dinp[n * C + i] + ((double)w[i] * g[i] - dm - norm * dnm) * r;
                ww[i] += norm * g[i];
                wb[i] += g[i];
            }
        }
        ops->layernorm_backward(k, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
        assert_close("layernorm dinp", dinp, wi, N * C, 1e-4, 1e-5);
        assert_close("layernorm dweight", dw, ww, C, 1e-5, 1e-4); /* sums of 300 O(1) terms */
        assert_close("layernorm dbias", db, wb, C, 1e-5, 1e-4);
        free(inp), free(w), free(b), free(dout), free(out), free(mean), free(rstd), free(dinp), free(dw), free(db);
        free(wi);
        ops->ctx_destroy(k);
    }
}

/* ---- attention ------------------------------------------------------------------------- */

typedef struct {
    kern_ctx *k;
    float *out, *preatt, *att, *inp, *wt;
    int B, T, C, NH;
} att_case;

static double att_loss(void *p)
{
    att_case *c = p;
    ops->attention_forward(c->k, c->out, c->preatt, c->att, c->inp, c->B, c->T, c->C, c->NH);
    return dotd(c->wt, c->out, (size_t)c->B * c->T * c->C);
}

/* Naive attention in double: per row, scores, softmax over t2 <= t, sum of v. */
static void att_reference(double *out, double *att, const float *inp, int B, int T, int C, int NH)
{
    int hs = C / NH;
    double scale = 1.0 / sqrt(hs);
    double *row = malloc(T * sizeof *row);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = inp + ((size_t)b * T + t) * 3 * C + h * hs;
                double mx = -INFINITY, sum = 0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *kk = inp + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    double s = 0;
                    for (int i = 0; i < hs; i++)
                        s += (double)q[i] * kk[i];
                    row[t2] = s * scale;
                    mx = fmax(mx, row[t2]);
                }
                for (int t2 = 0; t2 <= t; t2++)
                    sum += (row[t2] = exp(row[t2] - mx));
                double *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++)
                    o[i] = 0;
                double *a = att + (((size_t)b * NH + h) * T + t) * T;
                for (int t2 = 0; t2 < T; t2++)
                    a[t2] = t2 <= t ? row[t2] / sum : 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = inp + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++)
                        o[i] += a[t2] * v[i];
                }
            }
    free(row);
}

/* T = 70 crosses the 64-row blocks of the implementation. */
static void test_attention_forward(void **state)
{
    (void)state;
    static const int shapes[][4] = {{2, 5, 8, 2}, {2, 70, 32, 4}, {1, 130, 12, 3}};
    for (int threads = 1; threads <= 2; threads++) {
        kern_ctx *k = ctx(threads);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], NH = shapes[s][3];
            size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
            float *inp = randv(nq, 2), *out = zerov(no), *pre = zerov(na), *att = zerov(na);
            double *wo = malloc(no * sizeof *wo), *wa = malloc(na * sizeof *wa);
            ops->attention_forward(k, out, pre, att, inp, B, T, C, NH);
            att_reference(wo, wa, inp, B, T, C, NH);
            assert_close("attention out", out, wo, no, 1e-4, 1e-5);
            /* att: only the causal triangle is specified */
            for (size_t r = 0; r < (size_t)B * NH * T; r++)
                for (int t2 = 0; t2 <= (int)(r % T); t2++) {
                    double want = wa[r * T + t2], got = att[r * T + t2];
                    if (!(fabs(got - want) <= 1e-5 + 1e-4 * want)) {
                        print_error("att[%zu,%d]: got %.9g want %.9g\n", r, t2, got, want);
                        fail();
                    }
                }
            free(inp), free(out), free(pre), free(att), free(wo), free(wa);
        }
        ops->ctx_destroy(k);
    }
}

static void attention_grad_case(int B, int T, int C, int NH)
{
    kern_ctx *k = ctx(2);
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    att_case c = {k, zerov(no), zerov(na), zerov(na), randv(nq, 1.5), randv(no, 1), B, T, C, NH};
    att_loss(&c);
    /* The backward must not read att above the diagonal: poison it. */
    for (size_t r = 0; r < (size_t)B * NH * T; r++)
        for (int t2 = (int)(r % T) + 1; t2 < T; t2++)
            c.att[r * T + t2] = NAN;
    float *dinp = zerov(nq), *dpre = randv(na, 1), *datt = randv(na, 1);
    ops->attention_backward(k, dinp, dpre, datt, c.wt, c.inp, c.att, B, T, C, NH);
    check_grad("attention dinp", c.inp, dinp, nq, att_loss, &c, NULL);
    free(c.out), free(c.preatt), free(c.att), free(c.inp), free(c.wt), free(dinp), free(dpre), free(datt);
    ops->ctx_destroy(k);
}

static void test_attention_grad(void **state)
{
    (void)state;
    attention_grad_case(2, 5, 8, 2);
    attention_grad_case(1, 67, 4, 2); /* two row blocks */
}

/* attention_decode at Tc positions is the last row of attention_forward
 * over the same Tc positions: the cache holds rows 0..Tc-2 of the keys and
 * values, qkv the last position.  The op writes the new row into the cache
 * and nothing past it (a NaN sentinel there would also poison the output if
 * it were read).  Tc runs over 1, a single block and past the 64-row
 * blocks of the full attention; NH = 3 gives a head size that is not a
 * power of two. */
static void test_attention_decode(void **state)
{
    (void)state;
    static const int tcs[] = {1, 2, 7, 64, 65, 70};
    const int B = 2, C = 24, Tmax = 72;
    for (int threads = 1; threads <= 2; threads++) {
        kern_ctx *k = ctx(threads);
        for (int NH = 2; NH <= 3; NH++)
            for (size_t i = 0; i < sizeof tcs / sizeof tcs[0]; i++) {
                int Tc = tcs[i];
                size_t nq = (size_t)B * Tc * 3 * C, no = (size_t)B * Tc * C, na = (size_t)B * NH * Tc * Tc;
                size_t nc = (size_t)B * Tmax * C;
                float *inp = randv(nq, 2), *out = zerov(no), *pre = zerov(na), *att = zerov(na);
                float *kc = malloc(nc * sizeof *kc), *vc = malloc(nc * sizeof *vc), *qkv = zerov((size_t)B * 3 * C);
                float *dout = zerov((size_t)B * C), *datt = zerov((size_t)B * NH * Tc);
                for (size_t j = 0; j < nc; j++)
                    kc[j] = vc[j] = NAN;
                for (int b = 0; b < B; b++) {
                    const float *rows = inp + (size_t)b * Tc * 3 * C;
                    for (int t = 0; t < Tc - 1; t++) {
                        memcpy(kc + ((size_t)b * Tmax + t) * C, rows + (size_t)t * 3 * C + C, C * sizeof(float));
                        memcpy(vc + ((size_t)b * Tmax + t) * C, rows + (size_t)t * 3 * C + 2 * C, C * sizeof(float));
                    }
                    memcpy(qkv + (size_t)b * 3 * C, rows + (size_t)(Tc - 1) * 3 * C, 3 * C * sizeof(float));
                }
                ops->attention_forward(k, out, pre, att, inp, B, Tc, C, NH);
                ops->attention_decode(k, dout, datt, kc, vc, qkv, B, Tc, Tmax, C, NH);
                double *want = malloc((size_t)B * C * sizeof *want), mx = 0;
                for (int b = 0; b < B; b++)
                    for (int c = 0; c < C; c++) {
                        want[b * C + c] = out[((size_t)b * Tc + Tc - 1) * C + c];
                        mx = fmax(mx, fabs(want[b * C + c]));
                    }
                assert_close("attention_decode out", dout, want, (size_t)B * C, 1e-5, 1e-5 * mx);
                for (int b = 0; b < B; b++) {
                    const float *last = qkv + (size_t)b * 3 * C;
                    assert_memory_equal(kc + ((size_t)b * Tmax + Tc - 1) * C, last + C, C * sizeof(float));
                    assert_memory_equal(vc + ((size_t)b * Tmax + Tc - 1) * C, last + 2 * C, C * sizeof(float));
                    for (size_t j = ((size_t)b * Tmax + Tc) * C; j < (size_t)(b + 1) * Tmax * C; j++)
                        assert_true(isnan(kc[j]) && isnan(vc[j]));
                }
                free(inp), free(out), free(pre), free(att), free(kc), free(vc), free(qkv), free(dout), free(datt);
                free(want);
            }
        ops->ctx_destroy(k);
    }
}

/* ---- pointwise ------------------------------------------------------------------------- */

typedef void (*unary_fwd)(kern_ctx *k, float *out, const float *inp, size_t N);

typedef struct {
    kern_ctx *k;
    unary_fwd f;
    float *out, *inp, *wt;
    size_t n;
} un_case;

static double un_loss(void *p)
{
    un_case *c = p;
    c->f(c->k, c->out, c->inp, c->n);
    return dotd(c->wt, c->out, c->n);
}

static double gelu_ref(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static void test_gelu(void **state)
{
    (void)state;
    enum { N = 64 };
    kern_ctx *k = ctx(2);
    un_case c = {k, ops->gelu_forward, zerov(N), randv(N, 4), randv(N, 1), N};
    un_loss(&c);
    double want[N];
    for (int i = 0; i < N; i++)
        want[i] = gelu_ref(c.inp[i]);
    assert_close("gelu out", c.out, want, N, 1e-5, 1e-6);
    float *dinp = zerov(N);
    ops->gelu_backward(k, dinp, c.inp, c.wt, N);
    check_grad("gelu dinp", c.inp, dinp, N, un_loss, &c, NULL);
    /* and the derivative itself against its closed form in double */
    for (int i = 0; i < N; i++) {
        double x = c.inp[i], a = sqrt(2.0 / M_PI), u = a * (x + 0.044715 * x * x * x), th = tanh(u);
        want[i] = c.wt[i] * (0.5 * (1 + th) + 0.5 * x * (1 - th * th) * a * (1 + 3 * 0.044715 * x * x));
    }
    assert_close("gelu dinp", dinp, want, N, 1e-5, 1e-6);

    /* Far tails: exact limits, finite gradients. */
    float x[6] = {-100.0f, -20.0f, -9.0f, 9.0f, 20.0f, 1e4f}, y[6], g[6] = {0}, one[6] = {1, 1, 1, 1, 1, 1};
    ops->gelu_forward(k, y, x, 6);
    ops->gelu_backward(k, g, x, one, 6);
    for (int i = 0; i < 6; i++) {
        assert_true(isfinite(y[i]) && isfinite(g[i]));
        assert_true(fabs(y[i] - gelu_ref(x[i])) <= 1e-6 * fabs(x[i]) + 1e-12);
        assert_true(fabs(g[i] - (x[i] > 0 ? 1.0 : 0.0)) < 1e-5);
    }
    free(c.out), free(c.inp), free(c.wt), free(dinp);
    ops->ctx_destroy(k);
}

static void test_relu(void **state)
{
    (void)state;
    enum { N = 40 };
    kern_ctx *k = ctx(2);
    un_case c = {k, ops->relu_forward, zerov(N), randv(N, 1), randv(N, 1), N};
    for (int i = 0; i < N; i++) /* keep clear of the kink at 0, more than FD_H away */
        c.inp[i] += c.inp[i] >= 0 ? 0.05f : -0.05f;
    un_loss(&c);
    for (int i = 0; i < N; i++)
        assert_true(c.out[i] == (c.inp[i] > 0 ? c.inp[i] : 0.0f));
    float *dinp = zerov(N);
    ops->relu_backward(k, dinp, c.inp, c.wt, N);
    check_grad("relu dinp", c.inp, dinp, N, un_loss, &c, NULL);
    free(c.out), free(c.inp), free(c.wt), free(dinp);
    ops->ctx_destroy(k);
}

typedef struct {
    kern_ctx *k;
    float *out, *a, *b, *wt;
    size_t n;
} res_case;

static double res_loss(void *p)
{
    res_case *c = p;
    ops->residual_forward(c->k, c->out, c->a, c->b, c->n);
    return dotd(c->wt, c->out, c->n);
}

static void test_residual(void **state)
{
    (void)state;
    enum { N = 33 };
    kern_ctx *k = ctx(2);
    res_case c = {k, zerov(N), randv(N, 1), randv(N, 1), randv(N, 1), N};
    res_loss(&c);
    for (int i = 0; i < N; i++)
        assert_true(c.out[i] == c.a[i] + c.b[i]);
    float *da = zerov(N), *db = zerov(N);
    ops->accumulate(k, da, c.wt, N);
    ops->accumulate(k, db, c.wt, N);
    check_grad("residual da", c.a, da, N, res_loss, &c, NULL);
    check_grad("residual db", c.b, db, N, res_loss, &c, NULL);
    free(c.out), free(c.a), free(c.b), free(c.wt), free(da), free(db);
    ops->ctx_destroy(k);
}

/* Large arrays go through the threaded path; in place is allowed. */
static void test_pointwise_large(void **state)
{
    (void)state;
    size_t n = 100003;
    kern_ctx *k = ctx(3);
    float *x = randv(n, 3), *y = zerov(n), *z = dupv(x, n);
    ops->gelu_forward(k, y, x, n);
    ops->gelu_forward(k, z, z, n);
    assert_memory_equal(y, z, n * sizeof *y);
    for (size_t i = 0; i < n; i += 97)
        assert_true(fabs(y[i] - gelu_ref(x[i])) <= 1e-5 * fabs(y[i]) + 1e-6);
    ops->relu_forward(k, y, x, n);
    for (size_t i = 0; i < n; i++)
        assert_true(y[i] == (x[i] > 0 ? x[i] : 0.0f));
    ops->residual_forward(k, z, x, y, n);
    memcpy(y, x, n * sizeof *y);
    ops->accumulate(k, y, y, n);
    for (size_t i = 0; i < n; i++)
        assert_true(y[i] == 2 * x[i] && z[i] == x[i] + (x[i] > 0 ? x[i] : 0.0f));
    free(x), free(y), free(z);
    ops->ctx_destroy(k);
}

/* ---- cross-entropy ------------------------------------------------------------------------ */

typedef struct {
    kern_ctx *k;
    float *losses, *lse, *logits, *dloss;
    int32_t *targets;
    int N, V, Vp;
} ce_case;

static double ce_loss(void *p)
{
    ce_case *c = p;
    ops->crossentropy_forward(c->k, c->losses, c->lse, c->logits, c->targets, c->N, c->V, c->Vp);
    return dotd(c->dloss, c->losses, c->N);
}

static void test_crossentropy(void **state)
{
    (void)state;
    enum { N = 5, V = 7, Vp = 8 };
    kern_ctx *k = ctx(2);
    int32_t targets[N] = {0, 6, 3, 3, 1};
    ce_case c = {k, zerov(N), zerov(N), randv(N * Vp, 3), randv(N, 1), targets, N, V, Vp};
    for (int i = 0; i < N; i++)
        c.logits[i * Vp + V] = 1e30f; /* padding: must be ignored */
    ce_loss(&c);
    double want_dl[N * Vp];
    for (int i = 0; i < N; i++) {
        const float *x = c.logits + i * Vp;
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < V; j++)
            mx = fmax(mx, x[j]);
        for (int j = 0; j < V; j++)
            s += exp(x[j] - mx);
        double want = log(s) + mx - x[targets[i]], lse = log(s) + mx;
        assert_true(fabs(c.losses[i] - want) <= 1e-5 * fabs(want) + 1e-6);
        assert_true(fabs(c.lse[i] - lse) <= 1e-6 * fabs(lse) + 1e-6);
        for (int j = 0; j < V; j++)
            want_dl[i * Vp + j] = c.dloss[i] * (exp(x[j] - mx) / s - (j == targets[i]));
        want_dl[i * Vp + V] = 0.0;
    }
    /* Backward overwrites: what the buffer held before does not matter, and
     * the padded column comes out exactly 0. */
    float *dl = randv(N * Vp, 100);
    for (int i = 0; i < N; i++)
        dl[i * Vp + V] = 42.0f;
    ops->crossentropy_backward(k, dl, c.logits, c.lse, targets, c.dloss, N, V, Vp);
    assert_close("crossentropy dlogits", dl, want_dl, N * Vp, 1e-5, 1e-7);
    for (int i = 0; i < N; i++)
        assert_true(dl[i * Vp + V] == 0.0f);
    unsigned char skip[N * Vp] = {0};
    for (int i = 0; i < N; i++)
        skip[i * Vp + V] = 1; /* the padded logit is 1e30: no difference quotient there */
    check_grad("crossentropy dlogits", c.logits, dl, N * Vp, ce_loss, &c, skip);

    /* Huge logits: stable, and a certain prediction costs 0. */
    float big[2 * Vp], lb[2], sb[2];
    int32_t tb[2] = {2, 5};
    for (int j = 0; j < 2 * Vp; j++)
        big[j] = -1000.0f;
    big[2] = 1000.0f;      /* row 0: target 2 certain */
    big[Vp + 1] = 3000.0f; /* row 1: target 5 hopeless */
    ops->crossentropy_forward(k, lb, sb, big, tb, 2, V, Vp);
    assert_true(lb[0] == 0.0f && sb[0] == 1000.0f);
    assert_true(fabs(lb[1] - 4000.0) < 1e-3 * 4000 && sb[1] == 3000.0f);
    ops->crossentropy_backward(k, big, big, sb, tb, c.dloss, 2, V, Vp);
    for (int j = 0; j < 2 * Vp; j++)
        assert_true(isfinite(big[j]));

    /* A target outside [0,V) cannot pass unnoticed. */
    int32_t bad[2] = {V, -1};
    ops->crossentropy_forward(k, lb, sb, c.logits, bad, 2, V, Vp);
    assert_true(isnan(lb[0]) && isnan(lb[1]) && isfinite(sb[0]) && isfinite(sb[1]));
    free(c.losses), free(c.lse), free(c.logits), free(c.dloss), free(dl);
    ops->ctx_destroy(k);
}

/* The models compute dlogits over the logits: in place must give the very
 * bits of out of place, on the threaded and vectorised path (N·V above
 * KCPU_PAR_MIN) and with rows that are not 16-byte aligned (Vp odd). */
static void test_crossentropy_in_place(void **state)
{
    (void)state;
    static const int shapes[][3] = {{64, 1000, 1024}, {33, 997, 1001}, {5, 7, 8}};
    kern_ctx *k = ctx(3);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], V = shapes[s][1], Vp = shapes[s][2];
        size_t n = (size_t)N * Vp;
        float *logits = randv(n, 8), *lse = zerov(N), *losses = zerov(N), *dloss = randv(N, 1);
        float *out = randv(n, 1), *again = randv(n, 1);
        int32_t *tg = malloc((size_t)N * sizeof *tg);
        assert_non_null(tg);
        for (int i = 0; i < N; i++)
            tg[i] = (int32_t)(rng_u32() % (uint32_t)V);
        ops->crossentropy_forward(k, losses, lse, logits, tg, N, V, Vp);
        ops->crossentropy_backward(k, out, logits, lse, tg, dloss, N, V, Vp);
        ops->crossentropy_backward(k, again, logits, lse, tg, dloss, N, V, Vp);
        assert_memory_equal(out, again, n * sizeof *out); /* overwrites, whatever was there */
        ops->crossentropy_backward(k, logits, logits, lse, tg, dloss, N, V, Vp);
        assert_memory_equal(logits, out, n * sizeof *out);
        free(logits), free(lse), free(losses), free(dloss), free(out), free(again), free(tg);
    }
    ops->ctx_destroy(k);
}

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

/* ---- 16-bit activations: each op is its fp32 op and a cast, bitwise ---------------------------- */

static uint16_t *h16(size_t n)
{
    uint16_t *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}

static void test_act16_ops(void **state)
{
    (void)state;
    enum { N = 37, C = 48, OC = 20 };
    for (int pi = 0; pi < 2; pi++) {
        kern_precision prec = pi ? KERN_FP16 : KERN_BF16;
        kern_ctx *k = ops->ctx_create(2, 0, prec, NULL);
        assert_non_null(k);
        void (*narrow)(kern_ctx *, uint16_t *, const float *, size_t) =
            pi ? ops->cast_f32_to_f16 : ops->cast_f32_to_bf16;
        void (*widen)(kern_ctx *, float *, const uint16_t *, size_t) =
            pi ? ops->cast_f16_to_f32 : ops->cast_bf16_to_f32;
        float *x = randv(N * C, 2), *w = randv(C, 1), *b = randv(C, 1), *d = randv(N * C, 1);
        float *t = zerov(N * C), *m1 = zerov(N), *r1 = zerov(N), *m2 = zerov(N), *r2 = zerov(N);
        uint16_t *want = h16(N * C), *got = h16(N * C);

        ops->layernorm_forward(k, t, m1, r1, x, w, b, N, C);
        narrow(k, want, t, N * C);
        ops->layernorm_forward16(k, got, m2, r2, x, w, b, N, C);
        assert_memory_equal(got, want, N * C * sizeof *got);
        assert_memory_equal(m1, m2, N * sizeof *m1);
        assert_memory_equal(r1, r2, N * sizeof *r1);
        { /* backward: as layernorm_backward, and the updated dinp rounded */
            float *g1 = randv(N * C, 1), *g2 = malloc(N * C * sizeof *g2), *dw1 = zerov(C), *db1 = zerov(C);
            float *dw2 = zerov(C), *db2 = zerov(C);
            assert_non_null(g2);
            memcpy(g2, g1, N * C * sizeof *g2);
            ops->layernorm_backward(k, g1, dw1, db1, d, x, w, m1, r1, N, C);
            narrow(k, want, g1, N * C);
            ops->layernorm_backward16(k, g2, got, dw2, db2, d, NULL, x, w, m1, r1, N, C);
            assert_memory_equal(g1, g2, N * C * sizeof *g1);
            assert_memory_equal(got, want, N * C * sizeof *got);
            assert_memory_equal(dw1, dw2, C * sizeof *dw1);
            assert_memory_equal(db1, db2, C * sizeof *db1);
            /* dout in 16 bits: the fp32 op on its widening */
            uint16_t *d16 = h16(N * C);
            float *dw = zerov(N * C);
            narrow(k, d16, d, N * C);
            widen(k, dw, d16, N * C);
            memcpy(g2, g1, N * C * sizeof *g2);
            ops->layernorm_backward(k, g1, dw1, db1, dw, x, w, m1, r1, N, C);
            ops->layernorm_backward16(k, g2, NULL, dw2, db2, NULL, d16, x, w, m1, r1, N, C);
            assert_memory_equal(g1, g2, N * C * sizeof *g1);
            assert_memory_equal(dw1, dw2, C * sizeof *dw1);
            assert_memory_equal(db1, db2, C * sizeof *db1);
            free(d16), free(dw);
            free(g1), free(g2), free(dw1), free(db1), free(dw2), free(db2);
        }

        /* GELU: 16 bits in and out, the fp32 op on the widened inputs;
         * backward also in place over dout16. */
        {
            uint16_t *x16 = h16(N * C), *dd16 = h16(N * C);
            float *xw = zerov(N * C), *dw = zerov(N * C);
            narrow(k, x16, x, N * C);
            narrow(k, dd16, d, N * C);
            widen(k, xw, x16, N * C);
            widen(k, dw, dd16, N * C);
            ops->gelu_forward(k, t, xw, N * C);
            narrow(k, want, t, N * C);
            ops->gelu_forward16(k, got, x16, N * C);
            assert_memory_equal(got, want, N * C * sizeof *got);
            ops->gelu_backward(k, t, xw, dw, N * C);
            narrow(k, want, t, N * C);
            ops->gelu_backward16(k, got, x16, dd16, N * C);
            assert_memory_equal(got, want, N * C * sizeof *got);
            ops->gelu_backward16(k, dd16, x16, dd16, N * C);
            assert_memory_equal(dd16, want, N * C * sizeof *got);
            free(x16), free(dd16), free(xw), free(dw);
        }

        /* matmul: 16-bit inp, weight (and dout) are the widened fp32 ones. */
        uint16_t *i16 = h16(N * C), *d16 = h16(N * OC), *wt16 = h16(OC * C);
        float *wt = randv(OC * C, 1), *bias = randv(OC, 1), *dout = randv(N * OC, 1);
        narrow(k, i16, x, N * C);
        narrow(k, d16, dout, N * OC);
        narrow(k, wt16, wt, OC * C);
        widen(k, wt, wt16, OC * C);
        float *iw = zerov(N * C), *dw32 = zerov(N * OC);
        widen(k, iw, i16, N * C);
        widen(k, dw32, d16, N * OC);
        float *o1 = zerov(N * OC), *o2 = randv(N * OC, 1);
        ops->matmul_forward(k, o1, iw, wt, bias, N, C, OC);
        ops->matmul_forward16(k, o2, i16, wt16, bias, N, C, OC);
        assert_memory_equal(o1, o2, N * OC * sizeof *o1);
        { /* with the residual added: the same product plus res */
            float *res = randv(N * OC, 1), *o3 = randv(N * OC, 1);
            ops->residual_forward(k, o1, res, o2, N * OC);
            ops->matmul_forward16_residual(k, o3, i16, wt16, bias, res, N, C, OC);
            assert_memory_equal(o1, o3, N * OC * sizeof *o1);
            ops->matmul_forward(k, o1, iw, wt, bias, N, C, OC); /* o1 as it was, for below */
            free(res), free(o3);
        }
        for (int dv = 0; dv < 4; dv++) { /* dout as fp32, then as 16 bits; dinp then in 16 bits too */
            float *gi1 = randv(N * C, 1), *gi2 = randv(N * C, 1), *gw1 = randv(OC * C, 1), *gb1 = randv(OC, 1);
            float *gw2 = malloc(OC * C * sizeof *gw2), *gb2 = malloc(OC * sizeof *gb2);
            assert_non_null(gw2);
            assert_non_null(gb2);
            memcpy(gw2, gw1, OC * C * sizeof *gw2);
            memcpy(gb2, gb1, OC * sizeof *gb2);
            bool d16in = dv & 1, d16out = dv & 2;
            uint16_t *gi16 = h16(N * C), *gi16w = h16(N * C);
            ops->matmul_backward(k, gi1, gw1, gb1, d16in ? dw32 : dout, iw, wt, N, C, OC);
            ops->matmul_backward16(k, d16out ? NULL : gi2, d16out ? gi16 : NULL, gw2, gb2, d16in ? NULL : dout,
                                   d16in ? d16 : NULL, i16, wt16, N, C, OC);
            if (d16out) {
                narrow(k, gi16w, gi1, N * C);
                assert_memory_equal(gi16, gi16w, N * C * sizeof *gi16);
            } else {
                assert_memory_equal(gi1, gi2, N * C * sizeof *gi1);
            }
            free(gi16), free(gi16w);
            assert_memory_equal(gw1, gw2, OC * C * sizeof *gw1);
            assert_memory_equal(gb1, gb2, OC * sizeof *gb1);
            free(gi1), free(gi2), free(gw1), free(gw2), free(gb1), free(gb2);
        }
        /* 16-bit output: the GEMM's fp32 result rounded once, with the
         * bias rounded to 16 bits first. */
        {
            uint16_t *b16 = h16(OC), *o16 = h16(N * OC);
            float *bw = zerov(OC);
            narrow(k, b16, bias, OC);
            widen(k, bw, b16, OC);
            ops->matmul_forward(k, o1, iw, wt, bw, N, C, OC);
            narrow(k, want, o1, N * OC);
            ops->matmul_forward16_out16(k, o16, i16, wt16, bias, N, C, OC);
            assert_memory_equal(o16, want, N * OC * sizeof *o16);
            free(b16), free(o16), free(bw);
        }
        /* 16-bit logits: the GEMM's fp32 result rounded once; cross-entropy
         * on the widened logits, its dlogits rounded, also in place. */
        uint16_t *l16 = h16(N * OC), *g16 = h16(N * OC);
        ops->matmul_forward(k, o1, iw, wt, NULL, N, C, OC);
        narrow(k, want, o1, N * OC);
        ops->matmul_forward16_out16(k, l16, i16, wt16, NULL, N, C, OC);
        assert_memory_equal(l16, want, N * OC * sizeof *l16);
        int32_t tg[N];
        for (int i = 0; i < N; i++)
            tg[i] = (int32_t)(rng_u32() % (OC - 3)); /* V = OC - 3 of Vp = OC columns */
        float *lw = zerov(N * OC), *ls1 = zerov(N), *le1 = zerov(N), *ls2 = zerov(N), *le2 = zerov(N);
        float *dl = randv(N, 1);
        widen(k, lw, l16, N * OC);
        ops->crossentropy_forward(k, ls1, le1, lw, tg, N, OC - 3, OC);
        ops->crossentropy_forward16(k, ls2, le2, l16, tg, N, OC - 3, OC);
        assert_memory_equal(ls1, ls2, N * sizeof *ls1);
        assert_memory_equal(le1, le2, N * sizeof *le1);
        ops->crossentropy_backward(k, lw, lw, le1, tg, dl, N, OC - 3, OC);
        narrow(k, want, lw, N * OC);
        ops->crossentropy_backward16(k, g16, l16, le2, tg, dl, N, OC - 3, OC);
        assert_memory_equal(g16, want, N * OC * sizeof *g16);
        ops->crossentropy_backward16(k, l16, l16, le2, tg, dl, N, OC - 3, OC);
        assert_memory_equal(l16, want, N * OC * sizeof *l16);
        /* Both in one: the same losses, and the same dlogits16 in place. */
        ops->matmul_forward16_out16(k, l16, i16, wt16, NULL, N, C, OC);
        float *ls3 = randv(N, 1);
        ops->crossentropy_fused16(k, ls3, l16, tg, dl, N, OC - 3, OC);
        assert_memory_equal(ls3, ls1, N * sizeof *ls1);
        assert_memory_equal(l16, want, N * OC * sizeof *l16);
        free(ls3);
        free(l16), free(g16), free(lw), free(ls1), free(le1), free(ls2), free(le2), free(dl);

        free(x), free(w), free(b), free(d), free(t), free(m1), free(r1), free(m2), free(r2), free(want), free(got);
        free(i16), free(d16), free(wt16), free(wt), free(bias), free(dout), free(iw), free(dw32), free(o1), free(o2);
        ops->ctx_destroy(k);
    }
    assert_false(ops->act16_native); /* the cpu's are the reference, not the fast path */
}

/* ---- AdamW, norms, memory helpers ------------------------------------------------------------ */

static void test_adamw(void **state)
{
    (void)state;
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    static const size_t sizes[] = {37, 50001};
    kern_ctx *k = ctx(2);
    for (size_t s = 0; s < 2; s++) {
        size_t n = sizes[s];
        float *p = randv(n, 1), *m = zerov(n), *v = zerov(n), *g = randv(n, 1);
        double *rp = malloc(n * sizeof *rp), *rm = calloc(n, sizeof *rm), *rv = calloc(n, sizeof *rv);
        for (size_t i = 0; i < n; i++)
            rp[i] = p[i];
        /* t = 1 with m = v = 0 and no decay: the step is lr·g/(|g| + eps), i.e. ±lr. */
        float *p1 = dupv(p, n), *m1 = zerov(n), *v1 = zerov(n);
        ops->adamw(k, p1, NULL, g, m1, v1, n, lr, b1, b2, eps, 0.0f, 1.0f, 1);
        for (size_t i = 0; i < n; i++) {
            double want = p[i] - lr * g[i] / (fabs(g[i]) + eps);
            assert_true(fabs(p1[i] - want) <= 1e-6 * fabs(want) + 1e-7);
        }
        for (int t = 1; t <= 4; t++) {
            for (size_t i = 0; i < n; i++)
                g[i] = rng_f();
            ops->adamw(k, p, NULL, g, m, v, n, lr, b1, b2, eps, wd, gs, t);
            for (size_t i = 0; i < n; i++) {
                double gi = (double)gs * g[i];
                rm[i] = b1 * rm[i] + (1.0 - b1) * gi;
                rv[i] = b2 * rv[i] + (1.0 - b2) * gi * gi;
                double mh = rm[i] / (1.0 - pow(b1, t)), vh = rv[i] / (1.0 - pow(b2, t));
                rp[i] -= lr * (mh / (sqrt(vh) + eps) + wd * rp[i]);
            }
        }
        /* four fp32 steps of size ~lr: errors ~1e-7 on O(1) parameters */
        assert_close("adamw p", p, rp, n, 1e-5, 1e-6);
        assert_close("adamw m", m, rm, n, 1e-5, 1e-7);
        assert_close("adamw v", v, rv, n, 1e-5, 1e-8);
        free(p), free(m), free(v), free(g), free(rp), free(rm), free(rv), free(p1), free(m1), free(v1);
    }
    ops->ctx_destroy(k);
}

/* The 16-bit copy adamw writes (p16) is the updated p rounded as the
 * context's cast rounds it, bit for bit, and p, m, v are the bits they are
 * without it: the copy changes nothing else. */
static void test_adamw_p16(void **state)
{
    (void)state;
    const size_t n = 50001; /* parallel, with a tail */
    for (int pi = 0; pi < 2; pi++) {
        kern_precision prec = pi ? KERN_FP16 : KERN_BF16;
        kern_ctx *k = ops->ctx_create(2, 0, prec, NULL);
        assert_non_null(k);
        float *p = randv(n, 1), *m = zerov(n), *v = zerov(n), *g = randv(n, 1);
        float *p2 = dupv(p, n), *m2 = zerov(n), *v2 = zerov(n);
        uint16_t *p16 = h16(n), *want = h16(n);
        void (*narrow)(kern_ctx *, uint16_t *, const float *, size_t) =
            pi ? ops->cast_f32_to_f16 : ops->cast_f32_to_bf16;
        for (int t = 1; t <= 3; t++) {
            ops->adamw(k, p, p16, g, m, v, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
            ops->adamw(k, p2, NULL, g, m2, v2, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
            narrow(k, want, p, n);
            assert_memory_equal(p16, want, n * sizeof *p16);
        }
        assert_memory_equal(p, p2, n * sizeof *p);
        assert_memory_equal(m, m2, n * sizeof *m);
        assert_memory_equal(v, v2, n * sizeof *v);
        free(p), free(m), free(v), free(g), free(p2), free(m2), free(v2), free(p16), free(want);
        ops->ctx_destroy(k);
    }
}

/* adamw_multi is adamw segment by segment: the same bits, weight decay
 * only on the segments that ask for it, and a gap between segments left
 * as it was. */
static void test_adamw_multi(void **state)
{
    (void)state;
    const kern_segment segs[] = {{0, 20001, 1}, {20001, 3, 0}, {20004, 771, 1}, {20780, 999, 0}};
    const size_t n = 20780 + 999;
    kern_ctx *k = ops->ctx_create(2, 0, KERN_BF16, NULL);
    assert_non_null(k);
    float *p = randv(n, 1), *g = randv(n, 1), *m = zerov(n), *v = zerov(n);
    float *p2 = dupv(p, n), *m2 = zerov(n), *v2 = zerov(n), *p0 = dupv(p, n);
    uint16_t *h = h16(n), *h2 = h16(n);
    memcpy(h2, h, n * sizeof *h);
    for (int t = 1; t <= 3; t++) {
        ops->adamw_multi(k, p, h, g, m, v, segs, 4, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
        for (int i = 0; i < 4; i++) {
            size_t o = segs[i].offset;
            ops->adamw(k, p2 + o, h2 + o, g + o, m2 + o, v2 + o, segs[i].n, 1e-2f, 0.9f, 0.95f, 1e-8f,
                       segs[i].decay ? 0.1f : 0.0f, 0.5f, t);
        }
    }
    assert_memory_equal(p, p2, n * sizeof *p);
    assert_memory_equal(m, m2, n * sizeof *m);
    assert_memory_equal(v, v2, n * sizeof *v);
    assert_memory_equal(h, h2, n * sizeof *h);
    for (size_t i = 20775; i < 20780; i++) /* the gap */
        assert_memory_equal(&p[i], &p0[i], sizeof *p);
    free(p), free(g), free(m), free(v), free(p2), free(m2), free(v2), free(p0), free(h), free(h2);
    ops->ctx_destroy(k);
}

static void test_sumsq_and_helpers(void **state)
{
    (void)state;
    size_t n = 100003;
    for (int threads = 1; threads <= 3; threads++) {
        kern_ctx *k = ctx(threads);
        float *g = randv(n, 3);
        double want = 0, got = -1, got2 = -2;
        for (size_t i = 0; i < n; i++)
            want += (double)g[i] * g[i];
        ops->sumsq(k, &got, g, n);
        ops->sumsq(k, &got2, g, n);
        assert_true(fabs(got - want) <= 1e-12 * want);
        assert_memory_equal(&got, &got2, sizeof got); /* deterministic */
        ops->sumsq(k, &got, g, 3);
        assert_true(fabs(got - ((double)g[0] * g[0] + (double)g[1] * g[1] + (double)g[2] * g[2])) < 1e-12);
        ops->sumsq(k, &got, g, 0);
        assert_true(got == 0.0);

        assert_int_equal(ops->count_nonfinite(k, g, n), 0);
        g[5] = INFINITY, g[n - 1] = -INFINITY, g[777] = NAN, g[50000] = -NAN;
        assert_int_equal(ops->count_nonfinite(k, g, n), 4);
        assert_int_equal(ops->count_nonfinite(k, g, 5), 0);

        float *h = zerov(n), *c = zerov(n);
        ops->copy_h2d(k, h, g, n * sizeof *g);
        assert_memory_equal(h, g, n * sizeof *g);
        ops->copy_d2h(k, c, h, 4); /* a single float */
        assert_memory_equal(c, g, 4);
        ops->scale(k, h, n, 0.5f);
        for (size_t i = 0; i < n; i += 101)
            assert_true(h[i] == g[i] * 0.5f || (isnan(g[i]) && isnan(h[i])));
        ops->zero(k, h, n);
        for (size_t i = 0; i < n; i++)
            assert_true(h[i] == 0.0f);
        assert_int_equal(ops->sync(k), 0);
        free(g), free(h), free(c);
        ops->ctx_destroy(k);
    }
    assert_string_equal(ops->name, "cpu");
}

/* ---- casts ---------------------------------------------------------------------------------- */

static float bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* IEEE half by arithmetic in double, round to nearest even (the FPU's mode). */
static uint16_t f16_reference(float f)
{
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (isnan(f))
        return 0x7e00;
    if (a >= 65520.0) /* halfway to 65536 and above round to inf */
        return sign | 0x7c00;
    if (a < 0x1p-14)
        return sign | (uint16_t)nearbyint(a * 0x1p24); /* may round up to 0x0400: the min normal */
    int e;
    frexp(a, &e); /* a = f·2^e, f in [0.5,1) */
    e -= 1;       /* a in [2^e, 2^(e+1)) */
    double m = nearbyint(ldexp(a, 10 - e));
    if (m == 2048.0)
        m = 1024.0, e += 1;
    return sign | (uint16_t)((e + 15) << 10 | ((int)m - 1024));
}

static void test_casts(void **state)
{
    (void)state;
    kern_ctx *k = ctx(2);
    size_t n = 65536;
    uint16_t *h = malloc(n * sizeof *h), *h2 = malloc(n * sizeof *h2);
    float *f = malloc(n * sizeof *f);
    for (size_t i = 0; i < n; i++)
        h[i] = (uint16_t)i;

    /* Every bf16 and fp16 value survives the round trip; NaNs stay NaNs. */
    ops->cast_bf16_to_f32(k, f, h, n);
    ops->cast_f32_to_bf16(k, h2, f, n);
    for (size_t i = 0; i < n; i++) {
        assert_true(f_bits(f[i]) == (uint32_t)i << 16);
        if ((i & 0x7f80) == 0x7f80 && (i & 0x7f))
            assert_true((h2[i] & 0x7f80) == 0x7f80 && (h2[i] & 0x7f));
        else
            assert_int_equal(h2[i], i);
    }
    ops->cast_f16_to_f32(k, f, h, n);
    ops->cast_f32_to_f16(k, h2, f, n);
    for (size_t i = 0; i < n; i++) {
        if ((i & 0x7c00) == 0x7c00 && (i & 0x3ff)) {
            assert_true(isnan(f[i]));
            assert_true((h2[i] & 0x7c00) == 0x7c00 && (h2[i] & 0x3ff));
        } else {
            assert_int_equal(h2[i], i);
        }
    }
    /* fp16 decoding of known values: subnormals, extremes, signed zero. */
    struct {
        uint16_t h;
        float f;
    } known[] = {{0x3c00, 1.0f},          {0x0001, 0x1p-24f},   {0x03ff, 1023 * 0x1p-24f}, {0x0400, 0x1p-14f},
                 {0x7bff, 65504.0f},      {0xc000, -2.0f},      {0x8000, -0.0f},           {0x3555, 0.333251953125f}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        float g;
        ops->cast_f16_to_f32(k, &g, &known[i].h, 1);
        assert_true(f_bits(g) == f_bits(known[i].f));
    }

    /* Ties go to even, in both formats, normal and subnormal. */
    struct {
        float f;
        uint16_t bf, hf;
    } ties[] = {
        {1.0f + 0x1p-8f, 0x3f80, 0x3c04},        /* bf16 tie -> even (down) */
        {1.0f + 3 * 0x1p-8f, 0x3f82, 0x3c0c},    /* bf16 tie -> even (up) */
        {1.0f + 0x1p-11f, 0x3f80, 0x3c00},       /* fp16 tie -> even (down) */
        {1.0f + 3 * 0x1p-11f, 0x3f80, 0x3c02},   /* fp16 tie -> even (up) */
        {0x1p-25f, 0x3300, 0x0000},              /* half the least fp16 subnormal -> 0 */
        {3 * 0x1p-25f, 0x33c0, 0x0002},          /* 1.5 subnormal units -> 2 */
        {1023.5f * 0x1p-24f, 0x3880, 0x0400},    /* the largest subnormal's tie rounds to the min normal */
        {65504.0f, 0x4780, 0x7bff},              /* fp16 max */
        {65519.0f, 0x4780, 0x7bff},              /* below the tie: max */
        {65520.0f, 0x4780, 0x7c00},              /* the tie to 65536: inf */
        {INFINITY, 0x7f80, 0x7c00},
        {-INFINITY, 0xff80, 0xfc00},
        {-0.0f, 0x8000, 0x8000},
        {1e-10f, 0x2edc, 0x0000},                /* fp16 underflow */
    };
    for (size_t i = 0; i < sizeof ties / sizeof ties[0]; i++) {
        uint16_t b, hh;
        ops->cast_f32_to_bf16(k, &b, &ties[i].f, 1);
        ops->cast_f32_to_f16(k, &hh, &ties[i].f, 1);
        if (b != ties[i].bf || hh != ties[i].hf) {
            print_error("cast %a: bf16 %04x (want %04x), fp16 %04x (want %04x)\n", ties[i].f, b, ties[i].bf, hh,
                        ties[i].hf);
            fail();
        }
    }
    float qn = NAN;
    uint16_t b, hh;
    ops->cast_f32_to_bf16(k, &b, &qn, 1);
    ops->cast_f32_to_f16(k, &hh, &qn, 1);
    assert_true((b & 0x7f80) == 0x7f80 && (b & 0x7f));
    assert_true((hh & 0x7c00) == 0x7c00 && (hh & 0x3ff));

    /* Random floats of every magnitude against the reference in double. */
    for (size_t i = 0; i < n; i++) {
        uint32_t u = rng_u32();
        /* exponents around fp16's range: 2^-30 .. 2^17 */
        u = (u & 0x807fffffu) | ((uint32_t)(97 + rng_u32() % 48) << 23);
        f[i] = bits_f(u);
    }
    ops->cast_f32_to_f16(k, h2, f, n);
    for (size_t i = 0; i < n; i++)
        if (h2[i] != f16_reference(f[i])) {
            print_error("fp16(%a) = %04x, want %04x\n", f[i], h2[i], f16_reference(f[i]));
            fail();
        }
    free(h), free(h2), free(f);
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
        cmocka_unit_test(test_matmul_forward),
        cmocka_unit_test(test_matmul_grad),
        cmocka_unit_test(test_matmul_backward_reference),
        cmocka_unit_test(test_encoder),
        cmocka_unit_test(test_encoder_backward_reference),
        cmocka_unit_test(test_layernorm_forward),
        cmocka_unit_test(test_layernorm_grad),
        cmocka_unit_test(test_layernorm_backward_reference),
        cmocka_unit_test(test_attention_forward),
        cmocka_unit_test(test_attention_grad),
        cmocka_unit_test(test_attention_decode),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_relu),
        cmocka_unit_test(test_residual),
        cmocka_unit_test(test_pointwise_large),
        cmocka_unit_test(test_crossentropy),
        cmocka_unit_test(test_crossentropy_in_place),
        cmocka_unit_test(test_accumulates),
        cmocka_unit_test(test_overwrites),
        cmocka_unit_test(test_act16_ops),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_adamw_p16),
        cmocka_unit_test(test_adamw_multi),
        cmocka_unit_test(test_sumsq_and_helpers),
        cmocka_unit_test(test_casts),
        cmocka_unit_test(test_determinism_and_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
