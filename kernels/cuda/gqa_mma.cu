// gqa_mma.cu — fused causal grouped-query attention (Llama) on the tensor
// cores: gqa.cu's interface (fp32 qkv in, fp32 out and lse; packed samples'
// start masking; query head h reads key/value head h / (NH/KVH)) with
// flash_mma.cu's scheme: the tiles converted to the context's 16-bit type
// in shared memory, multiplied with mma.sync m16n8k16, and the score,
// probability and gradient tiles kept in registers.  For 16-bit contexts
// only: the operands are rounded to bf16 or fp16 like every GEMM input
// there, where gqa.cu stays in fp32 on the CUDA cores.
//
// Head sizes 64 and 128, as templates: the tiles are HS + 8 values apart
// (rows 16 bytes apart in the banks), and HS = 128 takes half the rows per
// CTA so that the tiles stay in the 48 KB of static shared memory.
//   forward:  BR queries per CTA (a 16-row band per warp), BC keys a step;
//   backward: B keys per CTA (a band of Sᵀ per warp), B queries a step, over
//             every query head of the key/value head's group, so that dK
//             and dV stay in registers and are written once; dQ is summed
//             with atomics into dqkv's query columns (zeroed first), as
//             flash_mma.cu sums its dQ.
// Masking: key j is seen by query t when start[t] <= j <= t (start NULL:
// 0).  Blocks wholly before a band's samples or after its queries are
// skipped; the others mask element by element.
#include <math.h>

#ifdef GRADD_CUDA_EMU
#include "cuda_emu.h"
#else
#include "kern_cuda.cuh"
#endif
#include "tile16.cuh"
#include "mma16.cuh"

// The tile shapes of head size HS.
template <int HS> struct gm_shape {
    static_assert(HS == 64 || HS == 128, "head sizes 64 and 128");
    static constexpr int LD = HS + 8;
    static constexpr int BR = HS == 64 ? 128 : 64; // forward: queries per CTA
    static constexpr int BC = HS == 64 ? 64 : 32;  // forward: keys per step
    static constexpr int FWD_THREADS = BR / 16 * 32;
    static constexpr int B = HS == 64 ? 64 : 32; // backward: keys per CTA, queries per step
    static constexpr int BWD_THREADS = B / 16 * 32;
    static constexpr int LDS = B + 8; // backward: the dSᵀ tile's pitch
    // CTAs per SM the register budget is cut for (flash_mma.cu's at 64).
    static constexpr int FWD_MIN_CTAS = HS == 64 ? 2 : 1;
    static constexpr int BWD_MIN_CTAS = HS == 64 ? 3 : 1;
};

// ROWS × HS values of fp32 (row r at src + r·pitch; rows at or past `rows`
// zeros) into dst[r·LD ..] as E, by THREADS threads: HS / 64 tiles of 64
// columns, all loaded before any is stored (tile16.cuh).
template <class E, int HS, int LD, int ROWS, int THREADS>
__device__ __forceinline__ void gm_stage(E *dst, const float *src, size_t pitch, int rows)
{
    kc_tile_regs<ROWS, THREADS, float> t[HS / 64];
#pragma unroll
    for (int h = 0; h < HS / 64; h++)
        kc_tile_load(t[h], src + 64 * h, pitch, rows);
#pragma unroll
    for (int h = 0; h < HS / 64; h++)
        kc_tile_store<E, LD>(dst + 64 * h, t[h]);
}

// flash_mma.cu's two ldmatrix address patterns, for a pitch of LD.
template <bool TRANS, int LD, class E> __device__ __forceinline__ void gm_ldm_p1(uint32_t (&r)[4], const E *s, int lane)
{
    m16_ldm<TRANS>(r, s + (lane & 15) * LD + (lane >> 4) * 8);
}

template <bool TRANS, int LD, class E> __device__ __forceinline__ void gm_ldm_p2(uint32_t (&r)[4], const E *s, int lane)
{
    m16_ldm<TRANS>(r, s + ((lane & 7) + (lane >> 4) * 8) * LD + ((lane >> 3) & 1) * 8);
}

// acc (16 × N: N/8 tiles) += A · X[16·kk ..][0..N): X row-major, pitch LD,
// read transposed as the B operand.
template <class E, int N, int LD>
__device__ __forceinline__ void gm_mma_xn(float (&acc)[N / 8][4], const uint32_t (&a)[4], const E *X, int kk, int lane)
{
#pragma unroll
    for (int dd = 0; dd < N / 16; dd++) {
        uint32_t xf[4];
        gm_ldm_p1<true, LD>(xf, X + kk * 16 * LD + dd * 16, lane);
        m16_mma<E>(acc[2 * dd], a, xf[0], xf[1]);
        m16_mma<E>(acc[2 * dd + 1], a, xf[2], xf[3]);
    }
}

__device__ __forceinline__ int gm_start(const int32_t *start, size_t bt) { return start ? start[bt] : 0; }

// Over a warp: the least of v.
__device__ __forceinline__ int gm_warp_min(int v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// ---- forward --------------------------------------------------------------------------------

// Scores in log2 units (scale·log2 e folded in); lse back in natural units.
template <class E, int HS>
__global__ __launch_bounds__(gm_shape<HS>::FWD_THREADS, gm_shape<HS>::FWD_MIN_CTAS) void gm_forward(float *__restrict__ out,
                                                                         float *__restrict__ lse,
                                                                         const float *__restrict__ qkv,
                                                                         const int32_t *__restrict__ start, int T,
                                                                         int NH, int KVH, float scale_log2)
{
    using SH = gm_shape<HS>;
    constexpr int LD = SH::LD, BR = SH::BR, BC = SH::BC, THREADS = SH::FWD_THREADS, WARPS = THREADS / 32;
    __shared__ __align__(128) E Qs[BR * LD];
    __shared__ __align__(128) E Ks[BC * LD];
    __shared__ __align__(128) E Vs[BC * LD];
    __shared__ int first_key[WARPS];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int qb = gridDim.y - 1 - blockIdx.y; // the longest rows first (kc_attn_grid)
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH, kvh = h / (NH / KVH);
    const int q0 = qb * BR, band = q0 + warp * 16; // this warp's first query
    const size_t W = (size_t)(NH + 2 * KVH) * HS, C = (size_t)NH * HS;
    const float *rows = qkv + (size_t)b * T * W;
    const float *kbase = rows + (size_t)(NH + kvh) * HS, *vbase = rows + (size_t)(NH + KVH + kvh) * HS;

    gm_stage<E, HS, LD, BR, THREADS>(Qs, rows + (size_t)q0 * W + (size_t)h * HS, W, T - q0);
    const int row[2] = {band + g, band + g + 8};
    const int st[2] = {row[0] < T ? gm_start(start, (size_t)b * T + row[0]) : row[0],
                       row[1] < T ? gm_start(start, (size_t)b * T + row[1]) : row[1]};
    // The band's first key: the least start of its rows (rows past T count
    // as themselves); the CTA's, the least of its bands'.
    const int band_first = gm_warp_min(min(st[0], st[1]));
    if (lane == 0)
        first_key[warp] = band_first;
    __syncthreads();
    int cta_first = first_key[0];
#pragma unroll
    for (int w = 1; w < WARPS; w++)
        cta_first = min(cta_first, first_key[w]);

    float o[HS / 8][4];
#pragma unroll
    for (int j = 0; j < HS / 8; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; // rows g, g+8: running max (log2), this lane's sum

    const int last = min(q0 + BR - 1, T - 1) / BC;
    for (int kb = cta_first / BC; kb <= last; kb++) {
        const int k0 = kb * BC;
        __syncthreads(); // the previous K, V are no longer read
        gm_stage<E, HS, LD, BC, THREADS>(Ks, kbase + (size_t)k0 * W, W, T - k0);
        gm_stage<E, HS, LD, BC, THREADS>(Vs, vbase + (size_t)k0 * W, W, T - k0);
        __syncthreads();
        // Bands are 16-aligned and blocks 16-aligned: a band wholly at or
        // past k0 needs this block unless the block ends before its samples
        // begin.  A band that does not still meets every barrier.
        const bool active = k0 <= band && k0 + BC > band_first;
        if (!active)
            continue;

        float s[BC / 8][4]; // S = Q·Kᵀ for keys k0 + 8·j + 2c..
#pragma unroll
        for (int j = 0; j < BC / 8; j++)
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HS / 16; kk++) {
            uint32_t qf[4];
            gm_ldm_p1<false, LD>(qf, Qs + warp * 16 * LD + kk * 16, lane);
#pragma unroll
            for (int jj = 0; jj < BC / 16; jj++) {
                uint32_t kf[4];
                gm_ldm_p2<false, LD>(kf, Ks + jj * 16 * LD + kk * 16, lane);
                m16_mma<E>(s[2 * jj], qf, kf[0], kf[1]);
                m16_mma<E>(s[2 * jj + 1], qf, kf[2], kf[3]);
            }
        }

        // Online softmax over this block's keys, on the registers.
        const bool edge = k0 + BC - 1 > band || k0 + BC > T || start != nullptr;
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < BC / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = k0 + 8 * j + 2 * c + (e & 1), hr = e >> 1;
                float v = s[j][e] * scale_log2;
                if (edge && (key > row[hr] || key >= T || key < st[hr]))
                    v = -INFINITY;
                s[j][e] = v;
                mx[hr] = fmaxf(mx[hr], v);
            }
        float alpha[2], mu[2];
        m16_softmax_rescale(mx, m, l, mu, alpha);
#pragma unroll
        for (int j = 0; j < BC / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int hr = e >> 1;
                s[j][e] = exp2f(s[j][e] - mu[hr]);
                l[hr] += s[j][e];
            }
#pragma unroll
        for (int j = 0; j < HS / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[j][e] *= alpha[e >> 1];

        // O += P·V: P's accumulator tiles are the A operand directly.
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            uint32_t pa[4];
            m16_acc_to_a<E>(pa, s[2 * kk], s[2 * kk + 1]);
            gm_mma_xn<E, HS, LD>(o, pa, Vs, kk, lane);
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
        float *orow = out + ((size_t)b * T + t) * C + (size_t)h * HS + 2 * c;
#pragma unroll
        for (int j = 0; j < HS / 8; j++)
            kc_store2(orow + 8 * j, o[j][2 * hr] * inv, o[j][2 * hr + 1] * inv);
        if (c == 0)
            lse[(size_t)bh * T + t] = (m[hr] + log2f(l[hr])) * 0.69314718055994531f;
    }
}

// ---- backward -------------------------------------------------------------------------------

// One CTA per (key block, b·kv head); warp w owns keys k0 + 16w.. as the
// rows of Sᵀ = K·Qᵀ, over every query head of the group and every query
// block that sees its keys.  D (B,NH,T) = Σ_d dout·out per row (gqa.cu's
// gqa_dsum_kernel).  dK and dV OVERWRITE their columns of dqkv; dQ is
// ADDED by atomics into its columns, which the caller zeroed.
template <class E, int HS>
__global__ __launch_bounds__(gm_shape<HS>::BWD_THREADS, gm_shape<HS>::BWD_MIN_CTAS) void gm_backward(float *dqkv, const float *__restrict__ dout,
                                                                          const float *__restrict__ lse,
                                                                          const float *__restrict__ D,
                                                                          const float *qkv,
                                                                          const int32_t *__restrict__ start, int T,
                                                                          int NH, int KVH, float scale)
{
    using SH = gm_shape<HS>;
    constexpr int LD = SH::LD, B = SH::B, THREADS = SH::BWD_THREADS, LDS = SH::LDS;
    __shared__ __align__(128) E Ks[B * LD];
    __shared__ __align__(128) E Vs[B * LD];
    __shared__ __align__(128) E Qs[B * LD];
    __shared__ __align__(128) E dOs[B * LD];
    __shared__ __align__(128) E dSs[B * LDS]; // dSᵀ (keys × queries)
    __shared__ float Lq[B], Dq[B];            // lse·log2 e and D of the step's queries
    __shared__ int Sq[B];                     // and their starts

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int kb = blockIdx.y, nqb = (T + B - 1) / B; // key block 0, the longest, first (kc_attn_grid)
    const int bk = blockIdx.x, b = bk / KVH, kvh = bk % KVH, group = NH / KVH;
    const int k0 = kb * B;
    const size_t W = (size_t)(NH + 2 * KVH) * HS, C = (size_t)NH * HS;
    const float *rows = qkv + (size_t)b * T * W;
    float *grows = dqkv + (size_t)b * T * W;
    const float scale_log2 = scale * 1.44269504088896341f;
    const int key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8}; // rows g, g+8 of this warp's Sᵀ

    gm_stage<E, HS, LD, B, THREADS>(Ks, rows + (size_t)k0 * W + (size_t)(NH + kvh) * HS, W, T - k0);
    gm_stage<E, HS, LD, B, THREADS>(Vs, rows + (size_t)k0 * W + (size_t)(NH + KVH + kvh) * HS, W, T - k0);

    float dk[HS / 8][4], dv[HS / 8][4]; // rows g, g+8 of this warp's keys; d = 8·j + 2c..
#pragma unroll
    for (int j = 0; j < HS / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk[j][e] = dv[j][e] = 0.0f;

    for (int hh = 0; hh < group; hh++) {
        const int h = kvh * group + hh;
        const size_t bh = (size_t)b * NH + h;
        const float *qbase = rows + (size_t)h * HS, *dbase = dout + (size_t)b * T * C + (size_t)h * HS;
        // Queries before k0 see none of these keys.
        for (int qb = kb; qb < nqb; qb++) {
            const int q0 = qb * B;
            __syncthreads(); // Qs, dOs, dSs, Lq, Dq, Sq of the previous step are no longer read
            gm_stage<E, HS, LD, B, THREADS>(Qs, qbase + (size_t)q0 * W, W, T - q0);
            gm_stage<E, HS, LD, B, THREADS>(dOs, dbase + (size_t)q0 * C, C, T - q0);
            if (threadIdx.x < B) {
                const int q = q0 + threadIdx.x;
                Lq[threadIdx.x] = q < T ? lse[bh * T + q] * 1.44269504088896341f : 0.0f;
                Dq[threadIdx.x] = q < T ? D[bh * T + q] : 0.0f;
                Sq[threadIdx.x] = q < T ? gm_start(start, (size_t)b * T + q) : T;
            }
            __syncthreads();
            // Packed samples: a step whose queries all begin after this
            // CTA's keys sees none of them (alike for the whole CTA).
            if (start) {
                bool none = true;
                for (int i = 0; i < B; i++)
                    none = none && Sq[i] > k0 + B - 1;
                if (none)
                    continue;
            }

            // Sᵀ = K·Qᵀ: 16 keys × B queries (q0 + 8·j + 2c..).
            float s[B / 8][4];
#pragma unroll
            for (int j = 0; j < B / 8; j++)
                s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < HS / 16; kk++) {
                uint32_t ka[4];
                gm_ldm_p1<false, LD>(ka, Ks + warp * 16 * LD + kk * 16, lane);
#pragma unroll
                for (int jj = 0; jj < B / 16; jj++) {
                    uint32_t qf[4];
                    gm_ldm_p2<false, LD>(qf, Qs + jj * 16 * LD + kk * 16, lane);
                    m16_mma<E>(s[2 * jj], ka, qf[0], qf[1]);
                    m16_mma<E>(s[2 * jj + 1], ka, qf[2], qf[3]);
                }
            }
            // Pᵀ = exp(scale·Sᵀ − lse[q]), zero where the query does not see the key.
#pragma unroll
            for (int j = 0; j < B / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int qc = 8 * j + 2 * c + (e & 1), q = q0 + qc, kr = key[e >> 1];
                    float p = exp2f(s[j][e] * scale_log2 - Lq[qc]);
                    if (q < kr || q >= T || kr >= T || kr < Sq[qc])
                        p = 0.0f;
                    s[j][e] = p;
                }

            // dV += Pᵀ·dO.
#pragma unroll
            for (int kk = 0; kk < B / 16; kk++) {
                uint32_t pa[4];
                m16_acc_to_a<E>(pa, s[2 * kk], s[2 * kk + 1]);
                gm_mma_xn<E, HS, LD>(dv, pa, dOs, kk, lane);
            }

            // dPᵀ = V·dOᵀ, 16 queries at a time, and dSᵀ = Pᵀ ⊙ (dPᵀ − D[q]).
#pragma unroll
            for (int jj = 0; jj < B / 16; jj++) {
                float dp[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
                for (int kk = 0; kk < HS / 16; kk++) {
                    uint32_t va[4], of[4];
                    gm_ldm_p1<false, LD>(va, Vs + warp * 16 * LD + kk * 16, lane);
                    gm_ldm_p2<false, LD>(of, dOs + jj * 16 * LD + kk * 16, lane);
                    m16_mma<E>(dp[0], va, of[0], of[1]);
                    m16_mma<E>(dp[1], va, of[2], of[3]);
                }
#pragma unroll
                for (int t = 0; t < 2; t++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int j = 2 * jj + t, qc = 8 * j + 2 * c + (e & 1);
                        s[j][e] *= dp[t][e] - Dq[qc];
                    }
            }

            // dK += dSᵀ·Q, and dSᵀ to shared memory for dQ.
#pragma unroll
            for (int kk = 0; kk < B / 16; kk++) {
                uint32_t da[4];
                m16_acc_to_a<E>(da, s[2 * kk], s[2 * kk + 1]);
                gm_mma_xn<E, HS, LD>(dk, da, Qs, kk, lane);
                m16_store_a(dSs + (warp * 16 + g) * LDS + kk * 16 + 2 * c, LDS, da);
            }
            __syncthreads(); // every warp's dSᵀ rows are in place

            // dQ for queries q0 + 16·warp.. = dS·K (dS read transposed from dSᵀ).
            float dq[HS / 8][4];
#pragma unroll
            for (int j = 0; j < HS / 8; j++)
                dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < B / 16; kk++) {
                uint32_t sa[4];
                gm_ldm_p2<true, LDS>(sa, dSs + kk * 16 * LDS + warp * 16, lane);
                gm_mma_xn<E, HS, LD>(dq, sa, Ks, kk, lane);
            }
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int q = q0 + warp * 16 + g + 8 * hr;
                if (q >= T)
                    continue;
                float *gq = grows + (size_t)q * W + (size_t)h * HS + 2 * c;
#pragma unroll
                for (int j = 0; j < HS / 8; j++)
                    m16_atomic_add2(gq + 8 * j, scale * dq[j][2 * hr], scale * dq[j][2 * hr + 1]);
            }
        }
    }

    // dK and dV of this CTA's keys: no other CTA writes them.
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int kr = key[hr];
        if (kr >= T)
            continue;
        float *gk = grows + (size_t)kr * W + (size_t)(NH + kvh) * HS + 2 * c;
        float *gv = grows + (size_t)kr * W + (size_t)(NH + KVH + kvh) * HS + 2 * c;
#pragma unroll
        for (int j = 0; j < HS / 8; j++) {
            kc_store2(gk + 8 * j, scale * dk[j][2 * hr], scale * dk[j][2 * hr + 1]);
            kc_store2(gv + 8 * j, dv[j][2 * hr], dv[j][2 * hr + 1]);
        }
    }
}

// ---- host side ------------------------------------------------------------------------------
// (Not under emulation: the test launches the kernels itself, with emu_launch.)
#ifndef GRADD_CUDA_EMU

bool kc_gqa_mma_ok(kern_ctx *k, int HS)
{
    return k->gqa_mma && k->prec != KERN_FP32 && (HS == 64 || HS == 128);
}

template <int HS, class F> static void gm_with(kern_ctx *k, F &&f)
{
    kc_with16(k->prec == KERN_BF16, [&]<class E>() { f.template operator()<E, HS>(); });
}

template <class F> static void gm_with_hs(kern_ctx *k, int HS, F &&f)
{
    if (HS == 64)
        gm_with<64>(k, f);
    else
        gm_with<128>(k, f);
}

void kc_gqa_mma_forward(kern_ctx *k, float *out, float *lse, const float *qkv, const int32_t *start, int B, int T,
                        int NH, int KVH, int HS)
{
    const float scale_log2 = 1.44269504088896341f / sqrtf((float)HS);
    gm_with_hs(k, HS, [&]<class E, int H>() {
        using SH = gm_shape<H>;
        gm_forward<E, H><<<kc_attn_grid(B, T, NH, SH::BR), SH::FWD_THREADS, 0, k->stream>>>(out, lse, qkv, start, T,
                                                                                          NH, KVH, scale_log2);
    });
    kc_launched(k, "attention_gqa_forward (mma)");
}

// D: gqa_dsum_kernel's row sums, computed by the caller.
void kc_gqa_mma_backward(kern_ctx *k, float *dqkv, const float *dout, const float *lse, const float *D,
                         const float *qkv, const int32_t *start, int B, int T, int NH, int KVH, int HS)
{
    // dQ is summed into its columns: zeros first.
    const size_t W = (size_t)(NH + 2 * KVH) * HS;
    kc_ok(k, cudaMemset2DAsync(dqkv, W * sizeof(float), 0, (size_t)NH * HS * sizeof(float), (size_t)B * T, k->stream),
          "attention_gqa_backward (zero dq)");
    gm_with_hs(k, HS, [&]<class E, int H>() {
        using SH = gm_shape<H>;
        gm_backward<E, H><<<kc_attn_grid(B, T, KVH, SH::B), SH::BWD_THREADS, 0, k->stream>>>(
            dqkv, dout, lse, D, qkv, start, T, NH, KVH, 1.0f / sqrtf((float)HS));
    });
    kc_launched(k, "attention_gqa_backward (mma)");
}
#endif // !GRADD_CUDA_EMU
