/* test_train.c — the training engine on the simulated cpu device:
 * accumulation equivalence, bitwise resume, memory tags, and learning. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "pool/dev.h"
#include "fixture.h"
#include "jobcfg.h"
#include "kernels.h"
#include "pool/pool.h"
#include "io/safetensors.h"
#include "engine/train.h"

static int setup(void **state)
{
    (void)state;
    /* A small text corpus: every run below reads the same bytes. */
    if (fx_setup("train", (size_t)1 << 30, NULL) != 0 || fx_write_corpus() != 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return fx_teardown();
}

/* A tiny GPT job over the corpus, writing to fx_dir/NAME. */
static void tiny_gpt(job_config *j, const char *name, uint32_t micro, uint64_t steps)
{
    fx_job(j, name);
    fx_gpt(j, 2, 2, 32, 16);
    j->steps = steps;
    j->batch = 16;
    j->micro_batch = micro;
    j->lr = 3e-3;
    j->weight_decay = 0.1;
    j->threads = 2;
    j->eval_batches = 2;
}

static void run_ok(const job_config *j, train_result *res, const train_hooks *h)
{
    if (train_run(j, fx_pool, kern_cpu_ops(), 1, h, res) != TRAIN_DONE)
        fail_msg("train_run: %s", res->message);
}

/* The checkpointed parameters of two output directories are bitwise equal. */
static void same_params(const char *d1, const char *d2)
{
    size_t n1, n2;
    float *a = fx_read_resume(d1, "params", &n1), *b = fx_read_resume(d2, "params", &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1 * sizeof(float));
    free(a);
    free(b);
}

/* ---- accumulation: 16×1 = 4×4 = 5+5+5+1 ---------------------------------------- */

static void test_accumulation_equivalence(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    static const uint32_t micros[] = {16, 4, 5};
    char ref_dir[128] = "";
    double ref_val = 0;
    for (size_t i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "accum%u", micros[i]);
        tiny_gpt(&j, name, micros[i], 5);
        run_ok(&j, &res, NULL);
        assert_int_equal(res.micro, micros[i]);
        if (!ref_dir[0]) {
            snprintf(ref_dir, sizeof ref_dir, "%s", j.out_dir);
            ref_val = res.val_loss;
            continue;
        }
        /* Validation covers eval_batches × batch samples whatever the
         * micro-batch: the same loss, up to the parameters' reassociation
         * noise.  (It counted micro-batches: 2 × 4 samples against 2 × 16.) */
        if (fabs(res.val_loss - ref_val) > 1e-5 * ref_val)
            fail_msg("micro %u: val loss %.9g, micro 16: %.9g", micros[i], res.val_loss, ref_val);
        /* The same update up to reassociation of the gradient sums over
         * the batch: per tensor, ||Δ|| / ||p|| <= 1e-5 (issue 4's
         * tolerance).  Element-wise it is looser: Adam divides by sqrt(v),
         * so a near-zero gradient's rounding noise moves its parameter by a
         * visible fraction of lr. */
        char which[64] = "";
        double worst = fx_worst_tensor_diff(j.out_dir, ref_dir, which, sizeof which);
        if (worst > 1e-5)
            fail_msg("micro %u differs from micro 16 by relative %.3g in %s", micros[i], worst, which);
    }
}

/* ---- resume: bitwise equal to an uninterrupted run ---------------------------- */

static void test_resume_bitwise(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    fx_stopper full = {0}, part = {.stop_after = 4};
    train_hooks hf = {.on_step = fx_record, .user = &full}, hp = {.on_step = fx_record, .should_stop = fx_stop_now, .user = &part};

    tiny_gpt(&j, "full", 5, 9);
    j.checkpoint_every = 3;
    run_ok(&j, &res, &hf);

    tiny_gpt(&j, "parts", 5, 9);
    j.checkpoint_every = 3;
    assert_int_equal(train_run(&j, fx_pool, kern_cpu_ops(), 1, &hp, &res), TRAIN_STOPPED);
    assert_int_equal(res.steps_done, 4);
    /* The stop checkpoint holds step 4; the second run picks it up. */
    part.stop_after = 0;
    run_ok(&j, &res, &hp);
    assert_int_equal(res.steps_done, 9);
    for (int s = 1; s <= 9; s++)
        if (memcmp(&full.losses[s], &part.losses[s], sizeof(double)) != 0)
            fail_msg("step %d: loss %.17g uninterrupted, %.17g resumed", s, full.losses[s], part.losses[s]);

    char d1[128], d2[128];
    snprintf(d1, sizeof d1, "%s/full", fx_dir);
    snprintf(d2, sizeof d2, "%s/parts", fx_dir);
    same_params(d1, d2);

    /* metrics.jsonl has each step once, in order, after the resume. */
    char path[160], line[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", d2);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    unsigned long long last = 0;
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, "val_loss"))
            continue;
        unsigned long long st = strtoull(strstr(line, "\"step\":") + 7, NULL, 10);
        assert_int_equal(st, last + 1);
        last = st;
    }
    fclose(f);
    assert_int_equal(last, 9);
}

/* ---- polls between layers: a stop inside a micro-batch or an evaluation ------------ */

/* Counts train_hooks.poll calls; once step `after` is reported, the k-th
 * poll after that returns true. */
typedef struct {
    fx_stopper rec;
    uint64_t polls, base, after;
    uint64_t k;
    bool armed;
    uint64_t at_step[16]; /* polls done when step s was reported */
} poller;

static bool count_poll(void *user)
{
    poller *p = user;
    p->polls++;
    return p->armed && p->k && p->polls - p->base == p->k;
}

static void poll_step(void *user, const train_progress *pr)
{
    poller *p = user;
    fx_record(&p->rec, pr);
    if (pr->step < 16)
        p->at_step[pr->step] = p->polls;
    if (pr->step == p->after) {
        p->armed = true;
        p->base = p->polls;
    }
}

static bool metrics_line(const char *dir, const char *needle)
{
    char path[160], line[1024];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", fx_dir, dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

static void test_poll_stops_inside_micro_batch(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    poller full = {0};
    train_hooks hf = {.on_step = poll_step, .poll = count_poll, .user = &full};
    tiny_gpt(&j, "pfull", 16, 9);
    j.eval_every = 3;
    run_ok(&j, &res, &hf);
    /* One micro-batch per step, polled between its layers (2 layers and
     * the output layer, forward and backward): a micro-batch that takes
     * minutes still shows signs of life. */
    uint64_t train_polls = full.at_step[5] - full.at_step[4];
    assert_int_equal(train_polls, 6);
    assert_true(full.at_step[6] - full.at_step[5] > train_polls); /* step 6 evaluates too */

    /* A stop at the third poll of step 5: in the middle of its only
     * micro-batch.  Nothing is polled after it and the step is not applied. */
    poller part = {.after = 4, .k = 3};
    train_hooks hp = {.on_step = poll_step, .poll = count_poll, .user = &part};
    tiny_gpt(&j, "ppart", 16, 9);
    j.eval_every = 3;
    assert_int_equal(train_run(&j, fx_pool, kern_cpu_ops(), 1, &hp, &res), TRAIN_STOPPED);
    assert_int_equal(res.steps_done, 4);
    assert_int_equal(part.polls - part.base, 3);

    /* Resumed; then a stop in the evaluation after step 6 (its second
     * poll): the step stands, its validation is not reported. */
    part = (poller){.after = 5, .k = train_polls + 2};
    assert_int_equal(train_run(&j, fx_pool, kern_cpu_ops(), 1, &hp, &res), TRAIN_STOPPED);
    assert_int_equal(res.steps_done, 6);
    assert_false(metrics_line("ppart", "{\"step\":6,\"val_loss\""));
    assert_true(metrics_line("ppart", "{\"step\":3,\"val_loss\""));

    /* The rest: every loss and the parameters bitwise as uninterrupted. */
    part = (poller){0};
    run_ok(&j, &res, &hp);
    assert_int_equal(res.steps_done, 9);
    for (int s = 7; s <= 9; s++)
        if (memcmp(&full.rec.losses[s], &part.rec.losses[s], sizeof(double)) != 0)
            fail_msg("step %d: loss %.17g uninterrupted, %.17g after two stops", s, full.rec.losses[s],
                     part.rec.losses[s]);
    assert_true(metrics_line("ppart", "{\"step\":9,\"val_loss\""));
    char d1[128], d2[128];
    snprintf(d1, sizeof d1, "%s/pfull", fx_dir);
    snprintf(d2, sizeof d2, "%s/ppart", fx_dir);
    same_params(d1, d2);
}

/* ---- divergence: a clear failure with what led there ------------------------------ */

static void test_divergence_reported(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    /* Adam moves every weight by about lr a step: at 1e3 the logits
     * overflow within a few steps. */
    tiny_gpt(&j, "diverge", 16, 20);
    j.lr = 1e3;
    j.warmup = 0;
    j.grad_clip = 0;
    j.checkpoint_every = 1;
    assert_int_equal(train_run(&j, fx_pool, kern_cpu_ops(), 1, NULL, &res), TRAIN_FAILED);
    printf("%s\n", res.message);
    unsigned long long at = 0, before = 0;
    const char *p = strstr(res.message, "the training loss became ");
    assert_non_null(p);
    p = strstr(p, " at step ");
    assert_non_null(p);
    at = strtoull(p + 9, NULL, 10);
    assert_true(at >= 2 && at < 20);
    p = strstr(res.message, "(step ");
    assert_non_null(p);
    before = strtoull(p + 6, NULL, 10);
    assert_int_equal(before, at - 1);
    const char *want[] = {"gradient norm", "lower [train] lr (now 1000)", "raise [train] warmup (now 0)",
                          "set [train] grad_clip", "the last checkpoint is kept"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(res.message, want[i]))
            fail_msg("the message lacks '%s': %s", want[i], res.message);
    /* Kept indeed: the last step that was finite. */
    char step[32], expect[32];
    snprintf(expect, sizeof expect, "%llu", before);
    assert_string_equal(fx_resume_meta(j.out_dir, "step", step, sizeof step), expect);
}

/* ---- a failed checkpoint write leaves the previous one usable ---------------------- */

static uint64_t fail_at_step;

static void inject(void *user, st_writer *w, uint64_t step)
{
    (void)user;
    /* Fail after the header is on disk: the partial temp file must go,
     * and resume.safetensors must still be the previous checkpoint. */
    if (step == fail_at_step)
        st_writer_fail_at(w, ST_STAGE_WRITE, EIO);
}

static void test_checkpoint_failure_keeps_previous(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    tiny_gpt(&j, "ckref", 5, 6);
    j.checkpoint_every = 2;
    run_ok(&j, &res, NULL);

    tiny_gpt(&j, "ckfail", 5, 6);
    j.checkpoint_every = 2;
    fail_at_step = 4;
    train_hooks h = {.on_checkpoint = inject};
    assert_int_equal(train_run(&j, fx_pool, kern_cpu_ops(), 1, &h, &res), TRAIN_FAILED);
    assert_non_null(strstr(res.message, "checkpoint failed (the previous one is intact)"));
    assert_non_null(strstr(res.message, "resume.safetensors"));

    /* The previous checkpoint (step 2) is intact and readable... */
    char step[32];
    assert_string_equal(fx_resume_meta(j.out_dir, "step", step, sizeof step), "2");
    /* ...no temporary file is left next to it... */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls -a %s | grep -q tmp", j.out_dir);
    assert_int_not_equal(system(cmd), 0);
    /* ...and resuming from it ends where an undisturbed run ends. */
    fail_at_step = 0;
    run_ok(&j, &res, NULL);
    char d1[128];
    snprintf(d1, sizeof d1, "%s/ckref", fx_dir);
    same_params(d1, j.out_dir);
}

/* ---- a checkpoint for another model is refused --------------------------------- */

static void test_resume_mismatch_refused(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    tiny_gpt(&j, "mismatch", 8, 2);
    run_ok(&j, &res, NULL);
    j.width = 64;
    j.steps = 4;
    assert_int_equal(train_run(&j, fx_pool, kern_cpu_ops(), 1, NULL, &res), TRAIN_FAILED);
    assert_non_null(strstr(res.message, "was written for 'gpt layers=2 heads=2 width=32"));
    assert_non_null(strstr(res.message, "use another [output] dir"));
}

/* ---- a checkpoint that cannot be continued is refused, and left as it was -------- */

static void expect_refused(const job_config *j, const char *want)
{
    train_result res;
    char step[32];
    assert_int_equal(train_run(j, fx_pool, kern_cpu_ops(), 1, NULL, &res), TRAIN_FAILED);
    if (!strstr(res.message, want))
        fail_msg("got '%s', want '%s'", res.message, want);
    assert_string_equal(fx_resume_meta(j->out_dir, "step", step, sizeof step), "2");
}

static void test_resume_guards(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    char path[700], want[800];
    tiny_gpt(&j, "guards", 8, 2);
    run_ok(&j, &res, NULL);
    j.steps = 4;

    /* The data position indexes an order the seed shuffles over the data. */
    j.seed++;
    snprintf(want, sizeof want, "was written with [train] seed %llu but the job has %llu",
             (unsigned long long)j.seed - 1, (unsigned long long)j.seed);
    expect_refused(&j, want);
    j.seed--;
    snprintf(path, sizeof path, "%s/half.txt", fx_dir);
    FILE *f = fopen(path, "w");
    for (int i = 0; i < 200; i++)
        fprintf(f, "the quick brown fox %d jumps over the lazy dog; pack my box with five dozen jugs.\n", i % 17);
    fclose(f);
    char train[sizeof j.train];
    memcpy(train, j.train, sizeof train);
    snprintf(j.train, sizeof j.train, "%s", path);
    expect_refused(&j, "training samples per epoch, but [data] now gives");
    memcpy(j.train, train, sizeof train);

    /* Files a checkpoint killed before its rename left are removed; others
     * that only look alike stay. */
    const char *stale[] = {"resume.safetensors.tmp.99999", "model.safetensors.tmp.7"},
               *kept[] = {"resume.safetensors.tmp.x7", "resume.safetensors.tmp.", "other.tmp.5"};
    for (size_t i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "%s/%s", j.out_dir, i < 2 ? stale[i] : kept[i - 2]);
        f = fopen(path, "w");
        fputs("partial", f);
        fclose(f);
    }
    run_ok(&j, &res, NULL);
    assert_int_equal(res.steps_done, 4);
    for (size_t i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "%s/%s", j.out_dir, i < 2 ? stale[i] : kept[i - 2]);
        assert_int_equal(access(path, F_OK) == 0, i >= 2);
    }

    /* Damage the tensors hold is refused, naming the tensor. */
    tiny_gpt(&j, "damaged", 8, 2);
    run_ok(&j, &res, NULL);
    j.steps = 4;
    fx_resume_poke(j.out_dir, "adam_v", 5, -1.0f);
    expect_refused(&j, "resume.safetensors: tensor adam_v holds -1 at index 5");
    fx_resume_poke(j.out_dir, "adam_v", 5, 0.0f);
    fx_resume_poke(j.out_dir, "params", 3, NAN);
    expect_refused(&j, "resume.safetensors: tensor params holds nan at index 3");
    /* strtoull would read "-1" as 2^64 - 1. */
    fx_resume_set_meta(j.out_dir, "seed", "-1");
    expect_refused(&j, "bad seed or epoch_size metadata");
}

/* A limit under what the model's lasting state takes: the report says how
 * much it takes and what to raise the limit to. */
static void test_limit_under_the_model(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    tiny_gpt(&j, "tiny-limit", 8, 2);
    j.mem_limit = 64 << 10;
    assert_int_equal(train_run(&j, fx_pool, kern_cpu_ops(), 1, NULL, &res), TRAIN_FAILED);
    pool_job_forget(fx_pool, 1); /* the limit goes with the job, as a worker's does */
    if (!strstr(res.message, "out of memory for the parameters") ||
        !strstr(res.message, "the parameters, gradients and optimizer state alone take") ||
        !strstr(res.message, "raise [memory] limit to at least"))
        fail_msg("got '%s'", res.message);
}

/* RLIMIT_FSIZE as small as `bytes` (with SIGXFSZ ignored, a write past it
 * fails with EFBIG), or back to `was`: a full disk for a run's files,
 * which must be regular (a link to /dev/full is refused as special). */
static void limit_file_size(struct rlimit *was, rlim_t bytes)
{
    struct rlimit lim;
    signal(SIGXFSZ, SIG_IGN);
    if (bytes) {
        assert_int_equal(getrlimit(RLIMIT_FSIZE, was), 0);
        lim = *was;
        lim.rlim_cur = bytes;
        assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    } else {
        assert_int_equal(setrlimit(RLIMIT_FSIZE, was), 0);
    }
}

/* A metrics write that fails (a full disk) stops the run, naming the
 * file, before any checkpoint could skip the lines lost. */
static void test_full_disk_stops_the_run(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    char path[700], ckpt[700];
    tiny_gpt(&j, "fulldisk", 8, 4);
    j.checkpoint_every = 1;
    assert_int_equal(mkdir(j.out_dir, 0755), 0);
    snprintf(path, sizeof path, "%s/metrics.jsonl", j.out_dir);
    /* Room for the lock's note and TensorBoard's first events, not for
     * a metrics line. */
    struct rlimit was;
    limit_file_size(&was, 100);
    train_outcome o = train_run(&j, fx_pool, kern_cpu_ops(), 1, NULL, &res);
    limit_file_size(&was, 0);
    assert_int_equal(o, TRAIN_FAILED);
    char want[800];
    snprintf(want, sizeof want, "cannot write %s: %s", path, strerror(EFBIG));
    if (!strstr(res.message, want))
        fail_msg("got '%s'", res.message);
    snprintf(ckpt, sizeof ckpt, "%s/resume.safetensors", j.out_dir);
    assert_int_not_equal(access(ckpt, F_OK), 0);

    /* Resuming: the lines past the checkpoint go, and so does a last line
     * a crash cut short; a trim that cannot be written keeps the file. */
    unlink(path);
    tiny_gpt(&j, "fulldisk", 8, 2);
    j.checkpoint_every = 1;
    run_ok(&j, &res, NULL);
    FILE *f = fopen(path, "a");
    fputs("{\"step\":1,\"loss\":3.1", f); /* cut short */
    fclose(f);
    char tmp[720];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    j.steps = 4;
    limit_file_size(&was, 100); /* the two lines kept take more */
    o = train_run(&j, fx_pool, kern_cpu_ops(), 1, NULL, &res);
    limit_file_size(&was, 0);
    assert_int_equal(o, TRAIN_FAILED);
    assert_non_null(strstr(res.message, "cannot trim"));
    f = fopen(path, "r");
    char text[4096];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    assert_non_null(strstr(text, "{\"step\":1,\"loss\":3.1")); /* untouched */
    assert_int_not_equal(access(tmp, F_OK), 0);
    run_ok(&j, &res, NULL);
    f = fopen(path, "r");
    n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    assert_null(strstr(text, "\"loss\":3.1{"));
    assert_null(strstr(text, "\"loss\":3.1\n"));
    assert_int_equal(text[n - 1], '\n');
}

/* The deepest model a job file may ask for builds and trains (it was
 * refused at start, after submit had taken it). */
static void test_deepest_model(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    fx_job(&j, "deepest");
    fx_gpt(&j, JOBCFG_MAX_LAYERS, 1, 8, 8);
    j.steps = 1;
    j.batch = 2;
    j.micro_batch = 2;
    j.threads = 1;
    run_ok(&j, &res, NULL);
    assert_true(isfinite(res.final_loss));
}

/* A resumed run reports where it resumed before anything else, so a job
 * that then fails (here: its limit no longer fits micro-batch 1) shows the
 * step it had reached, not step 0. */
static void test_resume_reported_first(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    tiny_gpt(&j, "resumefail", 8, 4);
    run_ok(&j, &res, NULL);
    size_t persistent = res.persistent_bytes;
    j.steps = 8;
    j.mem_limit = persistent + 4096;
    fx_stopper rec = {0};
    train_hooks h = {.on_step = fx_record, .user = &rec};
    assert_int_equal(train_run(&j, fx_pool, kern_cpu_ops(), 1, &h, &res), TRAIN_FAILED);
    pool_job_forget(fx_pool, 1);
    assert_int_equal(rec.seen, 4);
    assert_true(rec.resumed);
    assert_true(isfinite(rec.losses[4]));
}

/* A job whose data is refused leaves no output directory. */
static void test_bad_data_leaves_nothing(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    tiny_gpt(&j, "nodata", 8, 2);
    snprintf(j.train, sizeof j.train, "%s/empty.txt", fx_dir);
    fclose(fopen(j.train, "w"));
    assert_int_equal(train_run(&j, fx_pool, kern_cpu_ops(), 1, NULL, &res), TRAIN_FAILED);
    assert_non_null(strstr(res.message, "empty.txt"));
    assert_int_not_equal(access(j.out_dir, F_OK), 0);
}

/* ---- one run per output directory ------------------------------------------------ */

static void test_out_dir_locked(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    tiny_gpt(&j, "locked", 8, 2);
    assert_int_equal(mkdir(j.out_dir, 0755), 0);
    char path[600], buf[64] = "";
    snprintf(path, sizeof path, "%s/.lock", j.out_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("pid 4242, job 9\n", f);
    fflush(f);
    assert_int_equal(flock(fileno(f), LOCK_EX | LOCK_NB), 0);

    /* Refused while held, naming the holder, with nothing written. */
    assert_int_equal(train_run(&j, fx_pool, kern_cpu_ops(), 1, NULL, &res), TRAIN_FAILED);
    char want[700];
    snprintf(want, sizeof want, "output directory %s is in use by another run (pid 4242, job 9)", j.out_dir);
    if (!strstr(res.message, want))
        fail_msg("got '%s'", res.message);
    snprintf(path, sizeof path, "%s/metrics.jsonl", j.out_dir);
    assert_int_not_equal(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/resume.safetensors", j.out_dir);
    assert_int_not_equal(access(path, F_OK), 0);

    /* Free once the holder lets go (a crashed holder's lock goes with it). */
    fclose(f);
    run_ok(&j, &res, NULL);
    snprintf(path, sizeof path, "%s/.lock", j.out_dir);
    f = fopen(path, "r");
    assert_non_null(f);
    assert_non_null(fgets(buf, sizeof buf, f));
    fclose(f);
    snprintf(want, sizeof want, "pid %ld, job 1\n", (long)getpid());
    assert_string_equal(buf, want);
}

/* ---- the pool sees the job's memory by tag ----------------------------------- */

typedef struct {
    pool_stats st;
    bool taken;
} snap;

static void take_stats(void *user, const train_progress *pr)
{
    (void)pr;
    snap *s = user;
    if (!s->taken)
        pool_stats_read(fx_pool, &s->st);
    s->taken = true;
}

static void test_memory_tags(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    static snap s;
    memset(&s, 0, sizeof s);
    train_hooks h = {.on_step = take_stats, .user = &s};
    tiny_gpt(&j, "tags", 8, 1);
    run_ok(&j, &res, &h);
    assert_true(s.taken);
    int64_t params = s.st.tag_current[POOL_TAG_PARAMS];
    assert_true(params > 0);
    assert_int_equal(s.st.tag_current[POOL_TAG_GRADS], params);
    assert_int_equal(s.st.tag_current[POOL_TAG_OPTIMIZER], 2 * params);
    /* Activations: within the model's estimate for micro 8 (rounded to 512). */
    int64_t acts = s.st.tag_current[POOL_TAG_ACTIVATIONS];
    assert_true(acts >= (int64_t)(res.act_fixed / 2 + res.act_per_sample * 8));
    assert_true(acts <= (int64_t)(res.act_fixed + res.act_per_sample * 8 + 512));
    assert_true(s.st.tag_current[POOL_TAG_DATA] > 0);
    /* And everything went back when the job ended. */
    pool_stats after;
    pool_stats_read(fx_pool, &after);
    assert_int_equal(after.allocated_bytes[POOL_ALL].current, 0);
}

/* ---- the pool's step-based trimming runs at step boundaries ------------------------- */

static void test_trim_every_steps(void **state)
{
    (void)state;
    pool_config pc;
    pool_config_default(&pc);
    pc.trim_every_steps = 2;
    /* Blocks of 16M and up are never split, so the job (whose buffers are
     * all smaller) leaves the cached 64M segment idle. */
    pc.max_split_size = 16u << 20;
    pool *tp;
    assert_int_equal(pool_create(fx_dev, &pc, &tp), 0);
    /* Something cached before the job, as another job would leave it. */
    pool_free(tp, pool_alloc(tp, 64u << 20, POOL_TAG_OTHER, 9, NULL));
    pool_stats st;
    pool_stats_read(tp, &st);
    assert_true(st.reserved_bytes[POOL_ALL].current >= 64 << 20);
    job_config j;
    train_result res;
    tiny_gpt(&j, "trimsteps", 8, 6);
    if (train_run(&j, tp, kern_cpu_ops(), 1, NULL, &res) != TRAIN_DONE)
        fail_msg("train_run: %s", res.message);
    pool_stats_read(tp, &st);
    /* The trim at step 2 gave the idle 64M back; later ones found nothing
     * to release and were skipped (a policy trim that cannot give anything
     * back does not run). */
    assert_int_equal(st.trims, 1);
    assert_true(st.trimmed_bytes >= 64u << 20);
    pool_destroy(tp);
}

/* ---- learning, sized for CI ---------------------------------------------------- */

static void test_gpt_learns_fortunes(void **state)
{
    (void)state;
    if (access("/usr/share/games/fortunes", R_OK) != 0)
        skip();
    job_config j;
    train_result res;
    tiny_gpt(&j, "fortunes", 16, 150);
    snprintf(j.train, sizeof j.train, "/usr/share/games/fortunes");
    j.layers = 2;
    j.width = 64;
    j.heads = 4;
    j.context = 64;
    j.lr = 3e-3;
    j.warmup = 10;
    j.val_fraction = 0.02;
    j.eval_batches = 8;
    run_ok(&j, &res, NULL);
    /* ln(256) = 5.55 is a uniform guess; byte-level text is ~2.5 after a
     * short run.  Well below: 3.0. */
    printf("fortunes: final loss %.3f, val loss %.3f\n", res.final_loss, res.val_loss);
    assert_true(res.val_loss < 3.0);
}

static void test_mlp_learns_fashion(void **state)
{
    (void)state;
    const char *dir = "/usr/share/datasets/fashion-mnist";
    char imgs[256];
    snprintf(imgs, sizeof imgs, "%s/train-images-idx3-ubyte.gz", dir);
    if (access(imgs, R_OK) != 0)
        skip();
    job_config j;
    train_result res;
    jobcfg_defaults(&j);
    snprintf(j.model, sizeof j.model, "mlp");
    j.nhidden = 1;
    j.hidden[0] = 128;
    snprintf(j.hidden_text, sizeof j.hidden_text, "128");
    j.format = JOBCFG_DATA_IDX;
    snprintf(j.train, sizeof j.train, "%s", imgs);
    snprintf(j.train_labels, sizeof j.train_labels, "%s/train-labels-idx1-ubyte.gz", dir);
    snprintf(j.val, sizeof j.val, "%s/t10k-images-idx3-ubyte.gz", dir);
    snprintf(j.val_labels, sizeof j.val_labels, "%s/t10k-labels-idx1-ubyte.gz", dir);
    j.subset = 12000;
    j.val_subset = 2000;
    j.steps = 300;
    j.batch = 64;
    j.micro_batch = 64;
    j.lr = 2e-3;
    j.threads = 2;
    snprintf(j.out_dir, sizeof j.out_dir, "%s/fashion", fx_dir);
    snprintf(j.source, sizeof j.source, "test");
    run_ok(&j, &res, NULL);
    printf("fashion-mnist: final loss %.3f, test accuracy %.2f%%\n", res.final_loss, res.val_accuracy * 100);
    assert_true(res.val_accuracy >= 0.80);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accumulation_equivalence),
        cmocka_unit_test(test_resume_bitwise),
        cmocka_unit_test(test_poll_stops_inside_micro_batch),
        cmocka_unit_test(test_divergence_reported),
        cmocka_unit_test(test_resume_mismatch_refused),
        cmocka_unit_test(test_resume_guards),
        cmocka_unit_test(test_bad_data_leaves_nothing),
        cmocka_unit_test(test_limit_under_the_model),
        cmocka_unit_test(test_deepest_model),
        cmocka_unit_test(test_resume_reported_first),
        cmocka_unit_test(test_full_disk_stops_the_run),
        cmocka_unit_test(test_checkpoint_failure_keeps_previous),
        cmocka_unit_test(test_out_dir_locked),
        cmocka_unit_test(test_memory_tags),
        cmocka_unit_test(test_trim_every_steps),
        cmocka_unit_test(test_gpt_learns_fortunes),
        cmocka_unit_test(test_mlp_learns_fashion),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
