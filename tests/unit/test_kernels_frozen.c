/* test_kernels_frozen.c — the CPU kernels a frozen base (LoRA, lora.h) runs
 * on: encoder_forward16w against a plain loop with its own decoding of bf16
 * and fp16, and the backward ops without a weight gradient
 * (matmul_backward16 without dweight and inp16, rmsnorm_backward and
 * layernorm_backward(16) without dweight and dbias) giving dinp bitwise
 * as they do with one.  All exact: widening is exact, and a gradient that
 * is not asked for must not change the arithmetic of the one that is.
 *
 * Each case runs on one thread and on three, at a size below and one above
 * the CPU backend's parallel threshold (KCPU_PAR_MIN, 16384 elements). */
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

static const kern_precision precs[2] = {KERN_BF16, KERN_FP16};
static const int nthreads[2] = {1, 3};

/* ---- a 16-bit value decoded by its definition ---------------------------------------- */

static float bf16_value(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* IEEE binary16 (finite): sign, 5 exponent bits biased by 15, 10 mantissa
 * bits; exponent 0 is subnormal, m·2^-24. */
static float f16_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return (float)(h & 0x8000 ? -v : v);
}

/* A random finite 16-bit value of the type prec names (NaN and inf have
 * no single widening the two decoders need agree on). */
static uint16_t rand16(kern_precision prec)
{
    for (;;) {
        uint16_t h = (uint16_t)rng_u32();
        if (prec == KERN_FP16 ? (h & 0x7c00) != 0x7c00 : (h & 0x7f80) != 0x7f80)
            return h;
    }
}

/* ---- encoder_forward16w ------------------------------------------------------------------ */

static void encoder16w_case(kern_precision prec, int threads, int B, int T, int C, int V, bool with_wpe)
{
    kern_ctx *k = ops->ctx_create(threads, 0, prec, NULL);
    assert_non_null(k);
    size_t n = (size_t)B * T * C;
    uint16_t *wte16 = h16((size_t)V * C);
    for (size_t i = 0; i < (size_t)V * C; i++)
        wte16[i] = rand16(prec);
    float *wpe = with_wpe ? randv((size_t)T * C, 1) : NULL;
    int32_t *inp = malloc((size_t)B * T * sizeof *inp);
    assert_non_null(inp);
    for (int i = 0; i < B * T; i++)
        inp[i] = (int32_t)(rng_u32() % (uint32_t)V);
    float *want = zerov(n), *got = randv(n, 1); /* overwritten */
    for (int bt = 0; bt < B * T; bt++)
        for (int c = 0; c < C; c++) {
            uint16_t h = wte16[(size_t)inp[bt] * C + c];
            float v = prec == KERN_FP16 ? f16_value(h) : bf16_value(h);
            if (wpe)
                v += wpe[(size_t)(bt % T) * C + c];
            want[(size_t)bt * C + c] = v;
        }
    ops->encoder_forward16w(k, got, inp, wte16, wpe, B, T, C);
    if (memcmp(got, want, n * sizeof *got))
        fail_msg("encoder_forward16w %s threads=%d B=%d T=%d C=%d wpe=%s: not the plain loop's bits",
                 prec == KERN_FP16 ? "fp16" : "bf16", threads, B, T, C, with_wpe ? "yes" : "NULL");
    free(wte16), free(wpe), free(inp), free(want), free(got);
    ops->ctx_destroy(k);
}

static void test_encoder16w(void **state)
{
    (void)state;
    assert_non_null(ops->encoder_forward16w);
    for (int p = 0; p < 2; p++)
        for (int t = 0; t < 2; t++)
            for (int w = 0; w < 2; w++) {
                encoder16w_case(precs[p], nthreads[t], 2, 5, 33, 7, w);
                encoder16w_case(precs[p], nthreads[t], 3, 41, 200, 50, w); /* 24600 elements */
            }
}

/* ---- matmul_backward16 without a weight gradient ---------------------------------------------- */

/* dinp (fp32 or dinp16) and dbias with dweight NULL and inp16 NULL, against
 * the same call with dweight and inp16: bitwise. */
static void mm16_case(kern_precision prec, int threads, int N, int C, int OC, bool from16, bool to16)
{
    kern_ctx *k = ops->ctx_create(threads, 0, prec, NULL);
    assert_non_null(k);
    void (*narrow)(kern_ctx *, uint16_t *, const float *, size_t) =
        prec == KERN_FP16 ? ops->cast_f32_to_f16 : ops->cast_f32_to_bf16;
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, nd = (size_t)N * OC;
    float *x = randv(ni, 1), *w = randv(nw, 1), *d = randv(nd, 1);
    uint16_t *x16 = h16(ni), *w16 = h16(nw), *d16 = h16(nd);
    narrow(k, x16, x, ni);
    narrow(k, w16, w, nw);
    narrow(k, d16, d, nd);
    float *dw = zerov(nw), *db1 = randv(OC, 1), *db2 = dupv(db1, OC);
    float *di1 = randv(ni, 1), *di2 = randv(ni, 1); /* overwritten, unless to16 */
    float *di2_0 = dupv(di2, ni);
    uint16_t *g1 = h16(ni), *g2 = h16(ni);
    const float *dout = from16 ? NULL : d;
    const uint16_t *dout16 = from16 ? d16 : NULL;
    ops->matmul_backward16(k, to16 ? NULL : di1, to16 ? g1 : NULL, dw, db1, dout, dout16, x16, w16, N, C, OC);
    ops->matmul_backward16(k, to16 ? NULL : di2, to16 ? g2 : NULL, NULL, db2, dout, dout16, NULL, w16, N, C, OC);
    if (to16) {
        assert_memory_equal(g2, g1, ni * sizeof *g1);
        assert_memory_equal(di2, di2_0, ni * sizeof *di2); /* no fp32 dinp asked for */
    } else {
        assert_memory_equal(di2, di1, ni * sizeof *di1);
    }
    assert_memory_equal(db2, db1, OC * sizeof *db1);
    free(x), free(w), free(d), free(x16), free(w16), free(d16), free(dw), free(db1), free(db2);
    free(di1), free(di2), free(di2_0), free(g1), free(g2);
    ops->ctx_destroy(k);
}

static void test_matmul_backward16_frozen(void **state)
{
    (void)state;
    for (int p = 0; p < 2; p++)
        for (int t = 0; t < 2; t++)
            for (int v = 0; v < 3; v++) { /* dout fp32, dout16, dout16 with dinp16 */
                mm16_case(precs[p], nthreads[t], 13, 24, 17, v > 0, v == 2);
                mm16_case(precs[p], nthreads[t], 70, 96, 130, v > 0, v == 2);
            }
}

/* ---- norms without weight gradients ---------------------------------------------------------- */

/* rmsnorm_backward, layernorm_backward and layernorm_backward16 (dout fp32
 * with dinp16, and dout16) with the weight gradients NULL: dinp (+=, from
 * the same random start) and dinp16 bitwise as with them. */
static void norms_case(kern_precision prec, int threads, int N, int C)
{
    kern_ctx *k = ops->ctx_create(threads, 0, prec, NULL);
    assert_non_null(k);
    size_t n = (size_t)N * C;
    float *x = randv(n, 2), *w = randv(C, 1), *b = randv(C, 1), *d = randv(n, 1), *g0 = randv(n, 1);
    float *y = zerov(n), *mean = zerov(N), *rstd = zerov(N), *dw = zerov(C), *db = zerov(C);
    float *g1 = dupv(g0, n), *g2 = dupv(g0, n);

    ops->rmsnorm_forward(k, y, rstd, x, w, N, C, 1e-5f);
    ops->rmsnorm_backward(k, g1, dw, d, x, w, rstd, N, C);
    ops->rmsnorm_backward(k, g2, NULL, d, x, w, rstd, N, C);
    assert_memory_equal(g2, g1, n * sizeof *g1);

    ops->layernorm_forward(k, y, mean, rstd, x, w, b, N, C);
    memcpy(g1, g0, n * sizeof *g1);
    memcpy(g2, g0, n * sizeof *g2);
    ops->layernorm_backward(k, g1, dw, db, d, x, w, mean, rstd, N, C);
    ops->layernorm_backward(k, g2, NULL, NULL, d, x, w, mean, rstd, N, C);
    assert_memory_equal(g2, g1, n * sizeof *g1);

    uint16_t *o1 = h16(n), *o2 = h16(n), *d16 = h16(n);
    memcpy(g1, g0, n * sizeof *g1);
    memcpy(g2, g0, n * sizeof *g2);
    ops->layernorm_backward16(k, g1, o1, dw, db, d, NULL, x, w, mean, rstd, N, C);
    ops->layernorm_backward16(k, g2, o2, NULL, NULL, d, NULL, x, w, mean, rstd, N, C);
    assert_memory_equal(g2, g1, n * sizeof *g1);
    assert_memory_equal(o2, o1, n * sizeof *o1);
    (prec == KERN_FP16 ? ops->cast_f32_to_f16 : ops->cast_f32_to_bf16)(k, d16, d, n);
    memcpy(g1, g0, n * sizeof *g1);
    memcpy(g2, g0, n * sizeof *g2);
    ops->layernorm_backward16(k, g1, NULL, dw, db, NULL, d16, x, w, mean, rstd, N, C);
    ops->layernorm_backward16(k, g2, NULL, NULL, NULL, NULL, d16, x, w, mean, rstd, N, C);
    assert_memory_equal(g2, g1, n * sizeof *g1);

    free(x), free(w), free(b), free(d), free(g0), free(y), free(mean), free(rstd), free(dw), free(db);
    free(g1), free(g2), free(o1), free(o2), free(d16);
    ops->ctx_destroy(k);
}

static void test_norms_frozen(void **state)
{
    (void)state;
    for (int p = 0; p < 2; p++)
        for (int t = 0; t < 2; t++) {
            norms_case(precs[p], nthreads[t], 9, 37);
            norms_case(precs[p], nthreads[t], 131, 200); /* 26200 elements */
        }
}

int main(void)
{
    ops = kern_cpu_ops();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encoder16w),
        cmocka_unit_test(test_matmul_backward16_frozen),
        cmocka_unit_test(test_norms_frozen),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
