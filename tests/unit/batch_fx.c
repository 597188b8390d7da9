/* batch_fx.c — see batch_fx.h. */
#include "batch_fx.h"

#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "pool/dev.h"
#include "fixture.h"
#include "kern_ws.h"
#include "pool/pool.h"

const kern_ops *kops;

/* A .npy v1.0 header padded to 64 bytes. */
static void write_npy(const char *path, const char *descr, const char *shape, const void *data, size_t len)
{
    char hdr[128];
    int n = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape);
    size_t total = 10 + (size_t)n + 1;
    size_t pad = (64 - total % 64) % 64;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint16_t hl = (uint16_t)(n + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fwrite(&hl, 2, 1, f);
    fwrite(hdr, 1, (size_t)n, f);
    for (size_t i = 0; i < pad; i++)
        fputc(' ', f);
    fputc('\n', f);
    fwrite(data, 1, len, f);
    fclose(f);
}

int batch_fx_setup(void **state)
{
    (void)state;
    /* Expandable segments: a trim gives back the free chunks inside
     * partly used runs too, so a simulated process can take memory a step
     * needs (with fixed segments it could only take whole free segments,
     * and a step's workspace would live on in its activations' segment). */
    pool_config pc;
    pool_config_default(&pc);
    pc.expandable_segments = true;
    if (fx_setup("batch", (size_t)256 << 20, &pc) != 0 || fx_write_corpus() != 0)
        return -1;
    /* 512 images of 64 floats, 10 classes. */
    enum { N = 512, D = 64 };
    float *img = malloc(N * D * sizeof *img);
    int32_t lab[N];
    for (int i = 0; i < N; i++) {
        lab[i] = i % 10;
        for (int k = 0; k < D; k++)
            img[i * D + k] = (float)((i * 31 + k * 7) % 17) / 17.0f + (k == lab[i] ? 1.0f : 0.0f);
    }
    char path[128];
    snprintf(path, sizeof path, "%s/img.npy", fx_dir);
    write_npy(path, "<f4", "(512, 64)", img, N * D * sizeof *img);
    snprintf(path, sizeof path, "%s/lab.npy", fx_dir);
    write_npy(path, "<i4", "(512,)", lab, sizeof lab);
    free(img);
    kops = kern_ws_ops(WS_FIXED, WS_FACTOR);
    return 0;
}

int batch_fx_teardown(void **state)
{
    (void)state;
    return fx_teardown();
}

void make_job(job_config *j, const shape *s, const char *out, uint32_t micro, uint64_t steps)
{
    fx_job(j, out);
    if (s->mlp) {
        snprintf(j->model, sizeof j->model, "mlp");
        j->nhidden = 2;
        j->hidden[0] = 256;
        j->hidden[1] = 128;
        snprintf(j->hidden_text, sizeof j->hidden_text, "256,128");
        j->format = JOBCFG_DATA_NPY;
        snprintf(j->train, sizeof j->train, "%s/img.npy", fx_dir);
        snprintf(j->train_labels, sizeof j->train_labels, "%s/lab.npy", fx_dir);
    } else {
        fx_gpt(j, s->layers, s->heads, s->width, s->context);
    }
    j->steps = steps;
    j->batch = s->batch;
    j->micro_batch = micro;
    j->lr = 3e-3;
    j->weight_decay = 0.1;
    j->threads = 2;
    j->eval_batches = 1;
    j->margin = 0;
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", j->out_dir);
    assert_int_equal(system(cmd), 0);
}

train_outcome run(const job_config *j, const train_hooks *h, train_result *res)
{
    train_outcome o = train_run(j, fx_pool, kops, 1, h, res);
    pool_job_forget(fx_pool, 1);
    return o;
}

bool press(void *user)
{
    pressure *x = user;
    if (x->stop_after && x->done >= x->stop_after)
        return true;
    if (x->injected || x->done + 1 != x->at || ++x->calls < 2)
        return false;
    x->injected = true;
    if (x->limit_to) {
        assert_int_equal(pool_job_set_limit(fx_pool, 1, x->limit_to), 0);
        return false;
    }
    pool_trim(fx_pool, POOL_TRIM_REQUEST, 0);
    size_t free_b, total;
    dev_mem_info(fx_dev, &free_b, &total);
    assert_int_equal(dev_cpu_set_external(fx_dev, free_b), DEV_OK);
    return false;
}

void watch(void *user, const train_progress *pr)
{
    pressure *x = user;
    x->done = pr->step;
    if (pr->step < 64)
        x->micro[pr->step] = pr->micro;
    x->last = *pr;
    if (x->release && pr->step == x->release)
        assert_int_equal(dev_cpu_set_external(fx_dev, 0), DEV_OK);
}

bool metrics_has(const char *dir, const char *needle)
{
    char path[256], line[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, "\"event\":\"batch_change\"") && strstr(line, needle);
    fclose(f);
    return found;
}

const shape oom_shape = {"gpt L2 C64 T32", false, 2, 4, 64, 32, 16};

size_t half_limit(void)
{
    job_config j;
    train_result res;
    make_job(&j, &oom_shape, "estimate", 1, 1);
    assert_int_equal(run(&j, NULL, &res), TRAIN_DONE);
    return res.persistent_bytes + res.act_fixed + res.act_per_sample * (oom_shape.batch / 2) + 3 * WS_FIXED;
}

void expect_meta(const char *dir, const char *key, const char *want)
{
    char got[64];
    fx_resume_meta(dir, key, got, sizeof got);
    if (strcmp(got, want) != 0)
        fail_msg("resume.safetensors %s: '%s', expected '%s'", key, got, want);
}
