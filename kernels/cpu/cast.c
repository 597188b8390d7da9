/* cast.c — fp32 <-> bf16 / fp16 (raw uint16), and the non-finite count. */
#include <omp.h>

#include "cpu_kernels.h"

#define CAST_SPLIT(n, body)                                                                                     \
    do {                                                                                                        \
        int nt_ = k->threads;                                                                                   \
        _Pragma("omp parallel num_threads(nt_) if (n >= KCPU_PAR_MIN)")                                         \
        {                                                                                                       \
            size_t lo, hi;                                                                                      \
            kcpu_split(n, omp_get_thread_num(), omp_get_num_threads(), 32, &lo, &hi);                           \
            body;                                                                                               \
        }                                                                                                       \
    } while (0)

/* ---- fp16 scalars -----------------------------------------------------------------
 * IEEE binary16, round to nearest even, subnormals kept, overflow to ±inf,
 * NaN kept quiet (F. Giesen's float_to_half_fast3_rtne and half_to_float). */
static inline uint16_t f32_to_f16(float f)
{
    uint32_t u = kcpu_f2u(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    u &= 0x7fffffffu;
    uint16_t o;
    if (u >= 0x47800000u) { /* >= 65536 (or inf, nan): inf, or quiet NaN */
        o = u > 0x7f800000u ? (uint16_t)(0x7e00u | ((u >> 13) & 0x3ffu)) : 0x7c00u;
    } else if (u < 0x38800000u) { /* below 2^-14: an fp16 subnormal or zero */
        /* Adding 0.5 puts the 10 subnormal bits at the bottom of the
         * mantissa, rounded to nearest even by the FPU. */
        float s = kcpu_u2f(u) + 0.5f;
        o = (uint16_t)(kcpu_f2u(s) - 0x3f000000u);
    } else {
        uint32_t odd = (u >> 13) & 1u;
        u += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
        o = (uint16_t)(u >> 13); /* a carry into the exponent rounds up to inf */
    }
    return (uint16_t)(o | sign);
}

static inline float f16_to_f32(uint16_t h)
{
    uint32_t o = ((uint32_t)h & 0x7fffu) << 13;
    uint32_t exp = o & (0x7c00u << 13);
    o += (uint32_t)(127 - 15) << 23;
    if (exp == 0x7c00u << 13) { /* inf, nan */
        o += (uint32_t)(128 - 16) << 23;
    } else if (exp == 0) { /* zero, subnormal: renormalise by a float subtraction */
        o += 1u << 23;
        o = kcpu_f2u(kcpu_u2f(o) - kcpu_u2f(113u << 23));
    }
    return kcpu_u2f(o | ((uint32_t)h & 0x8000u) << 16);
}

/* ---- casts ------------------------------------------------------------------------- */

void kcpu_round_bf16(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = kern_f32_to_bf16(src[i]);
}

void kcpu_round_f16(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = f32_to_f16(src[i]);
}

void kcpu_widen_bf16(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = kern_bf16_to_f32(src[i]);
}

void kcpu_widen_f16(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = f16_to_f32(src[i]);
}

void kcpu_cast_f32_to_bf16(kern_ctx *k, uint16_t *dst, const float *src, size_t n)
{
    CAST_SPLIT(n, kcpu_round_bf16(dst + lo, src + lo, hi - lo));
}

void kcpu_cast_bf16_to_f32(kern_ctx *k, float *dst, const uint16_t *src, size_t n)
{
    CAST_SPLIT(n, kcpu_widen_bf16(dst + lo, src + lo, hi - lo));
}

void kcpu_cast_f32_to_f16(kern_ctx *k, uint16_t *dst, const float *src, size_t n)
{
    CAST_SPLIT(n, kcpu_round_f16(dst + lo, src + lo, hi - lo));
}

void kcpu_cast_f16_to_f32(kern_ctx *k, float *dst, const uint16_t *src, size_t n)
{
    CAST_SPLIT(n, kcpu_widen_f16(dst + lo, src + lo, hi - lo));
}

/* ---- non-finite count ----------------------------------------------------------------
 * An integer sum: exact in any order. */
size_t kcpu_count_nonfinite(kern_ctx *k, const float *p, size_t n)
{
    int nt = k->threads;
    size_t bad = 0;
#pragma omp parallel for simd num_threads(nt) schedule(static) reduction(+ : bad) if (n >= KCPU_PAR_MIN)
    for (size_t i = 0; i < n; i++)
        bad += (kcpu_f2u(p[i]) & 0x7f800000u) == 0x7f800000u;
    return bad;
}
