/* model_llama.c — Llama: RMSNorm pre-norm blocks, rotary positions (with
 * Llama 3's frequency scaling), grouped-query attention, a SwiGLU MLP, no
 * biases, the output layer tied to the token embedding or not.
 *
 * Parameters carry transformers' LlamaForCausalLM names, matrices stored
 * (out,in) like nn.Linear, so they export as they are:
 *   model.embed_tokens.weight (V,C),
 *   model.layers.l.{input_layernorm.weight (C),
 *       self_attn.q_proj.weight (NH·HS,C), self_attn.k_proj.weight (KVH·HS,C),
 *       self_attn.v_proj.weight (KVH·HS,C), self_attn.o_proj.weight (C,NH·HS),
 *       post_attention_layernorm.weight (C),
 *       mlp.gate_proj.weight (F,C), mlp.up_proj.weight (F,C), mlp.down_proj.weight (C,F)},
 *   model.norm.weight (C), lm_head.weight (V,C) unless tied.
 * q, k and v lie one after the other, so one GEMM over the three writes a
 * row of qkv (NH + 2·KVH heads, what the attention kernels read), and gate
 * and up likewise write [gate | up] (what SwiGLU reads).
 *
 * Activations keep what backward reads (per layer: ln1 and its rstd, qkv
 * after RoPE, the attention output and its lse, residual2, ln2 and its
 * rstd, [gate | up], the SwiGLU output, residual3); the rest is one
 * layer's scratch.  With recompute (model.h) the per-layer ones but
 * residual3 hold one layer, and the backward runs each block's forward
 * again into them.  As in model_gpt.c the residual stream's gradient is one
 * buffer that the RMSNorm backwards add into.
 *
 * 16-bit activations (lp16, model_act16): where the kernels' 16-bit ops
 * pay, a bf16/fp16 job keeps ln1, ln2, [gate | up], the SwiGLU output, lnf
 * and the logits in the context's 16-bit type, and hands the gradients
 * between those ops (dln, dgu, dhid, dlogits, and the residual stream's
 * dres16 copy) in 16 bits: each is read only by GEMMs and SwiGLU, which
 * would round it to 16 bits anyway, so it is rounded once where it is
 * written.  Their fp32 buffers are then empty.  qkv, the attention output
 * and their gradients stay fp32 (RoPE and the attention kernels are
 * fp32); the attention output is rounded into one layer's atty16 for the
 * output projection's GEMM, forward and backward.  Without lp16 the fp32
 * GEMMs of a bf16/fp16 context round their inputs themselves (kernels.h).
 *
 * With LoRA (lora.h) every GEMM of a base weight, the head's included, goes
 * through lora_linear_forward/backward with the adapters of its sites (q, k
 * and v share the qkv GEMM, gate and up the gate_up one), the norms read
 * their weights through lora_base32, and the base gets no gradient: no
 * embedding backward, no norm weight gradients.  A 16-bit base has no fp32
 * token table: the embedding is read from params16. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lora.h"
#include "model.h"

#define ALIGN 64

/* One block's parameter offsets (in floats, into m->params / m->grads). */
typedef struct {
    size_t ln1w, qkvw, ow, ln2w, guw, downw;
    /* The LoRA sites of each GEMM (lora_site; -1: none). */
    int qkv_site[3], o_site, gu_site[2], down_site;
} llama_layer;

typedef struct {
    uint32_t L, C, NH, KVH, HS, F, T, V;
    uint32_t W; /* a qkv row: (NH + 2·KVH)·HS */
    double theta, norm_eps;
    int scaling; /* jobcfg_rope_scaling */
    double factor, low_freq, high_freq;
    uint32_t rope_context;
    uint32_t P; /* the positions the model is made for, T or more (jobcfg.h): its export's */
    bool tied;
    bool lp16; /* 16-bit activations (above) */
    /* lp16: the attention output's rounding, to the context's type. */
    void (*narrow)(kern_ctx *k, uint16_t *dst, const float *src, size_t n);
    llama_layer *layer;
    size_t embed, normw, head; /* head == embed when tied */
    float *inv_freq_host;      /* (HS/2), scaling included */

    /* Activations for up to n samples. */
    uint32_t n;
    bool rc; /* bound with recompute: per-layer buffers hold one layer (slot 0) */
    float *inv_freq;                 /* (HS/2), on the device */
    float *encoded;                  /* (B,T,C) */
    float *ln1, *ln1_rstd;           /* (L,B,T,C), (L,B,T) */
    float *qkv;                      /* (L,B,T,W) */
    float *atty, *att_lse;           /* (L,B,T,C), (L,B,NH,T) */
    float *residual2;                /* (L,B,T,C) */
    float *ln2, *ln2_rstd;           /* (L,B,T,C), (L,B,T) */
    float *gu, *hid;                 /* (L,B,T,2F), (L,B,T,F) */
    float *residual3;                /* (L,B,T,C) */
    float *lnf, *lnf_rstd;           /* (B,T,C), (B,T) */
    float *logits, *lse, *losses;    /* (B,T,V) (dlogits in backward), (B,T), (B,T) */
    /* One layer of scratch. */
    float *proj;                     /* (B,T,C) o_proj and down_proj outputs */
    float *dres;                     /* (B,T,C) residual-stream gradient */
    float *dsmall;                   /* (B,T,C) dln, datty */
    float *dqkv;                     /* (B,T,W) */
    float *dgu, *dhid;               /* (B,T,2F), (B,T,F) */
    float *dlosses;                  /* (B,T) */
    /* lp16: as ln1, ln2, gu, hid, lnf, logits (which then are empty) */
    uint16_t *ln1_16, *ln2_16, *gu16, *hid16, *lnf16, *logits16;
    /* lp16 scratch: the attention output rounded; dres rounded for the
     * GEMMs that read it; and as dsmall (the norms' douts), dgu, dhid */
    uint16_t *atty16, *dres16, *dln16, *dgu16, *dhid16;
    void *lora_scratch;              /* lora_scratch_bytes for B·T rows */
    float *dloss_host;               /* host, (B,T) */
    model_loss loss;                 /* the loss's buffers above (model.h) */

    /* Incremental decoding: a buffer of the caller's (decode_start). */
    uint32_t dec_n, dec_len;
    float *kcache, *vcache;          /* (L,n,T,KVH·HS) */
    float *dec_att;                  /* (n,NH,T) */
    int32_t *dec_pos;                /* (n) this step's position, for RoPE */
    int32_t *dec_pos_host;
} llama;

static llama *LL(const model *m) { return (llama *)m->impl; }

/* ---- rotary frequencies --------------------------------------------------------------
 * inv_freq[i] = theta^(-2i/HS); with Llama 3 scaling, as transformers'
 * _compute_llama3_parameters: wavelengths 2π/inv_freq above
 * rope_context/low_freq are slowed by `factor`, those below
 * rope_context/high_freq kept, and the band between blended smoothly. */
static void rope_frequencies(const llama *g, float *out)
{
    uint32_t half = g->HS / 2;
    for (uint32_t i = 0; i < half; i++) {
        double f = 1.0 / pow(g->theta, (double)(2 * i) / g->HS);
        if (g->scaling == JOBCFG_ROPE_LLAMA3) {
            double wavelen = 2 * M_PI / f;
            double low_wavelen = g->rope_context / g->low_freq, high_wavelen = g->rope_context / g->high_freq;
            if (wavelen > low_wavelen) {
                f /= g->factor;
            } else if (wavelen >= high_wavelen) {
                double s = (g->rope_context / wavelen - g->low_freq) / (g->high_freq - g->low_freq);
                f = (1 - s) * f / g->factor + s * f;
            }
        }
        out[i] = (float)f;
    }
}

/* ---- activation layout ------------------------------------------------------------ */

/* carve()'s buffers, each of which may add up to ALIGN bytes: its own 37,
 * and the four that LoRA's scratch may round within (lora.h). */
#define LLAMA_BUFFERS 41

/* In lp16 mode the fp32 buffers that the 16-bit ones replace are empty,
 * and the other way round. */
static size_t carve(const model *m, llama *g, char *base, uint32_t n, bool rc)
{
    size_t BT = (size_t)n * g->T, C = g->C, L = rc ? 1 : g->L, W = g->W, F = g->F, V = g->V;
    size_t f32 = g->lp16 ? 0 : 1, h16 = g->lp16 ? 1 : 0;
    size_t off = 0;
#define TAKE_BYTES(ptr, bytes)                             \
    do {                                                   \
        if (base)                                          \
            g->ptr = (void *)(base + off);                 \
        off += ((bytes) + ALIGN - 1) / ALIGN * ALIGN;      \
    } while (0)
#define TAKE(ptr, count) TAKE_BYTES(ptr, (count) * sizeof(float))
#define TAKE16(ptr, count) TAKE_BYTES(ptr, (count) * sizeof(uint16_t))
    TAKE(inv_freq, g->HS / 2);
    TAKE(encoded, BT * C);
    TAKE(ln1, f32 * L * BT * C);
    TAKE16(ln1_16, h16 * L * BT * C);
    TAKE(ln1_rstd, L * BT);
    TAKE(qkv, L * BT * W);
    TAKE(atty, L * BT * C);
    TAKE(att_lse, L * n * g->NH * g->T);
    TAKE(residual2, L * BT * C);
    TAKE(ln2, f32 * L * BT * C);
    TAKE16(ln2_16, h16 * L * BT * C);
    TAKE(ln2_rstd, L * BT);
    TAKE(gu, f32 * L * BT * 2 * F);
    TAKE16(gu16, h16 * L * BT * 2 * F);
    TAKE(hid, f32 * L * BT * F);
    TAKE16(hid16, h16 * L * BT * F);
    TAKE(residual3, (size_t)g->L * BT * C); /* the blocks' inputs and the loss's: kept whole */
    TAKE(lnf, f32 * BT * C);
    TAKE16(lnf16, h16 * BT * C);
    TAKE(lnf_rstd, BT);
    TAKE(logits, f32 * BT * V);
    TAKE16(logits16, h16 * BT * V);
    TAKE(lse, BT);
    TAKE(losses, BT);
    TAKE(proj, f32 * BT * C); /* lp16: the projections add into the stream themselves */
    TAKE16(atty16, h16 * BT * C);
    TAKE(dres, BT * C);
    TAKE16(dres16, h16 * BT * C);
    TAKE(dsmall, BT * C);
    TAKE16(dln16, h16 * BT * C);
    TAKE(dqkv, BT * W);
    TAKE(dgu, f32 * BT * 2 * F);
    TAKE16(dgu16, h16 * BT * 2 * F);
    TAKE(dhid, f32 * BT * F);
    TAKE16(dhid16, h16 * BT * F);
    TAKE(dlosses, BT);
    TAKE_BYTES(lora_scratch, lora_scratch_bytes(m, BT));
#undef TAKE16
#undef TAKE
#undef TAKE_BYTES
    return off;
}

static uint32_t llama_units(const model *m)
{
    return LL(m)->T;
}

static void llama_activation_bytes(const model *m, size_t *fixed, size_t *per_sample)
{
    llama *g = LL(m);
    model_activation_split(carve(m, g, NULL, 1, m->recompute), carve(m, g, NULL, 2, m->recompute), LLAMA_BUFFERS,
                           ALIGN, fixed, per_sample);
}

static int llama_bind(model *m, void *mem, uint32_t n)
{
    llama *g = LL(m);
    carve(m, g, mem, n, m->recompute);
    lora_bind(m, g->lora_scratch, (size_t)n * g->T);
    g->rc = m->recompute;
    g->n = n;
    m->max_n = n;
    free(g->dloss_host);
    g->dloss_host = malloc((size_t)n * g->T * sizeof(float));
    g->loss = (model_loss){g->lp16, g->logits, g->logits16, g->lse, g->losses, g->dlosses, g->dloss_host, (int)g->V};
    m->k->copy_h2d(m->kc, g->inv_freq, g->inv_freq_host, g->HS / 2 * sizeof(float));
    g->dec_n = 0;
    g->dec_len = 0;
    return g->dloss_host ? 0 : -1;
}

/* ---- parameters ---------------------------------------------------------------------- */

/* Llama's: N(0, 0.02) for every matrix and the embedding, unit norms. */
static void llama_init(const model *m, float *params, uint64_t seed)
{
    for (int t = 0; t < m->ntensors; t++) {
        const model_tensor *mt = &m->tensors[t];
        float *p = params + mt->offset;
        if (mt->ndim == 1) {
            for (size_t i = 0; i < mt->numel; i++)
                p[i] = 1.0f;
        } else {
            for (size_t i = 0; i < mt->numel; i++)
                p[i] = 0.02f * model_rand_normal(seed, mt->offset + i);
        }
    }
}

/* ---- forward ------------------------------------------------------------------------- */

/* The token embeddings of B sequences of T tokens into out (B,T,C): from
 * the fp32 table, or from params16 for a base held in 16 bits only. */
static void embed_forward(model *m, float *out, const int32_t *tokens, int B, int T)
{
    const llama *g = LL(m);
    if (m->params)
        m->k->encoder_forward(m->kc, out, tokens, m->params + g->embed, NULL, B, T, (int)g->C);
    else
        m->k->encoder_forward16w(m->kc, out, tokens, m->params16 + g->embed, NULL, B, T, (int)g->C);
}

/* Block l's forward for B sequences of T tokens, from its input into its
 * activations (layer l's, or the one layer's with recompute).  `out`: also
 * residual3, its output; the backward's recomputation leaves it (kept, and
 * no backward reads the down projection's output).  pos, start (B,T) or
 * NULL: model_batch's. */
static void llama_block_forward(model *m, uint32_t l, const int32_t *pos, const int32_t *start, int B, int T,
                                bool out)
{
    llama *g = LL(m);
    const kern_ops *k = m->k;
    kern_ctx *kc = m->kc;
    int C = (int)g->C, NH = (int)g->NH, KVH = (int)g->KVH, HS = (int)g->HS, F = (int)g->F, W = (int)g->W;
    int BT = B * T;
    size_t BTC = (size_t)BT * C, s = g->rc ? 0 : l; /* the slot of the per-layer buffers */
    float eps = (float)g->norm_eps;
    const float *residual = l == 0 ? g->encoded : g->residual3 + (l - 1) * BTC;
    float *ln1 = g->ln1 + s * BTC, *ln1_rstd = g->ln1_rstd + s * BT;
    float *qkv = g->qkv + s * BT * W, *atty = g->atty + s * BTC;
    float *lse = g->att_lse + s * B * NH * T, *res2 = g->residual2 + s * BTC;
    float *ln2 = g->ln2 + s * BTC, *ln2_rstd = g->ln2_rstd + s * BT;
    float *gu = g->gu + s * BT * 2 * F, *hid = g->hid + s * BT * F;
    float *res3 = g->residual3 + l * BTC;
    const llama_layer *w = &g->layer[l];

    if (g->lp16) {
        const float *P = m->params;
        const uint16_t *P16 = m->params16;
        uint16_t *ln1_16 = g->ln1_16 + s * BTC, *ln2_16 = g->ln2_16 + s * BTC;
        uint16_t *gu16 = g->gu16 + s * BT * 2 * F, *hid16 = g->hid16 + s * BT * F;
        k->rmsnorm_forward16(kc, ln1_16, ln1_rstd, residual, P + w->ln1w, BT, C, eps);
        k->matmul_forward16(kc, qkv, ln1_16, P16 + w->qkvw, NULL, BT, C, W);
        k->rope_forward(kc, qkv, g->inv_freq, pos, BT, T, NH + KVH, HS, W);
        k->attention_gqa_forward(kc, atty, lse, qkv, start, B, T, NH, KVH, HS);
        g->narrow(kc, g->atty16, atty, BTC);
        k->matmul_forward16_residual(kc, res2, g->atty16, P16 + w->ow, NULL, residual, BT, C, C);
        k->rmsnorm_forward16(kc, ln2_16, ln2_rstd, res2, P + w->ln2w, BT, C, eps);
        k->matmul_forward16_out16(kc, gu16, ln2_16, P16 + w->guw, NULL, BT, C, 2 * F);
        k->swiglu_forward16(kc, hid16, gu16, BT, F);
        if (out)
            k->matmul_forward16_residual(kc, res3, hid16, P16 + w->downw, NULL, res2, BT, F, C);
        return;
    }
    k->rmsnorm_forward(kc, ln1, ln1_rstd, residual, lora_base32(m, w->ln1w), BT, C, eps);
    lora_linear_forward(m, qkv, ln1, w->qkvw, LORA_NO_BIAS, w->qkv_site, 3, BT, C, W);
    k->rope_forward(kc, qkv, g->inv_freq, pos, BT, T, NH + KVH, HS, W);
    k->attention_gqa_forward(kc, atty, lse, qkv, start, B, T, NH, KVH, HS);
    lora_linear_forward(m, g->proj, atty, w->ow, LORA_NO_BIAS, &w->o_site, 1, BT, C, C);
    k->residual_forward(kc, res2, residual, g->proj, BTC);
    k->rmsnorm_forward(kc, ln2, ln2_rstd, res2, lora_base32(m, w->ln2w), BT, C, eps);
    lora_linear_forward(m, gu, ln2, w->guw, LORA_NO_BIAS, w->gu_site, 2, BT, C, 2 * F);
    k->swiglu_forward(kc, hid, gu, BT, F);
    if (out) {
        lora_linear_forward(m, g->proj, hid, w->downw, LORA_NO_BIAS, &w->down_site, 1, BT, F, C);
        k->residual_forward(kc, res3, res2, g->proj, BTC);
    }
}

/* Up to the logits, for B sequences of T <= g->T tokens (T < g->T: the
 * buffers hold the smaller tensors packed, for sampling).  pos, start
 * (B,T) or NULL: model_batch's. */
static void llama_body(model *m, const int32_t *inp, const int32_t *pos, const int32_t *start, int B, int T)
{
    llama *g = LL(m);
    const kern_ops *k = m->k;
    kern_ctx *kc = m->kc;
    int C = (int)g->C, BT = B * T;
    size_t BTC = (size_t)BT * C;
    float eps = (float)g->norm_eps;

    embed_forward(m, g->encoded, inp, B, T);
    for (uint32_t l = 0; l < g->L; l++) {
        if (model_poll(m))
            return;
        llama_block_forward(m, l, pos, start, B, T, true);
    }
    if (model_poll(m)) /* the output layer is the widest GEMM */
        return;
    const float *last = g->residual3 + (g->L - 1) * BTC;
    if (g->lp16) {
        k->rmsnorm_forward16(kc, g->lnf16, g->lnf_rstd, last, m->params + g->normw, BT, C, eps);
        k->matmul_forward16_out16(kc, g->logits16, g->lnf16, m->params16 + g->head, NULL, BT, C, (int)g->V);
        return;
    }
    k->rmsnorm_forward(kc, g->lnf, g->lnf_rstd, last, lora_base32(m, g->normw), BT, C, eps);
    lora_linear_forward(m, g->logits, g->lnf, g->head, LORA_NO_BIAS, NULL, 0, BT, C, (int)g->V);
}

static double llama_forward(model *m, const model_batch *b, uint64_t *correct)
{
    llama *g = LL(m);
    if (correct)
        *correct = 0;
    llama_body(m, b->x, b->pos, b->start, (int)b->n, (int)g->T);
    if (m->stopped)
        return 0;
    return model_loss_forward(m, &g->loss, b->y, (size_t)b->n * g->T);
}

static int llama_forward_logits(model *m, const int32_t *tokens, uint32_t n, uint32_t len, float *out)
{
    llama *g = LL(m);
    /* 16-bit logits stay on the device in training; sampling builds its own
     * fp32 model (sample.c), so this path never sees them. */
    if (n == 0 || n > g->n || len == 0 || len > g->T || g->lp16)
        return -1;
    llama_body(m, tokens, NULL, NULL, (int)n, (int)len);
    for (uint32_t s = 0; s < n; s++)
        m->k->copy_d2h(m->kc, out + (size_t)s * g->V, g->logits + ((size_t)s * len + len - 1) * g->V,
                       g->V * sizeof(float));
    return 0;
}

/* ---- incremental decoding ---------------------------------------------------------------- */

/* Keys and values of layer l, sequence b, position t at
 * kcache[((l·n + b)·T + t)·KVH·HS]: each layer's cache is the
 * (B,Tmax,KVH·HS) attention_gqa_decode reads. */
static size_t carve_decode(llama *g, char *base, uint32_t n)
{
    size_t cache = (size_t)g->L * n * g->T * g->KVH * g->HS * sizeof(float);
    size_t att = (size_t)n * g->NH * g->T * sizeof(float);
    cache = (cache + ALIGN - 1) / ALIGN * ALIGN;
    att = (att + ALIGN - 1) / ALIGN * ALIGN;
    if (base) {
        g->kcache = (float *)base;
        g->vcache = (float *)(base + cache);
        g->dec_att = (float *)(base + 2 * cache);
        g->dec_pos = (int32_t *)(base + 2 * cache + att);
    }
    return 2 * cache + att + ((size_t)n * sizeof(int32_t) + ALIGN - 1) / ALIGN * ALIGN;
}

static size_t llama_decode_bytes(const model *m, uint32_t n)
{
    return carve_decode(LL(m), NULL, n);
}

static int llama_decode_start(model *m, void *mem, uint32_t n)
{
    llama *g = LL(m);
    g->dec_n = 0;
    g->dec_len = 0;
    /* The fp32 activation buffers serve as scratch: some are empty in lp16. */
    if (!mem || n == 0 || n > g->n || g->lp16 || !m->k || !m->k->attention_gqa_decode)
        return -1;
    int32_t *host = realloc(g->dec_pos_host, n * sizeof *host);
    if (!host)
        return -1;
    g->dec_pos_host = host;
    carve_decode(g, mem, n);
    g->dec_n = n;
    return 0;
}

/* Position pos of each of the dec_n sequences through the whole model: the
 * layers of llama_body with B = n, T = 1 (a prefix of the activation
 * buffers), RoPE at pos, and attention over the cache. */
static int llama_decode_step(model *m, const int32_t *tokens, uint32_t pos, float *out)
{
    llama *g = LL(m);
    const kern_ops *k = m->k;
    kern_ctx *kc = m->kc;
    if (!g->dec_n || g->dec_n > g->n || g->lp16 || pos >= g->T || pos > g->dec_len)
        return -1;
    int n = (int)g->dec_n, C = (int)g->C, NH = (int)g->NH, KVH = (int)g->KVH, HS = (int)g->HS, F = (int)g->F;
    int W = (int)g->W, T = (int)g->T;
    size_t nC = (size_t)n * C, cache_l = (size_t)n * T * KVH * HS;
    float eps = (float)g->norm_eps;

    for (int i = 0; i < n; i++)
        g->dec_pos_host[i] = (int32_t)pos;
    k->copy_h2d(kc, g->dec_pos, g->dec_pos_host, (size_t)n * sizeof(int32_t));
    embed_forward(m, g->encoded, tokens, n, 1);
    const float *residual = g->encoded;
    for (uint32_t l = 0; l < g->L; l++) {
        const llama_layer *w = &g->layer[l];
        float *res2 = g->residual2, *res3 = g->residual3 + (l % 2) * nC;
        k->rmsnorm_forward(kc, g->ln1, g->ln1_rstd, residual, lora_base32(m, w->ln1w), n, C, eps);
        lora_linear_forward(m, g->qkv, g->ln1, w->qkvw, LORA_NO_BIAS, w->qkv_site, 3, n, C, W);
        k->rope_forward(kc, g->qkv, g->inv_freq, g->dec_pos, n, 1, NH + KVH, HS, W);
        k->attention_gqa_decode(kc, g->atty, g->dec_att, g->kcache + l * cache_l, g->vcache + l * cache_l, g->qkv,
                                n, (int)pos + 1, T, NH, KVH, HS);
        lora_linear_forward(m, g->proj, g->atty, w->ow, LORA_NO_BIAS, &w->o_site, 1, n, C, C);
        k->residual_forward(kc, res2, residual, g->proj, nC);
        k->rmsnorm_forward(kc, g->ln2, g->ln2_rstd, res2, lora_base32(m, w->ln2w), n, C, eps);
        lora_linear_forward(m, g->gu, g->ln2, w->guw, LORA_NO_BIAS, w->gu_site, 2, n, C, 2 * F);
        k->swiglu_forward(kc, g->hid, g->gu, n, F);
        lora_linear_forward(m, g->proj, g->hid, w->downw, LORA_NO_BIAS, &w->down_site, 1, n, F, C);
        k->residual_forward(kc, res3, res2, g->proj, nC);
        residual = res3;
    }
    k->rmsnorm_forward(kc, g->lnf, g->lnf_rstd, residual, lora_base32(m, g->normw), n, C, eps);
    lora_linear_forward(m, g->logits, g->lnf, g->head, LORA_NO_BIAS, NULL, 0, n, C, (int)g->V);
    k->copy_d2h(kc, out, g->logits, (size_t)n * g->V * sizeof(float));
    g->dec_len = pos + 1;
    return 0;
}

/* ---- backward ------------------------------------------------------------------------ */

/* A norm weight's gradient; NULL for a frozen base (lora.h). */
static float *norm_grad(const model *m, size_t off)
{
    return m->lora ? NULL : m->grads + off;
}

/* The stream's gradient through the final norm and the head's GEMM, from
 * the logits' gradient (the cross-entropy backward wrote dlogits over the
 * logits, their last reader, zeroing the rows of ignored targets). */
static void head_backward(model *m, int BT)
{
    llama *g = LL(m);
    const kern_ops *k = m->k;
    kern_ctx *kc = m->kc;
    int C = (int)g->C, V = (int)g->V;
    const float *last = g->residual3 + (g->L - 1) * (size_t)BT * C;
    k->zero(kc, g->dres, (size_t)BT * C);
    if (g->lp16) {
        k->matmul_backward16(kc, NULL, g->dln16, m->grads + g->head, NULL, NULL, g->logits16, g->lnf16,
                             m->params16 + g->head, BT, C, V);
        k->rmsnorm_backward16(kc, g->dres, g->dres16, m->grads + g->normw, NULL, g->dln16, last, m->params + g->normw,
                              g->lnf_rstd, BT, C);
        return;
    }
    lora_linear_backward(m, g->dsmall, g->logits, g->lnf, g->head, LORA_NO_BIAS, NULL, 0, BT, C, V);
    k->rmsnorm_backward(kc, g->dres, norm_grad(m, g->normw), g->dsmall, last, lora_base32(m, g->normw), g->lnf_rstd,
                        BT, C);
}

/* Block l's backward in 16-bit activations: dres and dres16 hold the
 * stream's gradient at its output; the 16-bit GEMM backwards write their
 * dinp in 16 bits where the next reader is a 16-bit op (dhid16, dgu16, the
 * norms' dln16), and the norms' backwards add into dres and write dres16
 * for the GEMM backward after them. */
static void block_backward16(model *m, const model_batch *b, uint32_t l, size_t s)
{
    llama *g = LL(m);
    const kern_ops *k = m->k;
    kern_ctx *kc = m->kc;
    int B = (int)b->n, T = (int)g->T, C = (int)g->C, NH = (int)g->NH, KVH = (int)g->KVH, HS = (int)g->HS;
    int F = (int)g->F, W = (int)g->W, BT = B * T;
    size_t BTC = (size_t)BT * C;
    const float *P = m->params;
    const uint16_t *P16 = m->params16;
    float *D = m->grads;
    const float *residual = l == 0 ? g->encoded : g->residual3 + (size_t)(l - 1) * BTC;
    const float *ln1_rstd = g->ln1_rstd + s * BT, *qkv = g->qkv + s * BT * W, *atty = g->atty + s * BTC;
    const float *lse = g->att_lse + s * B * NH * T, *res2 = g->residual2 + s * BTC, *ln2_rstd = g->ln2_rstd + s * BT;
    const uint16_t *ln1_16 = g->ln1_16 + s * BTC, *ln2_16 = g->ln2_16 + s * BTC;
    const uint16_t *gu16 = g->gu16 + s * BT * 2 * F, *hid16 = g->hid16 + s * BT * F;
    const llama_layer *w = &g->layer[l];

    k->matmul_backward16(kc, NULL, g->dhid16, D + w->downw, NULL, NULL, g->dres16, hid16, P16 + w->downw, BT, F, C);
    k->swiglu_backward16(kc, g->dgu16, gu16, g->dhid16, BT, F);
    k->matmul_backward16(kc, NULL, g->dln16, D + w->guw, NULL, NULL, g->dgu16, ln2_16, P16 + w->guw, BT, C, 2 * F);
    k->rmsnorm_backward16(kc, g->dres, g->dres16, D + w->ln2w, NULL, g->dln16, res2, P + w->ln2w, ln2_rstd, BT, C);

    /* atty16 holds the last block the forward ran: this one, just run
     * again with recompute; else round this one's output again. */
    if (!g->rc)
        g->narrow(kc, g->atty16, atty, BTC);
    k->matmul_backward16(kc, g->dsmall, NULL, D + w->ow, NULL, NULL, g->dres16, g->atty16, P16 + w->ow, BT, C, C);
    k->attention_gqa_backward(kc, g->dqkv, g->dsmall, atty, lse, qkv, b->start, B, T, NH, KVH, HS);
    k->rope_backward(kc, g->dqkv, g->inv_freq, b->pos, BT, T, NH + KVH, HS, W);
    k->matmul_backward16(kc, NULL, g->dln16, D + w->qkvw, NULL, g->dqkv, NULL, ln1_16, P16 + w->qkvw, BT, C, W);
    /* The embedding's backward reads dres, in fp32: no dres16 below block 0. */
    k->rmsnorm_backward16(kc, g->dres, l > 0 ? g->dres16 : NULL, D + w->ln1w, NULL, g->dln16, residual, P + w->ln1w,
                          ln1_rstd, BT, C);
}

/* The backward from the logits' gradient on. */
static void llama_backward_body(model *m, const model_batch *b)
{
    llama *g = LL(m);
    const kern_ops *k = m->k;
    kern_ctx *kc = m->kc;
    int B = (int)b->n, T = (int)g->T, C = (int)g->C, NH = (int)g->NH, KVH = (int)g->KVH, HS = (int)g->HS;
    int F = (int)g->F, W = (int)g->W, BT = B * T;
    size_t BTC = (size_t)BT * C;

    if (model_poll(m))
        return;
    head_backward(m, BT);
    model_grads_final(m, g->normw); /* and the untied head after it */

    for (int l = (int)g->L - 1; l >= 0; l--) {
        if (model_poll(m))
            return;
        /* Recompute: the block's activations again from its kept input;
         * it writes only forward buffers and atty16, so dres and dres16
         * carry over. */
        if (g->rc)
            llama_block_forward(m, (uint32_t)l, b->pos, b->start, B, T, false);
        size_t s = g->rc ? 0 : (size_t)l;
        const llama_layer *w = &g->layer[l];
        if (g->lp16) {
            block_backward16(m, b, (uint32_t)l, s);
            model_grads_final(m, w->ln1w); /* the layer's first tensor */
            continue;
        }
        const float *residual = l == 0 ? g->encoded : g->residual3 + (size_t)(l - 1) * BTC;
        const float *ln1 = g->ln1 + s * BTC, *ln1_rstd = g->ln1_rstd + s * BT;
        const float *qkv = g->qkv + s * BT * W, *atty = g->atty + s * BTC;
        const float *lse = g->att_lse + s * B * NH * T, *res2 = g->residual2 + s * BTC;
        const float *ln2 = g->ln2 + s * BTC, *ln2_rstd = g->ln2_rstd + s * BT;
        const float *gu = g->gu + s * BT * 2 * F, *hid = g->hid + s * BT * F;

        /* residual3 = residual2 + down(swiglu(gate_up(ln2))) */
        lora_linear_backward(m, g->dhid, g->dres, hid, w->downw, LORA_NO_BIAS, &w->down_site, 1, BT, F, C);
        k->swiglu_backward(kc, g->dgu, gu, g->dhid, BT, F);
        lora_linear_backward(m, g->dsmall, g->dgu, ln2, w->guw, LORA_NO_BIAS, w->gu_site, 2, BT, C, 2 * F);
        k->rmsnorm_backward(kc, g->dres, norm_grad(m, w->ln2w), g->dsmall, res2, lora_base32(m, w->ln2w), ln2_rstd, BT,
                            C);

        /* residual2 = residual + o(attention(rope(qkv(ln1)))) */
        lora_linear_backward(m, g->dsmall, g->dres, atty, w->ow, LORA_NO_BIAS, &w->o_site, 1, BT, C, C);
        k->attention_gqa_backward(kc, g->dqkv, g->dsmall, atty, lse, qkv, b->start, B, T, NH, KVH, HS);
        k->rope_backward(kc, g->dqkv, g->inv_freq, b->pos, BT, T, NH + KVH, HS, W);
        lora_linear_backward(m, g->dsmall, g->dqkv, ln1, w->qkvw, LORA_NO_BIAS, w->qkv_site, 3, BT, C, W);
        k->rmsnorm_backward(kc, g->dres, norm_grad(m, w->ln1w), g->dsmall, residual, lora_base32(m, w->ln1w), ln1_rstd,
                            BT, C);
        model_grads_final(m, w->ln1w); /* the layer's first tensor */
    }
    if (!m->lora) /* a frozen embedding: the residual stream's gradient ends here */
        k->encoder_backward(kc, m->grads + g->embed, NULL, g->dres, b->x, B, T, C);
}

static void llama_backward(model *m, const model_batch *b, float dloss)
{
    llama *g = LL(m);
    model_loss_backward(m, &g->loss, b->y, (size_t)b->n * g->T, dloss);
    llama_backward_body(m, b);
}

static void llama_train_body(model *m, const model_batch *b)
{
    llama_body(m, b->x, b->pos, b->start, (int)b->n, (int)LL(m)->T);
}

static double llama_forward_backward(model *m, const model_batch *b, float dloss)
{
    return model_forward_backward(m, b, dloss, &LL(m)->loss, llama_train_body, llama_backward_body);
}

static void llama_destroy(model *m)
{
    llama *g = LL(m);
    if (!g)
        return;
    free(g->layer);
    free(g->inv_freq_host);
    free(g->dloss_host);
    free(g->dec_pos_host);
    free(g);
    m->impl = NULL;
}

static const model_ops llama_ops = {
    .units_per_sample = llama_units,
    .activation_bytes = llama_activation_bytes,
    .bind_activations = llama_bind,
    .init_params = llama_init,
    .forward = llama_forward,
    .forward_logits = llama_forward_logits,
    .decode_bytes = llama_decode_bytes,
    .decode_start = llama_decode_start,
    .decode_step = llama_decode_step,
    .backward = llama_backward,
    .forward_backward = llama_forward_backward,
    .destroy = llama_destroy,
};

/* ---- shapes --------------------------------------------------------------------------- */

/* [model] mlp_width 0: Llama's own rule, 8/3 of the width rounded up to a
 * multiple of 256 (width 4096 gives Llama 2 7B's 11008). */
static uint32_t mlp_width_of(const job_config *j)
{
    if (j->mlp_width)
        return j->mlp_width;
    uint64_t f = (8ull * j->width + 2) / 3;
    return (uint32_t)((f + 255) / 256 * 256);
}

static uint32_t kv_heads_of(const job_config *j)
{
    return j->kv_heads ? j->kv_heads : j->heads;
}

/* Why the shape cannot be built, or NULL. */
static const char *shape_problem(const job_config *j, const char **key)
{
    uint32_t kvh = kv_heads_of(j);
    *key = "heads";
    if (j->heads == 0 || j->width % j->heads)
        return "must divide [model] width";
    *key = "kv_heads";
    if (kvh == 0 || j->heads % kvh)
        return "must divide [model] heads";
    *key = "width";
    if ((j->width / j->heads) % 2)
        return "a head (width / heads) must have an even size for rotary embeddings";
    *key = "rope_high_freq";
    if (j->rope_scaling == JOBCFG_ROPE_LLAMA3 && !(j->rope_high_freq > j->rope_low_freq))
        return "must be above [model] rope_low_freq";
    return NULL;
}

/* The linear layers that may get adapters, by PEFT's names; PEFT's default
 * for llama adapts q and v (model_kind_llama). */
static const char *const llama_lora_targets[] = {"q_proj",    "k_proj",  "v_proj",    "o_proj",
                                                 "gate_proj", "up_proj", "down_proj", NULL};

/* The adapters ([finetune] method = lora), after the tensor table: a site
 * per linear layer of each block, where its output lies in its GEMM's rows
 * (q, k, v in a qkv row; gate, up in a gate_up row), and the norm weights
 * the kernels read in fp32.  Without LoRA every site is -1.  0, or -1 with
 * err. */
static int llama_lora(const job_config *j, model *m, char *err, size_t err_len)
{
    llama *g = LL(m);
    if (lora_create(m, j, err, err_len) != 0)
        return -1;
    if (m->lora && m->k && j->precision != JOBCFG_FP32 && !m->k->encoder_forward16w) {
        snprintf(err, err_len, "llama: the %s kernels cannot read a 16-bit token table (LoRA on a 16-bit base)",
                 m->k->name);
        return -1;
    }
    int C = (int)g->C, F = (int)g->F, W = (int)g->W, Q = (int)(g->NH * g->HS), KV = (int)(g->KVH * g->HS);
    char name[96];
    for (uint32_t l = 0; l < g->L; l++) {
        llama_layer *w = &g->layer[l];
#define SITE(suffix, target, in, out, ld, col) \
    (snprintf(name, sizeof name, "model.layers.%u." suffix, l), lora_site(m, name, target, in, out, ld, col))
        w->qkv_site[0] = SITE("self_attn.q_proj", "q_proj", C, Q, W, 0);
        w->qkv_site[1] = SITE("self_attn.k_proj", "k_proj", C, KV, W, Q);
        w->qkv_site[2] = SITE("self_attn.v_proj", "v_proj", C, KV, W, Q + KV);
        w->o_site = SITE("self_attn.o_proj", "o_proj", Q, C, C, 0);
        w->gu_site[0] = SITE("mlp.gate_proj", "gate_proj", C, F, 2 * F, 0);
        w->gu_site[1] = SITE("mlp.up_proj", "up_proj", C, F, 2 * F, F);
        w->down_site = SITE("mlp.down_proj", "down_proj", F, C, C, 0);
#undef SITE
        lora_keep32(m, w->ln1w, g->C);
        lora_keep32(m, w->ln2w, g->C);
    }
    lora_keep32(m, g->normw, g->C);
    return m->lora ? lora_finish(m, err, err_len) : 0;
}

/* Every depth a job file may ask for has its tensors: 9 per block, 3 more. */
_Static_assert(9 * JOBCFG_MAX_LAYERS + 3 <= MODEL_MAX_TENSORS, "MODEL_MAX_TENSORS below [model] layers' range");

static int llama_create(const job_config *j, uint32_t input_dim, uint32_t classes, model *m, char *err,
                        size_t err_len)
{
    (void)input_dim;
    (void)classes;
    const char *key, *why = shape_problem(j, &key);
    if (why) {
        snprintf(err, err_len, "llama: %s: %s", key, why);
        return -1;
    }
    if (9 * (size_t)j->layers + 3 > MODEL_MAX_TENSORS) {
        snprintf(err, err_len, "llama: %u layers are more than this build supports", j->layers);
        return -1;
    }
    const kern_ops *k = m->k;
    if (k && !(k->rmsnorm_forward && k->rmsnorm_backward && k->rope_forward && k->rope_backward &&
               k->swiglu_forward && k->swiglu_backward && k->attention_gqa_forward && k->attention_gqa_backward)) {
        snprintf(err, err_len, "llama: the %s kernels have no Llama layers", k->name);
        return -1;
    }
    llama *g = calloc(1, sizeof *g);
    if (g) {
        g->layer = calloc(j->layers, sizeof *g->layer);
        g->inv_freq_host = malloc(j->width / j->heads / 2 * sizeof(float));
    }
    if (!g || !g->layer || !g->inv_freq_host) {
        if (g)
            free(g->layer);
        free(g);
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    g->L = j->layers;
    g->C = j->width;
    g->NH = j->heads;
    g->KVH = kv_heads_of(j);
    g->HS = j->width / j->heads;
    g->F = mlp_width_of(j);
    g->T = j->context;
    g->V = j->vocab;
    g->W = (g->NH + 2 * g->KVH) * g->HS;
    g->theta = j->rope_theta;
    g->norm_eps = j->norm_eps;
    g->scaling = j->rope_scaling;
    g->factor = j->rope_factor;
    g->low_freq = j->rope_low_freq;
    g->high_freq = j->rope_high_freq;
    g->rope_context = j->rope_context;
    g->tied = j->tie_embeddings;
    g->P = j->positions > j->context ? j->positions : j->context;
    g->narrow = k ? (j->precision == JOBCFG_FP16 ? k->cast_f32_to_f16 : k->cast_f32_to_bf16) : NULL;
    g->lp16 = model_act16(j, k) && k->rmsnorm_forward16 && k->rmsnorm_backward16 && k->swiglu_forward16 &&
              k->swiglu_backward16 && g->narrow;
    m->needs_params16 = g->lp16;
    rope_frequencies(g, g->inv_freq_host);
    if (k && k->attention_gqa_ok && !k->attention_gqa_ok(m->kc, (int)g->NH, (int)g->KVH, (int)g->HS)) {
        snprintf(err, err_len, "llama: the %s kernels have no attention for %u heads of %u over %u key/value heads",
                 k->name, g->NH, g->HS, g->KVH);
        free(g->layer), free(g->inv_freq_host), free(g);
        return -1;
    }
    m->impl = g;
    m->ops = &llama_ops;

    size_t C = g->C, KC = (size_t)g->KVH * g->HS, F = g->F;
    char name[64];
#define ADD(field, nm, nd, d0, d1)                                   \
    do {                                                             \
        size_t shape[2] = {(d0), (d1)};                              \
        field = m->num_params;                                       \
        model_add_tensor(m, nm, nd, shape, (nd) == 2, false);        \
    } while (0)
    ADD(g->embed, "model.embed_tokens.weight", 2, g->V, C);
    for (uint32_t l = 0; l < g->L; l++) {
        llama_layer *w = &g->layer[l];
        size_t unused;
#define NAME(suffix) (snprintf(name, sizeof name, "model.layers.%u." suffix, l), name)
        ADD(w->ln1w, NAME("input_layernorm.weight"), 1, C, 0);
        ADD(w->qkvw, NAME("self_attn.q_proj.weight"), 2, C, C);
        ADD(unused, NAME("self_attn.k_proj.weight"), 2, KC, C);
        ADD(unused, NAME("self_attn.v_proj.weight"), 2, KC, C);
        ADD(w->ow, NAME("self_attn.o_proj.weight"), 2, C, C);
        ADD(w->ln2w, NAME("post_attention_layernorm.weight"), 1, C, 0);
        ADD(w->guw, NAME("mlp.gate_proj.weight"), 2, F, C);
        ADD(unused, NAME("mlp.up_proj.weight"), 2, F, C);
        ADD(w->downw, NAME("mlp.down_proj.weight"), 2, C, F);
        (void)unused;
#undef NAME
    }
    ADD(g->normw, "model.norm.weight", 1, C, 0);
    if (g->tied)
        g->head = g->embed;
    else
        ADD(g->head, "lm_head.weight", 2, g->V, C);
#undef ADD
    if (llama_lora(j, m, err, err_len) != 0) {
        llama_destroy(m);
        return -1;
    }
    return 0;
}

/* ---- the describe line ------------------------------------------------------------------
 * "llama layers=.. heads=.. kv_heads=.. width=.. mlp_width=.. context=..
 * vocab=.. norm_eps=.. rope_theta=.. [rope_llama3=FACTOR,LOW,HIGH,CONTEXT]
 * tie_embeddings=on|off": the job file's keys, Llama 3 scaling's four in one
 * word (the line must fit a checkpoint's 256-byte signature), numbers in the
 * fewest digits that read back as the same double.  The layout of the
 * model's parameters, with or without adapters: a checkpoint names those
 * apart (its "lora" line). */

static void fmt_double(char *buf, size_t len, double v)
{
    if (v == floor(v) && fabs(v) < 1e15) { /* 500000, not 5e+05 */
        snprintf(buf, len, "%.0f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

static void llama_describe(const model *m, char *buf, size_t len)
{
    const llama *g = LL(m);
    char eps[32], theta[32], fac[32], lo[32], hi[32], rope[160] = "";
    fmt_double(eps, sizeof eps, g->norm_eps);
    fmt_double(theta, sizeof theta, g->theta);
    if (g->scaling == JOBCFG_ROPE_LLAMA3) {
        fmt_double(fac, sizeof fac, g->factor);
        fmt_double(lo, sizeof lo, g->low_freq);
        fmt_double(hi, sizeof hi, g->high_freq);
        snprintf(rope, sizeof rope, " rope_llama3=%s,%s,%s,%u", fac, lo, hi, g->rope_context);
    }
    snprintf(buf, len,
             "llama layers=%u heads=%u kv_heads=%u width=%u mlp_width=%u context=%u vocab=%u norm_eps=%s "
             "rope_theta=%s%s tie_embeddings=%s",
             g->L, g->NH, g->KVH, g->C, g->F, g->T, g->V, eps, theta, rope, g->tied ? "on" : "off");
    size_t n = strlen(buf);
    if (g->P != g->T && n + 1 < len)
        snprintf(buf + n, len - n, " positions=%u", g->P);
}

/* LK_POSITIONS: a u32 the line may leave out (0). */
typedef enum { LK_U32, LK_DOUBLE, LK_LLAMA3, LK_BOOL, LK_POSITIONS } llama_key_type;

typedef struct {
    const char *key;
    llama_key_type type;
    size_t field;  /* offset in job_config */
    double lo, hi; /* the job file's range */
} llama_key;

#define JF(f) offsetof(job_config, f)
static const llama_key line_keys[] = {
    {"layers", LK_U32, JF(layers), 1, JOBCFG_MAX_LAYERS},
    {"heads", LK_U32, JF(heads), 1, 128},
    {"kv_heads", LK_U32, JF(kv_heads), 1, 128},
    {"width", LK_U32, JF(width), 1, 16384},
    {"mlp_width", LK_U32, JF(mlp_width), 1, 1 << 18},
    {"context", LK_U32, JF(context), 2, 65536},
    {"vocab", LK_U32, JF(vocab), 2, JOBCFG_MAX_VOCAB},
    {"norm_eps", LK_DOUBLE, JF(norm_eps), 1e-12, 1},
    {"rope_theta", LK_DOUBLE, JF(rope_theta), 1, 1e12},
    {"rope_llama3", LK_LLAMA3, 0, 0, 0},
    {"tie_embeddings", LK_BOOL, JF(tie_embeddings), 0, 0},
    {"positions", LK_POSITIONS, JF(positions), 3, 2147483648.0},
};
#undef JF
#define NLINE_KEYS (sizeof line_keys / sizeof line_keys[0])

static bool parse_u32(const char *s, double lo, double hi, uint32_t *out)
{
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (*end || s[0] < '0' || s[0] > '9' || v < lo || v > hi)
        return false;
    *out = (uint32_t)v;
    return true;
}

static bool parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (*end || end == s || !(v >= lo && v <= hi))
        return false;
    *out = v;
    return true;
}

/* "FACTOR,LOW,HIGH,CONTEXT" in the job file's ranges. */
static bool parse_llama3(char *s, job_config *j)
{
    char *part[4];
    for (int i = 0; i < 4; i++) {
        part[i] = s;
        s += strcspn(s, ",");
        if ((*s == ',') != (i < 3))
            return false;
        *s++ = '\0';
    }
    j->rope_scaling = JOBCFG_ROPE_LLAMA3;
    return parse_double(part[0], 1, 1e6, &j->rope_factor) && parse_double(part[1], 1e-6, 1e6, &j->rope_low_freq) &&
           parse_double(part[2], 1e-6, 1e6, &j->rope_high_freq) && parse_u32(part[3], 1, 1 << 24, &j->rope_context);
}

/* One "key=value" word of a line into j; false when it is not one. */
static bool parse_word(const char *word, size_t wlen, job_config *j, bool *seen)
{
    const char *eq = memchr(word, '=', wlen);
    if (!eq)
        return false;
    size_t klen = (size_t)(eq - word), vlen = wlen - klen - 1;
    char val[128];
    if (vlen == 0 || vlen >= sizeof val)
        return false;
    memcpy(val, eq + 1, vlen);
    val[vlen] = '\0';
    for (size_t i = 0; i < NLINE_KEYS; i++) {
        const llama_key *lk = &line_keys[i];
        if (strlen(lk->key) != klen || strncmp(lk->key, word, klen) != 0)
            continue;
        if (seen[i])
            return false;
        seen[i] = true;
        void *field = (char *)j + lk->field;
        switch (lk->type) {
        case LK_U32:
        case LK_POSITIONS:
            return parse_u32(val, lk->lo, lk->hi, field);
        case LK_DOUBLE:
            return parse_double(val, lk->lo, lk->hi, field);
        case LK_LLAMA3:
            return parse_llama3(val, j);
        case LK_BOOL:
            if (strcmp(val, "on") && strcmp(val, "off"))
                return false;
            *(bool *)field = strcmp(val, "on") == 0;
            return true;
        }
    }
    return false;
}

static int llama_parse(const char *line, job_config *j, char *err, size_t err_len)
{
    job_config t = *j;
    t.rope_scaling = JOBCFG_ROPE_NONE;
    t.positions = 0;
    bool seen[NLINE_KEYS] = {false}, ok = strncmp(line, "llama ", 6) == 0;
    for (const char *p = line + 5; ok && *p;) {
        p += strspn(p, " ");
        size_t wlen = strcspn(p, " ");
        if (wlen)
            ok = parse_word(p, wlen, &t, seen);
        p += wlen;
    }
    for (size_t i = 0; ok && i < NLINE_KEYS; i++)
        ok = seen[i] || line_keys[i].type == LK_LLAMA3 || line_keys[i].type == LK_POSITIONS;
    const char *key;
    if (!ok || shape_problem(&t, &key) || (t.positions && t.positions <= t.context)) {
        snprintf(err, err_len, "'%s' is not a llama model line gradd can build (llama layers=N heads=N kv_heads=N "
                 "width=N mlp_width=N context=N vocab=N norm_eps=X rope_theta=X [rope_llama3=X,X,X,N] "
                 "tie_embeddings=on|off [positions=N])", line);
        return -1;
    }
    *j = t;
    return 0;
}

/* ---- job files ------------------------------------------------------------------------ */

static int llama_check_job(const job_config *j, char *err, size_t err_len)
{
    const char *key, *why = shape_problem(j, &key);
    if (why)
        return model_job_error(j, "model", key, why, err, err_len);
    if (j->format == JOBCFG_DATA_IDX)
        return model_job_error(j, "data", "format", "idx images train an mlp, not a llama", err, err_len);
    /* Llama 3's scaling keys without that scaling would be ignored. */
    static const char *const scaling[] = {"rope_factor", "rope_low_freq", "rope_high_freq", "rope_context"};
    for (size_t i = 0; j->rope_scaling != JOBCFG_ROPE_LLAMA3 && i < sizeof scaling / sizeof scaling[0]; i++)
        if (jobcfg_line(j, "model", scaling[i]))
            return model_job_error(j, "model", scaling[i], "is for rope_scaling = llama3, and the model has none",
                                   err, err_len);
    return 0;
}

/* The [model] keys only a llama reads: another kind refuses a file that
 * sets one, rather than train a model other than the one the file
 * describes (registry.c). */
int model_llama_keys_refuse(const job_config *j, const model_kind *kind, char *err, size_t err_len)
{
    static const char *const keys[] = {"kv_heads",      "mlp_width",      "rope_theta",   "rope_scaling",
                                       "rope_factor",   "rope_low_freq",  "rope_high_freq", "rope_context",
                                       "norm_eps",      "tie_embeddings"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (jobcfg_line(j, "model", keys[i])) {
            char why[96];
            snprintf(why, sizeof why, "is a llama key; %s has none", kind->a_name);
            return model_job_error(j, "model", keys[i], why, err, err_len);
        }
    return 0;
}

/* model_llama_hf.c: config.json in and out. */
int model_llama_hf_read(const void *config, job_config *j, char *err, size_t err_len);
void *model_llama_hf_config(const model *m);
bool model_llama_hf_ignore(const model *m, const char *name);

const model_kind model_kind_llama = {
    .name = "llama",
    .a_name = "a llama",
    .unit = "tok",
    .units = "tokens",
    .data = MODEL_DATA_TOKENS,
    .packs = true,
    .generates = true,
    .recomputes = true,
    .check_job = llama_check_job,
    .create = llama_create,
    .describe = llama_describe,
    .parse = llama_parse,
    .hf_type = "llama",
    .hf_read = model_llama_hf_read,
    .hf_config = model_llama_hf_config,
    .hf_ignore = model_llama_hf_ignore,
    .lora_targets = llama_lora_targets,
    .lora_default = "q_proj,v_proj",
    .lora_fan_in_fan_out = false,
};
