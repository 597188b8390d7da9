/* test_kernels_optim.c — the CPU optimizer step and what surrounds it:
 * AdamW against its formulas in double, its 16-bit parameter copy and its
 * per-segment form bit for bit, the gradients' sum of squares (the global
 * norm), the count of non-finite values, and the copy, scale and zero
 * helpers. */
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

int main(void)
{
    ops = kern_cpu_ops();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_adamw_p16),
        cmocka_unit_test(test_adamw_multi),
        cmocka_unit_test(test_sumsq_and_helpers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
