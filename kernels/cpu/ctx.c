/* ctx.c — the CPU backend's table, its context, and the memory helpers. */
#include <cblas.h>
#include <omp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cpu_kernels.h"

/* ---- context ----------------------------------------------------------------------- */

static kern_ctx *cpu_ctx_create(int threads, int device, kern_precision prec, const kern_scratch *scratch)
{
    (void)device;
    kern_ctx *k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    k->threads = threads > 0 ? threads : omp_get_max_threads();
    if (k->threads < 1)
        k->threads = 1;
    k->prec = prec;
    if (scratch)
        k->scratch = *scratch;
    kcpu_blas_single();
    return k;
}

static void cpu_ctx_destroy(kern_ctx *k)
{
    if (!k)
        return;
    free(k->work);
    free(k);
}

static int cpu_sync(kern_ctx *k)
{
    (void)k;
    return KERN_OK;
}

static void *cpu_stream(kern_ctx *k)
{
    (void)k;
    return NULL;
}

static const char *cpu_error(const kern_ctx *k)
{
    (void)k;
    return "";
}

void *kcpu_work(kern_ctx *k, size_t bytes)
{
    if (bytes <= k->work_bytes)
        return k->work;
    size_t want = (bytes + 4095) & ~(size_t)4095;
    void *p = NULL;
    if (posix_memalign(&p, 64, want) != 0)
        return NULL;
    free(k->work);
    k->work = p;
    k->work_bytes = want;
    return p;
}

void kcpu_blas_single(void)
{
    /* Process-wide in OpenBLAS; nothing else in gradd calls BLAS. */
    if (openblas_get_num_threads() != 1)
        openblas_set_num_threads(1);
}

/* ---- OpenBLAS's kernels -------------------------------------------------------------
 * OpenBLAS picks its kernels by CPU model as it is loaded.  Releases before
 * 0.3.25 (Debian 12 has 0.3.21) take an Intel model they do not know
 * (Emerald Rapids, family 6 model 207, and later ones) for a Prescott and
 * run the generic SSE3 kernels: there sgemm makes 25 GFLOP/s a core where
 * its AVX-512 kernels make 138 (2048³, one thread).  Later releases choose
 * by the CPU's features instead, and so does this, for the ones that don't:
 * of OpenBLAS's AVX-512 kernels SkylakeX's sgemm is the fastest (149
 * GFLOP/s at 2048×384×2048 where Cooperlake's make 128), and the CPU
 * device's GEMMs are fp32.
 * OPENBLAS_CORETYPE is read only at load, so the choice takes effect in a
 * process started with it (the callers run themselves again). */

const char *kern_cpu_blas_pick(const char *core, bool avx512, bool avx2)
{
    if (!core || strcasecmp(core, "Prescott") != 0)
        return NULL; /* a model OpenBLAS knows, or no OpenBLAS verdict */
    if (avx512)
        return "SkylakeX";
    if (avx2)
        return "Haswell";
    return NULL; /* a real SSE3-only CPU */
}

const char *kern_cpu_blas_core(void)
{
    return openblas_get_corename();
}

const char *kern_cpu_blas_better(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    /* libgcc's check includes the OS's consent (XCR0) to the AVX state. */
    __builtin_cpu_init();
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
                  __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl");
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return kern_cpu_blas_pick(openblas_get_corename(), avx512, avx2);
#else
    return NULL;
#endif
}

/* ---- memory helpers --------------------------------------------------------------- */
/* Large fills and copies are split over threads: one core does not saturate
 * the memory bandwidth of a server socket. */

#define KCPU_COPY_PAR_MIN ((size_t)1 << 22) /* bytes */

static void cpu_zero(kern_ctx *k, float *p, size_t n)
{
    int nt = k->threads;
#pragma omp parallel num_threads(nt) if (n * 4 >= KCPU_COPY_PAR_MIN)
    {
        size_t lo, hi;
        kcpu_split(n, omp_get_thread_num(), omp_get_num_threads(), 1024, &lo, &hi);
        if (hi > lo)
            memset(p + lo, 0, (hi - lo) * sizeof *p);
    }
}

static void cpu_copy(kern_ctx *k, void *dst, const void *src, size_t bytes)
{
    int nt = k->threads;
#pragma omp parallel num_threads(nt) if (bytes >= KCPU_COPY_PAR_MIN)
    {
        size_t lo, hi;
        kcpu_split(bytes, omp_get_thread_num(), omp_get_num_threads(), 4096, &lo, &hi);
        if (hi > lo)
            memcpy((char *)dst + lo, (const char *)src + lo, hi - lo);
    }
}

KCPU_CLONES static void scale_span(float *restrict p, size_t n, float s)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        p[i] *= s;
}

static void cpu_scale(kern_ctx *k, float *p, size_t n, float s)
{
    int nt = k->threads;
#pragma omp parallel num_threads(nt) if (n >= KCPU_PAR_MIN)
    {
        size_t lo, hi;
        kcpu_split(n, omp_get_thread_num(), omp_get_num_threads(), 16, &lo, &hi);
        scale_span(p + lo, hi - lo, s);
    }
}

static void dropout_span(float *out, const float *inp, size_t n, uint64_t seed, uint64_t first, uint32_t below,
                         float keep)
{
    for (size_t i = 0; i < n; i++)
        out[i] = kern_dropout_keep(seed, first + i, below) ? inp[i] * keep : 0.0f;
}

static void cpu_dropout(kern_ctx *k, float *out, const float *inp, size_t n, float p, uint64_t seed, uint64_t offset)
{
    uint32_t below;
    float keep;
    kern_dropout_rate(p, &below, &keep);
    int nt = k->threads;
#pragma omp parallel num_threads(nt) if (n >= KCPU_PAR_MIN)
    {
        size_t lo, hi;
        kcpu_split(n, omp_get_thread_num(), omp_get_num_threads(), 16, &lo, &hi);
        dropout_span(out + lo, inp + lo, hi - lo, seed, offset + lo, below, keep);
    }
}

/* ---- the table -------------------------------------------------------------------- */

static const kern_ops cpu_ops = {
    .name = "cpu",
    .ctx_create = cpu_ctx_create,
    .ctx_destroy = cpu_ctx_destroy,
    .sync = cpu_sync,
    .error = cpu_error,
    .stream = cpu_stream,
    .zero = cpu_zero,
    .copy_h2d = cpu_copy,
    .copy_d2h = cpu_copy,
    .scale = cpu_scale,
    .dropout = cpu_dropout,
    .encoder_forward = kcpu_encoder_forward,
    .encoder_backward = kcpu_encoder_backward,
    .encoder_forward16w = kcpu_encoder_forward16w,
    .layernorm_forward = kcpu_layernorm_forward,
    .layernorm_backward = kcpu_layernorm_backward,
    .matmul_forward = kcpu_matmul_forward,
    .matmul_backward = kcpu_matmul_backward,
    .attention_forward = kcpu_attention_forward,
    .attention_backward = kcpu_attention_backward,
    .attention_decode = kcpu_attention_decode,
    /* references only: no attention_fused_ok (kernels.h) */
    .attention_fused_forward16 = kcpu_attention_fused_forward16,
    .attention_fused_backward16 = kcpu_attention_fused_backward16,
    .rmsnorm_forward = kcpu_rmsnorm_forward,
    .rmsnorm_backward = kcpu_rmsnorm_backward,
    .rope_forward = kcpu_rope_forward,
    .rope_backward = kcpu_rope_backward,
    .swiglu_forward = kcpu_swiglu_forward,
    .swiglu_backward = kcpu_swiglu_backward,
    .attention_gqa_ok = kcpu_attention_gqa_ok,
    .attention_gqa_forward = kcpu_attention_gqa_forward,
    .attention_gqa_backward = kcpu_attention_gqa_backward,
    .attention_gqa_decode = kcpu_attention_gqa_decode,
    .gelu_forward = kcpu_gelu_forward,
    .gelu_backward = kcpu_gelu_backward,
    .relu_forward = kcpu_relu_forward,
    .relu_backward = kcpu_relu_backward,
    .residual_forward = kcpu_residual_forward,
    .accumulate = kcpu_accumulate,
    .copy2d = kcpu_copy2d,
    .crossentropy_forward = kcpu_crossentropy_forward,
    .crossentropy_backward = kcpu_crossentropy_backward,
    .sumsq = kcpu_sumsq,
    .adamw = kcpu_adamw,
    .adamw_multi = kcpu_adamw_multi,
    .cast_f32_to_bf16 = kcpu_cast_f32_to_bf16,
    .cast_bf16_to_f32 = kcpu_cast_bf16_to_f32,
    .cast_f32_to_f16 = kcpu_cast_f32_to_f16,
    .cast_f16_to_f32 = kcpu_cast_f16_to_f32,
    .count_nonfinite = kcpu_count_nonfinite,
    .act16_native = false,
    .layernorm_forward16 = kcpu_layernorm_forward16,
    .layernorm_backward16 = kcpu_layernorm_backward16,
    .gelu_forward16 = kcpu_gelu_forward16,
    .gelu_backward16 = kcpu_gelu_backward16,
    .matmul_forward16 = kcpu_matmul_forward16,
    .matmul_forward16_residual = kcpu_matmul_forward16_residual,
    .matmul_backward16 = kcpu_matmul_backward16,
    .matmul_forward16_out16 = kcpu_matmul_forward16_out16,
    .matmul_forward16_gelu = kcpu_matmul_forward16_gelu,
    .matmul_backward16_dgelu = kcpu_matmul_backward16_dgelu,
    .rmsnorm_forward16 = kcpu_rmsnorm_forward16,
    .rmsnorm_backward16 = kcpu_rmsnorm_backward16,
    .swiglu_forward16 = kcpu_swiglu_forward16,
    .swiglu_backward16 = kcpu_swiglu_backward16,
    .crossentropy_forward16 = kcpu_crossentropy_forward16,
    .crossentropy_backward16 = kcpu_crossentropy_backward16,
    .crossentropy_fused16 = kcpu_crossentropy_fused16,
};

const kern_ops *kern_cpu_ops(void)
{
    return &cpu_ops;
}
