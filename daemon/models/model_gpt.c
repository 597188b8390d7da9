/* model_gpt.c — GPT-2: learned positions, pre-norm blocks, tied output
 * embedding.
 *
 * Parameters, per layer contiguous, GPT-2 names (matrices stored (out,in)
 * like nn.Linear; exported transposed to GPT-2's Conv1D (in,out)):
 *   wte (V,C), wpe (T,C),
 *   h.l.{ln_1.weight (C), ln_1.bias (C), attn.c_attn.weight (3C,C), attn.c_attn.bias (3C),
 *        attn.c_proj.weight (C,C), attn.c_proj.bias (C), ln_2.weight (C), ln_2.bias (C),
 *        mlp.c_fc.weight (4C,C), mlp.c_fc.bias (4C), mlp.c_proj.weight (C,4C), mlp.c_proj.bias (C)},
 *   ln_f.weight (C), ln_f.bias (C).
 *
 * Activations keep only what backward reads (per layer: ln1, its mean and
 * rstd, qkv, att, atty, residual2, ln2, its mean and rstd, fch, fch_gelu,
 * residual3); everything else is one layer's worth of scratch reused by all
 * layers.  With recompute (model.h) the per-layer ones but residual3 (each
 * block's output, the next one's input) hold one layer, and the backward
 * runs each block's forward again into them.  The gradient of the residual
 * stream is a single (B,T,C) buffer:
 * every layer's backward reads it as dout and its layernorms add into it in
 * place, which is exactly the sum the residual connections call for.
 *
 * Sampling may instead run one position at a time (decode_step): its keys
 * and values go to a cache in a buffer of the caller's beside the
 * activations, and the activation buffers serve as that step's scratch.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errmsg.h"
#include "lora.h"
#include "model.h"

#define ALIGN 64

/* One block's parameter offsets (in floats, into m->params / m->grads). */
typedef struct {
    size_t ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
    int qkv_site, attproj_site, fc_site, fcproj_site; /* LoRA (lora.h); -1: none */
} gpt_layer;

typedef struct {
    uint32_t L, C, NH, T, V;
    uint32_t P; /* rows of wpe: the positions the model is made for, T or more (jobcfg.h) */
    /* The kernels have fused attention for this shape: att holds each row's
     * log-sum-exp (L,B,NH,T), and preatt/datt are not needed. */
    bool fused;
    /* 16-bit activations (kernels.h): in a bf16/fp16 job whose kernels have
     * the 16-bit ops, the activations only GEMMs read (ln1, ln2, fch_gelu,
     * lnf, and the logits) are stored in the 16-bit type, in the *16
     * buffers; so is the MLP's hidden layer (fch, which GELU reads) and its
     * gradient (dfch_gelu, then dfch in place), as autocast keeps them.
     * Their fp32 buffers are then empty.  Their GEMMs would round them to
     * 16 bits anyway.  Only where the backend says the 16-bit ops pay
     * (act16_native). */
    bool lp16;
    /* lp16 with fused attention on 16 bits: the qkv GEMM writes qkv in 16
     * bits (qkv16), as the kernels' tensor cores take it, and the kernels
     * write their output in 16 bits (atty16) for the attention
     * projection's GEMM. */
    bool qkv16_on;
    gpt_layer *layer;
    size_t wte, wpe, lnfw, lnfb;

    /* Activations for up to max_n samples. */
    uint32_t n; /* bound size */
    bool rc;    /* bound with recompute: per-layer buffers hold one layer (slot 0) */
    float *encoded;                                   /* (B,T,C) */
    float *ln1, *ln1_mean, *ln1_rstd;                 /* (L,B,T,C), (L,B,T) */
    float *qkv;                                       /* (L,B,T,3C) */
    float *att;                                       /* (L,B,NH,T,T) */
    float *atty;                                      /* (L,B,T,C) */
    float *residual2;                                 /* (L,B,T,C) */
    float *ln2, *ln2_mean, *ln2_rstd;                 /* (L,B,T,C), (L,B,T) */
    float *fch, *fch_gelu;                            /* (L,B,T,4C) */
    float *residual3;                                 /* (L,B,T,C) */
    float *lnf, *lnf_mean, *lnf_rstd;                 /* (B,T,C), (B,T) */
    uint16_t *ln1_16, *ln2_16, *lnf16;                /* lp16: as ln1, ln2, lnf */
    uint16_t *fch16, *fch_gelu16;                     /* lp16: as fch, fch_gelu */
    uint16_t *qkv16, *atty16;                         /* qkv16_on: as qkv, atty */
    uint16_t *logits16;                               /* lp16: as logits (dlogits in backward) */
    float *logits, *lse, *losses;                     /* (B,T,V) (dlogits in backward), (B,T), (B,T) */
    /* One layer of scratch, forward and backward. */
    float *preatt;                                    /* (B,NH,T,T) forward; dpreatt in backward */
    float *proj;                                      /* (B,T,C) attproj/fcproj outputs (fp32 ones) */
    float *dres;                                      /* (B,T,C) residual-stream gradient */
    uint16_t *dres16;                                 /* lp16: dres rounded, for the GEMMs that read it */
    float *dbig;                                      /* (B,T,4C) dfch_gelu, then dfch over it */
    uint16_t *dfch16;                                 /* lp16: as dbig */
    float *dqkv;                                      /* (B,T,3C); qkv16_on: (B,T,C), dq's fp32 sums */
    uint16_t *dqkv16;                                 /* qkv16_on: (B,T,3C) */
    float *dsmall;                                    /* (B,T,C) dln, datty (fp32 ones) */
    uint16_t *dln16;                                  /* lp16: (B,T,C) dln, for the layernorm backwards */
    float *datt;                                      /* (B,NH,T,T) */
    float *dlosses;                                   /* (B,T) */
    float *dloss_host;                                /* host copy, (B,T) */
    model_loss loss;                                  /* the loss's buffers above (model.h) */

    /* Incremental decoding (decode_start): a buffer of the caller's, apart
     * from the activations, so that training never pays for it. */
    uint32_t dec_n;   /* sequences the cache is for; 0: none bound */
    uint32_t dec_len; /* positions 0..dec_len-1 of each are cached */
    float *kcache, *vcache;                           /* (L,n,T,C) */
    float *dec_att;                                   /* (n,NH,T) attention_decode's scratch */
} gpt;

static gpt *G(const model *m) { return (gpt *)m->impl; }

/* With LoRA (lora.h) the base is frozen: a base tensor the fp32 kernels
 * read comes through lora_base32 (itself, or a 16-bit base's widened
 * copy), and D, the gradients, is NULL. */
#define B32(off) lora_base32(m, (off))
#define DG(off) (D ? D + (off) : NULL)

/* ---- activation layout ------------------------------------------------------------ */

/* The number of buffers carve() takes: each may add up to ALIGN bytes. */
#define GPT_BUFFERS 40

/* Walk the activation buffers for n samples: with base != NULL assign the
 * pointers, always return the bytes used (each buffer 64-byte aligned).
 * In lp16 mode the fp32 buffers it replaces are empty, and the other way
 * round. */
static size_t carve(gpt *g, char *base, uint32_t n, bool rc)
{
    size_t BT = (size_t)n * g->T, C = g->C, L = rc ? 1 : g->L, NH = g->NH, T = g->T, V = g->V;
    size_t TT = g->fused ? 0 : T * T; /* the (T,T) score matrices, unless fused */
    size_t f32 = g->lp16 ? 0 : 1, h16 = g->lp16 ? 1 : 0, q16 = g->qkv16_on ? 1 : 0;
    size_t off = 0;
#define TAKE_T(type, ptr, count)                                       \
    do {                                                               \
        if (base)                                                      \
            g->ptr = (type *)(base + off);                             \
        off += ((count) * sizeof(type) + ALIGN - 1) / ALIGN * ALIGN;   \
    } while (0)
#define TAKE(ptr, count) TAKE_T(float, ptr, count)
#define TAKE16(ptr, count) TAKE_T(uint16_t, ptr, count)
    TAKE(encoded, BT * C);
    TAKE(ln1, f32 * L * BT * C);
    TAKE16(ln1_16, h16 * L * BT * C);
    TAKE(ln1_mean, L * BT);
    TAKE(ln1_rstd, L * BT);
    TAKE(qkv, (1 - q16) * L * BT * 3 * C);
    TAKE16(qkv16, q16 * L * BT * 3 * C);
    TAKE(att, L * n * NH * (g->fused ? T : TT));
    TAKE(atty, (1 - q16) * L * BT * C);
    TAKE16(atty16, q16 * L * BT * C);
    TAKE(residual2, L * BT * C);
    TAKE(ln2, f32 * L * BT * C);
    TAKE16(ln2_16, h16 * L * BT * C);
    TAKE(ln2_mean, L * BT);
    TAKE(ln2_rstd, L * BT);
    TAKE(fch, f32 * L * BT * 4 * C);
    TAKE16(fch16, h16 * L * BT * 4 * C);
    TAKE(fch_gelu, f32 * L * BT * 4 * C);
    TAKE16(fch_gelu16, h16 * L * BT * 4 * C);
    TAKE(residual3, (size_t)g->L * BT * C); /* the blocks' inputs and the loss's: kept whole */
    TAKE(lnf, f32 * BT * C);
    TAKE16(lnf16, h16 * BT * C);
    TAKE(lnf_mean, BT);
    TAKE(lnf_rstd, BT);
    TAKE(logits, f32 * BT * V);
    TAKE16(logits16, h16 * BT * V);
    TAKE(lse, BT);
    TAKE(losses, BT);
    TAKE(preatt, n * NH * TT);
    TAKE(proj, (1 - q16) * BT * C); /* qkv16_on: both projections add into the stream themselves */
    TAKE(dres, BT * C);
    TAKE16(dres16, h16 * BT * C);
    TAKE(dbig, f32 * BT * 4 * C);
    TAKE16(dfch16, h16 * BT * 4 * C);
    TAKE(dqkv, (q16 ? 1 : 3) * BT * C);
    TAKE16(dqkv16, q16 * BT * 3 * C);
    TAKE(dsmall, (1 - q16) * BT * C); /* lp16: the dln are 16-bit; qkv16_on: so is datty */
    TAKE16(dln16, h16 * BT * C);
    TAKE(datt, n * NH * TT);
    TAKE(dlosses, BT);
#undef TAKE16
#undef TAKE
#undef TAKE_T
    return off;
}

static uint32_t gpt_units(const model *m)
{
    return G(m)->T;
}

/* The activations and, after them, LoRA's scratch (lora.h; 0 without). */
static void gpt_activation_bytes(const model *m, size_t *fixed, size_t *per_sample)
{
    gpt *g = G(m);
    size_t one = carve(g, NULL, 1, m->recompute) + lora_scratch_bytes(m, g->T);
    size_t two = carve(g, NULL, 2, m->recompute) + lora_scratch_bytes(m, 2 * (size_t)g->T);
    model_activation_split(one, two, GPT_BUFFERS + 4, ALIGN, fixed, per_sample);
}

static int gpt_bind(model *m, void *mem, uint32_t n)
{
    gpt *g = G(m);
    size_t used = carve(g, mem, n, m->recompute);
    lora_bind(m, (char *)mem + used, (size_t)n * g->T);
    g->rc = m->recompute;
    g->n = n;
    m->max_n = n;
    free(g->dloss_host);
    g->dloss_host = malloc((size_t)n * g->T * sizeof(float));
    g->loss = (model_loss){g->lp16, g->logits, g->logits16, g->lse, g->losses, g->dlosses, g->dloss_host, (int)g->V};
    /* A cache was for the old buffers' batch: start again. */
    g->dec_n = 0;
    g->dec_len = 0;
    return g->dloss_host ? 0 : -1;
}

/* ---- parameters ---------------------------------------------------------------------- */

static void gpt_init(const model *m, float *params, uint64_t seed)
{
    const gpt *g = G(m);
    /* GPT-2: N(0, 0.02) for matrices and embeddings, residual projections
     * scaled by 1/sqrt(2L), zero biases, unit layernorm gains. */
    float resid_std = 0.02f / sqrtf(2.0f * (float)g->L);
    for (int t = 0; t < m->ntensors; t++) {
        const model_tensor *mt = &m->tensors[t];
        float *p = params + mt->offset;
        const char *name = mt->name;
        size_t len = strlen(name);
        bool is_bias = len > 5 && strcmp(name + len - 5, ".bias") == 0;
        bool is_ln = strstr(name, "ln_") != NULL;
        if (is_bias) {
            memset(p, 0, mt->numel * sizeof *p);
        } else if (is_ln) {
            for (size_t i = 0; i < mt->numel; i++)
                p[i] = 1.0f;
        } else {
            float std = strstr(name, "c_proj.weight") ? resid_std : 0.02f;
            for (size_t i = 0; i < mt->numel; i++)
                p[i] = std * model_rand_normal(seed, mt->offset + i);
        }
    }
}

/* ---- forward ------------------------------------------------------------------------- */

/* Block l's forward for B sequences of T tokens, from its input (encoded or
 * residual3 of the block below) into its activations: layer l's, or the
 * one layer's with recompute.  `out`: also residual3, the block's output;
 * the backward's recomputation leaves it (it is kept, and no backward
 * reads the MLP projection's output). */
static void gpt_block_forward(model *m, uint32_t l, int B, int T, bool out)
{
    gpt *g = G(m);
    const kern_ops *k = m->k;
    kern_ctx *kc = m->kc;
    int C = (int)g->C, NH = (int)g->NH;
    size_t BT = (size_t)B * T, BTC = BT * C, LBT = BT, att_l = (size_t)B * NH * T * (g->fused ? 1 : T);
    size_t s = g->rc ? 0 : l; /* the slot of the per-layer buffers */
    const float *P = m->params;
    const uint16_t *P16 = m->params16; /* lp16: the weights as the 16-bit GEMMs read them */
    const float *residual = l == 0 ? g->encoded : g->residual3 + (l - 1) * BTC;
    float *ln1_mean = g->ln1_mean + s * LBT, *ln1_rstd = g->ln1_rstd + s * LBT;
    float *qkv = g->qkv + s * BTC * 3, *att = g->att + s * att_l, *atty = g->atty + s * BTC;
    float *res2 = g->residual2 + s * BTC;
    float *ln2_mean = g->ln2_mean + s * LBT, *ln2_rstd = g->ln2_rstd + s * LBT;
    float *res3 = g->residual3 + l * BTC;
    gpt_layer *w = &g->layer[l];

    if (g->qkv16_on) {
        uint16_t *ln1 = g->ln1_16 + s * BTC, *qkv16 = g->qkv16 + s * BTC * 3;
        k->layernorm_forward16(kc, ln1, ln1_mean, ln1_rstd, residual, P + w->ln1w, P + w->ln1b, (int)BT, C);
        k->matmul_forward16_out16(kc, qkv16, ln1, P16 + w->qkvw, P + w->qkvb, (int)BT, C, 3 * C);
    } else if (g->lp16) {
        uint16_t *ln1 = g->ln1_16 + s * BTC;
        k->layernorm_forward16(kc, ln1, ln1_mean, ln1_rstd, residual, P + w->ln1w, P + w->ln1b, (int)BT, C);
        k->matmul_forward16(kc, qkv, ln1, P16 + w->qkvw, P + w->qkvb, (int)BT, C, 3 * C);
    } else {
        float *ln1 = g->ln1 + s * BTC;
        k->layernorm_forward(kc, ln1, ln1_mean, ln1_rstd, residual, B32(w->ln1w), B32(w->ln1b), (int)BT, C);
        lora_linear_forward(m, qkv, ln1, w->qkvw, w->qkvb, &w->qkv_site, 1, (int)BT, C, 3 * C);
    }
    if (g->qkv16_on) {
        uint16_t *atty16 = g->atty16 + s * BTC;
        k->attention_fused_forward16(kc, atty16, att, g->qkv16 + s * BTC * 3, B, T, C, NH);
        k->matmul_forward16_residual(kc, res2, atty16, P16 + w->attprojw, P + w->attprojb, residual, (int)BT, C, C);
    } else {
        if (g->fused)
            k->attention_fused_forward(kc, atty, att, qkv, B, T, C, NH);
        else
            k->attention_forward(kc, atty, g->preatt, att, qkv, B, T, C, NH);
        lora_linear_forward(m, g->proj, atty, w->attprojw, w->attprojb, &w->attproj_site, 1, (int)BT, C, C);
        k->residual_forward(kc, res2, residual, g->proj, BTC);
    }
    if (g->lp16) {
        uint16_t *ln2 = g->ln2_16 + s * BTC, *fch = g->fch16 + s * BTC * 4;
        uint16_t *fch_gelu = g->fch_gelu16 + s * BTC * 4;
        k->layernorm_forward16(kc, ln2, ln2_mean, ln2_rstd, res2, P + w->ln2w, P + w->ln2b, (int)BT, C);
        if (k->matmul_forward16_gelu) { /* the GELU in the GEMM's epilogue, where there is one */
            k->matmul_forward16_gelu(kc, fch_gelu, fch, ln2, P16 + w->fcw, P + w->fcb, (int)BT, C, 4 * C);
        } else {
            k->matmul_forward16_out16(kc, fch, ln2, P16 + w->fcw, P + w->fcb, (int)BT, C, 4 * C);
            k->gelu_forward16(kc, fch_gelu, fch, BTC * 4);
        }
        if (out)
            k->matmul_forward16_residual(kc, res3, fch_gelu, P16 + w->fcprojw, P + w->fcprojb, res2, (int)BT, 4 * C,
                                         C);
    } else {
        float *ln2 = g->ln2 + s * BTC, *fch = g->fch + s * BTC * 4, *fch_gelu = g->fch_gelu + s * BTC * 4;
        k->layernorm_forward(kc, ln2, ln2_mean, ln2_rstd, res2, B32(w->ln2w), B32(w->ln2b), (int)BT, C);
        lora_linear_forward(m, fch, ln2, w->fcw, w->fcb, &w->fc_site, 1, (int)BT, C, 4 * C);
        k->gelu_forward(kc, fch_gelu, fch, BTC * 4);
        if (out) {
            lora_linear_forward(m, g->proj, fch_gelu, w->fcprojw, w->fcprojb, &w->fcproj_site, 1, (int)BT, 4 * C, C);
            k->residual_forward(kc, res3, res2, g->proj, BTC);
        }
    }
}

/* Everything up to the logits, for B sequences of T <= g->T tokens.  With
 * T < g->T the same buffers hold the smaller tensors packed (B,T,...): the
 * causal model needs no padding, so sampling pays only for the tokens it
 * has.  Training always passes T = g->T. */
static void gpt_body(model *m, const int32_t *inp, int B, int T)
{
    gpt *g = G(m);
    const kern_ops *k = m->k;
    kern_ctx *kc = m->kc;
    int C = (int)g->C, V = (int)g->V;
    size_t BT = (size_t)B * T, BTC = BT * C;
    const float *P = m->params;
    const uint16_t *P16 = m->params16;

    if (!P) /* a frozen base held in 16 bits (lora.h) */
        k->encoder_forward16w(kc, g->encoded, inp, P16 + g->wte, B32(g->wpe), B, T, C);
    else
        k->encoder_forward(kc, g->encoded, inp, P + g->wte, P + g->wpe, B, T, C);
    for (uint32_t l = 0; l < g->L; l++) {
        if (model_poll(m))
            return;
        gpt_block_forward(m, l, B, T, true);
    }
    if (model_poll(m)) /* the output layer is the widest GEMM */
        return;
    const float *last = g->residual3 + (g->L - 1) * BTC;
    if (g->lp16) {
        k->layernorm_forward16(kc, g->lnf16, g->lnf_mean, g->lnf_rstd, last, P + g->lnfw, P + g->lnfb, (int)BT, C);
        k->matmul_forward16_out16(kc, g->logits16, g->lnf16, P16 + g->wte, NULL, (int)BT, C, V);
    } else {
        k->layernorm_forward(kc, g->lnf, g->lnf_mean, g->lnf_rstd, last, B32(g->lnfw), B32(g->lnfb), (int)BT, C);
        lora_linear_forward(m, g->logits, g->lnf, g->wte, LORA_NO_BIAS, NULL, 0, (int)BT, C, V);
    }
}

static double gpt_forward(model *m, const model_batch *b, uint64_t *correct)
{
    gpt *g = G(m);
    if (correct)
        *correct = 0;
    gpt_body(m, b->x, (int)b->n, (int)g->T);
    if (m->stopped)
        return 0;
    return model_loss_forward(m, &g->loss, b->y, (size_t)b->n * g->T);
}

static int gpt_forward_logits(model *m, const int32_t *tokens, uint32_t n, uint32_t len, float *out)
{
    gpt *g = G(m);
    /* 16-bit logits stay on the device in training; sampling builds its own
     * fp32 model (sample.c), so this path never sees them. */
    if (n == 0 || n > g->n || len == 0 || len > g->T || g->lp16)
        return -1;
    gpt_body(m, tokens, (int)n, (int)len);
    for (uint32_t s = 0; s < n; s++)
        m->k->copy_d2h(m->kc, out + (size_t)s * g->V, g->logits + ((size_t)s * len + len - 1) * g->V,
                       g->V * sizeof(float));
    return 0;
}

/* ---- incremental decoding ---------------------------------------------------------------- */

/* The decode buffer for n sequences: with base != NULL assign the pointers;
 * always return the bytes used.  Keys and values of layer l for sequence b
 * at position t: kcache[((l·n + b)·T + t)·C], so each layer's cache is the
 * (B,Tmax,C) attention_decode reads. */
static size_t carve_decode(gpt *g, char *base, uint32_t n)
{
    size_t cache = (size_t)g->L * n * g->T * g->C * sizeof(float);
    size_t att = (size_t)n * g->NH * g->T * sizeof(float);
    cache = (cache + ALIGN - 1) / ALIGN * ALIGN;
    if (base) {
        g->kcache = (float *)base;
        g->vcache = (float *)(base + cache);
        g->dec_att = (float *)(base + 2 * cache);
    }
    return 2 * cache + (att + ALIGN - 1) / ALIGN * ALIGN;
}

static size_t gpt_decode_bytes(const model *m, uint32_t n)
{
    return carve_decode(G(m), NULL, n);
}

static int gpt_decode_start(model *m, void *mem, uint32_t n)
{
    gpt *g = G(m);
    g->dec_n = 0;
    g->dec_len = 0;
    /* The fp32 activation buffers serve as scratch: empty in lp16 mode.
     * Sampling builds a full model: the cache path reads the base as fp32
     * parameters, which a LoRA base may not have. */
    if (!mem || n == 0 || n > g->n || g->lp16 || m->lora || !m->k || !m->k->attention_decode)
        return -1;
    carve_decode(g, mem, n);
    g->dec_n = n;
    return 0;
}

/* One position of each of the dec_n sequences through the whole model: the
 * layers of gpt_body with B = n, T = 1 (the activation buffers, sized for
 * the bound batch × T positions, hold that as a prefix), the position's
 * embedding wpe[pos], and attention over the cache instead of the causal
 * attention over the batch's own rows.  fp32 only. */
static int gpt_decode_step(model *m, const int32_t *tokens, uint32_t pos, float *out)
{
    gpt *g = G(m);
    const kern_ops *k = m->k;
    kern_ctx *kc = m->kc;
    if (!g->dec_n || g->dec_n > g->n || g->lp16 || pos >= g->T || pos > g->dec_len)
        return -1;
    int n = (int)g->dec_n, C = (int)g->C, NH = (int)g->NH, V = (int)g->V, T = (int)g->T;
    size_t nC = (size_t)n * C, cache_l = (size_t)n * T * C;
    const float *P = m->params;

    k->encoder_forward(kc, g->encoded, tokens, P + g->wte, P + g->wpe + (size_t)pos * C, n, 1, C);
    for (uint32_t l = 0; l < g->L; l++) {
        const float *residual = l == 0 ? g->encoded : g->residual3 + (l - 1) * nC;
        size_t s = g->rc ? 0 : l; /* recompute: the per-layer buffers hold one layer */
        float *ln1 = g->ln1 + s * nC, *qkv = g->qkv + s * nC * 3, *atty = g->atty + s * nC;
        float *res2 = g->residual2 + s * nC, *ln2 = g->ln2 + s * nC;
        float *fch = g->fch + s * nC * 4, *fch_gelu = g->fch_gelu + s * nC * 4, *res3 = g->residual3 + l * nC;
        gpt_layer *w = &g->layer[l];

        k->layernorm_forward(kc, ln1, g->ln1_mean + s * n, g->ln1_rstd + s * n, residual, P + w->ln1w, P + w->ln1b,
                             n, C);
        k->matmul_forward(kc, qkv, ln1, P + w->qkvw, P + w->qkvb, n, C, 3 * C);
        k->attention_decode(kc, atty, g->dec_att, g->kcache + l * cache_l, g->vcache + l * cache_l, qkv, n,
                            (int)pos + 1, T, C, NH);
        k->matmul_forward(kc, g->proj, atty, P + w->attprojw, P + w->attprojb, n, C, C);
        k->residual_forward(kc, res2, residual, g->proj, nC);
        k->layernorm_forward(kc, ln2, g->ln2_mean + s * n, g->ln2_rstd + s * n, res2, P + w->ln2w, P + w->ln2b, n,
                             C);
        k->matmul_forward(kc, fch, ln2, P + w->fcw, P + w->fcb, n, C, 4 * C);
        k->gelu_forward(kc, fch_gelu, fch, nC * 4);
        k->matmul_forward(kc, g->proj, fch_gelu, P + w->fcprojw, P + w->fcprojb, n, 4 * C, C);
        k->residual_forward(kc, res3, res2, g->proj, nC);
    }
    const float *last = g->residual3 + (g->L - 1) * nC;
    k->layernorm_forward(kc, g->lnf, g->lnf_mean, g->lnf_rstd, last, P + g->lnfw, P + g->lnfb, n, C);
    k->matmul_forward(kc, g->logits, g->lnf, P + g->wte, NULL, n, C, V);
    k->copy_d2h(kc, out, g->logits, (size_t)n * V * sizeof(float));
    g->dec_len = pos + 1;
    return 0;
}

/* ---- backward ------------------------------------------------------------------------ */

/* The backward from the logits' gradient on: the cross-entropy backward
 * has overwritten the logits with dlogits (in place: it is their last
 * reader, and it reads each element before writing it). */
static void gpt_backward_body(model *m, const model_batch *b)
{
    gpt *g = G(m);
    const kern_ops *k = m->k;
    kern_ctx *kc = m->kc;
    int B = (int)b->n, T = (int)g->T, C = (int)g->C, NH = (int)g->NH, V = (int)g->V;
    size_t BT = (size_t)B * T, BTC = BT * C, LBT = BT, att_l = (size_t)B * NH * T * (g->fused ? 1 : T);
    const float *P = m->params;
    const uint16_t *P16 = m->params16;
    float *D = m->grads;
    if (model_poll(m))
        return;

    float *dlnf = g->dsmall;
    if (g->lp16) {
        uint16_t *dlogits = g->logits16;
        k->matmul_backward16(kc, NULL, g->dln16, D + g->wte, NULL, NULL, dlogits, g->lnf16, P16 + g->wte, (int)BT, C,
                             V);
    } else {
        float *dlogits = g->logits;
        lora_linear_backward(m, dlnf, dlogits, g->lnf, g->wte, LORA_NO_BIAS, NULL, 0, (int)BT, C, V);
    }
    k->zero(kc, g->dres, BTC);
    const float *last = g->residual3 + (g->L - 1) * BTC;
    /* On the 16-bit path the layernorm backwards read their dout as the
     * GEMM backward before them wrote it, in 16 bits (dln16), and each one
     * whose dres a 16-bit GEMM backward reads next also writes it rounded
     * (dres16), in the same pass: that GEMM would cast it otherwise. */
    if (g->lp16)
        k->layernorm_backward16(kc, g->dres, g->dres16, D + g->lnfw, D + g->lnfb, NULL, g->dln16, last,
                                P + g->lnfw, g->lnf_mean, g->lnf_rstd, (int)BT, C);
    else
        k->layernorm_backward(kc, g->dres, DG(g->lnfw), DG(g->lnfb), dlnf, last, B32(g->lnfw), g->lnf_mean,
                              g->lnf_rstd, (int)BT, C);
    model_grads_final(m, g->lnfw);

    for (int l = (int)g->L - 1; l >= 0; l--) {
        if (model_poll(m))
            return;
        /* Recompute: the block's activations again, from its kept input,
         * into the one layer's buffers.  It writes only forward buffers
         * and scratch the backward refills before reading (proj, preatt),
         * so dres and dres16 carry over from the block above. */
        if (g->rc)
            gpt_block_forward(m, (uint32_t)l, B, T, false);
        size_t s = g->rc ? 0 : (size_t)l;
        const float *residual = l == 0 ? g->encoded : g->residual3 + (size_t)(l - 1) * BTC;
        const float *ln1_mean = g->ln1_mean + s * LBT, *ln1_rstd = g->ln1_rstd + s * LBT;
        const float *qkv = g->qkv + s * BTC * 3, *att = g->att + s * att_l, *atty = g->atty + s * BTC;
        const float *res2 = g->residual2 + s * BTC;
        const float *ln2_mean = g->ln2_mean + s * LBT, *ln2_rstd = g->ln2_rstd + s * LBT;
        gpt_layer *w = &g->layer[l];

        /* residual3 = residual2 + fcproj: dfcproj is the stream gradient.
         * matmul_backward and gelu_backward overwrite their dinp, so no
         * buffer is zeroed first, and dfch takes dfch_gelu's place (in 16
         * bits: dfch16 holds both). */
        float *dfch_gelu = g->dbig, *dfch = g->dbig, *dln2 = g->dsmall;
        if (g->lp16) {
            const uint16_t *fch = g->fch16 + s * BTC * 4, *fch_gelu = g->fch_gelu16 + s * BTC * 4;
            const uint16_t *ln2 = g->ln2_16 + s * BTC;
            if (k->matmul_backward16_dgelu) {
                k->matmul_backward16_dgelu(kc, g->dfch16, fch, D + w->fcprojw, D + w->fcprojb, g->dres16, fch_gelu,
                                           P16 + w->fcprojw, (int)BT, 4 * C, C);
            } else {
                k->matmul_backward16(kc, NULL, g->dfch16, D + w->fcprojw, D + w->fcprojb, NULL, g->dres16,
                                     fch_gelu, P16 + w->fcprojw, (int)BT, 4 * C, C);
                k->gelu_backward16(kc, g->dfch16, fch, g->dfch16, BTC * 4);
            }
            k->matmul_backward16(kc, NULL, g->dln16, D + w->fcw, D + w->fcb, NULL, g->dfch16, ln2, P16 + w->fcw,
                                 (int)BT, C, 4 * C);
        } else {
            const float *fch = g->fch + s * BTC * 4, *fch_gelu = g->fch_gelu + s * BTC * 4;
            const float *ln2 = g->ln2 + s * BTC;
            lora_linear_backward(m, dfch_gelu, g->dres, fch_gelu, w->fcprojw, w->fcprojb, &w->fcproj_site, 1, (int)BT,
                                 4 * C, C);
            k->gelu_backward(kc, dfch, fch, dfch_gelu, BTC * 4);
            lora_linear_backward(m, dln2, dfch, ln2, w->fcw, w->fcb, &w->fc_site, 1, (int)BT, C, 4 * C);
        }
        const uint16_t *atty16 = g->qkv16_on ? g->atty16 + s * BTC : NULL;
        if (g->lp16) /* dres16 only for a 16-bit attention projection backward */
            k->layernorm_backward16(kc, g->dres, atty16 ? g->dres16 : NULL, D + w->ln2w, D + w->ln2b, NULL, g->dln16,
                                    res2, P + w->ln2w, ln2_mean, ln2_rstd, (int)BT, C);
        else
            k->layernorm_backward(kc, g->dres, DG(w->ln2w), DG(w->ln2b), dln2, res2, B32(w->ln2w), ln2_mean,
                                  ln2_rstd, (int)BT, C);

        /* residual2 = residual + attproj: dattproj is the stream gradient. */
        float *datty = g->dsmall, *dln1 = g->dsmall;
        /* On the 16-bit path datty is 16-bit too, in dfch16 (free until
         * the layer below's MLP), and the attention backward overwrites
         * dqkv16, with dqkv as dq's scratch. */
        uint16_t *datty16 = g->dfch16;
        if (atty16) {
            k->matmul_backward16(kc, NULL, datty16, D + w->attprojw, D + w->attprojb, NULL, g->dres16, atty16,
                                 P16 + w->attprojw, (int)BT, C, C);
            k->attention_fused_backward16(kc, g->dqkv16, g->dqkv, datty16, atty16, att, g->qkv16 + s * BTC * 3, B,
                                          T, C, NH);
        } else { /* the fp32 ops add into dqkv */
            lora_linear_backward(m, datty, g->dres, atty, w->attprojw, w->attprojb, &w->attproj_site, 1, (int)BT, C,
                                 C);
            k->zero(kc, g->dqkv, BTC * 3);
            if (g->fused)
                k->attention_fused_backward(kc, g->dqkv, datty, atty, att, qkv, B, T, C, NH);
            else
                k->attention_backward(kc, g->dqkv, g->preatt, g->datt, datty, qkv, att, B, T, C, NH);
        }
        if (atty16)
            k->matmul_backward16(kc, NULL, g->dln16, D + w->qkvw, D + w->qkvb, NULL, g->dqkv16, g->ln1_16 + s * BTC,
                                 P16 + w->qkvw, (int)BT, C, 3 * C);
        else if (g->lp16)
            k->matmul_backward16(kc, NULL, g->dln16, D + w->qkvw, D + w->qkvb, g->dqkv, NULL, g->ln1_16 + s * BTC,
                                 P16 + w->qkvw, (int)BT, C, 3 * C);
        else
            lora_linear_backward(m, dln1, g->dqkv, g->ln1 + s * BTC, w->qkvw, w->qkvb, &w->qkv_site, 1, (int)BT, C,
                                 3 * C);
        /* The key bias adds q·b to every score of a row, which softmax
         * ignores: its true gradient is exactly zero.  What the sum above
         * leaves there is rounding noise, and Adam would turn that noise
         * into full-size steps of a parameter that never changes the loss
         * (and make runs differ with the micro-batch split).  Clear it. */
        if (D)
            k->zero(kc, D + w->qkvb + C, (size_t)C);
        if (g->lp16) /* dres16 for the layer below's fcproj backward */
            k->layernorm_backward16(kc, g->dres, l > 0 ? g->dres16 : NULL, D + w->ln1w, D + w->ln1b, NULL, g->dln16,
                                    residual, P + w->ln1w, ln1_mean, ln1_rstd, (int)BT, C);
        else
            k->layernorm_backward(kc, g->dres, DG(w->ln1w), DG(w->ln1b), dln1, residual, B32(w->ln1w), ln1_mean,
                                  ln1_rstd, (int)BT, C);
        model_grads_final(m, w->ln1w); /* the layer's first tensor */
    }
    if (D) /* a frozen base (lora.h) has no embedding to train */
        k->encoder_backward(kc, D + g->wte, D + g->wpe, g->dres, b->x, B, T, C);
}

static void gpt_backward(model *m, const model_batch *b, float dloss)
{
    gpt *g = G(m);
    model_loss_backward(m, &g->loss, b->y, (size_t)b->n * g->T, dloss);
    gpt_backward_body(m, b);
}

static void gpt_train_body(model *m, const model_batch *b)
{
    gpt_body(m, b->x, (int)b->n, (int)G(m)->T);
}

static double gpt_forward_backward(model *m, const model_batch *b, float dloss)
{
    return model_forward_backward(m, b, dloss, &G(m)->loss, gpt_train_body, gpt_backward_body);
}

static void gpt_destroy(model *m)
{
    gpt *g = G(m);
    if (!g)
        return;
    free(g->layer);
    free(g->dloss_host);
    free(g);
    m->impl = NULL;
}

static const model_ops gpt_ops = {
    .units_per_sample = gpt_units,
    .activation_bytes = gpt_activation_bytes,
    .bind_activations = gpt_bind,
    .init_params = gpt_init,
    .forward = gpt_forward,
    .forward_logits = gpt_forward_logits,
    .decode_bytes = gpt_decode_bytes,
    .decode_start = gpt_decode_start,
    .decode_step = gpt_decode_step,
    .backward = gpt_backward,
    .forward_backward = gpt_forward_backward,
    .destroy = gpt_destroy,
};

/* LoRA's sites, Hugging Face's GPT2LMHeadModel module names (PEFT's
 * "c_proj" names both projections, as its suffix match does), and the
 * base tensors the fp32 kernels read. */
static int gpt_lora(const job_config *j, model *m, char *err, size_t err_len)
{
    if (lora_create(m, j, err, err_len) != 0)
        return -1;
    if (!m->lora)
        return 0;
    gpt *g = G(m);
    int C = (int)g->C;
    char mod[96];
    for (uint32_t l = 0; l < g->L; l++) {
        gpt_layer *w = &g->layer[l];
#define SITE(field, name, target, in, out)                                      \
    do {                                                                        \
        snprintf(mod, sizeof mod, "transformer.h.%u." name, l);                 \
        w->field = lora_site(m, mod, target, (in), (out), (out), 0);            \
    } while (0)
        SITE(qkv_site, "attn.c_attn", "c_attn", C, 3 * C);
        SITE(attproj_site, "attn.c_proj", "c_proj", C, C);
        SITE(fc_site, "mlp.c_fc", "c_fc", C, 4 * C);
        SITE(fcproj_site, "mlp.c_proj", "c_proj", 4 * C, C);
#undef SITE
        size_t vec[][2] = {{w->ln1w, C},     {w->ln1b, C}, {w->qkvb, 3 * (size_t)C}, {w->attprojb, C},
                           {w->ln2w, C},     {w->ln2b, C}, {w->fcb, 4 * (size_t)C},  {w->fcprojb, C}};
        for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++)
            lora_keep32(m, vec[i][0], vec[i][1]);
    }
    lora_keep32(m, g->wpe, (size_t)g->P * g->C);
    lora_keep32(m, g->lnfw, g->C);
    lora_keep32(m, g->lnfb, g->C);
    return lora_finish(m, err, err_len);
}

/* Every depth a job file may ask for has its tensors: 12 per block, 4 more. */
_Static_assert(12 * JOBCFG_MAX_LAYERS + 4 <= MODEL_MAX_TENSORS, "MODEL_MAX_TENSORS below [model] layers' range");

static int gpt_create(const job_config *j, uint32_t input_dim, uint32_t classes, model *m, char *err,
                      size_t err_len)
{
    (void)input_dim;
    (void)classes;
    if (j->heads == 0 || j->width % j->heads) {
        snprintf(err, err_len, "gpt: heads (%u) must divide width (%u)", j->heads, j->width);
        return -1;
    }
    if (12 * (size_t)j->layers + 4 > MODEL_MAX_TENSORS) {
        snprintf(err, err_len, "gpt: %u layers are more than this build supports", j->layers);
        return -1;
    }
    gpt *g = calloc(1, sizeof *g);
    if (g)
        g->layer = calloc(j->layers, sizeof *g->layer);
    if (!g || !g->layer) {
        free(g);
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    g->L = j->layers;
    g->C = j->width;
    g->NH = j->heads;
    g->T = j->context;
    g->P = j->positions > j->context ? j->positions : j->context;
    g->V = j->vocab;
    g->fused = m->k && m->k->attention_fused_ok && m->k->attention_fused_ok(m->kc, g->C, g->NH);
    const kern_ops *k = m->k;
    g->lp16 = model_act16(j, k) && k->layernorm_forward16 && k->layernorm_backward16 && k->gelu_forward16 &&
              k->gelu_backward16;
    g->qkv16_on = g->lp16 && g->fused && k->attention_fused_forward16 && k->attention_fused_backward16;
    m->needs_params16 = g->lp16;
    m->impl = g;
    m->ops = &gpt_ops;

    size_t C = g->C;
    char name[64];
#define ADD1(field, nm, d0, decay)                                   \
    do {                                                             \
        size_t shape[1] = {(d0)};                                    \
        field = m->num_params;                                       \
        model_add_tensor(m, nm, 1, shape, decay, false);             \
    } while (0)
#define ADD2(field, nm, d0, d1, tr)                                  \
    do {                                                             \
        size_t shape[2] = {(d0), (d1)};                              \
        field = m->num_params;                                       \
        model_add_tensor(m, nm, 2, shape, true, tr);                 \
    } while (0)
    ADD2(g->wte, "wte.weight", g->V, C, false);
    ADD2(g->wpe, "wpe.weight", g->P, C, false); /* rows T.. are never read: kept for export */
    for (uint32_t l = 0; l < g->L; l++) {
        gpt_layer *w = &g->layer[l];
#define NAME(suffix) (snprintf(name, sizeof name, "h.%u." suffix, l), name)
        ADD1(w->ln1w, NAME("ln_1.weight"), C, false);
        ADD1(w->ln1b, NAME("ln_1.bias"), C, false);
        ADD2(w->qkvw, NAME("attn.c_attn.weight"), 3 * C, C, true);
        ADD1(w->qkvb, NAME("attn.c_attn.bias"), 3 * C, false);
        ADD2(w->attprojw, NAME("attn.c_proj.weight"), C, C, true);
        ADD1(w->attprojb, NAME("attn.c_proj.bias"), C, false);
        ADD1(w->ln2w, NAME("ln_2.weight"), C, false);
        ADD1(w->ln2b, NAME("ln_2.bias"), C, false);
        ADD2(w->fcw, NAME("mlp.c_fc.weight"), 4 * C, C, true);
        ADD1(w->fcb, NAME("mlp.c_fc.bias"), 4 * C, false);
        ADD2(w->fcprojw, NAME("mlp.c_proj.weight"), C, 4 * C, true);
        ADD1(w->fcprojb, NAME("mlp.c_proj.bias"), C, false);
#undef NAME
    }
    ADD1(g->lnfw, "ln_f.weight", C, false);
    ADD1(g->lnfb, "ln_f.bias", C, false);
#undef ADD1
#undef ADD2
    if (gpt_lora(j, m, err, err_len) != 0) {
        gpt_destroy(m);
        return -1;
    }
    return 0;
}

/* ---- the kind ----------------------------------------------------------------------- */

static int gpt_check_job(const job_config *j, char *err, size_t err_len)
{
    if (j->width % j->heads)
        return model_job_error(j, "model", "heads", "must divide [model] width", err, err_len);
    if (j->format == JOBCFG_DATA_IDX)
        return model_job_error(j, "data", "format", "idx images train an mlp, not a gpt", err, err_len);
    return 0;
}

static void gpt_describe(const model *m, char *buf, size_t len)
{
    const gpt *g = G(m);
    int n = snprintf(buf, len, "gpt layers=%u heads=%u width=%u context=%u vocab=%u", g->L, g->NH, g->C, g->T, g->V);
    if (g->P != g->T && n >= 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, " positions=%u", g->P);
}

static int gpt_parse(const char *line, job_config *j, char *err, size_t err_len)
{
    unsigned l, h, w, c, v, p = 0;
    int used = 0, more = 0;
    if (sscanf(line, "gpt layers=%u heads=%u width=%u context=%u vocab=%u%n", &l, &h, &w, &c, &v, &used) != 5 ||
        (line[used] != '\0' && (line[used] != ' ' || sscanf(line + used + 1, "positions=%u%n", &p, &more) != 1 ||
                                 line[used + 1 + more] != '\0'))) {
        snprintf(err, err_len,
                 "'%s' is not a gpt model line (gpt layers=N heads=N width=N context=N vocab=N [positions=N])",
                 line);
        return -1;
    }
    if (!l || !h || !w || !c || v < 2 || w % h || l > 1000 || w > (1u << 16) || c > (1u << 16) || v > (1u << 20) ||
        (more && (p <= c || p > (1u << 16)))) {
        snprintf(err, err_len, "'%s' describes no model gradd can build", line);
        return -1;
    }
    j->layers = l;
    j->heads = h;
    j->width = w;
    j->context = c;
    j->vocab = v;
    j->positions = more ? p : 0;
    return 0;
}

/* ---- Hugging Face's GPT2LMHeadModel ------------------------------------------------ */

/* A whole number from lo to hi at config.json's key (def where absent,
 * unless def is 0). */
static int hf_count(const json_t *cfg, const char *key, long long lo, long long hi, long long def, uint32_t *out,
                    char *err, size_t err_len)
{
    const json_t *v = json_object_get(cfg, key);
    long long x = def;
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v))
            return errmsg_set(err, err_len, "config.json: %s: expected a whole number", key);
        x = json_integer_value(v);
    } else if (!def) {
        return errmsg_set(err, err_len, "config.json: %s: is required", key);
    }
    if (x < lo || x > hi)
        return errmsg_set(err, err_len, "config.json: %s: %lld is not from %lld to %lld", key, x, lo, hi);
    *out = (uint32_t)x;
    return 0;
}

static int gpt_hf_read(const void *config, job_config *j, char *err, size_t err_len)
{
    const json_t *cfg = config;
    uint32_t ctx = 0, inner = 0;
    if (hf_count(cfg, "n_embd", 1, 16384, 0, &j->width, err, err_len) ||
        hf_count(cfg, "n_layer", 1, JOBCFG_MAX_LAYERS, 0, &j->layers, err, err_len) ||
        hf_count(cfg, "n_head", 1, 128, 0, &j->heads, err, err_len) ||
        hf_count(cfg, "vocab_size", 2, JOBCFG_MAX_VOCAB, 0, &j->vocab, err, err_len))
        return -1;
    if (json_object_get(cfg, "n_positions")) {
        if (hf_count(cfg, "n_positions", 2, 65536, 0, &j->context, err, err_len))
            return -1;
    } else if (hf_count(cfg, "n_ctx", 2, 65536, 0, &j->context, err, err_len)) {
        return -1;
    }
    if (json_object_get(cfg, "n_ctx") && hf_count(cfg, "n_ctx", 2, 65536, 0, &ctx, err, err_len) == 0 &&
        ctx != j->context)
        return errmsg_set(err, err_len, "config.json: n_ctx: %u but n_positions is %u", ctx, j->context);
    j->positions = j->context;
    if (j->width % j->heads)
        return errmsg_set(err, err_len, "config.json: n_head: %u does not divide n_embd %u", j->heads, j->width);
    if (hf_count(cfg, "n_inner", 1, 1 << 18, 4 * (long long)j->width, &inner, err, err_len))
        return -1;
    if (inner != 4 * j->width)
        return errmsg_set(err, err_len, "config.json: n_inner: %u; gradd's gpt has 4 × n_embd (%u)", inner,
                          4 * j->width);
    /* gradd's layernorm has eps 1e-5 (kernels/cpu/layernorm.c) and its
     * GELU is the tanh approximation: another would be another model. */
    const json_t *eps = json_object_get(cfg, "layer_norm_epsilon");
    if (eps && (!json_is_number(eps) || json_number_value(eps) != 1e-5))
        return errmsg_set(err, err_len, "config.json: layer_norm_epsilon: gradd's gpt has 1e-05 only");
    const json_t *act = json_object_get(cfg, "activation_function");
    const char *a = act ? json_string_value(act) : "gelu_new";
    if (!a || (strcmp(a, "gelu_new") && strcmp(a, "gelu_pytorch_tanh")))
        return errmsg_set(err, err_len, "config.json: activation_function: gradd's gpt has gelu_new "
                          "(gelu_pytorch_tanh) only");
    const json_t *tie = json_object_get(cfg, "tie_word_embeddings");
    if (tie && !json_is_true(tie))
        return errmsg_set(err, err_len, "config.json: tie_word_embeddings: gradd's gpt ties its output layer to "
                          "wte, so only true");
    const json_t *inv = json_object_get(cfg, "scale_attn_by_inverse_layer_idx");
    if (inv && json_is_true(inv))
        return errmsg_set(err, err_len, "config.json: scale_attn_by_inverse_layer_idx: gradd's gpt has false only");
    const json_t *scale = json_object_get(cfg, "scale_attn_weights");
    if (scale && !json_is_true(scale))
        return errmsg_set(err, err_len, "config.json: scale_attn_weights: gradd's gpt has true only");
    return 0;
}

static void *gpt_hf_config(const model *m)
{
    const gpt *g = G(m);
    json_t *c = json_pack("{s:[s],s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:s,s:f,s:s,s:b,s:I,s:I,s:f,s:f,s:f,s:f}",
                          "architectures", "GPT2LMHeadModel", "model_type", "gpt2", "n_embd", (json_int_t)g->C,
                          "n_layer", (json_int_t)g->L, "n_head", (json_int_t)g->NH, "n_positions",
                          (json_int_t)g->P, "n_ctx", (json_int_t)g->P, "vocab_size", (json_int_t)g->V,
                          "activation_function", "gelu_new", "layer_norm_epsilon", 1e-5, "torch_dtype", "float32",
                          "tie_word_embeddings", 1, "bos_token_id", (json_int_t)g->V - 1, "eos_token_id",
                          (json_int_t)g->V - 1, "initializer_range", 0.02, "attn_pdrop", 0.0, "embd_pdrop", 0.0,
                          "resid_pdrop", 0.0);
    return c;
}

/* What a GPT2LMHeadModel checkpoint holds besides gradd's tensors: the
 * causal mask buffers of older transformers, and the head tied to wte. */
static bool gpt_hf_ignore(const model *m, const char *name)
{
    (void)m;
    if (!strcmp(name, "lm_head.weight"))
        return true;
    if (strncmp(name, "h.", 2))
        return false;
    const char *p = name + 2;
    if (*p < '0' || *p > '9')
        return false;
    while (*p >= '0' && *p <= '9')
        p++;
    return !strcmp(p, ".attn.bias") || !strcmp(p, ".attn.masked_bias");
}

static const char *const gpt_lora_targets[] = {"c_attn", "c_proj", "c_fc", NULL};

const model_kind model_kind_gpt = {
    .name = "gpt",
    .a_name = "a gpt",
    .unit = "tok",
    .units = "tokens",
    .data = MODEL_DATA_TOKENS,
    .generates = true,
    .recomputes = true,
    .check_job = gpt_check_job,
    .create = gpt_create,
    .describe = gpt_describe,
    .parse = gpt_parse,
    .hf_type = "gpt2",
    .hf_prefix = "transformer.",
    .lora_targets = gpt_lora_targets,
    .lora_default = "c_attn",
    .lora_fan_in_fan_out = true,
    .hf_read = gpt_hf_read,
    .hf_config = gpt_hf_config,
    .hf_ignore = gpt_hf_ignore,
};
