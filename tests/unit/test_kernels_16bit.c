/* test_kernels_16bit.c — the CPU kernels' 16-bit side: each 16-bit
 * activation op is its fp32 op and a cast, bitwise, and the bf16 and fp16
 * casts round trip every value, decode known ones, round ties to even and
 * match an IEEE half reference computed in double. */
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

/* ---- 16-bit activations: each op is its fp32 op and a cast, bitwise ---------------------------- */

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

        /* Llama's RMSNorm: out16 and rstd as the fp32 op's; backward from
         * dout or dout16, with dinp16 the updated dinp rounded. */
        {
            float *r3 = zerov(N), *g1 = randv(N * C, 1), *g2 = malloc(N * C * sizeof *g2), *dw1 = zerov(C);
            float *dw2 = zerov(C), *dwid = zerov(N * C);
            uint16_t *d16 = h16(N * C), *got2 = h16(N * C);
            assert_non_null(g2);
            ops->rmsnorm_forward(k, t, r1, x, w, N, C, 1e-5f);
            narrow(k, want, t, N * C);
            ops->rmsnorm_forward16(k, got, r3, x, w, N, C, 1e-5f);
            assert_memory_equal(got, want, N * C * sizeof *got);
            assert_memory_equal(r1, r3, N * sizeof *r1);
            memcpy(g2, g1, N * C * sizeof *g2);
            ops->rmsnorm_backward(k, g1, dw1, d, x, w, r1, N, C);
            narrow(k, want, g1, N * C);
            ops->rmsnorm_backward16(k, g2, got, dw2, d, NULL, x, w, r1, N, C);
            assert_memory_equal(g1, g2, N * C * sizeof *g1);
            assert_memory_equal(got, want, N * C * sizeof *got);
            assert_memory_equal(dw1, dw2, C * sizeof *dw1);
            narrow(k, d16, d, N * C);
            widen(k, dwid, d16, N * C);
            ops->rmsnorm_backward(k, g1, NULL, dwid, x, w, r1, N, C);
            narrow(k, want, g1, N * C);
            ops->rmsnorm_backward16(k, g2, got2, NULL, NULL, d16, x, w, r1, N, C);
            assert_memory_equal(g1, g2, N * C * sizeof *g1);
            assert_memory_equal(got2, want, N * C * sizeof *got2);
            free(r3), free(g1), free(g2), free(dw1), free(dw2), free(dwid), free(d16), free(got2);
        }
        /* SwiGLU: 16 bits in and out ([gate | up] of N rows of 2·(C/2)). */
        {
            int F = C / 2;
            uint16_t *gu16 = h16(N * C), *o16 = h16(N * F), *do16 = h16(N * F), *dg16 = h16(N * C);
            float *guw = zerov(N * C), *dow = zerov(N * F), *o32 = zerov(N * F), *dg32 = zerov(N * C);
            narrow(k, gu16, x, N * C);
            narrow(k, do16, d, N * F);
            widen(k, guw, gu16, N * C);
            widen(k, dow, do16, N * F);
            ops->swiglu_forward(k, o32, guw, N, F);
            narrow(k, want, o32, N * F);
            ops->swiglu_forward16(k, o16, gu16, N, F);
            assert_memory_equal(o16, want, N * F * sizeof *o16);
            ops->swiglu_backward(k, dg32, guw, dow, N, F);
            narrow(k, want, dg32, N * C);
            ops->swiglu_backward16(k, dg16, gu16, do16, N, F);
            assert_memory_equal(dg16, want, N * C * sizeof *dg16);
            free(gu16), free(o16), free(do16), free(dg16), free(guw), free(dow), free(o32), free(dg32);
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

int main(void)
{
    ops = kern_cpu_ops();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_act16_ops),
        cmocka_unit_test(test_casts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
