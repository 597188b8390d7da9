/* test_batch_recompute.c — [memory] recompute in the real engine, under a
 * [memory] limit that micro-batch 1 of a GPT fits with activation
 * recomputation and not without: off fails the job as before, auto turns
 * recompute on and completes, saying so (the batch change's reason, the
 * progress), and a resumed run starts with it on instead of running out of
 * memory again. */
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
#include "batch_fx.h"

/* Deep and long enough that the activations recompute drops (7 of 8
 * blocks' at T = 128) are megabytes, well above the workspace's and the
 * fit's slack. */
static const shape deep = {"gpt L8 C64 T128", false, 8, 4, 64, 128, 4};

/* The job's peak at micro-batch 1 as the controller fitted it, with
 * recompute on or off and no limit. */
static double peak1(int recompute)
{
    job_config j;
    train_result res;
    make_job(&j, &deep, "peak", 0, 1);
    j.recompute = recompute;
    j.tune = false;
    if (run(&j, NULL, &res) != TRAIN_DONE)
        fail_msg("%s", res.message);
    return res.peak_fixed + res.peak_per_sample;
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
    assert_true(metrics_has(j.out_dir, "\"reason\":\"recompute\""));
    expect_meta(j.out_dir, "recompute", "1");
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
    assert_int_equal(res.oom_recoveries, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_off_fails),
        cmocka_unit_test(test_auto_turns_on),
        cmocka_unit_test(test_resume_keeps_it),
        cmocka_unit_test(test_on_from_start),
    };
    return cmocka_run_group_tests(tests, batch_fx_setup, batch_fx_teardown);
}
