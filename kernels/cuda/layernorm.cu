// layernorm.cu — layernorm forward and backward, one warp per row.
//
// Forward: mean, then the variance about it (two passes over the row, which
// stays in L1), then the output; mean and rstd saved.  Backward: the row's
// dinp in one warp (two passes), and dweight/dbias by the deterministic
// column sums of reduce.cu.  eps = 1e-5 as in GPT-2 and the CPU reference.
//
// The forward is one kernel templated on the output's element type: fp32,
// or bf16/fp16 for layernorm_forward16, whose output only GEMMs read.  The
// 16-bit variant does the very same fp32 arithmetic and rounds only at the
// store, so it equals the fp32 forward followed by the cast, and mean/rstd
// are bitwise those of the fp32 forward.
#include <type_traits>

#include "kern_cuda.cuh"

#define LN_EPS 1e-5f
#define LN_WARPS 8


// O: float, __nv_bfloat16 or __half (the output's element type).
template <int W, class O>
__global__ static void ln_forward_kernel(O *__restrict__ out, float *__restrict__ mean, float *__restrict__ rstd,
                                         const float *__restrict__ inp, const float *__restrict__ weight,
                                         const float *__restrict__ bias, int N, int C)
{
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    if (row >= N)
        return;
    const float *x = inp + (size_t)row * C;
    O *o = out + (size_t)row * C;
    float sum = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {
        kc_fv<W> v = kc_ld<W>(x + c);
#pragma unroll
        for (int j = 0; j < W; j++)
            sum += v.v[j];
    }
    float m = kc_warp_sum(sum) / (float)C;
    float var = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {
        kc_fv<W> v = kc_ld<W>(x + c);
#pragma unroll
        for (int j = 0; j < W; j++) {
            float d = v.v[j] - m;
            var += d * d;
        }
    }
    float s = 1.0f / sqrtf(kc_warp_sum(var) / (float)C + LN_EPS);
    for (int c = lane * W; c < C; c += 32 * W) {
        kc_fv<W> v = kc_ld<W>(x + c), w = kc_ld<W>(weight + c), b = kc_ld<W>(bias + c);
#pragma unroll
        for (int j = 0; j < W; j++)
            v.v[j] = (v.v[j] - m) * s * w.v[j] + b.v[j];
        kc_stE<O, W>(o + c, v);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

// dinp += the gradient; with dinp16, also the updated dinp rounded to E.
// DO: dout's element type, fp32 or E (widened exactly).
template <int W, class E, class DO>
__global__ static void ln_backward_kernel(float *__restrict__ dinp, E *__restrict__ dinp16,
                                          const DO *__restrict__ dout, const float *__restrict__ inp,
                                          const float *__restrict__ weight, const float *__restrict__ mean,
                                          const float *__restrict__ rstd, int N, int C)
{
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    if (row >= N)
        return;
    size_t off = (size_t)row * C;
    const float *x = inp + off;
    const DO *d = dout + off;
    float *g = dinp + off;
    float m = mean[row], s = rstd[row];
    float dn_mean = 0.0f, dnn_mean = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {
        kc_fv<W> xv = kc_ld<W>(x + c), dv = kc_ldE<DO, W>(d + c), wv = kc_ld<W>(weight + c);
#pragma unroll
        for (int j = 0; j < W; j++) {
            float dn = wv.v[j] * dv.v[j];
            dn_mean += dn;
            dnn_mean += dn * (xv.v[j] - m) * s;
        }
    }
    dn_mean = kc_warp_sum(dn_mean) / (float)C;
    dnn_mean = kc_warp_sum(dnn_mean) / (float)C;
    for (int c = lane * W; c < C; c += 32 * W) {
        kc_fv<W> xv = kc_ld<W>(x + c), dv = kc_ldE<DO, W>(d + c), wv = kc_ld<W>(weight + c), gv = kc_ld<W>(g + c);
#pragma unroll
        for (int j = 0; j < W; j++) {
            float norm = (xv.v[j] - m) * s;
            gv.v[j] += (wv.v[j] * dv.v[j] - dn_mean - norm * dnn_mean) * s;
        }
        kc_st<W>(g + c, gv);
        if (dinp16)
            kc_stE<E, W>(dinp16 + off + c, gv);
    }
}

#ifndef GRADD_CUDA_EMU // the host launchers (tests/emu runs the kernels above itself)
// vec: C % 4 == 0 and every pointer aligned for 4-wide loads and stores (inp,
// weight, bias to 16 bytes; out to 16 bytes for fp32, 8 for 16-bit), which
// with C % 4 == 0 keeps every row's start aligned too.
template <class O>
static void ln_forward_launch(kern_ctx *k, O *out, float *mean, float *rstd, const float *inp, const float *weight,
                              const float *bias, int N, int C, bool vec)
{
    unsigned grid = (unsigned)((N + LN_WARPS - 1) / LN_WARPS);
    if (vec)
        ln_forward_kernel<4, O><<<grid, 32 * LN_WARPS, 0, k->stream>>>(out, mean, rstd, inp, weight, bias, N, C);
    else
        ln_forward_kernel<1, O><<<grid, 32 * LN_WARPS, 0, k->stream>>>(out, mean, rstd, inp, weight, bias, N, C);
}

void kc_layernorm_forward(kern_ctx *k, float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    kc_enter(k);
    ln_forward_launch(k, out, mean, rstd, inp, weight, bias, N, C,
                      C % 4 == 0 && kc_aligned(16, out, inp, weight, bias));
    kc_launched(k, "layernorm_forward");
}

void kc_layernorm_forward16(kern_ctx *k, uint16_t *out16, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    kc_enter(k);
    bool vec = C % 4 == 0 && kc_aligned(16, inp, weight, bias) && kc_aligned(8, out16);
    // fp16 only in an fp16 context; bf16 otherwise, as the CPU backend (an
    // fp32 context has no 16-bit type and never calls this).
    if (k->prec == KERN_FP16)
        ln_forward_launch(k, reinterpret_cast<__half *>(out16), mean, rstd, inp, weight, bias, N, C, vec);
    else
        ln_forward_launch(k, reinterpret_cast<__nv_bfloat16 *>(out16), mean, rstd, inp, weight, bias, N, C, vec);
    kc_launched(k, "layernorm_forward16");
}

template <class E, class DO>
static void ln_backward_launch(kern_ctx *k, float *dinp, E *dinp16, const DO *dout, const float *inp,
                               const float *weight, const float *mean, const float *rstd, int N, int C)
{
    unsigned grid = (unsigned)((N + LN_WARPS - 1) / LN_WARPS);
    if (C % 4 == 0 && kc_aligned(16, dinp, inp, weight) && kc_aligned(sizeof(DO) * 4, dout) && kc_aligned(8, dinp16))
        ln_backward_kernel<4, E, DO><<<grid, 32 * LN_WARPS, 0, k->stream>>>(dinp, dinp16, dout, inp, weight, mean,
                                                                           rstd, N, C);
    else
        ln_backward_kernel<1, E, DO><<<grid, 32 * LN_WARPS, 0, k->stream>>>(dinp, dinp16, dout, inp, weight, mean,
                                                                           rstd, N, C);
    kc_launched(k, "layernorm_backward");
}

// dinp16 (NULL: none) and dout16 (NULL: dout, fp32) in the context's 16-bit
// type: bf16 unless fp16, as kc_layernorm_forward16.
static void ln_backward(kern_ctx *k, float *dinp, uint16_t *dinp16, float *dweight, float *dbias, const float *dout,
                        const uint16_t *dout16, const float *inp, const float *weight, const float *mean,
                        const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    kc_enter(k);
    if (dweight && dbias) {
        float *part = (float *)kc_scratch(k, kc_colsum_scratch(k, N, C, true) * sizeof(float));
        if (part && dout16)
            kc_colsum16(k, dweight, dbias, dout16, inp, mean, rstd, N, C, part);
        else if (part)
            kc_colsum(k, dweight, dbias, dout, inp, mean, rstd, N, C, part);
    }
    if (!dinp)
        return;
    kc_with16(k->prec == KERN_BF16, [&]<class E>() {
        if (dout16)
            ln_backward_launch(k, dinp, reinterpret_cast<E *>(dinp16), reinterpret_cast<const E *>(dout16), inp,
                               weight, mean, rstd, N, C);
        else
            ln_backward_launch(k, dinp, reinterpret_cast<E *>(dinp16), dout, inp, weight, mean, rstd, N, C);
    });
}

void kc_layernorm_backward(kern_ctx *k, float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const float *mean, const float *rstd, int N,
                           int C)
{
    ln_backward(k, dinp, NULL, dweight, dbias, dout, NULL, inp, weight, mean, rstd, N, C);
}

void kc_layernorm_backward16(kern_ctx *k, float *dinp, uint16_t *dinp16, float *dweight, float *dbias,
                             const float *dout, const uint16_t *dout16, const float *inp, const float *weight,
                             const float *mean, const float *rstd, int N, int C)
{
    if ((!dout) == (!dout16)) {
        kc_ok(k, cudaErrorInvalidValue, "layernorm_backward16: exactly one of dout and dout16");
        return;
    }
    ln_backward(k, dinp, dinp16, dweight, dbias, dout, dout16, inp, weight, mean, rstd, N, C);
}
#endif
