/* sample.c — loading a GPT's weights for sampling, and generating. */
#include "sample.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fileio.h"
#include "jobcfg.h"
#include "train.h"
#include "kernels.h"
#include "models/model.h"
#include "io/safetensors.h"


struct sample_model {
    const kern_ops *k;
    kern_ctx *kc;
    model *m;
    float *params;
    void *acts;
    void *cache; /* the key/value cache, in acts after the activations; NULL if the model has none */
    uint64_t step;
};

void sample_free(sample_model *s)
{
    if (!s)
        return;
    model_destroy(s->m);
    if (s->kc)
        s->k->ctx_destroy(s->kc);
    free(s->params);
    free(s->acts);
    free(s);
}

/* Sampling one sequence may take at most this much activation memory (the
 * key/value cache included): a metadata line can describe a model whose
 * context × vocabulary is far beyond what its (small) file holds. */
#define SAMPLE_MAX_ACTIVATIONS ((size_t)4 << 30)

/* The file holds tensor t as exported (Conv1D weights transposed)? */
static bool expect_tensor(st_file *f, const model_tensor *t, char *why, size_t why_len)
{
    uint64_t shape[MODEL_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++)
        shape[d] = t->shape[d];
    if (t->transpose_export && t->ndim == 2) {
        shape[0] = t->shape[1];
        shape[1] = t->shape[0];
    }
    return st_expect(f, t->name, ST_F32, t->ndim, shape, why, why_len);
}

/* Every tensor of the model is in the file with its shape: checked before
 * anything the model's size is allocated, so the file's own size bounds it. */
static int check_named(const sample_model *s, st_file *f, char *err, size_t err_len)
{
    for (int i = 0; i < s->m->ntensors; i++)
        if (!expect_tensor(f, &s->m->tensors[i], err, err_len))
            return -1;
    return 0;
}

/* Fill s->params from model.safetensors: tensor by tensor, by name, undoing
 * the Conv1D transpose of the export.  check_named has passed. */
static int load_named(sample_model *s, st_file *f, char *err, size_t err_len)
{
    const model *m = s->m;
    float *tmp = NULL;
    size_t tmp_n = 0;
    int rc = 0;
    for (int i = 0; i < m->ntensors && rc == 0; i++) {
        const model_tensor *t = &m->tensors[i];
        bool tr = t->transpose_export && t->ndim == 2;
        char why[512];
        float *dst = s->params + t->offset;
        if (tr && tmp_n < t->numel) {
            free(tmp);
            tmp = malloc(t->numel * sizeof *tmp);
            tmp_n = tmp ? t->numel : 0;
            if (!tmp) {
                snprintf(err, err_len, "%s: out of memory", st_path(f));
                rc = -1;
                break;
            }
        }
        if (st_read(f, t->name, tr ? tmp : dst, t->numel * sizeof(float), why, sizeof why) != 0) {
            snprintf(err, err_len, "%s", why);
            rc = -1;
            break;
        }
        if (tr) {
            /* File (in,out) = (cols,rows) back to the model's (out,in). */
            size_t rows = t->shape[0], cols = t->shape[1];
            for (size_t a = 0; a < rows; a++)
                for (size_t b = 0; b < cols; b++)
                    dst[a * cols + b] = tmp[b * rows + a];
        }
    }
    free(tmp);
    return rc;
}

int sample_load(const char *path, int threads, sample_model **out, char *err, size_t err_len)
{
    *out = NULL;
    st_file *f;
    char why[1024];
    if (st_open(path, &f, why, sizeof why) != 0) {
        snprintf(err, err_len, "%s", why);
        return -1;
    }
    /* Which of the two files: the checkpoint says so in "format". */
    const char *fmt = st_meta(f, "format");
    bool resume = fmt && strcmp(fmt, TRAIN_RESUME_FORMAT) == 0;
    const char *key = resume ? "model" : "gradd_model";
    const char *sig = st_meta(f, key);
    job_config *jc = malloc(sizeof *jc);
    sample_model *s = calloc(1, sizeof *s);
    int rc = -1;
    if (!jc || !s) {
        snprintf(err, err_len, "%s: out of memory", path);
        goto out;
    }
    /* A LoRA job's checkpoint holds its adapters only; the base it trained
     * them on is [model] from's (or its seed's), which sampling has not. */
    const char *adapters = resume ? st_meta(f, "lora") : NULL;
    if (adapters) {
        snprintf(err, err_len,
                 "%s holds a LoRA job's adapters (%s), not a whole model: sample a job that sets [finetune] "
                 "merged = true, whose model.safetensors (written when it finishes) has the adapters merged into "
                 "the base, or apply its adapter_model.safetensors to the base model with PEFT",
                 path, adapters);
        goto out;
    }
    if (!sig) {
        snprintf(err, err_len,
                 "%s: no '%s' metadata: not written by gradd, and a GPT-2 file does not say how many heads it has",
                 path, key);
        goto out;
    }
    jobcfg_defaults(jc);
    if (model_parse_line(sig, jc, why, sizeof why) != 0) {
        snprintf(err, err_len, "%s: metadata %s: %s", path, key, why);
        goto out;
    }
    const char *step = st_meta(f, "step");
    s->step = step ? strtoull(step, NULL, 10) : 0;
    s->k = kern_cpu_ops();
    s->kc = s->k->ctx_create(threads, 0, KERN_FP32, NULL);
    if (!s->kc || model_create(jc, 0, 0, s->k, s->kc, &s->m, why, sizeof why) != 0) {
        snprintf(err, err_len, "%s: %s", path, s->kc ? why : "cannot create a CPU kernel context");
        goto out;
    }
    if (!s->m->ops->forward_logits) {
        snprintf(err, err_len, "%s: a %s model cannot generate", path, s->m->kind->name);
        goto out;
    }
    size_t P = s->m->num_params, fixed, per;
    s->m->ops->activation_bytes(s->m, &fixed, &per);
    /* The cache goes after the activations, in the same allocation: one
     * buffer, one limit.  Each term is below 2^62 for every shape
     * model_parse_line accepts, so the sums do not wrap. */
    size_t act_bytes = (fixed + per + 63) / 64 * 64;
    size_t cache_bytes = s->m->ops->decode_bytes ? s->m->ops->decode_bytes(s->m, 1) : 0;
    if (resume) {
        uint64_t shape[1] = {P};
        if (!st_expect(f, "params", ST_F32, 1, shape, why, sizeof why)) {
            snprintf(err, err_len, "%s", why);
            goto out;
        }
    } else if (check_named(s, f, err, err_len) != 0) {
        goto out;
    }
    if (act_bytes + cache_bytes > SAMPLE_MAX_ACTIVATIONS) {
        snprintf(err, err_len,
                 "%s: sampling this model (%s) needs %zu MiB of activations and key/value cache, more than the %zu "
                 "MiB allowed",
                 path, sig, (act_bytes + cache_bytes) >> 20, SAMPLE_MAX_ACTIVATIONS >> 20);
        goto out;
    }
    if (posix_memalign(&s->acts, 64, act_bytes + cache_bytes) != 0)
        s->acts = NULL;
    s->params = malloc(P * sizeof(float));
    if (!s->acts || !s->params) {
        snprintf(err, err_len, "%s: out of memory for %zu parameters", path, P);
        goto out;
    }
    if (s->m->ops->bind_activations(s->m, s->acts, 1) != 0) {
        snprintf(err, err_len, "%s: out of memory for the model's host buffers", path);
        goto out;
    }
    if (cache_bytes)
        s->cache = (char *)s->acts + act_bytes;
    s->m->params = s->params;
    if (resume) {
        if (st_read(f, "params", s->params, P * sizeof(float), why, sizeof why) != 0) {
            snprintf(err, err_len, "%s", why);
            goto out;
        }
    } else if (load_named(s, f, err, err_len) != 0) {
        goto out;
    }
    /* NaN or infinite weights (a damaged file, or a run that diverged) give
     * no text worth showing; say so instead. */
    size_t bad = s->k->count_nonfinite(s->kc, s->params, P);
    if (bad) {
        snprintf(err, err_len, "%s: %zu of its %zu parameters are not finite (NaN or infinity): the file is "
                 "damaged or the training diverged", path, bad, P);
        goto out;
    }
    rc = 0;
out:
    st_close(f);
    free(jc);
    if (rc != 0)
        sample_free(s);
    else
        *out = s;
    return rc;
}

int sample_pick_file(const char *out_dir, char *buf, size_t len, char *err, size_t err_len)
{
    static const char *const names[] = {"model.safetensors", "resume.safetensors"};
    int errs[2] = {0, 0};
    for (size_t i = 0; i < 2; i++) {
        snprintf(buf, len, "%s/%s", out_dir, names[i]);
        /* open, not access(2): access checks the real uid, and the caller
         * may have switched only its filesystem identity (access.h).  Not
         * a regular file (a FIFO the owner made) is refused here, naming
         * it, rather than passed over for the other. */
        int fd = fileio_open_regular(buf, O_RDONLY, 0, err, err_len);
        if (fd >= 0) {
            close(fd);
            return 0;
        }
        if (errno == EINVAL)
            return -1;
        errs[i] = errno;
    }
    int i = errs[0] != ENOENT ? 0 : errs[1] != ENOENT ? 1 : -1;
    if (i < 0)
        snprintf(err, err_len, "%s has no model.safetensors (written when the job finishes) and no "
                               "resume.safetensors (written at each checkpoint) yet",
                 out_dir);
    else
        snprintf(err, err_len, "%s/%s: %s", out_dir, names[i], strerror(errs[i]));
    return -1;
}

uint32_t sample_vocab(const sample_model *s) { return (uint32_t)s->m->tensors[0].shape[0]; }
uint32_t sample_context(const sample_model *s) { return (uint32_t)s->m->tensors[1].shape[0]; }
uint64_t sample_step(const sample_model *s) { return s->step; }

void sample_output_free(sample_output *o)
{
    free(o->ids);
    free(o->text);
    memset(o, 0, sizeof *o);
}

/* The next token from logits (V): the argmax at temperature 0, else a draw
 * from softmax(logits / temperature) with the counter-based generator, so a
 * seed fixes the whole sequence on every machine. */
static uint32_t pick(const float *logits, uint32_t V, double temperature, uint64_t seed, uint64_t i, double *p)
{
    uint32_t best = 0;
    for (uint32_t v = 1; v < V; v++)
        if (logits[v] > logits[best])
            best = v;
    if (temperature <= 0)
        return best;
    double sum = 0;
    for (uint32_t v = 0; v < V; v++) {
        p[v] = exp(((double)logits[v] - logits[best]) / temperature);
        sum += p[v];
    }
    double u = (double)(model_rand_u64(seed, i) >> 11) * 0x1.0p-53 * sum, acc = 0;
    for (uint32_t v = 0; v < V; v++) {
        acc += p[v];
        if (u < acc)
            return v;
    }
    return best; /* u rounded up to the sum: the last step of the CDF */
}

int sample_generate(sample_model *s, const sample_opts *o, sample_output *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    uint32_t V = sample_vocab(s), T = sample_context(s);
    if (o->tokens < 1 || o->tokens > SAMPLE_MAX_TOKENS) {
        snprintf(err, err_len, "tokens: %u is not between 1 and %d", o->tokens, SAMPLE_MAX_TOKENS);
        return -1;
    }
    if (!(o->temperature >= 0) || o->temperature > 100) {
        snprintf(err, err_len, "temperature: %g is not between 0 and 100", o->temperature);
        return -1;
    }
    if (o->prompt_len && V != 256) {
        snprintf(err, err_len, "prompt: the model's vocabulary has %u tokens, not the 256 bytes of a text model; "
                               "give the prompt as token ids, or none (it starts from token 0)", V);
        return -1;
    }
    if (o->prompt_len && o->prompt_ids_len) {
        snprintf(err, err_len, "prompt: give it as text or as token ids, not both");
        return -1;
    }
    for (size_t i = 0; i < o->prompt_ids_len; i++)
        if (o->prompt_ids[i] >= V) {
            snprintf(err, err_len, "prompt ids: %u (number %zu) is not below the model's vocabulary of %u",
                     o->prompt_ids[i], i + 1, V);
            return -1;
        }
    /* The window the model sees: the last T tokens of prompt + output.  A
     * byte model with no prompt starts at a line break, as text does. */
    size_t have = o->prompt_len ? o->prompt_len : o->prompt_ids_len ? o->prompt_ids_len : 1;
    size_t cap = have + o->tokens;
    int32_t *seq = malloc(cap * sizeof *seq);
    float *logits = malloc((size_t)V * sizeof *logits);
    double *p = malloc((size_t)V * sizeof *p);
    out->ids = malloc((size_t)o->tokens * sizeof *out->ids);
    out->text = V == 256 ? malloc(o->tokens) : NULL;
    if (!seq || !logits || !p || !out->ids || (V == 256 && !out->text)) {
        free(seq);
        free(logits);
        free(p);
        sample_output_free(out);
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    if (o->prompt_len)
        for (size_t i = 0; i < o->prompt_len; i++)
            seq[i] = o->prompt[i];
    else if (o->prompt_ids_len)
        for (size_t i = 0; i < o->prompt_ids_len; i++)
            seq[i] = (int32_t)o->prompt_ids[i];
    else
        seq[0] = V == 256 ? '\n' : 0;
    /* The key/value cache serves while the window starts at the sequence's
     * first token (have <= T): window position p is seq[p], the prompt is
     * one decode step per token (its logits but the last unused), and each
     * new token one more step.  Once the window slides, every token in it
     * sits at a new position, and with learned position embeddings no
     * cached key or value holds any more: from there on each token is
     * forward_logits over the whole window, T token-forwards, as without
     * the cache.  Either way the model sees the same window and gives the
     * same logits to rounding, so the same tokens come out. */
    bool cached = !o->no_cache && s->cache && s->m->ops->decode_start(s->m, s->cache, 1) == 0;
    size_t done = 0; /* seq[0, done) are in the cache */
    int rc = 0;
    for (uint32_t i = 0; i < o->tokens; i++) {
        const char *why = o->stop ? o->stop(o->stop_user) : NULL;
        if (why) {
            snprintf(err, err_len, "stopped after %u of %u tokens: %s", i, o->tokens, why);
            rc = -1;
            break;
        }
        size_t len = have < T ? have : T;
        if (cached && have <= T) {
            for (; done < have && rc == 0; done++)
                rc = s->m->ops->decode_step(s->m, seq + done, (uint32_t)done, logits);
        } else {
            rc = s->m->ops->forward_logits(s->m, seq + have - len, 1, (uint32_t)len, logits);
        }
        if (rc != 0) {
            snprintf(err, err_len, "forward failed");
            rc = -1;
            break;
        }
        uint32_t t = pick(logits, V, o->temperature, o->seed, i, p);
        seq[have++] = (int32_t)t;
        out->ids[out->n++] = t;
        if (out->text)
            out->text[i] = (uint8_t)t;
    }
    free(seq);
    free(logits);
    free(p);
    if (rc != 0)
        sample_output_free(out);
    return rc;
}
