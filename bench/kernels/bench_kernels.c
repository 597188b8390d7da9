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

#include "models/model.h"
#include "opbench.h"

/* The 16-bit activation path, on exactly model_gpt.c's condition, so that
 * the figures are those of the sequence a training job runs (and
 * GRADD_ACT16=0 compares the two paths here as it does there). */
static bool act16_path(void)
{
    return ob_prec != KERN_FP32 && model_act16_kernels(ob_ops) && ob_ops->layernorm_forward16 &&
           ob_ops->layernorm_backward16 && ob_ops->gelu_forward16 && ob_ops->gelu_backward16;
}

/* AdamW once per tensor, decay on the matrices, as train.c called it
 * before adamw_multi. */
static void adamw_tensors(const ob_tensors *t, float *P, uint16_t *P16, const float *D, float *m, float *v)
{
    for (int i = 0; i < t->n; i++) {
        size_t o = t->off[i];
        ob_ops->adamw(ob_k, P + o, P16 ? P16 + o : NULL, D + o, m + o, v + o, t->numel[i], 1e-4f, 0.9f, 0.95f,
                      1e-8f, t->decay[i] ? 0.1f : 0.0f, 1.0f, 1);
    }
}

int main(int argc, char **argv)
{
    int B = 8, T = 256, C = 384, NH = 6, V = 256, L = 6;
    int a0, rc = ob_open(argc, argv, "B T C NH V L", &a0);
    if (rc)
        return rc;
    if (argc > a0 + 5)
        B = atoi(argv[a0]), T = atoi(argv[a0 + 1]), C = atoi(argv[a0 + 2]), NH = atoi(argv[a0 + 3]),
        V = atoi(argv[a0 + 4]), L = atoi(argv[a0 + 5]);
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || V <= 0 || L <= 0 || C % NH) {
        fprintf(stderr, "bench_kernels: bad shape B=%d T=%d C=%d NH=%d V=%d L=%d\n", B, T, C, NH, V, L);
        return 2;
    }
    bool fused = ob_ops->attention_fused_ok && ob_ops->attention_fused_ok(ob_k, C, NH);
    bool lp16 = act16_path();
    /* As model_gpt.c: with fused attention the 16-bit path keeps qkv in 16 bits. */
    bool qkv16_on = lp16 && fused && ob_ops->attention_fused_forward16 && ob_ops->attention_fused_backward16;
    ob_path = lp16 ? "act16" : "fp32";
    snprintf(ob_shape, sizeof ob_shape, "B=%d T=%d C=%d NH=%d V=%d L=%d", B, T, C, NH, V, L);

    /* One layer's activations and the model's scratch (the per-layer
     * buffers of every layer cost the same to read and write). */
    size_t N = (size_t)B * T, NC = N * C, nscore = (size_t)B * NH * T * T;
    float *encoded = ob_buf(NC), *res2 = ob_buf(NC), *res3 = ob_buf(NC), *mean = ob_buf(N), *rstd = ob_buf(N);
    float *qkv = qkv16_on ? NULL : ob_buf(3 * NC), *atty = qkv16_on ? NULL : ob_buf(NC);
    float *att = ob_buf(fused ? (size_t)B * NH * T : nscore), *proj = ob_buf(NC);
    float *preatt = fused ? NULL : ob_buf(nscore), *datt = fused ? NULL : ob_buf(nscore);
    float *dres = ob_buf(NC), *dqkv = ob_buf(3 * NC), *dsmall = ob_buf(NC);
    float *lse = ob_buf(N), *losses = ob_buf(N), *dlosses = ob_buf(N);
    /* The activations that only GEMMs read, and the MLP's hidden layer and
     * its gradient: fp32, or 16-bit on act16. */
    float *ln1 = NULL, *ln2 = NULL, *fch = NULL, *fch_gelu = NULL, *lnf = NULL, *logits = NULL, *dbig = NULL;
    uint16_t *ln1_16 = NULL, *ln2_16 = NULL, *fch16 = NULL, *fch_gelu16 = NULL, *lnf16 = NULL, *logits16 = NULL;
    uint16_t *dres16 = lp16 ? ob_buf16(NC) : NULL, *dln16 = lp16 ? ob_buf16(NC) : NULL;
    uint16_t *dfch16 = NULL, *qkv16 = qkv16_on ? ob_buf16(3 * NC) : NULL, *atty16 = qkv16_on ? ob_buf16(NC) : NULL;
    uint16_t *dqkv16 = qkv16_on ? ob_buf16(3 * NC) : NULL;
    if (lp16) {
        ln1_16 = ob_buf16(NC), ln2_16 = ob_buf16(NC), fch16 = ob_buf16(4 * NC), fch_gelu16 = ob_buf16(4 * NC);
        lnf16 = ob_buf16(NC);
        logits16 = ob_buf16(N * V), dfch16 = ob_buf16(4 * NC);
    } else {
        ln1 = ob_buf(NC), ln2 = ob_buf(NC), fch = ob_buf(4 * NC), fch_gelu = ob_buf(4 * NC), lnf = ob_buf(NC);
        logits = ob_buf(N * V);
        dbig = ob_buf(4 * NC);
    }
    int32_t *tok = ob_tokens(N, V);

    /* Parameters as the model lays them out: AdamW runs once per tensor,
     * and the ops below read layer 0's weights. */
    int ntensors = 12 * L + 4;
    ob_tensors tl;
    ob_tensors_init(&tl, ntensors);
    size_t Cz = (size_t)C;
    size_t wte = ob_add_tensor(&tl, (size_t)V * Cz, true), wpe = ob_add_tensor(&tl, (size_t)T * Cz, true);
    size_t ln1w = 0, ln1b = 0, qkvw = 0, qkvb = 0, attprojw = 0, attprojb = 0, fcw = 0, fcb = 0,
           fcprojw = 0, fcprojb = 0;
    for (int l = 0; l < L; l++) {
        size_t o[12] = {ob_add_tensor(&tl, Cz, false),         ob_add_tensor(&tl, Cz, false),
                        ob_add_tensor(&tl, 3 * Cz * Cz, true), ob_add_tensor(&tl, 3 * Cz, false),
                        ob_add_tensor(&tl, Cz * Cz, true),     ob_add_tensor(&tl, Cz, false),
                        ob_add_tensor(&tl, Cz, false),         ob_add_tensor(&tl, Cz, false),
                        ob_add_tensor(&tl, 4 * Cz * Cz, true), ob_add_tensor(&tl, 4 * Cz, false),
                        ob_add_tensor(&tl, 4 * Cz * Cz, true), ob_add_tensor(&tl, Cz, false)};
        /* ln_2's own weights (o[6], o[7]) are not needed: the layernorms,
         * all one shape, are timed once, with ln_1's and ln_f's. */
        if (l == 0)
            ln1w = o[0], ln1b = o[1], qkvw = o[2], qkvb = o[3], attprojw = o[4], attprojb = o[5], fcw = o[8],
            fcb = o[9], fcprojw = o[10], fcprojb = o[11];
    }
    size_t lnfw = ob_add_tensor(&tl, Cz, false), lnfb = ob_add_tensor(&tl, Cz, false);
    size_t nparams = tl.total;
    float *P = ob_buf(nparams), *D = ob_buf(nparams), *mom = ob_buf(nparams), *vel = ob_buf_sq(nparams);
    /* act16: the weights as the 16-bit GEMMs read them, which AdamW writes
     * beside P (train.c). */
    uint16_t *P16 = lp16 ? ob_buf16(nparams) : NULL;

    /* ---- forward (gpt_body, then the loss) ----
     * Ops made several times per step at one shape (the layernorms, the
     * residual adds) are timed once and counted per_step times. */
    int ln_calls = 2 * L + 1;
    OB_OP("encoder_fwd", 1, OB_REST, ob_ops->encoder_forward(ob_k, encoded, tok, P + wte, P + wpe, B, T, C));
    if (lp16) {
        OB_OP("layernorm16_fwd", ln_calls, OB_REST,
           ob_ops->layernorm_forward16(ob_k, ln1_16, mean, rstd, encoded, P + ln1w, P + ln1b, (int)N, C));
        if (qkv16_on)
            OB_OP("matmul16_qkv_fwd", L, OB_GEMM,
               ob_ops->matmul_forward16_out16(ob_k, qkv16, ln1_16, P16 + qkvw, P + qkvb, (int)N, C, 3 * C));
        else
            OB_OP("matmul16_qkv_fwd", L, OB_GEMM,
               ob_ops->matmul_forward16(ob_k, qkv, ln1_16, P16 + qkvw, P + qkvb, (int)N, C, 3 * C));
    } else {
        OB_OP("layernorm_fwd", ln_calls, OB_REST,
           ob_ops->layernorm_forward(ob_k, ln1, mean, rstd, encoded, P + ln1w, P + ln1b, (int)N, C));
        OB_OP("matmul_qkv_fwd", L, OB_GEMM,
              ob_ops->matmul_forward(ob_k, qkv, ln1, P + qkvw, P + qkvb, (int)N, C, 3 * C));
    }
    if (qkv16_on) {
        OB_OP("attention16_fwd", L, OB_ATTENTION,
           ob_ops->attention_fused_forward16(ob_k, atty16, att, qkv16, B, T, C, NH));
        OB_OP("matmul16_proj_fwd", L, OB_GEMM,
           ob_ops->matmul_forward16_residual(ob_k, res2, atty16, P16 + attprojw, P + attprojb, encoded, (int)N, C, C));
    } else {
        if (fused)
            OB_OP("attention_fwd", L, OB_ATTENTION, ob_ops->attention_fused_forward(ob_k, atty, att, qkv, B, T, C, NH));
        else
            OB_OP("attention_fwd", L, OB_ATTENTION,
                  ob_ops->attention_forward(ob_k, atty, preatt, att, qkv, B, T, C, NH));
        OB_OP("matmul_proj_fwd", L, OB_GEMM,
           ob_ops->matmul_forward(ob_k, proj, atty, P + attprojw, P + attprojb, (int)N, C, C));
    }
    /* Both residual adds, where the projections do not make them (act16). */
    if (!lp16)
        OB_OP("residual_fwd", 2 * L, OB_REST, ob_ops->residual_forward(ob_k, res2, encoded, proj, NC));
    else if (!qkv16_on)
        OB_OP("residual_fwd", L, OB_REST, ob_ops->residual_forward(ob_k, res2, encoded, proj, NC));
    if (lp16) {
        if (ob_ops->matmul_forward16_gelu) { /* GELU in the GEMM's epilogue, as the model runs it where it can */
            OB_OP("matmul16_fc_gelu_fwd", L, OB_GEMM,
               ob_ops->matmul_forward16_gelu(ob_k, fch_gelu16, fch16, ln2_16, P16 + fcw, P + fcb, (int)N, C, 4 * C));
        } else {
            OB_OP("matmul16_fc_fwd", L, OB_GEMM,
               ob_ops->matmul_forward16_out16(ob_k, fch16, ln2_16, P16 + fcw, P + fcb, (int)N, C, 4 * C));
            OB_OP("gelu16_fwd", L, OB_REST, ob_ops->gelu_forward16(ob_k, fch_gelu16, fch16, 4 * NC));
        }
        OB_OP("matmul16_fcproj_fwd", L, OB_GEMM,
           ob_ops->matmul_forward16_residual(ob_k, res3, fch_gelu16, P16 + fcprojw, P + fcprojb, res2, (int)N,
                                             4 * C, C));
        OB_OP("logits16_fwd", 1, OB_GEMM,
              ob_ops->matmul_forward16_out16(ob_k, logits16, lnf16, P16 + wte, NULL, (int)N, C, V));
        if (ob_ops->crossentropy_fused16) /* the loss and its gradient in one pass, as training runs it */
            OB_OP("crossentropy16_fused", 1, OB_REST,
               ob_ops->crossentropy_fused16(ob_k, losses, logits16, tok, dlosses, (int)N, V, V));
        else
            OB_OP("crossentropy16_fwd", 1, OB_REST,
               ob_ops->crossentropy_forward16(ob_k, losses, lse, logits16, tok, (int)N, V, V));
    } else {
        OB_OP("matmul_fc_fwd", L, OB_GEMM, ob_ops->matmul_forward(ob_k, fch, ln2, P + fcw, P + fcb, (int)N, C, 4 * C));
        OB_OP("gelu_fwd", L, OB_REST, ob_ops->gelu_forward(ob_k, fch_gelu, fch, 4 * NC));
        OB_OP("matmul_fcproj_fwd", L, OB_GEMM,
           ob_ops->matmul_forward(ob_k, proj, fch_gelu, P + fcprojw, P + fcprojb, (int)N, 4 * C, C));
        OB_OP("matmul_lmhead_fwd", 1, OB_GEMM, ob_ops->matmul_forward(ob_k, logits, lnf, P + wte, NULL, (int)N, C, V));
        OB_OP("crossentropy_fwd", 1, OB_REST,
              ob_ops->crossentropy_forward(ob_k, losses, lse, logits, tok, (int)N, V, V));
    }

    /* ---- backward (gpt_backward): dlogits over the logits, in place;
     * matmul and gelu backward overwrite their dinp, so the only zeroing
     * is of the two sums (the residual stream's gradient, the fused q/k/v
     * gradient) and of the key bias's gradient. ---- */
    if (lp16) {
        if (!ob_ops->crossentropy_fused16)
            OB_OP("crossentropy16_bwd", 1, OB_REST,
               ob_ops->crossentropy_backward16(ob_k, logits16, logits16, lse, tok, dlosses, (int)N, V, V));
        OB_OP("logits16_bwd", 1, OB_GEMM,
           ob_ops->matmul_backward16(ob_k, NULL, dln16, D + wte, NULL, NULL, logits16, lnf16, P16 + wte, (int)N, C, V));
    } else {
        OB_OP("crossentropy_bwd", 1, OB_REST,
           ob_ops->crossentropy_backward(ob_k, logits, logits, lse, tok, dlosses, (int)N, V, V));
        OB_OP("matmul_lmhead_bwd", 1, OB_GEMM,
           ob_ops->matmul_backward(ob_k, dsmall, D + wte, NULL, logits, lnf, P + wte, (int)N, C, V));
    }
    OB_OP("zero_dres", 1, OB_REST, ob_ops->zero(ob_k, dres, NC));
    /* On act16 the layernorm backwards read their dout in 16 bits (dln16,
     * as the GEMM backwards write it) and most also write dres16 for the
     * next GEMM backward (model_gpt.c; timed here as all of them). */
    if (lp16)
        OB_OP("layernorm16_bwd", ln_calls, OB_REST,
           ob_ops->layernorm_backward16(ob_k, dres, dres16, D + lnfw, D + lnfb, NULL, dln16, res3, P + lnfw, mean, rstd,
                                     (int)N, C));
    else
        OB_OP("layernorm_bwd", ln_calls, OB_REST,
           ob_ops->layernorm_backward(ob_k, dres, D + lnfw, D + lnfb, dsmall, res3, P + lnfw, mean, rstd, (int)N, C));
    if (lp16) {
        if (ob_ops->matmul_backward16_dgelu) {
            OB_OP("matmul16_fcproj_dgelu_bwd", L, OB_GEMM,
               ob_ops->matmul_backward16_dgelu(ob_k, dfch16, fch16, D + fcprojw, D + fcprojb, dres16, fch_gelu16,
                                            P16 + fcprojw, (int)N, 4 * C, C));
        } else {
            OB_OP("matmul16_fcproj_bwd", L, OB_GEMM,
               ob_ops->matmul_backward16(ob_k, NULL, dfch16, D + fcprojw, D + fcprojb, NULL, dres16, fch_gelu16,
                                      P16 + fcprojw, (int)N, 4 * C, C));
            OB_OP("gelu16_bwd", L, OB_REST, ob_ops->gelu_backward16(ob_k, dfch16, fch16, dfch16, 4 * NC));
        }
        OB_OP("matmul16_fc_bwd", L, OB_GEMM,
           ob_ops->matmul_backward16(ob_k, NULL, dln16, D + fcw, D + fcb, NULL, dfch16, ln2_16, P16 + fcw, (int)N, C,
                                  4 * C));
    } else {
        OB_OP("matmul_fcproj_bwd", L, OB_GEMM,
           ob_ops->matmul_backward(ob_k, dbig, D + fcprojw, D + fcprojb, dres, fch_gelu, P + fcprojw, (int)N, 4 * C,
                                   C));
        OB_OP("gelu_bwd", L, OB_REST, ob_ops->gelu_backward(ob_k, dbig, fch, dbig, 4 * NC));
        OB_OP("matmul_fc_bwd", L, OB_GEMM,
           ob_ops->matmul_backward(ob_k, dsmall, D + fcw, D + fcb, dbig, ln2, P + fcw, (int)N, C, 4 * C));
    }
    if (qkv16_on)
        OB_OP("matmul16_proj_bwd", L, OB_GEMM,
           ob_ops->matmul_backward16(ob_k, NULL, dfch16, D + attprojw, D + attprojb, NULL, dres16, atty16,
                                     P16 + attprojw, (int)N, C, C));
    else
        OB_OP("matmul_proj_bwd", L, OB_GEMM,
           ob_ops->matmul_backward(ob_k, dsmall, D + attprojw, D + attprojb, dres, atty, P + attprojw, (int)N, C, C));
    if (!qkv16_on) /* the 16-bit fused backward overwrites its gradient */
        OB_OP("zero_dqkv", L, OB_REST, ob_ops->zero(ob_k, dqkv, 3 * NC));
    if (qkv16_on)
        OB_OP("attention16_bwd", L, OB_ATTENTION,
           ob_ops->attention_fused_backward16(ob_k, dqkv16, dqkv, dfch16, atty16, att, qkv16, B, T, C, NH));
    else if (fused)
        OB_OP("attention_bwd", L, OB_ATTENTION,
           ob_ops->attention_fused_backward(ob_k, dqkv, dsmall, atty, att, qkv, B, T, C, NH));
    else
        OB_OP("attention_bwd", L, OB_ATTENTION,
           ob_ops->attention_backward(ob_k, dqkv, preatt, datt, dsmall, qkv, att, B, T, C, NH));
    if (qkv16_on)
        OB_OP("matmul16_qkv_bwd", L, OB_GEMM,
           ob_ops->matmul_backward16(ob_k, NULL, dln16, D + qkvw, D + qkvb, NULL, dqkv16, ln1_16, P16 + qkvw, (int)N, C,
                                  3 * C));
    else if (lp16)
        OB_OP("matmul16_qkv_bwd", L, OB_GEMM,
           ob_ops->matmul_backward16(ob_k, NULL, dln16, D + qkvw, D + qkvb, dqkv, NULL, ln1_16, P16 + qkvw, (int)N, C,
                                  3 * C));
    else
        OB_OP("matmul_qkv_bwd", L, OB_GEMM,
           ob_ops->matmul_backward(ob_k, dsmall, D + qkvw, D + qkvb, dqkv, ln1, P + qkvw, (int)N, C, 3 * C));
    OB_OP("zero_qkv_kbias", L, OB_REST, ob_ops->zero(ob_k, D + qkvb + C, Cz));
    OB_OP("encoder_bwd", 1, OB_REST, ob_ops->encoder_backward(ob_k, D + wte, D + wpe, dres, tok, B, T, C));

    /* ---- the optimizer step as train.c's try_step makes it: zero the
     * gradients, their norm, adamw_multi over the tensors.  "adamw" (one
     * call over all parameters, no decay) and "adamw_per_tensor" (a call
     * per tensor) are kept for comparison: adamw_multi should take
     * adamw's time, not the per-tensor calls'. ---- */
    ob_optimizer(&tl, P, P16, D, mom, vel);
    OB_OP("adamw", 0, OB_REST,
          ob_ops->adamw(ob_k, P, P16, D, mom, vel, nparams, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, 1));
    OB_OP("adamw_per_tensor", 0, OB_REST, adamw_tensors(&tl, P, P16, D, mom, vel));
    ob_emit_all();
    ob_close();
    return 0;
}
