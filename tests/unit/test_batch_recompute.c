/* test_batch_recompute.c — [memory] recompute in the real engine, under a
 * [memory] limit that micro-batch 1 of a GPT fits with activation
 * recomputation and not without: off fails the job as before, auto turns
 * recompute on and completes, saying so (the batch change's reason, the
 * progress), and a resumed run starts with it on instead of running out of
 * memory again.  And auto's second lever: under a limit where micro-batch 2
 * fits without recompute and 4 only with it, tuning times 4 with recompute
 * (forced step times say which is faster) and keeps recompute only if it
 * is faster; off never tries it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "fixture.h"
#include "jobcfg.h"
#include "engine/train.h"
#include "engine/batch.h"
#include "batch_fx.h"

/* Deep and long enough that the activations recompute drops (7 of 8
 * blocks' at T = 128) are megabytes, well above the workspace's and the
 * fit's slack. */
static const shape deep = {"gpt L8 C64 T128", false, 8, 4, 64, 128, 4};

/* The fitted line peak(n) = fixed + per × n of the deep GPT, with and
 * without recompute, fitted from probes with no limit. */
static void line(int recompute, double *fixed, double *per)
{
    job_config j;
    train_result res;
    make_job(&j, &deep, "line", 0, 1);
    j.recompute = recompute;
    j.tune = false;
    if (run(&j, NULL, &res) != TRAIN_DONE)
        fail_msg("%s", res.message);
    *fixed = res.peak_fixed;
    *per = res.peak_per_sample;
}

/* The job's peak at micro-batch 1 as the controller fitted it, with
 * recompute on or off and no limit. */
static double peak1(int recompute)
{
    double fixed, per;
    line(recompute, &fixed, &per);
    return fixed + per;
}

/* Halfway between the two peaks at micro-batch 1. */
static size_t tight_limit(void)
{
    static size_t limit;
    if (!limit) {
        double off = peak1(JOBCFG_RECOMPUTE_OFF), on = peak1(JOBCFG_RECOMPUTE_ON);
        print_message("peak at micro-batch 1: %.0f bytes without recompute, %.0f with\n", off, on);
        assert_true(on < 0.85 * off);
        limit = (size_t)((off + on) / 2);
    }
    return limit;
}

static void tight_job(job_config *j, const char *out, int recompute, uint64_t steps)
{
    make_job(j, &deep, out, 0, steps);
    j->mem_limit = tight_limit();
    j->margin = 0;
    j->tune = false;
    j->recompute = recompute;
    j->checkpoint_every = 2;
}

static void test_off_fails(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    tight_job(&j, "off", JOBCFG_RECOMPUTE_OFF, 4);
    assert_int_equal(run(&j, NULL, &res), TRAIN_FAILED);
    assert_non_null(strstr(res.message, "micro-batch 1"));
}

/* A tight job run to its end, watched: its last progress in *w. */
static void run_tight(job_config *j, const char *out, int recompute, uint64_t steps, pressure *w,
                      train_result *res)
{
    tight_job(j, out, recompute, steps);
    *w = (pressure){0};
    train_hooks h = {.on_step = watch, .user = w};
    if (run(j, &h, res) != TRAIN_DONE)
        fail_msg("%s", res->message);
    assert_int_equal(res->steps_done, steps);
}

static void test_auto_turns_on(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    pressure w;
    run_tight(&j, "auto", JOBCFG_RECOMPUTE_AUTO, 4, &w, &res);
    assert_true(w.last.recompute);
    assert_string_equal(w.last.change_reason, "recompute");
    assert_string_equal(w.last.levers, "recompute (micro-batch 1 did not fit)");
    assert_true(metrics_has(j.out_dir, "\"reason\":\"recompute\""));
    expect_meta(j.out_dir, "recompute", "1");
    expect_meta(j.out_dir, "recompute_why", "micro-batch 1 did not fit");
}

/* Stopped after step 2 and resumed: the resumed run has recompute on from
 * its start, so its first step fits at once (no OOM, no recompute
 * change), and it completes. */
static void test_resume_keeps_it(void **state)
{
    (void)state;
    job_config j;
    train_result ra, rb;
    tight_job(&j, "resume", JOBCFG_RECOMPUTE_AUTO, 4);
    pressure a = {.stop_after = 2};
    train_hooks h = {.on_step = watch, .should_stop = press, .user = &a};
    if (run(&j, &h, &ra) != TRAIN_STOPPED)
        fail_msg("the first run did not stop: %s", ra.message);
    expect_meta(j.out_dir, "recompute", "1");
    pressure b = {0};
    h.user = &b;
    if (run(&j, &h, &rb) != TRAIN_DONE)
        fail_msg("the resumed run: %s", rb.message);
    assert_int_equal(rb.steps_done, 4);
    assert_true(b.last.recompute);
    assert_int_equal(rb.oom_recoveries, 0);
    assert_string_not_equal(b.last.change_reason, "recompute");
    assert_string_equal(b.last.levers, "recompute (micro-batch 1 did not fit; kept on resume)");
}

/* on: the smaller activation estimate from the start. */
static void test_on_from_start(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    pressure w;
    run_tight(&j, "on", JOBCFG_RECOMPUTE_ON, 2, &w, &res);
    assert_true(w.last.recompute);
    assert_string_equal(w.last.levers, "recompute (on in the job file)");
    assert_int_equal(res.oom_recoveries, 0);
}

/* ---- recompute timed against tuning's choice ---- */

/* Micro-batch 2 fits without recompute and 3 does not; 4 (the batch) fits
 * with it. */
static size_t limit_for_2(void)
{
    static size_t limit;
    if (!limit) {
        double f_off, p_off, f_on, p_on;
        line(JOBCFG_RECOMPUTE_OFF, &f_off, &p_off);
        line(JOBCFG_RECOMPUTE_ON, &f_on, &p_on);
        limit = (size_t)(f_off + 2.5 * p_off);
        print_message("per sample %.0f bytes without recompute, %.0f with; limit %zu\n", p_off, p_on, limit);
        assert_true(f_on + 4 * p_on < 0.9 * (double)limit);
    }
    return limit;
}

/* The step times the controller sees: 1 s a step without recompute at any
 * size (tuning keeps the fitted size, 2), `with_s` with it. */
static struct {
    double with_s;
    int with_steps; /* steps timed with recompute on */
} clock_fx;

static double fake_seconds(void *user, uint32_t micro, bool recompute, double measured)
{
    (void)user, (void)micro, (void)measured;
    if (!recompute)
        return 1.0;
    clock_fx.with_steps++;
    return clock_fx.with_s;
}

/* Tuning (2 candidates × 3 steps), recompute's fit and its 3 timed steps,
 * and a few after. */
#define TRIAL_STEPS 12

static void run_trial(job_config *j, const char *out, int recompute, double with_s, pressure *w)
{
    train_result res;
    make_job(j, &deep, out, 0, TRIAL_STEPS);
    j->mem_limit = limit_for_2();
    j->margin = 0;
    j->tune = true;
    j->recompute = recompute;
    j->checkpoint_every = TRIAL_STEPS;
    clock_fx.with_s = with_s;
    clock_fx.with_steps = 0;
    *w = (pressure){0};
    train_hooks h = {.on_step = watch, .user = w, .step_seconds = fake_seconds};
    if (run(j, &h, &res) != TRAIN_DONE)
        fail_msg("%s", res.message);
    assert_int_equal(res.steps_done, TRIAL_STEPS);
}

/* 4 with recompute at 0.5 s a step: 8 samples/s against 4. */
static void test_trial_keeps_faster(void **state)
{
    (void)state;
    job_config j;
    pressure w;
    run_trial(&j, "faster", JOBCFG_RECOMPUTE_AUTO, 0.5, &w);
    /* Timed for the trial, then every step but the last with it on. */
    assert_int_equal(clock_fx.with_steps, TRIAL_STEPS - 1 - 2 * BATCH_TUNE_STEPS);
    assert_true(w.last.recompute);
    assert_int_equal(w.last.micro, 4);
    assert_string_equal(w.last.levers, "recompute (faster at micro-batch 4)");
    assert_true(metrics_has(j.out_dir, "\"from\":2,\"to\":4,\"reason\":\"tuning\""));
    assert_true(metrics_has(j.out_dir, "\"from\":2,\"to\":4,\"reason\":\"recompute\""));
    /* fit, tuning 1, tuned 2, tuning 4 (recompute's fit), recompute. */
    assert_int_equal(w.last.batch_changes, 5);
    assert_int_equal(w.last.oom_recoveries, 0);
    expect_meta(j.out_dir, "recompute", "1");
    expect_meta(j.out_dir, "recompute_why", "faster at micro-batch 4");

    /* Resumed for 2 more steps: at 4 with recompute from the start, no
     * trial again, and still saying why. */
    train_result res;
    pressure b = {0};
    j.steps = TRIAL_STEPS + 2;
    clock_fx.with_steps = 0;
    train_hooks h = {.on_step = watch, .user = &b, .step_seconds = fake_seconds};
    if (run(&j, &h, &res) != TRAIN_DONE)
        fail_msg("the resumed run: %s", res.message);
    assert_int_equal(res.steps_done, TRIAL_STEPS + 2);
    assert_true(b.last.recompute);
    assert_int_equal(b.last.micro, 4);
    assert_int_equal(res.oom_recoveries, 0);
    assert_string_equal(b.last.levers, "recompute (faster at micro-batch 4; kept on resume)");
}

/* 4 with recompute at 2.1 s a step: under 2 samples/s against 4; back to
 * 2 without it. */
static void test_trial_drops_slower(void **state)
{
    (void)state;
    job_config j;
    pressure w;
    run_trial(&j, "slower", JOBCFG_RECOMPUTE_AUTO, 2.1, &w);
    assert_int_equal(clock_fx.with_steps, BATCH_TUNE_STEPS);
    assert_false(w.last.recompute);
    assert_int_equal(w.last.micro, 2);
    assert_string_equal(w.last.levers, "");
    assert_true(metrics_has(j.out_dir, "\"from\":4,\"to\":2,\"reason\":\"tuned\""));
    assert_false(metrics_has(j.out_dir, "\"reason\":\"recompute\""));
    expect_meta(j.out_dir, "recompute", "0");
}

/* off: tuning alone, never a step with recompute, whatever it would gain. */
static void test_trial_never_when_off(void **state)
{
    (void)state;
    job_config j;
    pressure w;
    run_trial(&j, "never", JOBCFG_RECOMPUTE_OFF, 0.01, &w);
    assert_int_equal(clock_fx.with_steps, 0);
    assert_false(w.last.recompute);
    assert_int_equal(w.last.micro, 2);
    assert_false(metrics_has(j.out_dir, "\"to\":4"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_off_fails),
        cmocka_unit_test(test_auto_turns_on),
        cmocka_unit_test(test_resume_keeps_it),
        cmocka_unit_test(test_on_from_start),
        cmocka_unit_test(test_trial_keeps_faster),
        cmocka_unit_test(test_trial_drops_slower),
        cmocka_unit_test(test_trial_never_when_off),
    };
    return cmocka_run_group_tests(tests, batch_fx_setup, batch_fx_teardown);
}
