/* encoder.c — token + position embedding (or the token embedding alone,
 * wpe NULL, for models whose positions are rotary). */
#include <omp.h>
#include <stdbool.h>

#include "cpu_kernels.h"

/* ---- forward ----------------------------------------------------------------------
 * inp (B,T) int32, wte (V,C), wpe (maxT,C) -> out (B,T,C) */
void kcpu_encoder_forward(kern_ctx *k, float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                          int T, int C)
{
    int nt = k->threads;
    size_t rows = (size_t)B * T;
#pragma omp parallel num_threads(nt) if (rows * C >= KCPU_PAR_MIN)
    {
        size_t lo, hi;
        kcpu_split(rows, omp_get_thread_num(), omp_get_num_threads(), 1, &lo, &hi);
        for (size_t bt = lo; bt < hi; bt++) {
            float *restrict o = out + bt * C;
            const float *restrict we = wte + (size_t)inp[bt] * C;
            if (!wpe) {
                memcpy(o, we, (size_t)C * sizeof *o);
                continue;
            }
            const float *restrict wp = wpe + (bt % (size_t)T) * C;
#pragma omp simd
            for (int i = 0; i < C; i++)
                o[i] = we[i] + wp[i];
        }
    }
}

/* ---- forward from a 16-bit token table ------------------------------------------
 * As the forward, with wte16 (V,C) in the context's 16-bit type (fp16 in an
 * fp16 context, bf16 otherwise, as lowp.c reads it), each row widened
 * exactly before the position is added: a frozen base's embedding, which
 * has no fp32 copy and no backward. */
void kcpu_encoder_forward16w(kern_ctx *k, float *out, const int32_t *inp, const uint16_t *wte16, const float *wpe,
                             int B, int T, int C)
{
    int nt = k->threads;
    bool f16 = k->prec == KERN_FP16;
    size_t rows = (size_t)B * T;
#pragma omp parallel num_threads(nt) if (rows * C >= KCPU_PAR_MIN)
    {
        size_t lo, hi;
        kcpu_split(rows, omp_get_thread_num(), omp_get_num_threads(), 1, &lo, &hi);
        for (size_t bt = lo; bt < hi; bt++) {
            float *restrict o = out + bt * C;
            const uint16_t *we = wte16 + (size_t)inp[bt] * C;
            if (f16)
                kcpu_widen_f16(o, we, (size_t)C);
            else
                kcpu_widen_bf16(o, we, (size_t)C);
            if (!wpe)
                continue;
            const float *restrict wp = wpe + (bt % (size_t)T) * C;
#pragma omp simd
            for (int i = 0; i < C; i++)
                o[i] += wp[i];
        }
    }
}

/* ---- backward ---------------------------------------------------------------------
 * dout (B,T,C), inp (B,T) -> dwte (V,C) +=, dwpe (maxT,C) += (dwpe NULL: none).
 * A token may repeat, so rows of dwte collide: threads split the channels
 * instead, and each walks all positions in order — no races, and the sums
 * do not depend on the thread count. */
void kcpu_encoder_backward(kern_ctx *k, float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                           int T, int C)
{
    int nt = k->threads;
    size_t rows = (size_t)B * T;
#pragma omp parallel num_threads(nt) if (rows * C >= KCPU_PAR_MIN)
    {
        size_t lo, hi;
        kcpu_split((size_t)C, omp_get_thread_num(), omp_get_num_threads(), 16, &lo, &hi);
        for (size_t bt = 0; bt < rows && hi > lo; bt++) {
            const float *restrict g = dout + bt * C;
            float *restrict we = dwte + (size_t)inp[bt] * C;
            if (!dwpe) {
#pragma omp simd
                for (size_t i = lo; i < hi; i++)
                    we[i] += g[i];
                continue;
            }
            float *restrict wp = dwpe + (bt % (size_t)T) * C;
#pragma omp simd
            for (size_t i = lo; i < hi; i++) {
                we[i] += g[i];
                wp[i] += g[i];
            }
        }
    }
}
