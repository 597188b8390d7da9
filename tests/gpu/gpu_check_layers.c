/* gpu_check_layers.c — the CUDA kernels of a transformer's layers against
 * the CPU's (see test_gpu_kernels.c): memory helpers, the encoder,
 * layernorm, matmul, attention (the reference and the fused kernels, on
 * fp32 and 16-bit qkv), the pointwise ops (dropout among them) and
 * cross-entropy. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "gpu_check.h"

/* ---- the ops ------------------------------------------------------------------------------ */

void test_memory(void)
{
    size_t n = 10007;
    buf a = mk(n, 1.0f);
    H->zero(hk, a.h, 5000);
    G->zero(gk, a.d, 5000);
    H->scale(hk, a.h + 1, n - 1, -0.37f); /* +1: unaligned path */
    G->scale(gk, a.d + 1, n - 1, -0.37f);
    gsync("memory");
    cmp("zero+scale", "p", &a, 0, 0);
    bfree(&a);
    /* Dropout: the mask is (seed, offset + i)'s, so exact; the vector path,
     * then an unaligned start in place (the backward's form). */
    buf x = mk(n, 1.0f), y = mk(n, 0);
    H->dropout(hk, y.h, x.h, n, 0.3f, 77, 1000003);
    G->dropout(gk, y.d, x.d, n, 0.3f, 77, 1000003);
    gsync("dropout");
    cmp("dropout", "out", &y, 0, 0);
    H->dropout(hk, x.h + 1, x.h + 1, n - 1, 0.1f, 5, 9);
    G->dropout(gk, x.d + 1, x.d + 1, n - 1, 0.1f, 5, 9);
    gsync("dropout");
    cmp("dropout", "in place", &x, 0, 0);
    bfree(&x), bfree(&y);
}

void test_encoder(int B, int T, int C, int V)
{
    char name[64];
    snprintf(name, sizeof name, "encoder C=%d", C);
    buf out = mk((size_t)B * T * C, 0), wte = mk((size_t)V * C, 1), wpe = mk((size_t)T * C, 1);
    ibuf inp = mki((size_t)B * T, 0, V);
    H->encoder_forward(hk, out.h, inp.h, wte.h, wpe.h, B, T, C);
    G->encoder_forward(gk, out.d, inp.d, wte.d, wpe.d, B, T, C);
    gsync(name);
    cmp(name, "out", &out, 0, 0);
    buf dout = mk((size_t)B * T * C, 1), dwte = mk((size_t)V * C, 1), dwpe = mk((size_t)T * C, 1);
    H->encoder_backward(hk, dwte.h, dwpe.h, dout.h, inp.h, B, T, C);
    G->encoder_backward(gk, dwte.d, dwpe.d, dout.d, inp.d, B, T, C);
    gsync(name);
    cmp(name, "dwte", &dwte, 1e-5, 1e-6);
    cmp(name, "dwpe", &dwpe, 1e-5, 1e-6);
    bfree(&out), bfree(&wte), bfree(&wpe), ibfree(&inp), bfree(&dout), bfree(&dwte), bfree(&dwpe);
}

void test_layernorm(int N, int C)
{
    char name[64];
    snprintf(name, sizeof name, "layernorm C=%d", C);
    buf inp = mk((size_t)N * C, 2), w = mk(C, 1), b = mk(C, 1);
    for (size_t i = 0; i < inp.n; i++) /* an offset, so the mean matters */
        inp.h[i] += 3.0f;
    G->copy_h2d(gk, inp.d, inp.h, inp.n * sizeof(float));
    buf out = mk((size_t)N * C, 0), mean = mk(N, 0), rstd = mk(N, 0);
    H->layernorm_forward(hk, out.h, mean.h, rstd.h, inp.h, w.h, b.h, N, C);
    G->layernorm_forward(gk, out.d, mean.d, rstd.d, inp.d, w.d, b.d, N, C);
    gsync(name);
    cmp(name, "out", &out, 1e-4, 1e-5);
    cmp(name, "mean", &mean, 1e-5, 1e-6);
    cmp(name, "rstd", &rstd, 1e-4, 1e-6);
    buf dout = mk((size_t)N * C, 1), dinp = mk((size_t)N * C, 1), dw = mk(C, 1), db = mk(C, 1);
    /* Both backwards from the cpu's saved statistics: tests backward alone. */
    G->copy_h2d(gk, mean.d, mean.h, N * sizeof(float));
    G->copy_h2d(gk, rstd.d, rstd.h, N * sizeof(float));
    H->layernorm_backward(hk, dinp.h, dw.h, db.h, dout.h, inp.h, w.h, mean.h, rstd.h, N, C);
    G->layernorm_backward(gk, dinp.d, dw.d, db.d, dout.d, inp.d, w.d, mean.d, rstd.d, N, C);
    gsync(name);
    cmp(name, "dinp", &dinp, 1e-4, 1e-5);
    cmp(name, "dweight", &dw, 1e-4, 1e-5);
    cmp(name, "dbias", &db, 1e-4, 1e-5);
    bfree(&inp), bfree(&w), bfree(&b), bfree(&out), bfree(&mean), bfree(&rstd);
    bfree(&dout), bfree(&dinp), bfree(&dw), bfree(&db);
}

/* offset: floats added to every pointer (1 = 4-byte aligned only). */
void test_matmul(const char *prec, int N, int C, int OC, bool bias, bool want_dinp, int offset, double rtol,
                 double atol)
{
    char name[64];
    snprintf(name, sizeof name, "matmul %s %dx%dx%d%s%s", prec, N, C, OC, bias ? "" : " nobias",
             offset ? " unal" : "");
    size_t o = (size_t)offset;
    buf inp = mk((size_t)N * C + o, 1), w = mk((size_t)OC * C + o, 1), b = mk((size_t)OC + o, 1);
    buf out = mk((size_t)N * OC + o, 0);
    const float *bh = bias ? b.h + o : NULL, *bd = bias ? b.d + o : NULL;
    H->matmul_forward(hk, out.h + o, inp.h + o, w.h + o, bh, N, C, OC);
    G->matmul_forward(gk, out.d + o, inp.d + o, w.d + o, bd, N, C, OC);
    gsync(name);
    cmp(name, "out", &out, rtol, atol);
    buf dout = mk((size_t)N * OC + o, 1), dinp = mk((size_t)N * C + o, 1), dw = mk((size_t)OC * C + o, 1),
        db = mk((size_t)OC + o, 1);
    H->matmul_backward(hk, want_dinp ? dinp.h + o : NULL, dw.h + o, bias ? db.h + o : NULL, dout.h + o, inp.h + o,
                       w.h + o, N, C, OC);
    G->matmul_backward(gk, want_dinp ? dinp.d + o : NULL, dw.d + o, bias ? db.d + o : NULL, dout.d + o, inp.d + o,
                       w.d + o, N, C, OC);
    gsync(name);
    cmp(name, "dinp", &dinp, rtol, atol);
    cmp(name, "dweight", &dw, rtol, atol);
    cmp(name, "dbias", &db, 1e-4, 1e-5); /* an fp32 reduction in every precision */
    bfree(&inp), bfree(&w), bfree(&b), bfree(&out), bfree(&dout), bfree(&dinp), bfree(&dw), bfree(&db);
}

void test_attention(const char *prec, int B, int T, int C, int NH, double rtol, double atol)
{
    char name[64];
    snprintf(name, sizeof name, "attention %s T=%d C=%d NH=%d", prec, T, C, NH);
    size_t BTC = (size_t)B * T * C, TT = (size_t)B * NH * T * T;
    buf inp = mk(3 * BTC, 1), out = mk(BTC, 0), pre = mk(TT, 0), att = mk(TT, 0);
    H->attention_forward(hk, out.h, pre.h, att.h, inp.h, B, T, C, NH);
    G->attention_forward(gk, out.d, pre.d, att.d, inp.d, B, T, C, NH);
    gsync(name);
    layout tri = {(size_t)B * NH * T, (size_t)T, (size_t)T, T};
    cmp_l(name, "preatt", pre.d, pre.h, TT, tri, rtol, atol);
    cmp_l(name, "att", att.d, att.h, TT, tri, rtol, atol);
    cmp(name, "out", &out, rtol, atol);
    buf dout = mk(BTC, 1), dinp = mk(3 * BTC, 1), dpre = mk(TT, 0), datt = mk(TT, 0);
    /* Each backend from its own att. */
    H->attention_backward(hk, dinp.h, dpre.h, datt.h, dout.h, inp.h, att.h, B, T, C, NH);
    G->attention_backward(gk, dinp.d, dpre.d, datt.d, dout.d, inp.d, att.d, B, T, C, NH);
    gsync(name);
    cmp(name, "dinp", &dinp, rtol, atol);
    bfree(&inp), bfree(&out), bfree(&pre), bfree(&att), bfree(&dout), bfree(&dinp), bfree(&dpre), bfree(&datt);
}

/* Fused attention against the CPU's materialised one: out, each row's
 * log-sum-exp (from the CPU's scaled scores), and dinp. */
void test_attention_fused(const char *prec, int B, int T, int C, int NH, double rtol, double atol)
{
    char name[64];
    snprintf(name, sizeof name, "fused attention %s B=%d T=%d C=%d NH=%d", prec, B, T, C, NH);
    if (!G->attention_fused_ok || !G->attention_fused_ok(gk, C, NH)) {
        FAIL("%s: the cuda kernels decline this shape", name);
        return;
    }
    size_t BTC = (size_t)B * T * C, TT = (size_t)B * NH * T * T, rows = (size_t)B * NH * T;
    buf inp = mk(3 * BTC, 1), out = mk(BTC, 0), pre = mk(TT, 0), att = mk(TT, 0), lse = mk(rows, 0);
    H->attention_forward(hk, out.h, pre.h, att.h, inp.h, B, T, C, NH);
    G->attention_fused_forward(gk, out.d, lse.d, inp.d, B, T, C, NH);
    gsync(name);
    for (size_t r = 0; r < rows; r++) {
        const float *p = pre.h + r * T;
        size_t t = r % (size_t)T;
        double m = -INFINITY, s = 0;
        for (size_t j = 0; j <= t; j++)
            m = fmax(m, p[j]);
        for (size_t j = 0; j <= t; j++)
            s += exp(p[j] - m);
        lse.h[r] = (float)(m + log(s));
    }
    cmp(name, "out", &out, rtol, atol);
    cmp(name, "lse", &lse, 1e-2, 1e-3);
    buf dout = mk(BTC, 1), dinp = mk(3 * BTC, 1), dpre = mk(TT, 0), datt = mk(TT, 0);
    H->attention_backward(hk, dinp.h, dpre.h, datt.h, dout.h, inp.h, att.h, B, T, C, NH);
    G->attention_fused_backward(gk, dinp.d, dout.d, out.d, lse.d, inp.d, B, T, C, NH);
    gsync(name);
    cmp(name, "dinp", &dinp, rtol, atol);
    bfree(&inp), bfree(&out), bfree(&pre), bfree(&att), bfree(&lse), bfree(&dout), bfree(&dinp), bfree(&dpre),
        bfree(&datt);
}

/* Fused attention on a 16-bit qkv, with 16-bit out and dout, against the cpu's
 * reference ops of the same name (the materialised attention on the widened
 * qkv); backward from the same out16 and lse on both sides (the cpu's),
 * into a 16-bit dinp that starts random on both sides, dq's scratch random
 * too. */
void test_attention_fused16(const char *prec, int B, int T, int C, int NH, double rtol, double atol)
{
    char name[64];
    snprintf(name, sizeof name, "fused attention16 %s B=%d T=%d C=%d NH=%d", prec, B, T, C, NH);
    if (!have16(name, "attention_fused_forward16", H->attention_fused_forward16 != NULL,
                G->attention_fused_forward16 != NULL) ||
        !have16(name, "attention_fused_backward16", H->attention_fused_backward16 != NULL,
                G->attention_fused_backward16 != NULL))
        return;
    if (!G->attention_fused_ok || !G->attention_fused_ok(gk, C, NH)) {
        FAIL("%s: the cuda kernels decline this shape", name);
        return;
    }
    size_t BTC = (size_t)B * T * C, rows = (size_t)B * NH * T;
    buf16 inp = mk16(3 * BTC, 1), out = mk16(BTC, 1);
    buf lse = mk(rows, 0);
    H->attention_fused_forward16(hk, out.h, lse.h, inp.h, B, T, C, NH);
    G->attention_fused_forward16(gk, out.d, lse.d, inp.d, B, T, C, NH);
    gsync(name);
    cmp16(name, "out16", &out, rtol, atol);
    cmp(name, "lse", &lse, 1e-2, 1e-3);
    G->copy_h2d(gk, out.d, out.h, BTC * 2);
    resync(&lse);
    buf dq = mk(BTC, 1);
    buf16 dinp = mk16(3 * BTC, 1), dout = mk16(BTC, 1);
    H->attention_fused_backward16(hk, dinp.h, dq.h, dout.h, out.h, lse.h, inp.h, B, T, C, NH);
    G->attention_fused_backward16(gk, dinp.d, dq.d, dout.d, out.d, lse.d, inp.d, B, T, C, NH);
    gsync(name);
    cmp16(name, "dinp16", &dinp, rtol, atol);
    b16free(&inp), b16free(&out), bfree(&lse), b16free(&dout), bfree(&dq), b16free(&dinp);
}

void test_pointwise(size_t n, int offset)
{
    char name[64];
    size_t o = (size_t)offset;
    buf x = mk(n + o, 4), y = mk(n + o, 1), out = mk(n + o, 0), dinp = mk(n + o, 1);
    snprintf(name, sizeof name, "gelu n=%zu%s", n, o ? " unal" : "");
    H->gelu_forward(hk, out.h + o, x.h + o, n);
    G->gelu_forward(gk, out.d + o, x.d + o, n);
    H->gelu_backward(hk, dinp.h + o, x.h + o, y.h + o, n);
    G->gelu_backward(gk, dinp.d + o, x.d + o, y.d + o, n);
    gsync(name);
    cmp(name, "out", &out, 1e-5, 1e-6);
    cmp(name, "dinp", &dinp, 1e-5, 1e-6);
    snprintf(name, sizeof name, "relu n=%zu%s", n, o ? " unal" : "");
    H->relu_forward(hk, out.h + o, x.h + o, n);
    G->relu_forward(gk, out.d + o, x.d + o, n);
    resync(&dinp);
    H->relu_backward(hk, dinp.h + o, x.h + o, y.h + o, n);
    G->relu_backward(gk, dinp.d + o, x.d + o, y.d + o, n);
    gsync(name);
    cmp(name, "out", &out, 0, 0);
    cmp(name, "dinp", &dinp, 0, 0); /* a select: exact */
    /* gelu backward in place over dout, as the GPT model calls it */
    snprintf(name, sizeof name, "gelu in place n=%zu%s", n, o ? " unal" : "");
    H->gelu_backward(hk, y.h + o, x.h + o, y.h + o, n);
    G->gelu_backward(gk, y.d + o, x.d + o, y.d + o, n);
    gsync(name);
    cmp(name, "dinp", &y, 1e-5, 1e-6);
    /* The in-place gelu left y differing within its tolerance: the exact
     * checks below start from the same y on both sides. */
    resync(&y);
    snprintf(name, sizeof name, "residual n=%zu%s", n, o ? " unal" : "");
    H->residual_forward(hk, out.h + o, x.h + o, y.h + o, n);
    G->residual_forward(gk, out.d + o, x.d + o, y.d + o, n);
    resync(&dinp);
    H->accumulate(hk, dinp.h + o, y.h + o, n);
    G->accumulate(gk, dinp.d + o, y.d + o, n);
    gsync(name);
    cmp(name, "out", &out, 0, 0);
    cmp(name, "accumulate", &dinp, 0, 0);
    bfree(&x), bfree(&y), bfree(&out), bfree(&dinp);
}

/* Losses and lse: 1e-5 (one online-softmax reduction of V terms, in another
 * order).  dlogits: 1e-4, from the same lse on both sides (the CPU's is copied
 * over first), so only expf and rounding differ.  The padding must come out
 * exactly 0, from a random start, and in place must give the bits of out of
 * place.  Row 0's target is V: a NaN loss on both sides. */
void test_crossentropy(int N, int V, int Vp)
{
    char name[64];
    snprintf(name, sizeof name, "crossentropy V=%d Vp=%d", V, Vp);
    buf logits = mk((size_t)N * Vp, 8), lse = mk(N, 0), losses = mk(N, 0);
    ibuf tg = mki(N, 0, V);
    tg.h[0] = V;
    tg.h[1] = -100; /* ignored: loss 0, a zero dlogits row */
    G->copy_h2d(gk, tg.d, tg.h, 2 * sizeof(int32_t));
    H->crossentropy_forward(hk, losses.h, lse.h, logits.h, tg.h, N, V, Vp);
    G->crossentropy_forward(gk, losses.d, lse.d, logits.d, tg.d, N, V, Vp);
    gsync(name);
    cmp(name, "losses", &losses, 1e-5, 1e-6);
    cmp(name, "lse", &lse, 1e-5, 1e-6);
    float l0;
    G->copy_d2h(gk, &l0, losses.d, sizeof l0);
    if (!isnan(l0) || !isnan(losses.h[0]))
        FAIL("%s: a target outside [0,V) gave losses gpu %g cpu %g, not NaN", name, l0, losses.h[0]);
    resync(&lse);
    buf dlogits = mk((size_t)N * Vp, 1), dloss = mk(N, 1);
    H->crossentropy_backward(hk, dlogits.h, logits.h, lse.h, tg.h, dloss.h, N, V, Vp);
    G->crossentropy_backward(gk, dlogits.d, logits.d, lse.d, tg.d, dloss.d, N, V, Vp);
    gsync(name);
    cmp_l(name, "dlogits", dlogits.d, dlogits.h, dlogits.n, (layout){(size_t)N, (size_t)V, (size_t)Vp, 0}, 1e-4,
          1e-6);
    float *got = hmalloc(dlogits.n * sizeof(float)), *inplace = hmalloc(dlogits.n * sizeof(float));
    G->copy_d2h(gk, got, dlogits.d, dlogits.n * sizeof(float));
    size_t nonzero = 0;
    for (size_t r = 0; r < (size_t)N; r++)
        for (size_t c = (size_t)V; c < (size_t)Vp; c++)
            nonzero += got[r * Vp + c] != 0.0f;
    if (nonzero)
        FAIL("%s: %zu padded dlogits are not 0", name, nonzero);
    G->crossentropy_backward(gk, logits.d, logits.d, lse.d, tg.d, dloss.d, N, V, Vp);
    gsync(name);
    G->copy_d2h(gk, inplace, logits.d, dlogits.n * sizeof(float));
    bool same = !memcmp(got, inplace, dlogits.n * sizeof(float));
    printf("  %-22s %-9s %s\n", name, "in place", same ? "ok (bitwise)" : "FAIL");
    if (!same)
        FAIL("%s: dlogits computed in place differ from out of place", name);
    free(got), free(inplace);
    bfree(&logits), bfree(&lse), bfree(&losses), ibfree(&tg), bfree(&dlogits), bfree(&dloss);
}
