// loss.cu — fused softmax + cross-entropy, one block per row.
//
// Forward: one pass over the logits for the running max and sum (online
// softmax, float4 loads where aligned), a block-wide merge, then the row's
// log-sum-exp and loss.  Nothing of size V is written: backward recomputes
// the softmax from the logits and lse, which is cheaper than writing and
// re-reading an (N,Vp) probabilities matrix.
// Backward: dlogits = dloss·(exp(x − lse) − onehot) on the first V columns,
// 0 on the padding and on the whole row of an ignored (negative) target, in
// one read and one write; it overwrites, so dlogits may be the logits
// buffer (each element is read and then written by the same thread, hence
// no __restrict__ on those two).
// Fused (training, 16-bit logits): both in one block per row, in place.
// Where the rows allow 16-byte vectors and fit (ce_reg_nv: GPT-2's padded
// 50304 columns do), ce_fused_reg_kernel: 1024 threads hold the row in
// registers, read it once, write it once, one exp per element for the sum
// and one for the gradient; its results differ from the two kernels' in
// the last bits (another order, exp2f).  Elsewhere ce_fused_kernel, the two
// kernels' arithmetic and bits with the row's second read following its
// first.
//
// The logits may also be 16-bit (the context's type, the *16 entry points):
// the kernels are templated on the element type E, widen on load and, in
// backward, round the result to E on store.
#include <string.h>

#include "kern_cuda.cuh"

#define CE_THREADS 256

// The row's softmax statistics: the online max and sum of its first V
// columns (W at a time where the launcher could vectorise), merged over the
// block through warp_ms.  Every lane of warp 0 returns the row's; the other
// warps' return values are partial.
template <class E, int W> __device__ __forceinline__ kc_ms ce_row_ms(const E *x, int V, kc_ms *warp_ms)
{
    int vw = V / W * W;
    kc_ms ms = {-INFINITY, 0.0f};
    for (int v = threadIdx.x * W; v < vw; v += CE_THREADS * W) {
        kc_fv<W> a = kc_ldE<E, W>(x + v);
#pragma unroll
        for (int j = 0; j < W; j++)
            ms = kc_ms_add(ms, a.v[j]);
    }
    for (int v = vw + threadIdx.x; v < V; v += CE_THREADS)
        ms = kc_ms_add(ms, kc_widen(x[v]));
    ms = kc_warp_ms(ms);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
        warp_ms[warp] = ms;
    __syncthreads();
    if (warp == 0) {
        ms = lane < CE_THREADS / 32 ? warp_ms[lane] : kc_ms{-INFINITY, 0.0f};
        ms = kc_warp_ms(ms);
    }
    return ms;
}

// The row's loss from its statistics.  log s + m − x[t], not lse − x[t]:
// with large logits lse has already rounded away what the difference keeps.
// A negative target marks an ignored row (a prompt token, padding): loss 0,
// as the cpu; one of V or more a NaN, so that it cannot pass unnoticed.
__device__ __forceinline__ float ce_loss(float m, float ls, float xt, int t, int V)
{
    return t < 0 ? 0.0f : t < V ? ls + (m - xt) : NAN;
}

template <class E> __device__ __forceinline__ float ce_row_loss(kc_ms ms, float ls, const E *x, int t, int V)
{
    return ce_loss(ms.m, ls, t >= 0 && t < V ? kc_widen(x[t]) : 0.0f, t, V);
}

// An ignored row's gradient is 0 throughout: its dloss counts as 0 (the
// softmax term is at most 1, so the product is an exact +0).
__device__ __forceinline__ float ce_row_dloss(const float *dloss, size_t row, int t)
{
    return t < 0 ? 0.0f : dloss[row];
}

// g = dl·(exp(x − lse) − onehot(t)) over the row, 0 on the padding.  W
// divides Vp (the launchers' choice), so the vectors cover the row, padding
// included.  g may be x: each element is read, then written, by one thread.
template <class E, int W>
__device__ __forceinline__ void ce_row_grad(E *g, const E *x, float lse, int t, float dl, int V, int Vp)
{
    for (int v = threadIdx.x * W; v < Vp; v += CE_THREADS * W) {
        kc_fv<W> a = kc_ldE<E, W>(x + v);
#pragma unroll
        for (int j = 0; j < W; j++)
            a.v[j] = v + j < V ? dl * (expf(a.v[j] - lse) - (v + j == t ? 1.0f : 0.0f)) : 0.0f;
        kc_stE<E, W>(g + v, a);
    }
}

template <class E, int W>
__global__ static void ce_forward_kernel(float *__restrict__ losses, float *__restrict__ lse,
                                         const E *__restrict__ logits, const int32_t *__restrict__ targets,
                                         int V, int Vp)
{
    __shared__ kc_ms warp_ms[CE_THREADS / 32];
    size_t row = blockIdx.x;
    const E *x = logits + row * Vp;
    kc_ms ms = ce_row_ms<E, W>(x, V, warp_ms);
    if (threadIdx.x == 0) {
        float ls = logf(ms.s);
        lse[row] = ms.m + ls;
        losses[row] = ce_row_loss(ms, ls, x, targets[row], V);
    }
}

template <class E, int W>
__global__ static void ce_backward_kernel(E *dlogits, const E *logits, const float *__restrict__ lse,
                                          const int32_t *__restrict__ targets, const float *__restrict__ dloss,
                                          int V, int Vp)
{
    size_t row = blockIdx.x;
    const int t = targets[row];
    ce_row_grad<E, W>(dlogits + row * Vp, logits + row * Vp, lse[row], t, ce_row_dloss(dloss, row, t), V, Vp);
}

// Forward and backward of a row in one block: the statistics, then the
// gradient over the logits in place, the row read the second time right
// after the first, not after the whole (N,Vp) matrix has gone through.
// The same arithmetic as the two kernels, so the same bits.  The fallback
// of ce_fused_reg_kernel below (rows it cannot vectorise or hold).
template <class E, int W>
__global__ static void ce_fused_kernel(float *__restrict__ losses, E *logits, const int32_t *__restrict__ targets,
                                       const float *__restrict__ dloss, int V, int Vp)
{
    __shared__ kc_ms warp_ms[CE_THREADS / 32];
    __shared__ float row_lse;
    size_t row = blockIdx.x;
    E *x = logits + row * Vp;
    kc_ms ms = ce_row_ms<E, W>(x, V, warp_ms);
    int t = targets[row];
    if (threadIdx.x == 0) { // reads x[t] before the barrier; the gradient overwrites it after
        float ls = logf(ms.s);
        row_lse = ms.m + ls;
        losses[row] = ce_row_loss(ms, ls, x, t, V);
    }
    __syncthreads();
    ce_row_grad<E, W>(x, x, row_lse, t, ce_row_dloss(dloss, row, t), V, Vp);
}

// ---- the fused kernel with the row in registers (16-bit logits, training) ----
//
// Why not ce_fused_kernel: a block of 256 threads streams its row twice,
// and with ~8 such blocks on each of 132 SMs the rows in flight (100 KB
// each for GPT-2, ~100 MB) are more than L2 holds, so the second read
// likely goes to DRAM again; its online softmax also pays up to two expf
// per element and the gradient a third, each expf several instructions
// besides the SFU's, with 8-byte loads.  Here a block of T threads loads
// its row once into registers as 16-byte vectors (NV per thread, kept as
// the raw 16-bit words: half the registers of widened floats), each thread
// takes the max of its own elements, then the sum of exp relative to that
// max (one exp per element), the block merges the threads' (max, sum)
// pairs in one reduction, and the gradient is computed from the registers
// (the second exp) and stored once: one read and one write of the row.
// At T = 1024 the kernel has 64 registers a thread, the whole register
// file: one block per SM.
//
// exp(x − m) as exp2f((x − m)·log2 e): the difference first, exact for the
// elements near the max that make up the sum, then one rounding of the
// product; exp2f is the SFU's ex2 (2 ulp), where expf adds a range
// reduction of several instructions per element.  The loss and dlogits
// differ from ce_fused_kernel's (and the two kernels') in the last bits:
// another summation order, another exp; the tests compare them with the
// CPU within the usual tolerances (loss 1e-5, dlogits 1e-4 of the max).
#define CE_VEC 8 // 16-bit elements per 16-byte vector
#define CE_REG_THREADS 1024
#define CE_REG_NV_MAX 8 // 8·1024·8 = 65536 columns, the largest vocabulary a job may have
#define CE_LOG2E 1.4426950408889634f

template <class E> __device__ __forceinline__ float ce_elem(const uint32_t (&w)[4], int j)
{
    return kc_from16<E>((uint16_t)(w[j >> 1] >> (16 * (j & 1))));
}

// A pair of raw 16-bit words as E's two-element vector type, for the
// packed max.
template <class E> __device__ __forceinline__ auto ce_pair(uint32_t u)
{
    std::conditional_t<std::is_same_v<E, __nv_bfloat16>, __nv_bfloat162, __half2> h;
    memcpy((void *)&h, &u, sizeof u); // (void *): the types' copy-assignment is not trivial, their bits are
    return h;
}

// Two gradients rounded to E and packed, lo first in memory: the
// conversion instruction that does two at once, round to nearest even as
// kc_to16 (the same bits but for a NaN's payload).
template <class E> __device__ __forceinline__ uint32_t ce_pack16(float lo, float hi)
{
    uint32_t u;
    if constexpr (std::is_same_v<E, __nv_bfloat16>) {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        memcpy(&u, &h, sizeof u);
    } else {
        __half2 h = __floats2half2_rn(lo, hi);
        memcpy(&u, &h, sizeof u);
    }
    return u;
}

// Vector k·T + threadIdx.x of the row for each k < NV (a warp's loads are
// contiguous); the launcher picks NV so that T·NV·CE_VEC >= Vp, with Vp a
// multiple of CE_VEC and the logits 16-byte aligned (ce_reg_nv).
template <class E, int T, int NV>
__global__ static void __launch_bounds__(T, 1)
    ce_fused_reg_kernel(float *__restrict__ losses, E *logits, const int32_t *__restrict__ targets,
                        const float *__restrict__ dloss, int V, int Vp)
{
    static_assert(T % 32 == 0 && T <= 1024, "whole warps, at most 32 of them");
    __shared__ kc_ms warp_ms[T / 32];
    __shared__ kc_ms row_ms;
    __shared__ uint32_t row_zero;
    const uint16_t neg_inf = std::is_same_v<E, __nv_bfloat16> ? 0xff80u : 0xfc00u;
    const size_t row = blockIdx.x;
    E *x = logits + row * Vp;
    const int t = targets[row];
    const float dl = ce_row_dloss(dloss, row, t);
    // x[t] read now, while the row loads, not between the two barriers
    // where the whole block would wait for it.
    float xt = 0.0f;
    if (threadIdx.x == 0 && t >= 0 && t < V)
        xt = kc_widen(x[t]);

    // The thread's columns from c0, and the bounds relative to it: vector k
    // is then xs plus a constant, not an address of its own to keep live.
    const int c0 = (int)threadIdx.x * CE_VEC, vlim = V - c0, plim = Vp - c0, tl = t - c0;
    E *xs = x + c0;
    uint32_t w[NV][4];
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int v = k * T * CE_VEC;
        uint4 a = make_uint4(0u, 0u, 0u, 0u);
        if (v < plim) {
            KC_EMU_ALIGNED(xs + v, 16);
            a = *reinterpret_cast<const uint4 *>(xs + v);
        }
        w[k][0] = a.x;
        w[k][1] = a.y;
        w[k][2] = a.z;
        w[k][3] = a.w;
        // The padding (and past the row's end) becomes −inf, which neither
        // the max nor the sum sees; only the last vectors take this branch.
        if (v + CE_VEC > vlim) {
#pragma unroll
            for (int j = 0; j < CE_VEC; j++)
                if (v + j >= vlim) {
                    const int sh = 16 * (j & 1);
                    w[k][j >> 1] = (w[k][j >> 1] & ~(0xffffu << sh)) | ((uint32_t)neg_inf << sh);
                }
        }
    }

    // The max on the packed pairs, before anything is widened: exact (a max
    // rounds nothing) and half the instructions.
    auto mx = ce_pair<E>((uint32_t)neg_inf * 0x10001u);
#pragma unroll
    for (int k = 0; k < NV; k++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            mx = __hmax2(mx, ce_pair<E>(w[k][i]));
    const float m = fmaxf(kc_widen(mx.x), kc_widen(mx.y));
    // A thread with no column (all −inf) sums relative to 0: exp2(−inf) = 0, not NaN.
    const float mt = m == -INFINITY ? 0.0f : m;
    float s0 = 0.0f, s1 = 0.0f; // two chains: half the dependent adds
#pragma unroll
    for (int k = 0; k < NV; k++)
#pragma unroll
        for (int j = 0; j < CE_VEC; j += 2) {
            s0 += exp2f((ce_elem<E>(w[k], j) - mt) * CE_LOG2E);
            s1 += exp2f((ce_elem<E>(w[k], j + 1) - mt) * CE_LOG2E);
        }
    kc_ms ms = {m, s0 + s1};
    ms = kc_warp_ms(ms);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
        warp_ms[warp] = ms;
    __syncthreads();
    if (warp == 0) {
        ms = lane < T / 32 ? warp_ms[lane] : kc_ms{-INFINITY, 0.0f};
        ms = kc_warp_ms(ms);
        if (lane == 0) { // thread 0, which read x[t]
            row_ms = ms;
            row_zero = 0;
            losses[row] = ce_loss(ms.m, logf(ms.s), xt, t, V);
        }
    }
    __syncthreads();
    ms = row_ms;
    // The words xor a 0 the compiler cannot see: it must widen them again
    // below, instead of keeping the floats widened for the sum live across
    // the reduction (twice the registers of the words; it spills).
    const uint32_t zero = row_zero;
#pragma unroll
    for (int k = 0; k < NV; k++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            w[k][i] ^= zero;

    // g = dl·exp(x − m)/s − dl·onehot(t): the one-hot and the padding's
    // exact 0 only in the vectors that hold them.
    const float scale = dl / ms.s;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int v = k * T * CE_VEC;
        if (v >= plim)
            continue;
        float g[CE_VEC];
#pragma unroll
        for (int j = 0; j < CE_VEC; j++)
            g[j] = scale * exp2f((ce_elem<E>(w[k], j) - ms.m) * CE_LOG2E);
        if (v + CE_VEC > vlim || (unsigned)(tl - v) < CE_VEC) {
#pragma unroll
            for (int j = 0; j < CE_VEC; j++) {
                if (v + j == tl)
                    g[j] -= dl;
                if (v + j >= vlim)
                    g[j] = 0.0f;
            }
        }
        KC_EMU_ALIGNED(xs + v, 16);
        *reinterpret_cast<uint4 *>(xs + v) = make_uint4(ce_pack16<E>(g[0], g[1]), ce_pack16<E>(g[2], g[3]),
                                                       ce_pack16<E>(g[4], g[5]), ce_pack16<E>(g[6], g[7]));
    }
}

// The register path's NV for a row of Vp 16-bit columns at `logits`, or 0
// for ce_fused_kernel: every row must start on 16 bytes, and the row must
// fit CE_REG_THREADS·CE_REG_NV_MAX vectors.
static inline int ce_reg_nv(int Vp, const void *logits)
{
    if (Vp <= 0 || Vp % CE_VEC || !kc_aligned(16, (const char *)logits))
        return 0;
    const int nv = (Vp / CE_VEC + CE_REG_THREADS - 1) / CE_REG_THREADS;
    return nv <= CE_REG_NV_MAX ? nv : 0;
}

#ifndef GRADD_CUDA_EMU // the host launchers (tests/emu runs the kernels above itself)
// One block of CE_THREADS per row: launch.template operator()<W>() with
// W = 4 where Vp allows it and the logits (and dlogits) are aligned to it.
template <class F> static void ce_launch(kern_ctx *k, bool vec, const char *what, F &&launch)
{
    kc_enter(k);
    if (vec)
        launch.template operator()<4>();
    else
        launch.template operator()<1>();
    kc_launched(k, what);
}

template <class E>
static void ce_forward(kern_ctx *k, float *losses, float *lse, const E *logits, const int32_t *targets, int N, int V,
                       int Vp)
{
    if (N <= 0 || V <= 0)
        return;
    ce_launch(k, Vp % 4 == 0 && kc_aligned(4 * sizeof(E), logits), "crossentropy_forward", [&]<int W>() {
        ce_forward_kernel<E, W><<<(unsigned)N, CE_THREADS, 0, k->stream>>>(losses, lse, logits, targets, V, Vp);
    });
}

template <class E>
static void ce_backward(kern_ctx *k, E *dlogits, const E *logits, const float *lse, const int32_t *targets,
                        const float *dloss, int N, int V, int Vp)
{
    if (N <= 0 || Vp <= 0)
        return;
    ce_launch(k, Vp % 4 == 0 && kc_aligned(4 * sizeof(E), logits, dlogits), "crossentropy_backward", [&]<int W>() {
        ce_backward_kernel<E, W>
            <<<(unsigned)N, CE_THREADS, 0, k->stream>>>(dlogits, logits, lse, targets, dloss, V, Vp);
    });
}

// ce_fused_reg_kernel<E, CE_REG_THREADS, nv>, the template's NV from the runtime nv.
template <class E, int NV = 1>
static void ce_fused_reg(kern_ctx *k, int nv, float *losses, E *logits, const int32_t *targets, const float *dloss,
                         int N, int V, int Vp)
{
    if constexpr (NV <= CE_REG_NV_MAX) {
        if (nv != NV)
            return ce_fused_reg<E, NV + 1>(k, nv, losses, logits, targets, dloss, N, V, Vp);
        kc_enter(k);
        ce_fused_reg_kernel<E, CE_REG_THREADS, NV>
            <<<(unsigned)N, CE_REG_THREADS, 0, k->stream>>>(losses, logits, targets, dloss, V, Vp);
        kc_launched(k, "crossentropy_fused16");
    }
}

template <class E>
static void ce_fused(kern_ctx *k, float *losses, E *logits, const int32_t *targets, const float *dloss, int N, int V,
                     int Vp)
{
    if (N <= 0 || Vp <= 0)
        return;
    if (int nv = ce_reg_nv(Vp, logits))
        return ce_fused_reg(k, nv, losses, logits, targets, dloss, N, V, Vp);
    ce_launch(k, Vp % 4 == 0 && kc_aligned(4 * sizeof(E), logits), "crossentropy_fused16", [&]<int W>() {
        ce_fused_kernel<E, W><<<(unsigned)N, CE_THREADS, 0, k->stream>>>(losses, logits, targets, dloss, V, Vp);
    });
}

void kc_crossentropy_forward(kern_ctx *k, float *losses, float *lse, const float *logits,
                             const int32_t *targets, int N, int V, int Vp)
{
    ce_forward(k, losses, lse, logits, targets, N, V, Vp);
}

void kc_crossentropy_backward(kern_ctx *k, float *dlogits, const float *logits, const float *lse,
                              const int32_t *targets, const float *dloss, int N, int V, int Vp)
{
    ce_backward(k, dlogits, logits, lse, targets, dloss, N, V, Vp);
}

void kc_crossentropy_forward16(kern_ctx *k, float *losses, float *lse, const uint16_t *logits16,
                               const int32_t *targets, int N, int V, int Vp)
{
    if (k->prec == KERN_BF16)
        ce_forward(k, losses, lse, reinterpret_cast<const __nv_bfloat16 *>(logits16), targets, N, V, Vp);
    else
        ce_forward(k, losses, lse, reinterpret_cast<const __half *>(logits16), targets, N, V, Vp);
}

void kc_crossentropy_backward16(kern_ctx *k, uint16_t *dlogits16, const uint16_t *logits16, const float *lse,
                                const int32_t *targets, const float *dloss, int N, int V, int Vp)
{
    if (k->prec == KERN_BF16)
        ce_backward(k, reinterpret_cast<__nv_bfloat16 *>(dlogits16), reinterpret_cast<const __nv_bfloat16 *>(logits16),
                    lse, targets, dloss, N, V, Vp);
    else
        ce_backward(k, reinterpret_cast<__half *>(dlogits16), reinterpret_cast<const __half *>(logits16), lse,
                    targets, dloss, N, V, Vp);
}

void kc_crossentropy_fused16(kern_ctx *k, float *losses, uint16_t *logits16, const int32_t *targets,
                             const float *dloss, int N, int V, int Vp)
{
    kc_with16(k->prec == KERN_BF16,
              [&]<class E>() { ce_fused(k, losses, reinterpret_cast<E *>(logits16), targets, dloss, N, V, Vp); });
}
#endif
