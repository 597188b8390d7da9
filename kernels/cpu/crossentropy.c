/* crossentropy.c — fused softmax + cross-entropy over the first V of Vp columns.
 *
 * Forward keeps one number per row, its log-sum-exp; backward recomputes the
 * softmax from the logits and that number.  A (N,Vp) probabilities matrix
 * would cost as much memory as the logits and a full extra write and read. */
#include <math.h>
#include <omp.h>

#include "cpu_kernels.h"

/* ---- forward ----------------------------------------------------------------------
 * logits (N,Vp), targets (N) -> losses (N), lse (N).
 * loss = log Σ e^(x - max) - (x[target] - max) rather than lse - x[target]:
 * with large logits, lse has already rounded away what the difference keeps.
 * A negative target is ignored (loss 0); one of V or more gives a NaN loss,
 * so it cannot pass unnoticed. */
KCPU_CLONES static void ce_rows(float *restrict losses, float *restrict lse, const float *restrict logits,
                                const int32_t *restrict targets, size_t lo, size_t hi, int V, int Vp)
{
    for (size_t i = lo; i < hi; i++) {
        const float *x = logits + i * Vp;
        float maxv = -INFINITY;
        KCPU_SIMD_MAX(maxv)
        for (int j = 0; j < V; j++)
            maxv = x[j] > maxv ? x[j] : maxv;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < V; j++)
            sum += kcpu_expf(x[j] - maxv);
        float ls = logf(sum);
        lse[i] = maxv + ls;
        int32_t t = targets[i];
        losses[i] = t < 0 ? 0.0f : t < V ? ls - (x[t] - maxv) : NAN;
    }
}

void kcpu_crossentropy_forward(kern_ctx *k, float *losses, float *lse, const float *logits,
                               const int32_t *targets, int N, int V, int Vp)
{
    int nt = k->threads;
#pragma omp parallel num_threads(nt) if ((size_t)N * V >= KCPU_PAR_MIN)
    {
        size_t lo, hi;
        kcpu_split((size_t)N, omp_get_thread_num(), omp_get_num_threads(), 1, &lo, &hi);
        ce_rows(losses, lse, logits, targets, lo, hi, V, Vp);
    }
}

/* ---- backward ---------------------------------------------------------------------
 * logits (N,Vp), lse (N), targets (N), dloss (N) -> dlogits (N,Vp) =
 * dloss·(softmax - onehot) on the first V columns, 0 on the padding, and 0
 * on the whole row of an ignored (negative) target.
 * dlogits may be logits itself, so the two are not restrict: each element is
 * read and then written by the same iteration, which `omp simd` allows. */
KCPU_CLONES static void ce_rows_backward(float *dlogits, const float *logits, const float *restrict lse,
                                         const int32_t *restrict targets, const float *restrict dloss, size_t lo,
                                         size_t hi, int V, int Vp)
{
    for (size_t i = lo; i < hi; i++) {
        float *dl = dlogits + i * Vp;
        const float *x = logits + i * Vp;
        const int32_t t = targets[i];
        const float d = t < 0 ? 0.0f : dloss[i], m = lse[i];
#pragma omp simd
        for (int j = 0; j < V; j++)
            dl[j] = d * (kcpu_expf(x[j] - m) - (j == t ? 1.0f : 0.0f));
        for (int j = V; j < Vp; j++)
            dl[j] = 0.0f;
    }
}

void kcpu_crossentropy_backward(kern_ctx *k, float *dlogits, const float *logits, const float *lse,
                                const int32_t *targets, const float *dloss, int N, int V, int Vp)
{
    int nt = k->threads;
#pragma omp parallel num_threads(nt) if ((size_t)N * V >= KCPU_PAR_MIN)
    {
        size_t lo, hi;
        kcpu_split((size_t)N, omp_get_thread_num(), omp_get_num_threads(), 1, &lo, &hi);
        ce_rows_backward(dlogits, logits, lse, targets, dloss, lo, hi, V, Vp);
    }
}
