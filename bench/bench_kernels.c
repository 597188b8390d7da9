/* bench_kernels.c — the CPU kernels at the GPT "small" shape of the CPU
 * benchmark (B=8, T=256, C=384, NH=6, V=256, L=6): milliseconds per call of
 * each op, and their sum over one training step (forward, backward, AdamW),
 * one JSON line per figure.  No peer here: bench/ compares whole steps with
 * PyTorch; this one says where a step's time goes.
 *
 * usage: bench_kernels [threads] [B T C NH V L]   (threads 0 = all cores)
 *
 * Built a second time as bench_kernels_cuda (BENCH_CUDA) when CUDA is
 * available: the same table of figures for the CUDA kernels of the
 * gradd-cuda module, on device buffers, each call timed to its completion
 * (the op, then sync):
 *   bench_kernels_cuda MODULE fp32|bf16|fp16 [B T C NH V L]
 * Attention is the fused kernel wherever the module has it for the shape.
 * Exits 77 without a usable GPU. */
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
static const kern_ops *ops;
static kern_ctx *k;
#endif

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* n values in [-0.5, 0.5), or their squares (AdamW's second moment must
 * not be negative). */
static float *buf_of(size_t n, bool square)
{
    float *p = malloc(n * sizeof *p);
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
    /* The same values, on the device. */
    float *d = NULL;
    if (cudaMalloc((void **)&d, n * sizeof *d) != cudaSuccess) {
        fprintf(stderr, "bench_kernels: out of device memory (%zu floats)\n", n);
        exit(1);
    }
    ops->copy_h2d(k, d, p, n * sizeof *p);
    ops->sync(k);
    free(p);
    return d;
#else
    return p;
#endif
}

static float *buf(size_t n) { return buf_of(n, false); }

/* var = best of `reps` timings of the statement, in ms. */
#define TIME(var, reps, stmt)                                                                                   \
    do {                                                                                                        \
        var = 1e30;                                                                                             \
        for (int r_ = 0; r_ < (reps); r_++) {                                                                   \
            double t0_ = now_ms();                                                                              \
            stmt;                                                                                               \
            ops->sync(k);                                                                                       \
            double dt_ = now_ms() - t0_;                                                                        \
            if (dt_ < var)                                                                                      \
                var = dt_;                                                                                      \
        }                                                                                                       \
    } while (0)

static void emit(const char *metric, double ms, const char *shape)
{
    printf("{\"bench\":\"%s\",\"metric\":\"%s\",\"value\":%.4f,\"unit\":\"ms\",\"shape\":\"%s\","
           "\"peer\":null,\"peer_value\":null,\"ratio\":null}\n",
           BENCH_NAME, metric, ms, shape);
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
    kern_precision prec = strcmp(argv[2], "bf16") == 0 ? KERN_BF16 : strcmp(argv[2], "fp16") == 0 ? KERN_FP16 : KERN_FP32;
    k = ops->ctx_create(0, 0, prec, NULL);
    bool fused = ops->attention_fused_ok && ops->attention_fused_ok(k, C, NH);
#else
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    const kern_ops *ops = kern_cpu_ops();
    kern_ctx *k = ops->ctx_create(threads, 0, KERN_FP32, NULL);
    bool fused = false;
#endif
    size_t N = (size_t)B * T, na = fused ? (size_t)B * NH * T : (size_t)B * NH * T * T;
    int Vp = (V + 63) / 64 * 64;
    char shape[96];
    snprintf(shape, sizeof shape, "B=%d T=%d C=%d NH=%d V=%d L=%d", B, T, C, NH, V, L);

    float *x = buf(N * C), *y = buf(N * C), *qkv = buf(N * 3 * C), *dqkv = buf(N * 3 * C), *h = buf(N * 4 * C);
    float *dh = buf(N * 4 * C), *pre = buf(na), *att = buf(na), *s1 = buf(na), *s2 = buf(na);
    float *w = buf((size_t)4 * C * C), *dw = buf((size_t)4 * C * C), *b = buf(4 * (size_t)C), *db = buf(4 * (size_t)C);
    float *mean = buf(N), *rstd = buf(N), *lw = buf(C), *lb = buf(C), *dlw = buf(C), *dlb = buf(C);
    float *logits = buf(N * Vp), *lse = buf(N), *losses = buf(N), *dloss = buf(N), *wte = buf((size_t)Vp * C);
    float *wpe = buf((size_t)T * C); /* its own: with V < T, wte is too small to stand in for it */
    int32_t *tok = malloc(N * sizeof *tok);
    for (size_t i = 0; i < N; i++)
        tok[i] = (int32_t)(i * 7 % V);
#ifdef BENCH_CUDA
    {
        int32_t *d = NULL;
        if (cudaMalloc((void **)&d, N * sizeof *d) != cudaSuccess)
            return 1;
        ops->copy_h2d(k, d, tok, N * sizeof *tok);
        ops->sync(k);
        free(tok);
        tok = d;
    }
#endif
    size_t nparams = (size_t)12 * L * C * C + (size_t)V * C + (size_t)T * C;
    float *p = buf(nparams), *g = buf(nparams), *m = buf(nparams), *v = buf_of(nparams, true);
    const int R = 5;

    /* per layer: 4 matmuls (qkv, proj, fc, fc-proj), 2 layernorms, attention, gelu, 2 residuals */
    double mm_qkv_f;
    TIME(mm_qkv_f, R, ops->matmul_forward(k, qkv, x, w, b, (int)N, C, 3 * C));
    double mm_qkv_b;
    TIME(mm_qkv_b, R, ops->matmul_backward(k, x, dw, db, dqkv, x, w, (int)N, C, 3 * C));
    double mm_proj_f;
    TIME(mm_proj_f, R, ops->matmul_forward(k, y, x, w, b, (int)N, C, C));
    double mm_proj_b;
    TIME(mm_proj_b, R, ops->matmul_backward(k, y, dw, db, x, x, w, (int)N, C, C));
    double mm_fc_f;
    TIME(mm_fc_f, R, ops->matmul_forward(k, h, x, w, b, (int)N, C, 4 * C));
    double mm_fc_b;
    TIME(mm_fc_b, R, ops->matmul_backward(k, x, dw, db, dh, x, w, (int)N, C, 4 * C));
    double mm_fc2_f;
    TIME(mm_fc2_f, R, ops->matmul_forward(k, x, h, w, b, (int)N, 4 * C, C));
    double mm_fc2_b;
    TIME(mm_fc2_b, R, ops->matmul_backward(k, dh, dw, db, x, h, w, (int)N, 4 * C, C));
    double att_f;
    double att_b;
    if (fused) {
        TIME(att_f, R, ops->attention_fused_forward(k, y, pre, qkv, B, T, C, NH));
        TIME(att_b, R, ops->attention_fused_backward(k, dqkv, x, y, pre, qkv, B, T, C, NH));
    } else {
        TIME(att_f, R, ops->attention_forward(k, y, pre, att, qkv, B, T, C, NH));
        TIME(att_b, R, ops->attention_backward(k, dqkv, s1, s2, y, qkv, att, B, T, C, NH));
    }
    double ln_f;
    TIME(ln_f, R, ops->layernorm_forward(k, y, mean, rstd, x, lw, lb, (int)N, C));
    double ln_b;
    TIME(ln_b, R, ops->layernorm_backward(k, y, dlw, dlb, x, x, lw, mean, rstd, (int)N, C));
    double gelu_f;
    TIME(gelu_f, R, ops->gelu_forward(k, dh, h, N * 4 * C));
    double gelu_b;
    TIME(gelu_b, R, ops->gelu_backward(k, dh, h, h, N * 4 * C));
    double res_f;
    TIME(res_f, R, ops->residual_forward(k, y, x, x, N * C));
    double acc;
    TIME(acc, R, ops->accumulate(k, y, x, N * C));
    double head_f;
    TIME(head_f, R, ops->matmul_forward(k, logits, x, wte, NULL, (int)N, C, Vp));
    double head_b;
    TIME(head_b, R, ops->matmul_backward(k, x, wte, NULL, logits, x, wte, (int)N, C, Vp));
    double ce_f;
    TIME(ce_f, R, ops->crossentropy_forward(k, losses, lse, logits, tok, (int)N, V, Vp));
    double ce_b; /* in place, as the models call it */
    TIME(ce_b, R, ops->crossentropy_backward(k, logits, logits, lse, tok, dloss, (int)N, V, Vp));
    double enc_f;
    TIME(enc_f, R, ops->encoder_forward(k, x, tok, wte, wpe, B, T, C));
    double enc_b;
    TIME(enc_b, R, ops->encoder_backward(k, wte, wpe, x, tok, B, T, C));
    double adam;
    TIME(adam, R, ops->adamw(k, p, g, m, v, nparams, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, 1));
    double sq, norm;
    TIME(norm, R, ops->sumsq(k, &sq, g, nparams));
    double zero;
    TIME(zero, R, ops->zero(k, g, nparams));

    emit("matmul_qkv_fwd", mm_qkv_f, shape);
    emit("matmul_qkv_bwd", mm_qkv_b, shape);
    emit("matmul_fc_fwd", mm_fc_f, shape);
    emit("matmul_fc_bwd", mm_fc_b, shape);
    emit("attention_fwd", att_f, shape);
    emit("attention_bwd", att_b, shape);
    emit("layernorm_fwd", ln_f, shape);
    emit("layernorm_bwd", ln_b, shape);
    emit("gelu_fwd", gelu_f, shape);
    emit("gelu_bwd", gelu_b, shape);
    emit("crossentropy_fwd", ce_f, shape);
    emit("crossentropy_bwd", ce_b, shape);
    emit("adamw", adam, shape);
    emit("encoder_fwd", enc_f, shape);
    emit("encoder_bwd", enc_b, shape);
    emit("matmul_lmhead_fwd", head_f, shape);
    emit("matmul_lmhead_bwd", head_b, shape);
    emit("matmul_proj_fwd", mm_proj_f, shape);
    emit("matmul_proj_bwd", mm_proj_b, shape);
    emit("matmul_fcproj_fwd", mm_fc2_f, shape);
    emit("matmul_fcproj_bwd", mm_fc2_b, shape);
    emit("residual_fwd", res_f, shape);
    emit("accumulate", acc, shape);
    emit("sumsq", norm, shape);
    emit("zero", zero, shape);
    double layer = mm_qkv_f + mm_qkv_b + mm_proj_f + mm_proj_b + mm_fc_f + mm_fc_b + mm_fc2_f + mm_fc2_b + att_f +
                   att_b + 2 * (ln_f + ln_b) + gelu_f + gelu_b + 2 * (res_f + 2 * acc);
    double step = L * layer + ln_f + ln_b + head_f + head_b + ce_f + ce_b + enc_f + enc_b + adam + norm + zero;
    double gemm = L * (mm_qkv_f + mm_qkv_b + mm_proj_f + mm_proj_b + mm_fc_f + mm_fc_b + mm_fc2_f + mm_fc2_b) +
                  head_f + head_b;
    double attn = L * (att_f + att_b);
    emit("step_sum_of_ops", step, shape);
    emit("step_gemm_part", gemm, shape);
    emit("step_attention_part", attn, shape);
    emit("step_rest", step - gemm - attn, shape);
    ops->ctx_destroy(k);
    return 0;
}
