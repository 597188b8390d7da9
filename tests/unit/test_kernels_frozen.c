/* test_kernels_frozen.c — the CPU kernels a frozen base (LoRA, lora.h) runs
 * on: encoder_forward16w against a plain loop with its own decoding of bf16
 * and fp16, exact (widening is exact).
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

int main(void)
{
    ops = kern_cpu_ops();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encoder16w),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
