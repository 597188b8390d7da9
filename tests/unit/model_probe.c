/* model_probe.c — one training step of a gradd model, laid bare, for tests
 * that compare gradd with an independent implementation (a float64 NumPy
 * model, transformers).
 *
 *   model_probe JOB.cfg PARAMS.safetensors BATCH.safetensors OUT.safetensors
 *
 * builds the model JOB.cfg describes on the cpu kernels (fp32), loads every
 * parameter from PARAMS (F32, under the model's own tensor names, which are
 * its export names; a tensor the kind's hf_ignore names may be there too),
 * and with [finetune] method = lora the adapters too (under PEFT's names,
 * lora.h),
 * and runs one micro-batch from BATCH: x, y (n,T) I32, and optionally pos
 * and start (n,T) I32 (model_batch's packed samples; only for a kind that
 * packs).  OUT gets
 *   loss           F64 scalar: the mean cross-entropy over the targets that
 *                  are not ignored (y >= 0), Hugging Face's convention, of
 *                  a training pass: with [finetune] dropout, its masks are
 *                  those of a step whose stream (model.dropout.seed) is
 *                  [train] seed itself, for the first micro-batch
 *   logits         (n,T,V) F32: forward_logits of each token's own sample
 *                  alone (its tokens from start[t] to t), so a packed forward
 *                  that let samples see each other disagrees with them;
 *                  no dropout (as evaluation and sampling)
 *   decode_logits  (n,T,V) F32, without start and where the model decodes:
 *                  decode_step position by position, no dropout
 *   grad.NAME      the gradient of that loss, per tensor that trains: the
 *                  model's, or with LoRA the adapters' (the base is frozen)
 *   step.NAME      the parameters after one AdamW step on that gradient as
 *                  the trainer takes it (train.c): [train] lr (no schedule),
 *                  beta1, beta2, eps, weight_decay on the tensors that decay,
 *                  grad_clip on the global norm, step 1 from zero moments
 * Exit status: 0, or 1 with the reason on stderr. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "jobcfg.h"
#include "kernels.h"
#include "models/lora.h"
#include "models/model.h"

static int fail(const char *what, const char *why)
{
    fprintf(stderr, "model_probe: %s: %s\n", what, why);
    return 1;
}

static int load_job(const char *path, job_config *j)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(path, "cannot open");
    static char buf[1 << 16];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    if (len == sizeof buf)
        return fail(path, "larger than a job file can be here (64 KiB)");
    char err[1024];
    if (jobcfg_load_record(buf, len, path, j, err, sizeof err) != 0 || model_check_job(j, err, sizeof err) != 0)
        return fail(path, err);
    return 0;
}

/* Every tensor of the table (n of them) from f into buf. */
static int load_table(st_file *f, const char *path, const model_tensor *tab, int n, float *buf)
{
    char err[1024];
    for (int i = 0; i < n; i++) {
        const model_tensor *mt = &tab[i];
        uint64_t shape[MODEL_MAX_DIMS];
        for (int d = 0; d < mt->ndim; d++)
            shape[d] = mt->shape[d];
        if (!st_expect(f, mt->name, ST_F32, mt->ndim, shape, err, sizeof err) ||
            st_read(f, mt->name, buf + mt->offset, mt->numel * sizeof(float), err, sizeof err) != 0)
            return fail(path, err);
    }
    return 0;
}

static bool in_table(const model_tensor *tab, int n, const char *name)
{
    for (int t = 0; t < n; t++)
        if (strcmp(tab[t].name, name) == 0)
            return true;
    return false;
}

/* Every tensor of m from PARAMS into params, and with LoRA every adapter
 * into adapters; nothing else may be there. */
static int load_params(const model *m, const char *path, float *params, float *adapters)
{
    char err[1024];
    st_file *f;
    if (st_open(path, &f, err, sizeof err) != 0)
        return fail(path, err);
    const lora *lo = m->lora;
    int rc = load_table(f, path, m->tensors, m->ntensors, params);
    if (!rc && lo)
        rc = load_table(f, path, lo->tensors, lo->ntensors, adapters);
    for (size_t i = 0; i < st_count(f) && !rc; i++) {
        const char *name = st_tensor_at(f, i)->name;
        bool known = (m->kind->hf_ignore && m->kind->hf_ignore(m, name)) || in_table(m->tensors, m->ntensors, name) ||
                     (lo && in_table(lo->tensors, lo->ntensors, name));
        if (!known)
            rc = fail(name, "is not a tensor of the model");
    }
    st_close(f);
    return rc;
}

/* BATCH's x, y and the optional pos, start: (n,T) I32 each. */
static int load_batch(const char *path, uint32_t T, int32_t **arr, uint32_t *n)
{
    static const char *const names[] = {"x", "y", "pos", "start"};
    char err[1024];
    st_file *f;
    if (st_open(path, &f, err, sizeof err) != 0)
        return fail(path, err);
    const st_tensor *x = st_find(f, "x");
    int rc = 0;
    if (!x || x->ndim != 2 || x->shape[1] != T || x->shape[0] == 0) {
        st_close(f);
        return fail(path, "x: expected (n, [model] context) I32");
    }
    *n = (uint32_t)x->shape[0];
    for (int i = 0; i < 4 && !rc; i++) {
        uint64_t shape[2] = {*n, T};
        size_t bytes = (size_t)*n * T * sizeof(int32_t);
        if (i >= 2 && !st_find(f, names[i]))
            continue;
        arr[i] = malloc(bytes);
        if (!arr[i])
            rc = fail(path, "out of memory");
        else if (!st_expect(f, names[i], ST_I32, 2, shape, err, sizeof err) ||
                 st_read(f, names[i], arr[i], bytes, err, sizeof err) != 0)
            rc = fail(path, err);
    }
    st_close(f);
    return rc;
}

/* logits (n,T,V): each token's logits from its own sample alone. */
static int own_logits(model *m, const int32_t *x, const int32_t *start, uint32_t n, uint32_t T, uint32_t V,
                      float *out)
{
    for (uint32_t b = 0; b < n; b++)
        for (uint32_t t = 0; t < T; t++) {
            uint32_t s = start ? (uint32_t)start[b * T + t] : 0;
            if (s > t || m->ops->forward_logits(m, x + b * T + s, 1, t - s + 1, out + ((size_t)b * T + t) * V) != 0)
                return fail("forward_logits", "failed");
        }
    return 0;
}

static int decode_logits(model *m, const int32_t *x, uint32_t n, uint32_t T, uint32_t V, float *out, void **cache)
{
    *cache = aligned_alloc(64, (m->ops->decode_bytes(m, n) + 63) / 64 * 64);
    float *row = malloc((size_t)n * V * sizeof *row);
    int32_t *tok = malloc(n * sizeof *tok);
    int rc = !*cache || !row || !tok || m->ops->decode_start(m, *cache, n) != 0;
    for (uint32_t t = 0; t < T && !rc; t++) {
        for (uint32_t b = 0; b < n; b++)
            tok[b] = x[b * T + t];
        rc = m->ops->decode_step(m, tok, t, row) != 0;
        for (uint32_t b = 0; b < n && !rc; b++)
            memcpy(out + ((size_t)b * T + t) * V, row + (size_t)b * V, V * sizeof(float));
    }
    free(row);
    free(tok);
    return rc ? fail("decode", "failed") : 0;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: model_probe JOB.cfg PARAMS.safetensors BATCH.safetensors OUT.safetensors\n");
        return 1;
    }
    static job_config j;
    char err[1024];
    if (load_job(argv[1], &j))
        return 1;
    const kern_ops *ops = kern_cpu_ops();
    kern_ctx *kc = ops->ctx_create(0, 0, KERN_FP32, NULL);
    model *m;
    if (!kc || model_create(&j, 0, 0, ops, kc, &m, err, sizeof err) != 0)
        return fail(argv[1], kc ? err : "no kernel context");
    /* What trains: the model's table, or with LoRA the adapters' (and then
     * the base has no gradient). */
    const model_tensor *tab = m->lora ? m->lora->tensors : m->tensors;
    int ntab = m->lora ? m->lora->ntensors : m->ntensors;
    size_t P = m->lora ? m->lora->num_params : m->num_params;
    float *base = calloc(m->num_params, sizeof *base), *adapters = m->lora ? calloc(P, sizeof *adapters) : NULL;
    float *params = m->lora ? adapters : base, *grads = calloc(P, sizeof *grads);
    float *mom = calloc(2 * P, sizeof *mom);
    int32_t *arr[4] = {NULL, NULL, NULL, NULL};
    uint32_t n = 0, T = m->ops->units_per_sample(m), V = j.vocab;
    if (!base || !params || !grads || !mom)
        return fail("host", "out of memory");
    if (load_params(m, argv[2], base, adapters) || load_batch(argv[3], T, arr, &n))
        return 1;
    if ((arr[2] || arr[3]) && !m->kind->packs)
        return fail(argv[3], "pos and start are for a kind that packs samples");
    size_t fixed, per;
    m->ops->activation_bytes(m, &fixed, &per);
    void *acts = aligned_alloc(64, (fixed + per * n + 63) / 64 * 64);
    float *logits = malloc((size_t)n * T * V * sizeof *logits), *dec = NULL;
    if (!acts || !logits)
        return fail("host", "out of memory");
    m->params = base;
    if (m->lora) {
        m->lora->params = adapters;
        m->lora->grads = grads;
    } else {
        m->grads = grads;
    }
    m->ops->bind_activations(m, acts, n);

    /* forward and backward at dloss = 1 / (targets that count) */
    model_batch mb = {.x = arr[0], .y = arr[1], .n = n, .pos = arr[2], .start = arr[3]};
    size_t count = 0;
    for (size_t i = 0; i < (size_t)n * T; i++)
        count += arr[1][i] >= 0;
    if (count == 0)
        return fail(argv[3], "every target is ignored");
    m->dropout.on = true;
    m->dropout.seed = j.seed;
    m->dropout.first = 0;
    double loss = m->ops->forward(m, &mb, NULL) / (double)count;
    m->ops->backward(m, &mb, 1.0f / (float)count);
    m->dropout.on = false;

    void *cache = NULL;
    if (own_logits(m, arr[0], arr[3], n, T, V, logits))
        return 1;
    if (!arr[3] && m->ops->decode_step) {
        dec = malloc((size_t)n * T * V * sizeof *dec);
        if (!dec || decode_logits(m, arr[0], n, T, V, dec, &cache))
            return 1;
    }

    /* the optimizer step, as train.c takes it */
    float *stepped = malloc(P * sizeof *stepped);
    kern_segment *segs = malloc((size_t)ntab * sizeof *segs);
    if (!stepped || !segs)
        return fail("host", "out of memory");
    memcpy(stepped, params, P * sizeof *stepped);
    for (int i = 0; i < ntab; i++)
        segs[i] = (kern_segment){tab[i].offset, tab[i].numel, tab[i].decay};
    double sq = 0;
    ops->sumsq(kc, &sq, grads, P);
    double norm = sqrt(sq), scale = j.grad_clip > 0 && norm > j.grad_clip ? j.grad_clip / norm : 1.0;
    ops->adamw_multi(kc, stepped, NULL, grads, mom, mom + P, segs, ntab, (float)j.lr, (float)j.beta1,
                     (float)j.beta2, (float)j.eps, (float)j.weight_decay, (float)scale, 1);

    st_writer *w = st_writer_new();
    if (!w)
        return fail("host", "out of memory");
    uint64_t shape3[3] = {n, T, V};
    st_writer_add(w, "loss", ST_F64, 0, NULL, &loss, sizeof loss, NULL, 0);
    st_writer_add(w, "logits", ST_F32, 3, shape3, logits, (size_t)n * T * V * sizeof(float), NULL, 0);
    if (dec)
        st_writer_add(w, "decode_logits", ST_F32, 3, shape3, dec, (size_t)n * T * V * sizeof(float), NULL, 0);
    char (*names)[sizeof tab->name + 8] = malloc((size_t)ntab * 2 * sizeof *names);
    if (!names)
        return fail("host", "out of memory");
    for (int i = 0; i < ntab; i++) {
        const model_tensor *mt = &tab[i];
        uint64_t shape[MODEL_MAX_DIMS];
        for (int d = 0; d < mt->ndim; d++)
            shape[d] = mt->shape[d];
        snprintf(names[2 * i], sizeof names[0], "grad.%s", mt->name);
        snprintf(names[2 * i + 1], sizeof names[0], "step.%s", mt->name);
        st_writer_add(w, names[2 * i], ST_F32, mt->ndim, shape, grads + mt->offset, mt->numel * sizeof(float), NULL,
                      0);
        st_writer_add(w, names[2 * i + 1], ST_F32, mt->ndim, shape, stepped + mt->offset,
                      mt->numel * sizeof(float), NULL, 0);
    }
    if (st_write_atomic(w, argv[4], err, sizeof err) != 0)
        return fail(argv[4], err);
    st_writer_free(w);
    free(names), free(stepped), free(segs), free(cache), free(dec), free(logits), free(acts);
    for (int i = 0; i < 4; i++)
        free(arr[i]);
    free(base), free(adapters), free(grads), free(mom);
    model_destroy(m);
    ops->ctx_destroy(kc);
    return 0;
}
