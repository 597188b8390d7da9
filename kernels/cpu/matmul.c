/* matmul.c — fully connected layer: out = inp·weightᵀ + bias, on OpenBLAS sgemm.
 *
 * Each OpenMP thread calls single-threaded sgemm on its own slice of the
 * output (rows of out/dinp, rows of dweight), so the partition, and with it
 * every rounding, is fixed by the shapes and the thread count. */
#include <cblas.h>
#include <omp.h>

#include "cpu_kernels.h"

/* Below this many multiply-adds a GEMM runs on one thread. */
#define MM_PAR_MIN ((size_t)1 << 17)

/* Rows of a slice are multiples of this, to keep sgemm's register tiles whole. */
#define MM_ALIGN 16

/* Column tile for the bias reduction: one local accumulator array. */
#define DB_TILE 64

/* ---- forward ----------------------------------------------------------------------
 * inp (N,C), weight (OC,C), bias (OC) or NULL -> out (N,OC) */
void kcpu_matmul_forward(kern_ctx *k, float *out, const float *inp, const float *weight, const float *bias, int N,
                         int C, int OC)
{
    kcpu_blas_single();
    int nt = k->threads;
    size_t work = (size_t)N * C * OC;
    /* Split the rows of out, or its columns when there are too few rows. */
    int by_rows = N >= MM_ALIGN * nt || N >= OC;
#pragma omp parallel num_threads(nt) if (work >= MM_PAR_MIN)
    {
        int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        size_t lo, hi;
        kcpu_split(by_rows ? (size_t)N : (size_t)OC, tid, nth, MM_ALIGN, &lo, &hi);
        if (hi > lo) {
            size_t r0 = by_rows ? lo : 0, r1 = by_rows ? hi : (size_t)N;
            size_t c0 = by_rows ? 0 : lo, c1 = by_rows ? (size_t)OC : hi;
            float beta = 0.0f;
            if (bias) {
                /* Bias first, then sgemm adds into it (beta 1): one pass less. */
                for (size_t r = r0; r < r1; r++)
                    memcpy(out + r * OC + c0, bias + c0, (c1 - c0) * sizeof *out);
                beta = 1.0f;
            }
            if (r1 - r0 == 1) /* one row (a decode step): OpenBLAS's sgemv is ~5x its sgemm there */
                cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)(c1 - c0), C, 1.0f, weight + c0 * C, C, inp + r0 * C,
                            1, beta, out + r0 * OC + c0, 1);
            else
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(r1 - r0), (int)(c1 - c0), C, 1.0f,
                            inp + r0 * C, C, weight + c0 * C, C, beta, out + r0 * OC + c0, OC);
        }
    }
}

/* ---- backward ---------------------------------------------------------------------
 * dout (N,OC), inp (N,C), weight (OC,C) ->
 *   dinp (N,C) = dout·weight (overwritten);  dweight (OC,C) += doutᵀ·inp;  dbias (OC) += Σ_n dout.
 * dinp, dweight, dbias may each be NULL. */

/* dbias[lo,hi) += column sums of dout (N,OC): rows in order, so the sum does
 * not depend on the thread count. */
KCPU_CLONES static void bias_grad_span(float *restrict dbias, const float *restrict dout, size_t N, size_t OC,
                                       size_t lo, size_t hi)
{
    for (size_t o0 = lo; o0 < hi; o0 += DB_TILE) {
        size_t w = hi - o0 < DB_TILE ? hi - o0 : DB_TILE;
        float acc[DB_TILE] = {0};
        for (size_t n = 0; n < N; n++) {
            const float *row = dout + n * OC + o0;
#pragma omp simd
            for (size_t j = 0; j < w; j++)
                acc[j] += row[j];
        }
        for (size_t j = 0; j < w; j++)
            dbias[o0 + j] += acc[j];
    }
}

void kcpu_matmul_backward(kern_ctx *k, float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int N, int C, int OC)
{
    kcpu_blas_single();
    int nt = k->threads;
    size_t work = (size_t)N * C * OC;
    int dw_by_rows = OC >= MM_ALIGN * nt || OC >= C;
#pragma omp parallel num_threads(nt) if (work >= MM_PAR_MIN)
    {
        int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        size_t lo, hi;
        if (dinp) {
            kcpu_split((size_t)N, tid, nth, MM_ALIGN, &lo, &hi);
            if (hi > lo)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(hi - lo), C, OC, 1.0f,
                            dout + lo * OC, OC, weight, C, 0.0f, dinp + lo * C, C);
        }
        if (dweight) {
            if (dw_by_rows) {
                kcpu_split((size_t)OC, tid, nth, MM_ALIGN, &lo, &hi);
                if (hi > lo)
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(hi - lo), C, N, 1.0f, dout + lo,
                                OC, inp, C, 1.0f, dweight + lo * C, C);
            } else {
                kcpu_split((size_t)C, tid, nth, MM_ALIGN, &lo, &hi);
                if (hi > lo)
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, (int)(hi - lo), N, 1.0f, dout, OC,
                                inp + lo, C, 1.0f, dweight + lo, C);
            }
        }
        if (dbias) {
            kcpu_split((size_t)OC, tid, nth, 16, &lo, &hi);
            bias_grad_span(dbias, dout, (size_t)N, (size_t)OC, lo, hi);
        }
    }
}
