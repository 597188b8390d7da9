// pointwise.cu — elementwise ops: GELU, ReLU, residual, accumulate, scale,
// casts and the non-finite count.  Every op runs four elements per thread
// (float4; an 8-byte store for 16-bit outputs) where the pointers allow it,
// through kc_ew.
#include "kern_cuda.cuh"

// ---- GELU (tanh approximation), as the CPU reference -------------------------------------

#define KC_GELU_K 0.7978845608028654f // sqrt(2/pi)

__device__ __forceinline__ float kc_gelu(float x)
{
    float cube = 0.044715f * x * x * x;
    return 0.5f * x * (1.0f + tanhf(KC_GELU_K * (x + cube)));
}

__device__ __forceinline__ float kc_gelu_grad(float x)
{
    float cube = 0.044715f * x * x * x;
    float th = tanhf(KC_GELU_K * (x + cube));
    float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + x * 0.5f * sech2 * KC_GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
}

namespace {

// E: the element type of inputs and output.  float for gelu_forward/
// backward; bf16 or fp16 for the *16 ops: the inputs widened exactly, the
// same fp32 arithmetic, then the cast's rounding at the store.  Each
// element is read before it is written, by the same thread: in place works.
template <class E> struct gelu_fwd_f {
    E *out;
    const E *inp;
    template <int W> __device__ void run(size_t i) const
    {
        kc_fv<W> x = kc_ldE<E, W>(inp + i);
#pragma unroll
        for (int j = 0; j < W; j++)
            x.v[j] = kc_gelu(x.v[j]);
        kc_stE<E, W>(out + i, x);
    }
};

template <class E> struct gelu_bwd_f {
    E *dinp;
    const E *inp, *dout;
    template <int W> __device__ void run(size_t i) const
    {
        kc_fv<W> x = kc_ldE<E, W>(inp + i), d = kc_ldE<E, W>(dout + i);
#pragma unroll
        for (int j = 0; j < W; j++)
            d.v[j] *= kc_gelu_grad(x.v[j]);
        kc_stE<E, W>(dinp + i, d);
    }
};

struct relu_fwd_f {
    float *out;
    const float *inp;
    template <int W> __device__ void run(size_t i) const
    {
        kc_fv<W> x = kc_ld<W>(inp + i);
#pragma unroll
        for (int j = 0; j < W; j++)
            x.v[j] = x.v[j] > 0.0f ? x.v[j] : 0.0f;
        kc_st<W>(out + i, x);
    }
};

struct relu_bwd_f {
    float *dinp;
    const float *inp, *dout;
    template <int W> __device__ void run(size_t i) const
    {
        kc_fv<W> x = kc_ld<W>(inp + i), d = kc_ld<W>(dout + i);
#pragma unroll
        for (int j = 0; j < W; j++)
            d.v[j] = x.v[j] > 0.0f ? d.v[j] : 0.0f;
        kc_st<W>(dinp + i, d);
    }
};

struct add_f { // out = a + b (out may be a: accumulate)
    float *out;
    const float *a, *b;
    template <int W> __device__ void run(size_t i) const
    {
        kc_fv<W> x = kc_ld<W>(a + i), y = kc_ld<W>(b + i);
#pragma unroll
        for (int j = 0; j < W; j++)
            x.v[j] += y.v[j];
        kc_st<W>(out + i, x);
    }
};

struct scale_f {
    float *p;
    float s;
    template <int W> __device__ void run(size_t i) const
    {
        kc_fv<W> x = kc_ld<W>(p + i);
#pragma unroll
        for (int j = 0; j < W; j++)
            x.v[j] *= s;
        kc_st<W>(p + i, x);
    }
};

struct dropout_f { // out = inp·keep where the mask keeps it, else 0 (out may be inp)
    float *out;
    const float *inp;
    uint64_t seed, offset;
    uint32_t below;
    float keep;
    template <int W> __device__ void run(size_t i) const
    {
        kc_fv<W> x = kc_ld<W>(inp + i);
#pragma unroll
        for (int j = 0; j < W; j++)
            x.v[j] = kern_dropout_keep(seed, offset + i + j, below) ? x.v[j] * keep : 0.0f;
        kc_st<W>(out + i, x);
    }
};

// The 16-bit type a BF16 flag names.
template <bool BF16> using kc_e16 = std::conditional_t<BF16, __nv_bfloat16, __half>;

template <bool BF16> struct to16_f {
    uint16_t *dst;
    const float *src;
    template <int W> __device__ void run(size_t i) const
    {
        kc_stE<kc_e16<BF16>, W>(reinterpret_cast<kc_e16<BF16> *>(dst + i), kc_ld<W>(src + i));
    }
};

template <bool BF16> struct from16_f {
    float *dst;
    const uint16_t *src;
    template <int W> __device__ void run(size_t i) const
    {
        kc_st<W>(dst + i, kc_ldE<kc_e16<BF16>, W>(reinterpret_cast<const kc_e16<BF16> *>(src + i)));
    }
};

} // namespace

// Rows of a slice: one thread per element, grid-stride; the row and column
// from one division (a slice is a few thousand columns, the GEMMs around it
// cost far more than this pass).
__global__ static void copy2d_kernel(float *dst, int ldd, const float *src, int lds, size_t n, int cols, bool acc)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / (size_t)cols, c = i - r * (size_t)cols;
        float v = src[r * (size_t)lds + c];
        float *d = dst + r * (size_t)ldd + c;
        *d = acc ? *d + v : v;
    }
}

#ifndef GRADD_CUDA_EMU // the host launchers (tests/emu runs the functors above itself)
void kc_gelu_forward(kern_ctx *k, float *out, const float *inp, size_t N)
{
    kc_enter(k);
    kc_ew(k, N, kc_aligned(16, out, inp), gelu_fwd_f<float>{out, inp}, "gelu_forward");
}

void kc_gelu_backward(kern_ctx *k, float *dinp, const float *inp, const float *dout, size_t N)
{
    kc_enter(k);
    kc_ew(k, N, kc_aligned(16, dinp, inp, dout), gelu_bwd_f<float>{dinp, inp, dout}, "gelu_backward");
}

// The 16-bit type is fp16 in an fp16 context, bf16 otherwise (as the CPU
// backend; an fp32 context never calls these).  Four at a time needs every
// pointer 8-byte aligned.
template <class E> static const E *kc_as(const uint16_t *p) { return reinterpret_cast<const E *>(p); }
template <class E> static E *kc_as(uint16_t *p) { return reinterpret_cast<E *>(p); }

void kc_gelu_forward16(kern_ctx *k, uint16_t *out16, const uint16_t *inp16, size_t N)
{
    kc_enter(k);
    bool vec = kc_aligned(8, out16, inp16);
    if (k->prec == KERN_FP16)
        kc_ew(k, N, vec, gelu_fwd_f<__half>{kc_as<__half>(out16), kc_as<__half>(inp16)}, "gelu_forward16");
    else
        kc_ew(k, N, vec, gelu_fwd_f<__nv_bfloat16>{kc_as<__nv_bfloat16>(out16), kc_as<__nv_bfloat16>(inp16)},
              "gelu_forward16");
}

void kc_gelu_backward16(kern_ctx *k, uint16_t *dinp16, const uint16_t *inp16, const uint16_t *dout16, size_t N)
{
    kc_enter(k);
    bool vec = kc_aligned(8, dinp16, inp16, dout16);
    if (k->prec == KERN_FP16)
        kc_ew(k, N, vec,
              gelu_bwd_f<__half>{kc_as<__half>(dinp16), kc_as<__half>(inp16), kc_as<__half>(dout16)},
              "gelu_backward16");
    else
        kc_ew(k, N, vec,
              gelu_bwd_f<__nv_bfloat16>{kc_as<__nv_bfloat16>(dinp16), kc_as<__nv_bfloat16>(inp16),
                                        kc_as<__nv_bfloat16>(dout16)},
              "gelu_backward16");
}

void kc_relu_forward(kern_ctx *k, float *out, const float *inp, size_t N)
{
    kc_enter(k);
    kc_ew(k, N, kc_aligned(16, out, inp), relu_fwd_f{out, inp}, "relu_forward");
}

void kc_relu_backward(kern_ctx *k, float *dinp, const float *inp, const float *dout, size_t N)
{
    kc_enter(k);
    kc_ew(k, N, kc_aligned(16, dinp, inp, dout), relu_bwd_f{dinp, inp, dout}, "relu_backward");
}

void kc_residual_forward(kern_ctx *k, float *out, const float *a, const float *b, size_t N)
{
    kc_enter(k);
    kc_ew(k, N, kc_aligned(16, out, a, b), add_f{out, a, b}, "residual_forward");
}

void kc_accumulate(kern_ctx *k, float *dst, const float *src, size_t N)
{
    kc_enter(k);
    kc_ew(k, N, kc_aligned(16, dst, src), add_f{dst, dst, src}, "accumulate");
}

void kc_copy2d(kern_ctx *k, float *dst, int ldd, const float *src, int lds, int N, int cols, bool accumulate)
{
    if (N <= 0 || cols <= 0)
        return;
    kc_enter(k);
    size_t n = (size_t)N * (size_t)cols;
    copy2d_kernel<<<kc_grid(k, n, 256), 256, 0, k->stream>>>(dst, ldd, src, lds, n, cols, accumulate);
    kc_launched(k, "copy2d");
}

void kc_scale(kern_ctx *k, float *p, size_t n, float s)
{
    kc_enter(k);
    kc_ew(k, n, kc_aligned(16, p), scale_f{p, s}, "scale");
}

void kc_dropout(kern_ctx *k, float *out, const float *inp, size_t n, float p, uint64_t seed, uint64_t offset)
{
    kc_enter(k);
    uint32_t below;
    float keep;
    kern_dropout_rate(p, &below, &keep);
    kc_ew(k, n, kc_aligned(16, out, inp), dropout_f{out, inp, seed, offset, below, keep}, "dropout");
}

void kc_cast_lowp(kern_ctx *k, uint16_t *dst, const float *src, size_t n, bool bf16)
{
    bool vec = kc_aligned(16, src) && kc_aligned(8, dst);
    if (bf16)
        kc_ew(k, n, vec, to16_f<true>{dst, src}, "cast_f32_to_bf16");
    else
        kc_ew(k, n, vec, to16_f<false>{dst, src}, "cast_f32_to_f16");
}

void kc_cast_f32_to_bf16(kern_ctx *k, uint16_t *dst, const float *src, size_t n)
{
    kc_enter(k);
    kc_cast_lowp(k, dst, src, n, true);
}

void kc_cast_f32_to_f16(kern_ctx *k, uint16_t *dst, const float *src, size_t n)
{
    kc_enter(k);
    kc_cast_lowp(k, dst, src, n, false);
}

void kc_cast_bf16_to_f32(kern_ctx *k, float *dst, const uint16_t *src, size_t n)
{
    kc_enter(k);
    kc_ew(k, n, kc_aligned(16, dst) && kc_aligned(8, src), from16_f<true>{dst, src}, "cast_bf16_to_f32");
}

void kc_cast_f16_to_f32(kern_ctx *k, float *dst, const uint16_t *src, size_t n)
{
    kc_enter(k);
    kc_ew(k, n, kc_aligned(16, dst) && kc_aligned(8, src), from16_f<false>{dst, src}, "cast_f16_to_f32");
}

void kc_widen_lowp(kern_ctx *k, float *dst, const uint16_t *src, size_t n)
{
    if (k->prec == KERN_FP16) // as lowp.c and the producers: bf16 unless fp16
        kc_cast_f16_to_f32(k, dst, src, n);
    else
        kc_cast_bf16_to_f32(k, dst, src, n);
}
#endif

// ---- count_nonfinite ------------------------------------------------------------------

template <int W>
__global__ static void nonfinite_kernel(const float *p, size_t n, unsigned long long *count)
{
    unsigned long long c = 0;
    size_t nw = n / W;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nw; i += (size_t)gridDim.x * blockDim.x) {
        kc_fv<W> x = kc_ld<W>(p + i * W);
#pragma unroll
        for (int j = 0; j < W; j++)
            c += !isfinite(x.v[j]);
    }
    if (blockIdx.x == 0 && threadIdx.x < n - nw * W)
        c += !isfinite(p[nw * W + threadIdx.x]);
    for (int o = 16; o > 0; o >>= 1)
        c += __shfl_xor_sync(0xffffffffu, c, o);
    if ((threadIdx.x & 31) == 0 && c)
        atomicAdd(count, c); // integer: exact in any order
}

#ifndef GRADD_CUDA_EMU
size_t kc_count_nonfinite(kern_ctx *k, const float *p, size_t n)
{
    if (n == 0)
        return 0;
    kc_enter(k);
    unsigned long long *dc = &k->d_small->count;
    kc_ok(k, cudaMemsetAsync(dc, 0, sizeof *dc, k->stream), "count_nonfinite");
    if (kc_aligned(16, p))
        nonfinite_kernel<4><<<kc_grid(k, n / 4 + 1, 256), 256, 0, k->stream>>>(p, n, dc);
    else
        nonfinite_kernel<1><<<kc_grid(k, n, 256), 256, 0, k->stream>>>(p, n, dc);
    kc_launched(k, "count_nonfinite");
    kc_ok(k, cudaMemcpyAsync(&k->h_small->count, dc, sizeof *dc, cudaMemcpyDeviceToHost, k->stream),
          "count_nonfinite(copy)");
    if (!kc_ok(k, cudaStreamSynchronize(k->stream), "count_nonfinite(sync)"))
        return n; // unknown: say everything is bad rather than nothing
    return (size_t)k->h_small->count;
}
#endif
