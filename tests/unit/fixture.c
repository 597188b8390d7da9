/* fixture.c — see fixture.h. */
#include "fixture.h"

#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "io/safetensors.h"

char fx_dir[64];
dev *fx_dev;
pool *fx_pool;

int fx_setup(const char *tag, size_t capacity, const pool_config *pc)
{
    snprintf(fx_dir, sizeof fx_dir, "/tmp/gradd-%s-XXXXXX", tag);
    if (!mkdtemp(fx_dir))
        return -1;
    pool_config def;
    if (!pc) {
        pool_config_default(&def);
        pc = &def;
    }
    if (dev_cpu_create(capacity, 0, &fx_dev) != DEV_OK || pool_create(fx_dev, pc, &fx_pool) != 0)
        return -1;
    return 0;
}

int fx_teardown(void)
{
    pool_destroy(fx_pool);
    dev_destroy(fx_dev);
    fx_pool = NULL;
    fx_dev = NULL;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", fx_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* fx_dir/corpus.txt opened for writing, or NULL. */
static FILE *open_corpus(void)
{
    char path[128];
    snprintf(path, sizeof path, "%s/corpus.txt", fx_dir);
    return fopen(path, "w");
}

int fx_write_corpus(void)
{
    FILE *f = open_corpus();
    if (!f)
        return -1;
    for (int i = 0; i < 400; i++)
        fprintf(f, "the quick brown fox %d jumps over the lazy dog; pack my box with five dozen jugs.\n", i % 17);
    return fclose(f) == 0 ? 0 : -1;
}

int fx_write_corpus_repeat(const char *text, int times)
{
    FILE *f = open_corpus();
    if (!f)
        return -1;
    for (int i = 0; i < times; i++)
        fputs(text, f);
    return fclose(f) == 0 ? 0 : -1;
}

void fx_job(job_config *j, const char *out)
{
    jobcfg_defaults(j);
    j->val_fraction = 0.1;
    j->warmup = 2;
    snprintf(j->out_dir, sizeof j->out_dir, "%s/%s", fx_dir, out);
    snprintf(j->name, sizeof j->name, "%s", out);
    snprintf(j->source, sizeof j->source, "test");
}

void fx_gpt(job_config *j, uint32_t layers, uint32_t heads, uint32_t width, uint32_t context)
{
    snprintf(j->model, sizeof j->model, "gpt");
    j->layers = layers;
    j->heads = heads;
    j->width = width;
    j->context = context;
    j->vocab = 256;
    j->format = JOBCFG_DATA_TEXT;
    snprintf(j->train, sizeof j->train, "%s/corpus.txt", fx_dir);
}

/* DIR/resume.safetensors, open; a cmocka failure when it cannot be. */
static st_file *open_resume(const char *dir)
{
    char path[256], err[512];
    snprintf(path, sizeof path, "%s/resume.safetensors", dir);
    st_file *f;
    if (st_open(path, &f, err, sizeof err) != 0)
        fail_msg("%s", err);
    return f;
}

float *fx_read_resume(const char *dir, const char *name, size_t *n)
{
    char err[512];
    st_file *f = open_resume(dir);
    const st_tensor *t = st_find(f, name);
    assert_non_null(t);
    float *v = malloc(t->bytes);
    assert_int_equal(st_read(f, name, v, t->bytes, err, sizeof err), 0);
    *n = t->bytes / sizeof(float);
    st_close(f);
    return v;
}

const char *fx_resume_meta(const char *dir, const char *key, char *buf, size_t len)
{
    st_file *f = open_resume(dir);
    const char *v = st_meta(f, key);
    if (!v)
        fail_msg("%s/resume.safetensors has no metadata '%s'", dir, key);
    snprintf(buf, len, "%s", v);
    st_close(f);
    return buf;
}

void fx_resume_set_meta(const char *dir, const char *key, const char *value)
{
    char path[256], err[512];
    snprintf(path, sizeof path, "%s/resume.safetensors", dir);
    st_file *f = open_resume(dir);
    if (!st_meta(f, key))
        fail_msg("%s has no metadata '%s' to drop", path, key);
    st_writer *w = st_writer_new();
    assert_non_null(w);
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor *t = st_tensor_at(f, i);
        const void *data = st_data(f, t, err, sizeof err);
        if (!data)
            fail_msg("%s", err);
        st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, data, t->bytes, err, sizeof err);
    }
    for (size_t i = 0; i < st_meta_count(f); i++) {
        const char *k, *v;
        st_meta_at(f, i, &k, &v);
        if (strcmp(k, key) != 0 || value)
            st_writer_meta(w, k, strcmp(k, key) != 0 ? v : value, err, sizeof err);
    }
    /* The tensors are read from f's mapping while the new file is written
     * beside it; the rename leaves the mapping valid until st_close. */
    if (st_write_atomic(w, path, err, sizeof err) != 0)
        fail_msg("%s", err);
    st_writer_free(w);
    st_close(f);
}

void fx_resume_poke(const char *dir, const char *name, size_t i, float v)
{
    st_file *f = open_resume(dir);
    const st_tensor *t = st_find(f, name);
    if (!t || t->dtype != ST_F32 || i >= t->nelem)
        fail_msg("%s/resume.safetensors has no f32 element %s[%zu]", dir, name, i);
    off_t at = (off_t)(st_data_offset(f) + t->begin + i * sizeof(float));
    char path[256];
    snprintf(path, sizeof path, "%s/resume.safetensors", dir);
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, &v, sizeof v, at), (ssize_t)sizeof v);
    close(fd);
    st_close(f);
}

double fx_worst_tensor_diff(const char *dir_a, const char *dir_b, char *which, size_t which_len)
{
    char pa[256], pb[256], err[512];
    snprintf(pa, sizeof pa, "%s/model.safetensors", dir_a);
    snprintf(pb, sizeof pb, "%s/model.safetensors", dir_b);
    st_file *fa, *fb;
    if (st_open(pa, &fa, err, sizeof err) != 0 || st_open(pb, &fb, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(st_count(fa), st_count(fb));
    double worst = 0;
    for (size_t i = 0; i < st_count(fa); i++) {
        const st_tensor *ta = st_tensor_at(fa, i);
        const float *a = st_data(fa, ta, err, sizeof err);
        const float *b = st_data(fb, st_find(fb, ta->name), err, sizeof err);
        assert_non_null(a);
        assert_non_null(b);
        double num = 0, den = 0;
        for (uint64_t e = 0; e < ta->nelem; e++) {
            num += ((double)a[e] - b[e]) * ((double)a[e] - b[e]);
            den += (double)b[e] * b[e];
        }
        double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        if (rel > worst) {
            worst = rel;
            if (which)
                snprintf(which, which_len, "%s", ta->name);
        }
    }
    st_close(fa);
    st_close(fb);
    return worst;
}

void fx_record(void *user, const train_progress *pr)
{
    fx_stopper *s = user;
    s->seen = pr->step;
    s->resumed = pr->resumed;
    if (pr->step < sizeof s->losses / sizeof s->losses[0])
        s->losses[pr->step] = pr->loss;
}

bool fx_stop_now(void *user)
{
    fx_stopper *s = user;
    return s->stop_after && s->seen >= s->stop_after;
}

void fx_model_open(fx_model *fm, const job_config *j, uint64_t seed)
{
    const kern_ops *k = kern_cpu_ops();
    char err[256];
    fm->kc = k->ctx_create(1, 0, KERN_FP32, NULL);
    assert_non_null(fm->kc);
    if (model_create(j, 0, 0, k, fm->kc, &fm->m, err, sizeof err) != 0)
        fail_msg("model_create: %s", err);
    size_t fixed, per;
    fm->m->ops->activation_bytes(fm->m, &fixed, &per);
    assert_int_equal(posix_memalign(&fm->acts, 64, fixed + per), 0);
    fm->m->ops->bind_activations(fm->m, fm->acts, 1);
    fm->m->params = malloc(fm->m->num_params * sizeof(float));
    assert_non_null(fm->m->params);
    fm->m->ops->init_params(fm->m, fm->m->params, seed);
}

void fx_model_close(fx_model *fm)
{
    free(fm->m->params);
    model_destroy(fm->m);
    free(fm->acts);
    kern_cpu_ops()->ctx_destroy(fm->kc);
    memset(fm, 0, sizeof *fm);
}

double fx_token_loss(const float *logits, int V, int32_t target)
{
    double mx = logits[0], z = 0;
    for (int v = 1; v < V; v++)
        mx = logits[v] > mx ? logits[v] : mx;
    for (int v = 0; v < V; v++)
        z += exp(logits[v] - mx);
    return mx + log(z) - logits[target];
}
