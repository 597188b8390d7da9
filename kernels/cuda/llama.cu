// llama.cu — the Llama layers' pointwise and row kernels: RMSNorm (forward,
// backward), rotary position embedding (forward, backward, in place) and
// SwiGLU (forward, backward).  The fused grouped-query attention is gqa.cu.
//
// RMSNorm runs one warp per row, as layernorm.cu's general kernels; its
// weight gradient is a deterministic column sum: one partial row per split
// of the rows (the splits reduce.cu would take for this N and C), merged in
// a fixed order by kc_colsum_merge, so the bits depend on N and C only;
// a frozen norm (dweight NULL) skips it, and dinp is the same.
// RoPE runs one thread per (row, frequency): the angle's cos and sin are
// computed once and turn that pair of elements in every head of the row.
//
// The RMSNorm and SwiGLU kernels are templated on their element types:
// fp32, or bf16/fp16 for the 16-bit activation ops (kernels.h).  A 16-bit
// variant does the fp32 arithmetic of the fp32 one on exact widenings and
// rounds only where it stores, so it equals the fp32 op followed by the
// cast, and rstd is bitwise the fp32 op's.
#include "kern_cuda.cuh"

#define LL_THREADS 256
#define LL_ROWS (LL_THREADS / 32) // rows per block, one warp each

// One element of type E at p, widened; and stored, rounded.
template <class E> __device__ __forceinline__ float ll_ld(const E *p) { return kc_ldE<E, 1>(p).v[0]; }
template <class E> __device__ __forceinline__ void ll_st(E *p, float v)
{
    kc_fv<1> r = {{v}};
    kc_stE<E, 1>(p, r);
}

// ---- RMSNorm ------------------------------------------------------------------------
// inp (N,C), weight (C) -> out (N,C) = inp·rstd·weight, rstd (N) =
// 1/sqrt(mean(inp²) + eps).  O: out's element type.
template <class O>
__global__ static void rms_forward_kernel(O *__restrict__ out, float *__restrict__ rstd,
                                          const float *__restrict__ inp, const float *__restrict__ weight, int N,
                                          int C, float eps)
{
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * LL_ROWS + (threadIdx.x >> 5);
    if (row >= N) // a whole warp: no collective below misses a lane
        return;
    const float *x = inp + (size_t)row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32)
        s += x[c] * x[c];
    s = kc_warp_sum(s);
    const float r = 1.0f / sqrtf(s / C + eps);
    O *y = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32)
        ll_st(y + c, x[c] * r * weight[c]);
    if (lane == 0)
        rstd[row] = r;
}

// dinp (N,C) += r·w·g − x·r³/C·Σ g·w·x, per row (g = dout, r = rstd);
// dinp16 (may be NULL): the updated dinp rounded to E.  DO: dout's type.
template <class E, class DO>
__global__ static void rms_backward_kernel(float *__restrict__ dinp, E *__restrict__ dinp16,
                                           const DO *__restrict__ dout, const float *__restrict__ inp,
                                           const float *__restrict__ weight, const float *__restrict__ rstd, int N,
                                           int C)
{
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * LL_ROWS + (threadIdx.x >> 5);
    if (row >= N)
        return;
    const size_t off = (size_t)row * C;
    const float *x = inp + off;
    const DO *g = dout + off;
    float dot = 0.0f;
    for (int c = lane; c < C; c += 32)
        dot += ll_ld(g + c) * weight[c] * x[c];
    dot = kc_warp_sum(dot);
    const float r = rstd[row], k = dot * r * r * r / C;
    float *dx = dinp + off;
    for (int c = lane; c < C; c += 32) {
        const float d = dx[c] + (r * weight[c] * ll_ld(g + c) - x[c] * k);
        dx[c] = d;
        if (dinp16)
            ll_st(dinp16 + off + c, d);
    }
}

// part[s·C + c] = Σ dout·inp·rstd over the rows of split s (rows_per_split
// each), for the 32 columns of block x: 8 row strides meet in shared
// memory in a fixed order.
template <class DO>
__global__ static void rms_dweight_kernel(float *__restrict__ part, const DO *__restrict__ dout,
                                          const float *__restrict__ inp, const float *__restrict__ rstd, int N, int C,
                                          int rows_per_split)
{
    __shared__ float acc[8][33];
    const int c = blockIdx.x * 32 + threadIdx.x, s = blockIdx.y;
    const int r0 = s * rows_per_split, r1 = min(N, r0 + rows_per_split);
    float a = 0.0f;
    if (c < C)
        for (int r = r0 + (int)threadIdx.y; r < r1; r += 8) {
            const size_t i = (size_t)r * C + c;
            a += ll_ld(dout + i) * inp[i] * rstd[r];
        }
    acc[threadIdx.y][threadIdx.x] = a;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t = 0.0f;
#pragma unroll
        for (int y = 0; y < 8; y++)
            t += acc[y][threadIdx.x];
        part[(size_t)s * C + c] = t;
    }
}

// The splits of the rows for the weight gradient: those of kc_colsum (a
// function of N and C only), so that the bits do not depend on the GPU.
static inline int rms_splits(const kern_ctx *k, int N, int C)
{
    return (int)(kc_colsum_scratch(k, N, C, false) / (size_t)C);
}

// ---- rotary position embedding ----------------------------------------------------------
// x (N rows of `stride`), in place: heads 0..NHR-1 of HS from the row's
// start; element i < HS/2 pairs with i + HS/2 and the pair turns by
// dir·pos·inv_freq[i] (dir −1: backward, the transposed rotation).
__global__ static void rope_kernel(float *__restrict__ x, const float *__restrict__ inv_freq,
                                   const int32_t *__restrict__ pos, int N, int T, int NHR, int HS, int stride,
                                   float dir)
{
    const int half = HS / 2;
    const size_t total = (size_t)N * half;
    for (size_t w = blockIdx.x * (size_t)blockDim.x + threadIdx.x; w < total; w += (size_t)gridDim.x * blockDim.x) {
        const size_t r = w / half;
        const int i = (int)(w % half);
        const float p = (float)(pos ? pos[r] : (int32_t)(r % (size_t)T));
        const float a = p * inv_freq[i];
        const float c = cosf(a), s = dir * sinf(a);
        float *e = x + r * (size_t)stride + i;
        for (int h = 0; h < NHR; h++, e += HS) {
            const float x1 = e[0], x2 = e[half];
            e[0] = x1 * c - x2 * s;
            e[half] = x2 * c + x1 * s;
        }
    }
}

// ---- SwiGLU ---------------------------------------------------------------------------------
// gu (N,2F) = [gate | up] per row -> out (N,F) = silu(gate)·up; E: both
// tensors' element type.
template <class E>
__global__ static void swiglu_forward_kernel(E *__restrict__ out, const E *__restrict__ gu, int N, int F)
{
    const size_t total = (size_t)N * F;
    for (size_t w = blockIdx.x * (size_t)blockDim.x + threadIdx.x; w < total; w += (size_t)gridDim.x * blockDim.x) {
        const size_t n = w / F, i = w % F;
        const float g = ll_ld(gu + n * 2 * F + i), u = ll_ld(gu + n * 2 * F + F + i);
        ll_st(out + w, g / (1.0f + expf(-g)) * u);
    }
}

// dgu (N,2F) overwritten: d gate = dout·up·σ(g)·(1 + g·(1 − σ(g))),
// d up = dout·silu(g).
template <class E>
__global__ static void swiglu_backward_kernel(E *__restrict__ dgu, const E *__restrict__ gu,
                                              const E *__restrict__ dout, int N, int F)
{
    const size_t total = (size_t)N * F;
    for (size_t w = blockIdx.x * (size_t)blockDim.x + threadIdx.x; w < total; w += (size_t)gridDim.x * blockDim.x) {
        const size_t n = w / F, i = w % F;
        const float g = ll_ld(gu + n * 2 * F + i), u = ll_ld(gu + n * 2 * F + F + i), d = ll_ld(dout + w);
        const float s = 1.0f / (1.0f + expf(-g));
        ll_st(dgu + n * 2 * F + F + i, d * g * s);
        ll_st(dgu + n * 2 * F + i, d * u * s * (1.0f + g * (1.0f - s)));
    }
}

#ifndef GRADD_CUDA_EMU // the host launchers (tests/emu runs the kernels above itself)
template <class O>
static void rms_forward_launch(kern_ctx *k, O *out, float *rstd, const float *inp, const float *weight, int N, int C,
                               float eps, const char *what)
{
    if (N <= 0 || C <= 0)
        return;
    kc_enter(k);
    rms_forward_kernel<O><<<(unsigned)((N + LL_ROWS - 1) / LL_ROWS), LL_THREADS, 0, k->stream>>>(out, rstd, inp,
                                                                                               weight, N, C, eps);
    kc_launched(k, what);
}

void kc_rmsnorm_forward(kern_ctx *k, float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                        float eps)
{
    rms_forward_launch(k, out, rstd, inp, weight, N, C, eps, "rmsnorm_forward");
}

void kc_rmsnorm_forward16(kern_ctx *k, uint16_t *out16, float *rstd, const float *inp, const float *weight, int N,
                          int C, float eps)
{
    // bf16 unless fp16, as the CPU's 16-bit ops (an fp32 context never calls them).
    kc_with16(k->prec != KERN_FP16, [&]<class E>() {
        rms_forward_launch(k, reinterpret_cast<E *>(out16), rstd, inp, weight, N, C, eps, "rmsnorm_forward16");
    });
}

template <class E, class DO>
static void rms_backward_launch(kern_ctx *k, float *dinp, E *dinp16, float *dweight, const DO *dout,
                                const float *inp, const float *weight, const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    kc_enter(k);
    const int S = rms_splits(k, N, C), rows = (N + S - 1) / S;
    // dweight NULL (a frozen norm): dinp alone, from the same kernel.
    float *part = dweight ? (float *)kc_scratch(k, (size_t)S * C * sizeof(float)) : NULL;
    if (dweight && !part)
        return;
    rms_backward_kernel<E, DO><<<(unsigned)((N + LL_ROWS - 1) / LL_ROWS), LL_THREADS, 0, k->stream>>>(
        dinp, dinp16, dout, inp, weight, rstd, N, C);
    kc_launched(k, "rmsnorm_backward");
    if (!dweight)
        return;
    rms_dweight_kernel<DO><<<dim3((unsigned)((C + 31) / 32), (unsigned)S), dim3(32, 8), 0, k->stream>>>(
        part, dout, inp, rstd, N, C, rows);
    kc_launched(k, "rmsnorm_backward(dweight)");
    kc_colsum_merge(k, dweight, NULL, part, NULL, S, C);
}

void kc_rmsnorm_backward(kern_ctx *k, float *dinp, float *dweight, const float *dout, const float *inp,
                         const float *weight, const float *rstd, int N, int C)
{
    rms_backward_launch(k, dinp, (float *)NULL, dweight, dout, inp, weight, rstd, N, C);
}

void kc_rmsnorm_backward16(kern_ctx *k, float *dinp, uint16_t *dinp16, float *dweight, const float *dout,
                           const uint16_t *dout16, const float *inp, const float *weight, const float *rstd, int N,
                           int C)
{
    if ((!dout) == (!dout16)) {
        kc_ok(k, cudaErrorInvalidValue, "rmsnorm_backward16: exactly one of dout and dout16");
        return;
    }
    kc_with16(k->prec != KERN_FP16, [&]<class E>() {
        E *d16 = reinterpret_cast<E *>(dinp16);
        if (dout16)
            rms_backward_launch(k, dinp, d16, dweight, reinterpret_cast<const E *>(dout16), inp, weight, rstd, N, C);
        else
            rms_backward_launch(k, dinp, d16, dweight, dout, inp, weight, rstd, N, C);
    });
}

static void rope_run(kern_ctx *k, float *x, const float *inv_freq, const int32_t *pos, int N, int T, int NHR, int HS,
                     int stride, float dir, const char *what)
{
    if (N <= 0 || NHR <= 0 || HS < 2)
        return;
    kc_enter(k);
    const size_t work = (size_t)N * (HS / 2);
    rope_kernel<<<kc_grid(k, work, 256), 256, 0, k->stream>>>(x, inv_freq, pos, N, T, NHR, HS, stride, dir);
    kc_launched(k, what);
}

void kc_rope_forward(kern_ctx *k, float *x, const float *inv_freq, const int32_t *pos, int N, int T, int NHR, int HS,
                     int stride)
{
    rope_run(k, x, inv_freq, pos, N, T, NHR, HS, stride, 1.0f, "rope_forward");
}

void kc_rope_backward(kern_ctx *k, float *dx, const float *inv_freq, const int32_t *pos, int N, int T, int NHR,
                      int HS, int stride)
{
    rope_run(k, dx, inv_freq, pos, N, T, NHR, HS, stride, -1.0f, "rope_backward");
}

template <class E> static void swiglu_launch(kern_ctx *k, E *out, const E *gu, int N, int F, const char *what)
{
    if (N <= 0 || F <= 0)
        return;
    kc_enter(k);
    swiglu_forward_kernel<E><<<kc_grid(k, (size_t)N * F, 256), 256, 0, k->stream>>>(out, gu, N, F);
    kc_launched(k, what);
}

template <class E>
static void swiglu_backward_launch(kern_ctx *k, E *dgu, const E *gu, const E *dout, int N, int F, const char *what)
{
    if (N <= 0 || F <= 0)
        return;
    kc_enter(k);
    swiglu_backward_kernel<E><<<kc_grid(k, (size_t)N * F, 256), 256, 0, k->stream>>>(dgu, gu, dout, N, F);
    kc_launched(k, what);
}

void kc_swiglu_forward(kern_ctx *k, float *out, const float *gu, int N, int F)
{
    swiglu_launch(k, out, gu, N, F, "swiglu_forward");
}

void kc_swiglu_backward(kern_ctx *k, float *dgu, const float *gu, const float *dout, int N, int F)
{
    swiglu_backward_launch(k, dgu, gu, dout, N, F, "swiglu_backward");
}

void kc_swiglu_forward16(kern_ctx *k, uint16_t *out16, const uint16_t *gu16, int N, int F)
{
    kc_with16(k->prec != KERN_FP16, [&]<class E>() {
        swiglu_launch(k, reinterpret_cast<E *>(out16), reinterpret_cast<const E *>(gu16), N, F, "swiglu_forward16");
    });
}

void kc_swiglu_backward16(kern_ctx *k, uint16_t *dgu16, const uint16_t *gu16, const uint16_t *dout16, int N, int F)
{
    kc_with16(k->prec != KERN_FP16, [&]<class E>() {
        swiglu_backward_launch(k, reinterpret_cast<E *>(dgu16), reinterpret_cast<const E *>(gu16),
                               reinterpret_cast<const E *>(dout16), N, F, "swiglu_backward16");
    });
}
#endif
