/* kern_check.c — see kern_check.h. */
#include "kern_check.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#define FD_H 1e-2
#define FD_RTOL 1e-3
#define FD_ATOL_FRAC 2e-4

const kern_ops *ops;

/* ---- helpers ---------------------------------------------------------------------- */

static uint64_t rng_state = 0x243F6A8885A308D3ull;

uint32_t rng_u32(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}

float rng_f(void)
{
    return (float)((rng_u32() >> 8) * (1.0 / 8388608.0) - 1.0);
}

float *randv(size_t n, float scale)
{
    float *p = malloc(n * sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = scale * rng_f();
    return p;
}

float *zerov(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}

float *dupv(const float *src, size_t n)
{
    float *p = malloc(n * sizeof *p);
    assert_non_null(p);
    memcpy(p, src, n * sizeof *p);
    return p;
}

double dotd(const float *a, const float *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

void assert_close(const char *what, const float *got, const double *want, size_t n, double rtol, double atol)
{
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        if (!(err <= atol + rtol * fabs(want[i]))) {
            print_error("%s[%zu]: got %.9g want %.9g (err %.3g)\n", what, i, got[i], want[i], err);
            fail();
        }
    }
}

/* ---- finite differences -------------------------------------------------------------- */

void check_grad(const char *what, float *x, const float *analytic, size_t n, loss_fn loss, void *c,
                const unsigned char *skip)
{
    double *num = malloc(n * sizeof *num);
    assert_non_null(num);
    double scale = 0.0;
    for (size_t i = 0; i < n; i++) {
        float x0 = x[i];
        float xp = (float)(x0 + FD_H), xm = (float)(x0 - FD_H);
        x[i] = xp;
        double lp = loss(c);
        x[i] = xm;
        double lm = loss(c);
        x[i] = x0;
        num[i] = (lp - lm) / ((double)xp - (double)xm);
        if (fabs(num[i]) > scale)
            scale = fabs(num[i]);
    }
    loss(c); /* leave the forward state as it was */
    double atol = FD_ATOL_FRAC * scale;
    for (size_t i = 0; i < n; i++) {
        if (skip && skip[i])
            continue;
        double a = analytic[i], err = fabs(a - num[i]);
        double tol = FD_RTOL * fmax(fabs(a), fabs(num[i])) + atol;
        if (!(err <= tol)) {
            print_error("%s: d[%zu] analytic %.7g numeric %.7g (err %.3g > tol %.3g)\n", what, i, a, num[i], err,
                        tol);
            free(num);
            fail();
        }
    }
    free(num);
}

kern_ctx *ctx(int threads)
{
    kern_ctx *k = ops->ctx_create(threads, 0, KERN_FP32, NULL);
    assert_non_null(k);
    return k;
}

uint16_t *h16(size_t n)
{
    uint16_t *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}
