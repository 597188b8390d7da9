// layernorm.cu — layernorm forward and backward, one warp per row.
//
// Two families of kernels:
//
// The register kernels (C = 128·V for V in LN_FWD_VS / LN_BWD_VS, every
// pointer aligned for 4-wide accesses): a lane holds its V float4s of the
// row (columns 128·k + 4·lane) in registers, so the row is read from memory
// once.
//   Forward: mean, variance about it and the output from the registers.
//   Backward: dinp (+=, and its 16-bit copy) and the weight gradients in one
//   launch: block b owns rows [b·R, b·R + R) (R from N alone, lnb_rows), its
//   warps stride them, and each lane keeps Σ dout·norm and Σ dout of its
//   columns in its warp's slice of shared memory; the 8 warps' sums are
//   added in a fixed order and the block writes one partial row, which
//   kc_colsum_merge (reduce.cu) adds into dweight/dbias in a fixed order.  No atomics: the bits depend on
//   N and C only, never on timing or the GPU model (R and the grid do not
//   depend on the SM count).  This replaces three launches (dinp, then the
//   column sums re-reading dout and x, then their final pass) by two.
//
// The general kernels (any C, any alignment; W = 4 or 1 elements per access):
// the same arithmetic over the row in three passes that hit L1, and
// dweight/dbias by the column sums of reduce.cu.
//
// Both write the same fp32 expressions in the same order: a lane adds its
// elements in column order (k outer, j inner), then the warp's butterfly;
// so the register kernels give the results of the W = 4 kernels bit for bit
// (mean, rstd, out, dinp; tests/emu checks it), and which family a shape
// takes changes no value.  Only dweight/dbias sum in another order (per
// block of rows, then across blocks, instead of per column slice): both
// orders are fixed by N and C, so both are deterministic.
//
// The forward is templated on the output's element type: fp32, or bf16/fp16
// for layernorm_forward16, whose output only GEMMs read.  The 16-bit variant
// does the very same fp32 arithmetic and rounds only at the store, so it
// equals the fp32 forward followed by the cast, and mean/rstd are bitwise
// those of the fp32 forward.  eps = 1e-5 as in GPT-2 and the CPU reference.
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

// ---- the register kernels ---------------------------------------------------------------

// The widths the register kernels are compiled for: C = 128·V (GPT-2:
// 768, 1024).  The backward stops at V = 6: its per-warp sums in shared
// memory, 8·2·C floats, reach the 48 KiB of static shared memory there.
#define LN_FWD_VS(X) X(1) X(2) X(3) X(4) X(6) X(8)
#define LN_BWD_VS(X) X(1) X(2) X(3) X(4) X(6)

// V for the register kernels, or 0 (the general kernels): C = 128·V with V
// one of LN_FWD_VS (bwd: LN_BWD_VS), and vec (every pointer aligned for the
// 4-wide path).
static inline int ln_reg_v(int C, bool vec, bool bwd)
{
    if (!vec || C % 128)
        return 0;
#define LN_IS_V(v)                                                                                                   \
    if (C == 128 * (v))                                                                                              \
        return v;
    if (bwd) {
        LN_BWD_VS(LN_IS_V)
    } else {
        LN_FWD_VS(LN_IS_V)
    }
#undef LN_IS_V
    return 0;
}

// Backward: the rows a block owns, R = ⌈N / LNB_BLOCKS⌉, so that there are
// at most LNB_BLOCKS blocks.  A function of N alone: the order of the
// weight-gradient sums (and so their bits) does not depend on the GPU.
// 256 blocks fit an H100/H200 (132 SMs, LNB_MIN_BLOCKS = 2 blocks of 256
// threads each: 128 registers, 2·48 KiB of shared memory at C = 768) in one
// wave, and leave kc_colsum_merge at most 256 partial rows.
#define LNB_BLOCKS 256
#define LNB_MIN_BLOCKS 2
static inline int lnb_rows(int N) { return N > LNB_BLOCKS ? (N + LNB_BLOCKS - 1) / LNB_BLOCKS : 1; }

// The ln_forward_kernel<4, O> arithmetic with the row in registers: lane
// holds columns 128·k + 4·lane + j, summed k outer, j inner, as that
// kernel's loop visits them.
template <int V, class O>
__global__ __launch_bounds__(32 * LN_WARPS) static void ln_forward_reg(O *__restrict__ out, float *__restrict__ mean,
                                                                       float *__restrict__ rstd,
                                                                       const float *__restrict__ inp,
                                                                       const float *__restrict__ weight,
                                                                       const float *__restrict__ bias, int N)
{
    constexpr int C = 128 * V;
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    if (row >= N)
        return;
    const float *x = inp + (size_t)row * C + 4 * lane;
    O *o = out + (size_t)row * C + 4 * lane;
    kc_fv<4> v[V];
#pragma unroll
    for (int k = 0; k < V; k++)
        v[k] = kc_ld<4>(x + 128 * k);
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < V; k++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            sum += v[k].v[j];
    float m = kc_warp_sum(sum) / (float)C;
    float var = 0.0f;
#pragma unroll
    for (int k = 0; k < V; k++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float d = v[k].v[j] - m;
            var += d * d;
        }
    float s = 1.0f / sqrtf(kc_warp_sum(var) / (float)C + LN_EPS);
#pragma unroll
    for (int k = 0; k < V; k++) {
        int c = 128 * k + 4 * lane;
        kc_fv<4> w = kc_ld<4>(weight + c), b = kc_ld<4>(bias + c);
#pragma unroll
        for (int j = 0; j < 4; j++)
            v[k].v[j] = (v[k].v[j] - m) * s * w.v[j] + b.v[j];
        kc_stE<O, 4>(o + 128 * k, v[k]);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

// Backward of the rows [blockIdx.x·R, +R) ∩ [0, N), 32·LN_WARPS threads:
//   dinp += the gradient as ln_backward_kernel<4> computes it, and with
//     dinp16 the updated dinp rounded to E;
//   part (NULL: none; else 2·gridDim.x·C floats): row blockIdx.x of part_a =
//     part gets Σ dout·norm over the block's rows, of part_b = part +
//     gridDim.x·C Σ dout, as kc_colsum_merge expects.
// Each lane sums its own columns over its warp's rows (in row order) into
// the warp's slice of shared memory, then warps 0..7 are added in that order
// per column.  The sums live in shared memory, not registers: 2·4·V more
// registers per thread (48 at C = 768) on top of the row and dout spilled
// at two blocks per SM; there they cost a read and a write per row, which
// the shared-memory pipe has the room for (it waits on DRAM).
// DO: dout's element type, fp32 or E (widened exactly).
template <int V, class E, class DO>
__global__ __launch_bounds__(32 * LN_WARPS, LNB_MIN_BLOCKS) static void ln_backward_reg(
    float *__restrict__ dinp, E *__restrict__ dinp16, float *__restrict__ part, const DO *__restrict__ dout,
    const float *__restrict__ inp, const float *__restrict__ weight, const float *__restrict__ mean,
    const float *__restrict__ rstd, int N, int R)
{
    constexpr int C = 128 * V;
    // [warp][0]: Σ dout·norm, [warp][1]: Σ dout; 48 KiB at C = 768.
    __shared__ __align__(16) float acc[LN_WARPS][2][C];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int r0 = blockIdx.x * R, r1 = min(N, r0 + R);
    float *aw = acc[warp][0] + 4 * lane, *ab = acc[warp][1] + 4 * lane;
    if (part) {
        kc_fv<4> z = {};
#pragma unroll
        for (int k = 0; k < V; k++) {
            kc_st<4>(aw + 128 * k, z);
            kc_st<4>(ab + 128 * k, z);
        }
    }
    // row is warp-uniform: the shuffles below see all 32 lanes.  Each lane
    // reads and writes only its own columns of its warp's sums: no barrier.
    for (int row = r0 + warp; row < r1; row += LN_WARPS) {
        size_t off = (size_t)row * C + 4 * lane;
        float m = mean[row], s = rstd[row];
        kc_fv<4> xv[V], dv[V];
#pragma unroll
        for (int k = 0; k < V; k++) {
            xv[k] = kc_ld<4>(inp + off + 128 * k);
            dv[k] = kc_ldE<DO, 4>(dout + off + 128 * k);
        }
        float dn_mean = 0.0f, dnn_mean = 0.0f;
#pragma unroll
        for (int k = 0; k < V; k++) {
            kc_fv<4> wv = kc_ld<4>(weight + 128 * k + 4 * lane);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float dn = wv.v[j] * dv[k].v[j];
                dn_mean += dn;
                dnn_mean += dn * (xv[k].v[j] - m) * s;
            }
        }
        dn_mean = kc_warp_sum(dn_mean) / (float)C;
        dnn_mean = kc_warp_sum(dnn_mean) / (float)C;
        // Chunk k of x and dout is dead after step k: the loads of dinp and
        // of the sums do not raise the peak of live registers.
#pragma unroll
        for (int k = 0; k < V; k++) {
            kc_fv<4> wv = kc_ld<4>(weight + 128 * k + 4 * lane), gv = kc_ld<4>(dinp + off + 128 * k);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float norm = (xv[k].v[j] - m) * s;
                gv.v[j] += (wv.v[j] * dv[k].v[j] - dn_mean - norm * dnn_mean) * s;
            }
            kc_st<4>(dinp + off + 128 * k, gv);
            if (dinp16)
                kc_stE<E, 4>(dinp16 + off + 128 * k, gv);
            if (part) {
                kc_fv<4> a = kc_ld<4>(aw + 128 * k), b = kc_ld<4>(ab + 128 * k);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    // colsum_partial's terms: dout·((x − mean)·rstd) and dout.
                    a.v[j] += dv[k].v[j] * ((xv[k].v[j] - m) * s);
                    b.v[j] += dv[k].v[j];
                }
                kc_st<4>(aw + 128 * k, a);
                kc_st<4>(ab + 128 * k, b);
            }
        }
    }
    if (!part) // uniform over the grid: no thread reaches the barrier
        return;
    __syncthreads();
    float *pa = part + (size_t)blockIdx.x * C, *pb = part + ((size_t)gridDim.x + blockIdx.x) * C;
    for (int c = threadIdx.x; c < C; c += 32 * LN_WARPS) {
        float ta = 0.0f, tb = 0.0f;
#pragma unroll
        for (int w = 0; w < LN_WARPS; w++) {
            ta += acc[w][0][c];
            tb += acc[w][1][c];
        }
        pa[c] = ta;
        pb[c] = tb;
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
    switch (ln_reg_v(C, vec, false)) {
#define LN_FWD_V(v)                                                                                                  \
    case v:                                                                                                          \
        ln_forward_reg<v, O><<<grid, 32 * LN_WARPS, 0, k->stream>>>(out, mean, rstd, inp, weight, bias, N);         \
        return;
        LN_FWD_VS(LN_FWD_V)
#undef LN_FWD_V
    default:
        break;
    }
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

// The register backward (ln_reg_v's V), with the weight gradients (dweight
// and dbias both, or neither) fused in; false: this shape goes the general way.
template <class E, class DO>
static bool ln_backward_reg_launch(kern_ctx *k, float *dinp, E *dinp16, float *dweight, float *dbias, const DO *dout,
                                   const float *inp, const float *weight, const float *mean, const float *rstd, int N,
                                   int C)
{
    // dinp16 may be NULL (kc_aligned counts NULL as aligned); dinp is not.
    bool vec = kc_aligned(16, dinp, inp, weight) && kc_aligned(sizeof(DO) * 4, dout) && kc_aligned(8, dinp16);
    int V = ln_reg_v(C, vec, true);
    if (!V)
        return false;
    int R = lnb_rows(N);
    unsigned grid = (unsigned)((N + R - 1) / R);
    float *part = NULL;
    if (dweight && dbias) {
        part = (float *)kc_scratch(k, (size_t)2 * grid * C * sizeof(float));
        if (!part)
            return true; // the error is recorded
    }
    switch (V) {
#define LN_BWD_V(v)                                                                                                  \
    case v:                                                                                                          \
        ln_backward_reg<v, E, DO>                                                                                    \
            <<<grid, 32 * LN_WARPS, 0, k->stream>>>(dinp, dinp16, part, dout, inp, weight, mean, rstd, N, R);       \
        break;
        LN_BWD_VS(LN_BWD_V)
#undef LN_BWD_V
    default:
        break;
    }
    kc_launched(k, "layernorm_backward");
    if (part)
        kc_colsum_merge(k, dweight, dbias, part, part + (size_t)grid * C, (int)grid, C);
    return true;
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
    bool wgrad = dweight && dbias;
    if (!dinp && !wgrad)
        return;
    // The register backward needs dinp; the weight gradients alone (no
    // caller in training) go the general way.
    bool done = false;
    if (dinp) {
        kc_with16(k->prec == KERN_BF16, [&]<class E>() {
            E *d16 = reinterpret_cast<E *>(dinp16);
            float *dw = wgrad ? dweight : NULL;
            if (dout16)
                done = ln_backward_reg_launch(k, dinp, d16, dw, dbias, reinterpret_cast<const E *>(dout16),
                                              inp, weight, mean, rstd, N, C);
            else
                done = ln_backward_reg_launch(k, dinp, d16, dw, dbias, dout, inp, weight, mean, rstd, N, C);
        });
    }
    if (done)
        return;
    if (wgrad) {
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
