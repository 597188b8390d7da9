/* bench_kernels.c — the CPU kernels at the GPT "small" shape of the CPU
 * benchmark (B=8, T=256, C=384, NH=6, V=256, L=6): milliseconds per call of
 * each op, and their sum over one training step (forward, backward, AdamW),
 * one JSON line per figure.  No peer here: bench/ compares whole steps with
 * PyTorch; this one says where a step's time goes.
 *
 * usage: bench_kernels [threads] [B T C NH V L]   (threads 0 = all cores) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static float *buf(size_t n)
{
    float *p = malloc(n * sizeof *p);
    if (!p) {
        fprintf(stderr, "bench_kernels: out of memory (%zu floats)\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    return p;
}

/* var = best of `reps` timings of the statement, in ms. */
#define TIME(var, reps, stmt)                                                                                   \
    do {                                                                                                        \
        var = 1e30;                                                                                             \
        for (int r_ = 0; r_ < (reps); r_++) {                                                                   \
            double t0_ = now_ms();                                                                              \
            stmt;                                                                                               \
            double dt_ = now_ms() - t0_;                                                                        \
            if (dt_ < var)                                                                                      \
                var = dt_;                                                                                      \
        }                                                                                                       \
    } while (0)

static void emit(const char *metric, double ms, const char *shape)
{
    printf("{\"bench\":\"kernels_cpu\",\"metric\":\"%s\",\"value\":%.4f,\"unit\":\"ms\",\"shape\":\"%s\","
           "\"peer\":null,\"peer_value\":null,\"ratio\":null}\n",
           metric, ms, shape);
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    int B = 8, T = 256, C = 384, NH = 6, V = 256, L = 6;
    if (argc > 7)
        B = atoi(argv[2]), T = atoi(argv[3]), C = atoi(argv[4]), NH = atoi(argv[5]), V = atoi(argv[6]),
        L = atoi(argv[7]);
    const kern_ops *ops = kern_cpu_ops();
    kern_ctx *k = ops->ctx_create(threads, 0, KERN_FP32, NULL);
    size_t N = (size_t)B * T, na = (size_t)B * NH * T * T;
    int Vp = (V + 63) / 64 * 64;
    char shape[96];
    snprintf(shape, sizeof shape, "B=%d T=%d C=%d NH=%d V=%d L=%d", B, T, C, NH, V, L);

    float *x = buf(N * C), *y = buf(N * C), *qkv = buf(N * 3 * C), *dqkv = buf(N * 3 * C), *h = buf(N * 4 * C);
    float *dh = buf(N * 4 * C), *pre = buf(na), *att = buf(na), *s1 = buf(na), *s2 = buf(na);
    float *w = buf((size_t)4 * C * C), *dw = buf((size_t)4 * C * C), *b = buf(4 * (size_t)C), *db = buf(4 * (size_t)C);
    float *mean = buf(N), *rstd = buf(N), *lw = buf(C), *lb = buf(C), *dlw = buf(C), *dlb = buf(C);
    float *logits = buf(N * Vp), *probs = buf(N * Vp), *losses = buf(N), *dloss = buf(N), *wte = buf((size_t)Vp * C);
    int32_t *tok = malloc(N * sizeof *tok);
    for (size_t i = 0; i < N; i++)
        tok[i] = (int32_t)(i * 7 % V);
    size_t nparams = (size_t)12 * L * C * C + (size_t)V * C + (size_t)T * C;
    float *p = buf(nparams), *g = buf(nparams), *m = buf(nparams), *v = buf(nparams);
    for (size_t i = 0; i < nparams; i++)
        v[i] = v[i] * v[i];
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
    TIME(att_f, R, ops->attention_forward(k, y, pre, att, qkv, B, T, C, NH));
    double att_b;
    TIME(att_b, R, ops->attention_backward(k, dqkv, s1, s2, y, qkv, att, B, T, C, NH));
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
    TIME(ce_f, R, ops->crossentropy_forward(k, losses, probs, logits, tok, (int)N, V, Vp));
    double ce_b;
    TIME(ce_b, R, ops->crossentropy_backward(k, logits, probs, tok, dloss, (int)N, V, Vp));
    double enc_f;
    TIME(enc_f, R, ops->encoder_forward(k, x, tok, wte, wte, B, T, C));
    double enc_b;
    TIME(enc_b, R, ops->encoder_backward(k, wte, wte, x, tok, B, T, C));
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
