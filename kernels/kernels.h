/* kernels.h — the compute interface.  Every op has a CPU implementation
 * (kern_cpu_*, in kernels/cpu) and, where CUDA is built, a CUDA one
 * (kern_cuda_*, the .cu files in kernels/cuda, inside the gradd-cuda module) that is
 * tested against the CPU reference in tests/gpu/. */
#ifndef GRADD_KERNELS_H
#define GRADD_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __CUDACC__
#define KERN_HD __host__ __device__
#else
#define KERN_HD
#endif

/* ---- fill_pattern --------------------------------------------------------- */
/* p (n,) uint32: p[i] = kern_pattern(seed, i).  Used to prove that memory the
 * pool hands out is really there and writable (every page of a mapped
 * expandable segment, every byte of a raw allocation), and that a trimmed
 * range did not keep anyone's data. */
static inline KERN_HD uint32_t kern_pattern(uint32_t seed, uint64_t i)
{
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)seed << 32 | seed);
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (uint32_t)x;
}

void kern_cpu_fill_pattern(uint32_t *p, size_t n, uint32_t seed);
/* Returns the number of mismatching words (0 when p holds the pattern). */
size_t kern_cpu_check_pattern(const uint32_t *p, size_t n, uint32_t seed);

/* Device pointer p; stream is a cudaStream_t (NULL: the default stream).
 * Returns 0 or a cudaError_t value. */
int kern_cuda_fill_pattern(uint32_t *p, size_t n, uint32_t seed, void *stream);

#ifdef __cplusplus
}
#endif

#endif
