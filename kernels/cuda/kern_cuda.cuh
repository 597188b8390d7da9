// kern_cuda.cuh — internals shared by the CUDA kernels (kernels/cuda/*.cu).
//
// Nothing here is visible outside the gradd-cuda module: the .cu files are
// compiled with -fvisibility=hidden and the only exported symbol is the ops
// table, gradd_kern_cuda_ops (ctx.cu).
//
// Error handling: kern_ops functions return void, so every CUDA/cuBLASLt
// failure is recorded in the context (the first one wins, with a message on
// stderr) and reported by sync(), which then clears it so that the caller can
// recover from an out-of-memory on scratch and carry on.
#ifndef GRADD_KERN_CUDA_CUH
#define GRADD_KERN_CUDA_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <type_traits>

#include "kernels.h"

#ifdef GRADD_CUDA_EMU
// tests/emu: the device code of the including .cu file compiled by a host
// compiler and run on the CPU (cuda_emu.h); its <<<>>> launchers are left out.
#include "cuda_emu.h"
// A 4-wide access must be aligned to its size on the GPU (it faults
// otherwise); on the host it would just work, so the emulation checks.
#define KC_EMU_ALIGNED(p, n)                                                                                        \
    do {                                                                                                             \
        if ((uintptr_t)(p) % (n))                                                                                    \
            emu::fail("misaligned vector access");                                                                   \
    } while (0)
#else
#define KC_EMU_ALIGNED(p, n) ((void)0)
#endif

struct kc_plan; // a cached cuBLASLt plan (gemm.cu)
struct kc_dnn;  // cuDNN's attention and its plans (gqa_cudnn.cu)

// Pinned staging slots for copy_h2d: the caller may reuse its buffer as soon
// as copy_h2d returns, yet the copy stays asynchronous.
#define KC_STAGING_SLOTS 4
#define KC_STAGING_MAX ((size_t)16 << 20) // bigger copies go direct + sync

struct kc_staging {
    void *host;
    size_t cap;
    cudaEvent_t done;
    bool busy;
};

// Fixed-size device scratch owned by the context: sumsq partials and the
// small results the host reads back.
#define KC_SUMSQ_BLOCKS 1024
struct kc_small {
    double partial[KC_SUMSQ_BLOCKS];
    double sumsq;
    unsigned long long count;
};

// One block's work in adamw_multi (optim.cu): n elements from off, of one
// tensor; flags: KC_CHUNK_DECAY, KC_CHUNK_VEC (four at a time).
struct kc_adamw_chunk {
    unsigned long long off;
    unsigned n, flags;
};
enum { KC_CHUNK_DECAY = 1, KC_CHUNK_VEC = 2 };

struct kern_ctx {
    int device;
    int sm_count;
    kern_precision prec;
    // Fused attention runs the register-resident kernels of flash_mma.cu,
    // or flash.cu's WMMA ones when GRADD_FLASH=wmma at creation.
    bool flash_mma;
    // Llama's attention in a 16-bit context on the tensor cores
    // (gqa_mma.cu) when GRADD_GQA=mma at creation, on cuDNN's fused
    // attention (gqa_cudnn.cu) when GRADD_GQA=cudnn, else gqa.cu's fp32
    // kernels: the default, which bench_gqa_cuda's timings are to choose.
    bool gqa_mma, gqa_cudnn;
    kc_dnn *dnn; // made at cuDNN's first use
    cudaStream_t stream;
    cublasLtHandle_t lt;

    kern_scratch scratch; // acquire == NULL: cudaMalloc/cudaFree
    // cuBLASLt workspace, held for the context's lifetime.
    void *workspace;
    size_t workspace_bytes;
    // Per-op scratch (GEMM input casts, reduction partials, sort buffers):
    // grown on demand, given back to the pool at sync().
    void *buf;
    size_t buf_bytes;

    kc_small *d_small;  // device
    kc_small *h_small;  // pinned host mirror

    kc_staging staging[KC_STAGING_SLOTS];
    int staging_next;

    // adamw_multi's chunk table on the device, and the segments and vector
    // choice it was made from (host copies): made again only when they
    // change, which for a training run is once.
    kc_adamw_chunk *adamw_chunks;
    size_t adamw_nchunks;
    kern_segment *adamw_segs;
    int adamw_nsegs;
    bool adamw_vec;

    kc_plan *plans; // GEMM plan cache (gemm.cu)
    int nplans, plan_next;

    int err; // first error since the last sync(): a cudaError_t value, or 1000 + cublasStatus_t
    char errmsg[200];
    char lasterr[200]; // what the last failed sync() reported (kern_ops.error)
};

// ---- errors and helpers (ctx.cu) ----------------------------------------------

// Record a failure (the first one since the last sync wins): code, a
// cudaError_t value or 1000 + cublasStatus_t, and "what: detail".
void kc_fail(kern_ctx *k, int code, const char *what, const char *detail);
// Record e (if it is an error and the first one); returns true when e is fine.
bool kc_ok(kern_ctx *k, cudaError_t e, const char *what);
bool kc_blas_ok(kern_ctx *k, cublasStatus_t s, const char *what);
// After a kernel launch.
static inline void kc_launched(kern_ctx *k, const char *what) { kc_ok(k, cudaGetLastError(), what); }
// Make k's device current for this thread.
void kc_enter(kern_ctx *k);
// Scratch of at least `bytes` (256-byte aligned), valid until the next call
// of kc_scratch on this context or sync(); NULL (error recorded) on OOM.
// Every op asks at most once, for all it needs.
void *kc_scratch(kern_ctx *k, size_t bytes);
// Allocation and release of device memory through the caller's scratch
// callback (or cudaMalloc).
void *kc_dev_alloc(kern_ctx *k, size_t bytes);
void kc_dev_free(kern_ctx *k, void *p);

static inline size_t kc_round(size_t x, size_t to) { return (x + to - 1) / to * to; }

// Grid for a grid-stride loop over `work` items with `threads` per block.
static inline unsigned kc_grid(const kern_ctx *k, size_t work, unsigned threads)
{
    size_t blocks = (work + threads - 1) / threads;
    size_t cap = (size_t)(k->sm_count > 0 ? k->sm_count : 16) * 32;
    if (blocks > cap)
        blocks = cap;
    return blocks ? (unsigned)blocks : 1u;
}

template <class... P> static inline bool kc_aligned(size_t to, const P *...p)
{
    return ((((uintptr_t)p % to) == 0) && ...);
}

// ---- device helpers ----------------------------------------------------------------

__device__ __forceinline__ float kc_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double kc_warp_sum(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float kc_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Online softmax state (running max m, sum s of exp(x - m)).
struct kc_ms {
    float m, s;
};

__device__ __forceinline__ kc_ms kc_ms_add(kc_ms a, float x)
{
    if (x == -INFINITY)
        return a;
    if (x > a.m) {
        a.s = a.s * expf(a.m - x) + 1.0f; // exp(-inf) = 0 for the first element
        a.m = x;
    } else {
        a.s += expf(x - a.m);
    }
    return a;
}

__device__ __forceinline__ kc_ms kc_ms_merge(kc_ms a, kc_ms b)
{
    float m = fmaxf(a.m, b.m);
    if (m == -INFINITY)
        return a;
    kc_ms r;
    r.m = m;
    r.s = a.s * expf(a.m - m) + b.s * expf(b.m - m);
    return r;
}

__device__ __forceinline__ kc_ms kc_warp_ms(kc_ms v)
{
    for (int o = 16; o > 0; o >>= 1) {
        kc_ms w;
        w.m = __shfl_xor_sync(0xffffffffu, v.m, o);
        w.s = __shfl_xor_sync(0xffffffffu, v.s, o);
        v = kc_ms_merge(v, w);
    }
    return v;
}

// W consecutive floats, loaded and stored as one float4 when W == 4.
template <int W> struct kc_fv {
    float v[W];
};

template <int W> __device__ __forceinline__ kc_fv<W> kc_ld(const float *p)
{
    kc_fv<W> r;
    if constexpr (W == 4) {
        KC_EMU_ALIGNED(p, 16);
        float4 t = *reinterpret_cast<const float4 *>(p);
        r.v[0] = t.x;
        r.v[1] = t.y;
        r.v[2] = t.z;
        r.v[3] = t.w;
    } else {
#pragma unroll
        for (int j = 0; j < W; j++)
            r.v[j] = p[j];
    }
    return r;
}

template <int W> __device__ __forceinline__ void kc_st(float *p, const kc_fv<W> &r)
{
    if constexpr (W == 4) {
        KC_EMU_ALIGNED(p, 16);
        *reinterpret_cast<float4 *>(p) = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
    } else {
#pragma unroll
        for (int j = 0; j < W; j++)
            p[j] = r.v[j];
    }
}

// The same for an element type E: float, __nv_bfloat16 or __half.  16-bit
// loads widen exactly; stores round to nearest even with the casts' own
// conversions (kern_f32_to_bf16 is the CPU's function, so bf16 results
// match a CPU cast of the same fp32 value bit for bit).  W == 4: one 16-byte
// (fp32) or 8-byte (16-bit) access, aligned to it.
template <class E> __device__ __forceinline__ uint16_t kc_to16(float f)
{
    if constexpr (std::is_same_v<E, __nv_bfloat16>)
        return kern_f32_to_bf16(f);
    else
        return __half_as_ushort(__float2half_rn(f));
}

template <class E> __device__ __forceinline__ float kc_from16(uint16_t h)
{
    if constexpr (std::is_same_v<E, __nv_bfloat16>)
        return kern_bf16_to_f32(h);
    else
        return __half2float(__ushort_as_half(h));
}

// One element of type E widened exactly to fp32.
__device__ __forceinline__ float kc_widen(float x) { return x; }
__device__ __forceinline__ float kc_widen(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float kc_widen(__half x) { return __half2float(x); }

template <class E, int W> __device__ __forceinline__ kc_fv<W> kc_ldE(const E *p)
{
    if constexpr (std::is_same_v<E, float>) {
        return kc_ld<W>(p);
    } else {
        const uint16_t *q = reinterpret_cast<const uint16_t *>(p);
        kc_fv<W> r;
        if constexpr (W == 4) {
            KC_EMU_ALIGNED(q, 8);
            ushort4 h = *reinterpret_cast<const ushort4 *>(q);
            r.v[0] = kc_from16<E>(h.x);
            r.v[1] = kc_from16<E>(h.y);
            r.v[2] = kc_from16<E>(h.z);
            r.v[3] = kc_from16<E>(h.w);
        } else {
#pragma unroll
            for (int j = 0; j < W; j++)
                r.v[j] = kc_from16<E>(q[j]);
        }
        return r;
    }
}

template <class E, int W> __device__ __forceinline__ void kc_stE(E *p, const kc_fv<W> &r)
{
    if constexpr (std::is_same_v<E, float>) {
        kc_st<W>(p, r);
    } else {
        uint16_t *q = reinterpret_cast<uint16_t *>(p);
        if constexpr (W == 4) {
            KC_EMU_ALIGNED(q, 8);
            *reinterpret_cast<ushort4 *>(q) =
                make_ushort4(kc_to16<E>(r.v[0]), kc_to16<E>(r.v[1]), kc_to16<E>(r.v[2]), kc_to16<E>(r.v[3]));
        } else {
#pragma unroll
            for (int j = 0; j < W; j++)
                q[j] = kc_to16<E>(r.v[j]);
        }
    }
}

// f.template operator()<E>() with E the 16-bit type a context's bf16 flag
// names: the host side's one dispatch from the context to the kernels'
// template parameter (a lambda `[&]<class E>() { ... }`).
template <class F> inline void kc_with16(bool bf16, F &&f)
{
    if (bf16)
        f.template operator()<__nv_bfloat16>();
    else
        f.template operator()<__half>();
}

// Elementwise launcher: f.template run<W>(i) handles elements [i, i+W).
// With vec, the first n/4*4 elements go four at a time (every pointer f
// touches must then be 16-byte aligned), the tail one at a time.
template <int W, class F> __global__ void kc_ew_kernel(size_t base, size_t count, F f)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        f.template run<W>(base + i * W);
}

#ifndef GRADD_CUDA_EMU // (tests/emu launches kc_ew_kernel itself, with the same head/tail split)
template <class F> static inline void kc_ew(kern_ctx *k, size_t n, bool vec, const F &f, const char *what)
{
    size_t head = 0;
    if (vec && n >= 4) {
        size_t nv = n / 4;
        kc_ew_kernel<4, F><<<kc_grid(k, nv, 256), 256, 0, k->stream>>>(0, nv, f);
        head = nv * 4;
    }
    if (head < n)
        kc_ew_kernel<1, F><<<kc_grid(k, n - head, 256), 256, 0, k->stream>>>(head, n - head, f);
    kc_launched(k, what);
}
#endif

// ---- GEMM (gemm.cu) --------------------------------------------------------------------

// Column-major cuBLASLt call D = alpha·op(A)·op(B) + beta·C (+ bias), C = D
// unless given, strided batched when batch > 1.  A, B are of type ab (fp32, bf16 or fp16), D fp32.
struct kc_gemm_args {
    bool ta, tb;
    int m, n, k;
    const void *A;
    int lda;
    long long sA;
    const void *B;
    int ldb;
    long long sB;
    void *D;
    int ldd;
    long long sD;
    const void *C; // the beta·C term's matrix, laid out as D; NULL: D itself
    int batch;
    float alpha, beta;
    const void *bias; // CUBLASLT_EPILOGUE_BIAS (length m, of D's type: cuBLASLt's default), or NULL
    // cuBLASLt's GELU epilogues (the tanh form, GPT-2's), with aux of D's
    // type and layout (ld ldd, a multiple of 8): KC_GELU_FWD: D = gelu(acc +
    // bias), aux = acc + bias (GELU_AUX[_BIAS]); KC_GELU_BWD: D = acc ·
    // gelu'(aux) (DGELU, no bias).  KC_GELU_NONE (0): neither.
    int gelu;
    const void *aux;
    cudaDataType_t ab;
    cudaDataType_t dt; // D's type: CUDA_R_32F (0, what a zeroed struct says) unless a 16-bit output
    cublasComputeType_t compute;
};
enum { KC_GELU_NONE, KC_GELU_FWD, KC_GELU_BWD };
// One column-major GEMM, D (m×n) = op(A)·op(B) + beta·D, alpha 1, unbatched,
// fp32 operands, output and compute; callers change what differs (16-bit
// types, a bias, batch strides, alpha).
static inline kc_gemm_args kc_gemm_plain(bool ta, bool tb, int m, int n, int kk, const void *A, int lda,
                                         const void *B, int ldb, void *D, int ldd, float beta)
{
    kc_gemm_args g = {};
    g.ta = ta;
    g.tb = tb;
    g.m = m;
    g.n = n;
    g.k = kk;
    g.A = A;
    g.lda = lda;
    g.B = B;
    g.ldb = ldb;
    g.D = D;
    g.ldd = ldd;
    g.batch = 1;
    g.alpha = 1.0f;
    g.beta = beta;
    g.ab = CUDA_R_32F;
    g.compute = CUBLAS_COMPUTE_32F;
    return g;
}
// 0: done.  1: no algorithm for this configuration (nothing recorded; the
// caller may fall back).  -1: error recorded.
int kc_gemm(kern_ctx *k, const kc_gemm_args *g);
void kc_plans_destroy(kern_ctx *k);

// Deterministic column sums (reduce.cu): dst_a[c] += Σ_r f(r, c) over the rows of
// the (N, C) matrix dout; with LN, dst_a = dweight (Σ dout·norm) and dst_b =
// dbias (Σ dout); without, dst_a += Σ dout.  part: scratch of kc_colsum_scratch floats.
size_t kc_colsum_scratch(const kern_ctx *k, int N, int C, bool ln);
void kc_colsum(kern_ctx *k, float *dst_a, float *dst_b, const float *dout, const float *inp, const float *mean,
               const float *rstd, int N, int C, float *part);
// The same over a 16-bit (the context's type) dout16, each element widened
// exactly, with the same splits and order as kc_colsum (LN with inp, as there).
void kc_colsum16(kern_ctx *k, float *dst_a, float *dst_b, const uint16_t *dout16, const float *inp, const float *mean,
                 const float *rstd, int N, int C, float *part);

// dst_a[c] += Σ_s part_a[s·C + c] over S partial rows (C apart), and dst_b
// likewise from part_b unless dst_b is NULL; in a fixed order (reduce.cu).
void kc_colsum_merge(kern_ctx *k, float *dst_a, float *dst_b, const float *part_a, const float *part_b, int S, int C);

// Cast fp32 to bf16 (bf16 = true) or fp16, round to nearest even (pointwise.cu).
void kc_cast_lowp(kern_ctx *k, uint16_t *dst, const float *src, size_t n, bool bf16);
// Widen the context's 16-bit type (bf16 unless the context is fp16) to
// fp32 (pointwise.cu).
void kc_widen_lowp(kern_ctx *k, float *dst, const uint16_t *src, size_t n);

// ---- the ops (one .cu file per family) -----------------------------------------------

kern_ctx *kc_ctx_create(int threads, int device, kern_precision prec, const kern_scratch *scratch);
void kc_ctx_destroy(kern_ctx *k);
int kc_sync(kern_ctx *k);
const char *kc_error(const kern_ctx *k);
void kc_zero(kern_ctx *k, float *p, size_t n);
void kc_copy_h2d(kern_ctx *k, void *dst, const void *src, size_t bytes);
void kc_copy_d2h(kern_ctx *k, void *dst, const void *src, size_t bytes);

void kc_scale(kern_ctx *k, float *p, size_t n, float s);
void kc_dropout(kern_ctx *k, float *out, const float *inp, size_t n, float p, uint64_t seed, uint64_t offset);
void kc_gelu_forward(kern_ctx *k, float *out, const float *inp, size_t N);
void kc_gelu_backward(kern_ctx *k, float *dinp, const float *inp, const float *dout, size_t N);
void kc_relu_forward(kern_ctx *k, float *out, const float *inp, size_t N);
void kc_relu_backward(kern_ctx *k, float *dinp, const float *inp, const float *dout, size_t N);
void kc_residual_forward(kern_ctx *k, float *out, const float *a, const float *b, size_t N);
void kc_accumulate(kern_ctx *k, float *dst, const float *src, size_t N);
void kc_copy2d(kern_ctx *k, float *dst, int ldd, const float *src, int lds, int N, int cols, bool accumulate);
void kc_cast_f32_to_bf16(kern_ctx *k, uint16_t *dst, const float *src, size_t n);
void kc_cast_bf16_to_f32(kern_ctx *k, float *dst, const uint16_t *src, size_t n);
void kc_cast_f32_to_f16(kern_ctx *k, uint16_t *dst, const float *src, size_t n);
void kc_cast_f16_to_f32(kern_ctx *k, float *dst, const uint16_t *src, size_t n);
size_t kc_count_nonfinite(kern_ctx *k, const float *p, size_t n);

void kc_encoder_forward(kern_ctx *k, float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                        int T, int C);
void kc_encoder_backward(kern_ctx *k, float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                         int T, int C);
void kc_encoder_forward16w(kern_ctx *k, float *out, const int32_t *inp, const uint16_t *wte16, const float *wpe,
                           int B, int T, int C);

void kc_layernorm_forward(kern_ctx *k, float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int N, int C);
void kc_layernorm_backward(kern_ctx *k, float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const float *mean, const float *rstd, int N,
                           int C);

void kc_matmul_forward(kern_ctx *k, float *out, const float *inp, const float *weight, const float *bias, int N,
                       int C, int OC);
void kc_matmul_backward(kern_ctx *k, float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int N, int C, int OC);

void kc_attention_forward(kern_ctx *k, float *out, float *preatt, float *att, const float *inp, int B, int T,
                          int C, int NH);
void kc_attention_backward(kern_ctx *k, float *dinp, float *dpreatt, float *datt, const float *dout,
                           const float *inp, const float *att, int B, int T, int C, int NH);
bool kc_attention_fused_ok(kern_ctx *k, int C, int NH);
void kc_attention_fused_forward(kern_ctx *k, float *out, float *lse, const float *inp, int B, int T, int C, int NH);
void kc_attention_fused_backward(kern_ctx *k, float *dinp, const float *dout, const float *out, const float *lse,
                                 const float *inp, int B, int T, int C, int NH);
void kc_attention_fused_forward16(kern_ctx *k, uint16_t *out16, float *lse, const uint16_t *inp16, int B, int T,
                                  int C, int NH);
void kc_attention_fused_backward16(kern_ctx *k, uint16_t *dinp16, float *dq, const uint16_t *dout16,
                                   const uint16_t *out16, const float *lse, const uint16_t *inp16, int B, int T, int C,
                                   int NH);
// The register-resident variant (flash_mma.cu), same shapes; flash.cu
// checks them and picks between the two.  D (B,NH,T) = Σ dout·out per row.
// fp32 inp and out, or inp16 and out16 (the context's 16-bit type), the
// other pair NULL.
void kc_flash_mma_forward(kern_ctx *k, float *out, uint16_t *out16, float *lse, const float *inp,
                          const uint16_t *inp16, int B, int T, int C, int NH);
// Backward: fp32 dinp (+=), dout and inp, or dinp16 (dk, dv written), dq
// (summed into, zeroed by the caller), dout16 and inp16.
void kc_flash_mma_backward(kern_ctx *k, float *dinp, uint16_t *dinp16, float *dq, const float *dout,
                           const uint16_t *dout16, const float *lse, const float *D, const float *inp,
                           const uint16_t *inp16, int B, int T, int C, int NH);

// Llama (llama.cu; the attention gqa.cu).
void kc_rmsnorm_forward(kern_ctx *k, float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                        float eps);
void kc_rmsnorm_backward(kern_ctx *k, float *dinp, float *dweight, const float *dout, const float *inp,
                         const float *weight, const float *rstd, int N, int C);
void kc_rope_forward(kern_ctx *k, float *x, const float *inv_freq, const int32_t *pos, int N, int T, int NHR, int HS,
                     int stride);
void kc_rope_backward(kern_ctx *k, float *dx, const float *inv_freq, const int32_t *pos, int N, int T, int NHR,
                      int HS, int stride);
void kc_swiglu_forward(kern_ctx *k, float *out, const float *gu, int N, int F);
void kc_swiglu_backward(kern_ctx *k, float *dgu, const float *gu, const float *dout, int N, int F);
void kc_rmsnorm_forward16(kern_ctx *k, uint16_t *out16, float *rstd, const float *inp, const float *weight, int N,
                          int C, float eps);
void kc_rmsnorm_backward16(kern_ctx *k, float *dinp, uint16_t *dinp16, float *dweight, const float *dout,
                           const uint16_t *dout16, const float *inp, const float *weight, const float *rstd, int N,
                           int C);
void kc_swiglu_forward16(kern_ctx *k, uint16_t *out16, const uint16_t *gu16, int N, int F);
void kc_swiglu_backward16(kern_ctx *k, uint16_t *dgu16, const uint16_t *gu16, const uint16_t *dout16, int N, int F);
// The tensor-core variant (gqa_mma.cu) that gqa.cu's launchers hand a
// 16-bit context's head sizes 64 and 128 to, with GRADD_GQA=mma.  D (B,NH,T)
// = Σ dout·out per row, from gqa.cu.
bool kc_gqa_mma_ok(kern_ctx *k, int HS);
void kc_gqa_mma_forward(kern_ctx *k, float *out, float *lse, const float *qkv, const int32_t *start, int B, int T,
                        int NH, int KVH, int HS);
void kc_gqa_mma_backward(kern_ctx *k, float *dqkv, const float *dout, const float *lse, const float *D,
                         const float *qkv, const int32_t *start, int B, int T, int NH, int KVH, int HS);
// cuDNN's fused attention (gqa_cudnn.cu), with GRADD_GQA=cudnn: false when
// it does not take the call (an fp32 context, packed samples, a head size
// other than 64 and 128, a shape cuDNN has no engine for, no cuDNN), which
// gqa.cu's launchers then run themselves; true when it queued the op or
// recorded its failure.
bool kc_gqa_cudnn_forward(kern_ctx *k, float *out, float *lse, const float *qkv, const int32_t *start, int B, int T,
                          int NH, int KVH, int HS);
bool kc_gqa_cudnn_backward(kern_ctx *k, float *dqkv, const float *dout, const float *out, const float *lse,
                           const float *qkv, const int32_t *start, int B, int T, int NH, int KVH, int HS);
void kc_gqa_cudnn_destroy(kern_ctx *k);
bool kc_attention_gqa_ok(kern_ctx *k, int NH, int KVH, int HS);
void kc_attention_gqa_forward(kern_ctx *k, float *out, float *lse, const float *qkv, const int32_t *start, int B,
                              int T, int NH, int KVH, int HS);
void kc_attention_gqa_backward(kern_ctx *k, float *dqkv, const float *dout, const float *out, const float *lse,
                               const float *qkv, const int32_t *start, int B, int T, int NH, int KVH, int HS);

void kc_crossentropy_forward(kern_ctx *k, float *losses, float *lse, const float *logits,
                             const int32_t *targets, int N, int V, int Vp);
void kc_crossentropy_backward(kern_ctx *k, float *dlogits, const float *logits, const float *lse,
                              const int32_t *targets, const float *dloss, int N, int V, int Vp);

void kc_layernorm_forward16(kern_ctx *k, uint16_t *out16, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C);
void kc_gelu_forward16(kern_ctx *k, uint16_t *out16, const uint16_t *inp16, size_t N);
void kc_gelu_backward16(kern_ctx *k, uint16_t *dinp16, const uint16_t *inp16, const uint16_t *dout16, size_t N);
void kc_matmul_forward16(kern_ctx *k, float *out, const uint16_t *inp16, const uint16_t *weight16,
                         const float *bias, int N, int C, int OC);
void kc_layernorm_backward16(kern_ctx *k, float *dinp, uint16_t *dinp16, float *dweight, float *dbias,
                             const float *dout, const uint16_t *dout16, const float *inp, const float *weight,
                             const float *mean, const float *rstd, int N, int C);
void kc_matmul_forward16_residual(kern_ctx *k, float *out, const uint16_t *inp16, const uint16_t *weight16,
                                  const float *bias, const float *res, int N, int C, int OC);
void kc_matmul_backward16(kern_ctx *k, float *dinp, uint16_t *dinp16, float *dweight, float *dbias,
                          const float *dout, const uint16_t *dout16, const uint16_t *inp16, const uint16_t *weight16,
                          int N, int C, int OC);

void kc_matmul_forward16_out16(kern_ctx *k, uint16_t *out16, const uint16_t *inp16, const uint16_t *weight16,
                               const float *bias, int N, int C, int OC);
void kc_matmul_forward16_gelu(kern_ctx *k, uint16_t *out16, uint16_t *pre16, const uint16_t *inp16,
                              const uint16_t *weight16, const float *bias, int N, int C, int OC);
void kc_matmul_backward16_dgelu(kern_ctx *k, uint16_t *dinp16, const uint16_t *pre16, float *dweight, float *dbias,
                                const uint16_t *dout16, const uint16_t *inp16, const uint16_t *weight16, int N, int C,
                                int OC);
void kc_crossentropy_forward16(kern_ctx *k, float *losses, float *lse, const uint16_t *logits16,
                               const int32_t *targets, int N, int V, int Vp);
void kc_crossentropy_backward16(kern_ctx *k, uint16_t *dlogits16, const uint16_t *logits16, const float *lse,
                                const int32_t *targets, const float *dloss, int N, int V, int Vp);
void kc_crossentropy_fused16(kern_ctx *k, float *losses, uint16_t *logits16, const int32_t *targets,
                             const float *dloss, int N, int V, int Vp);

void kc_sumsq(kern_ctx *k, double *out, const float *g, size_t n);
void kc_adamw(kern_ctx *k, float *p, uint16_t *p16, const float *g, float *m, float *v, size_t n, float lr,
              float beta1, float beta2, float eps, float weight_decay, float grad_scale, int t);
void kc_adamw_multi(kern_ctx *k, float *p, uint16_t *p16, const float *g, float *m, float *v,
                    const kern_segment *segs, int nsegs, float lr, float beta1, float beta2, float eps,
                    float weight_decay, float grad_scale, int t);

#endif
