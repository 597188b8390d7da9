// cuda_emu.h — just enough CUDA to run a kernel source file on the host (g++, C++20).
//
// Why: kernels written with warp-level PTX (mma.sync, ldmatrix) have fragment
// layouts that are easy to get wrong and impossible to check without a GPU.
// Compiling the real kernel source against this header runs its exact index
// arithmetic on the CPU, with the collectives emulated from the PTX ISA's
// definitions, so a layout or masking mistake shows up as a wrong number.
//
// Execution model:
//   - emu_launch(grid, block, f) runs the CTAs one after another; a CTA runs
//     one std::thread per CUDA thread, all calling f().
//   - __shared__ is `static`: with one CTA alive at a time, a function-local
//     static is exactly that CTA's shared memory.  (Unlike a GPU, it keeps its
//     contents between CTAs; it starts as zeros, not garbage.)
//   - __syncthreads() is a std::barrier over the CTA's threads.  Each call
//     site's line is checked to be the same for every thread (a barrier in
//     divergent code is undefined behaviour on the GPU).
//   - Warp collectives (__shfl_xor_sync, mma, ldmatrix) meet at a per-warp
//     std::barrier.  Every lane writes its operands into an exchange slot and
//     arrives; the barrier's completion step, which runs once after all 32
//     lanes have arrived and before any is released, checks that all lanes
//     issued the same collective, then computes every lane's result; each
//     lane then reads its own.  Two exchange slots are used alternately, so a
//     lane may start the next collective while others still read this one's
//     results: a slot is rewritten two collectives later, and every lane has
//     read it by then (it had to arrive at the collective in between).  One
//     barrier phase per collective instead of two halves the (dominant)
//     synchronisation cost on a small machine, with the same semantics.
//   - Threads that return early drop out of the CTA barrier (as exited
//     threads do on the GPU); a warp collective missing a lane aborts.
#ifndef GRADD_CUDA_EMU_H
#define GRADD_CUDA_EMU_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <math.h>
#include <memory>
#include <source_location>
#include <thread>
#include <type_traits>
#include <vector>

// ---- keywords ---------------------------------------------------------------------------
// The CUDA headers, included by a host compiler, already make __global__,
// __device__ and __host__ empty, __forceinline__ always_inline and
// __align__(n) __attribute__((aligned(n))) (alignas cannot stand between
// `static` and the type, where __align__ is written in kernels).  Build with
// -Wno-unknown-pragmas: #pragma unroll is nvcc's, and g++ 12 does not let a
// diagnostic pragma silence it.
#undef __shared__
#define __shared__ static
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

// ---- built-in variables -----------------------------------------------------------------
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

namespace emu {

[[noreturn]] inline void fail(const char *what, const std::source_location &at = std::source_location::current())
{
    std::fprintf(stderr, "cuda_emu: %s (%s:%u)\n", what, at.file_name(), (unsigned)at.line());
    std::fflush(stderr);
    std::abort();
}

enum class Op : int { none = 0, shfl_xor, mma_bf16, mma_f16, ldm_x4, ldm_x4_trans, syncwarp, exited };

// One lane's operands and results of a warp collective.
struct Lane {
    Op op;
    unsigned mask;
    int lanemask;
    uint64_t val;          // shfl: the value (bits), up to 8 bytes
    uint32_t a[4], b[2];   // mma operands
    float c[4];            // mma accumulator in / out
    const void *addr;      // ldmatrix: the row address this lane gives
    uint32_t r[4];         // ldmatrix result
    uint64_t out;          // shfl result
};

struct Warp;

// The barrier's completion step: computes the collective for all lanes.
struct Complete {
    Warp *w;
    void operator()() noexcept;
};

struct Warp {
    Lane slot[2][32];
    int phase = 0; // the slot the current collective uses (flipped by the completion step)
    std::barrier<Complete> bar;
    explicit Warp(int lanes) : bar(lanes, Complete{this}) {}
};

struct Cta {
    std::barrier<> block;
    std::vector<std::unique_ptr<Warp>> warps;
    std::atomic<unsigned> sync_line{0};
    std::atomic<int> sync_bad{0};
    explicit Cta(int threads) : block(threads)
    {
        for (int w = 0; w < threads / 32; w++)
            warps.push_back(std::make_unique<Warp>(32));
    }
};

inline thread_local Cta *cur_cta;
inline thread_local Warp *cur_warp;
inline thread_local int cur_lane;
inline thread_local unsigned cur_tid; // linear thread index in the CTA

// 16-bit floats to double, exactly (every bf16/fp16 value is a double).
inline double bf16_bits(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16; // bf16 is the top half of an fp32
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline double f16_bits(uint16_t h)
{
    __half_raw raw;
    raw.x = h;
    return (double)__half2float(__half(raw)); // exact: fp16 ⊂ fp32
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{..}.f32, per the PTX ISA
// ("Matrix Fragments for mma.m16n8k16 with floating point type"), with
// g = laneid >> 2 and t = laneid % 4:
//   A (16×16, row): a_i, i = 0..7, in registers a[i/2] (low half = even i):
//        row = g for i in {0,1,4,5}, g + 8 otherwise;
//        col = 2t + (i & 1) for i < 4, 2t + (i & 1) + 8 for i >= 4.
//   B (16×8, col): b_i, i = 0..3, in b[i/2]: row = 2t + (i & 1) (+8 for i >= 2), col = g.
//   C, D (16×8, f32): c_i: row = g for i < 2, g + 8 otherwise; col = 2t + (i & 1).
// The 16 products and C are summed in double and rounded to float once: the
// products of 16-bit inputs are exact, so this is the exact result rounded
// once (the hardware's own summation order and rounding are unspecified).
inline void do_mma(Lane *L, bool bf16)
{
    double A[16][16], B[16][8];
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane >> 2, t = lane & 3;
        for (int i = 0; i < 8; i++) {
            const uint16_t h = (uint16_t)(L[lane].a[i / 2] >> (16 * (i & 1)));
            const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
            const int col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
            A[row][col] = bf16 ? bf16_bits(h) : f16_bits(h);
        }
        for (int i = 0; i < 4; i++) {
            const uint16_t h = (uint16_t)(L[lane].b[i / 2] >> (16 * (i & 1)));
            const int row = 2 * t + (i & 1) + (i >= 2 ? 8 : 0);
            B[row][g] = bf16 ? bf16_bits(h) : f16_bits(h);
        }
    }
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane >> 2, t = lane & 3;
        for (int i = 0; i < 4; i++) {
            const int row = i < 2 ? g : g + 8, col = 2 * t + (i & 1);
            double s = L[lane].c[i];
            for (int k = 0; k < 16; k++)
                s += A[row][k] * B[k][col];
            L[lane].c[i] = (float)s;
        }
    }
}

// ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16, per the PTX ISA: lanes
// 8i..8i+7 give the addresses of rows 0..7 of matrix i (8 consecutive 16-bit
// elements each, 16-byte aligned); register i of lane L receives from matrix
// i, low half first, elements (row L/4, cols 2(L%4), 2(L%4)+1), or with
// .trans elements (rows 2(L%4), 2(L%4)+1, col L/4).
inline void do_ldmatrix(Lane *L, bool trans)
{
    uint16_t M[4][8][8];
    for (int m = 0; m < 4; m++)
        for (int row = 0; row < 8; row++) {
            const void *p = L[8 * m + row].addr;
            if ((uintptr_t)p % 16)
                fail("ldmatrix: a row address is not 16-byte aligned");
            std::memcpy(M[m][row], p, 16);
        }
    for (int lane = 0; lane < 32; lane++) {
        const int r = lane >> 2, c = 2 * (lane & 3);
        for (int m = 0; m < 4; m++) {
            uint16_t lo = trans ? M[m][c][r] : M[m][r][c];
            uint16_t hi = trans ? M[m][c + 1][r] : M[m][r][c + 1];
            L[lane].r[m] = (uint32_t)lo | ((uint32_t)hi << 16);
        }
    }
}

inline void Complete::operator()() noexcept
{
    Lane *L = w->slot[w->phase];
    w->phase ^= 1;
    const Op op = L[0].op;
    bool all_exited = true;
    for (int lane = 0; lane < 32; lane++)
        all_exited = all_exited && L[lane].op == Op::exited;
    if (all_exited) // the whole warp has returned: nothing to compute
        return;
    for (int lane = 0; lane < 32; lane++) {
        if (L[lane].op == Op::exited)
            fail("warp collective: a lane of the warp has exited");
        if (L[lane].op != op)
            fail("warp collective: the lanes of a warp issued different collectives (divergence)");
    }
    switch (op) {
    case Op::shfl_xor:
        for (int lane = 0; lane < 32; lane++) {
            if (L[lane].mask != 0xffffffffu || L[lane].lanemask != L[0].lanemask)
                fail("__shfl_xor_sync: only a full mask and a warp-uniform lane mask are emulated");
            L[lane].out = L[lane ^ (L[lane].lanemask & 31)].val;
        }
        break;
    case Op::mma_bf16:
    case Op::mma_f16:
        do_mma(L, op == Op::mma_bf16);
        break;
    case Op::ldm_x4:
    case Op::ldm_x4_trans:
        do_ldmatrix(L, op == Op::ldm_x4_trans);
        break;
    case Op::syncwarp: // the meeting is all there is to it
        break;
    default:
        fail("warp collective: unknown operation");
    }
}

// This lane's slot of the collective about to be issued.
inline Lane &my_slot() { return cur_warp->slot[cur_warp->phase][cur_lane]; }

} // namespace emu

// ---- device functions ---------------------------------------------------------------------

inline void __syncthreads(const std::source_location at = std::source_location::current())
{
    emu::Cta *cta = emu::cur_cta;
    // Every thread must wait at the same __syncthreads: the first to arrive
    // in a phase records its line, the others compare.  The record is reset
    // by the last thread out of the barrier below, which cannot race with the
    // next phase's first arrival because both barriers separate them.
    unsigned expect = 0;
    if (!cta->sync_line.compare_exchange_strong(expect, at.line()) && expect != at.line())
        cta->sync_bad.store(1);
    cta->block.arrive_and_wait();
    if (cta->sync_bad.load())
        emu::fail("__syncthreads: threads of a CTA wait at different barriers");
    if (emu::cur_tid == 0)
        cta->sync_line.store(0);
    cta->block.arrive_and_wait();
}

template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lanemask, int width = 32)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shfl of a small trivially copyable value");
    if (width != 32)
        emu::fail("__shfl_xor_sync: only width 32 is emulated");
    emu::Lane &s = emu::my_slot();
    s.op = emu::Op::shfl_xor;
    s.mask = mask;
    s.lanemask = lanemask;
    s.val = 0;
    std::memcpy(&s.val, &v, sizeof(T));
    emu::cur_warp->bar.arrive_and_wait();
    T r;
    std::memcpy(&r, &s.out, sizeof(T));
    return r;
}

// d += a·b for one m16n8k16 tile, E = __nv_bfloat16 or __half.
template <class E>
inline void emu_mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    static_assert(std::is_same_v<E, __nv_bfloat16> || std::is_same_v<E, __half>, "bf16 or f16");
    emu::Lane &s = emu::my_slot();
    s.op = std::is_same_v<E, __nv_bfloat16> ? emu::Op::mma_bf16 : emu::Op::mma_f16;
    for (int i = 0; i < 4; i++) {
        s.a[i] = a[i];
        s.c[i] = d[i];
    }
    s.b[0] = b0;
    s.b[1] = b1;
    emu::cur_warp->bar.arrive_and_wait();
    for (int i = 0; i < 4; i++)
        d[i] = s.c[i];
}

// ldmatrix .x4 (.trans when trans): p is this lane's row address in shared memory.
inline void emu_ldmatrix_x4(uint32_t (&r)[4], const void *p, bool trans)
{
    emu::Lane &s = emu::my_slot();
    s.op = trans ? emu::Op::ldm_x4_trans : emu::Op::ldm_x4;
    s.addr = p;
    emu::cur_warp->bar.arrive_and_wait();
    for (int i = 0; i < 4; i++)
        r[i] = s.r[i];
}

// Shared memory is ordinary memory here: the generic address is the address.
inline size_t __cvta_generic_to_shared(const void *p) { return (size_t)p; }

template <class T> inline T __ldg(const T *p)
{
    if ((uintptr_t)p % alignof(T)) // a vector load (float4: 16 bytes) faults on the GPU when misaligned
        emu::fail("__ldg: misaligned address");
    return *p;
}

inline float atomicAdd(float *p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v)
{
    return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}

// __syncwarp(): all 32 lanes meet (a partial mask is not emulated), which
// orders their shared-memory accesses before and after, as on the GPU.
inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    if (mask != 0xffffffffu)
        emu::fail("__syncwarp: only a full mask is emulated");
    emu::my_slot().op = emu::Op::syncwarp;
    emu::cur_warp->bar.arrive_and_wait();
}

inline float __expf(float x) { return expf(x); }

// ---- cp.async (16 bytes, global to shared) ----------------------------------------------
// Each thread's copies wait in commit groups and land only when that thread
// waits for their group (cp.async.wait_group n: all but the n newest), so a
// kernel that reads a tile before its wait, or (with the barrier after the
// wait left out) another thread's part of it, reads stale data here as it
// might on the GPU.  src_bytes 0: the 16 bytes are zeros (the zfill form).
namespace emu {
struct CpAsync {
    void *dst;
    const void *src;
    int bytes;
};
inline thread_local std::vector<CpAsync> cp_open;
inline thread_local std::deque<std::vector<CpAsync>> cp_groups;
} // namespace emu

inline void emu_cp_async16(void *dst, const void *src, int src_bytes)
{
    if ((uintptr_t)dst % 16 || (src_bytes && (uintptr_t)src % 16))
        emu::fail("cp.async: a 16-byte copy that is not 16-byte aligned");
    if (src_bytes != 0 && src_bytes != 16)
        emu::fail("cp.async: only 16 or 0 source bytes are emulated");
    emu::cp_open.push_back({dst, src, src_bytes});
}

inline void emu_cp_commit()
{
    emu::cp_groups.push_back(std::move(emu::cp_open));
    emu::cp_open.clear();
}

inline void emu_cp_wait(int newest_pending)
{
    while ((int)emu::cp_groups.size() > newest_pending) {
        for (const emu::CpAsync &c : emu::cp_groups.front()) {
            if (c.bytes)
                std::memcpy(c.dst, c.src, 16);
            else
                std::memset(c.dst, 0, 16);
        }
        emu::cp_groups.pop_front();
    }
}

// Dynamic shared memory (extern __shared__): one buffer, as there is one CTA
// alive at a time.  The kernels' sources take it through a macro of theirs.
inline unsigned char *emu_dynamic_smem()
{
    alignas(128) static unsigned char buf[192 * 1024];
    return buf;
}

// ---- WMMA (nvcuda::wmma), 16×16×16 ------------------------------------------------------
// The fragments' register layout is opaque in CUDA, so code that only loads,
// multiplies and stores them (as flash.cu does) is correct for any layout.
// Here every lane holds the whole tile, widened to fp32: loads read all of
// it, mma_sync computes all of it (products of 16-bit values are exact; the
// 16 are summed in double and added to the accumulator once, like do_mma),
// and store_matrix_sync is written by lane 0 alone, so that the lanes do not
// race on identical stores (the kernel's own __syncwarp orders them with
// other lanes' reads, as it must on the GPU, where each lane stores a part).
namespace nvcuda {
namespace wmma {
struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "16x16x16 only");
    float v[16][16];
};

template <class Use, class T, class L> inline void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, float x)
{
    for (auto &row : f.v)
        for (float &e : row)
            e = x;
}

inline float widen_elem(float x) { return x; }
inline float widen_elem(__nv_bfloat16 x) { return __bfloat162float(x); }
inline float widen_elem(__half x) { return __half2float(x); }

// A (16×16, m×k) and B (k×n): element (r, c) of the operand at p[r·ldm + c]
// row-major, p[c·ldm + r] column-major.
template <class Use, class T, class L> inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L> &f, const T *p,
                                                                   unsigned ldm)
{
    static_assert(std::is_same_v<L, row_major> || std::is_same_v<L, col_major>, "operand layout");
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.v[r][c] = widen_elem(std::is_same_v<L, row_major> ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]);
}

template <class TA, class LA, class TB, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d, const fragment<matrix_a, 16, 16, 16, TA, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, TB, LB> &b, const fragment<accumulator, 16, 16, 16, float> &c)
{
    float out[16][16];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            double s = 0;
            for (int k = 0; k < 16; k++)
                s += (double)a.v[i][k] * b.v[k][j];
            out[i][j] = (float)((double)c.v[i][j] + s);
        }
    std::memcpy(d.v, out, sizeof out);
}

inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm,
                              layout_t layout)
{
    if (emu::cur_lane != 0)
        return;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            (layout == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]) = f.v[r][c];
}
} // namespace wmma
} // namespace nvcuda

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

// ---- launcher ------------------------------------------------------------------------------

// Run kernel() (a callable, typically a lambda calling the __global__
// function with its arguments) as a grid of CTAs, one CTA at a time.
template <class F> void emu_launch(dim3 grid, dim3 block, F &&kernel)
{
    const unsigned nthreads = block.x * block.y * block.z;
    if (nthreads == 0 || nthreads % 32)
        emu::fail("emu_launch: the block size must be a positive multiple of 32");
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                emu::Cta cta((int)nthreads);
                std::vector<std::thread> th;
                th.reserve(nthreads);
                for (unsigned t = 0; t < nthreads; t++)
                    th.emplace_back([&, t] {
                        threadIdx = make_uint3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
                        blockIdx = make_uint3(bx, by, bz);
                        blockDim = block;
                        gridDim = grid;
                        emu::cur_cta = &cta;
                        emu::cur_warp = cta.warps[t / 32].get();
                        emu::cur_lane = (int)(t % 32);
                        emu::cur_tid = t;
                        kernel();
                        bool pending = !emu::cp_open.empty();
                        for (const auto &grp : emu::cp_groups)
                            pending = pending || !grp.empty();
                        if (pending)
                            emu::fail("cp.async: copies still pending when the thread exits");
                        emu::cp_groups.clear();
                        // An exited thread no longer counts at __syncthreads;
                        // in a warp collective its absence is an error.
                        emu::my_slot().op = emu::Op::exited;
                        emu::cur_warp->bar.arrive_and_drop();
                        cta.block.arrive_and_drop();
                    });
                for (auto &x : th)
                    x.join();
            }
}

// For the emulated tests: uniform [-1, 1) from a splitmix64 state, so that
// a failure reproduces from its seed.
static inline float emu_uniform(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) / 4503599627370496.0 - 1.0); // 2^52
}

#endif
