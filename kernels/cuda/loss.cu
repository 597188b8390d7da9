// loss.cu — fused softmax + cross-entropy, one block per row.
//
// Forward: one pass over the logits for the running max and sum (online
// softmax, float4 loads where aligned), a block-wide merge, then the row's
// log-sum-exp and loss.  Nothing of size V is written: backward recomputes
// the softmax from the logits and lse, which is cheaper than writing and
// re-reading an (N,Vp) probabilities matrix.
// Backward: dlogits = dloss·(exp(x − lse) − onehot) on the first V columns,
// 0 on the padding, in one read and one write; it overwrites, so dlogits may
// be the logits buffer (each element is read and then written by the same
// thread, hence no __restrict__ on those two).
// Fused (training): both in one block per row, the row's second read
// following its first.
//
// The logits may also be 16-bit (the context's type, the *16 entry points):
// the kernels are templated on the element type E, widen on load and, in
// backward, round the result to E on store.
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
template <class E> __device__ __forceinline__ float ce_row_loss(kc_ms ms, float ls, const E *x, int t, int V)
{
    return (t >= 0 && t < V) ? ls + (ms.m - kc_widen(x[t])) : NAN;
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
    ce_row_grad<E, W>(dlogits + row * Vp, logits + row * Vp, lse[row], targets[row], dloss[row], V, Vp);
}

// Forward and backward of a row in one block: the statistics, then the
// gradient over the logits in place, the row read the second time right
// after the first (from L2 on the GPU: a row of 50k 16-bit logits is
// 100 KB, and the SMs' rows in flight a fraction of L2), not after the
// whole (N,Vp) matrix has gone through.  The same arithmetic as the two
// kernels, so the same bits.
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
    ce_row_grad<E, W>(x, x, row_lse, t, dloss[row], V, Vp);
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

template <class E>
static void ce_fused(kern_ctx *k, float *losses, E *logits, const int32_t *targets, const float *dloss, int N, int V,
                     int Vp)
{
    if (N <= 0 || Vp <= 0)
        return;
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
