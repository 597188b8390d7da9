/* layernorm.c — layer normalisation over the last dimension (eps 1e-5). */
#include <math.h>
#include <omp.h>

#include "cpu_kernels.h"

#define LN_EPS 1e-5f

/* ---- forward ----------------------------------------------------------------------
 * inp (N,C), weight, bias (C) -> out (N,C), mean, rstd (N) */
KCPU_CLONES static void ln_rows(float *restrict out, float *restrict mean, float *restrict rstd,
                                const float *restrict inp, const float *restrict w, const float *restrict b,
                                size_t lo, size_t hi, int C)
{
    for (size_t n = lo; n < hi; n++) {
        const float *x = inp + n * C;
        float *y = out + n * C;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int i = 0; i < C; i++)
            s += x[i];
        float m = s / C;
        /* Two passes: the variance of values far from zero stays accurate. */
        float v = 0.0f;
#pragma omp simd reduction(+ : v)
        for (int i = 0; i < C; i++) {
            float d = x[i] - m;
            v += d * d;
        }
        float r = 1.0f / sqrtf(v / C + LN_EPS);
#pragma omp simd
        for (int i = 0; i < C; i++)
            y[i] = (x[i] - m) * r * w[i] + b[i];
        mean[n] = m;
        rstd[n] = r;
    }
}

void kcpu_layernorm_forward(kern_ctx *k, float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C)
{
    int nt = k->threads;
#pragma omp parallel num_threads(nt) if ((size_t)N * C >= KCPU_PAR_MIN)
    {
        size_t lo, hi;
        kcpu_split((size_t)N, omp_get_thread_num(), omp_get_num_threads(), 1, &lo, &hi);
        ln_rows(out, mean, rstd, inp, weight, bias, lo, hi, C);
    }
}

/* ---- backward ---------------------------------------------------------------------
 * dout, inp (N,C), weight (C), mean, rstd (N) ->
 *   dinp (N,C) +=, dweight (C) +=, dbias (C) +=.
 * dweight and dbias sum over rows: each thread sums its rows into its own
 * partial (pw, pb), and the partials are added in thread order.  Both NULL
 * (a frozen norm): no partials, and dinp the very same expression. */
static inline float ln_dx(float dnorm, float norm, float dnorm_mean, float dnorm_norm_mean, float r)
{
    return (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r;
}

KCPU_CLONES static void ln_rows_backward(float *restrict dinp, float *restrict pw, float *restrict pb,
                                         const float *restrict dout, const float *restrict inp,
                                         const float *restrict w, const float *restrict mean,
                                         const float *restrict rstd, size_t lo, size_t hi, int C)
{
    for (size_t n = lo; n < hi; n++) {
        const float *x = inp + n * C, *g = dout + n * C;
        float *dx = dinp + n * C;
        const float m = mean[n], r = rstd[n];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * r;
            float dnorm = w[i] * g[i];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        if (!pw) {
#pragma omp simd
            for (int i = 0; i < C; i++)
                dx[i] += ln_dx(w[i] * g[i], (x[i] - m) * r, dnorm_mean, dnorm_norm_mean, r);
            continue;
        }
#pragma omp simd
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * r;
            pb[i] += g[i];
            pw[i] += norm * g[i];
            dx[i] += ln_dx(w[i] * g[i], norm, dnorm_mean, dnorm_norm_mean, r);
        }
    }
}

void kcpu_layernorm_backward(kern_ctx *k, float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean, const float *rstd, int N,
                             int C)
{
    int nt = (size_t)N * C >= KCPU_PAR_MIN ? k->threads : 1;
    if (!dweight || !dbias) {
#pragma omp parallel num_threads(nt)
        {
            size_t lo, hi;
            kcpu_split((size_t)N, omp_get_thread_num(), omp_get_num_threads(), 1, &lo, &hi);
            ln_rows_backward(dinp, NULL, NULL, dout, inp, weight, mean, rstd, lo, hi, C);
        }
        return;
    }
    size_t Cp = ((size_t)C + 15) & ~(size_t)15; /* partials on separate cache lines */
    float *part = kcpu_work(k, (size_t)nt * 2 * Cp * sizeof(float));
    if (!part) {
        /* No host memory for partials: one thread, straight into the gradients. */
        ln_rows_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, 0, (size_t)N, C);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        float *pw = part + (size_t)tid * 2 * Cp, *pb = pw + Cp;
        memset(pw, 0, 2 * Cp * sizeof *pw);
        size_t lo, hi;
        kcpu_split((size_t)N, tid, nth, 1, &lo, &hi);
        ln_rows_backward(dinp, pw, pb, dout, inp, weight, mean, rstd, lo, hi, C);
#pragma omp barrier
        kcpu_split((size_t)C, tid, nth, 16, &lo, &hi);
        for (size_t i = lo; i < hi; i++) {
            float sw = 0.0f, sb = 0.0f;
            for (int t = 0; t < nth; t++) {
                sw += part[(size_t)t * 2 * Cp + i];
                sb += part[(size_t)t * 2 * Cp + Cp + i];
            }
            dweight[i] += sw;
            dbias[i] += sb;
        }
    }
}
