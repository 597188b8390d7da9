/* gpu_check_act16.c — the CUDA 16-bit activation ops against the CPU's and
 * against the GPU's own fp32 op and cast (see test_gpu_kernels.c):
 * layernorm, GELU, the 16-bit GEMMs with their bias, GELU and residual
 * epilogues, the logits and cross-entropy, and their determinism. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "gpu_check.h"

/* ---- 16-bit activations (bf16/fp16 contexts) ----------------------------------------------- */

/* layernorm_forward16: out16 against the CPU's, mean and rstd as the fp32
 * test; then on the GPU alone, out16 bitwise the fp32 forward + cast, with
 * bitwise the same mean and rstd.  out_off (16-bit elements) moves out16 off
 * its 8-byte alignment for the scalar path. */
void test_layernorm16(int N, int C, int out_off)
{
    char name[64];
    snprintf(name, sizeof name, "layernorm16 C=%d%s", C, out_off ? " unal" : "");
    if (!have16(name, "layernorm_forward16", H->layernorm_forward16 != NULL, G->layernorm_forward16 != NULL))
        return;
    size_t NC = (size_t)N * C, o = (size_t)out_off;
    buf inp = mk(NC, 2), w = mk(C, 1), b = mk(C, 1);
    for (size_t i = 0; i < inp.n; i++) /* an offset, so the mean matters */
        inp.h[i] += 3.0f;
    G->copy_h2d(gk, inp.d, inp.h, inp.n * sizeof(float));
    buf16 out = mk16(NC + o, 0), again = mk16(NC, 0);
    /* The fp32 forward's out32 as aligned as out16 (16 or only 4 bytes), so
     * that both take the same (vector or scalar) path: the order of the row
     * sums, and so mean and rstd, depend on it. */
    size_t o32 = out_off % 4 ? 1 : 0;
    buf mean = mk(N, 0), rstd = mk(N, 0), out32 = mk(NC + o32, 0), mean32 = mk(N, 0), rstd32 = mk(N, 0);
    H->layernorm_forward16(hk, out.h + o, mean.h, rstd.h, inp.h, w.h, b.h, N, C);
    G->layernorm_forward16(gk, out.d + o, mean.d, rstd.d, inp.d, w.d, b.d, N, C);
    gsync(name);
    cmp16(name, "out16", &out, 1e-4, 1e-5);
    cmp(name, "mean", &mean, 1e-5, 1e-6);
    cmp(name, "rstd", &rstd, 1e-4, 1e-6);
    G->layernorm_forward(gk, out32.d + o32, mean32.d, rstd32.d, inp.d, w.d, b.d, N, C);
    gcast16(again.d, out32.d + o32, NC);
    gsync(name);
    size_t d = diff16(out.d + o, again.d, NC);
    bool stats = same_bits(mean.d, mean32.d, N) && same_bits(rstd.d, rstd32.d, N);
    printf("  %-22s %-9s %zu differ from the gpu's fp32 forward + cast, mean/rstd %s %s\n", name, "self", d,
           stats ? "bitwise equal" : "differ", d || !stats ? "FAIL" : "ok");
    if (d || !stats)
        FAIL("%s: not the fp32 forward followed by the cast: %zu outputs differ, mean/rstd %s", name, d,
             stats ? "equal" : "differ");

    /* Backward with the 16-bit copy of the updated dinp: dinp and the
     * weight gradients as the cpu's, and the copy bitwise the gpu's own
     * cast of its dinp.  From the cpu's mean and rstd on both sides. */
    if (have16(name, "layernorm_backward16", H->layernorm_backward16 != NULL, G->layernorm_backward16 != NULL)) {
        resync(&mean);
        resync(&rstd);
        buf dout = mk(NC, 1), dinp = mk(NC, 1), dw = mk(C, 0), db = mk(C, 0);
        buf16 d16 = mk16(NC + o, 0);
        H->layernorm_backward16(hk, dinp.h, d16.h + o, dw.h, db.h, dout.h, NULL, inp.h, w.h, mean.h, rstd.h, N, C);
        G->layernorm_backward16(gk, dinp.d, d16.d + o, dw.d, db.d, dout.d, NULL, inp.d, w.d, mean.d, rstd.d, N, C);
        gsync(name);
        cmp(name, "dinp", &dinp, 1e-4, 1e-5);
        cmp(name, "dweight", &dw, 1e-4, 1e-5);
        cmp(name, "dbias", &db, 1e-4, 1e-5);
        cmp16(name, "dinp16", &d16, 1e-4, 1e-5);
        gcast16(again.d, dinp.d, NC);
        gsync(name);
        size_t dd = diff16(d16.d + o, again.d, NC);
        printf("  %-22s %-9s %zu of dinp16 differ from the gpu's cast of its dinp %s\n", name, "self", dd,
               dd ? "FAIL" : "ok");
        if (dd)
            FAIL("%s: dinp16 is not dinp rounded: %zu differ", name, dd);
        /* dout in 16 bits (as the GEMM backwards write it) */
        buf16 o16 = mk16(NC, 1);
        buf dinp2 = mk(NC, 1), dw2 = mk(C, 0), db2 = mk(C, 0);
        H->layernorm_backward16(hk, dinp2.h, NULL, dw2.h, db2.h, NULL, o16.h, inp.h, w.h, mean.h, rstd.h, N, C);
        G->layernorm_backward16(gk, dinp2.d, NULL, dw2.d, db2.d, NULL, o16.d, inp.d, w.d, mean.d, rstd.d, N, C);
        gsync(name);
        cmp(name, "dinp/d16", &dinp2, 1e-4, 1e-5);
        cmp(name, "dweight/d16", &dw2, 1e-4, 1e-5);
        cmp(name, "dbias/d16", &db2, 1e-4, 1e-5);
        bfree(&dout), bfree(&dinp), bfree(&dw), bfree(&db), b16free(&d16), b16free(&o16), bfree(&dinp2), bfree(&dw2),
            bfree(&db2);
    }
    bfree(&inp), bfree(&w), bfree(&b), b16free(&out), b16free(&again), bfree(&mean), bfree(&rstd);
    bfree(&out32), bfree(&mean32), bfree(&rstd32);
}

/* gelu_forward16 and gelu_backward16 over n elements, 16 bits in and out,
 * the inputs in_off and the outputs out_off elements past an aligned start:
 * (0,0) and (0,4) four at a time, (1,*) and (0,2) the scalar path (an
 * 8-byte vector needs every pointer 8-byte aligned).  The outputs start as
 * random bits: both must overwrite.  Each is the gpu's own fp32 op on the
 * widened inputs, then the cast; backward also in place over dout16. */
void test_gelu16(size_t n, int in_off, int out_off)
{
    char name[64];
    snprintf(name, sizeof name, "gelu16 n=%zu +%d/+%d", n, in_off, out_off);
    if (!have16(name, "gelu_forward16", H->gelu_forward16 != NULL, G->gelu_forward16 != NULL) ||
        !have16(name, "gelu_backward16", H->gelu_backward16 != NULL, G->gelu_backward16 != NULL))
        return;
    size_t io = (size_t)in_off, oo = (size_t)out_off;
    buf16 x = mk16(n + io, 4), y = mk16(n + io, 1);
    buf xw = mk(n, 0), yw = mk(n, 0), f32 = mk(n, 0);
    buf16 out = mk16(n + oo, 0), dinp = mk16(n + oo, 0), again = mk16(n, 0);
    H->gelu_forward16(hk, out.h + oo, x.h + io, n);
    G->gelu_forward16(gk, out.d + oo, x.d + io, n);
    H->gelu_backward16(hk, dinp.h + oo, x.h + io, y.h + io, n);
    G->gelu_backward16(gk, dinp.d + oo, x.d + io, y.d + io, n);
    gsync(name);
    cmp16(name, "out16", &out, 1e-5, 1e-6);
    cmp16(name, "dinp16", &dinp, 1e-5, 1e-6);
    widen16(xw.h, x.h + io, n);
    widen16(yw.h, y.h + io, n);
    G->copy_h2d(gk, xw.d, xw.h, n * sizeof(float));
    G->copy_h2d(gk, yw.d, yw.h, n * sizeof(float));
    G->gelu_forward(gk, f32.d, xw.d, n);
    gcast16(again.d, f32.d, n);
    gsync(name);
    size_t df = diff16(out.d + oo, again.d, n);
    G->gelu_backward(gk, f32.d, xw.d, yw.d, n);
    gcast16(again.d, f32.d, n);
    G->gelu_backward16(gk, y.d + io, x.d + io, y.d + io, n); /* in place over dout16 */
    gsync(name);
    size_t db = diff16(dinp.d + oo, again.d, n), dp = diff16(y.d + io, again.d, n);
    printf("  %-22s %-9s %zu (forward), %zu (backward), %zu (in place) differ from the gpu's fp32 op + cast %s\n",
           name, "self", df, db, dp, df || db || dp ? "FAIL" : "ok");
    if (df || db || dp)
        FAIL("%s: not the fp32 op followed by the cast: %zu forward, %zu backward, %zu in-place values differ", name,
             df, db, dp);
    b16free(&x), b16free(&y), bfree(&xw), bfree(&yw), bfree(&f32), b16free(&out), b16free(&dinp), b16free(&again);
}

/* matmul_forward16, then matmul_backward16 three times: from dout (fp32),
 * from dout16, and from dout16 with dinp16 (16 bits) for dinp, with the
 * same 16-bit inp16 (and dout16) on both sides.  Gradient buffers start
 * random: dinp must be overwritten (or left alone when not asked for),
 * dweight and dbias accumulated into. */
void test_matmul16(int N, int C, int OC, bool bias, bool want_dinp, int offset)
{
    const char *prec = ctx_bf16 ? "bf16" : "fp16";
    double tol = 2e-2; /* as the bf16/fp16 matmul tests: 16-bit GEMM inputs */
    char name[80];
    snprintf(name, sizeof name, "matmul16 %s %dx%dx%d%s%s%s", prec, N, C, OC, bias ? "" : " nobias",
             want_dinp ? "" : " nodinp", offset ? " unal" : "");
    if (!have16(name, "matmul_forward16", H->matmul_forward16 != NULL, G->matmul_forward16 != NULL) ||
        !have16(name, "matmul_backward16", H->matmul_backward16 != NULL, G->matmul_backward16 != NULL))
        return;
    size_t o = (size_t)offset;
    buf16 inp = mk16((size_t)N * C + o, 1);
    buf16 w = mk16((size_t)OC * C + o, 1);
    buf b = mk((size_t)OC + o, 1), out = mk((size_t)N * OC + o, 1);
    const float *bh = bias ? b.h + o : NULL, *bd = bias ? b.d + o : NULL;
    H->matmul_forward16(hk, out.h + o, inp.h + o, w.h + o, bh, N, C, OC);
    G->matmul_forward16(gk, out.d + o, inp.d + o, w.d + o, bd, N, C, OC);
    gsync(name);
    cmp(name, "out", &out, tol, tol);
    if (have16(name, "matmul_forward16_residual", H->matmul_forward16_residual != NULL,
               G->matmul_forward16_residual != NULL)) {
        buf res = mk((size_t)N * OC + o, 1), out2 = mk((size_t)N * OC + o, 1);
        H->matmul_forward16_residual(hk, out2.h + o, inp.h + o, w.h + o, bh, res.h + o, N, C, OC);
        G->matmul_forward16_residual(gk, out2.d + o, inp.d + o, w.d + o, bd, res.d + o, N, C, OC);
        gsync(name);
        cmp(name, "out+res", &out2, tol, tol);
        bfree(&res), bfree(&out2);
    }
    buf dout = mk((size_t)N * OC + o, 1);
    buf16 dout16 = mk16((size_t)N * OC + o, 1);
    for (int mode = 0; mode <= 2; mode++) {
        bool from16 = mode >= 1, to16 = mode == 2 && want_dinp;
        buf dinp = mk((size_t)N * C + o, 1), dw = mk((size_t)OC * C + o, 1), db = mk((size_t)OC + o, 1);
        buf16 dinp16 = mk16((size_t)N * C + o, 1);
        const float *dh = from16 ? NULL : dout.h + o, *dd = from16 ? NULL : dout.d + o;
        const uint16_t *d16h = from16 ? dout16.h + o : NULL, *d16d = from16 ? dout16.d + o : NULL;
        float *dih = want_dinp && !to16 ? dinp.h + o : NULL, *did = want_dinp && !to16 ? dinp.d + o : NULL;
        H->matmul_backward16(hk, dih, to16 ? dinp16.h + o : NULL, dw.h + o, bias ? db.h + o : NULL, dh, d16h,
                             inp.h + o, w.h + o, N, C, OC);
        G->matmul_backward16(gk, did, to16 ? dinp16.d + o : NULL, dw.d + o, bias ? db.d + o : NULL, dd, d16d,
                             inp.d + o, w.d + o, N, C, OC);
        gsync(name);
        const char *tag = mode == 2 ? "/d16->16" : from16 ? "/d16" : "/d32";
        char what[32];
        if (to16) {
            snprintf(what, sizeof what, "dinp16%s", tag);
            cmp16(name, what, &dinp16, tol, tol);
        } else {
            snprintf(what, sizeof what, "dinp%s", tag);
            cmp(name, what, &dinp, tol, tol);
        }
        snprintf(what, sizeof what, "dw%s", tag);
        cmp(name, what, &dw, tol, tol);
        snprintf(what, sizeof what, "dbias%s", tag);
        cmp(name, what, &db, 1e-4, 1e-5); /* fp32 sums of the same values */
        bfree(&dinp), bfree(&dw), bfree(&db), b16free(&dinp16);
    }
    b16free(&inp), b16free(&w), bfree(&b), bfree(&out), bfree(&dout), b16free(&dout16);
}

/* A 16-bit GEMM output with a bias, as the MLP's hidden layer: out16 =
 * inp16·Wᵀ + bias16, rounded once. */
void test_out16_bias(int N, int C, int OC, int offset)
{
    const char *prec = ctx_bf16 ? "bf16" : "fp16";
    char name[80];
    snprintf(name, sizeof name, "out16+bias %s %dx%dx%d%s", prec, N, C, OC, offset ? " unal" : "");
    if (!have16(name, "matmul_forward16_out16", H->matmul_forward16_out16 != NULL,
                G->matmul_forward16_out16 != NULL))
        return;
    size_t o = (size_t)offset;
    buf16 inp = mk16((size_t)N * C + o, 1), out = mk16((size_t)N * OC + o, 1), w = mk16((size_t)OC * C + o, 1);
    buf b = mk((size_t)OC + o, 1);
    H->matmul_forward16_out16(hk, out.h + o, inp.h + o, w.h + o, b.h + o, N, C, OC);
    G->matmul_forward16_out16(gk, out.d + o, inp.d + o, w.d + o, b.d + o, N, C, OC);
    gsync(name);
    cmp16(name, "out16", &out, 2e-2, 2e-2); /* 16-bit GEMM inputs, as test_matmul */
    b16free(&inp), b16free(&out), b16free(&w), bfree(&b);
}

/* The MLP's GEMM+GELU ops, shaped as the model runs them: fc (N,C)→(N,Hd)
 * writing pre16 and out16 = gelu(pre16), then the gradient through the
 * fcproj GEMM (N,Hd)→(N,C) and the GELU into dinp16 (N,Hd).  On the GPU
 * GELU (and its derivative) is taken in the GEMM's epilogue of the fp32
 * value before rounding, where the cpu rounds first: the 16-bit GEMM
 * tolerance covers that.  Hd not a multiple of 8 takes the GPU's fallback
 * (the two ops).  The backward starts from the cpu's pre16 and out16 on both sides. */
void test_gelu_gemm16(int N, int C, int Hd, int offset)
{
    const char *prec = ctx_bf16 ? "bf16" : "fp16";
    char name[80];
    snprintf(name, sizeof name, "gemm+gelu16 %s %dx%dx%d%s", prec, N, C, Hd, offset ? " unal" : "");
    if (!have16(name, "matmul_forward16_gelu", H->matmul_forward16_gelu != NULL,
                G->matmul_forward16_gelu != NULL) ||
        !have16(name, "matmul_backward16_dgelu", H->matmul_backward16_dgelu != NULL,
                G->matmul_backward16_dgelu != NULL))
        return;
    size_t o = (size_t)offset, NH = (size_t)N * Hd;
    buf16 inp = mk16((size_t)N * C + o, 1), pre = mk16(NH + o, 0), out = mk16(NH + o, 0);
    buf16 w = mk16((size_t)Hd * C + o, 1);
    buf b = mk((size_t)Hd + o, 1);
    H->matmul_forward16_gelu(hk, out.h + o, pre.h + o, inp.h + o, w.h + o, b.h + o, N, C, Hd);
    G->matmul_forward16_gelu(gk, out.d + o, pre.d + o, inp.d + o, w.d + o, b.d + o, N, C, Hd);
    gsync(name);
    cmp16(name, "pre16", &pre, 2e-2, 2e-2); /* 16-bit GEMM inputs, as test_matmul */
    cmp16(name, "out16", &out, 2e-2, 2e-2);

    G->copy_h2d(gk, pre.d, pre.h, pre.n * 2);
    G->copy_h2d(gk, out.d, out.h, out.n * 2); /* the fcproj GEMM's input */
    buf16 dout = mk16((size_t)N * C + o, 1), dinp = mk16(NH + o, 0);
    buf16 wp = mk16((size_t)C * Hd + o, 1);
    buf dw = mk((size_t)C * Hd + o, 1), db = mk((size_t)C + o, 1);
    H->matmul_backward16_dgelu(hk, dinp.h + o, pre.h + o, dw.h + o, db.h + o, dout.h + o, out.h + o, wp.h + o, N,
                               Hd, C);
    G->matmul_backward16_dgelu(gk, dinp.d + o, pre.d + o, dw.d + o, db.d + o, dout.d + o, out.d + o, wp.d + o, N,
                               Hd, C);
    gsync(name);
    cmp16(name, "dinp16", &dinp, 2e-2, 2e-2);
    cmp(name, "dw", &dw, 2e-2, 2e-2);
    cmp(name, "dbias", &db, 1e-4, 1e-5); /* fp32 sums of the same values */
    b16free(&inp), b16free(&pre), b16free(&out), b16free(&w), bfree(&b), b16free(&dout), b16free(&dinp),
        b16free(&wp), bfree(&dw), bfree(&db);
}

/* The output layer in 16 bits: logits16 = inp16·Wᵀ rounded once, then
 * cross-entropy on them and its 16-bit dlogits, in place as the model runs
 * it.  Both sides start from the same 16-bit logits (the CPU's), so the
 * loss comparison tests the kernels, not the GEMM's rounding. */
void test_logits16(int N, int C, int V, int Vp)
{
    const char *prec = ctx_bf16 ? "bf16" : "fp16";
    char name[80];
    snprintf(name, sizeof name, "logits16 %s %dx%dx%d/%d", prec, N, C, V, Vp);
    if (!have16(name, "matmul_forward16_out16", H->matmul_forward16_out16 != NULL,
                G->matmul_forward16_out16 != NULL) ||
        !have16(name, "crossentropy_forward16", H->crossentropy_forward16 != NULL,
                G->crossentropy_forward16 != NULL) ||
        !have16(name, "crossentropy_backward16", H->crossentropy_backward16 != NULL,
                G->crossentropy_backward16 != NULL))
        return;
    buf16 inp = mk16((size_t)N * C, 1), out = mk16((size_t)N * Vp, 0), w = mk16((size_t)Vp * C, 1);
    H->matmul_forward16_out16(hk, out.h, inp.h, w.h, NULL, N, C, Vp);
    G->matmul_forward16_out16(gk, out.d, inp.d, w.d, NULL, N, C, Vp);
    gsync(name);
    cmp16(name, "logits16", &out, 2e-2, 2e-2); /* 16-bit GEMM inputs, as test_matmul */

    /* Cross-entropy from the CPU's logits on both sides, scaled up so the
     * softmax is not flat. */
    float *f = hmalloc((size_t)N * Vp * sizeof(float));
    for (size_t i = 0; i < (size_t)N * Vp; i++)
        f[i] = 8.0f * rnd();
    narrow16(out.h, f, (size_t)N * Vp);
    free(f);
    G->copy_h2d(gk, out.d, out.h, (size_t)N * Vp * 2);
    buf lse = mk(N, 0), losses = mk(N, 0), dloss = mk(N, 1);
    ibuf tg = mki(N, 0, V);
    H->crossentropy_forward16(hk, losses.h, lse.h, out.h, tg.h, N, V, Vp);
    G->crossentropy_forward16(gk, losses.d, lse.d, out.d, tg.d, N, V, Vp);
    gsync(name);
    cmp(name, "losses", &losses, 1e-5, 1e-6);
    cmp(name, "lse", &lse, 1e-5, 1e-6);
    resync(&lse);
    buf16 dl = mk16((size_t)N * Vp, 0);
    H->crossentropy_backward16(hk, dl.h, out.h, lse.h, tg.h, dloss.h, N, V, Vp);
    G->crossentropy_backward16(gk, dl.d, out.d, lse.d, tg.d, dloss.d, N, V, Vp);
    gsync(name);
    cmp16(name, "dlogits16", &dl, 1e-4, 1e-6);
    G->crossentropy_backward16(gk, out.d, out.d, lse.d, tg.d, dloss.d, N, V, Vp); /* in place */
    gsync(name);
    size_t d = diff16(out.d, dl.d, (size_t)N * Vp);
    printf("  %-22s %-9s %s\n", name, "in place", d ? "FAIL" : "ok (bitwise)");
    if (d)
        FAIL("%s: %zu dlogits16 computed in place differ from out of place", name, d);
    /* Fused: where Vp allows (a multiple of 8, 16-byte rows: GPT-2's), the
     * register-resident kernel, which sums in another order and with
     * exp2f, so against the CPU within the two ops' tolerances, not the
     * two kernels' bits; elsewhere the fallback, which is the two kernels'
     * arithmetic and must give their bits (from the GPU's own lse).  Both:
     * twice the same bits. */
    if (have16(name, "crossentropy_fused16", H->crossentropy_fused16 != NULL, G->crossentropy_fused16 != NULL)) {
        buf lse2 = mk(N, 0), l2 = mk(N, 0), l3 = mk(N, 0), l4 = mk(N, 0);
        memcpy(l3.h, losses.h, (size_t)N * sizeof(float));
        G->copy_h2d(gk, out.d, out.h, (size_t)N * Vp * 2);
        G->crossentropy_fused16(gk, l3.d, out.d, tg.d, dloss.d, N, V, Vp);
        G->copy_h2d(gk, dl.d, out.h, (size_t)N * Vp * 2);
        G->crossentropy_fused16(gk, l4.d, dl.d, tg.d, dloss.d, N, V, Vp);
        gsync(name);
        cmp(name, "fused losses", &l3, 1e-5, 1e-6);
        buf16 fz = {dl.h, out.d, (size_t)N * Vp}; /* the CPU's dlogits16 (from its lse) vs the fused ones */
        cmp16(name, "fused dlogits16", &fz, 1e-4, 1e-6);
        size_t dt = diff16(out.d, dl.d, (size_t)N * Vp);
        bool st = same_bits(l3.d, l4.d, N);
        printf("  %-22s %-9s twice: losses %s, %zu dlogits16 differ %s\n", name, "fused", st ? "same" : "differ", dt,
               st && !dt ? "ok" : "FAIL");
        if (!st || dt)
            FAIL("%s: the fused cross-entropy twice gives other bits (%zu dlogits16 differ)", name, dt);
        if (Vp % 8) { /* the fallback */
            G->copy_h2d(gk, out.d, out.h, (size_t)N * Vp * 2);
            G->crossentropy_forward16(gk, l2.d, lse2.d, out.d, tg.d, N, V, Vp);
            G->crossentropy_backward16(gk, dl.d, out.d, lse2.d, tg.d, dloss.d, N, V, Vp);
            G->crossentropy_fused16(gk, l3.d, out.d, tg.d, dloss.d, N, V, Vp);
            gsync(name);
            size_t dg = diff16(out.d, dl.d, (size_t)N * Vp);
            bool sl = same_bits(l2.d, l3.d, N);
            printf("  %-22s %-9s losses %s, %zu dlogits16 differ from the two kernels' %s\n", name, "fused",
                   sl ? "same" : "differ", dg, sl && !dg ? "ok" : "FAIL");
            if (!sl || dg)
                FAIL("%s: the fused fallback is not the two kernels (%zu dlogits16 differ)", name, dg);
        }
        bfree(&lse2), bfree(&l2), bfree(&l3), bfree(&l4);
    }
    b16free(&inp), b16free(&out), b16free(&w), bfree(&lse), bfree(&losses), bfree(&dloss), ibfree(&tg), b16free(&dl);
}

/* dbias from dout16 (the 16-bit column sums) is deterministic: twice from
 * zero, the same bits. */
void test_determinism16(void)
{
    int N = 1000, C = 40, OC = 777;
    if (!have16("determinism16", "matmul_backward16", H->matmul_backward16 != NULL, G->matmul_backward16 != NULL))
        return;
    buf16 dout = mk16((size_t)N * OC, 1), inp = mk16((size_t)N * C, 1), w = mk16((size_t)OC * C, 1);
    buf dw = mk((size_t)OC * C, 0), b1 = mk(OC, 0), b2 = mk(OC, 0);
    G->matmul_backward16(gk, NULL, NULL, dw.d, b1.d, NULL, dout.d, inp.d, w.d, N, C, OC);
    G->matmul_backward16(gk, NULL, NULL, dw.d, b2.d, NULL, dout.d, inp.d, w.d, N, C, OC);
    gsync("determinism16");
    bool same = same_bits(b1.d, b2.d, OC);
    printf("  %-22s matmul_backward16 dbias from dout16 %s\n", "determinism16", same ? "ok" : "FAIL");
    if (!same)
        FAIL("determinism16: dbias from dout16 gave different bits on a second run");
    b16free(&dout), b16free(&inp), b16free(&w), bfree(&dw), bfree(&b1), bfree(&b2);
}
