/* lora.c — low-rank adapters on a frozen base (lora.h): the job's settings,
 * the sites and the adapters' table, the GEMMs of the base with the
 * adapters added, their starting values, merging, and PEFT's config.
 *
 * Per site, forward: u = s·(x·Aᵀ) (N,r), then x·Wᵀ's columns += u·Bᵀ.
 * Backward recomputes u rather than keeping it (N·r floats a site, for a
 * GEMM of N·in·r: cheaper than the activation bookkeeping, and the same
 * with or without recompute), then g = s·(d·B), dB += dᵀ·u, dA += gᵀ·x
 * and dx += g·A.  The scale is applied to u rather than to u·Bᵀ (as PEFT
 * scales the product): the same value to rounding.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "lora.h"

#define ALIGN 64

static size_t round_up(size_t bytes)
{
    return (bytes + ALIGN - 1) / ALIGN * ALIGN;
}

/* ---- the job's settings ------------------------------------------------------------ */

static int target_index(const model_kind *kd, const char *name, size_t len)
{
    for (int t = 0; kd->lora_targets[t]; t++)
        if (strlen(kd->lora_targets[t]) == len && !strncmp(kd->lora_targets[t], name, len))
            return t;
    return -1;
}

int lora_parse_targets(const model_kind *kd, const char *list, unsigned *bits, char *why, size_t why_len)
{
    *bits = 0;
    if (!list[0])
        list = kd->lora_default;
    for (const char *s = list; *s;) {
        size_t n = strcspn(s, ","), wn = n;
        const char *w = s;
        while (wn && (*w == ' ' || *w == '\t'))
            w++, wn--;
        while (wn && (w[wn - 1] == ' ' || w[wn - 1] == '\t'))
            wn--;
        int t = target_index(kd, w, wn);
        if (t < 0 || t >= 32) {
            char known[256];
            size_t at = 0;
            known[0] = '\0';
            for (int i = 0; kd->lora_targets[i] && at < sizeof known; i++)
                at += (size_t)snprintf(known + at, sizeof known - at, "%s%s", i ? ", " : "", kd->lora_targets[i]);
            snprintf(why, why_len, "'%.*s' is not one of %s", (int)(wn < 64 ? wn : 64), w, known);
            return -1;
        }
        if (*bits & 1u << t) {
            snprintf(why, why_len, "'%.*s' is named twice", (int)wn, w);
            return -1;
        }
        *bits |= 1u << t;
        s += n;
        if (*s == ',')
            s++;
    }
    return 0;
}

int lora_create(model *m, const job_config *j, char *err, size_t err_len)
{
    if (j->ft_method != JOBCFG_FT_LORA)
        return 0;
    const model_kind *kd = m->kind;
    if (!kd || !kd->lora_targets)
        return model_job_error(j, "finetune", "method", "this model kind offers no LoRA", err, err_len);
    lora *l = calloc(1, sizeof *l);
    if (!l) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    l->rank = j->lora_rank;
    l->alpha = (float)j->lora_alpha;
    l->scale = (float)(j->lora_alpha / j->lora_rank);
    l->dropout = j->lora_dropout;
    l->base16 = j->precision != JOBCFG_FP32;
    l->bf16 = j->precision == JOBCFG_BF16;
    char why[512];
    if (lora_parse_targets(kd, j->lora_targets, &l->targets, why, sizeof why) != 0) {
        free(l);
        return model_job_error(j, "finetune", "targets", why, err, err_len);
    }
    m->lora = l;
    return 0;
}

/* The base tensor called `module`.weight: the model's own name, or that
 * name less the kind's hf_prefix (gpt's tensors lack "transformer."). */
static const model_tensor *base_weight(const model *m, const char *module)
{
    char want[128];
    const char *pre = m->kind->hf_prefix;
    size_t np = pre ? strlen(pre) : 0;
    for (int pass = 0; pass < 2; pass++) {
        const char *mod = module;
        if (pass == 1) {
            if (!np || strncmp(module, pre, np) != 0)
                break;
            mod = module + np;
        }
        snprintf(want, sizeof want, "%s.weight", mod);
        for (int i = 0; i < m->ntensors; i++)
            if (!strcmp(m->tensors[i].name, want))
                return &m->tensors[i];
    }
    return NULL;
}

int lora_site(model *m, const char *module, const char *target, int in, int out, int ld, int col)
{
    lora *l = m->lora;
    if (!l)
        return -1;
    int t = target_index(m->kind, target, strlen(target));
    if (t < 0 || !(l->targets & 1u << t))
        return -1;
    if (l->nsites >= LORA_MAX_SITES) {
        l->nsites = LORA_MAX_SITES + 1; /* lora_finish refuses the model */
        return -1;
    }
    lora_site_t *s = &l->site[l->nsites];
    memset(s, 0, sizeof *s);
    snprintf(s->module, sizeof s->module, "%s", module);
    s->target = t;
    s->in = in;
    s->out = out;
    s->ld = ld;
    s->col = col;
    s->key = 0xcbf29ce484222325ull;
    for (const char *c = s->module; *c; c++)
        s->key = (s->key ^ (unsigned char)*c) * 0x100000001b3ull;
    const model_tensor *w = base_weight(m, module);
    s->w = w ? w->offset : (size_t)-1;
    return l->nsites++;
}

void lora_keep32(model *m, size_t offset, size_t numel)
{
    lora *l = m->lora;
    if (!l)
        return;
    if (l->nkeep >= LORA_MAX_KEEP32) {
        l->nkeep = LORA_MAX_KEEP32 + 1;
        return;
    }
    l->keep_off[l->nkeep] = offset;
    l->keep_at[l->nkeep] = l->n32;
    l->keep_n[l->nkeep] = numel;
    l->n32 += (numel + 15) / 16 * 16; /* each widened tensor starts 64-byte aligned */
    l->nkeep++;
}

int lora_finish(model *m, char *err, size_t err_len)
{
    lora *l = m->lora;
    if (!l)
        return 0;
    if (l->nsites > LORA_MAX_SITES || l->nkeep > LORA_MAX_KEEP32) {
        snprintf(err, err_len, "[finetune] targets: more than %d layers with adapters", LORA_MAX_SITES);
        return -1;
    }
    unsigned seen = 0;
    size_t off = 0;
    for (int i = 0; i < l->nsites; i++) {
        lora_site_t *s = &l->site[i];
        const char *name = m->kind->lora_targets[s->target];
        if (s->w == (size_t)-1) {
            snprintf(err, err_len, "LoRA: %s has no weight %s.weight", m->kind->a_name, s->module);
            return -1;
        }
        if (l->rank > (uint32_t)(s->in < s->out ? s->in : s->out)) {
            snprintf(err, err_len, "[finetune] rank: %u is above %s's smaller side (%d × %d)", l->rank, name, s->out,
                     s->in);
            return -1;
        }
        seen |= 1u << s->target;
        const char *ab[2] = {"lora_A", "lora_B"};
        size_t shape[2][2] = {{l->rank, (size_t)s->in}, {(size_t)s->out, l->rank}};
        for (int k = 0; k < 2; k++) {
            model_tensor *t = &l->tensors[l->ntensors++];
            memset(t, 0, sizeof *t);
            snprintf(t->name, sizeof t->name, "base_model.model.%s.%s.weight", s->module, ab[k]);
            t->offset = off;
            t->ndim = 2;
            t->shape[0] = shape[k][0];
            t->shape[1] = shape[k][1];
            t->numel = shape[k][0] * shape[k][1];
            t->decay = true;
            off += t->numel;
            if (k == 0)
                s->a = t->offset;
            else
                s->b = t->offset;
        }
    }
    l->num_params = off;
    unsigned missing = l->targets & ~seen;
    for (int t = 0; missing && m->kind->lora_targets[t]; t++)
        if (missing & 1u << t) {
            snprintf(err, err_len, "[finetune] targets: %s has no %s layer", m->kind->a_name,
                     m->kind->lora_targets[t]);
            return -1;
        }
    return 0;
}

void lora_destroy(model *m)
{
    free(m->lora);
    m->lora = NULL;
}

const float *lora_base32(const model *m, size_t off)
{
    const lora *l = m->lora;
    if (!l || !l->base32)
        return m->params + off;
    for (int i = 0; i < l->nkeep; i++)
        if (off >= l->keep_off[i] && off < l->keep_off[i] + l->keep_n[i])
            return l->base32 + l->keep_at[i] + (off - l->keep_off[i]);
    return NULL; /* a tensor the model did not keep: its kernels would fault, loudly */
}

/* ---- scratch ---------------------------------------------------------------------------- */

static void widest(const lora *l, size_t *in, size_t *both)
{
    size_t mi = 0, mb = 0;
    for (int i = 0; i < l->nsites; i++) {
        const lora_site_t *s = &l->site[i];
        mi = (size_t)s->in > mi ? (size_t)s->in : mi;
        mb = (size_t)s->in > mb ? (size_t)s->in : mb;
        mb = (size_t)s->out > mb ? (size_t)s->out : mb;
    }
    *in = mi;
    *both = mb;
}

/* The widest GEMM input of the base, for a 16-bit base's cast of it: every
 * 2-D tensor's second dimension bounds it. */
static size_t widest_base_in(const model *m)
{
    size_t w = 0;
    for (int i = 0; i < m->ntensors; i++)
        if (m->tensors[i].ndim == 2 && m->tensors[i].shape[1] > w)
            w = m->tensors[i].shape[1];
    return w;
}

static size_t carve(const model *m, char *base, size_t rows)
{
    lora *l = m->lora;
    size_t in, both, off = 0;
    widest(l, &in, &both);
    float *p[3];
    size_t n[3] = {rows * l->rank, rows * l->rank, rows * both};
    for (int i = 0; i < 3; i++) {
        p[i] = base ? (float *)(base + off) : NULL;
        off += round_up(n[i] * sizeof(float));
    }
    uint16_t *x16 = NULL;
    if (l->base16) {
        x16 = base ? (uint16_t *)(base + off) : NULL;
        off += round_up(rows * widest_base_in(m) * sizeof(uint16_t));
    }
    float *xd = NULL;
    if (l->dropout > 0) {
        xd = base ? (float *)(base + off) : NULL;
        off += round_up(rows * in * sizeof(float));
    }
    if (base) {
        l->u = p[0];
        l->g = p[1];
        l->t = p[2];
        l->x16 = x16;
        l->xd = xd;
        l->rows = rows;
    }
    return off;
}

size_t lora_scratch_bytes(const model *m, size_t rows)
{
    return m->lora ? carve(m, NULL, rows) : 0;
}

void lora_bind(model *m, void *mem, size_t rows)
{
    if (m->lora)
        carve(m, mem, rows);
}

/* ---- the GEMMs --------------------------------------------------------------------------- */

/* out = inp (N rows of site s's input width) through the site's dropout
 * mask for this micro-batch (lora.h).  Packed rows hold several samples:
 * their elements' numbers still never overlap within a step, rows being
 * no more than samples.  out may be inp. */
static void site_mask(model *m, int site, float *out, const float *inp, int N)
{
    const lora *l = m->lora;
    const lora_site_t *s = &l->site[site];
    uint64_t T = m->ops->units_per_sample(m);
    m->k->dropout(m->kc, out, inp, (size_t)N * s->in, (float)l->dropout, model_rand_u64(m->dropout.seed, s->key),
                  m->dropout.first * T * (uint64_t)s->in);
}

/* Whether this pass drops the adapters' inputs. */
static bool dropping(const model *m)
{
    return m->lora->dropout > 0 && m->dropout.on;
}

/* What site s's adapters read of the GEMM input inp: inp itself, or when
 * dropping its masked copy in xd. */
static const float *site_input(model *m, int site, const float *inp, int N)
{
    if (!dropping(m))
        return inp;
    site_mask(m, site, m->lora->xd, inp, N);
    return m->lora->xd;
}

/* u (N,r) = s·(x·Aᵀ): what the forward multiplies by Bᵀ, and the backward
 * recomputes. */
static void site_u(model *m, const lora_site_t *s, const float *inp, int N)
{
    lora *l = m->lora;
    m->k->matmul_forward(m->kc, l->u, inp, l->params + s->a, NULL, N, s->in, (int)l->rank);
    m->k->scale(m->kc, l->u, (size_t)N * l->rank, l->scale);
}

void lora_linear_forward(model *m, float *out, const float *inp, size_t w, size_t b, const int *sites, int n, int N,
                         int C, int OC)
{
    const kern_ops *k = m->k;
    kern_ctx *kc = m->kc;
    lora *l = m->lora;
    const float *bias = b == LORA_NO_BIAS ? NULL : lora_base32(m, b);
    if (l && l->base16) {
        if (l->bf16)
            k->cast_f32_to_bf16(kc, l->x16, inp, (size_t)N * C);
        else
            k->cast_f32_to_f16(kc, l->x16, inp, (size_t)N * C);
        k->matmul_forward16(kc, out, l->x16, m->params16 + w, bias, N, C, OC);
    } else {
        k->matmul_forward(kc, out, inp, m->params + w, bias, N, C, OC);
    }
    if (!l)
        return;
    int r = (int)l->rank;
    for (int i = 0; i < n; i++) {
        if (sites[i] < 0)
            continue;
        const lora_site_t *s = &l->site[sites[i]];
        site_u(m, s, site_input(m, sites[i], inp, N), N);
        k->matmul_forward(kc, l->t, l->u, l->params + s->b, NULL, N, r, s->out);
        if (s->ld == s->out && s->col == 0)
            k->accumulate(kc, out, l->t, (size_t)N * s->out);
        else
            k->copy2d(kc, out + s->col, s->ld, l->t, s->out, N, s->out, true);
    }
}

void lora_linear_backward(model *m, float *dinp, const float *dout, const float *inp, size_t w, size_t b,
                          const int *sites, int n, int N, int C, int OC)
{
    const kern_ops *k = m->k;
    kern_ctx *kc = m->kc;
    lora *l = m->lora;
    if (!l)
        k->matmul_backward(kc, dinp, m->grads + w, b == LORA_NO_BIAS ? NULL : m->grads + b, dout, inp, m->params + w,
                           N, C, OC);
    else if (dinp && l->base16)
        k->matmul_backward16(kc, dinp, NULL, NULL, NULL, dout, NULL, NULL, m->params16 + w, N, C, OC);
    else if (dinp)
        k->matmul_backward(kc, dinp, NULL, NULL, dout, inp, m->params + w, N, C, OC);
    if (!l)
        return;
    int r = (int)l->rank;
    for (int i = 0; i < n; i++) {
        if (sites[i] < 0)
            continue;
        const lora_site_t *s = &l->site[sites[i]];
        float *dA = l->grads + s->a, *dB = l->grads + s->b;
        const float *x = site_input(m, sites[i], inp, N);
        site_u(m, s, x, N);
        const float *d = dout;
        if (s->ld != s->out || s->col != 0) {
            k->copy2d(kc, l->t, s->out, dout + s->col, s->ld, N, s->out, false);
            d = l->t;
        }
        k->matmul_backward(kc, l->g, dB, NULL, d, l->u, l->params + s->b, N, r, s->out);
        k->scale(kc, l->g, (size_t)N * r, l->scale);
        /* t is free again once g is made from it. */
        k->matmul_backward(kc, dinp ? l->t : NULL, dA, NULL, l->g, x, l->params + s->a, N, s->in, r);
        if (!dinp)
            continue;
        if (dropping(m)) /* dropout's backward is the same mask on the gradient */
            site_mask(m, sites[i], l->t, l->t, N);
        k->accumulate(kc, dinp, l->t, (size_t)N * s->in);
    }
}

/* ---- values ----------------------------------------------------------------------------- */

void lora_init(const model *m, float *adapters, uint64_t seed)
{
    const lora *l = m->lora;
    /* A stream of its own: the base's init draws from `seed` at the
     * tensors' offsets, which the adapters' offsets overlap. */
    uint64_t s2 = seed ^ 0x4c6f524164617074ull;
    for (int i = 0; i < l->nsites; i++) {
        const lora_site_t *s = &l->site[i];
        float bound = 1.0f / sqrtf((float)s->in);
        size_t na = (size_t)l->rank * s->in;
        for (size_t e = 0; e < na; e++) {
            double u = (double)(model_rand_u64(s2, s->a + e) >> 11) * 0x1.0p-53;
            adapters[s->a + e] = (float)((2 * u - 1) * bound);
        }
        memset(adapters + s->b, 0, (size_t)s->out * l->rank * sizeof(float));
    }
}

void lora_merge(const model *m, float *params, const float *adapters)
{
    const lora *l = m->lora;
    uint32_t r = l->rank;
    for (int i = 0; i < l->nsites; i++) {
        const lora_site_t *s = &l->site[i];
        float *W = params + s->w;
        const float *A = adapters + s->a, *B = adapters + s->b;
        for (int o = 0; o < s->out; o++) {
            float *row = W + (size_t)o * s->in;
            for (uint32_t q = 0; q < r; q++) {
                float b = l->scale * B[(size_t)o * r + q];
                const float *a = A + (size_t)q * s->in;
                for (int c = 0; c < s->in; c++)
                    row[c] += b * a[c];
            }
        }
    }
}

static size_t targets_text(const model *m, char *buf, size_t len)
{
    const lora *l = m->lora;
    size_t n = 0;
    buf[0] = '\0';
    for (int t = 0; m->kind->lora_targets[t]; t++)
        if (l->targets & 1u << t)
            n += (size_t)snprintf(buf + n, n < len ? len - n : 0, "%s%s", n ? "," : "", m->kind->lora_targets[t]);
    return n;
}

void lora_describe(const model *m, char *buf, size_t len)
{
    char targets[256];
    targets_text(m, targets, sizeof targets);
    snprintf(buf, len, "lora r=%u alpha=%g targets=%s", m->lora->rank, (double)m->lora->alpha, targets);
}

void *lora_peft_config(const model *m, const char *base)
{
    const lora *l = m->lora;
    json_t *o = json_object(), *targets = json_array();
    if (!o || !targets) {
        json_decref(o);
        json_decref(targets);
        return NULL;
    }
    for (int t = 0; m->kind->lora_targets[t]; t++)
        if (l->targets & 1u << t)
            json_array_append_new(targets, json_string(m->kind->lora_targets[t]));
    double a = l->alpha;
    int bad = 0;
    bad |= json_object_set_new(o, "peft_type", json_string("LORA"));
    bad |= json_object_set_new(o, "task_type", json_string("CAUSAL_LM"));
    bad |= json_object_set_new(o, "base_model_name_or_path", json_string(base ? base : ""));
    bad |= json_object_set_new(o, "r", json_integer(l->rank));
    bad |= json_object_set_new(o, "lora_alpha", a == floor(a) && fabs(a) < 1e15 ? json_integer((json_int_t)a)
                                                                               : json_real(a));
    bad |= json_object_set_new(o, "lora_dropout", json_real(l->dropout));
    bad |= json_object_set_new(o, "target_modules", targets);
    bad |= json_object_set_new(o, "bias", json_string("none"));
    bad |= json_object_set_new(o, "fan_in_fan_out", json_boolean(m->kind->lora_fan_in_fan_out));
    bad |= json_object_set_new(o, "modules_to_save", json_null());
    bad |= json_object_set_new(o, "init_lora_weights", json_true());
    bad |= json_object_set_new(o, "inference_mode", json_true());
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}
