/* test_gpu_kernels.c — every CUDA kernel against its CPU reference.
 *
 * Exit 0: passed.  Exit 77: no usable GPU here (meson reports "skipped").
 * Anything else: failed, with the reason on stderr.  Takes the path of
 * gradd-cuda.so (or its directory) as its argument: the CUDA ops table is
 * the one that module exports (dlsym KERN_CUDA_OPS_SYMBOL), the CPU one is
 * kern_cpu_ops().  For every op: the same random inputs on both, both run,
 * the results compared element by element, |gpu − cpu| ≤ rtol·|cpu| +
 * atol·max|cpu|, with the maximum errors printed.  Gradient buffers start
 * random (not zero), so the "+=" of every backward that accumulates is
 * checked too, and that the ones that overwrite (matmul's dinp, gelu, relu,
 * crossentropy) do overwrite.
 *
 * Tolerances: fp32 context: 1e-5 (pointwise) to 1e-4 (GEMMs, reductions);
 * bf16/fp16 contexts (GEMM inputs in 16 bits, fp32 accumulate): 2e-2 of
 * the largest value; casts and counts: exact.
 *
 * The 16-bit activation ops (layernorm_forward16, gelu_forward16,
 * gelu_backward16) round an fp32 result once, and the two backends' fp32
 * results may differ in the last fp32 bits, which can carry a value across
 * a 16-bit rounding boundary: their outputs are compared widened to fp32,
 * |gpu − cpu| ≤ ulp16(cpu) + the fp32 op's tolerance, with the count of
 * bitwise matches printed.  On the GPU alone they must be bitwise the fp32
 * op followed by the GPU's cast, as kernels.h defines them.
 * matmul_forward16/backward16 get the same 16-bit operands on both sides
 * and the bf16/fp16 GEMM tolerance; dbias is an fp32 sum on both: 1e-4.
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <libgen.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool/dev.h"
#include "kernels.h"

static const kern_ops *G; /* cuda */
static const kern_ops *H; /* cpu */
static kern_ctx *hk;      /* cpu context */
static kern_ctx *gk;      /* the cuda context under test (switched per precision) */
static int failures;

#define FAIL(...)                                                                                               \
    do {                                                                                                        \
        fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                    \
        fprintf(stderr, __VA_ARGS__);                                                                           \
        fputc('\n', stderr);                                                                                    \
        failures++;                                                                                             \
    } while (0)

/* ---- random numbers ------------------------------------------------------------------ */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

/* The 16-bit type of the context under test: bf16 (true) or fp16. */
static bool ctx_bf16;

static uint32_t rnd_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

/* Uniform in [-1, 1). */
static float rnd(void) { return (float)((double)rnd_u32() / 2147483648.0 - 1.0); }

/* ---- paired buffers: the same contents on the host (cpu) and the device (cuda) ------ */

typedef struct {
    float *h, *d;
    size_t n;
} buf;

typedef struct {
    int32_t *h, *d;
    size_t n;
} ibuf;

/* Device buffers live until free_all() at the end of a precision's run:
 * one run makes a few hundred. */
#define MAX_ALLOCS 8192
static void *dev_allocs[MAX_ALLOCS];
static int ndev_allocs;

static void *dmalloc(size_t bytes)
{
    void *p = NULL;
    if (ndev_allocs == MAX_ALLOCS) {
        fprintf(stderr, "more than %d device buffers: raise MAX_ALLOCS\n", MAX_ALLOCS);
        exit(1);
    }
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 4);
    if (e != cudaSuccess) {
        fprintf(stderr, "cudaMalloc(%zu) failed: %s\n", bytes, cudaGetErrorString(e));
        exit(1);
    }
    dev_allocs[ndev_allocs++] = p;
    return p;
}

static void *hmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 4);
    if (!p) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    return p;
}

static void free_all(void)
{
    for (int i = 0; i < ndev_allocs; i++)
        cudaFree(dev_allocs[i]);
    ndev_allocs = 0;
}

/* scale·uniform[-1,1), or zeros when scale is 0. */
static buf mk(size_t n, float scale)
{
    buf b = {hmalloc(n * sizeof(float)), dmalloc(n * sizeof(float)), n};
    for (size_t i = 0; i < n; i++)
        b.h[i] = scale == 0.0f ? 0.0f : scale * rnd();
    G->copy_h2d(gk, b.d, b.h, n * sizeof(float));
    return b;
}

/* The same 16-bit values (raw uint16 of the context's type) on both sides. */
typedef struct {
    uint16_t *h, *d;
    size_t n;
} buf16;

static void narrow16(uint16_t *dst, const float *src, size_t n)
{
    if (ctx_bf16)
        H->cast_f32_to_bf16(hk, dst, src, n);
    else
        H->cast_f32_to_f16(hk, dst, src, n);
}

static void widen16(float *dst, const uint16_t *src, size_t n)
{
    if (ctx_bf16)
        H->cast_bf16_to_f32(hk, dst, src, n);
    else
        H->cast_f16_to_f32(hk, dst, src, n);
}

/* scale·uniform[-1,1) rounded to 16 bits; scale 0: random bit patterns, for
 * outputs that must be overwritten (and a prefix that must not be). */
static buf16 mk16(size_t n, float scale)
{
    buf16 b = {hmalloc(n * 2), dmalloc(n * 2), n};
    if (scale == 0.0f) {
        for (size_t i = 0; i < n; i++)
            b.h[i] = (uint16_t)rnd_u32();
    } else {
        float *f = hmalloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            f[i] = scale * rnd();
        narrow16(b.h, f, n);
        free(f);
    }
    G->copy_h2d(gk, b.d, b.h, n * 2);
    return b;
}

static void b16free(buf16 *b) { free(b->h); }

static ibuf mki(size_t n, int lo, int hi)
{
    ibuf b = {hmalloc(n * sizeof(int32_t)), dmalloc(n * sizeof(int32_t)), n};
    for (size_t i = 0; i < n; i++)
        b.h[i] = lo + (int32_t)(rnd_u32() % (uint32_t)(hi - lo));
    G->copy_h2d(gk, b.d, b.h, n * sizeof(int32_t));
    return b;
}

/* Make the device copy equal the host reference again, so that an op that
 * accumulates into a buffer starts from the same bits on both sides (a
 * previous op's tolerated difference must not count against the next). */
static void resync(buf *b) { G->copy_h2d(gk, b->d, b->h, b->n * sizeof(float)); }

static void bfree(buf *b) { free(b->h); }
static void ibfree(ibuf *b) { free(b->h); }

static void gsync(const char *op)
{
    int e = G->sync(gk);
    if (e)
        FAIL("%s: cuda sync returned %d: %s", op, e, G->error(gk));
}

/* ---- comparison ----------------------------------------------------------------------- */

/* got (device, n with row stride ld, the first `cols` of each row compared)
 * against ref (host); `lower` (T) compares only the causal lower triangle of
 * T×T blocks. */
typedef struct {
    size_t rows, cols, ld; /* rows × cols of ld; 0 rows: one flat row of n */
    int tri_T;             /* > 0: (.., T, T) blocks, compare j <= t only */
} layout;

static void cmp_l(const char *op, const char *what, const float *dgot, const float *ref, size_t n, layout L,
                  double rtol, double atol)
{
    float *got = hmalloc(n * sizeof(float));
    G->copy_d2h(gk, got, dgot, n * sizeof(float));
    size_t rows = L.rows ? L.rows : 1, cols = L.rows ? L.cols : n, ld = L.rows ? L.ld : n;
    double maxref = 0.0;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) {
            if (L.tri_T && (int)c > (int)(r % (size_t)L.tri_T))
                continue;
            double a = fabs((double)ref[r * ld + c]);
            if (isfinite(a) && a > maxref)
                maxref = a;
        }
    double max_abs = 0.0, max_rel = 0.0;
    size_t bad = 0, first = (size_t)-1;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) {
            if (L.tri_T && (int)c > (int)(r % (size_t)L.tri_T))
                continue;
            size_t i = r * ld + c;
            double x = got[i], y = ref[i];
            if (isnan(x) && isnan(y))
                continue;
            if (isinf(y) && x == y)
                continue;
            double e = fabs(x - y);
            double rel = e / fmax(fabs(y), 1e-3 * maxref + 1e-30);
            if (!(e <= rtol * fabs(y) + atol * maxref)) {
                if (first == (size_t)-1)
                    first = i;
                bad++;
            }
            if (e > max_abs || isnan(e))
                max_abs = e;
            if (rel > max_rel || isnan(rel))
                max_rel = rel;
        }
    printf("  %-22s %-9s max|ref| %-9.3g max abs err %-9.3g max rel err %-9.3g %s\n", op, what, maxref, max_abs,
           max_rel, bad ? "FAIL" : "ok");
    if (bad)
        FAIL("%s %s: %zu of %zu elements out of tolerance (rtol %g, atol %g·max); first at %zu: gpu %.9g cpu %.9g",
             op, what, bad, n, rtol, atol, first, got[first], ref[first]);
    free(got);
}

static void cmp(const char *op, const char *what, const buf *b, double rtol, double atol)
{
    cmp_l(op, what, b->d, b->h, b->n, (layout){0, 0, 0, 0}, rtol, atol);
}

/* The spacing of the 16-bit type at |x| (its unit in the last place; the
 * subnormal spacing below the smallest normal). */
static double ulp16(double x)
{
    int mant = ctx_bf16 ? 7 : 10, emin = ctx_bf16 ? -126 : -14, e = emin;
    x = fabs(x);
    if (x > 0 && isfinite(x)) {
        int fe;
        frexp(x, &fe); /* x = m·2^fe, m in [0.5, 1) */
        e = fe - 1 > emin ? fe - 1 : emin;
    }
    return ldexp(1.0, e - mant);
}

/* A 16-bit result (device) against the CPU's (host): widened to fp32,
 * |gpu − cpu| ≤ ulp16(cpu) + rtol·|cpu| + atol·max|cpu|, that is at most one
 * 16-bit rounding step apart beyond what the fp32 op itself may differ by.
 * Prints how many are bitwise equal. */
static void cmp16(const char *op, const char *what, const buf16 *b, double rtol, double atol)
{
    size_t n = b->n;
    uint16_t *g16 = hmalloc(n * 2);
    float *got = hmalloc(n * sizeof(float)), *ref = hmalloc(n * sizeof(float));
    G->copy_d2h(gk, g16, b->d, n * 2);
    widen16(got, g16, n);
    widen16(ref, b->h, n);
    double maxref = 0.0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(ref[i]) && fabs((double)ref[i]) > maxref)
            maxref = fabs((double)ref[i]);
    double max_abs = 0.0, max_ulp = 0.0;
    size_t exact = 0, bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        if (g16[i] == b->h[i]) {
            exact++;
            continue;
        }
        double x = got[i], y = ref[i], e = fabs(x - y), u = e / ulp16(y);
        if (!(e <= ulp16(y) + rtol * fabs(y) + atol * maxref)) {
            if (!bad)
                first = i;
            bad++;
        }
        if (e > max_abs || isnan(e))
            max_abs = e;
        if (u > max_ulp || isnan(u))
            max_ulp = u;
    }
    printf("  %-22s %-9s max|ref| %-9.3g max abs err %-9.3g max err %.3g ulp16, %zu of %zu exact %s\n", op, what,
           maxref, max_abs, max_ulp, exact, n, bad ? "FAIL" : "ok");
    if (bad)
        FAIL("%s %s: %zu of %zu 16-bit values more than 1 ulp16 + (rtol %g, atol %g·max) apart; first at %zu: gpu "
             "%.9g (0x%04x) cpu %.9g (0x%04x)",
             op, what, bad, n, rtol, atol, first, got[first], g16[first], ref[first], b->h[first]);
    free(g16), free(got), free(ref);
}

/* Two device arrays of n 16-bit values: how many differ. */
static size_t diff16(const uint16_t *d1, const uint16_t *d2, size_t n)
{
    uint16_t *a = hmalloc(n * 2), *b = hmalloc(n * 2);
    G->copy_d2h(gk, a, d1, n * 2);
    G->copy_d2h(gk, b, d2, n * 2);
    size_t d = 0;
    for (size_t i = 0; i < n; i++)
        d += a[i] != b[i];
    free(a), free(b);
    return d;
}

/* The GPU's own cast of an fp32 device array to the context's 16-bit type. */
static void gcast16(uint16_t *dst, const float *src, size_t n)
{
    if (ctx_bf16)
        G->cast_f32_to_bf16(gk, dst, src, n);
    else
        G->cast_f32_to_f16(gk, dst, src, n);
}

/* An op of kernels.h's 16-bit section missing from a table: a failure of its
 * own, named, rather than a crash. */
static bool have16(const char *name, const char *op, bool in_cpu, bool in_cuda)
{
    if (!in_cpu) {
        printf("  %-22s %-9s FAIL: not in the cpu ops table\n", name, op);
        FAIL("%s: the cpu ops table has no %s (NULL): nothing to compare the cuda op with", name, op);
    }
    if (!in_cuda) {
        printf("  %-22s %-9s FAIL: not in the cuda ops table\n", name, op);
        FAIL("%s: the cuda ops table has no %s (NULL)", name, op);
    }
    return in_cpu && in_cuda;
}

/* ---- the ops ------------------------------------------------------------------------------ */

static void test_memory(void)
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
}

static void test_encoder(int B, int T, int C, int V)
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

static void test_layernorm(int N, int C)
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
static void test_matmul(const char *prec, int N, int C, int OC, bool bias, bool want_dinp, int offset, double rtol,
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

static void test_attention(const char *prec, int B, int T, int C, int NH, double rtol, double atol)
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
static void test_attention_fused(const char *prec, int B, int T, int C, int NH, double rtol, double atol)
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
static void test_attention_fused16(const char *prec, int B, int T, int C, int NH, double rtol, double atol)
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

static void test_pointwise(size_t n, int offset)
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
static void test_crossentropy(int N, int V, int Vp)
{
    char name[64];
    snprintf(name, sizeof name, "crossentropy V=%d Vp=%d", V, Vp);
    buf logits = mk((size_t)N * Vp, 8), lse = mk(N, 0), losses = mk(N, 0);
    ibuf tg = mki(N, 0, V);
    tg.h[0] = V;
    G->copy_h2d(gk, tg.d, tg.h, sizeof(int32_t));
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

static void test_sumsq(size_t n, int offset)
{
    size_t o = (size_t)offset;
    buf g = mk(n + o, 3);
    double hs = 0, gs = 0;
    H->sumsq(hk, &hs, g.h + o, n);
    G->sumsq(gk, &gs, g.d + o, n);
    gsync("sumsq");
    double e = fabs(gs - hs), rel = e / fmax(fabs(hs), 1e-300);
    printf("  %-22s %-9s ref %-12.9g abs err %-9.3g rel err %-9.3g %s\n", "sumsq", o ? "unal" : "", hs, e, rel,
           rel <= 1e-10 ? "ok" : "FAIL");
    if (!(rel <= 1e-10))
        FAIL("sumsq n=%zu: gpu %.17g cpu %.17g", n, gs, hs);
    bfree(&g);
}

static void test_adamw(size_t n)
{
    buf p = mk(n, 1), g = mk(n, 1), m = mk(n, 0.1f), v = mk(n, 0);
    for (size_t i = 0; i < n; i++)
        v.h[i] = 0.01f * fabsf(rnd());
    G->copy_h2d(gk, v.d, v.h, n * sizeof(float));
    for (int t = 1; t <= 3; t++) {
        H->adamw(hk, p.h, NULL, g.h, m.h, v.h, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
        G->adamw(gk, p.d, NULL, g.d, m.d, v.d, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
    }
    gsync("adamw");
    cmp("adamw", "p", &p, 1e-6, 1e-6);
    cmp("adamw", "m", &m, 1e-6, 1e-7);
    cmp("adamw", "v", &v, 1e-6, 1e-7);
    bfree(&p), bfree(&g), bfree(&m), bfree(&v);
}

/* AdamW in a 16-bit context with the 16-bit copy of p (p16), at an offset
 * that takes the scalar path too: p16 is exactly the GPU's own cast of the
 * GPU's p (bitwise), and within an ulp16 of the cpu's p16. */
static void test_adamw16(size_t n, int offset)
{
    const char *name = ctx_bf16 ? "adamw16 bf16" : "adamw16 fp16";
    size_t o = (size_t)offset;
    buf p = mk(n + o, 1), g = mk(n + o, 1), m = mk(n + o, 0.1f), v = mk(n + o, 0);
    buf16 p16 = mk16(n + o, 0), again = mk16(n + o, 0);
    for (size_t i = 0; i < n + o; i++)
        v.h[i] = 0.01f * fabsf(rnd());
    G->copy_h2d(gk, v.d, v.h, (n + o) * sizeof(float));
    for (int t = 1; t <= 3; t++) {
        H->adamw(hk, p.h + o, p16.h + o, g.h + o, m.h + o, v.h + o, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
        G->adamw(gk, p.d + o, p16.d + o, g.d + o, m.d + o, v.d + o, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
    }
    gcast16(again.d + o, p.d + o, n);
    gsync(name);
    cmp(name, "p", &p, 1e-6, 1e-6);
    cmp16(name, "p16", &p16, 1e-6, 1e-6);
    size_t d = diff16(p16.d + o, again.d + o, n);
    printf("  %-22s %-9s %zu of p16 differ from the gpu's cast of its p %s\n", name, o ? "unal" : "", d,
           d ? "FAIL" : "ok");
    if (d)
        FAIL("%s: %zu values of p16 are not the cast of the updated p", name, d);
    bfree(&p), bfree(&g), bfree(&m), bfree(&v), b16free(&p16), b16free(&again);
}

static bool same16(uint16_t a, uint16_t b, bool bf16)
{
    if (a == b)
        return true;
    /* NaN: any quiet NaN will do (the payload may differ). */
    uint16_t expm = bf16 ? 0x7f80u : 0x7c00u, manm = bf16 ? 0x007fu : 0x03ffu;
    bool na = (a & expm) == expm && (a & manm), nb = (b & expm) == expm && (b & manm);
    return na && nb;
}

static void test_casts(size_t n)
{
    float *src = hmalloc(n * sizeof(float));
    static const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65520.0f, 1e6f, -1e6f, 6e-8f, 3e-8f,
                                    1e-40f, 3.4e38f, INFINITY, -INFINITY, NAN, 1.00390625f, 1.0009765625f};
    size_t ns = sizeof special / sizeof special[0];
    for (size_t i = 0; i < n; i++) {
        if (i < ns) {
            src[i] = special[i];
        } else {
            /* Random bit patterns: every exponent, rounding ties included. */
            uint32_t u = rnd_u32() ^ (rnd_u32() << 16);
            memcpy(&src[i], &u, 4);
        }
    }
    float *dsrc = dmalloc(n * sizeof(float));
    uint16_t *d16 = dmalloc(n * 2), *h16 = hmalloc(n * 2), *g16 = hmalloc(n * 2);
    float *dback = dmalloc(n * sizeof(float)), *hback = hmalloc(n * sizeof(float)), *gback = hmalloc(n * sizeof(float));
    G->copy_h2d(gk, dsrc, src, n * sizeof(float));
    for (int bf = 1; bf >= 0; bf--) {
        const char *name = bf ? "cast bf16" : "cast f16";
        if (bf) {
            H->cast_f32_to_bf16(hk, h16, src, n);
            G->cast_f32_to_bf16(gk, d16, dsrc, n);
        } else {
            H->cast_f32_to_f16(hk, h16, src, n);
            G->cast_f32_to_f16(gk, d16, dsrc, n);
        }
        G->copy_d2h(gk, g16, d16, n * 2);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < n; i++)
            if (!same16(g16[i], h16[i], bf)) {
                if (!bad)
                    first = i;
                bad++;
            }
        /* Back to fp32 from the same 16-bit values. */
        G->copy_h2d(gk, d16, h16, n * 2);
        if (bf) {
            H->cast_bf16_to_f32(hk, hback, h16, n);
            G->cast_bf16_to_f32(gk, dback, d16, n);
        } else {
            H->cast_f16_to_f32(hk, hback, h16, n);
            G->cast_f16_to_f32(gk, dback, d16, n);
        }
        G->copy_d2h(gk, gback, dback, n * sizeof(float));
        gsync(name);
        size_t bad2 = 0;
        for (size_t i = 0; i < n; i++)
            if (memcmp(&gback[i], &hback[i], 4) && !(isnan(gback[i]) && isnan(hback[i])))
                bad2++;
        printf("  %-22s %-9s %zu values, %zu differ to 16 bits, %zu differ back to fp32 %s\n", name, "", n, bad,
               bad2, bad || bad2 ? "FAIL" : "ok");
        if (bad)
            FAIL("%s: %zu mismatches, first at %zu: %.9g -> gpu 0x%04x cpu 0x%04x", name, bad, first,
                 (double)src[first], g16[first], h16[first]);
        if (bad2)
            FAIL("%s: %zu mismatches back to fp32", name, bad2);
    }
    free(src), free(h16), free(g16), free(hback), free(gback);
}

static void test_nonfinite(size_t n, int offset)
{
    size_t o = (size_t)offset;
    buf p = mk(n + o, 1);
    size_t put = 0;
    for (size_t i = o; i < n + o; i += 997, put++)
        p.h[i] = put % 3 == 0 ? NAN : put % 3 == 1 ? INFINITY : -INFINITY;
    p.h[n + o - 1] = NAN; /* the tail */
    G->copy_h2d(gk, p.d, p.h, (n + o) * sizeof(float));
    size_t hc = H->count_nonfinite(hk, p.h + o, n), gc = G->count_nonfinite(gk, p.d + o, n);
    gsync("count_nonfinite");
    printf("  %-22s %-9s cpu %zu gpu %zu %s\n", "count_nonfinite", o ? "unal" : "", hc, gc, hc == gc ? "ok" : "FAIL");
    if (hc != gc)
        FAIL("count_nonfinite: gpu %zu cpu %zu", gc, hc);
    bfree(&p);
}

/* The reductions that the CUDA side promises to keep deterministic (no
 * float atomics): the same inputs twice give the same bits. */
static bool same_bits(const float *d1, const float *d2, size_t n)
{
    float *a = hmalloc(n * sizeof(float)), *b = hmalloc(n * sizeof(float));
    G->copy_d2h(gk, a, d1, n * sizeof(float));
    G->copy_d2h(gk, b, d2, n * sizeof(float));
    bool same = !memcmp(a, b, n * sizeof(float));
    free(a), free(b);
    return same;
}

/* A device copy of b (host side too). */
static buf clone(const buf *b)
{
    buf c = mk(b->n, 0);
    memcpy(c.h, b->h, b->n * sizeof(float));
    G->copy_h2d(gk, c.d, c.h, b->n * sizeof(float));
    return c;
}

/* adamw_multi against adamw once per segment, both on the GPU: the same
 * bits for p, m, v and (with16) p16.  The segments mix decay, span several
 * of its chunks, start off a multiple of 4 and leave a gap between two
 * (which both sides leave alone); offset 1 puts every base off 16 bytes.
 * Steps 1 and 2 reuse the chunk table made at step 1, step 3 has other
 * segments, so the table is made again. */
static void test_adamw_multi(int offset, bool with16)
{
    char name[64];
    snprintf(name, sizeof name, "adamw_multi%s%s", with16 ? (ctx_bf16 ? " bf16" : " fp16") : "", offset ? " unal" : "");
    enum { LEN = 40780 + 2001 }; /* the elements the segments span */
    const kern_segment segs[] = {{0, 40000, 1}, {40000, 3, 0}, {40003, 771, 1}, {40774, 1, 0}, {40780, 2001, 0}};
    const kern_segment other[] = {{0, 40003, 0}, {40003, LEN - 40003, 1}};
    for (int i = 0; i < 5; i++) /* past the buffers, both sides would write into their neighbours */
        if (segs[i].offset + segs[i].n > LEN || (i < 2 && other[i].offset + other[i].n > LEN)) {
            FAIL("%s: test segment %d ends past the buffers", name, i);
            return;
        }
    size_t o = (size_t)offset, n = LEN + o;
    buf p1 = mk(n, 1), g = mk(n, 1), m1 = mk(n, 0.1f), v1 = mk(n, 0);
    for (size_t i = 0; i < n; i++)
        v1.h[i] = 0.01f * fabsf(rnd());
    G->copy_h2d(gk, v1.d, v1.h, n * sizeof(float));
    buf p2 = clone(&p1), m2 = clone(&m1), v2 = clone(&v1);
    buf16 h1 = mk16(n, 0), h2 = mk16(n, 0);
    G->copy_h2d(gk, h2.d, h1.h, n * 2);
    for (int t = 1; t <= 3; t++) {
        const kern_segment *s = t < 3 ? segs : other;
        int ns = t < 3 ? 5 : 2;
        for (int i = 0; i < ns; i++) {
            size_t at = o + s[i].offset;
            G->adamw(gk, p1.d + at, with16 ? h1.d + at : NULL, g.d + at, m1.d + at, v1.d + at, s[i].n, 1e-3f,
                     0.9f, 0.95f, 1e-8f, s[i].decay ? 0.1f : 0.0f, 0.5f, t);
        }
        G->adamw_multi(gk, p2.d + o, with16 ? h2.d + o : NULL, g.d + o, m2.d + o, v2.d + o, s, ns, 1e-3f, 0.9f,
                       0.95f, 1e-8f, 0.1f, 0.5f, t);
    }
    gsync(name);
    bool same = same_bits(p1.d, p2.d, n) && same_bits(m1.d, m2.d, n) && same_bits(v1.d, v2.d, n);
    size_t d16 = with16 ? diff16(h1.d, h2.d, n) : 0;
    printf("  %-22s p, m, v%s the bits of adamw per segment %s\n", name, with16 ? ", p16" : "",
           same && !d16 ? "ok" : "FAIL");
    if (!same || d16)
        FAIL("%s: not the bits of adamw per segment (p, m, v %s; %zu of p16 differ)", name,
             same ? "same" : "differ", d16);
    bfree(&p1), bfree(&g), bfree(&m1), bfree(&v1), bfree(&p2), bfree(&m2), bfree(&v2);
    b16free(&h1), b16free(&h2);
}

static void test_determinism(void)
{
    int B = 8, T = 64, C = 128, V = 7, N = B * T;
    buf dout = mk((size_t)N * C, 1), inp = mk((size_t)N * C, 1), w = mk(C, 1), mean = mk(N, 0), rstd = mk(N, 0);
    ibuf tok = mki((size_t)N, 0, V);
    buf g1 = mk((size_t)V * C, 0), g2 = mk((size_t)V * C, 0), p1 = mk((size_t)T * C, 0), p2 = mk((size_t)T * C, 0);
    G->encoder_backward(gk, g1.d, p1.d, dout.d, tok.d, B, T, C);
    G->encoder_backward(gk, g2.d, p2.d, dout.d, tok.d, B, T, C);
    bool enc = same_bits(g1.d, g2.d, g1.n) && same_bits(p1.d, p2.d, p1.n);
    buf o = mk((size_t)N * C, 0), bb = mk(C, 0);
    G->layernorm_forward(gk, o.d, mean.d, rstd.d, inp.d, w.d, bb.d, N, C);
    buf w1 = mk(C, 0), w2 = mk(C, 0), b1 = mk(C, 0), b2 = mk(C, 0);
    G->layernorm_backward(gk, NULL, w1.d, b1.d, dout.d, inp.d, w.d, mean.d, rstd.d, N, C);
    G->layernorm_backward(gk, NULL, w2.d, b2.d, dout.d, inp.d, w.d, mean.d, rstd.d, N, C);
    bool ln = same_bits(w1.d, w2.d, C) && same_bits(b1.d, b2.d, C);
    /* With dinp (from zeros): the register kernel's fused weight gradients
     * (C = 128), twice the same bits. */
    buf d1 = mk((size_t)N * C, 0), d2 = mk((size_t)N * C, 0), w3 = mk(C, 0), w4 = mk(C, 0), b3 = mk(C, 0),
        b4 = mk(C, 0);
    G->layernorm_backward(gk, d1.d, w3.d, b3.d, dout.d, inp.d, w.d, mean.d, rstd.d, N, C);
    G->layernorm_backward(gk, d2.d, w4.d, b4.d, dout.d, inp.d, w.d, mean.d, rstd.d, N, C);
    ln = ln && same_bits(w3.d, w4.d, C) && same_bits(b3.d, b4.d, C) && same_bits(d1.d, d2.d, d1.n);
    bfree(&d1), bfree(&d2), bfree(&w3), bfree(&w4), bfree(&b3), bfree(&b4);
    double s1 = 0, s2 = 0;
    G->sumsq(gk, &s1, dout.d, dout.n);
    G->sumsq(gk, &s2, dout.d, dout.n);
    gsync("determinism");
    printf("  %-22s encoder_backward %s, layernorm_backward %s, sumsq %s\n", "determinism", enc ? "ok" : "FAIL",
           ln ? "ok" : "FAIL", s1 == s2 ? "ok" : "FAIL");
    if (!enc || !ln || s1 != s2)
        FAIL("a deterministic reduction gave different bits on a second run");
    bfree(&dout), bfree(&inp), bfree(&w), bfree(&mean), bfree(&rstd), ibfree(&tok), bfree(&g1), bfree(&g2);
    bfree(&p1), bfree(&p2), bfree(&o), bfree(&bb), bfree(&w1), bfree(&w2), bfree(&b1), bfree(&b2);
}

/* ---- 16-bit activations (bf16/fp16 contexts) ----------------------------------------------- */

/* layernorm_forward16: out16 against the CPU's, mean and rstd as the fp32
 * test; then on the GPU alone, out16 bitwise the fp32 forward + cast, with
 * bitwise the same mean and rstd.  out_off (16-bit elements) moves out16 off
 * its 8-byte alignment for the scalar path. */
static void test_layernorm16(int N, int C, int out_off)
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
static void test_gelu16(size_t n, int in_off, int out_off)
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
static void test_matmul16(int N, int C, int OC, bool bias, bool want_dinp, int offset)
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
static void test_out16_bias(int N, int C, int OC, int offset)
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
static void test_gelu_gemm16(int N, int C, int Hd, int offset)
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
static void test_logits16(int N, int C, int V, int Vp)
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
static void test_determinism16(void)
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

/* ---- scratch through a callback, as the pool provides it ----------------------------------- */

typedef struct {
    int live, acquired;
    size_t peak_bytes;
} scratch_stats;

static void *scratch_acquire(void *user, size_t bytes)
{
    scratch_stats *s = user;
    void *p = NULL;
    if (cudaMalloc(&p, bytes) != cudaSuccess)
        return NULL;
    s->live++;
    s->acquired++;
    if (bytes > s->peak_bytes)
        s->peak_bytes = bytes;
    return p;
}

static void scratch_release(void *user, void *p)
{
    scratch_stats *s = user;
    s->live--;
    cudaFree(p);
}

/* ---- main ---------------------------------------------------------------------------------- */

static void run_fp32(void)
{
    printf("fp32 context\n");
    test_memory();
    test_encoder(4, 32, 96, 17);
    test_encoder(3, 17, 30, 5);
    test_layernorm(257, 96);
    test_layernorm(100, 63);
    test_layernorm(64, 768);
    test_layernorm(4096, 768); /* GPT-2 124M's width: the register kernels, 256 blocks of 16 rows */
    test_matmul("fp32", 256, 96, 288, true, true, 0, 1e-4, 1e-5);
    test_matmul("fp32", 33, 17, 29, true, true, 0, 1e-4, 1e-5);
    test_matmul("fp32", 64, 32, 48, false, false, 0, 1e-4, 1e-5);
    test_matmul("fp32", 48, 40, 24, true, true, 1, 1e-4, 1e-5);
    test_matmul("fp32", 512, 768, 2304, true, true, 0, 1e-4, 1e-5);
    test_attention("fp32", 2, 64, 96, 4, 1e-4, 1e-5);
    test_attention("fp32", 3, 37, 48, 3, 1e-4, 1e-5);
    test_attention("fp32", 1, 256, 768, 12, 1e-4, 1e-5);
    test_pointwise(10007, 0);
    test_pointwise(4099, 1);
    test_crossentropy(64, 1000, 1024);
    test_crossentropy(33, 37, 37);
    test_crossentropy(8, 50257, 50304);
    test_sumsq(1000003, 0);
    test_sumsq(12345, 1);
    test_adamw(10007);
    test_adamw_multi(0, false);
    test_adamw_multi(1, false);
    test_casts(100003);
    test_nonfinite(1000003, 0);
    test_nonfinite(5003, 1);
    test_determinism();
}

static void run_lowp(const char *prec)
{
    ctx_bf16 = !strcmp(prec, "bf16");
    /* The cpu's 16-bit ops read and write the type their context's
     * precision names (an fp32 context: bf16), so the reference side gets a
     * context of the same precision for this pass. */
    kern_ctx *h32 = hk;
    hk = H->ctx_create(0, 0, ctx_bf16 ? KERN_BF16 : KERN_FP16, NULL);
    if (!hk) {
        FAIL("cpu %s ctx_create failed", prec);
        hk = h32;
        return;
    }
    printf("%s context (GEMM inputs in 16 bits)\n", prec);
    test_matmul(prec, 256, 96, 288, true, true, 0, 2e-2, 2e-2);
    test_matmul(prec, 33, 17, 29, true, true, 0, 2e-2, 2e-2);
    test_matmul(prec, 48, 40, 24, false, true, 1, 2e-2, 2e-2);
    test_matmul(prec, 512, 768, 3072, true, true, 0, 2e-2, 2e-2);
    test_attention(prec, 2, 64, 96, 4, 2e-2, 2e-2);
    test_attention(prec, 1, 128, 768, 12, 2e-2, 2e-2);
    /* Tails (T not a multiple of the 64-row blocks), several blocks, GPT-2's heads. */
    test_attention_fused(prec, 2, 133, 128, 2, 2e-2, 2e-2);
    test_attention_fused(prec, 1, 64, 64, 1, 2e-2, 2e-2);
    test_attention_fused(prec, 2, 512, 768, 12, 2e-2, 2e-2);
    /* T between two and four 64-row blocks, not a multiple of 64. */
    test_attention_fused(prec, 1, 200, 128, 2, 2e-2, 2e-2);
    /* The same on a 16-bit qkv, as the model's 16-bit path runs it. */
    test_attention_fused16(prec, 2, 133, 128, 2, 2e-2, 2e-2);
    test_attention_fused16(prec, 2, 512, 768, 12, 2e-2, 2e-2);
    /* The 16-bit activation ops. */
    test_layernorm16(257, 96, 0);
    test_layernorm16(100, 63, 0);
    test_layernorm16(64, 768, 0);
    test_layernorm16(33, 96, 2);
    /* GPT-2 shapes: C = 768 on the register kernels (forward and the fused
     * backward, 256 blocks of 16 rows), unaligned (the general ones), and
     * C = 1024 (register forward, general backward). */
    test_layernorm16(4096, 768, 0);
    test_layernorm16(1000, 768, 2);
    test_layernorm16(300, 1024, 0);
    test_gelu16(10007, 0, 0);
    test_gelu16(4099, 1, 1);
    test_gelu16(4099, 0, 2);
    test_gelu16(4099, 0, 4);
    test_matmul16(256, 96, 288, true, true, 0);
    test_matmul16(33, 17, 29, true, true, 0);    /* N·C, C, OC odd */
    test_matmul16(48, 40, 24, false, false, 1);  /* pointers 2 or 4 bytes off */
    test_matmul16(45, 52, 2304, true, false, 0); /* N·C = 2340, not a multiple of 8 */
    test_matmul16(64, 128, 50304, false, true, 0); /* GPT-2's padded vocabulary (lm head) */
    test_matmul16(31, 52, 50304, true, true, 0);
    test_matmul16(512, 768, 3072, true, true, 0);
    test_out16_bias(512, 768, 3072, 0);   /* GPT-2's MLP hidden layer */
    test_out16_bias(33, 17, 29, 1);       /* odd, pointers 2 or 4 bytes off */
    test_gelu_gemm16(512, 768, 3072, 0);  /* GPT-2's MLP: the epilogue path */
    test_gelu_gemm16(33, 17, 29, 1);      /* Hd not a multiple of 8: the two ops */
    test_logits16(64, 128, 50257, 50304); /* GPT-2's vocabulary, padded */
    test_logits16(33, 52, 37, 37);        /* odd: the scalar paths */
    test_logits16(64, 128, 50304, 50304); /* V = Vp, as the daemon runs GPT-2 */
    test_logits16(16, 64, 1001, 1004);    /* Vp % 8 == 4: the fused fallback, 4-wide */
    test_determinism16();
    test_adamw16(10007, 0);
    test_adamw16(4099, 1);
    test_adamw_multi(0, true);
    test_adamw_multi(1, true);
    H->ctx_destroy(hk);
    hk = h32;
}

int main(int argc, char **argv)
{
    char dir[4096] = "", path[4200] = "";
    setvbuf(stdout, NULL, _IOLBF, 0); /* in order with stderr's FAIL lines */
    if (argc > 1) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s", argv[1]);
        if (strstr(tmp, ".so")) {
            snprintf(path, sizeof path, "%s", argv[1]);
            snprintf(dir, sizeof dir, "%s", dirname(tmp));
        } else {
            snprintf(dir, sizeof dir, "%s", argv[1]);
            snprintf(path, sizeof path, "%s/gradd-cuda.so", argv[1]);
        }
    }
    dev *devs[16];
    char why[256] = "";
    int n = dev_cuda_probe(dir[0] ? dir : NULL, devs, 16, why, sizeof why);
    if (n == 0) {
        printf("SKIP: %s\n", why);
        return 77;
    }
    int ordinal = devs[0]->index;
    printf("%s: %s\n", devs[0]->id, devs[0]->name);
    for (int i = 0; i < n; i++)
        dev_destroy(devs[i]);
    if (!path[0]) {
        fprintf(stderr, "usage: %s path/to/gradd-cuda.so\n", argv[0]);
        return 2;
    }
    void *mod = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!mod) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        return 1;
    }
    G = dlsym(mod, KERN_CUDA_OPS_SYMBOL);
    H = kern_cpu_ops();
    if (!G || !H) {
        fprintf(stderr, "no %s in %s\n", G ? "cpu table" : KERN_CUDA_OPS_SYMBOL, path);
        return 1;
    }
    /* Every entry of the table is filled, but attention_decode (sampling
     * decodes on the cpu) and act16_native (a bool, not a function). */
    const void *const *slots = (const void *const *)((const char *)G + sizeof(const char *));
    size_t nslots = (sizeof(kern_ops) - sizeof(const char *)) / sizeof(void *);
    for (size_t i = 0; i < nslots; i++) {
        size_t off = sizeof(const char *) + i * sizeof(void *);
        if (off == offsetof(kern_ops, attention_decode) || off == offsetof(kern_ops, act16_native))
            continue;
        if (!slots[i])
            FAIL("kern_ops slot %zu of the cuda table is NULL", i);
    }
    if (!G->act16_native)
        FAIL("the cuda table says its 16-bit ops are not native");
    if (strcmp(G->name, "cuda"))
        FAIL("table name '%s'", G->name);
    cudaSetDevice(ordinal);

    hk = H->ctx_create(0, 0, KERN_FP32, NULL);
    gk = G->ctx_create(0, ordinal, KERN_FP32, NULL);
    if (!hk || !gk) {
        fprintf(stderr, "ctx_create failed (cpu %p, cuda %p)\n", (void *)hk, (void *)gk);
        return 1;
    }
    run_fp32();
    G->ctx_destroy(gk);
    free_all();

    /* bf16 with scratch from a callback: after sync only the cuBLASLt
     * workspace and adamw_multi's chunk table (the last one made) are still
     * held. */
    scratch_stats ss = {0, 0, 0};
    kern_scratch cb = {scratch_acquire, scratch_release, &ss};
    gk = G->ctx_create(0, ordinal, KERN_BF16, &cb);
    if (!gk) {
        FAIL("bf16 ctx_create failed");
    } else {
        run_lowp("bf16");
        gsync("bf16");
        printf("  scratch callback: %d acquisitions, peak %zu KiB, %d live after sync\n", ss.acquired,
               ss.peak_bytes >> 10, ss.live);
        if (ss.acquired < 2 || ss.live != 2)
            FAIL("scratch callback: %d acquired, %d live after sync (want >= 2, 2)", ss.acquired, ss.live);
        G->ctx_destroy(gk);
        if (ss.live != 0)
            FAIL("scratch callback: %d buffers live after ctx_destroy", ss.live);
    }
    free_all();

    gk = G->ctx_create(0, ordinal, KERN_FP16, NULL);
    if (!gk) {
        FAIL("fp16 ctx_create failed");
    } else {
        run_lowp("fp16");
        G->ctx_destroy(gk);
    }
    free_all();
    H->ctx_destroy(hk);

    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
