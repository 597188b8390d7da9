// gqa.cu — fused causal grouped-query attention (Llama), fp32: the (T,T)
// scores are never stored.
//
// qkv (B,T,W), W = (NH + 2·KVH)·HS: each row holds NH query heads, then KVH
// key heads, then KVH value heads; query head h reads key/value head
// h / (NH/KVH).  Token t attends to keys start[t]..t (start NULL: 0..t),
// its own sample's tokens when several samples are packed in a sequence.
//
// The FlashAttention-2 scheme on CUDA cores, in fp32 throughout (inputs
// and outputs are fp32 like every op; the results stay within rounding of
// the cpu's): the forward keeps a running max and sum per query row and
// saves each row's log-sum-exp; the backward recomputes the probabilities
// from it, in two kernels that each own what they write, so that nothing
// is summed with atomics and the bits depend only on the shapes:
//   dq: one CTA per (query block, b·h), over the key tiles its rows see;
//   dk, dv: one CTA per (key block, b·kv head), over the group's query
//   heads and the query tiles that see its keys.
// Each overwrites its part of dqkv; together they cover all of it.
//
// Layout: 128 threads, four warps.  In a key tile of 32, lane j owns key j:
// it computes that key's score against each of its warp's query rows
// (read from shared memory as broadcasts, the keys' rows padded by one
// float so that the 32 lanes hit 32 banks), the warp reduces the row's max
// and sum with shuffles, and the probabilities go through shared memory to
// the product with V, where lane j owns the output elements j, j + 32, ...
// The dk/dv kernel turns this round: lane i owns query i of a tile of 32.
// Head sizes: multiples of 32 up to 128 (64 and 128 are Llama's); the
// shared memory then stays under the 48 KB a kernel may have statically.
#include <limits.h>
#include <math.h>

#include "kern_cuda.cuh"

#define GQ_THREADS 128
#define GQ_WARPS (GQ_THREADS / 32)
#define GQ_BK 32   // keys per tile (the forward and dq), queries per tile (dk/dv)
#define GQ_FWD_R 4 // query rows per warp, forward: 16 per CTA
#define GQ_DQ_R 2  // query rows per warp, dq: 8 per CTA (it also holds dout and V)
#define GQ_DKV_R 2 // keys per warp, dk/dv: 8 per CTA (it holds a query tile and its dout)

static_assert(GQ_BK == 32, "a key (or query) per lane");

__device__ __forceinline__ int gq_start(const int32_t *start, size_t bt) { return start ? start[bt] : 0; }

// The smallest start among the block's rows [q0, q1) (q0 itself when that
// is smaller); every warp computes it alike, so it is uniform over the CTA.
__device__ __forceinline__ int gq_first_key(const int32_t *start, size_t row0, int q0, int q1)
{
    if (!start)
        return 0;
    const int lane = threadIdx.x & 31;
    float s = -(float)q0; // exact: T < 2^24
    for (int t = q0 + lane; t < q1; t += 32)
        s = fmaxf(s, -(float)start[row0 + t]);
    return -(int)kc_warp_max(s);
}

// dst[r][0..HS) = row r0 + r of src (ld floats apart), zeros past T, for
// r < ROWS: the CTA stages a tile of rows into shared memory.
template <int HS, int ROWS, int P>
__device__ __forceinline__ void gq_stage(float (*dst)[P], const float *src, size_t ld, int r0, int T)
{
    for (int i = threadIdx.x; i < ROWS * HS; i += GQ_THREADS) {
        const int r = i / HS, d = i % HS, t = r0 + r;
        dst[r][d] = t < T ? src[(size_t)t * ld + d] : 0.0f;
    }
}

// s[r] += a[r]·b over HS for the R rows of a: the lane's row b (a key's, a
// query's) against the warp's rows, which every lane reads alike.
template <int HS, int R, int PA, int PB>
__device__ __forceinline__ void gq_dots(float (&s)[R], const float (*a)[PA], const float (&b)[PB])
{
    for (int d = 0; d < HS; d++) {
        const float bd = b[d];
#pragma unroll
        for (int r = 0; r < R; r++)
            s[r] += a[r][d] * bd;
    }
}

// acc[r][e] += Σ_j w[r][j]·m[j][lane + 32e] over the GQ_BK rows of m: the
// weights (probabilities, their gradients) of the warp's R rows, times a
// tile, the lane owning the output elements lane, lane + 32, ...
template <int E, int R, int P>
__device__ __forceinline__ void gq_accum(float (&acc)[R][E], const float (*w)[GQ_BK], const float (*m)[P])
{
    const int lane = threadIdx.x & 31;
    for (int j = 0; j < GQ_BK; j++) {
        float v[E];
#pragma unroll
        for (int e = 0; e < E; e++)
            v[e] = m[j][lane + 32 * e];
#pragma unroll
        for (int r = 0; r < R; r++) {
#pragma unroll
            for (int e = 0; e < E; e++)
                acc[r][e] += w[r][j] * v[e];
        }
    }
}

// Row t0 + r of dst (ld floats apart) = v[r]·mul[r] for the warp's R rows
// below T, the lane writing elements lane, lane + 32, ...
template <int E, int R>
__device__ __forceinline__ void gq_store(float *dst, size_t ld, int t0, int T, const float (&v)[R][E],
                                         const float (&mul)[R])
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (t0 + r >= T)
            continue;
#pragma unroll
        for (int e = 0; e < E; e++)
            dst[(size_t)(t0 + r) * ld + lane + 32 * e] = v[r][e] * mul[r];
    }
}

// ---- forward --------------------------------------------------------------------------
// out (B,T,NH·HS), lse (B,NH,T).  CTA (query block, b·NH + h).
template <int HS>
__global__ __launch_bounds__(GQ_THREADS) void gqa_forward_kernel(float *__restrict__ out, float *__restrict__ lse,
                                                                 const float *__restrict__ qkv,
                                                                 const int32_t *__restrict__ start, int T, int NH,
                                                                 int KVH, float scale)
{
    constexpr int E = HS / 32, R = GQ_FWD_R, BQ = GQ_WARPS * R;
    __shared__ float Qs[BQ][HS];
    __shared__ float Ks[GQ_BK][HS + 1];
    __shared__ float Vs[GQ_BK][HS];
    __shared__ float Ps[GQ_WARPS][R][GQ_BK];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int b = blockIdx.y / NH, h = blockIdx.y % NH, g = h / (NH / KVH);
    const int W = (NH + 2 * KVH) * HS, C = NH * HS;
    const int q0 = blockIdx.x * BQ, q1 = min(q0 + BQ, T);
    const size_t row0 = (size_t)b * T;
    const float *base = qkv + row0 * W;

    gq_stage<HS, BQ>(Qs, base + h * HS, W, q0, T);
    int st[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int t = q0 + warp * R + r;
        st[r] = t < T ? gq_start(start, row0 + t) : INT_MAX; // past T: no key is valid
    }
    float m[R], l[R], o[R][E];
#pragma unroll
    for (int r = 0; r < R; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++)
            o[r][e] = 0.0f;
    }

    const int kfirst = gq_first_key(start, row0, q0, q1);
    for (int k0 = kfirst / GQ_BK * GQ_BK; k0 < q1; k0 += GQ_BK) {
        __syncthreads(); // the previous tile's readers are done (and Qs is written, the first time)
        gq_stage<HS, GQ_BK>(Ks, base + (NH + g) * HS, W, k0, T);
        gq_stage<HS, GQ_BK>(Vs, base + (NH + KVH + g) * HS, W, k0, T);
        __syncthreads();
        float s[R] = {};
        gq_dots<HS>(s, Qs + warp * R, Ks[lane]);
        const int key = k0 + lane;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int t = q0 + warp * R + r;
            const bool ok = key <= t && key >= st[r];
            const float x = ok ? s[r] * scale : -INFINITY;
            const float mn = fmaxf(m[r], kc_warp_max(x));
            // A row that has seen no key yet stays as it is (mn = −inf).
            const float p = ok ? expf(x - mn) : 0.0f;
            const float corr = mn == -INFINITY ? 1.0f : expf(m[r] - mn);
            l[r] = l[r] * corr + kc_warp_sum(p);
            m[r] = mn;
#pragma unroll
            for (int e = 0; e < E; e++)
                o[r][e] *= corr;
            Ps[warp][r][lane] = p;
        }
        __syncwarp();
        gq_accum(o, Ps[warp], Vs);
    }

    float inv[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int t = q0 + warp * R + r;
        inv[r] = 1.0f / l[r];
        if (t < T && lane == 0)
            lse[(size_t)blockIdx.y * T + t] = m[r] + logf(l[r]);
    }
    gq_store(out + row0 * C + h * HS, C, q0 + warp * R, T, o, inv);
}

// ---- backward ------------------------------------------------------------------------
// Dsum (B,NH,T) = Σ dout·out over each row's head: what the softmax's
// backward subtracts (Σ_j p·dp = dout·out).  One warp per (b, t, h).
template <int HS>
__global__ __launch_bounds__(GQ_THREADS) void gqa_dsum_kernel(float *__restrict__ Dsum, const float *__restrict__ dout,
                                                              const float *__restrict__ out, int B, int T, int NH)
{
    const int lane = threadIdx.x & 31;
    const size_t rows = (size_t)B * T * NH;
    const size_t warps = (size_t)gridDim.x * GQ_WARPS;
    for (size_t w = blockIdx.x * (size_t)GQ_WARPS + (threadIdx.x >> 5); w < rows; w += warps) {
        const size_t bt = w / NH;
        const int h = (int)(w % NH);
        const float *go = dout + w * HS, *o = out + w * HS; // (b,t,h) rows are HS apart
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < HS / 32; e++)
            s += go[lane + 32 * e] * o[lane + 32 * e];
        s = kc_warp_sum(s);
        if (lane == 0) {
            const size_t b = bt / T, t = bt % T;
            Dsum[(b * NH + h) * T + t] = s;
        }
    }
}

// dq (the query heads of dqkv, overwritten) = scale·Σ_j ds_tj·k_j with
// ds = p·(dout·v − Dsum).  CTA (query block, b·NH + h).
template <int HS>
__global__ __launch_bounds__(GQ_THREADS) void gqa_dq_kernel(float *__restrict__ dqkv, const float *__restrict__ dout,
                                                            const float *__restrict__ lse,
                                                            const float *__restrict__ Dsum,
                                                            const float *__restrict__ qkv,
                                                            const int32_t *__restrict__ start, int T, int NH,
                                                            int KVH, float scale)
{
    constexpr int E = HS / 32, R = GQ_DQ_R, BQ = GQ_WARPS * R;
    __shared__ float Qs[BQ][HS];
    __shared__ float Gs[BQ][HS]; // dout rows
    __shared__ float Ks[GQ_BK][HS + 1];
    __shared__ float Vs[GQ_BK][HS + 1];
    __shared__ float Ps[GQ_WARPS][R][GQ_BK];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int b = blockIdx.y / NH, h = blockIdx.y % NH, g = h / (NH / KVH);
    const int W = (NH + 2 * KVH) * HS, C = NH * HS;
    const int q0 = blockIdx.x * BQ, q1 = min(q0 + BQ, T);
    const size_t row0 = (size_t)b * T;
    const float *base = qkv + row0 * W;

    gq_stage<HS, BQ>(Qs, base + h * HS, W, q0, T);
    gq_stage<HS, BQ>(Gs, dout + row0 * C + h * HS, C, q0, T);
    int st[R];
    float ls[R], ds[R], dq[R][E];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int t = q0 + warp * R + r;
        st[r] = t < T ? gq_start(start, row0 + t) : INT_MAX;
        ls[r] = t < T ? lse[(size_t)blockIdx.y * T + t] : 0.0f;
        ds[r] = t < T ? Dsum[(size_t)blockIdx.y * T + t] : 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++)
            dq[r][e] = 0.0f;
    }

    const int kfirst = gq_first_key(start, row0, q0, q1);
    for (int k0 = kfirst / GQ_BK * GQ_BK; k0 < q1; k0 += GQ_BK) {
        __syncthreads();
        gq_stage<HS, GQ_BK>(Ks, base + (NH + g) * HS, W, k0, T);
        gq_stage<HS, GQ_BK>(Vs, base + (NH + KVH + g) * HS, W, k0, T);
        __syncthreads();
        float s[R] = {}, dp[R] = {};
        gq_dots<HS>(s, Qs + warp * R, Ks[lane]);
        gq_dots<HS>(dp, Gs + warp * R, Vs[lane]);
        const int key = k0 + lane;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int t = q0 + warp * R + r;
            const bool ok = key <= t && key >= st[r];
            const float p = ok ? expf(s[r] * scale - ls[r]) : 0.0f;
            Ps[warp][r][lane] = p * (dp[r] - ds[r]);
        }
        __syncwarp();
        gq_accum(dq, Ps[warp], Ks);
    }

    float sc[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        sc[r] = scale;
    gq_store(dqkv + row0 * W + h * HS, W, q0 + warp * R, T, dq, sc);
}

// dk = scale·Σ_t ds_tj·q_t, dv = Σ_t p_tj·dout_t over the group's query
// heads and the queries t >= j that see key j (the key/value heads of
// dqkv, overwritten).  CTA (key block, b·KVH + g); lane i owns query i of a
// tile, and each warp GQ_DKV_R keys of the block.
template <int HS>
__global__ __launch_bounds__(GQ_THREADS) void gqa_dkv_kernel(float *__restrict__ dqkv, const float *__restrict__ dout,
                                                             const float *__restrict__ lse,
                                                             const float *__restrict__ Dsum,
                                                             const float *__restrict__ qkv,
                                                             const int32_t *__restrict__ start, int T, int NH,
                                                             int KVH, float scale)
{
    constexpr int E = HS / 32, R = GQ_DKV_R, BKV = GQ_WARPS * R;
    __shared__ float Kb[BKV][HS]; // the block's keys and values
    __shared__ float Vb[BKV][HS];
    __shared__ float Qs[GQ_BK][HS + 1]; // a tile of queries and their dout rows
    __shared__ float Gs[GQ_BK][HS + 1];
    __shared__ float Ps[GQ_WARPS][R][GQ_BK];
    __shared__ float Ds[GQ_WARPS][R][GQ_BK];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int b = blockIdx.y / KVH, g = blockIdx.y % KVH, group = NH / KVH;
    const int W = (NH + 2 * KVH) * HS, C = NH * HS;
    const int k0 = blockIdx.x * BKV, k1 = min(k0 + BKV, T);
    const size_t row0 = (size_t)b * T;
    const float *base = qkv + row0 * W;

    gq_stage<HS, BKV>(Kb, base + (NH + g) * HS, W, k0, T);
    gq_stage<HS, BKV>(Vb, base + (NH + KVH + g) * HS, W, k0, T);
    float dk[R][E] = {}, dv[R][E] = {};

    for (int h = g * group; h < (g + 1) * group; h++) {
        const size_t bh = (size_t)b * NH + h;
        for (int i0 = k0 / GQ_BK * GQ_BK; i0 < T; i0 += GQ_BK) {
            // The tile's queries, their starts, lse and Dsum, lane i query i0 + i.
            const int t = i0 + lane;
            const int st = t < T ? gq_start(start, row0 + t) : INT_MAX;
            // Skip a tile none of whose queries sees a key of the block (the
            // same test in every warp: uniform over the CTA).
            if (kc_warp_max(t < T && st < k1 ? 1.0f : 0.0f) == 0.0f)
                continue;
            const float ls = t < T ? lse[bh * T + t] : 0.0f, dsum = t < T ? Dsum[bh * T + t] : 0.0f;
            __syncthreads(); // the previous tile's readers are done
            gq_stage<HS, GQ_BK>(Qs, base + h * HS, W, i0, T);
            gq_stage<HS, GQ_BK>(Gs, dout + row0 * C + h * HS, C, i0, T);
            __syncthreads();
            float s[R] = {}, dp[R] = {};
            gq_dots<HS>(s, Kb + warp * R, Qs[lane]);
            gq_dots<HS>(dp, Vb + warp * R, Gs[lane]);
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int key = k0 + warp * R + r;
                const bool ok = key < k1 && key <= t && key >= st;
                const float p = ok ? expf(s[r] * scale - ls) : 0.0f;
                Ps[warp][r][lane] = p;
                Ds[warp][r][lane] = p * (dp[r] - dsum);
            }
            __syncwarp();
            gq_accum(dv, Ps[warp], Gs);
            gq_accum(dk, Ds[warp], Qs);
        }
    }

    float sc[R], one[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        sc[r] = scale;
        one[r] = 1.0f;
    }
    gq_store(dqkv + row0 * W + (NH + g) * HS, W, k0 + warp * R, T, dk, sc);
    gq_store(dqkv + row0 * W + (NH + KVH + g) * HS, W, k0 + warp * R, T, dv, one);
}

// Head sizes a kernel is instantiated for.
static inline bool gqa_hs_ok(int HS) { return HS == 32 || HS == 64 || HS == 96 || HS == 128; }

// f.template operator()<HS>() with HS the compile-time head size.
template <class F> static inline void gqa_with_hs(int HS, F &&f)
{
    switch (HS) {
    case 32:
        f.template operator()<32>();
        break;
    case 64:
        f.template operator()<64>();
        break;
    case 96:
        f.template operator()<96>();
        break;
    default:
        f.template operator()<128>();
        break;
    }
}

bool kc_attention_gqa_ok(kern_ctx *k, int NH, int KVH, int HS)
{
    (void)k;
    return NH > 0 && KVH > 0 && NH % KVH == 0 && gqa_hs_ok(HS);
}

#ifndef GRADD_CUDA_EMU // the host launchers (tests/emu runs the kernels above itself)
// Grid y is b·heads: at most 65535.
static bool gqa_shape(kern_ctx *k, int B, int T, int NH, int KVH, int HS, const char *what)
{
    if (B <= 0 || T <= 0)
        return false;
    if (!kc_attention_gqa_ok(k, NH, KVH, HS) || (long long)B * NH > 65535) {
        kc_ok(k, cudaErrorInvalidValue, what);
        return false;
    }
    return true;
}

void kc_attention_gqa_forward(kern_ctx *k, float *out, float *lse, const float *qkv, const int32_t *start, int B,
                              int T, int NH, int KVH, int HS)
{
    if (!gqa_shape(k, B, T, NH, KVH, HS, "attention_gqa_forward"))
        return;
    kc_enter(k);
    if (kc_gqa_cudnn_forward(k, out, lse, qkv, start, B, T, NH, KVH, HS))
        return;
    if (kc_gqa_mma_ok(k, HS)) {
        kc_gqa_mma_forward(k, out, lse, qkv, start, B, T, NH, KVH, HS);
        return;
    }
    const float scale = 1.0f / sqrtf((float)HS);
    gqa_with_hs(HS, [&]<int H>() {
        constexpr int BQ = GQ_WARPS * GQ_FWD_R;
        gqa_forward_kernel<H><<<dim3((unsigned)((T + BQ - 1) / BQ), (unsigned)(B * NH)), GQ_THREADS, 0, k->stream>>>(
            out, lse, qkv, start, T, NH, KVH, scale);
    });
    kc_launched(k, "attention_gqa_forward");
}

void kc_attention_gqa_backward(kern_ctx *k, float *dqkv, const float *dout, const float *out, const float *lse,
                               const float *qkv, const int32_t *start, int B, int T, int NH, int KVH, int HS)
{
    if (!gqa_shape(k, B, T, NH, KVH, HS, "attention_gqa_backward"))
        return;
    kc_enter(k);
    if (kc_gqa_cudnn_backward(k, dqkv, dout, out, lse, qkv, start, B, T, NH, KVH, HS))
        return;
    float *Dsum = (float *)kc_scratch(k, (size_t)B * NH * T * sizeof(float));
    if (!Dsum)
        return;
    const float scale = 1.0f / sqrtf((float)HS);
    const bool mma = kc_gqa_mma_ok(k, HS);
    gqa_with_hs(HS, [&]<int H>() {
        const size_t rows = (size_t)B * T * NH;
        gqa_dsum_kernel<H><<<kc_grid(k, rows, GQ_WARPS), GQ_THREADS, 0, k->stream>>>(Dsum, dout, out, B, T, NH);
        if (mma)
            return;
        constexpr int BQ = GQ_WARPS * GQ_DQ_R, BKV = GQ_WARPS * GQ_DKV_R;
        gqa_dq_kernel<H><<<dim3((unsigned)((T + BQ - 1) / BQ), (unsigned)(B * NH)), GQ_THREADS, 0, k->stream>>>(
            dqkv, dout, lse, Dsum, qkv, start, T, NH, KVH, scale);
        gqa_dkv_kernel<H><<<dim3((unsigned)((T + BKV - 1) / BKV), (unsigned)(B * KVH)), GQ_THREADS, 0, k->stream>>>(
            dqkv, dout, lse, Dsum, qkv, start, T, NH, KVH, scale);
    });
    if (mma)
        kc_gqa_mma_backward(k, dqkv, dout, lse, Dsum, qkv, start, B, T, NH, KVH, HS);
    kc_launched(k, "attention_gqa_backward");
}
#endif
