/* model_hf.c — a job's model from a Hugging Face directory ([model] from)
 * and the model's config.json for export, for any kind with the hooks
 * (model.h: hf_type, hf_read, hf_config, hf_ignore).
 *
 * The kind converts config.json into [model] keys; this file decides what
 * the job file may say about them (leave them out, or agree), matches the
 * files' tensors to the model's tensor table, and loads them.  io/hf.c
 * does the file work and knows no models.
 */
#include "model.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "errmsg.h"
#include "io/hf.h"

/* ---- the job's [model] keys against config.json ------------------------------------- */

typedef enum { F_U32, F_DOUBLE, F_BOOL, F_ROPE } field_type;

/* A [model] key that a config.json may give, and the config.json keys
 * (top level, or in rope_scaling) that give it in the families gradd
 * imports: only for naming the one the file has in messages. */
typedef struct {
    const char *key;
    size_t offset;
    field_type type;
    const char *hf[3];
} shape_key;

#define F(name) offsetof(job_config, name)
static const shape_key keys[] = {
    {"layers", F(layers), F_U32, {"num_hidden_layers", "n_layer"}},
    {"heads", F(heads), F_U32, {"num_attention_heads", "n_head"}},
    {"width", F(width), F_U32, {"hidden_size", "n_embd"}},
    {"context", F(context), F_U32, {"max_position_embeddings", "n_positions", "n_ctx"}},
    {"vocab", F(vocab), F_U32, {"vocab_size"}},
    {"kv_heads", F(kv_heads), F_U32, {"num_key_value_heads"}},
    {"mlp_width", F(mlp_width), F_U32, {"intermediate_size", "n_inner"}},
    {"rope_theta", F(rope_theta), F_DOUBLE, {"rope_theta"}},
    {"rope_scaling", F(rope_scaling), F_ROPE, {"rope_type", "type"}},
    {"rope_factor", F(rope_factor), F_DOUBLE, {"factor"}},
    {"rope_low_freq", F(rope_low_freq), F_DOUBLE, {"low_freq_factor"}},
    {"rope_high_freq", F(rope_high_freq), F_DOUBLE, {"high_freq_factor"}},
    {"rope_context", F(rope_context), F_U32, {"original_max_position_embeddings"}},
    {"norm_eps", F(norm_eps), F_DOUBLE, {"rms_norm_eps", "layer_norm_epsilon"}},
    {"tie_embeddings", F(tie_embeddings), F_BOOL, {"tie_word_embeddings"}},
};
#undef F
#define NKEYS (sizeof keys / sizeof keys[0])

static bool same(const shape_key *k, const job_config *a, const job_config *b)
{
    const char *pa = (const char *)a + k->offset, *pb = (const char *)b + k->offset;
    switch (k->type) {
    case F_U32:
        return *(const uint32_t *)pa == *(const uint32_t *)pb;
    case F_DOUBLE:
        return *(const double *)pa == *(const double *)pb;
    case F_BOOL:
        return *(const bool *)pa == *(const bool *)pb;
    case F_ROPE:
        return *(const int *)pa == *(const int *)pb;
    }
    return false;
}

static const char *show(const shape_key *k, const job_config *j, char *buf, size_t len)
{
    const char *p = (const char *)j + k->offset;
    switch (k->type) {
    case F_U32:
        snprintf(buf, len, "%u", *(const uint32_t *)p);
        break;
    case F_DOUBLE:
        snprintf(buf, len, "%.17g", *(const double *)p);
        break;
    case F_BOOL:
        snprintf(buf, len, "%s", *(const bool *)p ? "true" : "false");
        break;
    case F_ROPE:
        snprintf(buf, len, "%s", *(const int *)p == JOBCFG_ROPE_LLAMA3 ? "llama3" : "none");
        break;
    }
    return buf;
}

/* The config.json key that gives k, as the file spells it ("rope_scaling.
 * factor" for one in that object), into buf; NULL when the file has none. */
static const char *hf_name(const shape_key *k, const json_t *cfg, char *buf, size_t len)
{
    const json_t *rope = json_object_get(cfg, "rope_scaling");
    for (int i = 0; i < 3 && k->hf[i]; i++) {
        if (json_object_get(cfg, k->hf[i]))
            return k->hf[i];
        if (json_is_object(rope) && json_object_get(rope, k->hf[i])) {
            snprintf(buf, len, "rope_scaling.%s", k->hf[i]);
            return buf;
        }
    }
    return NULL;
}

const model_kind *model_kind_hf(const char *hf_type)
{
    size_t n;
    const model_kind *const *all = model_kinds(&n);
    for (size_t i = 0; hf_type && i < n; i++)
        if (all[i]->hf_type && !strcmp(all[i]->hf_type, hf_type))
            return all[i];
    return NULL;
}

/* The model_types this gradd imports, joined by '|'. */
static const char *hf_types(char *buf, size_t len)
{
    size_t n, at = 0;
    const model_kind *const *all = model_kinds(&n);
    buf[0] = '\0';
    for (size_t i = 0; i < n && at < len; i++)
        if (all[i]->hf_type)
            at += (size_t)snprintf(buf + at, len - at, "%s%s", at ? "|" : "", all[i]->hf_type);
    return buf;
}

/* Fill j from config.json (read as whoever calls: the job's owner). */
static int fill(job_config *j, const json_t *cfg, char *err, size_t err_len)
{
    char where[PATH_MAX + 64], why[PATH_MAX + 256], types[64];
    const char *type = json_string_value(json_object_get(cfg, "model_type"));
    const model_kind *kind = model_kind_hf(type);
    if (!type)
        return errmsg_set(err, err_len, "%s/%s: model_type: a string is required", j->from, HF_CONFIG);
    if (!kind) {
        char q[80];
        snprintf(q, sizeof q, "%s", type);
        for (char *c = q; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                *c = '?';
        return errmsg_set(err, err_len, "%s/%s: model_type '%s' is not one that gradd imports (%s)", j->from,
                          HF_CONFIG, q, hf_types(types, sizeof types));
    }
    if (jobcfg_line(j, "model", "type") && strcmp(j->model, kind->name)) {
        snprintf(why, sizeof why, "%s but %s/%s model_type is %s (%s)", j->model, j->from, HF_CONFIG, type,
                 kind->a_name);
        return model_job_error(j, "model", "type", why, err, err_len);
    }
    job_config *t = malloc(sizeof *t);
    if (!t)
        return errmsg_set(err, err_len, "%s/%s: out of memory", j->from, HF_CONFIG);
    *t = *j;
    snprintf(t->model, sizeof t->model, "%s", kind->name);
    char kerr[512];
    if (kind->hf_read(cfg, t, kerr, sizeof kerr) != 0) {
        free(t);
        /* kerr starts "config.json: ": the directory goes in front. */
        return errmsg_set(err, err_len, "%s/%s", j->from, kerr);
    }
    /* The job may train at fewer positions than the model is made for;
     * t->positions (the file's, whole) stays the model's. */
    bool short_context = jobcfg_line(j, "model", "context") && j->context < t->context;
    for (size_t i = 0; i < NKEYS; i++) {
        const shape_key *k = &keys[i];
        if (same(k, j, t) || !jobcfg_line(j, "model", k->key) || (k->offset == offsetof(job_config, context) &&
                                                                   short_context))
            continue;
        char mine[48], theirs[48], nbuf[64];
        const char *name = hf_name(k, cfg, nbuf, sizeof nbuf);
        snprintf(why, sizeof why, "%s but %s/%s %s%s %s%s", show(k, j, mine, sizeof mine), j->from, HF_CONFIG,
                 name ? name : "gives", name ? " is" : "", show(k, t, theirs, sizeof theirs),
                 k->offset == offsetof(job_config, context) ? ": a job may train at that many positions or fewer"
                                                            : "");
        free(t);
        snprintf(err, err_len, "%s: %s", jobcfg_where(j, "model", k->key, where, sizeof where), why);
        return -1;
    }
    /* Nothing contradicts: the file's keys stand, config.json's fill the rest. */
    snprintf(j->model, sizeof j->model, "%s", kind->name);
    j->positions = t->positions;
    for (size_t i = 0; i < NKEYS; i++) {
        const shape_key *k = &keys[i];
        if (k->offset == offsetof(job_config, context) && short_context)
            continue;
        size_t size = k->type == F_U32 ? sizeof(uint32_t)
                      : k->type == F_DOUBLE ? sizeof(double)
                      : k->type == F_BOOL ? sizeof(bool)
                                          : sizeof(int);
        memcpy((char *)j + k->offset, (const char *)t + k->offset, size);
    }
    free(t);
    return 0;
}

bool model_hf_later(job_config *j)
{
    if (!j->from[0] || !j->inputs_later)
        return false;
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/config.json", j->from);
    struct stat st;
    if (lstat(path, &st) == 0 || errno != ENOENT)
        return false;
    j->inputs_missing = true;
    return true;
}

int model_hf_fill(job_config *j, char *err, size_t err_len)
{
    if (!j->from[0])
        return 0;
    json_t *cfg;
    char cerr[PATH_MAX + 256], where[PATH_MAX + 64];
    if (hf_config_read(j->from, &cfg, cerr, sizeof cerr) != 0) {
        snprintf(err, err_len, "%s: %s", jobcfg_where(j, "model", "from", where, sizeof where), cerr);
        return -1;
    }
    int rc = fill(j, cfg, err, err_len);
    json_decref(cfg);
    return rc;
}

/* ---- the weights ----------------------------------------------------------------------- */

static bool ignore(void *user, const char *name)
{
    const model *m = user;
    return m->kind->hf_ignore && m->kind->hf_ignore(m, name);
}

/* Open dir's weights for m's tensor table, every header checked. */
static int open_for(const model *m, const char *dir, hf_weights **out, char *err, size_t err_len)
{
    hf_want *want = calloc((size_t)m->ntensors + 1, sizeof *want);
    if (!want)
        return errmsg_set(err, err_len, "%s: out of memory", dir);
    for (int i = 0; i < m->ntensors; i++) {
        const model_tensor *t = &m->tensors[i];
        bool tr = t->transpose_export && t->ndim == 2;
        want[i].name = t->name;
        want[i].ndim = t->ndim;
        want[i].transpose = tr;
        for (int d = 0; d < t->ndim && d < HF_MAX_DIMS; d++)
            want[i].shape[d] = t->shape[tr ? 1 - d : d];
    }
    int rc = hf_weights_open(dir, want, (size_t)m->ntensors, m->kind->hf_prefix, ignore, (void *)m, HF_CONFIG, out,
                             err, err_len);
    free(want);
    return rc;
}

int model_hf_check(const job_config *j, char *err, size_t err_len)
{
    if (!j->from[0])
        return 0;
    model *m;
    char merr[512];
    if (model_create(j, 0, 0, NULL, NULL, &m, merr, sizeof merr) != 0)
        return errmsg_set(err, err_len, "%s: %s", j->source, merr);
    hf_weights *w;
    int rc = open_for(m, j->from, &w, err, err_len);
    if (rc == 0)
        hf_weights_close(w);
    model_destroy(m);
    return rc;
}

int model_hf_load(const model *m, const char *dir, float *params, char *err, size_t err_len)
{
    hf_weights *w;
    if (open_for(m, dir, &w, err, err_len) != 0)
        return -1;
    int rc = 0;
    for (int i = 0; i < m->ntensors && rc == 0; i++)
        rc = hf_weights_read(w, (size_t)i, params + m->tensors[i].offset, err, err_len);
    hf_weights_close(w);
    return rc;
}

int model_hf_export_config(const model *m, const char *path, char *err, size_t err_len)
{
    if (!m->kind->hf_config)
        return 0;
    json_t *cfg = m->kind->hf_config(m);
    if (!cfg)
        return errmsg_set(err, err_len, "%s: out of memory", path);
    int rc = hf_write_json(path, cfg, err, err_len);
    json_decref(cfg);
    return rc;
}
