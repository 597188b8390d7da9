/* optim.c — AdamW and the sum of squares behind the global gradient norm. */
#include <math.h>
#include <omp.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "cpu_kernels.h"

/* ---- sum of squares ----------------------------------------------------------------
 * g (n) -> *out = Σ g² in double.  Each thread sums a static slice; the
 * partials are added in thread order. */
KCPU_CLONES static double sumsq_span(const float *restrict g, size_t n)
{
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (size_t i = 0; i < n; i++)
        s += (double)g[i] * (double)g[i];
    return s;
}

void kcpu_sumsq(kern_ctx *k, double *out, const float *g, size_t n)
{
    int nt = n >= KCPU_PAR_MIN ? k->threads : 1;
    double *part = nt > 1 ? kcpu_work(k, (size_t)nt * 8 * sizeof(double)) : NULL;
    if (!part) {
        *out = sumsq_span(g, n);
        return;
    }
    int used = 1;
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        size_t lo, hi;
        kcpu_split(n, tid, nth, 16, &lo, &hi);
        part[(size_t)tid * 8] = sumsq_span(g + lo, hi - lo); /* one cache line each */
        if (tid == 0)
            used = nth;
    }
    double s = 0.0;
    for (int t = 0; t < used; t++)
        s += part[(size_t)t * 8];
    *out = s;
}

/* ---- AdamW -----------------------------------------------------------------------
 * m = b1·m + (1-b1)·g;  v = b2·v + (1-b2)·g²;  g read as grad_scale·g;
 * p -= lr·( (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) + wd·p ). */
/* GCC vectorises no sqrtf while errno may be set (-fmath-errno, the default),
 * and AdamW is 4-5x slower scalar; so on x86-64 the body is written with SSE
 * (baseline there, VEX-encoded in the AVX2 clone).  The scalar tail and
 * other targets compute the same expression in the same order. */
KCPU_CLONES static void adamw_span(float *restrict p, const float *restrict g, float *restrict m,
                                   float *restrict v, size_t n, float lr, float b1, float b2, float eps, float wd,
                                   float gs, float inv_bc1, float inv_bc2)
{
    size_t i = 0;
#if defined(__SSE2__)
    const __m128 vb1 = _mm_set1_ps(b1), vb1c = _mm_set1_ps(1.0f - b1), vb2 = _mm_set1_ps(b2);
    const __m128 vb2c = _mm_set1_ps(1.0f - b2), vgs = _mm_set1_ps(gs), vlr = _mm_set1_ps(lr);
    const __m128 veps = _mm_set1_ps(eps), vwd = _mm_set1_ps(wd), vc1 = _mm_set1_ps(inv_bc1);
    const __m128 vc2 = _mm_set1_ps(inv_bc2);
    for (; i + 4 <= n; i += 4) {
        __m128 gi = _mm_mul_ps(vgs, _mm_loadu_ps(g + i));
        __m128 mi = _mm_add_ps(_mm_mul_ps(vb1, _mm_loadu_ps(m + i)), _mm_mul_ps(vb1c, gi));
        __m128 vi = _mm_add_ps(_mm_mul_ps(vb2, _mm_loadu_ps(v + i)), _mm_mul_ps(_mm_mul_ps(vb2c, gi), gi));
        _mm_storeu_ps(m + i, mi);
        _mm_storeu_ps(v + i, vi);
        __m128 pi = _mm_loadu_ps(p + i);
        __m128 step = _mm_div_ps(_mm_mul_ps(mi, vc1), _mm_add_ps(_mm_sqrt_ps(_mm_mul_ps(vi, vc2)), veps));
        step = _mm_add_ps(step, _mm_mul_ps(vwd, pi));
        _mm_storeu_ps(p + i, _mm_sub_ps(pi, _mm_mul_ps(vlr, step)));
    }
#endif
    for (; i < n; i++) {
        float gi = gs * g[i];
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi * inv_bc1, vhat = vi * inv_bc2;
        p[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);
    }
}

void kcpu_adamw(kern_ctx *k, float *p, uint16_t *p16, const float *g, float *m, float *v, size_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, float grad_scale, int t)
{
    /* Bias corrections in double: 1 - b2^t loses digits in float for small t. */
    float inv_bc1 = (float)(1.0 / (1.0 - pow(beta1, t)));
    float inv_bc2 = (float)(1.0 / (1.0 - pow(beta2, t)));
    int nt = k->threads;
#pragma omp parallel num_threads(nt) if (n >= KCPU_PAR_MIN)
    {
        size_t lo, hi;
        kcpu_split(n, omp_get_thread_num(), omp_get_num_threads(), 16, &lo, &hi);
        adamw_span(p + lo, g + lo, m + lo, v + lo, hi - lo, lr, beta1, beta2, eps, weight_decay, grad_scale,
                   inv_bc1, inv_bc2);
        /* The 16-bit copy of the slice this thread just wrote, while it is
         * in cache (the context's type, as lowp.c's ops read it). */
        if (p16 && k->prec == KERN_FP16)
            kcpu_round_f16(p16 + lo, p + lo, hi - lo);
        else if (p16)
            kcpu_round_bf16(p16 + lo, p + lo, hi - lo);
    }
}

/* The reference: adamw segment by segment.  A launch costs the CPU nothing
 * worth merging away, and this keeps the bits of the per-tensor calls. */
void kcpu_adamw_multi(kern_ctx *k, float *p, uint16_t *p16, const float *g, float *m, float *v,
                      const kern_segment *segs, int nsegs, float lr, float beta1, float beta2, float eps,
                      float weight_decay, float grad_scale, int t)
{
    for (int i = 0; i < nsegs; i++) {
        size_t o = segs[i].offset;
        kcpu_adamw(k, p + o, p16 ? p16 + o : NULL, g + o, m + o, v + o, segs[i].n, lr, beta1, beta2, eps,
                   segs[i].decay ? weight_decay : 0.0f, grad_scale, t);
    }
}
