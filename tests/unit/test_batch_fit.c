/* test_batch_fit.c — the batch controller in the real engine on the
 * simulated cpu device, finding the micro-batch that fits: probes against
 * an exhaustive search, the budget beside another job counted by its need,
 * tuning's decision in the progress report and metrics, a resumed job
 * keeping its fit and tuned size, and a validation subset of held-out data
 * (which needs this fixture's image data). */
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
#include "engine/train.h"
#include "batch_fx.h"

/* ---- probes against an exhaustive search ------------------------------------------- */

/* Does a fixed micro-batch n run one step under the limit without an OOM? */
static bool fits(const shape *s, uint32_t n, size_t limit)
{
    job_config j;
    train_result res;
    make_job(&j, s, "exhaustive", n, 1);
    j.mem_limit = limit;
    return run(&j, NULL, &res) == TRAIN_DONE && res.oom_recoveries == 0 && res.micro == n;
}

static void probes_within_10_percent(const shape *s)
{
    job_config j;
    train_result res;
    /* The limit: room for about 60% of the batch by the engine's estimate,
     * which knows nothing of the workspace — the probes must measure it. */
    make_job(&j, s, "estimate", 1, 1);
    assert_int_equal(run(&j, NULL, &res), TRAIN_DONE);
    size_t limit = res.persistent_bytes + res.act_fixed + res.act_per_sample * (s->batch * 6 / 10) + WS_FIXED;

    uint32_t truth = 0;
    for (uint32_t n = 1; n <= s->batch; n++)
        if (fits(s, n, limit))
            truth = n;
    assert_true(truth >= 2 && truth < s->batch);

    make_job(&j, s, "auto", 0, 1);
    j.mem_limit = limit;
    if (run(&j, NULL, &res) != TRAIN_DONE)
        fail_msg("%s: %s", s->name, res.message);
    printf("%s: true max %u, auto %u after %u probes (limit %zu, peak %.0f + %.0f n)\n", s->name, truth,
           res.micro_fit, res.probes, limit, res.peak_fixed, res.peak_per_sample);
    assert_true(res.probes <= BATCH_MAX_PROBES);
    assert_true(res.micro_fit <= truth);
    assert_true(res.micro_fit * 10 >= truth * 9);
    assert_int_equal(res.oom_recoveries, 0);
}

static void test_probes_mlp(void **state)
{
    (void)state;
    shape s = {"mlp 64-256-128-10", true, 0, 0, 0, 0, 48};
    probes_within_10_percent(&s);
}

static void test_probes_gpt_small(void **state)
{
    (void)state;
    shape s = {"gpt L2 C32 T16", false, 2, 2, 32, 16, 32};
    probes_within_10_percent(&s);
}

static void test_probes_gpt_wide(void **state)
{
    (void)state;
    shape s = {"gpt L1 C64 T32", false, 1, 4, 64, 32, 24};
    probes_within_10_percent(&s);
}

/* ---- another job on the device: its need, not its all-time peak ---------------------- */

/* Job 77 once peaked at most of the device (its probes, say) and now holds
 * 1 MiB.  Counted by that peak it leaves the job a few MiB; by the need it
 * declared for the size it runs now, nearly all of it. */
static void test_budget_counts_others_need(void **state)
{
    (void)state;
    shape s = {"gpt L2 C32 T16", false, 2, 2, 32, 16, 32};
    job_config j;
    train_result res;
    make_job(&j, &s, "estimate", 1, 1);
    assert_int_equal(run(&j, NULL, &res), TRAIN_DONE);
    size_t one = res.persistent_bytes + res.act_fixed + res.act_per_sample + WS_FIXED;

    size_t cap = (size_t)256 << 20, peak = cap - one - res.act_per_sample * 8;
    void *big = pool_alloc(fx_pool, peak, POOL_TAG_ACTIVATIONS, 77, NULL);
    assert_non_null(big);
    pool_free(fx_pool, big);
    pool_trim(fx_pool, POOL_TRIM_REQUEST, 0);
    void *held = pool_alloc(fx_pool, (size_t)1 << 20, POOL_TAG_ACTIVATIONS, 77, NULL);
    assert_non_null(held);

    make_job(&j, &s, "by-peak", 0, 1);
    j.tune = false;
    assert_int_equal(run(&j, NULL, &res), TRAIN_DONE);
    uint32_t by_peak = res.micro_fit;

    assert_int_equal(pool_job_set_need(fx_pool, 77, (size_t)1 << 20), 0);
    pool_stats st;
    pool_stats_read(fx_pool, &st);
    bool seen = false;
    for (size_t i = 0; i < st.njobs; i++)
        if (st.jobs[i].job == 77) {
            seen = true;
            assert_int_equal(st.jobs[i].need, (size_t)1 << 20);
            assert_true(st.jobs[i].peak >= (int64_t)peak);
        }
    assert_true(seen);
    make_job(&j, &s, "by-need", 0, 1);
    j.tune = false;
    assert_int_equal(run(&j, NULL, &res), TRAIN_DONE);
    printf("micro-batch fit beside a job that peaked at %zu MiB and needs 1 MiB: %u by its peak, %u by its need\n",
           peak >> 20, by_peak, res.micro_fit);
    assert_true(by_peak < s.batch / 2);
    assert_int_equal(res.micro_fit, s.batch);

    pool_free(fx_pool, held);
    pool_job_forget(fx_pool, 77);
}

/* ---- tuning in the engine --------------------------------------------------------------- */

/* With tuning on (the default) the engine's step times reach the
 * controller, and its decision is visible in the progress report and in
 * metrics.jsonl.  Which size wins depends on this machine's timing, so
 * only that it is a candidate at or below the fit is checked. */
static void test_tuned_run_visible(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    make_job(&j, &oom_shape, "tuned", 0, 3 * BATCH_TUNE_MAX + 4);
    j.mem_limit = half_limit();
    j.margin = 0.05;
    /* Tuning alone: recompute = auto would time one more size after it,
     * and keep it or not by the clock (test_batch_recompute's). */
    j.recompute = JOBCFG_RECOMPUTE_OFF;
    assert_true(j.tune);
    pressure calm = {0};
    train_hooks h = {.on_step = watch, .user = &calm};
    if (run(&j, &h, &res) != TRAIN_DONE)
        fail_msg("%s", res.message);
    assert_true(metrics_has(j.out_dir, "\"reason\":\"tuned\""));
    assert_string_equal(calm.last.change_reason, "tuned");
    uint32_t cand[BATCH_TUNE_MAX];
    int nc = batch_tune_candidates(oom_shape.batch, res.micro_fit, cand, BATCH_TUNE_MAX);
    bool found = false;
    for (int i = 0; i < nc; i++)
        found |= cand[i] == res.micro;
    printf("tuned: fit %u, chose %u after %llu changes\n", res.micro_fit, res.micro,
           (unsigned long long)res.batch_changes);
    assert_true(found);
    assert_true(res.micro <= res.micro_fit);
    assert_int_equal(res.oom_recoveries, 0);
}

/* ---- resuming with micro_batch = auto ---------------------------------------------------- */

/* Run j for `first` steps and stop, then resume it to the end; each run's
 * progress into a and b. */
static void stop_and_resume(const job_config *j, uint64_t first, pressure *a, train_result *ra, pressure *b,
                            train_result *rb)
{
    *a = (pressure){.stop_after = first};
    train_hooks h = {.on_step = watch, .should_stop = press, .user = a};
    if (run(j, &h, ra) != TRAIN_STOPPED)
        fail_msg("the first run did not stop: %s", ra->message);
    assert_int_equal(ra->steps_done, first);
    *b = (pressure){0};
    h.user = b;
    if (run(j, &h, rb) != TRAIN_DONE)
        fail_msg("the resumed run: %s", rb->message);
    assert_int_equal(rb->steps_done, j->steps);
}

static void expect_meta_u(const char *dir, const char *key, unsigned want)
{
    char s[32];
    snprintf(s, sizeof s, "%u", want);
    expect_meta(dir, key, s);
}

/* A resumed job starts at the size its first run found, verified by one
 * probe; under another [memory] limit it searches as a new job does. */
static void test_resume_keeps_fit(void **state)
{
    (void)state;
    const size_t limit = half_limit();
    job_config j;
    train_result r1, r2;
    pressure a, b;
    make_job(&j, &oom_shape, "resume-fit", 0, 10);
    j.mem_limit = limit;
    j.margin = 0.05;
    j.tune = false;
    stop_and_resume(&j, 4, &a, &r1, &b, &r2);
    const uint32_t fit = r1.micro_fit;
    printf("resume: fit %u after %u probes; resumed at %u after %u\n", fit, r1.probes, b.micro[5], r2.probes);
    assert_true(r1.probes >= 2);
    assert_int_equal(r1.micro, fit);
    expect_meta_u(j.out_dir, "micro_fit", fit);
    expect_meta_u(j.out_dir, "micro_tuned", 0);
    assert_int_equal(r2.probes, 1);
    assert_int_equal(r2.micro_fit, fit);
    for (int s = 5; s <= 10; s++)
        assert_int_equal(b.micro[s], fit);
    assert_int_equal(r2.batch_changes, 1);
    assert_string_equal(b.last.change_reason, "fit");
    assert_int_equal(r2.oom_recoveries, 0);

    /* A larger limit: what the first run found no longer says what fits,
     * and the resumed job probes exactly as a new job under that limit. */
    const size_t limit2 = limit + limit / 8;
    job_config fresh;
    train_result r3, r4;
    make_job(&fresh, &oom_shape, "resume-fresh", 0, 1);
    fresh.mem_limit = limit2;
    fresh.margin = 0.05;
    fresh.tune = false;
    if (run(&fresh, NULL, &r3) != TRAIN_DONE)
        fail_msg("%s", r3.message);
    j.mem_limit = limit2;
    j.steps = 12;
    if (run(&j, NULL, &r4) != TRAIN_DONE)
        fail_msg("%s", r4.message);
    printf("resume under limit %zu: fit %u after %u probes (a new job: %u after %u)\n", limit2, r4.micro_fit,
           r4.probes, r3.micro_fit, r3.probes);
    assert_true(r4.probes >= 2);
    assert_int_equal(r4.probes, r3.probes);
    assert_int_equal(r4.micro_fit, r3.micro_fit);
    assert_true(r4.micro_fit > fit);
}

/* With tuning on, a job resumed after tuning ended runs the tuned size
 * from its first step: one probe, no second search, no change after. */
static void test_resume_keeps_tuned(void **state)
{
    (void)state;
    job_config j;
    train_result r1, r2;
    pressure a, b;
    const uint64_t first = 3 * BATCH_TUNE_MAX + 4;
    make_job(&j, &oom_shape, "resume-tuned", 0, first + 8);
    j.mem_limit = half_limit();
    j.margin = 0.05;
    j.recompute = JOBCFG_RECOMPUTE_OFF; /* as test_tuned_run_visible */
    assert_true(j.tune);
    stop_and_resume(&j, first, &a, &r1, &b, &r2);
    const uint32_t tuned = r1.micro;
    printf("resume: fit %u, tuned %u; resumed at %u after %u probe(s)\n", r1.micro_fit, tuned, b.micro[first + 1],
           r2.probes);
    assert_string_equal(a.last.change_reason, "tuned");
    expect_meta_u(j.out_dir, "micro_tuned", tuned);
    assert_int_equal(r2.probes, 1);
    assert_int_equal(r2.micro_fit, r1.micro_fit);
    for (uint64_t s = first + 1; s <= first + 8; s++)
        assert_int_equal(b.micro[s], tuned);
    assert_int_equal(r2.batch_changes, 1);
    assert_string_equal(b.last.change_reason, "tuned");
}

/* val_subset limits a held-out validation set as it does a val file. */
static void test_val_subset_of_held_out(void **state)
{
    (void)state;
    shape mlp = {"mlp 64-256-128-10", true, 0, 0, 0, 0, 8};
    job_config j;
    train_result res;
    make_job(&j, &mlp, "valsub", 8, 1);
    j.val_fraction = 0.1; /* 51 of the 512 images */
    j.val_subset = 7;
    j.eval_batches = 0;
    if (run(&j, NULL, &res) != TRAIN_DONE)
        fail_msg("%s", res.message);
    char path[600], line[512];
    snprintf(path, sizeof path, "%s/metrics.jsonl", j.out_dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    bool seen = false;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "\"val_samples\"")) {
            if (!strstr(line, "\"val_samples\":7}"))
                fail_msg("validation line '%s'", line);
            seen = true;
        }
    fclose(f);
    assert_true(seen);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_counts_others_need),
        cmocka_unit_test(test_probes_mlp),
        cmocka_unit_test(test_probes_gpt_small),
        cmocka_unit_test(test_probes_gpt_wide),
        cmocka_unit_test(test_tuned_run_visible),
        cmocka_unit_test(test_resume_keeps_fit),
        cmocka_unit_test(test_resume_keeps_tuned),
        cmocka_unit_test(test_val_subset_of_held_out),
    };
    return cmocka_run_group_tests(tests, batch_fx_setup, batch_fx_teardown);
}
