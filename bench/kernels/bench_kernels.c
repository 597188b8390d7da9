/* bench_kernels.c — the CPU kernels at the GPT "small" shape of the CPU
 * benchmark (B=8, T=256, C=384, NH=6, V=256, L=6): milliseconds per call of
 * each op the GPT model (daemon/models/model_gpt.c) makes in a training step, in
 * the order and with the buffers it makes them, and their sum over one step
 * (forward, backward, then the engine's gradient zeroing, norm and AdamW),
 * one JSON line per figure.  No peer here: bench/train compares whole steps
 * with PyTorch; this one says where a step's time goes.
 *
 * usage: bench_kernels [threads] [B T C NH V L]   (threads 0 = all cores)
 *
 * Built a second time as bench_kernels_cuda (BENCH_CUDA) when CUDA is
 * available: the same table of figures for the CUDA kernels of the
 * gradd-cuda module, on device buffers, each call timed to its completion
 * (the op, then sync):
 *   bench_kernels_cuda MODULE fp32|bf16|fp16 [B T C NH V L]
 * Attention is the fused kernel wherever the module has it for the shape.
 * Exits 77 without a usable GPU.
 *
 * Two paths, chosen as model_gpt.c chooses them, and named in every line
 * ("path"):
 *   act16 — a bf16/fp16 context whose table has the 16-bit activation ops
 *           and says they pay (act16_native), unless GRADD_ACT16=0: the
 *           layernorm outputs, the MLP's hidden layer before and after
 *           GELU (and its gradient), the logits and, with fused attention,
 *           qkv and the attention output are 16-bit buffers, their producers and consumers the *16
 *           ops (metrics named layernorm16_*, matmul16_*, gelu16_*,
 *           logits16_*, crossentropy16_*, attention16_*);
 *   fp32  — everything else (the cpu build always): the fp32 ops, which in
 *           a 16-bit context cast their GEMM operands at every call.
 * Ops the two paths share keep their names (attention_*, matmul_proj_*,
 * layernorm_bwd, residual_fwd, encoder_*, zero_*, sumsq, adamw*). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef BENCH_NAME
#define BENCH_NAME "kernels_cpu"
#endif

#include "kernels.h"

#ifdef BENCH_CUDA
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#endif

static const kern_ops *ops;
static kern_ctx *k;
static kern_precision prec = KERN_FP32;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Memory of the backend: device memory for cuda, the heap for the cpu. */
static void *mem_alloc(size_t bytes)
{
    void *p = NULL;
#ifdef BENCH_CUDA
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess)
        p = NULL;
#else
    p = malloc(bytes ? bytes : 1);
#endif
    if (!p) {
        fprintf(stderr, "bench_kernels: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static void mem_free(void *p)
{
#ifdef BENCH_CUDA
    cudaFree(p);
#else
    free(p);
#endif
}

/* n values in [-0.5, 0.5), or their squares (AdamW's second moment must
 * not be negative), in the backend's memory. */
static float *buf_of(size_t n, bool square)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    if (!p) {
        fprintf(stderr, "bench_kernels: out of memory (%zu floats)\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    if (square)
        for (size_t i = 0; i < n; i++)
            p[i] *= p[i];
#ifdef BENCH_CUDA
    float *d = mem_alloc(n * sizeof *d);
    ops->copy_h2d(k, d, p, n * sizeof *p);
    ops->sync(k);
    free(p);
    return d;
#else
    return p;
#endif
}

static float *buf(size_t n) { return buf_of(n, false); }

/* The same values in the context's 16-bit type (bf16 or fp16, raw), as the
 * model's 16-bit activation buffers hold them: rounded by the backend's own
 * cast, so fp16 gets no host-side conversion of its own. */
static uint16_t *buf16(size_t n)
{
    float *f = buf(n);
    uint16_t *h = mem_alloc(n * sizeof *h);
    if (prec == KERN_FP16)
        ops->cast_f32_to_f16(k, h, f, n);
    else
        ops->cast_f32_to_bf16(k, h, f, n);
    ops->sync(k);
    mem_free(f);
    return h;
}

/* The 16-bit activation path, on exactly model_gpt.c's condition, so that
 * the figures are those of the sequence a training job runs (and
 * GRADD_ACT16=0 compares the two paths here as it does there). */
static bool act16_path(void)
{
    const char *env = getenv("GRADD_ACT16");
    return prec != KERN_FP32 && ops->act16_native && ops->layernorm_forward16 && ops->gelu_forward16 &&
           ops->gelu_backward16 && ops->matmul_forward16 && ops->matmul_forward16_residual && ops->matmul_backward16 &&
           ops->matmul_forward16_out16 && ops->layernorm_backward16 &&
           ops->crossentropy_forward16 && ops->crossentropy_backward16 && !(env && !strcmp(env, "0"));
}

/* ---- timings -------------------------------------------------------------------------- */

enum { PART_GEMM, PART_ATTENTION, PART_REST };

typedef struct {
    const char *metric;
    double ms;
    int per_step; /* calls in one training step (0: shown, not part of the step) */
    int part;
} op_time;

#define MAX_OPS 48
static op_time times[MAX_OPS];
static int ntimes;
static const int R = 5; /* best of R calls */

/* Time the statement (best of R, each call to its completion) and record it
 * as `metric`, made per_step times in a step. */
#define OP(metric_, per_step_, part_, stmt)                                                                     \
    do {                                                                                                        \
        double best_ = 1e30;                                                                                    \
        for (int r_ = 0; r_ < R; r_++) {                                                                        \
            double t0_ = now_ms();                                                                              \
            stmt;                                                                                               \
            if (ops->sync(k) != KERN_OK) { /* a failed op has no time */                                        \
                fprintf(stderr, "bench_kernels: %s: %s\n", (metric_), ops->error(k));                          \
                exit(1);                                                                                        \
            }                                                                                                   \
            double dt_ = now_ms() - t0_;                                                                        \
            if (dt_ < best_)                                                                                    \
                best_ = dt_;                                                                                    \
        }                                                                                                       \
        if (ntimes < MAX_OPS)                                                                                   \
            times[ntimes++] = (op_time){(metric_), best_, (per_step_), (part_)};                                \
    } while (0)

static char shape[96];
static const char *path_name, *prec_name;

/* per_step < 0: a composed figure, which has none. */
static void emit(const char *metric, double ms, int per_step)
{
    char ps[32] = "";
    if (per_step >= 0)
        snprintf(ps, sizeof ps, ",\"per_step\":%d", per_step);
    printf("{\"bench\":\"%s\",\"metric\":\"%s\",\"value\":%.4f,\"unit\":\"ms\",\"shape\":\"%s\","
           "\"precision\":\"%s\",\"path\":\"%s\"%s,\"peer\":null,\"peer_value\":null,\"ratio\":null}\n",
           BENCH_NAME, metric, ms, shape, prec_name, path_name, ps);
}

/* ---- the parameter layout (model_gpt.c's order) ----------------------------------------- */

typedef struct {
    size_t *off, *numel;
    bool *decay;
    int n;
    size_t total;
} tensors;

/* Append a tensor of numel parameters (room for it was allocated); returns
 * its offset. */
static size_t add_tensor(tensors *t, size_t numel, bool decay)
{
    size_t off = t->total;
    t->off[t->n] = off;
    t->numel[t->n] = numel;
    t->decay[t->n] = decay;
    t->n++;
    t->total += numel;
    return off;
}

/* AdamW once per tensor, decay on the matrices, as train.c called it
 * before adamw_multi. */
static void adamw_tensors(const tensors *t, float *P, uint16_t *P16, const float *D, float *m, float *v)
{
    for (int i = 0; i < t->n; i++) {
        size_t o = t->off[i];
        ops->adamw(k, P + o, P16 ? P16 + o : NULL, D + o, m + o, v + o, t->numel[i], 1e-4f, 0.9f, 0.95f, 1e-8f,
                   t->decay[i] ? 0.1f : 0.0f, 1.0f, 1);
    }
}

int main(int argc, char **argv)
{
    int B = 8, T = 256, C = 384, NH = 6, V = 256, L = 6;
#ifdef BENCH_CUDA
    const int a0 = 3; /* MODULE PRECISION, then the shape */
#else
    const int a0 = 2; /* threads, then the shape */
#endif
    if (argc > a0 + 5)
        B = atoi(argv[a0]), T = atoi(argv[a0 + 1]), C = atoi(argv[a0 + 2]), NH = atoi(argv[a0 + 3]),
        V = atoi(argv[a0 + 4]), L = atoi(argv[a0 + 5]);
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || V <= 0 || L <= 0 || C % NH) {
        fprintf(stderr, "bench_kernels: bad shape B=%d T=%d C=%d NH=%d V=%d L=%d\n", B, T, C, NH, V, L);
        return 2;
    }
#ifdef BENCH_CUDA
    if (argc < 3) {
        fprintf(stderr, "usage: bench_kernels_cuda MODULE fp32|bf16|fp16 [B T C NH V L]\n");
        return 2;
    }
    if (strcmp(argv[2], "fp32") == 0)
        prec = KERN_FP32;
    else if (strcmp(argv[2], "bf16") == 0)
        prec = KERN_BF16;
    else if (strcmp(argv[2], "fp16") == 0)
        prec = KERN_FP16;
    else {
        fprintf(stderr, "bench_kernels_cuda: precision %s: fp32, bf16 or fp16\n", argv[2]);
        return 2;
    }
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        fprintf(stderr, "bench_kernels_cuda: skipped, no usable GPU: %s\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
        return 77;
    }
    void *mod = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    ops = mod ? (const kern_ops *)dlsym(mod, KERN_CUDA_OPS_SYMBOL) : NULL;
    if (!ops) {
        fprintf(stderr, "bench_kernels_cuda: %s: %s\n", argv[1], dlerror());
        return 1;
    }
    k = ops->ctx_create(0, 0, prec, NULL);
#else
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    ops = kern_cpu_ops();
    k = ops->ctx_create(threads, 0, prec, NULL);
#endif
    if (!k) {
        fprintf(stderr, "bench_kernels: no %s context\n", ops->name);
        return 1;
    }
    bool fused = ops->attention_fused_ok && ops->attention_fused_ok(k, C, NH);
    bool lp16 = act16_path();
    /* As model_gpt.c: with fused attention the 16-bit path keeps qkv in 16 bits. */
    bool qkv16_on = lp16 && fused && ops->attention_fused_forward16 && ops->attention_fused_backward16;
    path_name = lp16 ? "act16" : "fp32";
    prec_name = prec == KERN_BF16 ? "bf16" : prec == KERN_FP16 ? "fp16" : "fp32";
    snprintf(shape, sizeof shape, "B=%d T=%d C=%d NH=%d V=%d L=%d", B, T, C, NH, V, L);

    /* One layer's activations and the model's scratch (the per-layer
     * buffers of every layer cost the same to read and write). */
    size_t N = (size_t)B * T, NC = N * C, nscore = (size_t)B * NH * T * T;
    float *encoded = buf(NC), *res2 = buf(NC), *res3 = buf(NC), *mean = buf(N), *rstd = buf(N);
    float *qkv = qkv16_on ? NULL : buf(3 * NC), *atty = qkv16_on ? NULL : buf(NC);
    float *att = buf(fused ? (size_t)B * NH * T : nscore), *proj = buf(NC);
    float *preatt = fused ? NULL : buf(nscore), *datt = fused ? NULL : buf(nscore);
    float *dres = buf(NC), *dqkv = buf(3 * NC), *dsmall = buf(NC);
    float *lse = buf(N), *losses = buf(N), *dlosses = buf(N);
    /* The activations that only GEMMs read, and the MLP's hidden layer and
     * its gradient: fp32, or 16-bit on act16. */
    float *ln1 = NULL, *ln2 = NULL, *fch = NULL, *fch_gelu = NULL, *lnf = NULL, *logits = NULL, *dbig = NULL;
    uint16_t *ln1_16 = NULL, *ln2_16 = NULL, *fch16 = NULL, *fch_gelu16 = NULL, *lnf16 = NULL, *logits16 = NULL;
    uint16_t *dres16 = lp16 ? buf16(NC) : NULL, *dln16 = lp16 ? buf16(NC) : NULL;
    uint16_t *dfch16 = NULL, *qkv16 = qkv16_on ? buf16(3 * NC) : NULL, *atty16 = qkv16_on ? buf16(NC) : NULL;
    uint16_t *dqkv16 = qkv16_on ? buf16(3 * NC) : NULL;
    if (lp16) {
        ln1_16 = buf16(NC), ln2_16 = buf16(NC), fch16 = buf16(4 * NC), fch_gelu16 = buf16(4 * NC), lnf16 = buf16(NC);
        logits16 = buf16(N * V), dfch16 = buf16(4 * NC);
    } else {
        ln1 = buf(NC), ln2 = buf(NC), fch = buf(4 * NC), fch_gelu = buf(4 * NC), lnf = buf(NC), logits = buf(N * V);
        dbig = buf(4 * NC);
    }
    int32_t *tok = malloc(N * sizeof *tok);
    for (size_t i = 0; i < N; i++)
        tok[i] = (int32_t)(i * 7 % V);
#ifdef BENCH_CUDA
    {
        int32_t *d = mem_alloc(N * sizeof *d);
        ops->copy_h2d(k, d, tok, N * sizeof *tok);
        ops->sync(k);
        free(tok);
        tok = d;
    }
#endif

    /* Parameters as the model lays them out: AdamW runs once per tensor,
     * and the ops below read layer 0's weights. */
    int ntensors = 12 * L + 4;
    tensors tl = {malloc(ntensors * sizeof(size_t)), malloc(ntensors * sizeof(size_t)), malloc(ntensors * sizeof(bool)),
                  0, 0};
    if (!tl.off || !tl.numel || !tl.decay) {
        fprintf(stderr, "bench_kernels: out of memory\n");
        return 1;
    }
    size_t Cz = (size_t)C;
    size_t wte = add_tensor(&tl, (size_t)V * Cz, true), wpe = add_tensor(&tl, (size_t)T * Cz, true);
    size_t ln1w = 0, ln1b = 0, qkvw = 0, qkvb = 0, attprojw = 0, attprojb = 0, fcw = 0, fcb = 0,
           fcprojw = 0, fcprojb = 0;
    for (int l = 0; l < L; l++) {
        size_t o[12] = {add_tensor(&tl, Cz, false),          add_tensor(&tl, Cz, false),
                        add_tensor(&tl, 3 * Cz * Cz, true),  add_tensor(&tl, 3 * Cz, false),
                        add_tensor(&tl, Cz * Cz, true),      add_tensor(&tl, Cz, false),
                        add_tensor(&tl, Cz, false),          add_tensor(&tl, Cz, false),
                        add_tensor(&tl, 4 * Cz * Cz, true),  add_tensor(&tl, 4 * Cz, false),
                        add_tensor(&tl, 4 * Cz * Cz, true),  add_tensor(&tl, Cz, false)};
        /* ln_2's own weights (o[6], o[7]) are not needed: the layernorms,
         * all one shape, are timed once, with ln_1's and ln_f's. */
        if (l == 0)
            ln1w = o[0], ln1b = o[1], qkvw = o[2], qkvb = o[3], attprojw = o[4], attprojb = o[5], fcw = o[8],
            fcb = o[9], fcprojw = o[10], fcprojb = o[11];
    }
    size_t lnfw = add_tensor(&tl, Cz, false), lnfb = add_tensor(&tl, Cz, false);
    size_t nparams = tl.total;
    float *P = buf(nparams), *D = buf(nparams), *mom = buf(nparams), *vel = buf_of(nparams, true);
    /* act16: the weights as the 16-bit GEMMs read them, which AdamW writes
     * beside P (train.c). */
    uint16_t *P16 = lp16 ? buf16(nparams) : NULL;

    /* ---- forward (gpt_body, then the loss) ----
     * Ops made several times per step at one shape (the layernorms, the
     * residual adds) are timed once and counted per_step times. */
    int ln_calls = 2 * L + 1;
    OP("encoder_fwd", 1, PART_REST, ops->encoder_forward(k, encoded, tok, P + wte, P + wpe, B, T, C));
    if (lp16) {
        OP("layernorm16_fwd", ln_calls, PART_REST,
           ops->layernorm_forward16(k, ln1_16, mean, rstd, encoded, P + ln1w, P + ln1b, (int)N, C));
        if (qkv16_on)
            OP("matmul16_qkv_fwd", L, PART_GEMM,
               ops->matmul_forward16_out16(k, qkv16, ln1_16, P16 + qkvw, P + qkvb, (int)N, C, 3 * C));
        else
            OP("matmul16_qkv_fwd", L, PART_GEMM,
               ops->matmul_forward16(k, qkv, ln1_16, P16 + qkvw, P + qkvb, (int)N, C, 3 * C));
    } else {
        OP("layernorm_fwd", ln_calls, PART_REST,
           ops->layernorm_forward(k, ln1, mean, rstd, encoded, P + ln1w, P + ln1b, (int)N, C));
        OP("matmul_qkv_fwd", L, PART_GEMM, ops->matmul_forward(k, qkv, ln1, P + qkvw, P + qkvb, (int)N, C, 3 * C));
    }
    if (qkv16_on) {
        OP("attention16_fwd", L, PART_ATTENTION,
           ops->attention_fused_forward16(k, atty16, att, qkv16, B, T, C, NH));
        OP("matmul16_proj_fwd", L, PART_GEMM,
           ops->matmul_forward16_residual(k, res2, atty16, P16 + attprojw, P + attprojb, encoded, (int)N, C, C));
    } else {
        if (fused)
            OP("attention_fwd", L, PART_ATTENTION, ops->attention_fused_forward(k, atty, att, qkv, B, T, C, NH));
        else
            OP("attention_fwd", L, PART_ATTENTION, ops->attention_forward(k, atty, preatt, att, qkv, B, T, C, NH));
        OP("matmul_proj_fwd", L, PART_GEMM,
           ops->matmul_forward(k, proj, atty, P + attprojw, P + attprojb, (int)N, C, C));
    }
    /* Both residual adds, where the projections do not make them (act16). */
    if (!lp16)
        OP("residual_fwd", 2 * L, PART_REST, ops->residual_forward(k, res2, encoded, proj, NC));
    else if (!qkv16_on)
        OP("residual_fwd", L, PART_REST, ops->residual_forward(k, res2, encoded, proj, NC));
    if (lp16) {
        if (ops->matmul_forward16_gelu) { /* GELU in the GEMM's epilogue, as the model runs it where it can */
            OP("matmul16_fc_gelu_fwd", L, PART_GEMM,
               ops->matmul_forward16_gelu(k, fch_gelu16, fch16, ln2_16, P16 + fcw, P + fcb, (int)N, C, 4 * C));
        } else {
            OP("matmul16_fc_fwd", L, PART_GEMM,
               ops->matmul_forward16_out16(k, fch16, ln2_16, P16 + fcw, P + fcb, (int)N, C, 4 * C));
            OP("gelu16_fwd", L, PART_REST, ops->gelu_forward16(k, fch_gelu16, fch16, 4 * NC));
        }
        OP("matmul16_fcproj_fwd", L, PART_GEMM,
           ops->matmul_forward16_residual(k, res3, fch_gelu16, P16 + fcprojw, P + fcprojb, res2, (int)N, 4 * C, C));
        OP("logits16_fwd", 1, PART_GEMM, ops->matmul_forward16_out16(k, logits16, lnf16, P16 + wte, NULL, (int)N, C, V));
        if (ops->crossentropy_fused16) /* the loss and its gradient in one pass, as training runs it */
            OP("crossentropy16_fused", 1, PART_REST,
               ops->crossentropy_fused16(k, losses, logits16, tok, dlosses, (int)N, V, V));
        else
            OP("crossentropy16_fwd", 1, PART_REST,
               ops->crossentropy_forward16(k, losses, lse, logits16, tok, (int)N, V, V));
    } else {
        OP("matmul_fc_fwd", L, PART_GEMM, ops->matmul_forward(k, fch, ln2, P + fcw, P + fcb, (int)N, C, 4 * C));
        OP("gelu_fwd", L, PART_REST, ops->gelu_forward(k, fch_gelu, fch, 4 * NC));
        OP("matmul_fcproj_fwd", L, PART_GEMM,
           ops->matmul_forward(k, proj, fch_gelu, P + fcprojw, P + fcprojb, (int)N, 4 * C, C));
        OP("matmul_lmhead_fwd", 1, PART_GEMM, ops->matmul_forward(k, logits, lnf, P + wte, NULL, (int)N, C, V));
        OP("crossentropy_fwd", 1, PART_REST, ops->crossentropy_forward(k, losses, lse, logits, tok, (int)N, V, V));
    }

    /* ---- backward (gpt_backward): dlogits over the logits, in place;
     * matmul and gelu backward overwrite their dinp, so the only zeroing
     * is of the two sums (the residual stream's gradient, the fused q/k/v
     * gradient) and of the key bias's gradient. ---- */
    if (lp16) {
        if (!ops->crossentropy_fused16)
            OP("crossentropy16_bwd", 1, PART_REST,
               ops->crossentropy_backward16(k, logits16, logits16, lse, tok, dlosses, (int)N, V, V));
        OP("logits16_bwd", 1, PART_GEMM,
           ops->matmul_backward16(k, NULL, dln16, D + wte, NULL, NULL, logits16, lnf16, P16 + wte, (int)N, C, V));
    } else {
        OP("crossentropy_bwd", 1, PART_REST,
           ops->crossentropy_backward(k, logits, logits, lse, tok, dlosses, (int)N, V, V));
        OP("matmul_lmhead_bwd", 1, PART_GEMM,
           ops->matmul_backward(k, dsmall, D + wte, NULL, logits, lnf, P + wte, (int)N, C, V));
    }
    OP("zero_dres", 1, PART_REST, ops->zero(k, dres, NC));
    /* On act16 the layernorm backwards read their dout in 16 bits (dln16,
     * as the GEMM backwards write it) and most also write dres16 for the
     * next GEMM backward (model_gpt.c; timed here as all of them). */
    if (lp16)
        OP("layernorm16_bwd", ln_calls, PART_REST,
           ops->layernorm_backward16(k, dres, dres16, D + lnfw, D + lnfb, NULL, dln16, res3, P + lnfw, mean, rstd,
                                     (int)N, C));
    else
        OP("layernorm_bwd", ln_calls, PART_REST,
           ops->layernorm_backward(k, dres, D + lnfw, D + lnfb, dsmall, res3, P + lnfw, mean, rstd, (int)N, C));
    if (lp16) {
        if (ops->matmul_backward16_dgelu) {
            OP("matmul16_fcproj_dgelu_bwd", L, PART_GEMM,
               ops->matmul_backward16_dgelu(k, dfch16, fch16, D + fcprojw, D + fcprojb, dres16, fch_gelu16,
                                            P16 + fcprojw, (int)N, 4 * C, C));
        } else {
            OP("matmul16_fcproj_bwd", L, PART_GEMM,
               ops->matmul_backward16(k, NULL, dfch16, D + fcprojw, D + fcprojb, NULL, dres16, fch_gelu16,
                                      P16 + fcprojw, (int)N, 4 * C, C));
            OP("gelu16_bwd", L, PART_REST, ops->gelu_backward16(k, dfch16, fch16, dfch16, 4 * NC));
        }
        OP("matmul16_fc_bwd", L, PART_GEMM,
           ops->matmul_backward16(k, NULL, dln16, D + fcw, D + fcb, NULL, dfch16, ln2_16, P16 + fcw, (int)N, C,
                                  4 * C));
    } else {
        OP("matmul_fcproj_bwd", L, PART_GEMM,
           ops->matmul_backward(k, dbig, D + fcprojw, D + fcprojb, dres, fch_gelu, P + fcprojw, (int)N, 4 * C, C));
        OP("gelu_bwd", L, PART_REST, ops->gelu_backward(k, dbig, fch, dbig, 4 * NC));
        OP("matmul_fc_bwd", L, PART_GEMM,
           ops->matmul_backward(k, dsmall, D + fcw, D + fcb, dbig, ln2, P + fcw, (int)N, C, 4 * C));
    }
    if (qkv16_on)
        OP("matmul16_proj_bwd", L, PART_GEMM,
           ops->matmul_backward16(k, NULL, dfch16, D + attprojw, D + attprojb, NULL, dres16, atty16, P16 + attprojw,
                                  (int)N, C, C));
    else
        OP("matmul_proj_bwd", L, PART_GEMM,
           ops->matmul_backward(k, dsmall, D + attprojw, D + attprojb, dres, atty, P + attprojw, (int)N, C, C));
    if (!qkv16_on) /* the 16-bit fused backward overwrites its gradient */
        OP("zero_dqkv", L, PART_REST, ops->zero(k, dqkv, 3 * NC));
    if (qkv16_on)
        OP("attention16_bwd", L, PART_ATTENTION,
           ops->attention_fused_backward16(k, dqkv16, dqkv, dfch16, atty16, att, qkv16, B, T, C, NH));
    else if (fused)
        OP("attention_bwd", L, PART_ATTENTION,
           ops->attention_fused_backward(k, dqkv, dsmall, atty, att, qkv, B, T, C, NH));
    else
        OP("attention_bwd", L, PART_ATTENTION,
           ops->attention_backward(k, dqkv, preatt, datt, dsmall, qkv, att, B, T, C, NH));
    if (qkv16_on)
        OP("matmul16_qkv_bwd", L, PART_GEMM,
           ops->matmul_backward16(k, NULL, dln16, D + qkvw, D + qkvb, NULL, dqkv16, ln1_16, P16 + qkvw, (int)N, C,
                                  3 * C));
    else if (lp16)
        OP("matmul16_qkv_bwd", L, PART_GEMM,
           ops->matmul_backward16(k, NULL, dln16, D + qkvw, D + qkvb, dqkv, NULL, ln1_16, P16 + qkvw, (int)N, C,
                                  3 * C));
    else
        OP("matmul_qkv_bwd", L, PART_GEMM,
           ops->matmul_backward(k, dsmall, D + qkvw, D + qkvb, dqkv, ln1, P + qkvw, (int)N, C, 3 * C));
    OP("zero_qkv_kbias", L, PART_REST, ops->zero(k, D + qkvb + C, Cz));
    OP("encoder_bwd", 1, PART_REST, ops->encoder_backward(k, D + wte, D + wpe, dres, tok, B, T, C));

    /* ---- the optimizer step as train.c's try_step makes it: zero the
     * gradients, their norm, adamw_multi over the tensors.  "adamw" (one
     * call over all parameters, no decay) and "adamw_per_tensor" (a call
     * per tensor) are kept for comparison: adamw_multi should take
     * adamw's time, not the per-tensor calls'. ---- */
    kern_segment *segs = malloc((size_t)tl.n * sizeof *segs);
    if (!segs) {
        fprintf(stderr, "bench_kernels: out of memory\n");
        return 1;
    }
    for (int i = 0; i < tl.n; i++)
        segs[i] = (kern_segment){tl.off[i], tl.numel[i], tl.decay[i]};
    double sq;
    OP("zero", 1, PART_REST, ops->zero(k, D, nparams));
    OP("sumsq", 1, PART_REST, ops->sumsq(k, &sq, D, nparams));
    OP("adamw", 0, PART_REST, ops->adamw(k, P, P16, D, mom, vel, nparams, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, 1));
    OP("adamw_per_tensor", 0, PART_REST, adamw_tensors(&tl, P, P16, D, mom, vel));
    OP("adamw_multi", 1, PART_REST,
       ops->adamw_multi(k, P, P16, D, mom, vel, segs, tl.n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1));

    double part[3] = {0, 0, 0};
    for (int i = 0; i < ntimes; i++) {
        emit(times[i].metric, times[i].ms, times[i].per_step);
        part[times[i].part] += times[i].per_step * times[i].ms;
    }
    double step = part[PART_GEMM] + part[PART_ATTENTION] + part[PART_REST];
    emit("step_sum_of_ops", step, -1);
    emit("step_gemm_part", part[PART_GEMM], -1);
    emit("step_attention_part", part[PART_ATTENTION], -1);
    emit("step_rest", part[PART_REST], -1);
    ops->ctx_destroy(k);
    return 0;
}
