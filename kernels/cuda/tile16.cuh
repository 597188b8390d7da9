// tile16.cuh — staging the fused attention kernels' tiles (flash.cu,
// flash_mma.cu): rows of 64 values from global memory into a 16-bit tile in
// shared memory, four values per thread and access.
//
// The source is fp32 (converted, round to nearest even) or already the
// tile's 16-bit type E (copied as it is: the qkv GEMM writes it so, and the
// conversion and half of the bytes are saved).  A caller loads every tile it
// needs into registers first (kc_tile_load) and only then stores them
// (kc_tile_store), so that all global-memory latencies overlap: staged one
// tile after another, each load's latency was paid in turn, and on the H100
// that was most of the WMMA kernels' time.
//
// The kernels' outputs may be 16 bits as well (kc_store2, kc_store4): the
// attention output, which only the attention projection's GEMM and the
// backward's row sums read.
//
// Included after kern_cuda.cuh, or after tests/emu/cuda_emu.h when the
// kernels run under the CPU emulation.
#pragma once

#include <type_traits>

#define KC_TILE_W 64 // values per row: the head size

// The grid of every fused attention kernel: (B·NH, blocks of `rows` rows),
// the block index on y.  CTAs are issued in the order of their linear index,
// x first, so all heads' block 0 come before any head's block 1: each kernel
// numbers its blocks so that the longest come first (forward: the last
// query rows, which see the most keys; backward: the first key rows, which
// the most queries see), and the short ones fill the last wave.  With the
// index on x, the longest blocks of the last heads were issued last.
static inline dim3 kc_attn_grid(int B, int T, int NH, int rows)
{
    return dim3((unsigned)(B * NH), (unsigned)((T + rows - 1) / rows));
}

// Two fp32 values as a packed pair of E, low one first.
template <class E> __device__ __forceinline__ uint32_t kc_pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t kc_pack2<__nv_bfloat16>(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
template <> __device__ __forceinline__ uint32_t kc_pack2<__half>(float lo, float hi)
{
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// Four consecutive source values as they are loaded: a float4 of fp32, or
// four 16-bit values in 8 bytes.
template <class S> struct kc_quad {
    using raw = float4;
};
template <> struct kc_quad<__nv_bfloat16> {
    using raw = uint2;
};
template <> struct kc_quad<__half> {
    using raw = uint2;
};

// The four values as E, packed: converted from fp32, or as they are when
// the source is already E.
template <class E> __device__ __forceinline__ uint2 kc_quad_pack(const float4 &v)
{
    return make_uint2(kc_pack2<E>(v.x, v.y), kc_pack2<E>(v.z, v.w));
}
template <class E> __device__ __forceinline__ uint2 kc_quad_pack(const uint2 &v) { return v; }

// One thread's share of a ROWS × 64 tile staged by THREADS threads.
template <int ROWS, int THREADS, class S> struct kc_tile_regs {
    static constexpr int PER = ROWS * KC_TILE_W / 4 / THREADS;
    static_assert(PER * THREADS * 4 == ROWS * KC_TILE_W, "tile and threads");
    typename kc_quad<S>::raw v[PER];
};

// Row r of the tile is src + r·pitch (in elements of S; every row 16-byte
// aligned for fp32, 8-byte for 16 bits); rows at or past `rows` are zeros
// (all-zero bits: +0 in fp32, bf16 and fp16 alike).
template <int ROWS, int THREADS, class S>
__device__ __forceinline__ void kc_tile_load(kc_tile_regs<ROWS, THREADS, S> &t, const S *src, size_t pitch, int rows)
{
    using R = typename kc_quad<S>::raw;
#pragma unroll
    for (int u = 0; u < kc_tile_regs<ROWS, THREADS, S>::PER; u++) {
        int i = threadIdx.x + u * THREADS, r = i / (KC_TILE_W / 4), c = (i % (KC_TILE_W / 4)) * 4;
        t.v[u] = r < rows ? __ldg(reinterpret_cast<const R *>(src + (size_t)r * pitch + c)) : R{};
    }
}

// The tile into dst[r·LD + c] as E (LD a multiple of 4: 8-byte stores).
template <class E, int LD, int ROWS, int THREADS, class S>
__device__ __forceinline__ void kc_tile_store(E *dst, const kc_tile_regs<ROWS, THREADS, S> &t)
{
    static_assert(LD % 4 == 0, "8-byte aligned rows");
#pragma unroll
    for (int u = 0; u < kc_tile_regs<ROWS, THREADS, S>::PER; u++) {
        int i = threadIdx.x + u * THREADS, r = i / (KC_TILE_W / 4), c = (i % (KC_TILE_W / 4)) * 4;
        *reinterpret_cast<uint2 *>(dst + r * LD + c) = kc_quad_pack<E>(t.v[u]);
    }
}

// Output stores of two and four consecutive fp32 results as O: fp32 as they
// are, or rounded to the 16-bit type (4- and 8-byte stores, aligned to it).
template <class O> __device__ __forceinline__ void kc_store2(O *p, float a, float b)
{
    if constexpr (std::is_same_v<O, float>)
        *reinterpret_cast<float2 *>(p) = make_float2(a, b);
    else
        *reinterpret_cast<uint32_t *>(p) = kc_pack2<O>(a, b);
}

template <class O> __device__ __forceinline__ void kc_store4(O *p, float a, float b, float c, float d)
{
    if constexpr (std::is_same_v<O, float>)
        *reinterpret_cast<float4 *>(p) = make_float4(a, b, c, d);
    else
        *reinterpret_cast<uint2 *>(p) = make_uint2(kc_pack2<O>(a, b), kc_pack2<O>(c, d));
}
