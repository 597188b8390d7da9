/* crossentropy.c — fused softmax + cross-entropy over the first V of Vp columns. */
#include <math.h>
#include <omp.h>

#include "cpu_kernels.h"

/* ---- forward ----------------------------------------------------------------------
 * logits (N,Vp), targets (N) -> losses (N), probs (N,Vp) (padding columns 0).
 * loss = log Σ e^(x - max) - (x[target] - max): no log of an underflowed
 * probability.  A target outside [0,V) gives a NaN loss, so it cannot pass
 * unnoticed. */
KCPU_CLONES static void ce_rows(float *restrict losses, float *restrict probs, const float *restrict logits,
                                const int32_t *restrict targets, size_t lo, size_t hi, int V, int Vp)
{
    for (size_t i = lo; i < hi; i++) {
        const float *x = logits + i * Vp;
        float *p = probs + i * Vp;
        float maxv;
        float sum = kcpu_softmax_row(p, x, V, Vp, &maxv);
        int32_t t = targets[i];
        losses[i] = t >= 0 && t < V ? logf(sum) - (x[t] - maxv) : NAN;
    }
}

void kcpu_crossentropy_forward(kern_ctx *k, float *losses, float *probs, const float *logits,
                               const int32_t *targets, int N, int V, int Vp)
{
    int nt = k->threads;
#pragma omp parallel num_threads(nt) if ((size_t)N * V >= KCPU_PAR_MIN)
    {
        size_t lo, hi;
        kcpu_split((size_t)N, omp_get_thread_num(), omp_get_num_threads(), 1, &lo, &hi);
        ce_rows(losses, probs, logits, targets, lo, hi, V, Vp);
    }
}

/* ---- backward ---------------------------------------------------------------------
 * probs (N,Vp), targets (N), dloss (N) -> dlogits (N,Vp) += dloss·(probs - onehot),
 * first V columns only. */
KCPU_CLONES static void ce_rows_backward(float *restrict dlogits, const float *restrict probs,
                                         const int32_t *restrict targets, const float *restrict dloss, size_t lo,
                                         size_t hi, int V, int Vp)
{
    for (size_t i = lo; i < hi; i++) {
        float *dl = dlogits + i * Vp;
        const float *p = probs + i * Vp;
        const float d = dloss[i];
        int32_t t = targets[i];
#pragma omp simd
        for (int j = 0; j < V; j++)
            dl[j] += d * (p[j] - (j == t ? 1.0f : 0.0f));
    }
}

void kcpu_crossentropy_backward(kern_ctx *k, float *dlogits, const float *probs, const int32_t *targets,
                                const float *dloss, int N, int V, int Vp)
{
    int nt = k->threads;
#pragma omp parallel num_threads(nt) if ((size_t)N * V >= KCPU_PAR_MIN)
    {
        size_t lo, hi;
        kcpu_split((size_t)N, omp_get_thread_num(), omp_get_num_threads(), 1, &lo, &hi);
        ce_rows_backward(dlogits, probs, targets, dloss, lo, hi, V, Vp);
    }
}
