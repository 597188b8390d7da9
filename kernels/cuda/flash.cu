// flash.cu — fused causal attention for 16-bit contexts: the (B,NH,T,T)
// score and probability matrices are never stored.
//
// Why: the materialised attention (attention.cu) writes and reads four
// (B,NH,T,T) fp32 buffers per layer and step; at GPT-2 size (B=16, T=1024,
// NH=12) that is 0.8 GB each, about a third of a step's time in memory
// traffic and most of its activation memory.  This is the FlashAttention-2
// scheme: forward keeps a running max and sum per query row (online softmax)
// and saves only each row's log-sum-exp; backward recomputes the
// probabilities block by block from it.
//
// Shape: head size 64 (GPT-2's), T up to 65535 blocks of 64 (the grid's y;
// kc_attn_grid), any B·NH.  Q·Kᵀ, P·V and the four backward products run on
// the tensor cores through WMMA (16×16×16 tiles, bf16 or fp16 inputs as the
// context's precision says, fp32 accumulate); softmax, masking and the
// running statistics are fp32.
// Inputs and outputs stay fp32 like every other op; tiles are converted to
// 16 bits as they are staged into shared memory.
//
// Blocks: 64 queries × 64 keys, four warps, each warp owning 16 rows.
// Forward: one CTA per (query block, b·h), key blocks 0..its own (causal).
// Backward: one CTA per (key block, b·h), query blocks from its own to the
// last; dK and dV accumulate in registers, dQ goes to global memory with
// atomicAdd (so dQ's summation order, unlike the rest, is not fixed).
#include <limits.h>
#include <math.h>
#include <type_traits>

#ifdef GRADD_CUDA_EMU
// tests/emu: the kernels compiled by a host compiler and run on the CPU
// (kern_cuda.cuh brings cuda_emu.h, WMMA included); the host side is not.
#define FA_DYNAMIC_SMEM(name) unsigned char *name = emu_dynamic_smem()
#else
#include <mma.h>

#define FA_DYNAMIC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#endif
#include "kern_cuda.cuh"
#include "tile16.cuh"

using namespace nvcuda;

#define FA_HS 64
#define FA_B 64                   // queries and keys per block
#define FA_THREADS 128            // four warps of 16 rows
#define FA_LD (FA_HS + 8)         // 16-bit tile pitch: +16 bytes against bank conflicts
#define FA_FLD (FA_B + 4)         // fp32 tile pitch

template <class E> __device__ __forceinline__ E fa_from(float x);
template <> __device__ __forceinline__ __nv_bfloat16 fa_from<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half fa_from<__half>(float x) { return __float2half(x); }
__device__ __forceinline__ float fa_to(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float fa_to(__half x) { return __half2float(x); }

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> fa_acc;

// acc += A·B for one 16×16 output tile over a depth of 64 (FA_HS or FA_B):
// four 16-deep steps.  Every 16-bit tile in shared memory has pitch FA_LD;
// a and b point at the operand's first element, and AL/BL say how it is
// laid out, which fixes how far one step moves (16 columns of a row-major
// A, 16 rows of a column-major one; the other way round for B).
template <class AL, class BL, class E>
__device__ __forceinline__ void fa_mma64(fa_acc &acc, const E *a, const E *b)
{
    constexpr int as = std::is_same_v<AL, wmma::row_major> ? 16 : 16 * FA_LD;
    constexpr int bs = std::is_same_v<BL, wmma::row_major> ? 16 * FA_LD : 16;
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, E, AL> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, E, BL> fb;
        wmma::load_matrix_sync(fa, a + kk * as, FA_LD);
        wmma::load_matrix_sync(fb, b + kk * bs, FA_LD);
        wmma::mma_sync(acc, fa, fb, acc);
    }
}

// dst (fp32, pitch FA_FLD) = A·B for one 16×16 tile, as fa_mma64.
template <class AL, class BL, class E>
__device__ __forceinline__ void fa_mma64_store(float *dst, const E *a, const E *b)
{
    fa_acc acc;
    wmma::fill_fragment(acc, 0.0f);
    fa_mma64<AL, BL>(acc, a, b);
    wmma::store_matrix_sync(dst, acc, FA_FLD, wmma::mem_row_major);
}

using fa_row = wmma::row_major;
using fa_col = wmma::col_major;

// Stage two 64-row tiles (tile16.cuh): every load of both is issued before
// the first store.  S0, S1: their sources' element types.
template <class E, class S0, class S1>
__device__ __forceinline__ void fa_stage2(E *dst0, const S0 *src0, size_t pitch0, E *dst1, const S1 *src1,
                                          size_t pitch1, int rows)
{
    kc_tile_regs<FA_B, FA_THREADS, S0> t0;
    kc_tile_regs<FA_B, FA_THREADS, S1> t1;
    kc_tile_load(t0, src0, pitch0, rows);
    kc_tile_load(t1, src1, pitch1, rows);
    kc_tile_store<E, FA_LD>(dst0, t0);
    kc_tile_store<E, FA_LD>(dst1, t1);
}

// Shared memory of the forward kernel, in bytes (all parts 128-byte multiples).
template <class E> static constexpr size_t fa_fwd_smem()
{
    return 4 * FA_B * FA_LD * sizeof(E) + 2 * FA_B * FA_FLD * sizeof(float) + 2 * FA_B * sizeof(float);
}

// out (B,T,C) = softmax(scale·Q·Kᵀ, causal)·V per head; lse (B,NH,T).
// S: the element type of inp, O of out: fp32 or E.
template <class E, class S, class O>
__global__ __launch_bounds__(FA_THREADS) void fa_forward(O *__restrict__ out, float *__restrict__ lse,
                                                         const S *__restrict__ inp, int T, int C, int NH,
                                                         float scale)
{
    FA_DYNAMIC_SMEM(fa_smem);
    E *Qs = reinterpret_cast<E *>(fa_smem);
    E *Ks = Qs + FA_B * FA_LD;
    E *Vs = Ks + FA_B * FA_LD;
    E *Ps = Vs + FA_B * FA_LD;
    float *Ss = reinterpret_cast<float *>(Ps + FA_B * FA_LD); // scores, then P·V of the block
    float *Os = Ss + FA_B * FA_FLD;                           // running output (unnormalised)
    float *Ms = Os + FA_B * FA_FLD;                           // running max per row
    float *Ls = Ms + FA_B;                                    // running sum per row

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int qb = gridDim.y - 1 - blockIdx.y; // the longest rows first (kc_attn_grid)
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = qb * FA_B;
    const size_t C3 = 3 * (size_t)C;
    const S *base = inp + (size_t)b * T * C3 + (size_t)h * FA_HS;

    // Q once (its second tile slot stages into Ps, overwritten before use).
    fa_stage2<E>(Qs, base + (size_t)q0 * C3, C3, Ps, base + (size_t)q0 * C3, C3, T - q0);
    for (int i = threadIdx.x; i < FA_B * FA_FLD; i += FA_THREADS)
        Os[i] = 0.0f;
    if (threadIdx.x < FA_B) {
        Ms[threadIdx.x] = -INFINITY;
        Ls[threadIdx.x] = 0.0f;
    }

    // Two lanes per row: row r of this warp's 16, columns c0..c0+31.
    const int r = warp * 16 + (lane >> 1), c0 = (lane & 1) * 32, t = q0 + r;
    // Lane pairs walk their 32 columns rotated by 5·row + 16·half (mod 32
    // banks, with the fp32 pitch ≡ 4): the warp's 32 accesses of each step
    // then fall in 32 different banks.
    const int rot = r + 16 * (lane & 1);
    float *srow = Ss + r * FA_FLD, *orow = Os + r * FA_FLD;

    for (int kb = 0; kb <= qb; kb++) {
        const int k0 = kb * FA_B;
        __syncthreads(); // the previous block's K, V are no longer read
        fa_stage2<E>(Ks, base + C + (size_t)k0 * C3, C3, Vs, base + 2 * (size_t)C + (size_t)k0 * C3, C3, T - k0);
        __syncthreads();

#pragma unroll
        for (int j = 0; j < 4; j++) // S = Q·Kᵀ, 16 keys at a time
            fa_mma64_store<fa_row, fa_col>(Ss + warp * 16 * FA_FLD + j * 16, Qs + warp * 16 * FA_LD,
                                           Ks + j * 16 * FA_LD);
        __syncwarp();

        // Online softmax over this block's keys.
        float mx = -INFINITY;
#pragma unroll
        for (int c = 0; c < 32; c++) {
            const int cx = c0 + ((c + rot) & 31);
            int key = k0 + cx;
            float v = key <= t && key < T ? srow[cx] * scale : -INFINITY;
            srow[cx] = v;
            mx = fmaxf(mx, v);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        const float m_old = Ms[r], m_new = fmaxf(m_old, mx);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new; // rows past T: everything masked
        float sum = 0.0f;
#pragma unroll
        for (int c = 0; c < 32; c++) {
            const int cx = c0 + ((c + rot) & 31);
            float p = __expf(srow[cx] - m_use);
            Ps[r * FA_LD + cx] = fa_from<E>(p);
            sum += p;
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        const float alpha = __expf(m_old - m_use);
        __syncwarp(); // both lanes of the row have read Ms[r]
        if ((lane & 1) == 0) {
            Ms[r] = m_new;
            Ls[r] = Ls[r] * alpha + sum;
        }
#pragma unroll
        for (int c = 0; c < 32; c++) {
            const int cx = c0 + ((c + rot) & 31);
            orow[cx] *= alpha;
        }
        __syncwarp();

#pragma unroll
        for (int j = 0; j < 4; j++) // P·V, 16 output dimensions at a time, into Ss
            fa_mma64_store<fa_row, fa_row>(Ss + warp * 16 * FA_FLD + j * 16, Ps + warp * 16 * FA_LD, Vs + j * 16);
        __syncwarp();
#pragma unroll
        for (int c = 0; c < 32; c++) {
            const int cx = c0 + ((c + rot) & 31);
            orow[cx] += srow[cx];
        }
        __syncwarp();
    }

    if (t < T) {
        const float l = Ls[r], inv = 1.0f / l;
        O *o = out + ((size_t)b * T + t) * C + (size_t)h * FA_HS + c0;
#pragma unroll
        for (int c = 0; c < 32; c += 4)
            kc_store4(o + c, orow[c0 + c] * inv, orow[c0 + c + 1] * inv, orow[c0 + c + 2] * inv,
                      orow[c0 + c + 3] * inv);
        if ((lane & 1) == 0)
            lse[(size_t)bh * T + t] = Ms[r] + logf(l);
    }
}

// D (B,NH,T) = Σ_d dout·out over each head's row: the softmax backward's
// row term, computed once instead of once per key block.  One warp per row.
// S: dout's and out's element type (fp32, or 16 bits, widened exactly).
template <class S>
__global__ static void fa_rowdot(float *__restrict__ D, const S *__restrict__ dout, const S *__restrict__ out,
                                 size_t rows, int T, int C, int NH)
{
    size_t w = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    for (; w < rows; w += ((size_t)gridDim.x * blockDim.x) >> 5) {
        size_t bh = w / T;
        int t = (int)(w % T), b = (int)(bh / NH), h = (int)(bh % NH);
        size_t o = ((size_t)b * T + t) * C + (size_t)h * FA_HS;
        float s = kc_widen(dout[o + lane]) * kc_widen(out[o + lane]) +
                  kc_widen(dout[o + lane + 32]) * kc_widen(out[o + lane + 32]);
        s = kc_warp_sum(s);
        if (lane == 0)
            D[w] = s;
    }
}

template <class E> static constexpr size_t fa_bwd_smem()
{
    return 6 * FA_B * FA_LD * sizeof(E) + FA_B * FA_FLD * sizeof(float) + 2 * FA_B * sizeof(float);
}

// The gradients of q, k, v.  S, the element type of inp, dout and dkv: fp32
// or E.  dk and dv go to dkv (B,T,3C: k at +C, v at +2C): with acc added
// into it (fp32 only), else overwriting it.  dq is summed by atomics into
// the fp32 dqg, rows qp apart (zeroed by the caller): dkv itself (qp = 3C)
// when S is fp32, or a (B,T,C) scratch (qp = C) that the caller rounds
// into dkv afterwards.  (No __restrict__ on the two: in the fp32 case they
// are the same buffer, written in disjoint columns.)
// Three CTAs per SM (12 warps), as the forward: at two, the backward sat
// mostly idle waiting on shared memory (measured with ncu on the H100: 255
// registers, 12.5% occupancy).
template <class E, class S>
__global__ __launch_bounds__(FA_THREADS, 3) void fa_backward(S *dkv, float *dqg, int qp,
                                                          const S *__restrict__ dout,
                                                          const float *__restrict__ lse, const float *__restrict__ D,
                                                          const S *__restrict__ inp, int T, int C, int NH,
                                                          float scale, bool acc)
{
    FA_DYNAMIC_SMEM(fa_smem);
    E *Ks = reinterpret_cast<E *>(fa_smem);
    E *Vs = Ks + FA_B * FA_LD;
    E *Qs = Vs + FA_B * FA_LD;
    E *dOs = Qs + FA_B * FA_LD;
    E *PT = dOs + FA_B * FA_LD;  // Pᵀ (keys × queries)
    E *dST = PT + FA_B * FA_LD;  // dSᵀ (keys × queries)
    float *St = reinterpret_cast<float *>(dST + FA_B * FA_LD); // Sᵀ, dPᵀ, then dQ and dK/dV staging
    float *Lq = St + FA_B * FA_FLD;
    float *Dq = Lq + FA_B;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kb = blockIdx.y, nqb = (T + FA_B - 1) / FA_B; // key block 0, the longest, first (kc_attn_grid)
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int k0 = kb * FA_B;
    const size_t C3 = 3 * (size_t)C;
    const S *base = inp + (size_t)b * T * C3 + (size_t)h * FA_HS;
    const S *dbase = dout + (size_t)b * T * C + (size_t)h * FA_HS;
    S *gbase = dkv + (size_t)b * T * C3 + (size_t)h * FA_HS;
    float *qbase = dqg + (size_t)b * T * qp + (size_t)h * FA_HS;

    fa_stage2<E>(Ks, base + C + (size_t)k0 * C3, C3, Vs, base + 2 * (size_t)C + (size_t)k0 * C3, C3, T - k0);

    fa_acc dK[4], dV[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        wmma::fill_fragment(dK[j], 0.0f);
        wmma::fill_fragment(dV[j], 0.0f);
    }

    // Two lanes per key row of this warp's 16: row r, queries c0..c0+31.
    const int r = warp * 16 + (lane >> 1), c0 = (lane & 1) * 32, key = k0 + r;
    const int rot = r + 16 * (lane & 1); // as in the forward: conflict-free column walk
    float *strow = St + r * FA_FLD;
    float *wst = St + warp * 16 * FA_FLD; // this warp's 16 rows of St

    for (int qb = kb; qb < nqb; qb++) {
        const int q0 = qb * FA_B;
        __syncthreads(); // Qs, dOs, dST of the previous block are no longer read
        fa_stage2<E>(Qs, base + (size_t)q0 * C3, C3, dOs, dbase + (size_t)q0 * C, C, T - q0);
        if (threadIdx.x < FA_B) {
            int q = q0 + threadIdx.x;
            Lq[threadIdx.x] = q < T ? lse[(size_t)bh * T + q] : 0.0f;
            Dq[threadIdx.x] = q < T ? D[(size_t)bh * T + q] : 0.0f;
        }
        __syncthreads();

#pragma unroll
        for (int j = 0; j < 4; j++) // Sᵀ = K·Qᵀ
            fa_mma64_store<fa_row, fa_col>(wst + j * 16, Ks + warp * 16 * FA_LD, Qs + j * 16 * FA_LD);
        __syncwarp();

#pragma unroll
        for (int c = 0; c < 32; c++) {
            const int cx = c0 + ((c + rot) & 31);
            int q = q0 + cx;
            float p = q >= key && q < T && key < T ? __expf(strow[cx] * scale - Lq[cx]) : 0.0f;
            PT[r * FA_LD + cx] = fa_from<E>(p);
        }
        __syncwarp();

#pragma unroll
        for (int j = 0; j < 4; j++) // dV += Pᵀ·dO
            fa_mma64<fa_row, fa_row>(dV[j], PT + warp * 16 * FA_LD, dOs + j * 16);
#pragma unroll
        for (int j = 0; j < 4; j++) // dPᵀ = V·dOᵀ, over Sᵀ
            fa_mma64_store<fa_row, fa_col>(wst + j * 16, Vs + warp * 16 * FA_LD, dOs + j * 16 * FA_LD);
        __syncwarp();
#pragma unroll
        for (int c = 0; c < 32; c++) { // dSᵀ = Pᵀ ⊙ (dPᵀ − D)
            const int cx = c0 + ((c + rot) & 31);
            // P from its 16-bit copy (the one dV used): keeping 32 fp32
            // values per lane across the GEMMs cost the registers for a
            // third CTA.
            dST[r * FA_LD + cx] = fa_from<E>(fa_to(PT[r * FA_LD + cx]) * (strow[cx] - Dq[cx]));
        }
        __syncthreads(); // every warp's dSᵀ rows are in place for dQ

#pragma unroll
        for (int j = 0; j < 4; j++) // dK += dSᵀ·Q
            fa_mma64<fa_row, fa_row>(dK[j], dST + warp * 16 * FA_LD, Qs + j * 16);
        // dQ rows warp·16.. (queries) = dS·K = (dSᵀ)ᵀ·K: dSᵀ read column-major.
#pragma unroll
        for (int j = 0; j < 4; j++)
            fa_mma64_store<fa_col, fa_row>(wst + j * 16, dST + warp * 16, Ks + j * 16);
        __syncwarp();
        for (int i = 0; i < 16; i++) {
            int q = q0 + warp * 16 + i;
            if (q < T) {
                float *g = qbase + (size_t)q * qp;
                atomicAdd(g + lane, scale * wst[i * FA_FLD + lane]);
                atomicAdd(g + lane + 32, scale * wst[i * FA_FLD + lane + 32]);
            }
        }
    }

    // dK and dV of this CTA's keys: no other CTA writes them.
    __syncthreads();
    for (int part = 1; part <= 2; part++) {
#pragma unroll
        for (int j = 0; j < 4; j++)
            wmma::store_matrix_sync(wst + j * 16, part == 1 ? dK[j] : dV[j], FA_FLD, wmma::mem_row_major);
        __syncwarp();
        const float f = part == 1 ? scale : 1.0f;
        for (int i = 0; i < 16; i++) {
            int kr = k0 + warp * 16 + i;
            if (kr < T) { // two adjacent columns per lane
                S *g = gbase + (size_t)kr * C3 + (size_t)part * C + 2 * lane;
                float x = f * wst[i * FA_FLD + 2 * lane], y = f * wst[i * FA_FLD + 2 * lane + 1];
                if constexpr (std::is_same_v<S, float>) {
                    if (acc) {
                        x = g[0] + x;
                        y = g[1] + y;
                    }
                }
                kc_store2(g, x, y);
            }
        }
        __syncwarp();
    }
}

// ---- host side -------------------------------------------------------------------------
#ifndef GRADD_CUDA_EMU

bool kc_attention_fused_ok(kern_ctx *k, int C, int NH)
{
    return k->prec != KERN_FP32 && NH > 0 && C % NH == 0 && C / NH == FA_HS;
}

// The shape, and every pointer 16-byte aligned (float4 accesses, and the
// mma kernels' 16-byte cp.async copies of 16-bit tiles; NULL passes, so the
// fp32 and the 16-bit set of an op are given together).
template <class... P> static bool fa_check(kern_ctx *k, int B, int T, int C, int NH, const char *what, const P *...p)
{
    if (B <= 0 || T <= 0)
        return false;
    if (!kc_attention_fused_ok(k, C, NH) || (size_t)B * NH > INT_MAX || (T + FA_B - 1) / FA_B > 65535) {
        kc_ok(k, cudaErrorInvalidValue, what);
        return false;
    }
    if (!kc_aligned(16, p...)) {
        kc_ok(k, cudaErrorMisalignedAddress, what);
        return false;
    }
    return true;
}

template <class E, class S, class O>
static void fa_launch_forward(kern_ctx *k, O *out, float *lse, const S *inp, int B, int T, int C, int NH)
{
    constexpr size_t smem = fa_fwd_smem<E>();
    if (!kc_ok(k, cudaFuncSetAttribute(fa_forward<E, S, O>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
               "fused attention forward: shared memory"))
        return;
    dim3 grid = kc_attn_grid(B, T, NH, FA_B);
    fa_forward<E, S, O><<<grid, FA_THREADS, smem, k->stream>>>(out, lse, inp, T, C, NH, 1.0f / sqrtf((float)FA_HS));
    kc_launched(k, "fused attention forward");
}

template <class E, class S>
static void fa_launch_backward(kern_ctx *k, S *dkv, float *dq, int qp, const S *dout, const float *lse,
                               const float *D, const S *inp, int B, int T, int C, int NH)
{
    constexpr size_t smem = fa_bwd_smem<E>();
    if (!kc_ok(k, cudaFuncSetAttribute(fa_backward<E, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
               "fused attention backward: shared memory"))
        return;
    dim3 grid = kc_attn_grid(B, T, NH, FA_B);
    // fp32 inp: the op adds into dinp (kernels.h); 16-bit: it overwrites.
    fa_backward<E, S><<<grid, FA_THREADS, smem, k->stream>>>(dkv, dq, qp, dout, lse, D, inp, T, C, NH,
                                                                1.0f / sqrtf((float)FA_HS), std::is_same_v<S, float>);
    kc_launched(k, "fused attention backward");
}

// fp32 inp and out, or inp16 and out16 in the context's 16-bit type (the
// other pair NULL).
static void fa_forward_any(kern_ctx *k, float *out, uint16_t *out16, float *lse, const float *inp,
                           const uint16_t *inp16, int B, int T, int C, int NH)
{
    const char *what = "fused attention forward: unsupported shape or alignment";
    if (!fa_check(k, B, T, C, NH, what, out, out16, inp, inp16))
        return;
    kc_enter(k);
    if (k->flash_mma) {
        kc_flash_mma_forward(k, out, out16, lse, inp, inp16, B, T, C, NH);
        return;
    }
    kc_with16(k->prec == KERN_BF16, [&]<class E>() {
        if (inp16)
            fa_launch_forward<E>(k, reinterpret_cast<E *>(out16), lse, reinterpret_cast<const E *>(inp16), B, T, C,
                                 NH);
        else
            fa_launch_forward<E>(k, out, lse, inp, B, T, C, NH);
    });
}

#endif // !GRADD_CUDA_EMU (fa_dq_round runs under tests/emu too)

// dinp16's q columns (B,T,3C) = dq (B,T,C) rounded, four values a thread
// (C is a multiple of 64).
template <class E>
__global__ static void fa_dq_round(uint16_t *__restrict__ dinp16, const float *__restrict__ dq, size_t rows, int C)
{
    size_t quads = rows * (size_t)(C / 4);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < quads; i += (size_t)gridDim.x * blockDim.x) {
        size_t row = i / (C / 4), c = i % (C / 4) * 4;
        kc_fv<4> v = kc_ld<4>(dq + row * C + c);
        kc_stE<E, 4>(reinterpret_cast<E *>(dinp16) + row * 3 * C + c, v);
    }
}

#ifndef GRADD_CUDA_EMU

// fp32: dinp (+=), dout, out, inp.  16-bit: dinp16 (overwritten), dq (a
// (B,T,C) fp32 scratch of the caller's), dout16, out16, inp16.  The other
// set NULL.
static void fa_backward_any(kern_ctx *k, float *dinp, uint16_t *dinp16, float *dq, const float *dout,
                            const uint16_t *dout16, const float *out, const uint16_t *out16, const float *lse,
                            const float *inp, const uint16_t *inp16, int B, int T, int C, int NH)
{
    const char *what = "fused attention backward: unsupported shape or alignment";
    if (!fa_check(k, B, T, C, NH, what, dinp, dinp16, dq, dout, dout16, out, out16, inp, inp16))
        return;
    kc_enter(k);
    size_t rows = (size_t)B * NH * T, BT = (size_t)B * T;
    float *D = (float *)kc_scratch(k, rows * sizeof(float));
    if (!D)
        return;
    kc_with16(k->prec == KERN_BF16, [&]<class E>() {
        unsigned grid = kc_grid(k, rows * 32, 256);
        if (inp16)
            fa_rowdot<<<grid, 256, 0, k->stream>>>(D, reinterpret_cast<const E *>(dout16),
                                                    reinterpret_cast<const E *>(out16), rows, T, C, NH);
        else
            fa_rowdot<<<grid, 256, 0, k->stream>>>(D, dout, out, rows, T, C, NH);
        kc_launched(k, "fused attention backward: row dot");
        if (inp16) // dk and dv are written by the kernels; dq summed into zeros, then rounded into dinp16
            kc_ok(k, cudaMemsetAsync(dq, 0, BT * C * sizeof(float), k->stream), "fused attention backward: zero dq");
        if (k->flash_mma)
            kc_flash_mma_backward(k, dinp, dinp16, dq, dout, dout16, lse, D, inp, inp16, B, T, C, NH);
        else if (inp16)
            fa_launch_backward<E>(k, reinterpret_cast<E *>(dinp16), dq, C, reinterpret_cast<const E *>(dout16), lse,
                                  D, reinterpret_cast<const E *>(inp16), B, T, C, NH);
        else
            fa_launch_backward<E>(k, dinp, dinp, 3 * C, dout, lse, D, inp, B, T, C, NH);
        if (inp16) {
            fa_dq_round<E><<<kc_grid(k, BT * C / 4, 256), 256, 0, k->stream>>>(dinp16, dq, BT, C);
            kc_launched(k, "fused attention backward: dq");
        }
    });
}

void kc_attention_fused_forward(kern_ctx *k, float *out, float *lse, const float *inp, int B, int T, int C, int NH)
{
    fa_forward_any(k, out, NULL, lse, inp, NULL, B, T, C, NH);
}

void kc_attention_fused_backward(kern_ctx *k, float *dinp, const float *dout, const float *out, const float *lse,
                                 const float *inp, int B, int T, int C, int NH)
{
    fa_backward_any(k, dinp, NULL, NULL, dout, NULL, out, NULL, lse, inp, NULL, B, T, C, NH);
}

void kc_attention_fused_forward16(kern_ctx *k, uint16_t *out16, float *lse, const uint16_t *inp16, int B, int T,
                                  int C, int NH)
{
    fa_forward_any(k, NULL, out16, lse, NULL, inp16, B, T, C, NH);
}

void kc_attention_fused_backward16(kern_ctx *k, uint16_t *dinp16, float *dq, const uint16_t *dout16,
                                   const uint16_t *out16, const float *lse, const uint16_t *inp16, int B, int T, int C,
                                   int NH)
{
    fa_backward_any(k, NULL, dinp16, dq, NULL, dout16, NULL, out16, lse, NULL, inp16, B, T, C, NH);
}
#endif // !GRADD_CUDA_EMU
