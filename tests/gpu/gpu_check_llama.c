/* gpu_check_llama.c — the CUDA kernels of a Llama layer against the CPU's
 * (see test_gpu_kernels.c): the embedding without positions, RMSNorm, RoPE,
 * SwiGLU and the fused grouped-query attention, with and without packed
 * samples' start mask; and RMSNorm and SwiGLU in 16 bits (a 16-bit
 * context's activation ops). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels.h"
#include "gpu_check.h"

/* An op that a Llama model needs missing from the cuda table: a failure
 * of its own, named, rather than a crash. */
static bool have(const char *name, const void *op)
{
    if (!op)
        FAIL("%s: the cuda ops table lacks it", name);
    return op != NULL;
}

void test_encoder_nowpe(int B, int T, int C, int V)
{
    char name[64];
    snprintf(name, sizeof name, "encoder without wpe C=%d", C);
    buf out = mk((size_t)B * T * C, 0), wte = mk((size_t)V * C, 1), dout = mk((size_t)B * T * C, 1),
        dwte = mk((size_t)V * C, 1);
    ibuf inp = mki((size_t)B * T, 0, V);
    H->encoder_forward(hk, out.h, inp.h, wte.h, NULL, B, T, C);
    G->encoder_forward(gk, out.d, inp.d, wte.d, NULL, B, T, C);
    gsync(name);
    cmp(name, "out", &out, 0, 0);
    H->encoder_backward(hk, dwte.h, NULL, dout.h, inp.h, B, T, C);
    G->encoder_backward(gk, dwte.d, NULL, dout.d, inp.d, B, T, C);
    gsync(name);
    cmp(name, "dwte", &dwte, 1e-5, 1e-6);
    bfree(&out), bfree(&wte), bfree(&dout), bfree(&dwte), ibfree(&inp);
}

void test_rmsnorm(int N, int C)
{
    char name[64];
    snprintf(name, sizeof name, "rmsnorm N=%d C=%d", N, C);
    if (!have(name, (const void *)G->rmsnorm_forward) || !have(name, (const void *)G->rmsnorm_backward))
        return;
    buf inp = mk((size_t)N * C, 2), w = mk(C, 1), out = mk((size_t)N * C, 0), rstd = mk(N, 0);
    H->rmsnorm_forward(hk, out.h, rstd.h, inp.h, w.h, N, C, 1e-5f);
    G->rmsnorm_forward(gk, out.d, rstd.d, inp.d, w.d, N, C, 1e-5f);
    gsync(name);
    cmp(name, "out", &out, 1e-4, 1e-5);
    cmp(name, "rstd", &rstd, 1e-5, 1e-6);
    resync(&rstd); /* backward alone, from the cpu's statistics */
    buf dout = mk((size_t)N * C, 1), dinp = mk((size_t)N * C, 1), dw = mk(C, 1);
    H->rmsnorm_backward(hk, dinp.h, dw.h, dout.h, inp.h, w.h, rstd.h, N, C);
    G->rmsnorm_backward(gk, dinp.d, dw.d, dout.d, inp.d, w.d, rstd.d, N, C);
    gsync(name);
    cmp(name, "dinp", &dinp, 1e-4, 1e-5);
    cmp(name, "dweight", &dw, 1e-4, 1e-5);
    bfree(&inp), bfree(&w), bfree(&out), bfree(&rstd), bfree(&dout), bfree(&dinp), bfree(&dw);
}

/* On qkv rows as the model lays them out: NH + KVH heads turn, the value
 * heads stay.  with_pos: positions that restart (packed samples) and run
 * into the thousands (large angles: the device's sincos range reduction). */
void test_rope(int B, int T, int NH, int KVH, int HS, bool with_pos)
{
    char name[80];
    snprintf(name, sizeof name, "rope T=%d NH=%d KVH=%d HS=%d%s", T, NH, KVH, HS, with_pos ? " pos" : "");
    if (!have(name, (const void *)G->rope_forward) || !have(name, (const void *)G->rope_backward))
        return;
    const int N = B * T, W = (NH + 2 * KVH) * HS;
    buf x = mk((size_t)N * W, 1), inv = mk(HS / 2, 0);
    for (int i = 0; i < HS / 2; i++)
        inv.h[i] = (float)pow(500000.0, -2.0 * i / HS);
    resync(&inv);
    ibuf pos = mki(N, 0, 1);
    for (int r = 0; r < N; r++)
        pos.h[r] = r % 97 == 13 ? 0 : 3000 + 5 * r;
    G->copy_h2d(gk, pos.d, pos.h, (size_t)N * sizeof(int32_t));
    H->rope_forward(hk, x.h, inv.h, with_pos ? pos.h : NULL, N, T, NH + KVH, HS, W);
    G->rope_forward(gk, x.d, inv.d, with_pos ? pos.d : NULL, N, T, NH + KVH, HS, W);
    gsync(name);
    cmp(name, "forward", &x, 1e-4, 1e-5);
    resync(&x);
    H->rope_backward(hk, x.h, inv.h, with_pos ? pos.h : NULL, N, T, NH + KVH, HS, W);
    G->rope_backward(gk, x.d, inv.d, with_pos ? pos.d : NULL, N, T, NH + KVH, HS, W);
    gsync(name);
    cmp(name, "backward", &x, 1e-4, 1e-5);
    bfree(&x), bfree(&inv), ibfree(&pos);
}

void test_swiglu(int N, int F)
{
    char name[64];
    snprintf(name, sizeof name, "swiglu N=%d F=%d", N, F);
    if (!have(name, (const void *)G->swiglu_forward) || !have(name, (const void *)G->swiglu_backward))
        return;
    buf gu = mk((size_t)N * 2 * F, 6), out = mk((size_t)N * F, 0), dout = mk((size_t)N * F, 1),
        dgu = mk((size_t)N * 2 * F, 1); /* random: backward overwrites it */
    H->swiglu_forward(hk, out.h, gu.h, N, F);
    G->swiglu_forward(gk, out.d, gu.d, N, F);
    gsync(name);
    cmp(name, "out", &out, 1e-5, 1e-6);
    H->swiglu_backward(hk, dgu.h, gu.h, dout.h, N, F);
    G->swiglu_backward(gk, dgu.d, gu.d, dout.d, N, F);
    gsync(name);
    cmp(name, "dgu", &dgu, 1e-5, 1e-6);
    bfree(&gu), bfree(&out), bfree(&dout), bfree(&dgu);
}

/* rmsnorm_forward16 and rmsnorm_backward16 from a 16-bit dout, writing
 * dinp16, against the cpu's within one 16-bit step; and each the gpu's own
 * fp32 op followed by its cast, bit for bit. */
void test_rmsnorm16(int N, int C)
{
    char name[64];
    snprintf(name, sizeof name, "rmsnorm16 N=%d C=%d", N, C);
    if (!have16(name, "rmsnorm_forward16", H->rmsnorm_forward16 != NULL, G->rmsnorm_forward16 != NULL) ||
        !have16(name, "rmsnorm_backward16", H->rmsnorm_backward16 != NULL, G->rmsnorm_backward16 != NULL))
        return;
    size_t n = (size_t)N * C;
    buf inp = mk(n, 2), w = mk(C, 1), rstd = mk(N, 0), f32 = mk(n, 0), r32 = mk(N, 0);
    buf16 out = mk16(n, 0), again = mk16(n, 0);
    H->rmsnorm_forward16(hk, out.h, rstd.h, inp.h, w.h, N, C, 1e-5f);
    G->rmsnorm_forward16(gk, out.d, rstd.d, inp.d, w.d, N, C, 1e-5f);
    G->rmsnorm_forward(gk, f32.d, r32.d, inp.d, w.d, N, C, 1e-5f);
    gcast16(again.d, f32.d, n);
    gsync(name);
    cmp16(name, "out16", &out, 1e-4, 1e-5);
    cmp(name, "rstd", &rstd, 1e-5, 1e-6);
    size_t df = diff16(out.d, again.d, n), dr = same_bits(rstd.d, r32.d, (size_t)N) ? 0 : 1;

    resync(&rstd); /* backward alone, from the cpu's statistics */
    buf16 dout = mk16(n, 1), dinp16 = mk16(n, 0);
    buf dinp = mk(n, 1), dw = mk(C, 1), dout32 = mk(n, 0), dinp32 = mk(n, 0);
    G->copy_h2d(gk, dinp32.d, dinp.h, n * sizeof(float)); /* dinp's start, before the cpu adds to it */
    H->rmsnorm_backward16(hk, dinp.h, dinp16.h, dw.h, NULL, dout.h, inp.h, w.h, rstd.h, N, C);
    G->rmsnorm_backward16(gk, dinp.d, dinp16.d, dw.d, NULL, dout.d, inp.d, w.d, rstd.d, N, C);
    widen16(dout32.h, dout.h, n);
    G->copy_h2d(gk, dout32.d, dout32.h, n * sizeof(float));
    G->rmsnorm_backward(gk, dinp32.d, NULL, dout32.d, inp.d, w.d, rstd.d, N, C);
    gcast16(again.d, dinp32.d, n);
    gsync(name);
    cmp(name, "dinp", &dinp, 1e-4, 1e-5);
    cmp16(name, "dinp16", &dinp16, 1e-4, 1e-5);
    cmp(name, "dweight", &dw, 1e-4, 1e-5);
    size_t db = diff16(dinp16.d, again.d, n);
    printf("  %-22s %-9s %zu (out16), %zu (rstd), %zu (dinp16) differ from the gpu's fp32 op + cast %s\n", name,
           "self", df, dr, db, df || dr || db ? "FAIL" : "ok");
    if (df || dr || db)
        FAIL("%s: not the fp32 op followed by the cast: %zu out16, %zu rstd, %zu dinp16", name, df, dr, db);
    bfree(&inp), bfree(&w), bfree(&rstd), bfree(&f32), bfree(&r32), b16free(&out), b16free(&again);
    b16free(&dout), b16free(&dinp16), bfree(&dinp), bfree(&dw), bfree(&dout32), bfree(&dinp32);
}

/* swiglu_forward16 and swiglu_backward16 against the cpu's, and the gpu's
 * fp32 ops on the widened inputs followed by the cast, bit for bit. */
void test_swiglu16(int N, int F)
{
    char name[64];
    snprintf(name, sizeof name, "swiglu16 N=%d F=%d", N, F);
    if (!have16(name, "swiglu_forward16", H->swiglu_forward16 != NULL, G->swiglu_forward16 != NULL) ||
        !have16(name, "swiglu_backward16", H->swiglu_backward16 != NULL, G->swiglu_backward16 != NULL))
        return;
    size_t n = (size_t)N * F;
    buf16 gu = mk16(2 * n, 6), dout = mk16(n, 1), out = mk16(n, 0), dgu = mk16(2 * n, 0), again = mk16(2 * n, 0);
    buf guw = mk(2 * n, 0), doutw = mk(n, 0), f32 = mk(2 * n, 0);
    H->swiglu_forward16(hk, out.h, gu.h, N, F);
    G->swiglu_forward16(gk, out.d, gu.d, N, F);
    H->swiglu_backward16(hk, dgu.h, gu.h, dout.h, N, F);
    G->swiglu_backward16(gk, dgu.d, gu.d, dout.d, N, F);
    gsync(name);
    cmp16(name, "out16", &out, 1e-5, 1e-6);
    cmp16(name, "dgu16", &dgu, 1e-5, 1e-6);
    widen16(guw.h, gu.h, 2 * n);
    widen16(doutw.h, dout.h, n);
    G->copy_h2d(gk, guw.d, guw.h, 2 * n * sizeof(float));
    G->copy_h2d(gk, doutw.d, doutw.h, n * sizeof(float));
    G->swiglu_forward(gk, f32.d, guw.d, N, F);
    gcast16(again.d, f32.d, n);
    gsync(name);
    size_t df = diff16(out.d, again.d, n);
    G->swiglu_backward(gk, f32.d, guw.d, doutw.d, N, F);
    gcast16(again.d, f32.d, 2 * n);
    gsync(name);
    size_t db = diff16(dgu.d, again.d, 2 * n);
    printf("  %-22s %-9s %zu (forward), %zu (backward) differ from the gpu's fp32 op + cast %s\n", name, "self", df,
           db, df || db ? "FAIL" : "ok");
    if (df || db)
        FAIL("%s: not the fp32 op followed by the cast: %zu forward, %zu backward", name, df, db);
    b16free(&gu), b16free(&dout), b16free(&out), b16free(&dgu), b16free(&again);
    bfree(&guw), bfree(&doutw), bfree(&f32);
}

/* packed: samples of 1, 33, 65, ... tokens in turn in each sequence. */
void test_gqa(int B, int T, int NH, int KVH, int HS, bool packed, double rtol, double atol)
{
    char name[80];
    snprintf(name, sizeof name, "gqa B=%d T=%d NH=%d KVH=%d HS=%d%s", B, T, NH, KVH, HS, packed ? " packed" : "");
    if (!have(name, (const void *)G->attention_gqa_ok) || !G->attention_gqa_ok(gk, NH, KVH, HS)) {
        FAIL("%s: the cuda kernels decline this shape", name);
        return;
    }
    const int W = (NH + 2 * KVH) * HS, C = NH * HS;
    const size_t BT = (size_t)B * T;
    buf qkv = mk(BT * W, 2), out = mk(BT * C, 0), lse = mk((size_t)B * NH * T, 0);
    ibuf start = mki(BT, 0, 1);
    for (int b = 0; b < B; b++) {
        int s0 = 0, len = 1;
        for (int t = 0; t < T; t++) {
            if (t - s0 >= len)
                s0 = t, len += 32;
            start.h[(size_t)b * T + t] = s0;
        }
    }
    G->copy_h2d(gk, start.d, start.h, BT * sizeof(int32_t));
    H->attention_gqa_forward(hk, out.h, lse.h, qkv.h, packed ? start.h : NULL, B, T, NH, KVH, HS);
    G->attention_gqa_forward(gk, out.d, lse.d, qkv.d, packed ? start.d : NULL, B, T, NH, KVH, HS);
    gsync(name);
    cmp(name, "out", &out, rtol, atol);
    /* In fp32 lse is the reference's to rounding; where the kernels round q
     * and k to 16 bits (gqa_mma, cuDNN) the scores, and with them lse, are
     * only as close as the output. */
    cmp(name, "lse", &lse, rtol > 1e-3 ? rtol : 1e-5, atol > 1e-3 ? atol : 1e-6);
    resync(&out), resync(&lse); /* backward alone, from the cpu's */
    buf dout = mk(BT * C, 1), dqkv = mk(BT * W, 1); /* random: backward overwrites it */
    H->attention_gqa_backward(hk, dqkv.h, dout.h, out.h, lse.h, qkv.h, packed ? start.h : NULL, B, T, NH, KVH, HS);
    G->attention_gqa_backward(gk, dqkv.d, dout.d, out.d, lse.d, qkv.d, packed ? start.d : NULL, B, T, NH, KVH, HS);
    gsync(name);
    cmp(name, "dqkv", &dqkv, rtol, atol);
    bfree(&qkv), bfree(&out), bfree(&lse), bfree(&dout), bfree(&dqkv), ibfree(&start);
}
