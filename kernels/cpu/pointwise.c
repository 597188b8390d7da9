/* pointwise.c — GELU, ReLU, residual add and accumulate, all of shape (N), and
 * the strided row copy (copy2d). */
#include <omp.h>
#include <string.h>

#include "cpu_kernels.h"

/* Each op splits [0,N) statically over the team and runs one vectorised span
 * per thread; spans start on 16-float (cache line) boundaries.  The spans
 * take no restrict pointers: in-place calls (out == inp, dinp == dout) are
 * allowed, and `omp simd` vectorises them anyway. */
#define POINTWISE(call)                                                                                         \
    do {                                                                                                        \
        int nt_ = k->threads;                                                                                   \
        _Pragma("omp parallel num_threads(nt_) if (N >= KCPU_PAR_MIN)")                                         \
        {                                                                                                       \
            size_t lo, hi;                                                                                      \
            kcpu_split(N, omp_get_thread_num(), omp_get_num_threads(), 16, &lo, &hi);                           \
            call;                                                                                               \
        }                                                                                                       \
    } while (0)

/* ---- GELU, tanh approximation ------------------------------------------------------
 * gelu(x) = 0.5·x·(1 + tanh(u)), u = sqrt(2/π)·(x + 0.044715·x³),
 * computed as x·σ(2u) with σ(z) = 1/(1 + e^-z), since 0.5·(1 + tanh(u)) = σ(2u):
 * one exp, no tanh, and exact limits (σ is 0 or 1) for large |x|.
 * d/dx = σ + x·σ(1-σ)·2·sqrt(2/π)·(1 + 3·0.044715·x²), as sech²(u) = 4σ(1-σ). */
#define GELU_SCALING 0.7978845608028654f /* sqrt(2/π) */
#define GELU_CUBE 0.044715f

KCPU_CLONES static void gelu_fwd_span(float *out, const float *inp, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALING * (x + GELU_CUBE * x * x * x);
        out[i] = x / (1.0f + kcpu_expf(-2.0f * u));
    }
}

KCPU_CLONES static void gelu_bwd_span(float *dinp, const float *inp, const float *dout,
                                      size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALING * (x + GELU_CUBE * x * x * x);
        float s = 1.0f / (1.0f + kcpu_expf(-2.0f * u));
        float local = s + 2.0f * GELU_SCALING * x * s * (1.0f - s) * (1.0f + 3.0f * GELU_CUBE * x * x);
        dinp[i] = local * dout[i];
    }
}

void kcpu_gelu_forward(kern_ctx *k, float *out, const float *inp, size_t N)
{
    POINTWISE(gelu_fwd_span(out + lo, inp + lo, hi - lo));
}

void kcpu_gelu_backward(kern_ctx *k, float *dinp, const float *inp, const float *dout, size_t N)
{
    POINTWISE(gelu_bwd_span(dinp + lo, inp + lo, dout + lo, hi - lo));
}

/* ---- ReLU ----------------------------------------------------------------------------- */

KCPU_CLONES static void relu_fwd_span(float *out, const float *inp, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

KCPU_CLONES static void relu_bwd_span(float *dinp, const float *inp, const float *dout,
                                      size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        dinp[i] = inp[i] > 0.0f ? dout[i] : 0.0f;
}

void kcpu_relu_forward(kern_ctx *k, float *out, const float *inp, size_t N)
{
    POINTWISE(relu_fwd_span(out + lo, inp + lo, hi - lo));
}

void kcpu_relu_backward(kern_ctx *k, float *dinp, const float *inp, const float *dout, size_t N)
{
    POINTWISE(relu_bwd_span(dinp + lo, inp + lo, dout + lo, hi - lo));
}

/* ---- residual ---------------------------------------------------------------------------
 * out = a + b; its backward is accumulate (dst += src) into both branches. */

KCPU_CLONES static void add_span(float *out, const float *a, const float *b, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

KCPU_CLONES static void acc_span(float *dst, const float *src, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

void kcpu_residual_forward(kern_ctx *k, float *out, const float *a, const float *b, size_t N)
{
    POINTWISE(add_span(out + lo, a + lo, b + lo, hi - lo));
}

void kcpu_accumulate(kern_ctx *k, float *dst, const float *src, size_t N)
{
    POINTWISE(acc_span(dst + lo, src + lo, hi - lo));
}

void kcpu_copy2d(kern_ctx *k, float *dst, int ldd, const float *src, int lds, int N, int cols, bool accumulate)
{
    int nt = k->threads;
    size_t work = (size_t)N * (size_t)cols;
#pragma omp parallel for num_threads(nt) schedule(static) if (work >= KCPU_PAR_MIN)
    for (int i = 0; i < N; i++) {
        float *d = dst + (size_t)i * ldd;
        const float *s = src + (size_t)i * lds;
        if (accumulate)
            acc_span(d, s, (size_t)cols);
        else
            memcpy(d, s, (size_t)cols * sizeof *d);
    }
}
