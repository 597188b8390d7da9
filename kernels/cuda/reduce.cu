// reduce.cu — deterministic column sums over an (N, C) matrix, for the
// matmul bias gradient and the layernorm weight/bias gradients.
//
// Pass 1: a grid of (C/32) × S blocks; block (x, s) owns 32 columns and a
// contiguous slice of rows, its 8 warps stride the slice, and the 8 partial
// sums meet in shared memory in a fixed order.  Pass 2: one thread per
// column adds the S partials in order and accumulates into the gradient.
// No atomics: the result depends only on N, C (and so S), never on timing.
//
// dout may also be 16-bit (kc_colsum16: the bias gradient of a GEMM whose
// dout the producer stored in bf16/fp16): the same kernels, templated on
// dout's element type, widen each element exactly to fp32 and sum in the
// same splits and order.
//
// kc_colsum_merge is pass 2 for partial rows made elsewhere (the layernorm
// backward's register kernel writes one per block of rows, with dout and x
// already in its registers): S partial rows, where S may be a few hundred,
// too many for colsum_final's one thread per column, whose S dependent
// loads leave it latency-bound on a handful of SMs.  colsum_merge gives each
// column CM_ROWS threads that stride the partials, then adds their sums in
// a fixed order: again a function of S and C only.
#include "kern_cuda.cuh"

#define CS_COLS 32
#define CS_ROWS 8
#define CS_TARGET_BLOCKS 1024 // fixed, so S (and the bits) do not depend on the GPU model

static int cs_splits(int N, int C)
{
    int xb = (C + CS_COLS - 1) / CS_COLS;
    int s = (CS_TARGET_BLOCKS + xb - 1) / xb;
    int max_s = (N + CS_ROWS - 1) / CS_ROWS; // at least 8 rows per split
    if (s > max_s)
        s = max_s;
    if (s < 1)
        s = 1;
    int rows = (N + s - 1) / s;
    return rows ? (N + rows - 1) / rows : 1;
}

size_t kc_colsum_scratch(const kern_ctx *k, int N, int C, bool ln)
{
    (void)k;
    return (size_t)cs_splits(N, C) * (size_t)C * (ln ? 2 : 1);
}

// T: dout's element type (float, __nv_bfloat16 or __half).
template <bool LN, class T>
__global__ static void colsum_partial(const T *__restrict__ dout, const float *__restrict__ inp,
                                      const float *__restrict__ mean, const float *__restrict__ rstd,
                                      float *__restrict__ part_a, float *__restrict__ part_b, int N, int C,
                                      int rows_per_split)
{
    __shared__ float sa[CS_ROWS][CS_COLS + 1];
    __shared__ float sb[LN ? CS_ROWS : 1][CS_COLS + 1];
    int c = blockIdx.x * CS_COLS + threadIdx.x;
    int s = blockIdx.y;
    int r0 = s * rows_per_split;
    int r1 = min(N, r0 + rows_per_split);
    float a = 0.0f, b = 0.0f;
    if (c < C) {
        for (int r = r0 + threadIdx.y; r < r1; r += CS_ROWS) {
            size_t i = (size_t)r * C + c;
            float d = kc_widen(dout[i]);
            if constexpr (LN) {
                a += d * ((inp[i] - mean[r]) * rstd[r]);
                b += d;
            } else {
                a += d;
            }
        }
    }
    sa[threadIdx.y][threadIdx.x] = a;
    if constexpr (LN)
        sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float ta = 0.0f, tb = 0.0f;
#pragma unroll
        for (int y = 0; y < CS_ROWS; y++) {
            ta += sa[y][threadIdx.x];
            if constexpr (LN)
                tb += sb[y][threadIdx.x];
        }
        part_a[(size_t)s * C + c] = ta;
        if constexpr (LN)
            part_b[(size_t)s * C + c] = tb;
    }
}

__global__ static void colsum_final(float *__restrict__ dst_a, float *__restrict__ dst_b,
                                    const float *__restrict__ part_a, const float *__restrict__ part_b, int S,
                                    int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float a = 0.0f, b = 0.0f;
    for (int s = 0; s < S; s++) {
        a += part_a[(size_t)s * C + c];
        if (dst_b)
            b += part_b[(size_t)s * C + c];
    }
    dst_a[c] += a;
    if (dst_b)
        dst_b[c] += b;
}

// dst_a[c] += Σ_s part_a[s·C + c] (and dst_b from part_b when not NULL):
// block (CS_COLS, CM_ROWS) owns 32 columns; thread y adds partials y, y +
// CM_ROWS, ... in order, then thread y = 0 adds the CM_ROWS sums in order.
#define CM_ROWS 16
__global__ static void colsum_merge(float *__restrict__ dst_a, float *__restrict__ dst_b,
                                    const float *__restrict__ part_a, const float *__restrict__ part_b, int S, int C)
{
    __shared__ float sa[CM_ROWS][CS_COLS + 1], sb[CM_ROWS][CS_COLS + 1];
    int c = blockIdx.x * CS_COLS + threadIdx.x;
    float a = 0.0f, b = 0.0f;
    if (c < C) {
        for (int s = threadIdx.y; s < S; s += CM_ROWS) {
            a += part_a[(size_t)s * C + c];
            if (dst_b)
                b += part_b[(size_t)s * C + c];
        }
    }
    sa[threadIdx.y][threadIdx.x] = a;
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float ta = 0.0f, tb = 0.0f;
#pragma unroll
        for (int y = 0; y < CM_ROWS; y++) {
            ta += sa[y][threadIdx.x];
            tb += sb[y][threadIdx.x];
        }
        dst_a[c] += ta;
        if (dst_b)
            dst_b[c] += tb;
    }
}

// The S splits of `rows` rows each and the launch shape, shared by the fp32
// and 16-bit entry points so that both sum in the same order.
struct cs_shape {
    int S, rows;
    dim3 grid, block;
};

static cs_shape cs_shape_of(int N, int C)
{
    cs_shape sh;
    sh.S = cs_splits(N, C);
    sh.rows = (N + sh.S - 1) / sh.S;
    sh.grid = dim3((unsigned)((C + CS_COLS - 1) / CS_COLS), (unsigned)sh.S);
    sh.block = dim3(CS_COLS, CS_ROWS);
    return sh;
}

#ifndef GRADD_CUDA_EMU // the host launchers (tests/emu runs the kernels above itself)
static void cs_final(kern_ctx *k, float *dst_a, float *dst_b, const float *part_a, const float *part_b, int S,
                     int C)
{
    colsum_final<<<(unsigned)((C + 255) / 256), 256, 0, k->stream>>>(dst_a, dst_b, part_a, part_b, S, C);
    kc_launched(k, "colsum_final");
}

void kc_colsum_merge(kern_ctx *k, float *dst_a, float *dst_b, const float *part_a, const float *part_b, int S, int C)
{
    if (S <= 0 || C <= 0)
        return;
    colsum_merge<<<(unsigned)((C + CS_COLS - 1) / CS_COLS), dim3(CS_COLS, CM_ROWS), 0, k->stream>>>(
        dst_a, dst_b, part_a, part_b, S, C);
    kc_launched(k, "colsum_merge");
}

// T: dout's element type.  With inp (LN), dst_a = Σ dout·norm and dst_b = Σ dout.
template <class T>
static void colsum_run(kern_ctx *k, float *dst_a, float *dst_b, const T *dout, const float *inp, const float *mean,
                       const float *rstd, int N, int C, float *part)
{
    if (N <= 0 || C <= 0)
        return;
    bool ln = inp != NULL;
    cs_shape sh = cs_shape_of(N, C);
    float *part_a = part, *part_b = ln ? part + (size_t)sh.S * C : NULL;
    if (ln)
        colsum_partial<true, T>
            <<<sh.grid, sh.block, 0, k->stream>>>(dout, inp, mean, rstd, part_a, part_b, N, C, sh.rows);
    else
        colsum_partial<false, T>
            <<<sh.grid, sh.block, 0, k->stream>>>(dout, NULL, NULL, NULL, part_a, NULL, N, C, sh.rows);
    kc_launched(k, "colsum_partial");
    cs_final(k, dst_a, ln ? dst_b : NULL, part_a, part_b, sh.S, C);
}

void kc_colsum(kern_ctx *k, float *dst_a, float *dst_b, const float *dout, const float *inp, const float *mean,
               const float *rstd, int N, int C, float *part)
{
    colsum_run(k, dst_a, dst_b, dout, inp, mean, rstd, N, C, part);
}

void kc_colsum16(kern_ctx *k, float *dst_a, float *dst_b, const uint16_t *dout16, const float *inp, const float *mean,
                 const float *rstd, int N, int C, float *part)
{
    // The context's 16-bit type: fp16 in an fp16 context, bf16 otherwise.
    if (k->prec == KERN_FP16)
        colsum_run(k, dst_a, dst_b, reinterpret_cast<const __half *>(dout16), inp, mean, rstd, N, C, part);
    else
        colsum_run(k, dst_a, dst_b, reinterpret_cast<const __nv_bfloat16 *>(dout16), inp, mean, rstd, N, C, part);
}
#endif
