/* test_kernels_layers.c — the CPU kernels of the per-token layers: the
 * encoder (token and position embeddings), layernorm, GELU, ReLU and the
 * residual add, and dropout.  Forward against naive references, backward against
 * central finite differences and, on shapes split over threads, against
 * sums in double; large arrays through the threaded pointwise path. */
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

/* A slice of wider rows, both ways, against plain loops: exact.  Enough
 * rows for the threaded path. */
static void test_copy2d(void **state)
{
    (void)state;
    int N = 3001, cols = 40, wide = 104;
    kern_ctx *k = ctx(3);
    float *w = randv((size_t)N * wide, 5), *d = randv((size_t)N * cols, 6), *w0 = dupv(w, (size_t)N * wide);
    ops->copy2d(k, w + 24, wide, d, cols, N, cols, true);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < wide; j++) {
            float want = w0[(size_t)i * wide + j] + (j >= 24 && j < 24 + cols ? d[(size_t)i * cols + j - 24] : 0.0f);
            assert_true(w[(size_t)i * wide + j] == want);
        }
    ops->copy2d(k, d, cols, w0 + 8, wide, N, cols, false);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < cols; j++)
            assert_true(d[(size_t)i * cols + j] == w0[(size_t)i * wide + 8 + j]);
    free(w), free(d), free(w0);
    ops->ctx_destroy(k);
}

/* Dropout at p = 0.25 over enough elements for the threaded path:
 * - each element is its input times 1/(1-p), exactly, or exactly 0;
 * - the kept share is 1-p within 5 standard deviations of a binomial
 *   draw (the draw is fixed: this either always holds or never);
 * - the mask is (seed, offset + i)'s alone: pieces at their offsets give
 *   the whole bit for bit, whatever the threads; in place is the same;
 * - applied to its own output (the backward) it keeps the same elements;
 * - another seed draws another mask (agreement near p² + (1-p)²);
 * - p = 0 is the identity. */
static void test_dropout(void **state)
{
    (void)state;
    const size_t n = 200003, cut = 77777;
    const float p = 0.25f;
    kern_ctx *k1 = ctx(1), *k3 = ctx(3);
    float *x = randv(n, 9), *y = zerov(n), *z = zerov(n), *w = dupv(x, n);
    const uint64_t seed = 0x1234abcdull, off = 5000000017ull;
    ops->dropout(k3, y, x, n, p, seed, off);
    size_t kept = 0;
    const float keep = 1.0f / (1.0f - p);
    for (size_t i = 0; i < n; i++) {
        assert_true(y[i] == x[i] * keep || y[i] == 0.0f);
        kept += y[i] != 0.0f;
    }
    double mean = (double)n * (1 - p), sd = sqrt((double)n * p * (1 - p));
    assert_true(fabs((double)kept - mean) < 5 * sd);
    ops->dropout(k1, z, x, cut, p, seed, off);
    ops->dropout(k1, z + cut, x + cut, n - cut, p, seed, off + cut);
    assert_memory_equal(y, z, n * sizeof *y);
    ops->dropout(k3, w, w, n, p, seed, off);
    assert_memory_equal(y, w, n * sizeof *y);
    ops->dropout(k3, z, y, n, p, seed, off);
    for (size_t i = 0; i < n; i++)
        assert_true(z[i] == y[i] * keep);
    ops->dropout(k3, z, x, n, p, seed + 1, off);
    size_t agree = 0;
    for (size_t i = 0; i < n; i++)
        agree += (y[i] != 0.0f) == (z[i] != 0.0f);
    double pa = (double)p * p + (1.0 - p) * (1.0 - p);
    assert_true(fabs((double)agree - n * pa) < 5 * sqrt(n * pa * (1 - pa)));
    ops->dropout(k3, z, x, n, 0.0f, seed, off);
    assert_memory_equal(z, x, n * sizeof *x);
    free(x), free(y), free(z), free(w);
    ops->ctx_destroy(k1);
    ops->ctx_destroy(k3);
}

int main(void)
{
    ops = kern_cpu_ops();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encoder),
        cmocka_unit_test(test_encoder_backward_reference),
        cmocka_unit_test(test_layernorm_forward),
        cmocka_unit_test(test_layernorm_grad),
        cmocka_unit_test(test_layernorm_backward_reference),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_relu),
        cmocka_unit_test(test_residual),
        cmocka_unit_test(test_pointwise_large),
        cmocka_unit_test(test_copy2d),
        cmocka_unit_test(test_dropout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
