/* gpu_check_frozen.c — the CUDA ops a frozen base (LoRA, lora.h) runs on,
 * against the CPU's (see test_gpu_kernels.c): the embedding from a 16-bit
 * token table, exact (one exact widening and one add on both sides), and
 * the backward ops without weight gradients (a frozen norm, a frozen GEMM
 * weight without its input), whose dinp must be bitwise the GPU's own with
 * the gradients asked for, and within the usual tolerance of the CPU's. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "gpu_check.h"

/* A second buffer starting from the same values as b (host and device). */
static buf twin(const buf *b)
{
    buf t = mk(b->n, 0);
    memcpy(t.h, b->h, b->n * sizeof(float));
    resync(&t);
    return t;
}

static void verdict_same(const char *name, const char *what, bool same)
{
    printf("  %-22s %-9s bitwise as with the weight gradients %s\n", name, what, same ? "ok" : "FAIL");
    if (!same)
        FAIL("%s %s: without the weight gradients, not the bits it has with them", name, what);
}

/* encoder_forward16w in a bf16/fp16 context, out starting random (it must
 * be overwritten).  table_off (16-bit elements) moves the table off its
 * 8-byte alignment: the scalar path. */
void test_encoder16w(int B, int T, int C, int V, bool with_wpe, int table_off)
{
    char name[64];
    snprintf(name, sizeof name, "encoder16w C=%d%s%s", C, with_wpe ? "" : " nowpe", table_off ? " unal" : "");
    if (!have16(name, "encoder_forward16w", H->encoder_forward16w != NULL, G->encoder_forward16w != NULL))
        return;
    size_t o = (size_t)table_off;
    buf16 wte = mk16((size_t)V * C + o, 4);
    buf wpe = mk((size_t)T * C, 1), out = mk((size_t)B * T * C, 1);
    ibuf inp = mki((size_t)B * T, 0, V);
    H->encoder_forward16w(hk, out.h, inp.h, wte.h + o, with_wpe ? wpe.h : NULL, B, T, C);
    G->encoder_forward16w(gk, out.d, inp.d, wte.d + o, with_wpe ? wpe.d : NULL, B, T, C);
    gsync(name);
    cmp(name, "out", &out, 0, 0);
    b16free(&wte), bfree(&wpe), bfree(&out), ibfree(&inp);
}

/* rmsnorm_backward without dweight and layernorm_backward without dweight
 * and dbias (fp32 context), from the cpu's statistics, dinp from a random
 * start on all sides. */
void test_frozen_norms(int N, int C)
{
    char name[64];
    snprintf(name, sizeof name, "frozen norms N=%d C=%d", N, C);
    size_t NC = (size_t)N * C;
    buf inp = mk(NC, 2), w = mk(C, 1), b = mk(C, 1), out = mk(NC, 0), mean = mk(N, 0), rstd = mk(N, 0);
    buf dout = mk(NC, 1), dw = mk(C, 1), db = mk(C, 1), d1 = mk(NC, 1), d2 = twin(&d1);

    H->rmsnorm_forward(hk, out.h, rstd.h, inp.h, w.h, N, C, 1e-5f);
    resync(&rstd);
    G->rmsnorm_backward(gk, d1.d, dw.d, dout.d, inp.d, w.d, rstd.d, N, C);
    G->rmsnorm_backward(gk, d2.d, NULL, dout.d, inp.d, w.d, rstd.d, N, C);
    H->rmsnorm_backward(hk, d2.h, NULL, dout.h, inp.h, w.h, rstd.h, N, C);
    gsync(name);
    verdict_same(name, "rms dinp", same_bits(d1.d, d2.d, NC));
    cmp(name, "rms dinp", &d2, 1e-4, 1e-5);

    H->layernorm_forward(hk, out.h, mean.h, rstd.h, inp.h, w.h, b.h, N, C);
    resync(&mean), resync(&rstd), resync(&d1);
    memcpy(d2.h, d1.h, NC * sizeof(float));
    resync(&d2);
    G->layernorm_backward(gk, d1.d, dw.d, db.d, dout.d, inp.d, w.d, mean.d, rstd.d, N, C);
    G->layernorm_backward(gk, d2.d, NULL, NULL, dout.d, inp.d, w.d, mean.d, rstd.d, N, C);
    H->layernorm_backward(hk, d2.h, NULL, NULL, dout.h, inp.h, w.h, mean.h, rstd.h, N, C);
    gsync(name);
    verdict_same(name, "ln dinp", same_bits(d1.d, d2.d, NC));
    cmp(name, "ln dinp", &d2, 1e-4, 1e-5);
    bfree(&inp), bfree(&w), bfree(&b), bfree(&out), bfree(&mean), bfree(&rstd);
    bfree(&dout), bfree(&dw), bfree(&db), bfree(&d1), bfree(&d2);
}

/* In a bf16/fp16 context: layernorm_backward16 without dweight and dbias
 * (dout fp32 with dinp16, and dout16). */
void test_frozen_norms16(int N, int C)
{
    char name[64];
    snprintf(name, sizeof name, "frozen norms16 N=%d C=%d", N, C);
    if (!have16(name, "layernorm_backward16", H->layernorm_backward16 != NULL, G->layernorm_backward16 != NULL))
        return;
    size_t NC = (size_t)N * C;
    buf inp = mk(NC, 2), w = mk(C, 1), b = mk(C, 1), out = mk(NC, 0), mean = mk(N, 0), rstd = mk(N, 0);
    buf dout = mk(NC, 1), dw = mk(C, 1), db = mk(C, 1);
    buf16 dout16 = mk16(NC, 1), o1 = mk16(NC, 0), o2 = mk16(NC, 0);
    H->layernorm_forward(hk, out.h, mean.h, rstd.h, inp.h, w.h, b.h, N, C);
    resync(&mean), resync(&rstd);
    for (int from16 = 0; from16 <= 1; from16++) {
        buf d1 = mk(NC, 1), d2 = twin(&d1);
        const float *dh = from16 ? NULL : dout.h, *dd = from16 ? NULL : dout.d;
        const uint16_t *d16h = from16 ? dout16.h : NULL, *d16d = from16 ? dout16.d : NULL;
        G->layernorm_backward16(gk, d1.d, from16 ? NULL : o1.d, dw.d, db.d, dd, d16d, inp.d, w.d, mean.d, rstd.d, N, C);
        G->layernorm_backward16(gk, d2.d, from16 ? NULL : o2.d, NULL, NULL, dd, d16d, inp.d, w.d, mean.d, rstd.d, N,
                                C);
        H->layernorm_backward16(hk, d2.h, from16 ? NULL : o2.h, NULL, NULL, dh, d16h, inp.h, w.h, mean.h, rstd.h, N,
                                C);
        gsync(name);
        verdict_same(name, from16 ? "dinp/d16" : "dinp", same_bits(d1.d, d2.d, NC));
        cmp(name, from16 ? "dinp/d16" : "dinp", &d2, 1e-4, 1e-5);
        if (!from16) {
            verdict_same(name, "dinp16", diff16(o1.d, o2.d, NC) == 0);
            cmp16(name, "dinp16", &o2, 1e-4, 1e-5);
        }
        bfree(&d1), bfree(&d2);
    }
    bfree(&inp), bfree(&w), bfree(&b), bfree(&out), bfree(&mean), bfree(&rstd), bfree(&dout), bfree(&dw), bfree(&db);
    b16free(&dout16), b16free(&o1), b16free(&o2);
}

/* In a bf16/fp16 context: matmul_backward16 without dweight and with inp16
 * NULL (dout fp32, dout16, dout16 with dinp16); dbias accumulated from the
 * same start on all sides. */
void test_frozen_mm16(int N, int C, int OC)
{
    char name[64];
    snprintf(name, sizeof name, "frozen mm16 %dx%dx%d", N, C, OC);
    if (!have16(name, "matmul_backward16", H->matmul_backward16 != NULL, G->matmul_backward16 != NULL))
        return;
    size_t NC = (size_t)N * C;
    double tol = 2e-2; /* as the bf16/fp16 matmul tests: 16-bit GEMM inputs */
    size_t ND = (size_t)N * OC;
    buf16 x16 = mk16(NC, 1), w16 = mk16((size_t)OC * C, 1), g16 = mk16(ND, 1);
    buf g = mk(ND, 1), mdw = mk((size_t)OC * C, 1), mdb = mk(OC, 1), mdb2 = twin(&mdb);
    for (int mode = 0; mode <= 2; mode++) {
        bool from16 = mode >= 1, to16 = mode == 2;
        buf i1 = mk(NC, 1), i2 = mk(NC, 1);
        buf16 t1 = mk16(NC, 0), t2 = mk16(NC, 0);
        resync(&mdb2); /* dbias from the same bits on all sides */
        G->copy_h2d(gk, mdb.d, mdb2.h, (size_t)OC * sizeof(float));
        const float *gh = from16 ? NULL : g.h, *gd = from16 ? NULL : g.d;
        const uint16_t *gh16 = from16 ? g16.h : NULL, *gd16 = from16 ? g16.d : NULL;
        G->matmul_backward16(gk, to16 ? NULL : i1.d, to16 ? t1.d : NULL, mdw.d, mdb.d, gd, gd16, x16.d, w16.d, N, C,
                             OC);
        G->matmul_backward16(gk, to16 ? NULL : i2.d, to16 ? t2.d : NULL, NULL, mdb2.d, gd, gd16, NULL, w16.d, N, C,
                             OC);
        H->matmul_backward16(hk, to16 ? NULL : i2.h, to16 ? t2.h : NULL, NULL, mdb2.h, gh, gh16, NULL, w16.h, N, C,
                             OC);
        gsync(name);
        const char *what = mode == 2 ? "dinp16" : from16 ? "dinp/d16" : "dinp";
        if (to16) {
            verdict_same(name, what, diff16(t1.d, t2.d, NC) == 0);
            cmp16(name, what, &t2, tol, tol);
        } else {
            verdict_same(name, what, same_bits(i1.d, i2.d, NC));
            cmp(name, what, &i2, tol, tol);
        }
        verdict_same(name, "dbias", same_bits(mdb.d, mdb2.d, OC));
        cmp(name, "dbias", &mdb2, 1e-4, 1e-5);
        bfree(&i1), bfree(&i2), b16free(&t1), b16free(&t2);
    }
    b16free(&x16), b16free(&w16), b16free(&g16), bfree(&g), bfree(&mdw), bfree(&mdb), bfree(&mdb2);
}
