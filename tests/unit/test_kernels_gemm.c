/* test_kernels_gemm.c — the CPU matmul (the GEMM behind every linear
 * layer): forward against the triple loop on shapes that take each of its
 * paths, backward against central finite differences and, on shapes split
 * over threads, against the formulas in double; and which OpenBLAS kernels
 * a process should start with where OpenBLAS fell back to its generic ones. */
#include <math.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels.h"
#include "kern_check.h"

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

/* ---- OpenBLAS's kernels -------------------------------------------------------------- */

static void test_blas_pick(void **state)
{
    (void)state;
    /* OpenBLAS's generic fallback on a CPU with AVX-512, or AVX2 and FMA:
     * the kernels of that instruction set, as later OpenBLAS releases pick. */
    assert_string_equal(kern_cpu_blas_pick("Prescott", true, true), "SkylakeX");
    assert_string_equal(kern_cpu_blas_pick("PRESCOTT", true, false), "SkylakeX");
    assert_string_equal(kern_cpu_blas_pick("Prescott", false, true), "Haswell");
    /* A real SSE3-only CPU, a model OpenBLAS knew, no verdict: as they are. */
    assert_null(kern_cpu_blas_pick("Prescott", false, false));
    assert_null(kern_cpu_blas_pick("Haswell", true, true));
    assert_null(kern_cpu_blas_pick("SkylakeX", true, true));
    assert_null(kern_cpu_blas_pick("Zen", false, true));
    assert_null(kern_cpu_blas_pick(NULL, true, true));
    /* This process's own: OpenBLAS names its kernels; a better choice is
     * only ever made over its fallback. */
    const char *core = kern_cpu_blas_core();
    assert_non_null(core);
    const char *better = kern_cpu_blas_better();
    if (better)
        assert_string_equal(core, "Prescott");
}

int main(void)
{
    ops = kern_cpu_ops();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_forward),
        cmocka_unit_test(test_matmul_grad),
        cmocka_unit_test(test_matmul_backward_reference),
        cmocka_unit_test(test_blas_pick),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
