/* gpu_check_llama.c — the CUDA kernels of a Llama layer against the CPU's
 * (see test_gpu_kernels.c): the embedding without positions, RMSNorm, RoPE,
 * SwiGLU and the fused grouped-query attention, with and without packed
 * samples' start mask. */
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
    cmp(name, "lse", &lse, 1e-5, 1e-6);
    resync(&out), resync(&lse); /* backward alone, from the cpu's */
    buf dout = mk(BT * C, 1), dqkv = mk(BT * W, 1); /* random: backward overwrites it */
    H->attention_gqa_backward(hk, dqkv.h, dout.h, out.h, lse.h, qkv.h, packed ? start.h : NULL, B, T, NH, KVH, HS);
    G->attention_gqa_backward(gk, dqkv.d, dout.d, out.d, lse.d, qkv.d, packed ? start.d : NULL, B, T, NH, KVH, HS);
    gsync(name);
    cmp(name, "dqkv", &dqkv, rtol, atol);
    bfree(&qkv), bfree(&out), bfree(&lse), bfree(&dout), bfree(&dqkv), ibfree(&start);
}
