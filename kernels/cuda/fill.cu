// fill.cu — CUDA fill_pattern; must match kern_cpu_fill_pattern word for word.
#ifdef GRADD_CUDA_EMU
#include "cuda_emu.h" // tests/emu: the kernel run on the CPU, without the launcher
#else
#include <cuda_runtime.h>
#endif

#include "kernels.h"

__global__ static void fill_pattern_kernel(uint32_t *p, size_t n, uint32_t seed)
{
    // Grid-stride so one launch of bounded size covers any n.
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = kern_pattern(seed, i);
}

#ifndef GRADD_CUDA_EMU
extern "C" __attribute__((visibility("default"))) int kern_cuda_fill_pattern(uint32_t *p, size_t n, uint32_t seed, void *stream)
{
    if (n == 0)
        return 0;
    size_t blocks = (n + 255) / 256;
    if (blocks > 65535)
        blocks = 65535;
    fill_pattern_kernel<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>(p, n, seed);
    return (int)cudaGetLastError();
}
#endif
