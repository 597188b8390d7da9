/* cpu_kernels.h — internals of the CPU backend, shared by the files of kernels/cpu only.
 *
 * Threading: every op runs its loops in one OpenMP team of k->threads threads
 * with static partitions that depend only on the problem size and the thread
 * count, and every reduction combines per-thread (or per-tile) partial sums
 * in a fixed order, so a result is bitwise reproducible for a fixed thread
 * count.  OpenBLAS is kept single-threaded (openblas_set_num_threads(1)) and
 * each OpenMP thread calls sgemm on its own slice: one thread pool, no
 * oversubscription between OpenMP and OpenBLAS's pthreads.
 *
 * A context is used by one thread at a time (like a CUDA stream). */
#ifndef GRADD_CPU_KERNELS_H
#define GRADD_CPU_KERNELS_H

/* The elementwise loops use selects (clamps, masks) that GCC vectorises only
 * when float comparisons may be speculated; gradd never reads FP exception
 * flags. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

struct kern_ctx {
    int threads; /* resolved: >= 1 */
    kern_precision prec; /* the fp32 ops ignore it; the 16-bit ones (lowp.c) store in its type */
    kern_scratch scratch;
    void *work; /* small per-thread partials, grown on demand */
    size_t work_bytes;
};

/* Per-thread partials for reductions: at least `bytes`, 64-byte aligned.
 * Returns NULL only when the host is out of memory. */
void *kcpu_work(kern_ctx *k, size_t bytes);

/* Makes sure OpenBLAS runs single-threaded (see above); cheap when it is. */
void kcpu_blas_single(void);

/* Problems below this many elements of work run on the calling thread: a
 * parallel region costs a few microseconds. */
#define KCPU_PAR_MIN 16384

/* This thread's share [*lo, *hi) of n items when `nth` threads split them
 * statically; boundaries are multiples of `align` (in items). */
static inline void kcpu_split(size_t n, int tid, int nth, size_t align, size_t *lo, size_t *hi)
{
    size_t blocks = (n + align - 1) / align;
    size_t per = blocks / (size_t)nth, extra = blocks % (size_t)nth;
    size_t b0 = (size_t)tid * per + ((size_t)tid < extra ? (size_t)tid : extra);
    size_t b1 = b0 + per + ((size_t)tid < extra ? 1 : 0);
    *lo = b0 * align < n ? b0 * align : n;
    *hi = b1 * align < n ? b1 * align : n;
}

/* ---- vector math ---------------------------------------------------------------
 * Branch-free, so that `#pragma omp simd` loops calling them vectorise (libm's
 * expf does not without -ffast-math). */

static inline uint32_t kcpu_f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float kcpu_u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* expf, Cephes polynomial after reduction by ln 2: relative error ~2 ulp on
 * [-87.33, 88.37]; 0 below that (no subnormals), saturating at exp(88.37)
 * up to 88.72 and +inf above (as expf); NaN stays NaN. */
static inline float kcpu_expf(float x)
{
    const float hi = 88.3762626647949f, lo = -87.3365447505531f;
    /* NaN goes through the polynomial as 0 (converting NaN to an int is
     * undefined) and comes out as itself below. */
    float xc = x > hi ? hi : (x < lo ? lo : (x != x ? 0.0f : x));
    /* n = round(x / ln2), by the 1.5·2^23 trick (exact for |n| < 2^22). */
    const float magic = 12582912.0f;
    float fn = (xc * 1.44269504088896341f + magic) - magic;
    float r = xc - fn * 0.693359375f;
    r = r - fn * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    int32_t n = (int32_t)fn;
    y = y * kcpu_u2f((uint32_t)(n + 127) << 23);
    y = x < lo ? 0.0f : y;
    y = x > 88.72283905206835f ? __builtin_inff() : y;
    return x != x ? x : y;
}

/* Function attributes for the hot elementwise leaves: on x86-64 with GCC, an
 * AVX2 clone picked at load time next to the baseline SSE2 one.  Not under
 * ThreadSanitizer: the ifunc resolvers GCC makes for the clones are
 * instrumented too, and the dynamic loader runs them before the TSan
 * runtime is initialised, so every binary died with SIGSEGV at load. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define KCPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define KCPU_CLONES
#endif

/* `omp simd` on a float max reduction.  Clang vectorises one only with
 * -ffinite-math-only, and reports the pragma it could not honour as a
 * warning; there the loop stays scalar (it is one pass of several). */
#define KCPU_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define KCPU_SIMD_MAX(var)
#else
#define KCPU_SIMD_MAX(var) KCPU_PRAGMA(omp simd reduction(max : var))
#endif

/* ---- the ops (one file per layer, llm.c-style) --------------------------------- */
void kcpu_encoder_forward(kern_ctx *k, float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                          int T, int C);
void kcpu_encoder_backward(kern_ctx *k, float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                           int T, int C);
void kcpu_encoder_forward16w(kern_ctx *k, float *out, const int32_t *inp, const uint16_t *wte16, const float *wpe,
                             int B, int T, int C);
void kcpu_layernorm_forward(kern_ctx *k, float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C);
void kcpu_layernorm_backward(kern_ctx *k, float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean, const float *rstd, int N,
                             int C);
void kcpu_matmul_forward(kern_ctx *k, float *out, const float *inp, const float *weight, const float *bias, int N,
                         int C, int OC);
void kcpu_matmul_backward(kern_ctx *k, float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int N, int C, int OC);
void kcpu_attention_forward(kern_ctx *k, float *out, float *preatt, float *att, const float *inp, int B, int T,
                            int C, int NH);
void kcpu_attention_backward(kern_ctx *k, float *dinp, float *dpreatt, float *datt, const float *dout,
                             const float *inp, const float *att, int B, int T, int C, int NH);
void kcpu_attention_decode(kern_ctx *k, float *out, float *att, float *kcache, float *vcache, const float *qkv,
                           int B, int Tc, int Tmax, int C, int NH);
void kcpu_gelu_forward(kern_ctx *k, float *out, const float *inp, size_t N);
void kcpu_gelu_backward(kern_ctx *k, float *dinp, const float *inp, const float *dout, size_t N);
void kcpu_relu_forward(kern_ctx *k, float *out, const float *inp, size_t N);
void kcpu_relu_backward(kern_ctx *k, float *dinp, const float *inp, const float *dout, size_t N);
void kcpu_residual_forward(kern_ctx *k, float *out, const float *a, const float *b, size_t N);
void kcpu_accumulate(kern_ctx *k, float *dst, const float *src, size_t N);
void kcpu_copy2d(kern_ctx *k, float *dst, int ldd, const float *src, int lds, int N, int cols, bool accumulate);
void kcpu_crossentropy_forward(kern_ctx *k, float *losses, float *lse, const float *logits,
                               const int32_t *targets, int N, int V, int Vp);
void kcpu_crossentropy_backward(kern_ctx *k, float *dlogits, const float *logits, const float *lse,
                                const int32_t *targets, const float *dloss, int N, int V, int Vp);
void kcpu_sumsq(kern_ctx *k, double *out, const float *g, size_t n);
void kcpu_adamw(kern_ctx *k, float *p, uint16_t *p16, const float *g, float *m, float *v, size_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, float grad_scale, int t);
void kcpu_adamw_multi(kern_ctx *k, float *p, uint16_t *p16, const float *g, float *m, float *v,
                      const kern_segment *segs, int nsegs, float lr, float beta1, float beta2, float eps,
                      float weight_decay, float grad_scale, int t);
/* dst (n) = src rounded to bf16 / fp16 as the casts round, on the calling
 * thread (for use inside another op's parallel region). */
void kcpu_round_bf16(uint16_t *dst, const float *src, size_t n);
void kcpu_round_f16(uint16_t *dst, const float *src, size_t n);
/* dst (n) = src widened exactly from bf16 / fp16, on the calling thread. */
void kcpu_widen_bf16(float *dst, const uint16_t *src, size_t n);
void kcpu_widen_f16(float *dst, const uint16_t *src, size_t n);
void kcpu_cast_f32_to_bf16(kern_ctx *k, uint16_t *dst, const float *src, size_t n);
void kcpu_cast_bf16_to_f32(kern_ctx *k, float *dst, const uint16_t *src, size_t n);
void kcpu_cast_f32_to_f16(kern_ctx *k, uint16_t *dst, const float *src, size_t n);
void kcpu_cast_f16_to_f32(kern_ctx *k, float *dst, const uint16_t *src, size_t n);

/* llama.c */
void kcpu_rmsnorm_forward(kern_ctx *k, float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                          float eps);
void kcpu_rmsnorm_backward(kern_ctx *k, float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, const float *rstd, int N, int C);
void kcpu_rope_forward(kern_ctx *k, float *x, const float *inv_freq, const int32_t *pos, int N, int T, int NHR, int HS,
                       int stride);
void kcpu_rope_backward(kern_ctx *k, float *dx, const float *inv_freq, const int32_t *pos, int N, int T, int NHR,
                        int HS, int stride);
void kcpu_swiglu_forward(kern_ctx *k, float *out, const float *gu, int N, int F);
void kcpu_swiglu_backward(kern_ctx *k, float *dgu, const float *gu, const float *dout, int N, int F);
bool kcpu_attention_gqa_ok(kern_ctx *k, int NH, int KVH, int HS);
void kcpu_attention_gqa_forward(kern_ctx *k, float *out, float *lse, const float *qkv, const int32_t *start, int B,
                                int T, int NH, int KVH, int HS);
void kcpu_attention_gqa_backward(kern_ctx *k, float *dqkv, const float *dout, const float *out, const float *lse,
                                 const float *qkv, const int32_t *start, int B, int T, int NH, int KVH, int HS);
void kcpu_attention_gqa_decode(kern_ctx *k, float *out, float *att, float *kcache, float *vcache, const float *qkv,
                               int B, int Tc, int Tmax, int NH, int KVH, int HS);

/* lowp.c */
void kcpu_layernorm_forward16(kern_ctx *k, uint16_t *out16, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int N, int C);
void kcpu_gelu_forward16(kern_ctx *k, uint16_t *out16, const uint16_t *inp16, size_t N);
void kcpu_gelu_backward16(kern_ctx *k, uint16_t *dinp16, const uint16_t *inp16, const uint16_t *dout16, size_t N);
void kcpu_matmul_forward16(kern_ctx *k, float *out, const uint16_t *inp16, const uint16_t *weight16,
                           const float *bias, int N, int C, int OC);
void kcpu_layernorm_backward16(kern_ctx *k, float *dinp, uint16_t *dinp16, float *dweight, float *dbias,
                               const float *dout, const uint16_t *dout16, const float *inp, const float *weight,
                               const float *mean, const float *rstd, int N, int C);
void kcpu_matmul_forward16_residual(kern_ctx *k, float *out, const uint16_t *inp16, const uint16_t *weight16,
                                    const float *bias, const float *res, int N, int C, int OC);
void kcpu_matmul_backward16(kern_ctx *k, float *dinp, uint16_t *dinp16, float *dweight, float *dbias,
                            const float *dout, const uint16_t *dout16, const uint16_t *inp16,
                            const uint16_t *weight16, int N, int C, int OC);
void kcpu_matmul_forward16_out16(kern_ctx *k, uint16_t *out16, const uint16_t *inp16, const uint16_t *weight16,
                                 const float *bias, int N, int C, int OC);
void kcpu_matmul_forward16_gelu(kern_ctx *k, uint16_t *out16, uint16_t *pre16, const uint16_t *inp16,
                                const uint16_t *weight16, const float *bias, int N, int C, int OC);
void kcpu_matmul_backward16_dgelu(kern_ctx *k, uint16_t *dinp16, const uint16_t *pre16, float *dweight, float *dbias,
                                  const uint16_t *dout16, const uint16_t *inp16, const uint16_t *weight16, int N,
                                  int C, int OC);
void kcpu_rmsnorm_forward16(kern_ctx *k, uint16_t *out16, float *rstd, const float *inp, const float *weight, int N,
                            int C, float eps);
void kcpu_rmsnorm_backward16(kern_ctx *k, float *dinp, uint16_t *dinp16, float *dweight, const float *dout,
                             const uint16_t *dout16, const float *inp, const float *weight, const float *rstd, int N,
                             int C);
void kcpu_swiglu_forward16(kern_ctx *k, uint16_t *out16, const uint16_t *gu16, int N, int F);
void kcpu_swiglu_backward16(kern_ctx *k, uint16_t *dgu16, const uint16_t *gu16, const uint16_t *dout16, int N, int F);
void kcpu_attention_fused_forward16(kern_ctx *k, uint16_t *out16, float *lse, const uint16_t *inp16, int B, int T,
                                    int C, int NH);
void kcpu_attention_fused_backward16(kern_ctx *k, uint16_t *dinp16, float *dq, const uint16_t *dout16,
                                     const uint16_t *out16, const float *lse, const uint16_t *inp16, int B, int T,
                                     int C, int NH);
void kcpu_crossentropy_forward16(kern_ctx *k, float *losses, float *lse, const uint16_t *logits16,
                                 const int32_t *targets, int N, int V, int Vp);
void kcpu_crossentropy_backward16(kern_ctx *k, uint16_t *dlogits16, const uint16_t *logits16, const float *lse,
                                  const int32_t *targets, const float *dloss, int N, int V, int Vp);
void kcpu_crossentropy_fused16(kern_ctx *k, float *losses, uint16_t *logits16, const int32_t *targets,
                               const float *dloss, int N, int V, int Vp);
size_t kcpu_count_nonfinite(kern_ctx *k, const float *p, size_t n);

#endif
