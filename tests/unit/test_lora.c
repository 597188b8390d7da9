/* test_lora.c — LoRA's gradients on llama and gpt (lora.h), on the cpu kernels in
 * fp32, by exact identities rather than a second implementation (which
 * tests/python/test_lora_ref.py is).
 *
 * A LoRA layer y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ is the full layer with the merged
 * weight W' = W + s·B·A, and by the chain rule dA = s·Bᵀ·dW' and
 * dB = s·dW'·Aᵀ, where dW' is the full model's gradient at W'.  So the
 * LoRA model on W, run with random nonzero A and B, must give the loss of
 * the full model on W', those adapter gradients, and the same gradient down
 * the residual stream into the embedding (captured at the last RMSNorm
 * backward, whose dinp is what the embedding backward reads).  The two sides
 * round differently (W' is rounded to fp32 once), so they agree to
 * tolerances stated at TOL_*, for every target the kind has, alone, PEFT's
 * default and all together, on grouped-query shapes, tied and untied.
 *
 * Exactly: with B = 0 the LoRA model's loss is the base model's, bitwise,
 * and dA is zero; recompute on and off give bitwise the same loss and
 * adapter gradients; the base is never written and the model has no base
 * gradient buffer.  A base held in 16 bits only (precision bf16) runs, and
 * agrees with the fp32 base to bf16's rounding.  And the model line is the
 * base's.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "jobcfg.h"
#include "kernels.h"
#include "models/lora.h"
#include "models/model.h"

enum { N = 2, T = 8, RANK = 4 };
#define ALPHA 16.0 /* s = alpha / rank = 4: the adapters move the layers as much as W does */

/* Relative to the largest magnitude of the reference tensor (max |got -
 * want| / max |want|); the loss relative to itself. */
#define TOL_GRAD 1e-5
#define TOL_LOSS 1e-6

/* GQA (kv_heads below heads), untied; one key/value head, tied. */
#define SHAPE_GQA "[model]\ntype = llama\nlayers = 2\nheads = 4\nkv_heads = 2\nwidth = 32\nmlp_width = 48\n" \
                  "context = 8\nvocab = 64\n"
#define SHAPE_MQA "[model]\ntype = llama\nlayers = 2\nheads = 4\nkv_heads = 1\nwidth = 32\nmlp_width = 40\n" \
                  "context = 8\nvocab = 64\ntie_embeddings = on\n"
/* gpt: biases, LayerNorm, a learned position table, Conv1D names under
 * "transformer." (hf_prefix). */
#define SHAPE_GPT "[model]\ntype = gpt\nlayers = 2\nheads = 4\nwidth = 32\ncontext = 8\nvocab = 64\n"
#define TAIL "[data]\ntrain = corpus.txt\n[output]\ndir = out\n"

/* ---- the last norm backward's dinp ---------------------------------------------------
 * The residual stream's gradient once every block has added into it: what
 * the embedding's backward reads (with LoRA, nothing reads it).  llama's
 * norms are RMSNorms, gpt's LayerNorms. */

static struct {
    const float *dinp;
    size_t n;
} last_norm;

static void capture_rmsnorm_backward(kern_ctx *k, float *dinp, float *dweight, const float *dout, const float *inp,
                                     const float *weight, const float *rstd, int N_, int C)
{
    kern_cpu_ops()->rmsnorm_backward(k, dinp, dweight, dout, inp, weight, rstd, N_, C);
    last_norm.dinp = dinp;
    last_norm.n = (size_t)N_ * C;
}

static void capture_layernorm_backward(kern_ctx *k, float *dinp, float *dweight, float *dbias, const float *dout,
                                       const float *inp, const float *weight, const float *mean, const float *rstd,
                                       int N_, int C)
{
    kern_cpu_ops()->layernorm_backward(k, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N_, C);
    last_norm.dinp = dinp;
    last_norm.n = (size_t)N_ * C;
}

/* ---- one forward and backward ----------------------------------------------------------- */

typedef struct {
    kern_ops ops;
    kern_ctx *kc;
    model *m;
    void *acts;
    float *params, *grads;  /* the base, and its gradient (full fine-tuning only) */
    uint16_t *p16;          /* a 16-bit base: params rounded, the only copy the model sees */
    float *b32;             /* ... and its norm weights widened (lora.h's base32) */
    float *ad, *adg;        /* the adapters and their gradient (LoRA only) */
    size_t P, AP;
    double loss;
    float *dx;              /* the embedding's input gradient (B,T,C) */
} run;

static void load(const char *text, job_config *j)
{
    char err[512];
    if (jobcfg_load_record(text, strlen(text), "/tmp/job.cfg", j, err, sizeof err) != 0 ||
        model_check_job(j, err, sizeof err) != 0)
        fail_msg("job: %s", err);
}

/* The LoRA job on `shape`: targets empty for the kind's default. */
static void lora_job(const char *shape, const char *targets, job_config *j)
{
    char text[1024];
    snprintf(text, sizeof text, "%s[finetune]\nmethod = lora\nrank = %d\nalpha = %g\n%s%s\n%s", shape, RANK, ALPHA,
             targets[0] ? "targets = " : "", targets, TAIL);
    load(text, j);
}

static void full_job(const char *shape, job_config *j)
{
    char text[1024];
    snprintf(text, sizeof text, "%s%s", shape, TAIL);
    load(text, j);
}

/* A batch with some targets ignored. */
static model_batch batch(int32_t *x, int32_t *y, uint32_t V)
{
    for (uint32_t i = 0; i < N * T; i++) {
        x[i] = (int32_t)((i * 37 + 11) % V);
        y[i] = (int32_t)((i * 53 + 5) % V);
    }
    y[3] = y[T + 5] = -100;
    return (model_batch){.x = x, .y = y, .n = N};
}

/* Build j's model on params (NULL: init_params) and, with LoRA, adapters
 * (NULL: lora_init's), then one forward and backward.  With LoRA and
 * precision bf16 the base is held in 16 bits only, as the trainer holds
 * it.  The model is kept for its tables; run_free ends it. */
static void run_step(run *r, const job_config *j, bool recompute, const float *params, const float *adapters,
                     int fill)
{
    memset(r, 0, sizeof *r);
    r->ops = *kern_cpu_ops();
    r->ops.rmsnorm_backward = capture_rmsnorm_backward;
    r->ops.layernorm_backward = capture_layernorm_backward;
    r->kc = r->ops.ctx_create(2, 0, j->precision == JOBCFG_BF16 ? KERN_BF16 : KERN_FP32, NULL);
    assert_non_null(r->kc);
    char err[512];
    if (model_create(j, 0, 0, &r->ops, r->kc, &r->m, err, sizeof err) != 0)
        fail_msg("model_create: %s", err);
    model *m = r->m;
    m->recompute = recompute;
    r->P = m->num_params;
    r->params = malloc(r->P * sizeof(float));
    assert_non_null(r->params);
    if (params)
        memcpy(r->params, params, r->P * sizeof(float));
    else
        m->ops->init_params(m, r->params, 7);
    m->params = r->params;
    if (m->lora && m->lora->base16) {
        lora *lo = m->lora;
        r->p16 = malloc(r->P * sizeof(uint16_t));
        r->b32 = calloc(lo->n32, sizeof(float));
        assert_true(r->p16 && r->b32);
        r->ops.cast_f32_to_bf16(r->kc, r->p16, r->params, r->P);
        for (int i = 0; i < lo->nkeep; i++)
            r->ops.cast_bf16_to_f32(r->kc, r->b32 + lo->keep_at[i], r->p16 + lo->keep_off[i], lo->keep_n[i]);
        lo->base32 = r->b32;
        m->params16 = r->p16;
        m->params = NULL;
    }
    if (m->lora) {
        r->AP = m->lora->num_params;
        r->ad = calloc(r->AP, sizeof(float));
        r->adg = calloc(r->AP, sizeof(float));
        assert_true(r->ad && r->adg);
        if (adapters)
            memcpy(r->ad, adapters, r->AP * sizeof(float));
        else
            lora_init(m, r->ad, 11);
        m->lora->params = r->ad;
        m->lora->grads = r->adg;
    } else {
        r->grads = calloc(r->P, sizeof(float));
        assert_non_null(r->grads);
        m->grads = r->grads;
    }

    size_t fixed, per;
    m->ops->activation_bytes(m, &fixed, &per);
    size_t bytes = (fixed + per * N + 63) / 64 * 64;
    r->acts = aligned_alloc(64, bytes);
    assert_non_null(r->acts);
    memset(r->acts, fill, bytes);
    m->ops->bind_activations(m, r->acts, N);

    int32_t x[N * T], y[N * T];
    model_batch b = batch(x, y, j->vocab);
    size_t count = 0;
    for (size_t i = 0; i < N * T; i++)
        count += y[i] >= 0;
    last_norm.dinp = NULL;
    if (m->ops->forward_backward) {
        r->loss = m->ops->forward_backward(m, &b, 1.0f / (float)count) / (double)count;
    } else {
        r->loss = m->ops->forward(m, &b, NULL) / (double)count;
        m->ops->backward(m, &b, 1.0f / (float)count);
    }
    assert_false(m->stopped);
    assert_int_equal(r->ops.sync(r->kc), KERN_OK);
    assert_non_null(last_norm.dinp);
    assert_int_equal(last_norm.n, (size_t)N * T * j->width);
    r->dx = malloc(last_norm.n * sizeof(float));
    assert_non_null(r->dx);
    memcpy(r->dx, last_norm.dinp, last_norm.n * sizeof(float));
}

static void run_free(run *r)
{
    model_destroy(r->m);
    r->ops.ctx_destroy(r->kc);
    free(r->acts), free(r->params), free(r->grads), free(r->ad), free(r->adg), free(r->dx), free(r->p16), free(r->b32);
}

/* A site's base weight: the tensor at its offset, whose name is the
 * site's module less the kind's hf_prefix, and whose shape is the site's. */
static const model_tensor *site_weight(const model *m, const lora_site_t *s)
{
    const char *pre = m->kind->hf_prefix;
    const char *mod = pre && !strncmp(s->module, pre, strlen(pre)) ? s->module + strlen(pre) : s->module;
    char name[128];
    snprintf(name, sizeof name, "%s.weight", mod);
    for (int i = 0; i < m->ntensors; i++)
        if (m->tensors[i].offset == s->w) {
            assert_string_equal(m->tensors[i].name, name);
            assert_int_equal(m->tensors[i].shape[0], (size_t)s->out);
            assert_int_equal(m->tensors[i].shape[1], (size_t)s->in);
            return &m->tensors[i];
        }
    fail_msg("no tensor at %s's offset", s->module);
    return NULL;
}

/* max |got - want| / max |want|; want must not be all zeros. */
static double rel_err(const float *got, const double *want, size_t n)
{
    double err = 0, top = 0;
    for (size_t i = 0; i < n; i++) {
        err = fmax(err, fabs((double)got[i] - want[i]));
        top = fmax(top, fabs(want[i]));
    }
    assert_true(top > 0);
    return err / top;
}

/* Adapters with every entry nonzero: A ~ 0.1·N(0,1), B ~ 0.05·N(0,1). */
static void random_adapters(const model *m, float *ad, uint64_t seed)
{
    const lora *lo = m->lora;
    for (int i = 0; i < lo->nsites; i++) {
        const lora_site_t *s = &lo->site[i];
        for (size_t k = 0; k < (size_t)lo->rank * s->in; k++)
            ad[s->a + k] = 0.1f * model_rand_normal(seed, s->a + k);
        for (size_t k = 0; k < (size_t)s->out * lo->rank; k++)
            ad[s->b + k] = 0.05f * model_rand_normal(seed, s->b + k);
    }
}

/* ---- B = 0: the base model ------------------------------------------------------------- */

static void test_zero_b(void **state)
{
    (void)state;
    static job_config jl, jf;
    lora_job(SHAPE_GQA, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", &jl);
    full_job(SHAPE_GQA, &jf);
    run l, f;
    run_step(&f, &jf, false, NULL, NULL, 0);
    run_step(&l, &jl, false, f.params, NULL, 0);
    assert_int_equal(l.P, f.P);
    assert_memory_equal(&l.loss, &f.loss, sizeof l.loss);
    for (size_t i = 0; i < (size_t)N * T * jf.width; i++)
        assert_true(l.dx[i] == f.dx[i]);
    /* lora_init: B zero, A within PEFT's ±1/√in and not zero; then
     * dA = s·Bᵀ·dW' is zero, and dB = s·dW'·Aᵀ is not */
    const lora *lo = l.m->lora;
    size_t nb = 0, na = 0;
    for (int i = 0; i < lo->nsites; i++) {
        const lora_site_t *s = &lo->site[i];
        for (size_t k = 0; k < (size_t)lo->rank * s->in; k++) {
            assert_true(fabsf(l.ad[s->a + k]) <= 1.0f / sqrtf((float)s->in));
            na += l.ad[s->a + k] != 0.0f;
            assert_true(l.adg[s->a + k] == 0.0f);
        }
        for (size_t k = 0; k < (size_t)s->out * lo->rank; k++) {
            assert_true(l.ad[s->b + k] == 0.0f);
            nb += l.adg[s->b + k] != 0.0f;
        }
    }
    assert_true(na > l.AP / 4);
    assert_true(nb > l.AP / 4);
    run_free(&l);
    run_free(&f);
}

/* ---- the merged model --------------------------------------------------------------------- */

/* The LoRA model against the full one on W + s·B·A, for one shape and
 * targets; the worst relative errors seen into *worst (loss, dA, dB, dx). */
static void check_merged(const char *shape, const char *targets, int sites_per_layer, double worst[4])
{
    static job_config jl, jf;
    lora_job(shape, targets, &jl);
    full_job(shape, &jf);
    run l, f;
    run_step(&l, &jl, false, NULL, NULL, 0);
    const model *m = l.m;
    const lora *lo = m->lora;
    assert_non_null(lo);
    assert_null(m->grads);
    assert_int_equal(lo->nsites, (int)jl.layers * sites_per_layer);
    assert_true(lo->scale == (float)(ALPHA / RANK));
    /* random nonzero adapters, then again from the same base */
    float *ad = malloc(l.AP * sizeof(float)), *base = malloc(l.P * sizeof(float));
    assert_true(ad && base);
    random_adapters(m, ad, 99);
    memcpy(base, l.params, l.P * sizeof(float));
    run_free(&l);
    run_step(&l, &jl, false, base, ad, 0);
    m = l.m;
    lo = m->lora;
    assert_memory_equal(l.params, base, l.P * sizeof(float)); /* the base is never written */
    assert_memory_equal(l.ad, ad, l.AP * sizeof(float));
    assert_null(m->grads);

    /* W' = W + s·B·A at every site */
    float *merged = malloc(l.P * sizeof(float));
    assert_non_null(merged);
    memcpy(merged, base, l.P * sizeof(float));
    for (int i = 0; i < lo->nsites; i++) {
        const lora_site_t *s = &lo->site[i];
        const model_tensor *w = site_weight(m, s);
        for (int o = 0; o < s->out; o++)
            for (int c = 0; c < s->in; c++) {
                double sum = 0;
                for (uint32_t k = 0; k < lo->rank; k++)
                    sum += (double)ad[s->b + (size_t)o * lo->rank + k] * ad[s->a + (size_t)k * s->in + c];
                merged[w->offset + (size_t)o * s->in + c] =
                    (float)(base[w->offset + (size_t)o * s->in + c] + lo->scale * sum);
            }
    }
    run_step(&f, &jf, false, merged, NULL, 0);

    double e = fabs(l.loss - f.loss) / fabs(f.loss);
    worst[0] = fmax(worst[0], e);
    assert_true(e <= TOL_LOSS);
    for (int i = 0; i < lo->nsites; i++) {
        const lora_site_t *s = &lo->site[i];
        const float *dw = f.grads + site_weight(m, s)->offset; /* dW' (out,in) */
        size_t r = lo->rank, na = r * s->in, nb = (size_t)s->out * r;
        double *want = malloc((na > nb ? na : nb) * sizeof(double));
        assert_non_null(want);
        for (size_t k = 0; k < r; k++) /* dA (r,in) = s·Bᵀ·dW' */
            for (int c = 0; c < s->in; c++) {
                double sum = 0;
                for (int o = 0; o < s->out; o++)
                    sum += (double)ad[s->b + (size_t)o * r + k] * dw[(size_t)o * s->in + c];
                want[k * s->in + c] = lo->scale * sum;
            }
        e = rel_err(l.adg + s->a, want, na);
        worst[1] = fmax(worst[1], e);
        if (e > TOL_GRAD)
            fail_msg("%s: dA off by %.3g of its largest", s->module, e);
        for (int o = 0; o < s->out; o++) /* dB (out,r) = s·dW'·Aᵀ */
            for (size_t k = 0; k < r; k++) {
                double sum = 0;
                for (int c = 0; c < s->in; c++)
                    sum += (double)dw[(size_t)o * s->in + c] * ad[s->a + k * s->in + c];
                want[(size_t)o * r + k] = lo->scale * sum;
            }
        e = rel_err(l.adg + s->b, want, nb);
        worst[2] = fmax(worst[2], e);
        if (e > TOL_GRAD)
            fail_msg("%s: dB off by %.3g of its largest", s->module, e);
        free(want);
    }
    size_t nx = (size_t)N * T * jf.width;
    double *want = malloc(nx * sizeof(double));
    assert_non_null(want);
    for (size_t i = 0; i < nx; i++)
        want[i] = f.dx[i];
    e = rel_err(l.dx, want, nx);
    worst[3] = fmax(worst[3], e);
    if (e > TOL_GRAD)
        fail_msg("the embedding's gradient off by %.3g of its largest", e);
    free(want), free(merged), free(ad), free(base);
    run_free(&l);
    run_free(&f);
}

static const struct {
    const char *targets;
    int per_layer;
} combos[] = {
    {"q_proj", 1},    {"k_proj", 1},  {"v_proj", 1},    {"o_proj", 1},
    {"gate_proj", 1}, {"up_proj", 1}, {"down_proj", 1}, {"", 2}, /* PEFT's default: q_proj, v_proj */
    {"down_proj,up_proj,o_proj,v_proj,gate_proj,k_proj,q_proj", 7},
};

/* gpt's: PEFT's "c_proj" is both projections of a block. */
static const struct {
    const char *targets;
    int per_layer;
} gpt_combos[] = {
    {"c_attn", 1}, {"c_proj", 2}, {"c_fc", 1}, {"", 1}, /* PEFT's default: c_attn */
    {"c_fc,c_proj,c_attn", 4},
};

static void test_merged(void **state)
{
    (void)state;
    double worst[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < sizeof combos / sizeof combos[0]; i++) {
        check_merged(SHAPE_GQA, combos[i].targets, combos[i].per_layer, worst);
        check_merged(SHAPE_MQA, combos[i].targets, combos[i].per_layer, worst);
    }
    for (size_t i = 0; i < sizeof gpt_combos / sizeof gpt_combos[0]; i++)
        check_merged(SHAPE_GPT, gpt_combos[i].targets, gpt_combos[i].per_layer, worst);
    print_message("worst relative errors: loss %.3g, dA %.3g, dB %.3g, embedding gradient %.3g\n", worst[0],
                  worst[1], worst[2], worst[3]);
}

/* ---- recompute --------------------------------------------------------------------------- */

static void recompute_same(const char *shape, const char *targets, int precision)
{
    static job_config j;
    lora_job(shape, targets, &j);
    j.precision = precision;
    run off, on;
    run_step(&off, &j, false, NULL, NULL, 0x00);
    float *ad = malloc(off.AP * sizeof(float));
    assert_non_null(ad);
    random_adapters(off.m, ad, 5);
    float *base = malloc(off.P * sizeof(float));
    assert_non_null(base);
    memcpy(base, off.params, off.P * sizeof(float));
    run_free(&off);
    run_step(&off, &j, false, base, ad, 0x00);
    run_step(&on, &j, true, base, ad, 0x7f);
    assert_memory_equal(&off.loss, &on.loss, sizeof off.loss);
    assert_memory_equal(off.adg, on.adg, off.AP * sizeof(float));
    size_t nonzero = 0;
    for (size_t i = 0; i < off.AP; i++)
        nonzero += off.adg[i] != 0.0f;
    assert_true(nonzero > off.AP / 2);
    assert_memory_equal(on.params, base, on.P * sizeof(float));
    free(ad), free(base);
    run_free(&off);
    run_free(&on);
}

/* On an fp32 base and on a 16-bit one. */
static void test_recompute(void **state)
{
    (void)state;
    static const char *const all = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
    recompute_same(SHAPE_GQA, all, JOBCFG_FP32);
    recompute_same(SHAPE_GQA, all, JOBCFG_BF16);
    recompute_same(SHAPE_GPT, "c_attn,c_proj,c_fc", JOBCFG_FP32);
    recompute_same(SHAPE_GPT, "c_attn,c_proj,c_fc", JOBCFG_BF16);
}

/* ---- a 16-bit base ------------------------------------------------------------------------- */

/* With precision bf16 the base is params16 alone: the model reads its token
 * table from there, its norm weights from base32 and its GEMMs' weights in
 * 16 bits, with the GEMMs' inputs rounded to bf16.  Against the fp32 base
 * on the same weights (bf16 values, so that only the inputs' rounding
 * differs), the loss and the adapters' gradients agree to bf16's
 * precision: TOL_BF16. */
#define TOL_BF16 2e-2

static void base16_near(const char *shape, const char *targets)
{
    static job_config j32, j16;
    lora_job(shape, targets, &j32);
    lora_job(shape, targets, &j16);
    j16.precision = JOBCFG_BF16;
    run a, b;
    run_step(&a, &j32, false, NULL, NULL, 0);
    float *base = malloc(a.P * sizeof(float)), *ad = malloc(a.AP * sizeof(float));
    uint16_t *h = malloc(a.P * sizeof(uint16_t));
    assert_true(base && ad && h);
    a.ops.cast_f32_to_bf16(a.kc, h, a.params, a.P);
    a.ops.cast_bf16_to_f32(a.kc, base, h, a.P);
    random_adapters(a.m, ad, 3);
    run_free(&a);
    run_step(&a, &j32, false, base, ad, 0);
    run_step(&b, &j16, false, base, ad, 0);
    assert_true(b.m->lora->base16);
    assert_null(b.m->params);
    assert_null(b.m->grads);
    assert_memory_equal(b.p16, h, b.P * sizeof(uint16_t)); /* the base is never written */

    double e = fabs(a.loss - b.loss) / a.loss, ea, eb = 0;
    assert_true(e < TOL_BF16);
    double *want = malloc(a.AP * sizeof(double));
    assert_non_null(want);
    for (size_t i = 0; i < a.AP; i++)
        want[i] = a.adg[i];
    ea = rel_err(b.adg, want, a.AP);
    assert_true(ea < TOL_BF16);
    /* Off from fp32, by rounding: the 16-bit path ran. */
    for (size_t i = 0; i < a.AP; i++)
        eb += b.adg[i] != a.adg[i];
    assert_true(eb > 0);
    print_message("bf16 base against fp32: loss %.3g, adapters' gradients %.3g (relative)\n", e, ea);
    free(want), free(base), free(ad), free(h);
    run_free(&a);
    run_free(&b);
}

static void test_base16(void **state)
{
    (void)state;
    base16_near(SHAPE_GQA, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
    base16_near(SHAPE_GPT, "c_attn,c_proj,c_fc"); /* biases, norms and wpe through base32 */
}

/* ---- the describe line ---------------------------------------------------------------------- */

/* The model line is the layout of the parameters, the same with adapters
 * (the checkpoint's "lora" line tells those apart): a merged export reads
 * back as the base model, and the line still parses.  lora_describe names
 * the adapters in the kind's order. */
static void test_describe(void **state)
{
    (void)state;
    static job_config j, jf, back;
    lora_job(SHAPE_GQA, "v_proj,down_proj", &j);
    full_job(SHAPE_GQA, &jf);
    model *m, *mf;
    char err[512], line[256], plain[256], lo[256];
    assert_int_equal(model_create(&j, 0, 0, kern_cpu_ops(), NULL, &m, err, sizeof err), 0);
    assert_int_equal(model_create(&jf, 0, 0, kern_cpu_ops(), NULL, &mf, err, sizeof err), 0);
    model_describe(m, line, sizeof line);
    model_describe(mf, plain, sizeof plain);
    assert_string_equal(line, plain);
    jobcfg_defaults(&back);
    if (model_parse_line(line, &back, err, sizeof err) != 0)
        fail_msg("%s: %s", line, err);
    assert_int_equal(back.ft_method, JOBCFG_FT_FULL);
    lora_describe(m, lo, sizeof lo);
    assert_string_equal(lo, "lora r=4 alpha=16 targets=v_proj,down_proj");
    model_destroy(mf);
    model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zero_b),
        cmocka_unit_test(test_merged),
        cmocka_unit_test(test_recompute),
        cmocka_unit_test(test_base16),
        cmocka_unit_test(test_describe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
