// attention.cu — causal multi-head self-attention: cuBLASLt strided-batched
// GEMMs for Q·K^T and att·V (and their backward), own kernels for the causal
// softmax.  The interface keeps preatt and att (B,NH,T,T) in memory, so this
// is the "materialised" attention of llm.c's CPU path, not a fused one.
//
// The heads of one sequence are a strided batch without any permutation:
// head h of Q is the (T, hs) matrix at inp + b·T·3C + h·hs with row stride 3C,
// so one GEMM per sequence covers its NH heads (batch stride hs), and B
// GEMMs cover the batch.  The scale 1/sqrt(hs) goes into alpha.
//
// Precision: KERN_FP32 uses CUBLAS_COMPUTE_32F; KERN_BF16 / KERN_FP16 let
// cuBLASLt down-convert the fp32 operands (CUBLAS_COMPUTE_32F_FAST_16BF /
// _FAST_16F, fp32 accumulate), falling back to fp32 where it declines.
//
// Forward writes att with zeros above the diagonal (so att·V needs no mask)
// and leaves preatt above the diagonal as the GEMM computed it.  Backward
// does not trust att above the diagonal (the interface calls it
// unspecified): the softmax-backward kernel writes the masked att into the
// datt scratch and the dV GEMM reads it from there.
#include <math.h>
#include <string.h>

#include "kern_cuda.cuh"

#define ATT_WARPS 8

// ---- causal softmax -----------------------------------------------------------------

// One warp per row (b, h, t): att[0..t] = softmax(preatt[0..t]), att[t+1..T) = 0.
__global__ static void att_softmax_forward(float *__restrict__ att, const float *__restrict__ preatt, size_t rows,
                                           int T)
{
    int lane = threadIdx.x & 31;
    size_t row = (size_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5);
    if (row >= rows)
        return;
    int t = (int)(row % (size_t)T);
    const float *p = preatt + row * T;
    float *a = att + row * T;
    kc_ms ms = {-INFINITY, 0.0f};
    for (int j = lane; j <= t; j += 32)
        ms = kc_ms_add(ms, p[j]);
    ms = kc_warp_ms(ms);
    float inv = 1.0f / ms.s;
    for (int j = lane; j < T; j += 32)
        a[j] = j <= t ? expf(p[j] - ms.m) * inv : 0.0f;
}

// One warp per row: dpreatt = att ⊙ (datt − Σ att·datt) on [0..t], 0 above;
// then datt is overwritten with the masked att for the dV GEMM.
__global__ static void att_softmax_backward(float *__restrict__ dpreatt, float *__restrict__ datt,
                                            const float *__restrict__ att, size_t rows, int T)
{
    int lane = threadIdx.x & 31;
    size_t row = (size_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5);
    if (row >= rows)
        return;
    int t = (int)(row % (size_t)T);
    const float *a = att + row * T;
    float *da = datt + row * T, *dp = dpreatt + row * T;
    float s = 0.0f;
    for (int j = lane; j <= t; j += 32)
        s += a[j] * da[j];
    s = kc_warp_sum(s);
    for (int j = lane; j < T; j += 32) {
        if (j <= t) {
            float aj = a[j];
            dp[j] = aj * (da[j] - s);
            da[j] = aj;
        } else {
            dp[j] = 0.0f;
            da[j] = 0.0f;
        }
    }
}

#ifndef GRADD_CUDA_EMU // the GEMMs and host launchers (tests/emu runs the kernels above itself)
// ---- GEMMs ------------------------------------------------------------------------------

static cublasComputeType_t att_compute(const kern_ctx *k)
{
    switch (k->prec) {
    case KERN_BF16:
        return CUBLAS_COMPUTE_32F_FAST_16BF;
    case KERN_FP16:
        return CUBLAS_COMPUTE_32F_FAST_16F;
    default:
        return CUBLAS_COMPUTE_32F;
    }
}

// A head-batched GEMM with fallbacks: the fast compute type → plain fp32;
// the strided batch → one call per head.
static void att_gemm(kern_ctx *k, kc_gemm_args g)
{
    g.ab = CUDA_R_32F;
    g.compute = att_compute(k);
    int r = kc_gemm(k, &g);
    if (r == 1 && g.compute != CUBLAS_COMPUTE_32F) {
        g.compute = CUBLAS_COMPUTE_32F;
        r = kc_gemm(k, &g);
    }
    if (r == 1 && g.batch > 1) {
        kc_gemm_args h = g;
        h.batch = 1;
        for (int i = 0; i < g.batch && r != -1; i++) {
            h.A = (const float *)g.A + (size_t)i * g.sA;
            h.B = (const float *)g.B + (size_t)i * g.sB;
            h.D = (float *)g.D + (size_t)i * g.sD; // D is untyped in kc_gemm_args: step in floats
            r = kc_gemm(k, &h);
            if (r == 1)
                break;
        }
    }
    if (r == 1)
        kc_blas_ok(k, CUBLAS_STATUS_NOT_SUPPORTED, "attention: no cuBLASLt algorithm");
}

static kc_gemm_args att_args(bool ta, bool tb, int m, int n, int kk, const float *A, int lda, long long sA,
                             const float *B, int ldb, long long sB, float *D, int ldd, long long sD, int batch,
                             float alpha, float beta)
{
    kc_gemm_args g = kc_gemm_plain(ta, tb, m, n, kk, A, lda, B, ldb, D, ldd, beta);
    g.sA = sA;
    g.sB = sB;
    g.sD = sD;
    g.batch = batch;
    g.alpha = alpha;
    return g;
}

static bool att_shape_ok(kern_ctx *k, int B, int T, int C, int NH)
{
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0)
        return false;
    if (C % NH) {
        kc_ok(k, cudaErrorInvalidValue, "attention: C is not a multiple of NH");
        return false;
    }
    return true;
}

void kc_attention_forward(kern_ctx *k, float *out, float *preatt, float *att, const float *inp, int B, int T,
                          int C, int NH)
{
    if (!att_shape_ok(k, B, T, C, NH))
        return;
    kc_enter(k);
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    long long TT = (long long)T * T;
    for (int b = 0; b < B; b++) {
        const float *q = inp + (size_t)b * T * C3, *kk = q + C;
        float *pb = preatt + (size_t)b * NH * TT;
        // preatt^T (T×T) = K_c^T · Q_c  per head
        att_gemm(k, att_args(true, false, T, T, hs, kk, C3, hs, q, C3, hs, pb, T, TT, NH, scale, 0.0f));
    }
    size_t rows = (size_t)B * NH * T;
    att_softmax_forward<<<(unsigned)((rows + ATT_WARPS - 1) / ATT_WARPS), 32 * ATT_WARPS, 0, k->stream>>>(
        att, preatt, rows, T);
    kc_launched(k, "attention softmax");
    for (int b = 0; b < B; b++) {
        const float *v = inp + (size_t)b * T * C3 + 2 * C;
        const float *ab = att + (size_t)b * NH * TT;
        float *ob = out + (size_t)b * T * C;
        // out^T (hs×T) = V_c · att_c
        att_gemm(k, att_args(false, false, hs, T, T, v, C3, hs, ab, T, TT, ob, C, hs, NH, 1.0f, 0.0f));
    }
}

void kc_attention_backward(kern_ctx *k, float *dinp, float *dpreatt, float *datt, const float *dout,
                           const float *inp, const float *att, int B, int T, int C, int NH)
{
    if (!att_shape_ok(k, B, T, C, NH))
        return;
    kc_enter(k);
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    long long TT = (long long)T * T;
    for (int b = 0; b < B; b++) {
        const float *v = inp + (size_t)b * T * C3 + 2 * C;
        const float *db = dout + (size_t)b * T * C;
        float *dab = datt + (size_t)b * NH * TT;
        // datt^T (T×T) = V_c^T · dout_c
        att_gemm(k, att_args(true, false, T, T, hs, v, C3, hs, db, C, hs, dab, T, TT, NH, 1.0f, 0.0f));
    }
    size_t rows = (size_t)B * NH * T;
    att_softmax_backward<<<(unsigned)((rows + ATT_WARPS - 1) / ATT_WARPS), 32 * ATT_WARPS, 0, k->stream>>>(
        dpreatt, datt, att, rows, T);
    kc_launched(k, "attention softmax backward");
    for (int b = 0; b < B; b++) {
        const float *q = inp + (size_t)b * T * C3, *kk = q + C;
        const float *db = dout + (size_t)b * T * C;
        const float *am = datt + (size_t)b * NH * TT; // the masked att
        const float *dp = dpreatt + (size_t)b * NH * TT;
        float *dq = dinp + (size_t)b * T * C3, *dk = dq + C, *dv = dq + 2 * C;
        // dV^T (hs×T) += dout_c · att_c^T
        att_gemm(k, att_args(false, true, hs, T, T, db, C, hs, am, T, TT, dv, C3, hs, NH, 1.0f, 1.0f));
        // dQ^T (hs×T) += scale · K_c · dpreatt_c
        att_gemm(k, att_args(false, false, hs, T, T, kk, C3, hs, dp, T, TT, dq, C3, hs, NH, scale, 1.0f));
        // dK^T (hs×T) += scale · Q_c · dpreatt_c^T
        att_gemm(k, att_args(false, true, hs, T, T, q, C3, hs, dp, T, TT, dk, C3, hs, NH, scale, 1.0f));
    }
}
#endif
