// flash_mma.cu — fused causal attention with the scores in registers.
//
// The same FlashAttention-2 scheme and the same interface as flash.cu (fp32
// q,k,v in and out, or both 16-bit, each row's log-sum-exp kept for
// backward), but the
// tiles are multiplied with mma.sync m16n8k16 on operands loaded with
// ldmatrix, and the score, probability and gradient tiles never leave the
// registers.  Why: the WMMA kernels round-trip every score tile through
// shared memory (their accumulator layout is opaque), and ncu on the H100
// showed them latency-bound on exactly those loads and stores (short
// scoreboard 34%, 18.75% occupancy).  Here a warp's accumulator fragment of
// S = Q·Kᵀ is, element for element, the A operand of P·V, so softmax runs on
// registers and feeds the next product directly.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with 16-bit inputs), per lane with
// g = lane/4 and c = lane%4:
//   A 16×16 (row):  {a0a1} = A[g][2c..], {a2a3} = A[g+8][2c..],
//                   {a4a5} = A[g][2c+8..], {a6a7} = A[g+8][2c+8..]
//   B 16×8  (col):  {b0b1} = B[2c..][g],  {b2b3} = B[2c+8..][g]
//   C 16×8  (fp32): c0,c1 = C[g][2c..],   c2,c3 = C[g+8][2c..]
// So two adjacent C tiles (columns n..n+15) are one A tile over k = n..n+15.
// ldmatrix.x4 loads four 8×8 16-bit matrices, lane L giving the address of
// row L%8 of matrix L/8; with .trans each lane receives the transposed
// elements.  Two address patterns cover every operand used here (fm_ldm_*).
//
// Forward: 128 queries per CTA (8 warps × 16 rows), 64 keys per step.
// Backward: 64 keys per CTA (4 warps × 16 rows of Sᵀ), 64 queries per step;
// dK and dV stay in registers; dQ is summed with atomicAdd, so its order of
// summation, unlike the rest, is not fixed.  Head size 64.  With 16-bit
// inputs (the model's 16-bit path) the tiles are copied with cp.async,
// each step's next tile loading behind math that does not read its buffer;
// ptxas (sm_90): forward 128 registers, no spill; backward 168, 64 bytes.
// On sm_90 dQ is summed with two-wide float atomics (m16_atomic_add2).
//
// The default (ctx.cu; flash.cu dispatches): on an H200 a GPT-2 124M bf16
// step took 36.2 ms with these kernels and 47.9 ms with flash.cu's WMMA
// ones, which GRADD_FLASH=wmma still selects.  tests/emu runs these kernels on the CPU
// (GRADD_CUDA_EMU: mma and ldmatrix emulated from the PTX ISA) against the
// CPU reference, so their indexing is checked without a GPU.
#include <math.h>

#ifdef GRADD_CUDA_EMU
// tests/emu: the kernels compiled by a host compiler and run on the CPU, one
// std::thread per CUDA thread, the PTX collectives emulated (cuda_emu.h).
#include "cuda_emu.h"
#else
#include "kern_cuda.cuh"
#endif
#include "tile16.cuh"
#include "mma16.cuh"

#define FM_HS 64
#define FM_LD (FM_HS + 8) // 16-bit tile pitch: rows 16 bytes apart in the banks
#define FM_FWD_BR 128     // forward: queries per CTA
#define FM_FWD_THREADS 256
#define FM_BWD_B 64 // backward: keys per CTA and queries per step
#define FM_BWD_THREADS 128
#define FM_BC 64 // forward: keys per step

// A ROWS × 64 tile of E (row r at src + r·pitch, 16-byte aligned; rows at or
// past `rows` zeros) into dst[r·FM_LD ..], by THREADS threads, 16 bytes per
// copy; the caller commits.
template <int ROWS, int THREADS, class E>
__device__ __forceinline__ void fm_tile_async(E *dst, const E *src, size_t pitch, int rows)
{
    constexpr int CHUNKS = ROWS * FM_HS / 8, PER = CHUNKS / THREADS;
    static_assert(PER * THREADS == CHUNKS, "tile and threads");
#pragma unroll
    for (int u = 0; u < PER; u++) {
        int i = threadIdx.x + u * THREADS, r = i / (FM_HS / 8), c = (i % (FM_HS / 8)) * 8;
        bool in = r < rows;
        m16_cp16(dst + r * FM_LD + c, in ? src + (size_t)r * pitch + c : src, in);
    }
}

// Pattern 1: lane L reads row L%16, column (L/16)·8 of the 16×16 block at s
// (pitch FM_LD).  Without .trans: the A fragment of a row-major A[m][k].
// With .trans on a row-major X[k][n]: the B fragments of n-tiles 0..7
// (r0, r1) and 8..15 (r2, r3).
template <bool TRANS, class E> __device__ __forceinline__ void fm_ldm_p1(uint32_t (&r)[4], const E *s, int lane)
{
    m16_ldm<TRANS>(r, s + (lane & 15) * FM_LD + (lane >> 4) * 8);
}

// Pattern 2: lane L reads row L%8 + (L/16)·8, column ((L/8)%2)·8.  Without
// .trans on a row-major Y[n][k] (B stored transposed): the B fragments of
// n-tiles 0..7 (r0, r1) and 8..15 (r2, r3).  With .trans on a row-major
// Xt[k][m] (A stored transposed): the A fragment of A = Xtᵀ.
template <bool TRANS, class E> __device__ __forceinline__ void fm_ldm_p2(uint32_t (&r)[4], const E *s, int lane)
{
    m16_ldm<TRANS>(r, s + ((lane & 7) + (lane >> 4) * 8) * FM_LD + ((lane >> 3) & 1) * 8);
}


// acc (16×64: eight 16×8 tiles) += A · X[16·kk .. 16·kk+15][0..63]: one
// 16-deep step of a product whose B operand X (k rows × 64) is row-major in
// shared memory and read transposed.  Every product of these kernels whose
// result has head-size columns (P·V, Pᵀ·dO, dSᵀ·Q, dS·K) is four of these.
template <class E>
__device__ __forceinline__ void fm_mma_x64(float (&acc)[8][4], const uint32_t (&a)[4], const E *X, int kk, int lane)
{
#pragma unroll
    for (int dd = 0; dd < 4; dd++) {
        uint32_t xf[4];
        fm_ldm_p1<true>(xf, X + kk * 16 * FM_LD + dd * 16, lane);
        m16_mma<E>(acc[2 * dd], a, xf[0], xf[1]);
        m16_mma<E>(acc[2 * dd + 1], a, xf[2], xf[3]);
    }
}

// ---- forward --------------------------------------------------------------------------------

// Scores are kept in log2 units (scale·log2 e folded in) so exp2f does the
// exponentials; lse is written back in natural units.
// S: the element type of inp, O of out: fp32 or E (tile16.cuh).
template <class E, class S, class O>
__global__ __launch_bounds__(FM_FWD_THREADS, 2) void fm_forward(O *__restrict__ out, float *__restrict__ lse,
                                                                const S *__restrict__ inp, int T, int C, int NH,
                                                                float scale_log2)
{
    __shared__ __align__(128) E Qs[FM_FWD_BR * FM_LD];
    __shared__ __align__(128) E Ks[FM_BC * FM_LD];
    __shared__ __align__(128) E Vs[FM_BC * FM_LD];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int qb = gridDim.y - 1 - blockIdx.y; // the longest rows first (kc_attn_grid)
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = qb * FM_FWD_BR, band = q0 + warp * 16; // this warp's first query
    const size_t C3 = 3 * (size_t)C;
    const S *base = inp + (size_t)b * T * C3 + (size_t)h * FM_HS;
    // 16-bit q,k,v: tiles by cp.async, K of the next block and V of this
    // one each loading behind the math that does not read its buffer (the
    // FlashAttention-2 schedule, with single buffers).  fp32: staged through
    // registers (converted), before each block's math.
    constexpr bool ASYNC = !std::is_same_v<S, float>;

    if constexpr (ASYNC) {
        fm_tile_async<FM_FWD_BR, FM_FWD_THREADS>(Qs, base + (size_t)q0 * C3, C3, T - q0);
        fm_tile_async<FM_BC, FM_FWD_THREADS>(Ks, base + C, C3, T); // K of block 0
        m16_cp_commit();
    } else {
        kc_tile_regs<FM_FWD_BR, FM_FWD_THREADS, S> q;
        kc_tile_load(q, base + (size_t)q0 * C3, C3, T - q0);
        kc_tile_store<E, FM_LD>(Qs, q);
    }
    // This warp's 16 query rows are read back as A fragments at every key
    // block: holding them (16 registers) made the staging spill.

    float o[8][4]; // output rows g, g+8 of the band; d = 8·j + 2c..
#pragma unroll
    for (int j = 0; j < 8; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; // rows g, g+8: running max (log2) and this lane's sum
    const int row[2] = {band + g, band + g + 8};

    const int last = min(q0 + FM_FWD_BR - 1, T - 1) / FM_BC;
    for (int kb = 0; kb <= last; kb++) {
        const int k0 = kb * FM_BC;
        if constexpr (ASYNC) {
            m16_cp_wait<0>(); // this block's K (and, first, Q)
            __syncthreads(); // ... everyone's; and the previous V is no longer read
            fm_tile_async<FM_BC, FM_FWD_THREADS>(Vs, base + 2 * (size_t)C + (size_t)k0 * C3, C3, T - k0);
            m16_cp_commit();
        } else {
            __syncthreads(); // the previous K, V are no longer read
            // One tile at a time: both at once needed 32 registers of loads
            // in flight, and spilled.
            kc_tile_regs<FM_BC, FM_FWD_THREADS, S> t;
            kc_tile_load(t, base + C + (size_t)k0 * C3, C3, T - k0);
            kc_tile_store<E, FM_LD>(Ks, t);
            kc_tile_load(t, base + 2 * (size_t)C + (size_t)k0 * C3, C3, T - k0);
            kc_tile_store<E, FM_LD>(Vs, t);
            __syncthreads();
        }
        // Bands are 16-aligned and blocks 64-aligned: a band is wholly at or
        // past k0 (it needs this block) or wholly before it (it does not).
        // A band that does not still meets every barrier.
        const bool active = k0 <= band;

        float s[8][4]; // S = Q·Kᵀ for keys k0 + 8·j + 2c..
#pragma unroll
        for (int j = 0; j < 8; j++)
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
        if (active) {
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                uint32_t qf[4];
                fm_ldm_p1<false>(qf, Qs + warp * 16 * FM_LD + kk * 16, lane);
#pragma unroll
                for (int jj = 0; jj < 4; jj++) {
                    uint32_t kf[4];
                    fm_ldm_p2<false>(kf, Ks + jj * 16 * FM_LD + kk * 16, lane);
                    m16_mma<E>(s[2 * jj], qf, kf[0], kf[1]);
                    m16_mma<E>(s[2 * jj + 1], qf, kf[2], kf[3]);
                }
            }
        }

        if constexpr (ASYNC) {
            __syncthreads(); // Ks is no longer read: the next block's K may come in
            if (kb < last) {
                fm_tile_async<FM_BC, FM_FWD_THREADS>(Ks, base + C + (size_t)(k0 + FM_BC) * C3, C3, T - k0 - FM_BC);
                m16_cp_commit();
            }
        }

        if (active) { // online softmax over this block's keys, on the registers
            const bool edge = k0 + FM_BC - 1 > band || k0 + FM_BC > T; // some key past some query, or past T
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = k0 + 8 * j + 2 * c + (e & 1), hr = e >> 1;
                    float v = s[j][e] * scale_log2;
                    if (edge && (key > row[hr] || key >= T))
                        v = -INFINITY;
                    s[j][e] = v;
                    mx[hr] = fmaxf(mx[hr], v);
                }
            float alpha[2], mu[2];
            m16_softmax_rescale(mx, m, l, mu, alpha);
#pragma unroll
            for (int j = 0; j < 8; j++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int hr = e >> 1;
                    s[j][e] = exp2f(s[j][e] - mu[hr]);
                    l[hr] += s[j][e];
                    o[j][e] *= alpha[hr];
                }
            }
        }

        if constexpr (ASYNC) {
            if (kb < last) // this block's V, with the next K still in flight
                m16_cp_wait<1>();
            else
                m16_cp_wait<0>();
            __syncthreads();
        }
        // O += P·V: P's accumulator tiles are the A operand directly.
        if (active) {
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                uint32_t pa[4];
                m16_acc_to_a<E>(pa, s[2 * kk], s[2 * kk + 1]);
                fm_mma_x64<E>(o, pa, Vs, kk, lane);
            }
        }
    }

#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 1);
        l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 2);
        const int t = row[hr];
        if (t >= T)
            continue;
        const float inv = 1.0f / l[hr];
        O *orow = out + ((size_t)b * T + t) * C + (size_t)h * FM_HS + 2 * c;
#pragma unroll
        for (int j = 0; j < 8; j++)
            kc_store2(orow + 8 * j, o[j][2 * hr] * inv, o[j][2 * hr + 1] * inv);
        if (c == 0)
            lse[(size_t)bh * T + t] = (m[hr] + log2f(l[hr])) * 0.69314718055994531f;
    }
}

// ---- backward -------------------------------------------------------------------------------

// dinp (B,T,3C) += dq, dk, dv.  D (B,NH,T) = Σ_d dout·out per row (flash.cu).
// One CTA per (key block, b·h); warp w owns keys k0 + 16w.. as the rows of
// Sᵀ = K·Qᵀ, so Pᵀ and dSᵀ are A operands of dV += Pᵀ·dO and dK += dSᵀ·Q
// straight from the registers.  dQ = dS·K needs dS with queries as rows:
// dSᵀ goes through shared memory once, read back transposed by ldmatrix.
// S, the element type of inp, dout and dkv: fp32 or E.  dk and dv go to
// dkv (B,T,3C: k at +C, v at +2C): with acc added into it (fp32 only), else
// overwriting it.  dq is summed by atomics into the fp32 dqg, rows qp apart
// (zeroed by the caller): dkv itself (qp = 3C) when S is fp32, or a (B,T,C)
// scratch (qp = C) that the caller rounds into dkv afterwards.  (No
// __restrict__ on the two: in the fp32 case they are the same buffer,
// written in disjoint columns.)
template <class E, class S>
__global__ __launch_bounds__(FM_BWD_THREADS, 3) void fm_backward(S *dkv, float *dqg, int qp,
                                                                 const S *__restrict__ dout,
                                                                 const float *__restrict__ lse,
                                                                 const float *__restrict__ D,
                                                                 const S *__restrict__ inp, int T, int C, int NH,
                                                                 float scale, bool acc)
{
    __shared__ __align__(128) E Ks[FM_BWD_B * FM_LD];
    __shared__ __align__(128) E Vs[FM_BWD_B * FM_LD];
    __shared__ __align__(128) E Qs[FM_BWD_B * FM_LD];
    __shared__ __align__(128) E dOs[FM_BWD_B * FM_LD];
    __shared__ __align__(128) E dSs[FM_BWD_B * FM_LD]; // dSᵀ (keys × queries)
    __shared__ float Lq[FM_BWD_B], Dq[FM_BWD_B];         // lse·log2 e and D of the step's queries

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int kb = blockIdx.y, nqb = (T + FM_BWD_B - 1) / FM_BWD_B; // key block 0, the longest, first (kc_attn_grid)
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int k0 = kb * FM_BWD_B;
    const size_t C3 = 3 * (size_t)C;
    const S *base = inp + (size_t)b * T * C3 + (size_t)h * FM_HS;
    const S *dbase = dout + (size_t)b * T * C + (size_t)h * FM_HS;
    S *gbase = dkv + (size_t)b * T * C3 + (size_t)h * FM_HS;
    float *qbase = dqg + (size_t)b * T * qp + (size_t)h * FM_HS;
    const float scale_log2 = scale * 1.44269504088896341f;
    const int key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8}; // rows g, g+8 of this warp's Sᵀ
    // 16-bit q and dout: each step's Q and dO tiles by cp.async, issued
    // during the previous step's dQ (which reads neither), so they load
    // behind its products and atomics.  fp32: staged through registers at
    // the top of each step.
    constexpr bool ASYNC = !std::is_same_v<S, float>;
    if constexpr (ASYNC) {
        fm_tile_async<FM_BWD_B, FM_BWD_THREADS>(Qs, base + (size_t)k0 * C3, C3, T - k0);
        fm_tile_async<FM_BWD_B, FM_BWD_THREADS>(dOs, dbase + (size_t)k0 * C, (size_t)C, T - k0);
        m16_cp_commit();
    }

    {
        kc_tile_regs<FM_BWD_B, FM_BWD_THREADS, S> kt, vt;
        kc_tile_load(kt, base + C + (size_t)k0 * C3, C3, T - k0);
        kc_tile_load(vt, base + 2 * (size_t)C + (size_t)k0 * C3, C3, T - k0);
        kc_tile_store<E, FM_LD>(Ks, kt);
        kc_tile_store<E, FM_LD>(Vs, vt);
    }

    float dk[8][4], dv[8][4]; // rows g, g+8 of this warp's keys; d = 8·j + 2c..
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk[j][e] = dv[j][e] = 0.0f;

    for (int qb = kb; qb < nqb; qb++) {
        const int q0 = qb * FM_BWD_B;
        if constexpr (ASYNC) {
            m16_cp_wait<0>(); // this step's Q and dO
            __syncthreads(); // ... everyone's; and dSs, Lq, Dq of the previous step are no longer read
        } else {
            __syncthreads(); // Qs, dOs, dSs of the previous step are no longer read
            kc_tile_regs<FM_BWD_B, FM_BWD_THREADS, S> qt, ot;
            kc_tile_load(qt, base + (size_t)q0 * C3, C3, T - q0);
            kc_tile_load(ot, dbase + (size_t)q0 * C, (size_t)C, T - q0);
            kc_tile_store<E, FM_LD>(Qs, qt);
            kc_tile_store<E, FM_LD>(dOs, ot);
        }
        if (threadIdx.x < FM_BWD_B) {
            int q = q0 + threadIdx.x;
            Lq[threadIdx.x] = q < T ? lse[(size_t)bh * T + q] * 1.44269504088896341f : 0.0f;
            Dq[threadIdx.x] = q < T ? D[(size_t)bh * T + q] : 0.0f;
        }
        __syncthreads();

        // Sᵀ = K·Qᵀ: 16 keys × 64 queries (q0 + 8·j + 2c..).
        float s[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++)
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            uint32_t ka[4];
            fm_ldm_p1<false>(ka, Ks + warp * 16 * FM_LD + kk * 16, lane);
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                uint32_t qf[4];
                fm_ldm_p2<false>(qf, Qs + jj * 16 * FM_LD + kk * 16, lane);
                m16_mma<E>(s[2 * jj], ka, qf[0], qf[1]);
                m16_mma<E>(s[2 * jj + 1], ka, qf[2], qf[3]);
            }
        }
        // Pᵀ = exp(scale·Sᵀ − lse[q]), zero where q < key, q ≥ T or key ≥ T.
        const bool diag = qb == kb, tail = q0 + FM_BWD_B > T || k0 + FM_BWD_B > T;
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qc = 8 * j + 2 * c + (e & 1), q = q0 + qc, kr = key[e >> 1];
                float p = exp2f(s[j][e] * scale_log2 - Lq[qc]);
                if ((diag && q < kr) || (tail && (q >= T || kr >= T)))
                    p = 0.0f;
                s[j][e] = p;
            }

        // dV += Pᵀ·dO (k = queries, n = d: dO read transposed).
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            uint32_t pa[4];
            m16_acc_to_a<E>(pa, s[2 * kk], s[2 * kk + 1]);
            fm_mma_x64<E>(dv, pa, dOs, kk, lane);
        }

        // dPᵀ = V·dOᵀ, 16 queries at a time, and at once dSᵀ = Pᵀ ⊙ (dPᵀ − D[q])
        // over the Pᵀ registers.  The warp's V band is loaded once for the
        // four query groups (ldmatrix is volatile asm: the compiler would
        // not merge repeated loads): 12 fewer ldmatrix per step, and ptxas
        // gives the same 168 registers and spill either way.
        uint32_t va[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
            fm_ldm_p1<false>(va[kk], Vs + warp * 16 * FM_LD + kk * 16, lane);
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            float dp[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                uint32_t of[4];
                fm_ldm_p2<false>(of, dOs + jj * 16 * FM_LD + kk * 16, lane);
                m16_mma<E>(dp[0], va[kk], of[0], of[1]);
                m16_mma<E>(dp[1], va[kk], of[2], of[3]);
            }
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int j = 2 * jj + t, qc = 8 * j + 2 * c + (e & 1);
                    s[j][e] *= dp[t][e] - Dq[qc];
                }
        }

        // dK += dSᵀ·Q (k = queries, n = d: Q read transposed), and dSᵀ to
        // shared memory for dQ.
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            uint32_t da[4];
            m16_acc_to_a<E>(da, s[2 * kk], s[2 * kk + 1]);
            fm_mma_x64<E>(dk, da, Qs, kk, lane);
            m16_store_a(dSs + (warp * 16 + g) * FM_LD + kk * 16 + 2 * c, FM_LD, da);
        }
        __syncthreads(); // every warp's dSᵀ rows are in place, and Qs, dOs are no longer read
        if constexpr (ASYNC) {
            if (qb + 1 < nqb) {
                const int q1 = q0 + FM_BWD_B;
                fm_tile_async<FM_BWD_B, FM_BWD_THREADS>(Qs, base + (size_t)q1 * C3, C3, T - q1);
                fm_tile_async<FM_BWD_B, FM_BWD_THREADS>(dOs, dbase + (size_t)q1 * C, (size_t)C, T - q1);
                m16_cp_commit();
            }
        }

        // dQ for queries q0 + 16·warp.. = dS·K: A = dS from dSᵀ (transposed
        // read), B = K (k = keys, n = d: read transposed).
        float dq[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++)
            dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            uint32_t sa[4];
            fm_ldm_p2<true>(sa, dSs + kk * 16 * FM_LD + warp * 16, lane);
            fm_mma_x64<E>(dq, sa, Ks, kk, lane);
        }
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int q = q0 + warp * 16 + g + 8 * hr;
            if (q >= T)
                continue;
            float *gq = qbase + (size_t)q * qp + 2 * c;
#pragma unroll
            for (int j = 0; j < 8; j++)
                m16_atomic_add2(gq + 8 * j, scale * dq[j][2 * hr], scale * dq[j][2 * hr + 1]);
        }
    }

    // dK and dV of this CTA's keys: no other CTA writes them.
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int kr = key[hr];
        if (kr >= T)
            continue;
        S *gk = gbase + (size_t)kr * C3 + C + 2 * c, *gv = gk + C;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float2 a = make_float2(0.0f, 0.0f), v = a;
            if constexpr (std::is_same_v<S, float>) {
                if (acc) {
                    a = *reinterpret_cast<float2 *>(gk + 8 * j);
                    v = *reinterpret_cast<float2 *>(gv + 8 * j);
                }
            }
            a.x += scale * dk[j][2 * hr];
            a.y += scale * dk[j][2 * hr + 1];
            v.x += dv[j][2 * hr];
            v.y += dv[j][2 * hr + 1];
            kc_store2(gk + 8 * j, a.x, a.y);
            kc_store2(gv + 8 * j, v.x, v.y);
        }
    }
}

// ---- host side ------------------------------------------------------------------------------
// (Not under emulation: the test launches the kernels itself, with emu_launch.)
#ifndef GRADD_CUDA_EMU

template <class E, class S, class O>
static void fm_launch_forward(kern_ctx *k, O *out, float *lse, const S *inp, int B, int T, int C, int NH)
{
    dim3 grid = kc_attn_grid(B, T, NH, FM_FWD_BR);
    fm_forward<E, S, O><<<grid, FM_FWD_THREADS, 0, k->stream>>>(out, lse, inp, T, C, NH,
                                                                1.44269504088896341f / sqrtf((float)FM_HS));
    kc_launched(k, "fused attention forward (mma)");
}

template <class E, class S>
static void fm_launch_backward(kern_ctx *k, S *dkv, float *dq, int qp, const S *dout, const float *lse,
                               const float *D, const S *inp, int B, int T, int C, int NH)
{
    dim3 grid = kc_attn_grid(B, T, NH, FM_BWD_B);
    // fp32 inp: the op adds into dinp (kernels.h); 16-bit: it overwrites.
    fm_backward<E, S><<<grid, FM_BWD_THREADS, 0, k->stream>>>(dkv, dq, qp, dout, lse, D, inp, T, C, NH,
                                                                 1.0f / sqrtf((float)FM_HS),
                                                                 std::is_same_v<S, float>);
    kc_launched(k, "fused attention backward (mma)");
}

// fp32 inp and out, or (the 16-bit path) inp16 and out16 in the context's
// 16-bit type: the other pair NULL.
void kc_flash_mma_forward(kern_ctx *k, float *out, uint16_t *out16, float *lse, const float *inp,
                          const uint16_t *inp16, int B, int T, int C, int NH)
{
    kc_with16(k->prec == KERN_BF16, [&]<class E>() {
        if (inp16)
            fm_launch_forward<E>(k, reinterpret_cast<E *>(out16), lse, reinterpret_cast<const E *>(inp16), B, T, C,
                                 NH);
        else
            fm_launch_forward<E>(k, out, lse, inp, B, T, C, NH);
    });
}

// fp32: dinp (+=), dout, inp.  16-bit: dinp16 (dk, dv written), dq (dq
// summed, zeroed by the caller), dout16, inp16.  The other set NULL.
void kc_flash_mma_backward(kern_ctx *k, float *dinp, uint16_t *dinp16, float *dq, const float *dout,
                           const uint16_t *dout16, const float *lse, const float *D, const float *inp,
                           const uint16_t *inp16, int B, int T, int C, int NH)
{
    kc_with16(k->prec == KERN_BF16, [&]<class E>() {
        if (inp16)
            fm_launch_backward<E>(k, reinterpret_cast<E *>(dinp16), dq, C, reinterpret_cast<const E *>(dout16), lse,
                                  D, reinterpret_cast<const E *>(inp16), B, T, C, NH);
        else
            fm_launch_backward<E>(k, dinp, dinp, 3 * C, dout, lse, D, inp, B, T, C, NH);
    });
}
#endif // !GRADD_CUDA_EMU
