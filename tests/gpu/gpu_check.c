/* gpu_check.c — see gpu_check.h. */
#include "gpu_check.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const kern_ops *G;
const kern_ops *H;
kern_ctx *hk;
kern_ctx *gk;
int failures;

/* ---- random numbers ------------------------------------------------------------------ */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

bool ctx_bf16;

uint32_t rnd_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

float rnd(void) { return (float)((double)rnd_u32() / 2147483648.0 - 1.0); }

/* ---- paired buffers: the same contents on the host (cpu) and the device (cuda) ------ */

/* Device buffers live until free_all() at the end of a precision's run:
 * one run makes a few hundred. */
#define MAX_ALLOCS 8192
static void *dev_allocs[MAX_ALLOCS];
static int ndev_allocs;

void *dmalloc(size_t bytes)
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

void *hmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 4);
    if (!p) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    return p;
}

void free_all(void)
{
    for (int i = 0; i < ndev_allocs; i++)
        cudaFree(dev_allocs[i]);
    ndev_allocs = 0;
}

buf mk(size_t n, float scale)
{
    buf b = {hmalloc(n * sizeof(float)), dmalloc(n * sizeof(float)), n};
    for (size_t i = 0; i < n; i++)
        b.h[i] = scale == 0.0f ? 0.0f : scale * rnd();
    G->copy_h2d(gk, b.d, b.h, n * sizeof(float));
    return b;
}

void narrow16(uint16_t *dst, const float *src, size_t n)
{
    if (ctx_bf16)
        H->cast_f32_to_bf16(hk, dst, src, n);
    else
        H->cast_f32_to_f16(hk, dst, src, n);
}

void widen16(float *dst, const uint16_t *src, size_t n)
{
    if (ctx_bf16)
        H->cast_bf16_to_f32(hk, dst, src, n);
    else
        H->cast_f16_to_f32(hk, dst, src, n);
}

buf16 mk16(size_t n, float scale)
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

void b16free(buf16 *b) { free(b->h); }

ibuf mki(size_t n, int lo, int hi)
{
    ibuf b = {hmalloc(n * sizeof(int32_t)), dmalloc(n * sizeof(int32_t)), n};
    for (size_t i = 0; i < n; i++)
        b.h[i] = lo + (int32_t)(rnd_u32() % (uint32_t)(hi - lo));
    G->copy_h2d(gk, b.d, b.h, n * sizeof(int32_t));
    return b;
}

void resync(buf *b) { G->copy_h2d(gk, b->d, b->h, b->n * sizeof(float)); }

void bfree(buf *b) { free(b->h); }
void ibfree(ibuf *b) { free(b->h); }

void gsync(const char *op)
{
    int e = G->sync(gk);
    if (e)
        FAIL("%s: cuda sync returned %d: %s", op, e, G->error(gk));
}

/* ---- comparison ----------------------------------------------------------------------- */

void cmp_l(const char *op, const char *what, const float *dgot, const float *ref, size_t n, layout L,
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

void cmp(const char *op, const char *what, const buf *b, double rtol, double atol)
{
    cmp_l(op, what, b->d, b->h, b->n, (layout){0, 0, 0, 0}, rtol, atol);
}

double ulp16(double x)
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

void cmp16(const char *op, const char *what, const buf16 *b, double rtol, double atol)
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

size_t diff16(const uint16_t *d1, const uint16_t *d2, size_t n)
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

void gcast16(uint16_t *dst, const float *src, size_t n)
{
    if (ctx_bf16)
        G->cast_f32_to_bf16(gk, dst, src, n);
    else
        G->cast_f32_to_f16(gk, dst, src, n);
}

bool have16(const char *name, const char *op, bool in_cpu, bool in_cuda)
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

bool same_bits(const float *d1, const float *d2, size_t n)
{
    float *a = hmalloc(n * sizeof(float)), *b = hmalloc(n * sizeof(float));
    G->copy_d2h(gk, a, d1, n * sizeof(float));
    G->copy_d2h(gk, b, d2, n * sizeof(float));
    bool same = !memcmp(a, b, n * sizeof(float));
    free(a), free(b);
    return same;
}
