/* test_batch_fp16.c — fp16 loss scaling in the real engine across
 * micro-batch changes and resume: an overflow halves the scale and skips
 * the step (AdamW's count included), an OOM leaves the scale alone, the
 * scale and its counts survive a stop and resume (also from checkpoints
 * older gradds wrote), a resume may change precision, and the scale
 * doubles after its run of good steps.  metrics.jsonl and TensorBoard show
 * the same scale. */
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/batch.h"
#include "fixture.h"
#include "jobcfg.h"
#include "pool/pool.h"
#include "engine/tboard.h"
#include "tensorboard.pb-c.h"
#include "engine/train.h"
#include "batch_fx.h"

/* ---- fp16 loss scaling across micro-batch changes and resume ------------------------ */

/* The workspace kernels, except that the gradients' sum of squares is +inf
 * on the steps in ovf_at: an fp16 overflow as the engine sees one (it
 * takes an overflow from a non-finite gradient norm).  The engine calls
 * sumsq once per step, after every micro-batch went through, so a step
 * redone after an OOM is counted once.  AdamW's t is recorded by step. */
#define T_STEPS 64
static kern_ops ovf_ops;
static uint64_t ovf_at[2]; /* 1-based steps that overflow; 0: none */
static uint64_t ovf_done;  /* steps finished: the one running is ovf_done + 1 */
static int ovf_t[T_STEPS]; /* the t AdamW ran with at each step; 0: it did not run, -1: two calls disagreed */

static void ovf_sumsq(kern_ctx *k, double *out, const float *g, size_t n)
{
    kops->sumsq(k, out, g, n);
    for (size_t i = 0; i < sizeof ovf_at / sizeof ovf_at[0]; i++)
        if (ovf_at[i] == ovf_done + 1)
            *out = INFINITY;
}

static void ovf_adamw(kern_ctx *k, float *p, uint16_t *p16, const float *g, float *m, float *v,
                      const kern_segment *segs, int nsegs, float lr, float beta1, float beta2, float eps,
                      float weight_decay, float grad_scale, int t)
{
    uint64_t s = ovf_done + 1;
    if (s < T_STEPS)
        ovf_t[s] = ovf_t[s] == 0 || ovf_t[s] == t ? t : -1;
    kops->adamw_multi(k, p, p16, g, m, v, segs, nsegs, lr, beta1, beta2, eps, weight_decay, grad_scale, t);
}

static const kern_ops *overflow_at(uint64_t a, uint64_t b)
{
    ovf_ops = *kops;
    ovf_ops.sumsq = ovf_sumsq;
    ovf_ops.adamw_multi = ovf_adamw;
    memset(ovf_t, 0, sizeof ovf_t);
    ovf_at[0] = a;
    ovf_at[1] = b;
    return &ovf_ops;
}

#define SCALE_STEPS (TRAIN_LOSS_SCALE_GROW_EVERY + 8)
#define STATE_STEPS 16

typedef struct {
    pressure x;                /* first: press takes a scale_watch as its pressure */
    const char *dir;           /* the job's output dir */
    double scale[SCALE_STEPS]; /* the loss scale reported after each step */
    /* read_state, with checkpoint_every = 1: the checkpointed params,
     * adam_m and adam_v after each step, read in the next step's hook (a
     * step's checkpoint is written after its own hook). */
    bool read_state;
    float *state[STATE_STEPS];
    size_t nstate;
} scale_watch;

static void scale_on_step(void *user, const train_progress *pr)
{
    scale_watch *w = user;
    watch(&w->x, pr);
    ovf_done = pr->step;
    if (pr->step < SCALE_STEPS)
        w->scale[pr->step] = pr->loss_scale;
    uint64_t prev = pr->step - 1;
    if (w->read_state && prev >= 1 && prev < STATE_STEPS && !w->state[prev]) {
        static const char *const names[3] = {"params", "adam_m", "adam_v"};
        size_t n[3];
        float *t[3];
        for (int i = 0; i < 3; i++)
            t[i] = fx_read_resume(w->dir, names[i], &n[i]);
        w->nstate = n[0] + n[1] + n[2];
        w->state[prev] = malloc(w->nstate * sizeof(float));
        assert_non_null(w->state[prev]);
        size_t off = 0;
        for (int i = 0; i < 3; off += n[i], i++) {
            memcpy(w->state[prev] + off, t[i], n[i] * sizeof(float));
            free(t[i]);
        }
    }
}

static void scale_watch_free(scale_watch *w)
{
    for (int i = 0; i < STATE_STEPS; i++)
        free(w->state[i]);
}

static void expect_scale(const scale_watch *w, uint64_t step, double want)
{
    if (w->scale[step] != want)
        fail_msg("step %llu: loss scale %.17g, expected %.17g", (unsigned long long)step, w->scale[step], want);
}

/* The tensorboard/ event file of a run: train/loss_scale at each step it
 * has, into scale[step] (NAN where a step has none), and how many. */
typedef struct {
    double scale[SCALE_STEPS];
    int n;
} tb_scales;

static int tb_scale_record(void *ctx, const uint8_t *data, size_t len)
{
    tb_scales *t = ctx;
    Gradd__Tb__Event *ev = gradd__tb__event__unpack(NULL, len, data);
    assert_non_null(ev);
    if (ev->what_case == GRADD__TB__EVENT__WHAT_SUMMARY && ev->step >= 0 && ev->step < SCALE_STEPS)
        for (size_t i = 0; i < ev->summary->n_value; i++)
            if (!strcmp(ev->summary->value[i]->tag, "train/loss_scale")) {
                t->scale[ev->step] = ev->summary->value[i]->simple_value;
                t->n++;
            }
    gradd__tb__event__free_unpacked(ev, NULL);
    return 0;
}

static void read_tb_scales(const char *out_dir, tb_scales *t)
{
    for (int s = 0; s < SCALE_STEPS; s++)
        t->scale[s] = NAN;
    t->n = 0;
    char dir[600], path[900], err[512];
    snprintf(dir, sizeof dir, "%s/tensorboard", out_dir);
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "events.out.tfevents.", 20)) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            if (tb_read_records(path, 0, tb_scale_record, t, err, sizeof err) < 0)
                fail_msg("%s", err);
        }
    closedir(d);
}



/* AdamW's t at steps from..to was want[0], want[1], ...; 0: not run (a
 * skipped step). */
static void expect_adam_t(uint64_t from, uint64_t to, const int *want)
{
    for (uint64_t s = from; s <= to; s++)
        if (ovf_t[s] != want[s - from])
            fail_msg("step %llu: AdamW ran with t = %d, expected %d (0: not at all)", (unsigned long long)s,
                     ovf_t[s], want[s - from]);
}

/* metrics.jsonl's step lines, by step: the loss scale they show (NAN: no
 * loss_scale), whether they say skipped, and whether the gradient norm is
 * null, JSON's stand-in for the infinite norm of an overflow. */
typedef struct {
    double scale[T_STEPS];
    bool skipped[T_STEPS], norm_null[T_STEPS], seen[T_STEPS];
} step_lines;

static void read_step_lines(const char *dir, step_lines *m)
{
    char path[PATH_MAX + 16], line[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    memset(m, 0, sizeof *m);
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, "\"loss\":"))
            continue;
        unsigned long long st = strtoull(strstr(line, "\"step\":") + 7, NULL, 10);
        assert_true(st > 0 && st < T_STEPS);
        assert_false(m->seen[st]);
        m->seen[st] = true;
        const char *ls = strstr(line, "\"loss_scale\":");
        m->scale[st] = ls ? strtod(ls + 13, NULL) : NAN;
        m->skipped[st] = strstr(line, ",\"skipped\":true") != NULL;
        m->norm_null[st] = strstr(line, "\"grad_norm\":null,") != NULL;
    }
    fclose(f);
}

/* fp16 on the cpu (train_hooks.cpu_mixed_precision), with auto micro-batches
 * of about half the batch: an overflow at step 3 halves the scale and skips
 * the step, AdamW's t included; an OOM in the middle of step 6 redoes it at
 * a smaller micro-batch and leaves the scale alone; the run stops after
 * step 8 and resumes with the scale, the count of good steps and the count
 * of applied updates it had; a second overflow at step 10 halves the
 * restored scale.  metrics.jsonl shows it all.  The same stop checkpoint
 * stripped of what older ones lack resumes as they must. */
static void test_fp16_scale_across_oom_and_resume(void **state)
{
    (void)state;
    const double S = TRAIN_LOSS_SCALE_INIT;
    job_config j;
    train_result res;
    make_job(&j, &oom_shape, "fp16", 0, 12);
    j.mem_limit = half_limit();
    j.margin = 0.05;
    j.tune = false; /* the fitted size from the first step: the OOM at step 6 is what changes it */
    j.precision = JOBCFG_FP16;
    j.checkpoint_every = 1;
    /* Without the seam the cpu refuses fp16, as it does for a job file. */
    assert_int_equal(run(&j, NULL, &res), TRAIN_FAILED);
    assert_non_null(strstr(res.message, "fp16 needs a CUDA device"));

    const kern_ops *k = overflow_at(3, 10);
    scale_watch *w = calloc(1, sizeof *w);
    *w = (scale_watch){.x = {.at = 6, .stop_after = 8}, .dir = j.out_dir, .read_state = true};
    train_hooks h = {.on_step = scale_on_step, .should_stop = press, .user = w,
                     .cpu_mixed_precision = true};
    ovf_done = 0;
    train_outcome o = train_run(&j, fx_pool, k, 1, &h, &res);
    pool_job_forget(fx_pool, 1);
    dev_cpu_set_external(fx_dev, 0);
    if (o != TRAIN_STOPPED)
        fail_msg("%s", o == TRAIN_FAILED ? res.message : "the run did not stop");
    assert_int_equal(res.steps_done, 8);
    printf("fp16: micro by step:");
    for (int s = 1; s <= 8; s++)
        printf(" %u", w->x.micro[s]);
    printf("; scale by step:");
    for (int s = 1; s <= 8; s++)
        printf(" %.0f", w->scale[s]);
    printf("\n");
    /* TensorBoard shows the same scale at every step (powers of two:
     * exact as floats). */
    {
        tb_scales tb;
        read_tb_scales(j.out_dir, &tb);
        assert_int_equal(tb.n, 8);
        for (int s = 1; s <= 8; s++)
            if (tb.scale[s] != w->scale[s])
                fail_msg("tensorboard step %d: train/loss_scale %.17g, metrics say %.17g", s, tb.scale[s],
                         w->scale[s]);
    }

    /* Steps 1 and 2 at the initial scale; the overflow at 3 halves it. */
    expect_scale(w, 1, S);
    expect_scale(w, 2, S);
    expect_scale(w, 3, S / 2);
    /* The skipped step touched neither the parameters nor Adam's moments
     * (bitwise), while a good step does. */
    assert_non_null(w->state[1]);
    assert_non_null(w->state[2]);
    assert_non_null(w->state[3]);
    assert_memory_equal(w->state[3], w->state[2], w->nstate * sizeof(float));
    assert_memory_not_equal(w->state[2], w->state[1], w->nstate * sizeof(float));
    assert_memory_not_equal(w->state[4], w->state[3], w->nstate * sizeof(float));
    /* The OOM inside step 6 shrank the micro-batch; the scale went on. */
    assert_true(w->x.injected);
    assert_true(res.oom_recoveries >= 1);
    assert_true(w->x.micro[6] < w->x.micro[5]);
    assert_string_equal(w->x.last.change_reason, "oom");
    for (uint64_t s = 4; s <= 8; s++)
        expect_scale(w, s, S / 2);
    /* The stop checkpoint holds the scale and the 5 good steps since the
     * overflow (4 to 8). */
    expect_meta(j.out_dir, "step", "8");
    expect_meta(j.out_dir, "loss_scale", "32768");
    expect_meta(j.out_dir, "loss_scale_good_steps", "5");
    /* The skipped step 3 left AdamW's count alone: step 4 is its third
     * update, and the stop checkpoint holds 7 updates in 8 steps.  Step 6
     * ran it once, after the redo. */
    expect_adam_t(1, 8, (const int[]){1, 2, 0, 3, 4, 5, 6, 7});
    expect_meta(j.out_dir, "optimizer_steps", "7");
    expect_meta(j.out_dir, "precision", "fp16");
    scale_watch_free(w);

    /* A copy of the stop checkpoint as an older gradd wrote it: no count of
     * updates (it took t = step) and no precision. */
    job_config old = j;
    snprintf(old.out_dir, sizeof old.out_dir, "%s/fp16-old", fx_dir);
    char cmd[2 * PATH_MAX + 32];
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", old.out_dir, j.out_dir, old.out_dir);
    assert_int_equal(system(cmd), 0);
    fx_resume_set_meta(old.out_dir, "optimizer_steps", NULL);
    fx_resume_set_meta(old.out_dir, "precision", NULL);

    /* Resume: the scale is the checkpoint's, the second overflow halves it. */
    *w = (scale_watch){.dir = j.out_dir, .read_state = true};
    ovf_done = 8;
    o = train_run(&j, fx_pool, k, 1, &h, &res);
    pool_job_forget(fx_pool, 1);
    if (o != TRAIN_DONE)
        fail_msg("%s", res.message);
    assert_int_equal(res.steps_done, 12);
    expect_scale(w, 9, S / 2);
    expect_scale(w, 10, S / 4);
    expect_scale(w, 11, S / 4);
    expect_scale(w, 12, S / 4);
    assert_memory_equal(w->state[10], w->state[9], w->nstate * sizeof(float));
    expect_meta(j.out_dir, "loss_scale", "16384");
    expect_meta(j.out_dir, "loss_scale_good_steps", "2");
    /* The count came back from the checkpoint: step 9 is update 8. */
    expect_adam_t(9, 12, (const int[]){8, 0, 9, 10});
    expect_meta(j.out_dir, "optimizer_steps", "10");
    scale_watch_free(w);

    /* metrics.jsonl, the stopped run's lines and the resumed run's: every
     * step once, with the scale after it; the two overflows skipped, their
     * infinite norms null (JSON has no inf). */
    step_lines m;
    read_step_lines(j.out_dir, &m);
    const double want[13] = {0, S, S, S / 2, S / 2, S / 2, S / 2, S / 2, S / 2, S / 2, S / 4, S / 4, S / 4};
    for (uint64_t s = 1; s <= 12; s++) {
        assert_true(m.seen[s]);
        if (m.scale[s] != want[s])
            fail_msg("metrics.jsonl step %llu: loss_scale %.17g, expected %.17g", (unsigned long long)s, m.scale[s],
                     want[s]);
        assert_int_equal(m.skipped[s], s == 3 || s == 10);
        assert_int_equal(m.norm_null[s], s == 3 || s == 10);
    }

    /* The older checkpoint: its optimizer had taken t = 8 at step 8, so it
     * goes on from there; its scale, above 1, is taken as fp16's. */
    *w = (scale_watch){.dir = old.out_dir};
    memset(ovf_t, 0, sizeof ovf_t);
    ovf_done = 8;
    o = train_run(&old, fx_pool, k, 1, &h, &res);
    pool_job_forget(fx_pool, 1);
    if (o != TRAIN_DONE)
        fail_msg("%s", res.message);
    expect_adam_t(9, 12, (const int[]){9, 0, 10, 11});
    expect_meta(old.out_dir, "optimizer_steps", "11");
    expect_scale(w, 9, S / 2);
    expect_scale(w, 10, S / 4);
    expect_meta(old.out_dir, "loss_scale", "16384");
    expect_meta(old.out_dir, "precision", "fp16");
    scale_watch_free(w);
    free(w);
}

/* A job resumed in another precision.  fp32 to fp16: the checkpoint's scale
 * is 1 (an fp32 run does not scale), and fp16 starts at the initial scale
 * as a new fp16 job would, also from a checkpoint older than the
 * "precision" it holds.  fp16 to fp32: no scale, and fp32's metrics lines
 * without loss_scale. */
static void test_fp16_resume_across_precisions(void **state)
{
    (void)state;
    const double S = TRAIN_LOSS_SCALE_INIT;
    job_config j;
    train_result res;
    make_job(&j, &oom_shape, "fp32to16", 8, 3);
    const kern_ops *k = overflow_at(0, 0);
    scale_watch *w = calloc(1, sizeof *w);
    *w = (scale_watch){.dir = j.out_dir};
    train_hooks h = {.on_step = scale_on_step, .user = w, .cpu_mixed_precision = true};
    ovf_done = 0;
    if (train_run(&j, fx_pool, k, 1, &h, &res) != TRAIN_DONE)
        fail_msg("%s", res.message);
    pool_job_forget(fx_pool, 1);
    expect_scale(w, 3, 1.0);
    expect_meta(j.out_dir, "precision", "fp32");
    expect_meta(j.out_dir, "loss_scale", "1");
    expect_meta(j.out_dir, "optimizer_steps", "3");
    job_config old = j;
    snprintf(old.out_dir, sizeof old.out_dir, "%s/fp32to16-old", fx_dir);
    char cmd[2 * PATH_MAX + 32];
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", old.out_dir, j.out_dir, old.out_dir);
    assert_int_equal(system(cmd), 0);
    fx_resume_set_meta(old.out_dir, "precision", NULL);

    /* Resumed as fp16, from the checkpoint and from its older twin. */
    const job_config *as16[2] = {&j, &old};
    for (int i = 0; i < 2; i++) {
        job_config r16 = *as16[i];
        r16.precision = JOBCFG_FP16;
        r16.steps = 6;
        *w = (scale_watch){.dir = r16.out_dir};
        ovf_done = 3;
        if (train_run(&r16, fx_pool, k, 1, &h, &res) != TRAIN_DONE)
            fail_msg("%s", res.message);
        pool_job_forget(fx_pool, 1);
        for (uint64_t s = 4; s <= 6; s++)
            expect_scale(w, s, S);
        expect_meta(r16.out_dir, "precision", "fp16");
        expect_meta(r16.out_dir, "loss_scale", "65536");
        expect_meta(r16.out_dir, "loss_scale_good_steps", "3");
        expect_meta(r16.out_dir, "optimizer_steps", "6");
        step_lines m;
        read_step_lines(r16.out_dir, &m);
        for (uint64_t s = 1; s <= 6; s++) {
            assert_true(m.seen[s]);
            /* The fp32 steps' lines have no scale; the fp16 ones do. */
            if (s <= 3)
                assert_true(isnan(m.scale[s]));
            else
                assert_true(m.scale[s] == S);
            assert_false(m.skipped[s]);
        }
        /* TensorBoard likewise (the directory holds both runs' files). */
        tb_scales tb;
        read_tb_scales(r16.out_dir, &tb);
        for (int s = 1; s <= 6; s++)
            assert_true(s <= 3 ? isnan(tb.scale[s]) : tb.scale[s] == S);
    }

    /* And back: the fp16 checkpoint (scale 65536) resumed as fp32 runs
     * unscaled. */
    j.steps = 8;
    *w = (scale_watch){.dir = j.out_dir};
    ovf_done = 6;
    if (train_run(&j, fx_pool, k, 1, &h, &res) != TRAIN_DONE)
        fail_msg("%s", res.message);
    pool_job_forget(fx_pool, 1);
    expect_scale(w, 7, 1.0);
    expect_scale(w, 8, 1.0);
    expect_meta(j.out_dir, "precision", "fp32");
    expect_meta(j.out_dir, "loss_scale", "1");
    step_lines m;
    read_step_lines(j.out_dir, &m);
    assert_true(m.seen[7] && isnan(m.scale[7]) && !m.skipped[7]);
    assert_true(m.seen[8] && isnan(m.scale[8]) && !m.skipped[8]);
    free(w);
}

/* The doubling: TRAIN_LOSS_SCALE_GROW_EVERY good steps after an overflow at
 * step 2 the scale doubles — at step 2 + 2000 exactly, although the run
 * was stopped and resumed in between (the count of good steps is in the
 * resume state).  A tiny MLP at 4 × 2, so the 2004 steps take little time. */
static void test_fp16_scale_doubles(void **state)
{
    (void)state;
    const double S = TRAIN_LOSS_SCALE_INIT;
    const uint64_t grow = TRAIN_LOSS_SCALE_GROW_EVERY, last = 2 + grow + 2;
    shape mlp = {"mlp 64-256-128-10", true, 0, 0, 0, 0, 8};
    job_config j;
    train_result res;
    make_job(&j, &mlp, "fp16grow", 4, last);
    j.precision = JOBCFG_FP16;
    const kern_ops *k = overflow_at(2, 0);
    scale_watch *w = calloc(1, sizeof *w);
    *w = (scale_watch){.x = {.stop_after = 1000}, .dir = j.out_dir};
    train_hooks h = {.on_step = scale_on_step, .should_stop = press, .user = w,
                     .cpu_mixed_precision = true};
    ovf_done = 0;
    assert_int_equal(train_run(&j, fx_pool, k, 1, &h, &res), TRAIN_STOPPED);
    pool_job_forget(fx_pool, 1);
    assert_int_equal(res.steps_done, 1000);
    expect_meta(j.out_dir, "loss_scale", "32768");
    expect_meta(j.out_dir, "loss_scale_good_steps", "998");

    w->x.stop_after = 0;
    if (train_run(&j, fx_pool, k, 1, &h, &res) != TRAIN_DONE)
        fail_msg("%s", res.message);
    pool_job_forget(fx_pool, 1);
    assert_int_equal(res.steps_done, last);
    expect_scale(w, 1, S);
    expect_scale(w, 2, S / 2);
    expect_scale(w, 1 + grow, S / 2);
    expect_scale(w, 2 + grow, S);
    expect_scale(w, last, S);
    expect_meta(j.out_dir, "loss_scale", "65536");
    expect_meta(j.out_dir, "loss_scale_good_steps", "2");
    scale_watch_free(w);
    free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp16_scale_across_oom_and_resume),
        cmocka_unit_test(test_fp16_scale_doubles),
        cmocka_unit_test(test_fp16_resume_across_precisions),
    };
    return cmocka_run_group_tests(tests, batch_fx_setup, batch_fx_teardown);
}
