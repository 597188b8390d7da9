// loss.cu — fused softmax + cross-entropy, one block per row.
//
// Forward: one pass for the running max and sum (online softmax, float4
// loads where aligned), a block-wide merge, a second pass that writes probs
// (padded columns V..Vp get 0) and the loss -log p[target] = log s + m - x.
// Backward: dlogits += dloss·(probs − onehot) on the first V columns.
#include "kern_cuda.cuh"

#define CE_THREADS 256

template <int W>
__global__ static void ce_forward_kernel(float *__restrict__ losses, float *__restrict__ probs,
                                         const float *__restrict__ logits, const int32_t *__restrict__ targets,
                                         int V, int Vp)
{
    __shared__ kc_ms warp_ms[CE_THREADS / 32];
    __shared__ kc_ms row_ms;
    size_t row = blockIdx.x;
    const float *x = logits + row * Vp;
    float *p = probs + row * Vp;
    int vw = V / W * W;
    kc_ms ms = {-INFINITY, 0.0f};
    for (int v = threadIdx.x * W; v < vw; v += CE_THREADS * W) {
        kc_fv<W> a = kc_ld<W>(x + v);
#pragma unroll
        for (int j = 0; j < W; j++)
            ms = kc_ms_add(ms, a.v[j]);
    }
    for (int v = vw + threadIdx.x; v < V; v += CE_THREADS)
        ms = kc_ms_add(ms, x[v]);
    ms = kc_warp_ms(ms);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
        warp_ms[warp] = ms;
    __syncthreads();
    if (warp == 0) {
        ms = lane < CE_THREADS / 32 ? warp_ms[lane] : kc_ms{-INFINITY, 0.0f};
        ms = kc_warp_ms(ms);
        if (lane == 0)
            row_ms = ms;
    }
    __syncthreads();
    ms = row_ms;
    float inv = 1.0f / ms.s;
    for (int v = threadIdx.x * W; v < vw; v += CE_THREADS * W) {
        kc_fv<W> a = kc_ld<W>(x + v);
#pragma unroll
        for (int j = 0; j < W; j++)
            a.v[j] = expf(a.v[j] - ms.m) * inv;
        kc_st<W>(p + v, a);
    }
    for (int v = vw + threadIdx.x; v < Vp; v += CE_THREADS)
        p[v] = v < V ? expf(x[v] - ms.m) * inv : 0.0f;
    if (threadIdx.x == 0) {
        int t = targets[row];
        losses[row] = (t >= 0 && t < V) ? logf(ms.s) + ms.m - x[t] : NAN;
    }
}

template <int W>
__global__ static void ce_backward_kernel(float *__restrict__ dlogits, const float *__restrict__ probs,
                                          const int32_t *__restrict__ targets, const float *__restrict__ dloss, int V,
                                          int Vp)
{
    size_t row = blockIdx.x;
    const float *p = probs + row * Vp;
    float *g = dlogits + row * Vp;
    float dl = dloss[row];
    int t = targets[row];
    int vw = V / W * W;
    for (int v = threadIdx.x * W; v < vw; v += CE_THREADS * W) {
        kc_fv<W> a = kc_ld<W>(p + v), d = kc_ld<W>(g + v);
#pragma unroll
        for (int j = 0; j < W; j++)
            d.v[j] += dl * (a.v[j] - (v + j == t ? 1.0f : 0.0f));
        kc_st<W>(g + v, d);
    }
    for (int v = vw + threadIdx.x; v < V; v += CE_THREADS)
        g[v] += dl * (p[v] - (v == t ? 1.0f : 0.0f));
}

void kc_crossentropy_forward(kern_ctx *k, float *losses, float *probs, const float *logits,
                             const int32_t *targets, int N, int V, int Vp)
{
    if (N <= 0 || V <= 0)
        return;
    kc_enter(k);
    if (Vp % 4 == 0 && kc_aligned(16, probs, logits))
        ce_forward_kernel<4><<<(unsigned)N, CE_THREADS, 0, k->stream>>>(losses, probs, logits, targets, V, Vp);
    else
        ce_forward_kernel<1><<<(unsigned)N, CE_THREADS, 0, k->stream>>>(losses, probs, logits, targets, V, Vp);
    kc_launched(k, "crossentropy_forward");
}

void kc_crossentropy_backward(kern_ctx *k, float *dlogits, const float *probs, const int32_t *targets,
                              const float *dloss, int N, int V, int Vp)
{
    if (N <= 0 || V <= 0)
        return;
    kc_enter(k);
    if (Vp % 4 == 0 && kc_aligned(16, probs, dlogits))
        ce_backward_kernel<4><<<(unsigned)N, CE_THREADS, 0, k->stream>>>(dlogits, probs, targets, dloss, V, Vp);
    else
        ce_backward_kernel<1><<<(unsigned)N, CE_THREADS, 0, k->stream>>>(dlogits, probs, targets, dloss, V, Vp);
    kc_launched(k, "crossentropy_backward");
}
