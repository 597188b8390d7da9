/* test_train_lora.c — the engine's side of LoRA (models/lora.h) on the
 * simulated cpu device, with a 16-bit base: the cpu computes in fp32
 * whatever the precision, but the engine's test-only seam for mixed
 * precision on the cpu (train_hooks.cpu_mixed_precision) makes it hold the
 * base as it does on a GPU, in bf16 alone.
 *
 *   - The pool holds the base once (P bf16 values and the fp32-read
 *     tensors, tagged frozen) and the adapters with their gradients and
 *     AdamW's moments; nothing of the base trains.
 *   - The merged export is the base rounded to bf16 and widened, plus
 *     scale·B·A at each site, with the fp32-read tensors exact: worked out
 *     here from the model's own init_params and the adapters' export.
 *   - A run stopped and resumed ends with the adapters of one that was not,
 *     bitwise.
 *   - Dropout's masks are the step's samples', whatever the split or
 *     recompute.
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

#include "engine/train.h"
#include "fixture.h"
#include "io/safetensors.h"
#include "jobcfg.h"
#include "kernels.h"
#include "models/lora.h"
#include "pool/pool.h"

static int setup(void **state)
{
    (void)state;
    if (fx_setup("lora", (size_t)256 << 20, NULL) != 0 || fx_write_corpus() != 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return fx_teardown();
}

static void job(job_config *j, const char *out, uint64_t steps)
{
    fx_job(j, out);
    snprintf(j->model, sizeof j->model, "llama");
    j->layers = 2;
    j->heads = 4;
    j->kv_heads = 2;
    j->width = 32;
    j->mlp_width = 64;
    j->context = 16;
    j->vocab = 256;
    j->format = JOBCFG_DATA_TEXT;
    snprintf(j->train, sizeof j->train, "%s/corpus.txt", fx_dir);
    j->steps = steps;
    j->batch = 4;
    j->micro_batch = 2;
    j->lr = 1e-2;
    j->warmup = 0;
    j->seed = 5;
    j->threads = 1;
    j->precision = JOBCFG_BF16;
    j->ft_method = JOBCFG_FT_LORA;
    j->lora_rank = 4;
    j->lora_alpha = 8;
    snprintf(j->lora_targets, sizeof j->lora_targets, "q_proj,v_proj,down_proj");
}

/* The job's model, shapes only, for its sizes and tables. */
static model *shapes_of(const job_config *j)
{
    model *m;
    char err[512];
    if (model_create(j, 0, 0, kern_cpu_ops(), NULL, &m, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_non_null(m->lora);
    return m;
}

static int64_t rounded(size_t bytes)
{
    return (int64_t)((bytes + 511) / 512 * 512);
}

typedef struct {
    pool_stats st;
    bool taken;
    char levers[320];
} snap;

static void take_stats(void *user, const train_progress *pr)
{
    snap *s = user;
    if (!s->taken) {
        pool_stats_read(fx_pool, &s->st);
        snprintf(s->levers, sizeof s->levers, "%s", pr->levers);
    }
    s->taken = true;
}

static float bf16_round(float x)
{
    return kern_bf16_to_f32(kern_f32_to_bf16(x));
}

/* The f32 tensor NAME of PATH, malloc'd, its element count in *n. */
static float *read_tensor(const char *path, const char *name, size_t *n)
{
    st_file *f;
    char err[512];
    if (st_open(path, &f, err, sizeof err) != 0)
        fail_msg("%s", err);
    const st_tensor *t = st_find(f, name);
    if (!t)
        fail_msg("%s: no tensor %s", path, name);
    assert_int_equal(t->dtype, ST_F32);
    *n = (size_t)t->nelem;
    float *v = malloc(t->bytes);
    assert_non_null(v);
    if (st_read(f, name, v, t->bytes, err, sizeof err) != 0)
        fail_msg("%s", err);
    st_close(f);
    return v;
}

static void test_bf16_base_once_and_merged(void **state)
{
    (void)state;
    job_config j;
    job(&j, "bf16", 3);
    j.lora_merged = true;
    model *m = shapes_of(&j);
    size_t P = m->num_params, A = m->lora->num_params;
    static snap s;
    memset(&s, 0, sizeof s);
    train_hooks h = {.on_step = take_stats, .user = &s, .cpu_mixed_precision = true};
    train_result res;
    if (train_run(&j, fx_pool, kern_cpu_ops(), 1, &h, &res) != TRAIN_DONE)
        fail_msg("train_run: %s", res.message);
    pool_job_forget(fx_pool, 1);
    assert_true(s.taken);
    assert_int_equal(s.st.tag_current[POOL_TAG_FROZEN],
                     rounded(P * sizeof(uint16_t)) + rounded(m->lora->n32 * sizeof(float)));
    assert_int_equal(s.st.tag_current[POOL_TAG_PARAMS], rounded(A * sizeof(float)));
    assert_int_equal(s.st.tag_current[POOL_TAG_GRADS], rounded(A * sizeof(float)));
    assert_int_equal(s.st.tag_current[POOL_TAG_OPTIMIZER], rounded(2 * A * sizeof(float)));
    assert_non_null(strstr(s.levers, "base frozen in bf16"));
    assert_int_equal(strncmp(s.levers, "lora (r=4 ", 10), 0);

    /* The merged model from the base the seed draws. */
    float *base = malloc(P * sizeof(float));
    assert_non_null(base);
    m->ops->init_params(m, base, j.seed);
    char path[256];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", j.out_dir);
    float *ad = calloc(A, sizeof(float));
    assert_non_null(ad);
    for (int i = 0; i < m->lora->ntensors; i++) {
        size_t n;
        float *t = read_tensor(path, m->lora->tensors[i].name, &n);
        assert_int_equal(n, m->lora->tensors[i].numel);
        memcpy(ad + m->lora->tensors[i].offset, t, n * sizeof(float));
        free(t);
    }
    /* Which floats the kernels read in fp32: exact in the export. */
    bool *keep = calloc(P, sizeof(bool));
    assert_non_null(keep);
    for (int i = 0; i < m->lora->nkeep; i++)
        for (size_t e = 0; e < m->lora->keep_n[i]; e++)
            keep[m->lora->keep_off[i] + e] = true;
    float *want = malloc(P * sizeof(float));
    assert_non_null(want);
    for (size_t e = 0; e < P; e++)
        want[e] = keep[e] ? base[e] : bf16_round(base[e]);
    lora_merge(m, want, ad);
    snprintf(path, sizeof path, "%s/model.safetensors", j.out_dir);
    double worst = 0;
    size_t sites_changed = 0;
    for (int i = 0; i < m->ntensors; i++) {
        const model_tensor *t = &m->tensors[i];
        size_t n;
        float *got = read_tensor(path, t->name, &n);
        assert_int_equal(n, t->numel);
        bool moved = false;
        for (size_t e = 0; e < n; e++) {
            double d = fabs((double)got[e] - want[t->offset + e]);
            worst = d > worst ? d : worst;
            moved |= got[e] != (keep[t->offset + e] ? base[t->offset + e] : bf16_round(base[t->offset + e]));
        }
        sites_changed += moved;
        free(got);
    }
    /* lora_merge here and in the export: the same fp32 sums. */
    assert_true(worst == 0);
    assert_int_equal(sites_changed, (size_t)m->lora->nsites);
    free(want);
    free(keep);
    free(ad);
    free(base);
    model_destroy(m);
}

static void test_stop_resume_bitwise(void **state)
{
    (void)state;
    job_config a, b;
    job(&a, "straight", 5);
    job(&b, "resumed", 5);
    train_result res;
    fx_stopper full = {0}, part = {.stop_after = 2};
    train_hooks hf = {.on_step = fx_record, .user = &full, .cpu_mixed_precision = true};
    train_hooks hp = {.on_step = fx_record, .should_stop = fx_stop_now, .user = &part, .cpu_mixed_precision = true};
    if (train_run(&a, fx_pool, kern_cpu_ops(), 1, &hf, &res) != TRAIN_DONE)
        fail_msg("%s", res.message);
    pool_job_forget(fx_pool, 1);
    assert_int_equal(train_run(&b, fx_pool, kern_cpu_ops(), 1, &hp, &res), TRAIN_STOPPED);
    pool_job_forget(fx_pool, 1);
    part.stop_after = 0;
    if (train_run(&b, fx_pool, kern_cpu_ops(), 1, &hp, &res) != TRAIN_DONE)
        fail_msg("%s", res.message);
    pool_job_forget(fx_pool, 1);
    assert_true(part.resumed);
    model *m = shapes_of(&a);
    for (int i = 0; i < m->lora->ntensors; i++) {
        size_t n1, n2;
        float *x = fx_read_resume(a.out_dir, m->lora->tensors[i].name, &n1);
        float *y = fx_read_resume(b.out_dir, m->lora->tensors[i].name, &n2);
        assert_int_equal(n1, n2);
        assert_memory_equal(x, y, n1 * sizeof(float));
        free(x);
        free(y);
    }
    size_t n1, n2;
    float *x = fx_read_resume(a.out_dir, "adam_v", &n1), *y = fx_read_resume(b.out_dir, "adam_v", &n2);
    assert_int_equal(n1, m->lora->num_params);
    assert_int_equal(n2, n1);
    assert_memory_equal(x, y, n1 * sizeof(float));
    free(x);
    free(y);
    model_destroy(m);
}

/* The largest |a - b| over the adapters of two runs' checkpoints, and of
 * b's values (for a relative figure). */
static double adapters_diff(const model *m, const char *dir_a, const char *dir_b, double *largest)
{
    double worst = 0, big = 0;
    for (int i = 0; i < m->lora->ntensors; i++) {
        size_t n1, n2;
        float *x = fx_read_resume(dir_a, m->lora->tensors[i].name, &n1);
        float *y = fx_read_resume(dir_b, m->lora->tensors[i].name, &n2);
        assert_int_equal(n1, n2);
        for (size_t e = 0; e < n1; e++) {
            double d = fabs((double)x[e] - y[e]);
            worst = d > worst ? d : worst;
            big = fabs(y[e]) > big ? fabs(y[e]) : big;
        }
        free(x);
        free(y);
    }
    *largest = big;
    return worst;
}

static void run_dropout(job_config *j, const char *out, uint32_t micro, int recompute, double rate, fx_stopper *rec)
{
    job(j, out, 4);
    j->precision = JOBCFG_FP32; /* the split is then the one difference that rounds */
    j->micro_batch = micro;
    j->recompute = recompute;
    j->lora_dropout = rate;
    memset(rec, 0, sizeof *rec);
    train_hooks h = {.on_step = fx_record, .user = rec};
    train_result res;
    if (train_run(j, fx_pool, kern_cpu_ops(), 1, &h, &res) != TRAIN_DONE)
        fail_msg("%s", res.message);
    pool_job_forget(fx_pool, 1);
    assert_int_equal(rec->seen, 4);
}

/* [finetune] dropout: its masks belong to the step's samples, not to how
 * the step is cut.
 *   - Micro-batches of 1 (accumulating 4) train as one micro-batch of 4
 *     does: the losses agree to 1e-6 and the adapters to 1e-5 of their
 *     largest, from the sums' order alone (masks drawn per micro-batch
 *     would move the first step's gradient, and the losses after it).
 *   - Recompute draws the same masks again: bitwise the same adapters.
 *   - The masks matter: without dropout the adapters end elsewhere, and
 *     the last step's loss differs. */
static void test_dropout_split_recompute(void **state)
{
    (void)state;
    job_config a, b, c, d;
    static fx_stopper ra, rb, rc, rd;
    run_dropout(&a, "drop_m4", 4, JOBCFG_RECOMPUTE_OFF, 0.25, &ra);
    run_dropout(&b, "drop_m1", 1, JOBCFG_RECOMPUTE_OFF, 0.25, &rb);
    run_dropout(&c, "drop_m1_rc", 1, JOBCFG_RECOMPUTE_ON, 0.25, &rc);
    run_dropout(&d, "nodrop_m4", 4, JOBCFG_RECOMPUTE_OFF, 0.0, &rd);
    for (int s = 1; s <= 4; s++) {
        print_message("step %d: loss %.7f (micro 4) %.7f (micro 1) %.7f (recompute) %.7f (no dropout)\n", s,
                      ra.losses[s], rb.losses[s], rc.losses[s], rd.losses[s]);
        assert_true(fabs(ra.losses[s] - rb.losses[s]) <= 1e-6 * fabs(ra.losses[s]));
        assert_true(rb.losses[s] == rc.losses[s]);
    }
    /* B starts at zero: the first step's loss is the base's either way. */
    assert_true(ra.losses[1] == rd.losses[1]);
    assert_true(fabs(ra.losses[4] - rd.losses[4]) > 1e-4 * fabs(rd.losses[4]));
    model *m = shapes_of(&a);
    double big, split = adapters_diff(m, a.out_dir, b.out_dir, &big);
    print_message("adapters: micro 1 against 4 %.3g of the largest %.3g\n", split / big, big);
    assert_true(split <= 1e-5 * big);
    assert_true(adapters_diff(m, b.out_dir, c.out_dir, &big) == 0);
    double off = adapters_diff(m, a.out_dir, d.out_dir, &big);
    print_message("adapters: dropout 0.25 against none %.3g of the largest\n", off / big);
    assert_true(off > 1e-2 * big);
    model_destroy(m);
}

/* [finetune] method = auto under a [memory] limit that full fine-tuning
 * (16 bytes a parameter before any activation) cannot meet: LoRA, with
 * the reason in the levers.  Stopped and resumed without the limit, it
 * goes on with the adapters its checkpoint holds, and ends bitwise where
 * a job that asked for LoRA ends. */
static void test_auto_chooses_lora_and_keeps_it(void **state)
{
    (void)state;
    job_config a, b;
    job(&a, "auto", 5);
    a.precision = JOBCFG_FP32;
    a.ft_method = JOBCFG_FT_AUTO;
    job(&b, "asked", 5);
    b.precision = JOBCFG_FP32;
    model *m = shapes_of(&b);
    a.mem_limit = 15 * m->num_params;
    static snap s;
    memset(&s, 0, sizeof s);
    fx_stopper part = {.stop_after = 2};
    train_hooks hp = {.on_step = fx_record, .should_stop = fx_stop_now, .user = &part};
    train_result res;
    assert_int_equal(train_run(&a, fx_pool, kern_cpu_ops(), 1, &hp, &res), TRAIN_STOPPED);
    pool_job_forget(fx_pool, 1);
    assert_true(res.lora);
    a.mem_limit = 0;
    part.stop_after = 0;
    train_hooks hs = {.on_step = take_stats, .user = &s};
    if (train_run(&a, fx_pool, kern_cpu_ops(), 1, &hs, &res) != TRAIN_DONE)
        fail_msg("%s", res.message);
    pool_job_forget(fx_pool, 1);
    assert_true(res.lora);
    print_message("levers on resume: %s\n", s.levers);
    assert_non_null(strstr(s.levers, "; method = auto: the checkpoint holds adapters)"));
    if (train_run(&b, fx_pool, kern_cpu_ops(), 1, NULL, &res) != TRAIN_DONE)
        fail_msg("%s", res.message);
    pool_job_forget(fx_pool, 1);
    /* The reason as the first run gave it, in its metrics. */
    char path[512], line[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", a.out_dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    bool said = false;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "\"batch_change\"")) {
            print_message("%s", line);
            said |= strstr(line, "\"reason\":\"lora\"") != NULL;
        }
    fclose(f);
    assert_true(said);
    double big;
    assert_true(adapters_diff(m, a.out_dir, b.out_dir, &big) == 0);
    assert_true(big > 0);
    model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_base_once_and_merged),
        cmocka_unit_test(test_stop_resume_bitwise),
        cmocka_unit_test(test_dropout_split_recompute),
        cmocka_unit_test(test_auto_chooses_lora_and_keeps_it),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
