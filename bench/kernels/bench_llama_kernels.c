/* bench_llama_kernels.c — where a Llama training step's time goes, op by
 * op: milliseconds per call of each op daemon/models/model_llama.c makes in
 * a step, in its order and with its buffers, and their sum over the step
 * (forward, backward, the optimizer), one JSON line per figure (opbench.h).
 * No peer: bench/llama compares whole steps with PyTorch; this one says
 * which ops to work on.
 *
 * usage: bench_llama_kernels [threads] [B T C NH KVH F V L]
 *        bench_llama_kernels_cuda MODULE fp32|bf16|fp16 [B T C NH KVH F V L]
 * The CPU build defaults to a small shape; the CUDA one to Llama 3.2 1B's
 * (B 4, T 2048, width 2048, 32 heads over 8 key/value heads, MLP 8192,
 * vocabulary 128256, 16 layers, the head tied to the embedding), and
 * exits 77 without a usable GPU.  The attention is the module's
 * attention_gqa_* (GRADD_GQA chooses its kernels there).
 *
 * Two paths, chosen as model_llama.c chooses them and named in every line
 * ("path"): act16 (a bf16/fp16 context with the 16-bit activation ops,
 * unless GRADD_ACT16=0: the RMSNorm outputs, [gate | up], the SwiGLU
 * output and the logits in 16 bits; metrics rmsnorm16_*, matmul16_*,
 * swiglu16_*, logits16_*, crossentropy16_*), or fp32.  Ops made several
 * times per step at one shape are timed once and counted per_step times. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "models/model.h"
#include "opbench.h"

/* model_llama.c's condition for its 16-bit path, the job's part aside. */
static bool act16_path(void)
{
    return ob_prec != KERN_FP32 && model_act16_kernels(ob_ops) && ob_ops->rmsnorm_forward16 &&
           ob_ops->rmsnorm_backward16 && ob_ops->swiglu_forward16 && ob_ops->swiglu_backward16;
}

int main(int argc, char **argv)
{
#ifdef BENCH_CUDA
    int B = 4, T = 2048, C = 2048, NH = 32, KVH = 8, F = 8192, V = 128256, L = 16;
#else
    int B = 4, T = 256, C = 256, NH = 8, KVH = 2, F = 704, V = 1024, L = 4;
#endif
    int a0, rc = ob_open(argc, argv, "B T C NH KVH F V L", &a0);
    if (rc)
        return rc;
    if (argc > a0 + 7)
        B = atoi(argv[a0]), T = atoi(argv[a0 + 1]), C = atoi(argv[a0 + 2]), NH = atoi(argv[a0 + 3]),
        KVH = atoi(argv[a0 + 4]), F = atoi(argv[a0 + 5]), V = atoi(argv[a0 + 6]), L = atoi(argv[a0 + 7]);
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || KVH <= 0 || F <= 0 || V <= 0 || L <= 0 || C % NH || NH % KVH ||
        (C / NH) % 2) {
        fprintf(stderr, "%s: bad shape B=%d T=%d C=%d NH=%d KVH=%d F=%d V=%d L=%d\n", argv[0], B, T, C, NH, KVH, F,
                V, L);
        return 2;
    }
    const int HS = C / NH, W = (NH + 2 * KVH) * HS;
    if (!ob_ops->attention_gqa_forward || (ob_ops->attention_gqa_ok && !ob_ops->attention_gqa_ok(ob_k, NH, KVH, HS))) {
        fprintf(stderr, "%s: the %s kernels have no attention for %d heads of %d over %d\n", argv[0], ob_ops->name,
                NH, HS, KVH);
        return 1;
    }
    bool lp16 = act16_path();
    ob_path = lp16 ? "act16" : "fp32";
    snprintf(ob_shape, sizeof ob_shape, "B=%d T=%d C=%d NH=%d KVH=%d F=%d V=%d L=%d", B, T, C, NH, KVH, F, V, L);

    /* One layer's activations and the model's scratch. */
    size_t N = (size_t)B * T, NC = N * C, NF = N * F;
    float *encoded = ob_buf(NC), *res2 = ob_buf(NC), *res3 = ob_buf(NC), *rstd = ob_buf(N);
    float *qkv = ob_buf(N * W), *atty = ob_buf(NC), *lse = ob_buf((size_t)B * NH * T), *dres = ob_buf(NC);
    float *dsmall = ob_buf(NC), *dqkv = ob_buf(N * W), *losses = ob_buf(N), *dlosses = ob_buf(N), *lse_ce = ob_buf(N);
    float *inv_freq = ob_buf((size_t)HS / 2);
    float *ln1 = NULL, *ln2 = NULL, *gu = NULL, *hid = NULL, *lnf = NULL, *logits = NULL, *proj = NULL;
    float *dgu = NULL, *dhid = NULL;
    uint16_t *ln1_16 = NULL, *ln2_16 = NULL, *gu16 = NULL, *hid16 = NULL, *lnf16 = NULL, *logits16 = NULL;
    uint16_t *atty16 = NULL, *dres16 = NULL, *dln16 = NULL, *dgu16 = NULL, *dhid16 = NULL;
    if (lp16) {
        ln1_16 = ob_buf16(NC), ln2_16 = ob_buf16(NC), gu16 = ob_buf16(2 * NF), hid16 = ob_buf16(NF);
        lnf16 = ob_buf16(NC), logits16 = ob_buf16(N * V), atty16 = ob_buf16(NC), dres16 = ob_buf16(NC);
        dln16 = ob_buf16(NC), dgu16 = ob_buf16(2 * NF), dhid16 = ob_buf16(NF);
    } else {
        ln1 = ob_buf(NC), ln2 = ob_buf(NC), gu = ob_buf(2 * NF), hid = ob_buf(NF), lnf = ob_buf(NC);
        logits = ob_buf(N * V), proj = ob_buf(NC), dgu = ob_buf(2 * NF), dhid = ob_buf(NF);
    }
    int32_t *tok = ob_tokens(N, V);

    /* Parameters as model_llama.c lays them out (tied head): the ops
     * below read layer 0's. */
    ob_tensors tl;
    ob_tensors_init(&tl, 9 * L + 2);
    size_t Cz = (size_t)C, KC = (size_t)KVH * HS, Fz = (size_t)F;
    size_t embed = ob_add_tensor(&tl, (size_t)V * Cz, true);
    size_t ln1w = 0, qkvw = 0, ow = 0, guw = 0, downw = 0;
    for (int l = 0; l < L; l++) {
        size_t o[9] = {ob_add_tensor(&tl, Cz, false),      ob_add_tensor(&tl, Cz * Cz, true),
                       ob_add_tensor(&tl, KC * Cz, true),  ob_add_tensor(&tl, KC * Cz, true),
                       ob_add_tensor(&tl, Cz * Cz, true),  ob_add_tensor(&tl, Cz, false),
                       ob_add_tensor(&tl, Fz * Cz, true),  ob_add_tensor(&tl, Fz * Cz, true),
                       ob_add_tensor(&tl, Cz * Fz, true)};
        if (l == 0)
            ln1w = o[0], qkvw = o[1], ow = o[4], guw = o[6], downw = o[8];
    }
    size_t normw = ob_add_tensor(&tl, Cz, false), head = embed;
    size_t nparams = tl.total;
    float *P = ob_buf(nparams), *D = ob_buf(nparams), *mom = ob_buf(nparams), *vel = ob_buf_sq(nparams);
    uint16_t *P16 = lp16 ? ob_buf16(nparams) : NULL;
    const float eps = 1e-5f;
    int norms = 2 * L + 1;

    /* ---- forward (llama_body and the loss) ---- */
    OB_OP("embed_fwd", 1, OB_REST, ob_ops->encoder_forward(ob_k, encoded, tok, P + embed, NULL, B, T, C));
    if (lp16) {
        OB_OP("rmsnorm16_fwd", norms, OB_REST,
              ob_ops->rmsnorm_forward16(ob_k, ln1_16, rstd, encoded, P + ln1w, (int)N, C, eps));
        OB_OP("matmul16_qkv_fwd", L, OB_GEMM,
              ob_ops->matmul_forward16(ob_k, qkv, ln1_16, P16 + qkvw, NULL, (int)N, C, W));
    } else {
        OB_OP("rmsnorm_fwd", norms, OB_REST, ob_ops->rmsnorm_forward(ob_k, ln1, rstd, encoded, P + ln1w, (int)N, C, eps));
        OB_OP("matmul_qkv_fwd", L, OB_GEMM, ob_ops->matmul_forward(ob_k, qkv, ln1, P + qkvw, NULL, (int)N, C, W));
    }
    OB_OP("rope_fwd", L, OB_REST, ob_ops->rope_forward(ob_k, qkv, inv_freq, NULL, (int)N, T, NH + KVH, HS, W));
    OB_OP("gqa_fwd", L, OB_ATTENTION, ob_ops->attention_gqa_forward(ob_k, atty, lse, qkv, NULL, B, T, NH, KVH, HS));
    if (lp16) {
        /* The attention output rounded for its projection, forward and
         * backward. */
        OB_OP("cast_atty16", 2 * L, OB_REST, ob_narrow(atty16, atty, NC));
        OB_OP("matmul16_o_fwd", L, OB_GEMM,
              ob_ops->matmul_forward16_residual(ob_k, res2, atty16, P16 + ow, NULL, encoded, (int)N, C, C));
        OB_OP("matmul16_gateup_fwd", L, OB_GEMM,
              ob_ops->matmul_forward16_out16(ob_k, gu16, ln2_16, P16 + guw, NULL, (int)N, C, 2 * F));
        OB_OP("swiglu16_fwd", L, OB_REST, ob_ops->swiglu_forward16(ob_k, hid16, gu16, (int)N, F));
        OB_OP("matmul16_down_fwd", L, OB_GEMM,
              ob_ops->matmul_forward16_residual(ob_k, res3, hid16, P16 + downw, NULL, res2, (int)N, F, C));
        OB_OP("logits16_fwd", 1, OB_GEMM,
              ob_ops->matmul_forward16_out16(ob_k, logits16, lnf16, P16 + head, NULL, (int)N, C, V));
        if (ob_ops->crossentropy_fused16) /* the loss and its gradient in one pass, as training runs it */
            OB_OP("crossentropy16_fused", 1, OB_REST,
                  ob_ops->crossentropy_fused16(ob_k, losses, logits16, tok, dlosses, (int)N, V, V));
        else
            OB_OP("crossentropy16_fwd", 1, OB_REST,
                  ob_ops->crossentropy_forward16(ob_k, losses, lse_ce, logits16, tok, (int)N, V, V));
    } else {
        OB_OP("matmul_o_fwd", L, OB_GEMM, ob_ops->matmul_forward(ob_k, proj, atty, P + ow, NULL, (int)N, C, C));
        OB_OP("residual_fwd", 2 * L, OB_REST, ob_ops->residual_forward(ob_k, res2, encoded, proj, NC));
        OB_OP("matmul_gateup_fwd", L, OB_GEMM,
              ob_ops->matmul_forward(ob_k, gu, ln2, P + guw, NULL, (int)N, C, 2 * F));
        OB_OP("swiglu_fwd", L, OB_REST, ob_ops->swiglu_forward(ob_k, hid, gu, (int)N, F));
        OB_OP("matmul_down_fwd", L, OB_GEMM, ob_ops->matmul_forward(ob_k, proj, hid, P + downw, NULL, (int)N, F, C));
        OB_OP("logits_fwd", 1, OB_GEMM, ob_ops->matmul_forward(ob_k, logits, lnf, P + head, NULL, (int)N, C, V));
        OB_OP("crossentropy_fwd", 1, OB_REST,
              ob_ops->crossentropy_forward(ob_k, losses, lse_ce, logits, tok, (int)N, V, V));
    }

    /* ---- backward (llama_backward_body) ---- */
    if (lp16) {
        if (!ob_ops->crossentropy_fused16)
            OB_OP("crossentropy16_bwd", 1, OB_REST,
                  ob_ops->crossentropy_backward16(ob_k, logits16, logits16, lse_ce, tok, dlosses, (int)N, V, V));
        OB_OP("logits16_bwd", 1, OB_GEMM,
              ob_ops->matmul_backward16(ob_k, NULL, dln16, D + head, NULL, NULL, logits16, lnf16, P16 + head, (int)N,
                                        C, V));
    } else {
        OB_OP("crossentropy_bwd", 1, OB_REST,
              ob_ops->crossentropy_backward(ob_k, logits, logits, lse_ce, tok, dlosses, (int)N, V, V));
        OB_OP("logits_bwd", 1, OB_GEMM,
              ob_ops->matmul_backward(ob_k, dsmall, D + head, NULL, logits, lnf, P + head, (int)N, C, V));
    }
    OB_OP("zero_dres", 1, OB_REST, ob_ops->zero(ob_k, dres, NC));
    if (lp16) {
        OB_OP("rmsnorm16_bwd", norms, OB_REST,
              ob_ops->rmsnorm_backward16(ob_k, dres, dres16, D + normw, NULL, dln16, res3, P + normw, rstd, (int)N,
                                         C));
        OB_OP("matmul16_down_bwd", L, OB_GEMM,
              ob_ops->matmul_backward16(ob_k, NULL, dhid16, D + downw, NULL, NULL, dres16, hid16, P16 + downw,
                                        (int)N, F, C));
        OB_OP("swiglu16_bwd", L, OB_REST, ob_ops->swiglu_backward16(ob_k, dgu16, gu16, dhid16, (int)N, F));
        OB_OP("matmul16_gateup_bwd", L, OB_GEMM,
              ob_ops->matmul_backward16(ob_k, NULL, dln16, D + guw, NULL, NULL, dgu16, ln2_16, P16 + guw, (int)N, C,
                                        2 * F));
        OB_OP("matmul16_o_bwd", L, OB_GEMM,
              ob_ops->matmul_backward16(ob_k, dsmall, NULL, D + ow, NULL, NULL, dres16, atty16, P16 + ow, (int)N, C,
                                        C));
    } else {
        OB_OP("rmsnorm_bwd", norms, OB_REST,
              ob_ops->rmsnorm_backward(ob_k, dres, D + normw, dsmall, res3, P + normw, rstd, (int)N, C));
        OB_OP("matmul_down_bwd", L, OB_GEMM,
              ob_ops->matmul_backward(ob_k, dhid, D + downw, NULL, dres, hid, P + downw, (int)N, F, C));
        OB_OP("swiglu_bwd", L, OB_REST, ob_ops->swiglu_backward(ob_k, dgu, gu, dhid, (int)N, F));
        OB_OP("matmul_gateup_bwd", L, OB_GEMM,
              ob_ops->matmul_backward(ob_k, dsmall, D + guw, NULL, dgu, ln2, P + guw, (int)N, C, 2 * F));
        OB_OP("matmul_o_bwd", L, OB_GEMM,
              ob_ops->matmul_backward(ob_k, dsmall, D + ow, NULL, dres, atty, P + ow, (int)N, C, C));
    }
    OB_OP("gqa_bwd", L, OB_ATTENTION,
          ob_ops->attention_gqa_backward(ob_k, dqkv, dsmall, atty, lse, qkv, NULL, B, T, NH, KVH, HS));
    OB_OP("rope_bwd", L, OB_REST, ob_ops->rope_backward(ob_k, dqkv, inv_freq, NULL, (int)N, T, NH + KVH, HS, W));
    if (lp16)
        OB_OP("matmul16_qkv_bwd", L, OB_GEMM,
              ob_ops->matmul_backward16(ob_k, NULL, dln16, D + qkvw, NULL, dqkv, NULL, ln1_16, P16 + qkvw, (int)N, C,
                                        W));
    else
        OB_OP("matmul_qkv_bwd", L, OB_GEMM,
              ob_ops->matmul_backward(ob_k, dsmall, D + qkvw, NULL, dqkv, ln1, P + qkvw, (int)N, C, W));
    OB_OP("embed_bwd", 1, OB_REST, ob_ops->encoder_backward(ob_k, D + embed, NULL, dres, tok, B, T, C));

    ob_optimizer(&tl, P, P16, D, mom, vel);
    ob_emit_all();
    ob_close();
    return 0;
}
