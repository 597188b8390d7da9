// emu_check.h — what the emulated kernel tests (test_kernels_emu.cc,
// test_train_emu.cc) share: the verdict line and the failure count, two
// comparisons (within a tolerance, bitwise), the element types' host
// storage, the CPU backend's contexts (the reference), and the launchers'
// grids (kc_grid, kc_ew's split).
//
// Included after the kernel sources: it uses kern_cuda.cuh (kc_ew_kernel,
// kc_grid, the 16-bit conversions), which they bring in with GRADD_CUDA_EMU.
#ifndef GRADD_EMU_CHECK_H
#define GRADD_EMU_CHECK_H

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <string>
#include <type_traits>

#include "kern_cuda.cuh"

inline int failures;

inline void verdict(const std::string &name, const char *what, size_t bad, size_t n, double max_err, const char *unit)
{
    std::printf("  %-34s %-14s max err %-10.3g %-8s %s\n", name.c_str(), what, max_err, unit, bad ? "FAIL" : "ok");
    if (bad) {
        std::printf("    %zu of %zu elements wrong\n", bad, n);
        failures++;
    }
}

inline uint32_t fbits(float f)
{
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// got[i] against ref[i] (fp32): |got − ref| ≤ rtol·|ref| + atol·max|ref|
// (NaN fails); the error reported is relative to max|ref|.
inline void compare(const std::string &name, const char *what, const float *got, const float *ref, size_t n,
                    double rtol, double atol)
{
    double maxref = 0, err = 0;
    for (size_t i = 0; i < n; i++)
        maxref = std::fmax(maxref, std::fabs((double)ref[i]));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = std::fabs((double)got[i] - ref[i]);
        err = std::fmax(err, d / maxref);
        bad += !(d <= rtol * std::fabs(ref[i]) + atol * maxref);
    }
    verdict(name, what, bad, n, err, "of max");
}

// ---- the element types -----------------------------------------------------------------
// E's storage on the host: float, or the raw uint16 bits of a bf16/fp16.
template <class E> using S = std::conditional_t<std::is_same_v<E, float>, float, uint16_t>;
template <class E> constexpr bool is16 = !std::is_same_v<E, float>;

template <class E> S<E> to_e(float f)
{
    if constexpr (std::is_same_v<E, float>)
        return f;
    else if constexpr (std::is_same_v<E, __nv_bfloat16>)
        return kern_f32_to_bf16(f);
    else
        return __half_as_ushort(__float2half_rn(f));
}

template <class E> float from_e(S<E> h)
{
    if constexpr (std::is_same_v<E, float>)
        return h;
    else if constexpr (std::is_same_v<E, __nv_bfloat16>)
        return kern_bf16_to_f32(h);
    else
        return __half2float(__ushort_as_half(h));
}

// The spacing of E's values at |x| (0 for fp32: "within one 16-bit ulp" is
// only a 16-bit allowance).
template <class E> double ulp_e(float x)
{
    if constexpr (std::is_same_v<E, float>) {
        return 0;
    } else {
        S<E> h = to_e<E>(std::fabs(x));
        return std::fabs((double)from_e<E>((S<E>)(h + 1)) - from_e<E>(h));
    }
}

// got and ref hold the same values of E bit for bit, where a NaN matches
// any NaN (its sign and payload are not what the GPU's and the CPU's
// arithmetic agree on).
template <class E> void same(const std::string &name, const char *what, const S<E> *got, const S<E> *ref, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        const bool nan = std::isnan(from_e<E>(got[i])), nan_ref = std::isnan(from_e<E>(ref[i]));
        bad += nan != nan_ref || (!nan && std::memcmp(&got[i], &ref[i], sizeof(S<E>)) != 0);
    }
    verdict(name, what, bad, n, 0, "bitwise");
}

template <class E> const char *ename()
{
    return std::is_same_v<E, float> ? "fp32" : std::is_same_v<E, __nv_bfloat16> ? "bf16" : "fp16";
}

// ---- the CPU backend ---------------------------------------------------------------------
// This translation unit sees CUDA's struct kern_ctx (kern_cuda.cuh); the CPU
// contexts are only passed back to the CPU ops, never looked into.
inline const kern_ops *H;
inline kern_ctx *cpu32, *cpu_bf16, *cpu_f16; // the *16 ops narrow to the context's type

template <class E> kern_ctx *cpu_ctx()
{
    return std::is_same_v<E, float> ? cpu32 : std::is_same_v<E, __nv_bfloat16> ? cpu_bf16 : cpu_f16;
}

inline bool cpu_open()
{
    H = kern_cpu_ops();
    cpu32 = H->ctx_create(1, 0, KERN_FP32, nullptr);
    cpu_bf16 = H->ctx_create(1, 0, KERN_BF16, nullptr);
    cpu_f16 = H->ctx_create(1, 0, KERN_FP16, nullptr);
    if (!cpu32 || !cpu_bf16 || !cpu_f16)
        std::fprintf(stderr, "cpu context\n");
    return cpu32 && cpu_bf16 && cpu_f16;
}

// Closes the contexts and prints the summary; the exit status (0 pass, 1 failure).
inline int cpu_close(std::chrono::steady_clock::time_point t0)
{
    H->ctx_destroy(cpu32);
    H->ctx_destroy(cpu_bf16);
    H->ctx_destroy(cpu_f16);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s: %d failure(s), %.1f s\n", failures ? "FAIL" : "PASS", failures, secs);
    return failures ? 1 : 0;
}

// ---- launch shapes -----------------------------------------------------------------------

// kc_grid(k, work, threads) of a device with one SM (so at most 32 blocks),
// and at most max_blocks: a cap smaller than the work makes a grid-stride
// loop go round at a size a CPU runs quickly (every CUDA thread is a thread
// here).
inline dim3 grid_for(size_t work, unsigned threads, unsigned max_blocks)
{
    kern_ctx k{};
    k.sm_count = 1;
    return dim3(std::min(kc_grid(&k, work, threads), max_blocks));
}

// kc_ew's split: with vec, the first n/4·4 elements four at a time, the rest
// one at a time, each launch on kc_ew's grid (within max_blocks).
template <class F> void ew_run(size_t n, bool vec, const F &f, unsigned max_blocks)
{
    size_t head = 0;
    if (vec && n >= 4) {
        const size_t nv = n / 4;
        emu_launch(grid_for(nv, 256, max_blocks), dim3(256), [=] { kc_ew_kernel<4, F>(0, nv, f); });
        head = nv * 4;
    }
    if (head < n)
        emu_launch(grid_for(n - head, 256, max_blocks), dim3(256), [=] { kc_ew_kernel<1, F>(head, n - head, f); });
}

#endif
