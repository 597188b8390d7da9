// gemm.cu — cuBLASLt GEMMs: a plan cache, matmul forward and backward.
//
// Row-major to cuBLASLt's column-major: a row-major (R, C) matrix is a
// column-major (C, R) one with the same leading dimension (its transpose),
// so out (N,OC) = inp (N,C) · W (OC,C)^T becomes out^T = W · inp^T:
//   D (OC×N) = op_T(Wc: C×OC) · Ic (C×N)                      (forward)
//   dinp^T (C×N)  = Wc (C×OC) · Dc (OC×N)                        (backward, dinp)
//   dW^T (C×OC)  += Ic (C×N) · op_T(Dc: OC×N)                    (backward, dweight)
// where Xc is the row-major X read as column-major.
//
// Precision: KERN_FP32 runs fp32 inputs with CUBLAS_COMPUTE_32F (true fp32,
// no TF32), so it matches the CPU to ~1e-5.  KERN_BF16 / KERN_FP16 cast both
// inputs into scratch (round to nearest even) and run 16-bit × 16-bit → fp32
// with CUBLAS_COMPUTE_32F.  Outputs and accumulation are fp32.  Should
// cuBLASLt offer no algorithm for the 16-bit case, the fp32 path runs instead.
// The *16 ops (kernels.h's 16-bit activations) take their activations and
// weights in 16 bits already and cast nothing but an fp32 dout or bias.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_cuda.cuh"

#ifndef GRADD_CUDA_EMU // cuBLASLt (tests/emu runs only the fallback kernels below)
#define KC_MAX_PLANS 96

// Everything that decides the algorithm; pointers only through their
// alignment.  memset before filling: it is compared with memcmp.
struct kc_gemm_key {
    int ta, tb, m, n, k, lda, ldb, ldd, batch;
    long long sA, sB, sD;
    int ab, dt, compute, epilogue;
    unsigned align_a, align_b, align_c, align_d, align_bias, align_aux;
};

struct kc_plan {
    kc_gemm_key key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
    bool has_algo;
};

static unsigned kc_alignment(const void *p)
{
    unsigned a = 256;
    while (a > 1 && ((uintptr_t)p % a))
        a >>= 1;
    return a;
}

static void plan_release(kc_plan *p)
{
    if (p->op)
        cublasLtMatmulDescDestroy(p->op);
    if (p->a)
        cublasLtMatrixLayoutDestroy(p->a);
    if (p->b)
        cublasLtMatrixLayoutDestroy(p->b);
    if (p->d)
        cublasLtMatrixLayoutDestroy(p->d);
    memset(p, 0, sizeof *p);
}

void kc_plans_destroy(kern_ctx *k)
{
    for (int i = 0; i < k->nplans; i++)
        plan_release(&k->plans[i]);
    free(k->plans);
    k->plans = NULL;
    k->nplans = 0;
    k->plan_next = 0;
}

static cublasStatus_t layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, int rows, int cols, int ld, int batch,
                             long long stride)
{
    cublasStatus_t s = cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, (int64_t)ld);
    if (s != CUBLAS_STATUS_SUCCESS || batch <= 1)
        return s;
    int32_t bc = batch;
    int64_t st = stride;
    s = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &st, sizeof st);
    return s;
}

// Build descriptors and ask the heuristic for the best algorithm.
static cublasStatus_t plan_build(kern_ctx *k, kc_plan *p, const kc_gemm_args *g)
{
    const kc_gemm_key *y = &p->key;
    cublasStatus_t s = cublasLtMatmulDescCreate(&p->op, (cublasComputeType_t)y->compute, CUDA_R_32F);
    if (s != CUBLAS_STATUS_SUCCESS)
        return s;
    int32_t ta = y->ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = y->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    uint32_t epi = (uint32_t)y->epilogue;
    if ((s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) ||
        (s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)) ||
        (s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi)))
        return s;
    if (g->bias) { // its alignment steers the heuristic
        s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias);
        if (s != CUBLAS_STATUS_SUCCESS)
            return s;
    }
    if (g->gelu) { // likewise the aux matrix's; laid out as D
        int64_t ld = y->ldd;
        if ((s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux,
                                                sizeof g->aux)) ||
            (s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld)))
            return s;
    }
    cudaDataType_t ab = (cudaDataType_t)y->ab;
    // Stored shapes: op(A) is m×k, op(B) is k×n.
    if ((s = layout(&p->a, ab, y->ta ? y->k : y->m, y->ta ? y->m : y->k, y->lda, y->batch, y->sA)) ||
        (s = layout(&p->b, ab, y->tb ? y->n : y->k, y->tb ? y->k : y->n, y->ldb, y->batch, y->sB)) ||
        (s = layout(&p->d, (cudaDataType_t)y->dt, y->m, y->n, y->ldd, y->batch, y->sD)))
        return s;

    cublasLtMatmulPreference_t pref;
    if ((s = cublasLtMatmulPreferenceCreate(&pref)))
        return s;
    uint64_t ws = k->workspace_bytes;
    uint32_t al_a = y->align_a, al_b = y->align_b, al_c = y->align_c, al_d = y->align_d;
    if (!(s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws)) &&
        !(s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                                   sizeof al_a)) &&
        !(s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                                   sizeof al_b)) &&
        !(s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
                                                   sizeof al_c)) &&
        !(s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d,
                                                   sizeof al_d))) {
        cublasLtMatmulHeuristicResult_t res;
        int count = 0;
        memset(&res, 0, sizeof res);
        // Any failure of the heuristic (NOT_SUPPORTED, INVALID_VALUE for a
        // type/epilogue combination) means "no algorithm": the caller falls
        // back, and reports it only when no fallback is left.
        cublasStatus_t h = cublasLtMatmulAlgoGetHeuristic(k->lt, p->op, p->a, p->b, p->d, p->d, pref, 1, &res, &count);
        if (h == CUBLAS_STATUS_SUCCESS && count > 0 && res.state == CUBLAS_STATUS_SUCCESS) {
            p->algo = res.algo;
            p->has_algo = true;
        }
    }
    cublasLtMatmulPreferenceDestroy(pref);
    return s;
}

static kc_plan *plan_get(kern_ctx *k, const kc_gemm_args *g, int *err)
{
    kc_gemm_key y;
    memset(&y, 0, sizeof y);
    y.ta = g->ta;
    y.tb = g->tb;
    y.m = g->m;
    y.n = g->n;
    y.k = g->k;
    y.lda = g->lda;
    y.ldb = g->ldb;
    y.ldd = g->ldd;
    y.batch = g->batch > 1 ? g->batch : 1;
    if (y.batch > 1) {
        y.sA = g->sA;
        y.sB = g->sB;
        y.sD = g->sD;
    }
    y.ab = (int)g->ab;
    y.dt = (int)g->dt;
    y.compute = (int)g->compute;
    if (g->gelu == KC_GELU_FWD)
        y.epilogue = g->bias ? (int)CUBLASLT_EPILOGUE_GELU_AUX_BIAS : (int)CUBLASLT_EPILOGUE_GELU_AUX;
    else if (g->gelu == KC_GELU_BWD)
        y.epilogue = (int)CUBLASLT_EPILOGUE_DGELU;
    else
        y.epilogue = g->bias ? (int)CUBLASLT_EPILOGUE_BIAS : (int)CUBLASLT_EPILOGUE_DEFAULT;
    y.align_a = kc_alignment(g->A);
    y.align_b = kc_alignment(g->B);
    y.align_d = kc_alignment(g->D);
    y.align_c = kc_alignment(g->C ? g->C : g->D);
    y.align_bias = g->bias ? kc_alignment(g->bias) : 0;
    y.align_aux = g->gelu ? kc_alignment(g->aux) : 0;
    for (int i = 0; i < k->nplans; i++)
        if (!memcmp(&k->plans[i].key, &y, sizeof y))
            return &k->plans[i];
    if (!k->plans) {
        k->plans = (kc_plan *)calloc(KC_MAX_PLANS, sizeof(kc_plan));
        if (!k->plans) {
            kc_ok(k, cudaErrorMemoryAllocation, "gemm plan cache");
            *err = -1;
            return NULL;
        }
    }
    kc_plan *p;
    if (k->nplans < KC_MAX_PLANS) {
        p = &k->plans[k->nplans++];
    } else { // full: evict round robin
        p = &k->plans[k->plan_next];
        k->plan_next = (k->plan_next + 1) % KC_MAX_PLANS;
        plan_release(p);
    }
    p->key = y;
    cublasStatus_t s = plan_build(k, p, g);
    if (s != CUBLAS_STATUS_SUCCESS) {
        kc_blas_ok(k, s, "cuBLASLt plan");
        plan_release(p);
        *err = -1;
        return NULL;
    }
    return p; // possibly without an algorithm: cached as such
}

int kc_gemm(kern_ctx *k, const kc_gemm_args *g)
{
    if (g->m <= 0 || g->n <= 0)
        return 0;
    if (g->k <= 0) // an empty sum: gemm_run handles it without cuBLASLt
        return 1;
    int err = 0;
    kc_plan *p = plan_get(k, g, &err);
    if (!p)
        return err;
    if (!p->has_algo)
        return 1;
    if (g->bias) {
        cublasStatus_t s =
            cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias);
        if (!kc_blas_ok(k, s, "cuBLASLt bias"))
            return -1;
    }
    if (g->gelu) {
        cublasStatus_t s =
            cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux, sizeof g->aux);
        if (!kc_blas_ok(k, s, "cuBLASLt GELU aux"))
            return -1;
    }
    cublasStatus_t s = cublasLtMatmul(k->lt, p->op, &g->alpha, g->A, p->a, g->B, p->b, &g->beta,
                                      g->C ? g->C : g->D, p->d, g->D, p->d, &p->algo, k->workspace,
                                      k->workspace_bytes, k->stream);
    return kc_blas_ok(k, s, "cublasLtMatmul") ? 0 : -1;
}
#endif

// ---- fallbacks for what cuBLASLt declines ------------------------------------------------

// out (N, OC) += bias (OC)  — after a GEMM without the bias epilogue.
__global__ static void add_bias_kernel(float *out, const float *bias, size_t N, int OC)
{
    size_t total = N * (size_t)OC;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        out[i] += bias[i % OC];
}

// The same for a 16-bit out and bias of the context's type E: rounded again
// after the add, where cuBLASLt's epilogue rounds once; only when cuBLASLt
// declines the epilogue.
template <class E> __global__ static void add_bias16_kernel(uint16_t *out, const uint16_t *bias, size_t N, int OC)
{
    size_t total = N * (size_t)OC;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        out[i] = kc_to16<E>(kc_from16<E>(out[i]) + kc_from16<E>(bias[i % OC]));
}

// D (m×n, ld) = beta·D: the k = 0 case.
__global__ static void scale_matrix_kernel(float *d, int m, int n, int ld, float beta)
{
    size_t total = (size_t)m * n;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t col = i / m, row = i % m;
        float *p = d + col * ld + row;
        *p = beta == 0.0f ? 0.0f : *p * beta;
    }
}

#ifndef GRADD_CUDA_EMU // the host side (tests/emu runs the kernels above itself)
// One GEMM whose bias epilogue, should cuBLASLt decline it, becomes a plain
// GEMM and the bias kernel: kc_gemm's return value.
static int gemm_try(kern_ctx *k, const kc_gemm_args *g, int N_rows_for_bias)
{
    int r = kc_gemm(k, g);
    if (r != 1 || !g->bias)
        return r;
    kc_gemm_args nb = *g;
    nb.bias = NULL;
    r = kc_gemm(k, &nb);
    if (r == 0) {
        add_bias_kernel<<<kc_grid(k, (size_t)N_rows_for_bias * g->m, 256), 256, 0, k->stream>>>(
            (float *)g->D, (const float *)g->bias, (size_t)N_rows_for_bias, g->m);
        kc_launched(k, "gemm(bias)");
    }
    return r;
}

// One GEMM with its fallbacks: 16-bit inputs (with the bias epilogue, then
// without) → fp32 inputs (likewise).  g16 (or NULL) is the 16-bit form of g32.
static void gemm_run(kern_ctx *k, const kc_gemm_args *g16, const kc_gemm_args *g32, int N_rows_for_bias)
{
    const kc_gemm_args *g = g16 ? g16 : g32;
    if (g->k <= 0) {
        if (g->beta != 1.0f) {
            scale_matrix_kernel<<<kc_grid(k, (size_t)g->m * g->n, 256), 256, 0, k->stream>>>((float *)g->D, g->m, g->n,
                                                                                            g->ldd, g->beta);
            kc_launched(k, "gemm(k=0)");
        }
        if (g->bias) {
            add_bias_kernel<<<kc_grid(k, (size_t)N_rows_for_bias * g->m, 256), 256, 0, k->stream>>>(
                (float *)g->D, (const float *)g->bias, (size_t)N_rows_for_bias, g->m);
            kc_launched(k, "gemm(bias)");
        }
        return;
    }
    int r = g16 ? gemm_try(k, g16, N_rows_for_bias) : 1;
    if (r == 1)
        r = gemm_try(k, g32, N_rows_for_bias);
    if (r == 1) {
        char msg[160];
        snprintf(msg, sizeof msg, "no cuBLASLt algorithm for m=%d n=%d k=%d lda=%d ldb=%d ldd=%d batch=%d", g->m,
                 g->n, g->k, g->lda, g->ldb, g->ldd, g->batch);
        kc_blas_ok(k, CUBLAS_STATUS_NOT_SUPPORTED, msg);
    }
}

// ---- matmul ---------------------------------------------------------------------------------

static inline bool lowp(const kern_ctx *k) { return k->prec == KERN_BF16 || k->prec == KERN_FP16; }
static inline cudaDataType_t lowp_type(const kern_ctx *k) { return k->prec == KERN_BF16 ? CUDA_R_16BF : CUDA_R_16F; }

/* D (m,n) = A (m,kk) · op(B) + beta·D, column-major: beta 1 for the
 * parameter gradients (they accumulate), 0 for dinp (overwritten); with lp
 * the 16-bit copies A16/B16 are used when cuBLASLt has an algorithm for
 * them, else the fp32 operands. */
static void gemm_backward_part(kern_ctx *k, float beta, bool tb, int m, int n, int kk, const float *A, int lda,
                               const float *B, int ldb, float *D, int ldd, const uint16_t *A16, const uint16_t *B16,
                               bool lp)
{
    kc_gemm_args g32 = kc_gemm_plain(false, tb, m, n, kk, A, lda, B, ldb, D, ldd, beta);
    kc_gemm_args g16 = g32;
    g16.A = A16;
    g16.B = B16;
    g16.ab = lowp_type(k);
    gemm_run(k, lp ? &g16 : NULL, &g32, 0);
}


// out (N,OC) = inp (N,C) · weight (OC,C)ᵀ + bias as column-major cuBLASLt
// arguments: D (OC×N) = op_T(W) · inp, beta 0, fp32 operands and output
// (callers switch the types for 16-bit operands).
static kc_gemm_args forward_args(void *out, const void *inp, const void *weight, const void *bias, int N, int C,
                                 int OC)
{
    kc_gemm_args g = kc_gemm_plain(true, false, OC, N, C, weight, C, inp, C, out, OC, 0.0f);
    g.bias = bias;
    return g;
}

void kc_matmul_forward(kern_ctx *k, float *out, const float *inp, const float *weight, const float *bias, int N,
                       int C, int OC)
{
    if (N <= 0 || OC <= 0)
        return;
    kc_enter(k);
    kc_gemm_args g32 = forward_args(out, inp, weight, bias, N, C, OC);
    if (!lowp(k) || C <= 0) {
        gemm_run(k, NULL, &g32, N);
        return;
    }
    size_t nw = (size_t)OC * C, ni = (size_t)N * C;
    size_t ow = 0, oi = kc_round(nw * 2, 256);
    char *buf = (char *)kc_scratch(k, oi + ni * 2);
    if (!buf)
        return;
    uint16_t *w16 = (uint16_t *)(buf + ow), *i16 = (uint16_t *)(buf + oi);
    bool bf = k->prec == KERN_BF16;
    kc_cast_lowp(k, w16, weight, nw, bf);
    kc_cast_lowp(k, i16, inp, ni, bf);
    kc_gemm_args g16 = g32;
    g16.A = w16;
    g16.B = i16;
    g16.ab = lowp_type(k);
    gemm_run(k, &g16, &g32, N);
}

void kc_matmul_backward(kern_ctx *k, float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int N, int C, int OC)
{
    if (N <= 0 || OC <= 0 || C < 0)
        return;
    kc_enter(k);
    bool lp = lowp(k) && C > 0;
    // One scratch request for everything: 16-bit copies, then dbias partials.
    size_t nd = (size_t)N * OC, nw = (size_t)OC * C, ni = (size_t)N * C;
    size_t od = 0, ow = 0, oi = 0, op = 0, end = 0;
    if (lp) {
        ow = kc_round(nd * 2, 256);
        oi = ow + (dinp ? kc_round(nw * 2, 256) : 0);
        end = oi + (dweight ? kc_round(ni * 2, 256) : 0);
    }
    op = end;
    if (dbias)
        end += kc_colsum_scratch(k, N, OC, false) * sizeof(float);
    char *buf = end ? (char *)kc_scratch(k, end) : NULL;
    if (end && !buf)
        return;

    uint16_t *d16 = NULL, *w16 = NULL, *i16 = NULL;
    if (lp) {
        bool bf = k->prec == KERN_BF16;
        d16 = (uint16_t *)(buf + od);
        kc_cast_lowp(k, d16, dout, nd, bf);
        if (dinp) {
            w16 = (uint16_t *)(buf + ow);
            kc_cast_lowp(k, w16, weight, nw, bf);
        }
        if (dweight) {
            i16 = (uint16_t *)(buf + oi);
            kc_cast_lowp(k, i16, inp, ni, bf);
        }
    }
    /* dinp (N,C) = dout·W: column-major D(C,N) = W(C,OC) · dout(OC,N). */
    if (dinp && C > 0)
        gemm_backward_part(k, 0.0f, false, C, N, OC, weight, C, dout, OC, dinp, C, w16, d16, lp);
    /* dW (OC,C) += doutᵀ·inp: column-major D(C,OC) = inp(C,N) · dout(OC,N)ᵀ. */
    if (dweight && C > 0)
        gemm_backward_part(k, 1.0f, true, C, OC, N, inp, C, dout, OC, dweight, C, i16, d16, lp);
    if (dbias)
        kc_colsum(k, dbias, NULL, dout, NULL, NULL, NULL, N, OC, (float *)(buf + op));
}

// ---- 16-bit activations: the GEMM operands the caller already holds in 16 bits ----------------

// Both operands as they are.  Should cuBLASLt have no 16-bit algorithm,
// they are widened (exactly) and the fp32 GEMM runs, as kc_matmul_forward
// falls back.
void kc_matmul_forward16(kern_ctx *k, float *out, const uint16_t *inp16, const uint16_t *weight16,
                         const float *bias, int N, int C, int OC)
{
    if (N <= 0 || OC <= 0)
        return;
    kc_enter(k);
    kc_gemm_args g32 = forward_args(out, NULL, NULL, bias, N, C, OC); // A, B: widened, if it comes to that
    if (C <= 0) { // an empty sum: out = bias (or 0), no operand read
        gemm_run(k, NULL, &g32, N);
        return;
    }
    kc_gemm_args g16 = g32;
    g16.A = weight16;
    g16.B = inp16;
    g16.ab = lowp_type(k);
    if (gemm_try(k, &g16, N) != 1)
        return;
    size_t nw = (size_t)OC * C, ni = (size_t)N * C;
    float *w32 = (float *)kc_scratch(k, (kc_round(nw, 64) + ni) * sizeof(float));
    if (!w32)
        return;
    float *i32 = w32 + kc_round(nw, 64);
    kc_widen_lowp(k, w32, weight16, nw);
    kc_widen_lowp(k, i32, inp16, ni);
    g32.A = w32;
    g32.B = i32;
    gemm_run(k, NULL, &g32, N);
}

// The residual in the GEMM's C operand (beta 1), the bias in its epilogue;
// should cuBLASLt take neither, the plain op and the residual kernel.
void kc_matmul_forward16_residual(kern_ctx *k, float *out, const uint16_t *inp16, const uint16_t *weight16,
                                  const float *bias, const float *res, int N, int C, int OC)
{
    if (N <= 0 || OC <= 0)
        return;
    kc_enter(k);
    if (C > 0) {
        kc_gemm_args g = forward_args(out, inp16, weight16, bias, N, C, OC);
        g.ab = lowp_type(k);
        g.C = res;
        g.beta = 1.0f;
        int r = kc_gemm(k, &g);
        if (r != 1)
            return;
    }
    kc_matmul_forward16(k, out, inp16, weight16, bias, N, C, OC);
    kc_residual_forward(k, out, res, out, (size_t)N * OC);
}

void kc_matmul_backward16(kern_ctx *k, float *dinp, uint16_t *dinp16, float *dweight, float *dbias,
                          const float *dout, const uint16_t *dout16, const uint16_t *inp16, const uint16_t *weight16,
                          int N, int C, int OC)
{
    if (N <= 0 || OC <= 0 || C < 0 || (!dout) == (!dout16) || (dinp && dinp16)) {
        if (!dout == !dout16 || (dinp && dinp16))
            kc_ok(k, cudaErrorInvalidValue, "matmul_backward16: exactly one of dout and dout16, at most one dinp");
        return;
    }
    kc_enter(k);
    bool bf = k->prec == KERN_BF16, want_in = (dinp || dinp16) && C > 0;
    size_t nd = (size_t)N * OC;
    // One scratch request: dout's 16-bit copy (an fp32 dout), then the
    // dbias partials.
    size_t op = dout ? kc_round(nd * 2, 256) : 0;
    size_t end = op + (dbias ? kc_colsum_scratch(k, N, OC, false) * sizeof(float) : 0);
    char *buf = end ? (char *)kc_scratch(k, end) : NULL;
    if (end && !buf)
        return;
    const uint16_t *d16 = dout16;
    if (dout) {
        kc_cast_lowp(k, (uint16_t *)buf, dout, nd, bf);
        d16 = (const uint16_t *)buf;
    }
    int r_in = 0, r_w = 0;
    if (want_in) { // dinp (N,C) = dout·W: column-major D(C,N) = W(C,OC) · dout(OC,N), beta 0
        kc_gemm_args a = kc_gemm_plain(false, false, C, N, OC, weight16, C, d16, OC,
                                       dinp16 ? (void *)dinp16 : (void *)dinp, C, 0.0f);
        a.ab = lowp_type(k);
        if (dinp16)
            a.dt = lowp_type(k);
        r_in = kc_gemm(k, &a);
        if (r_in == 1 && dinp16) { // no fp32 fallback, as kc_matmul_forward16_out16 says why
            char msg[120];
            snprintf(msg, sizeof msg, "no cuBLASLt algorithm for 16-bit output m=%d n=%d k=%d", C, N, OC);
            kc_blas_ok(k, CUBLAS_STATUS_NOT_SUPPORTED, msg);
            r_in = -1;
        }
    }
    if (dweight && C > 0) { // dW (OC,C) += doutᵀ·inp: column-major D(C,OC) = inp(C,N) · dout(OC,N)ᵀ
        kc_gemm_args a = kc_gemm_plain(false, true, C, OC, N, inp16, C, d16, OC, dweight, C, 1.0f);
        a.ab = lowp_type(k);
        r_w = kc_gemm(k, &a);
    }
    if (dbias) {
        if (dout)
            kc_colsum(k, dbias, NULL, dout, NULL, NULL, NULL, N, OC, (float *)(buf + op));
        else
            kc_colsum16(k, dbias, NULL, dout16, NULL, NULL, NULL, N, OC, (float *)(buf + op));
    }
    if (r_in != 1 && r_w != 1)
        return;
    // No 16-bit algorithm: fp32 GEMMs on operands widened exactly.  The
    // scratch is reused after the work queued on it, in stream order.
    size_t ni = r_w == 1 ? (size_t)N * C : 0, nw = r_in == 1 ? (size_t)OC * C : 0, nd32 = dout16 ? nd : 0;
    float *f = (float *)kc_scratch(k, (kc_round(nd32, 64) + kc_round(ni, 64) + nw) * sizeof(float));
    if (!f)
        return;
    const float *d32 = dout;
    if (dout16) {
        kc_widen_lowp(k, f, dout16, nd);
        d32 = f;
    }
    float *i32 = f + kc_round(nd32, 64), *w32 = i32 + kc_round(ni, 64);
    if (ni)
        kc_widen_lowp(k, i32, inp16, ni);
    if (nw)
        kc_widen_lowp(k, w32, weight16, nw);
    if (r_in == 1)
        gemm_backward_part(k, 0.0f, false, C, N, OC, w32, C, d32, OC, dinp, C, NULL, NULL, false);
    if (r_w == 1)
        gemm_backward_part(k, 1.0f, true, C, OC, N, i32, C, d32, OC, dweight, C, NULL, NULL, false);
}

// The 16-bit GEMMs with a 16-bit output read the bias (OC; may be NULL)
// rounded to the context's type, as cuBLASLt's epilogue reads a bias for
// such an output: cast into scratch.  false: no scratch (recorded).
static bool bias16(kern_ctx *k, const float *bias, int OC, uint16_t **b16)
{
    *b16 = NULL;
    if (!bias)
        return true;
    *b16 = (uint16_t *)kc_scratch(k, (size_t)OC * 2);
    if (!*b16)
        return false;
    kc_cast_lowp(k, *b16, bias, (size_t)OC, k->prec == KERN_BF16);
    return true;
}

// A 16-bit output: the logits, and the MLP's hidden layer; rounded once
// from the fp32 accumulator by cuBLASLt, the bias (cast to the output's
// type, as cuBLASLt's epilogue reads it) added before that rounding.  No
// fp32 fallback: that would need an fp32 (N,OC) buffer, the very tensor
// this op exists to avoid; cuBLASLt has algorithms for 16-bit in and out
// with fp32 compute on every GPU this module is built for, so a refusal is
// reported as an error.
void kc_matmul_forward16_out16(kern_ctx *k, uint16_t *out16, const uint16_t *inp16, const uint16_t *weight16,
                               const float *bias, int N, int C, int OC)
{
    if (N <= 0 || OC <= 0)
        return;
    kc_enter(k);
    uint16_t *b16;
    if (!bias16(k, bias, OC, &b16))
        return;
    int r = 0;
    if (C <= 0) { // an empty sum: zeros (the same bits in bf16 and fp16), then the bias
        kc_ok(k, cudaMemsetAsync(out16, 0, (size_t)N * OC * 2, k->stream), "matmul_forward16_out16(C=0)");
    } else {
        kc_gemm_args g = forward_args(out16, inp16, weight16, b16, N, C, OC);
        g.ab = lowp_type(k);
        g.dt = lowp_type(k);
        r = kc_gemm(k, &g);
        if (r == 1 && b16) { // the epilogue declined: the GEMM, then the bias kernel
            g.bias = NULL;
            r = kc_gemm(k, &g);
        } else if (r == 0) {
            b16 = NULL; // added by the epilogue
        }
        if (r == 1) {
            char msg[120];
            snprintf(msg, sizeof msg, "no cuBLASLt algorithm for 16-bit output m=%d n=%d k=%d", OC, N, C);
            kc_blas_ok(k, CUBLAS_STATUS_NOT_SUPPORTED, msg);
        }
    }
    if (r == 0 && b16) {
        unsigned grid = kc_grid(k, (size_t)N * OC, 256);
        if (k->prec == KERN_BF16)
            add_bias16_kernel<__nv_bfloat16><<<grid, 256, 0, k->stream>>>(out16, b16, (size_t)N, OC);
        else
            add_bias16_kernel<__half><<<grid, 256, 0, k->stream>>>(out16, b16, (size_t)N, OC);
        kc_launched(k, "matmul_forward16_out16(bias)");
    }
}

// The fc layer and its GELU in one GEMM (kernels.h): cuBLASLt's
// GELU_AUX_BIAS epilogue writes pre16 (the aux matrix) and out16 =
// gelu(acc + bias) from the same fp32 values, so the GELU kernel's pass
// over the hidden layer (reading pre16, writing out16: 4·N·OC bytes) is
// not made.  Should cuBLASLt decline the epilogue, or OC not be a multiple
// of 8 (the aux leading dimension must be), the two ops.
void kc_matmul_forward16_gelu(kern_ctx *k, uint16_t *out16, uint16_t *pre16, const uint16_t *inp16,
                              const uint16_t *weight16, const float *bias, int N, int C, int OC)
{
    if (N <= 0 || OC <= 0)
        return;
    kc_enter(k);
    if (C > 0 && OC % 8 == 0) {
        uint16_t *b16;
        if (!bias16(k, bias, OC, &b16))
            return;
        kc_gemm_args g = forward_args(out16, inp16, weight16, b16, N, C, OC);
        g.ab = g.dt = lowp_type(k);
        g.gelu = KC_GELU_FWD;
        g.aux = pre16;
        if (kc_gemm(k, &g) != 1)
            return; // done, or an error recorded
        // Only the bias cast was queued on the scratch: the ops below may reuse it.
    }
    kc_matmul_forward16_out16(k, pre16, inp16, weight16, bias, N, C, OC);
    kc_gelu_forward16(k, out16, pre16, (size_t)N * OC);
}

// The gradient through the next GEMM and the GELU (kernels.h): the dinp
// GEMM with cuBLASLt's DGELU epilogue, which multiplies by gelu'(pre16)
// before rounding, so the GELU backward's pass (reading dinp16 and pre16,
// writing dinp16: 6·N·C bytes) is not made; then dweight and dbias as
// matmul_backward16 makes them.  Should cuBLASLt decline, or C not be a
// multiple of 8, matmul_backward16 and gelu_backward16.
void kc_matmul_backward16_dgelu(kern_ctx *k, uint16_t *dinp16, const uint16_t *pre16, float *dweight, float *dbias,
                                const uint16_t *dout16, const uint16_t *inp16, const uint16_t *weight16, int N, int C,
                                int OC)
{
    if (N <= 0 || OC <= 0 || C < 0)
        return;
    kc_enter(k);
    if (C > 0 && C % 8 == 0) {
        // dinp (N,C) = dout·W: column-major D(C,N) = W(C,OC) · dout(OC,N), beta 0
        kc_gemm_args a = kc_gemm_plain(false, false, C, N, OC, weight16, C, dout16, OC, dinp16, C, 0.0f);
        a.ab = a.dt = lowp_type(k);
        a.gelu = KC_GELU_BWD;
        a.aux = pre16;
        int r = kc_gemm(k, &a);
        if (r < 0)
            return;
        if (r == 0) { // the parameters' gradients: matmul_backward16 without a dinp
            kc_matmul_backward16(k, NULL, NULL, dweight, dbias, NULL, dout16, inp16, weight16, N, C, OC);
            return;
        }
    }
    kc_matmul_backward16(k, NULL, dinp16, dweight, dbias, NULL, dout16, inp16, weight16, N, C, OC);
    kc_gelu_backward16(k, dinp16, pre16, dinp16, (size_t)N * C);
}
#endif
