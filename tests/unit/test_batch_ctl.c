/* test_batch_ctl.c — the batch controller alone, as pure logic over the
 * peaks, budgets and step times a test feeds it: probing and predicting
 * the largest micro-batch that fits, shrinking under pressure or on an
 * OOM, growing back when memory returns, tuning for throughput with a
 * cost the test controls, and resuming an earlier run's sizes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/batch.h"

/* ---- the controller alone ------------------------------------------------------ */

static void test_controller_model(void **state)
{
    (void)state;
    /* A device whose true peak is 10M + 1M·n + a 3M bump the prior misses. */
    batch_ctl c;
    batch_init(&c, 256, 256, 0.05, 5);
    batch_prior(&c, 10 << 20, 1 << 20);
    size_t budget = 100u << 20;
    uint32_t n;
    while ((n = batch_probe_next(&c, budget)) != 0) {
        size_t peak = (13u << 20) + ((size_t)n << 20);
        batch_probe_result(&c, n, peak, true, budget);
    }
    uint32_t truth = (uint32_t)((0.95 * (100 << 20) - (13 << 20)) / (1 << 20));
    assert_true(c.probes <= BATCH_MAX_PROBES);
    assert_true(c.micro <= truth && c.micro >= truth * 9 / 10);
    assert_int_equal(batch_accum(256, c.micro), (256 + c.micro - 1) / c.micro);

    /* The budget halves: shrink before an OOM; it comes back: grow after 5. */
    batch_reason why;
    uint32_t before = c.micro;
    uint32_t m = batch_step_end(&c, 1, 50u << 20, 50u << 20, 0.01, &why);
    assert_int_equal(why, BATCH_REASON_PRESSURE);
    assert_true(m < before && batch_peak(&c, m) <= 50u << 20);
    for (uint64_t s = 2; s < 6; s++) {
        assert_int_equal(batch_step_end(&c, s, budget, budget, 0.01, &why), m);
        assert_int_equal(why, BATCH_REASON_NONE);
    }
    assert_int_equal(batch_step_end(&c, 6, budget, budget, 0.01, &why), before);
    assert_int_equal(why, BATCH_REASON_GROW);
    /* An OOM at an unchanged budget: the size was wrong; never back to it. */
    uint32_t after = batch_on_oom(&c, 7, budget, budget, 0);
    assert_true(after < before);
    assert_true(c.max_fit < before);
    /* Micro-batch 1 out of memory: nothing left to try. */
    batch_init(&c, 8, 1, 0, 0);
    assert_int_equal(batch_on_oom(&c, 1, 1, 1, 0), 0);
}

/* The budget counts the pool's free bytes, but they may lie in pieces
 * between another job's blocks: the verifying probe fails for want of one
 * block that large, and the probes are spent.  Without the largest block
 * the pool could give, the refitted line would choose a size just under
 * the failed one, whose block does not exist either. */
static void test_probe_largest_block(void **state)
{
    (void)state;
    /* peak(n) = 2M + 0.62M·n, budget 17M: the line's answer is about 24. */
    const size_t budget = 17u << 20;
    const double fixed = 2 << 20, per = 0.62 * (1 << 20);
    batch_ctl c;
    batch_init(&c, 32, 32, 0.05, 0);
    batch_prior(&c, (size_t)fixed, (size_t)per);
    uint32_t n, probes = 0, failed = 0;
    while ((n = batch_probe_next(&c, budget)) != 0) {
        probes++;
        size_t peak = (size_t)(fixed + per * n);
        if (n > 6) {
            /* The pool's largest block holds the activations of 19. */
            failed = n;
            batch_probe_largest(&c, 19);
            batch_probe_result(&c, n, (size_t)(fixed + per * n * 0.9), false, budget);
        } else {
            batch_probe_result(&c, n, peak, true, budget);
        }
    }
    assert_int_equal(probes, BATCH_MAX_PROBES);
    assert_true(failed > 19);
    assert_int_equal(c.micro, 19);
    assert_int_equal(c.max_fit, 19);
    /* Once probing is over the limit changes nothing. */
    batch_probe_largest(&c, 3);
    assert_int_equal(c.micro, 19);

    /* No limit known: the line decides, below the failed size. */
    batch_init(&c, 32, 32, 0.05, 0);
    batch_prior(&c, (size_t)fixed, (size_t)per);
    while ((n = batch_probe_next(&c, budget)) != 0) {
        if (n > 6) {
            batch_probe_largest(&c, UINT32_MAX);
            batch_probe_result(&c, n, (size_t)(fixed + per * n * 0.9), false, budget);
        } else {
            batch_probe_result(&c, n, (size_t)(fixed + per * n), true, budget);
        }
    }
    assert_true(c.micro > 19 && c.micro < failed);
}

/* The pool rounds: a large block keeps a leftover of up to 1 MiB, so the
 * peak measured at n lies up to 1 MiB above the line of what n requests,
 * by an amount that varies with n.  Two small probes can then see a slope
 * well under the truth.  Truth here: 2.86M + 921K·n + leftover(n). */
static size_t rounded_peak(uint32_t n)
{
    static const double left[] = {0.9, 0.1, 0.6, 0.3, 0.8, 0.0, 0.5, 0.2, 0.7, 0.4};
    return (size_t)(2.86 * (1 << 20) + 921.0 * 1024 * n + left[n % 10] * ((1 << 20) - 1));
}

static void test_controller_rounded_peaks(void **state)
{
    (void)state;
    const size_t cap = (size_t)(40.27 * (1 << 20));
    const double usable = 0.95 * (double)cap;
    /* The two small probes (4 and 9, leftovers 0.8M and 0.4M) lie on a
     * line too shallow by a tenth: it predicts a size over the cap.
     * Knowing what a sample requests, the prediction fits. */
    batch_ctl c;
    batch_init(&c, 64, 64, 0.05, 10);
    batch_prior(&c, (size_t)(2.86 * (1 << 20)), 921 * 1024);
    batch_min_per_sample(&c, 921 * 1024);
    for (int i = 0; i < 2; i++) {
        uint32_t n = batch_probe_next(&c, cap);
        assert_int_equal(n, i ? 9 : 4);
        batch_probe_result(&c, n, rounded_peak(n), true, cap);
    }
    uint32_t pred = batch_max_for(&c, usable);
    assert_true((double)rounded_peak(pred) <= usable);
    assert_true(pred >= 36); /* the truth under 95% of the cap is 38 */

    /* A line that thinks 42 fits, and 42 does not: the OOM's bound (what
     * the job held plus what it asked for) lifts the line there, and the
     * size goes down by what that says, not by half. */
    batch_init(&c, 64, 64, 0.05, 10);
    batch_prior(&c, (size_t)(3.7 * (1 << 20)), 838 * 1024);
    batch_probe_skip(&c, cap);
    c.micro = 42;
    assert_true(batch_max_for(&c, usable) >= 42);
    uint32_t next = batch_on_oom(&c, 0, cap, cap, (size_t)(2.86 * (1 << 20) + 921.0 * 1024 * 42));
    assert_true(next >= 36 && next < 42);
    assert_true(rounded_peak(next) <= cap);
}

static void fit_40(batch_ctl *c, bool tune, uint64_t grow_after);

/* Shrunk by pressure: growth waits for memory to come back, rather than
 * growing on the same reading and being shrunk again at the next step. */
static void test_pressure_shrink_waits_for_memory(void **state)
{
    (void)state;
    batch_ctl c;
    batch_reason why;
    fit_40(&c, false, 3);
    uint32_t m = batch_step_end(&c, 1, 40u << 20, 40u << 20, 1e-3, &why);
    assert_int_equal(why, BATCH_REASON_PRESSURE);
    assert_true(m < 40);
    /* The budget reads a little higher (the pool trimmed), but the memory
     * available did not come back. */
    for (uint64_t s = 2; s < 30; s++) {
        assert_int_equal(batch_step_end(&c, s, 44u << 20, 40u << 20, 1e-3, &why), m);
        assert_int_equal(why, BATCH_REASON_NONE);
    }
    /* It comes back: growth after grow_after steps. */
    uint32_t g = m;
    for (uint64_t s = 30; s < 40 && g == m; s++)
        g = batch_step_end(&c, s, 50u << 20, 50u << 20, 1e-3, &why);
    assert_int_equal(g, 40);
    assert_int_equal(why, BATCH_REASON_GROW);
}

/* ---- tuning for throughput, with a cost the test controls --------------------------- */

/* Seconds for one step of a 64-sample batch at micro-batch n: a fixed cost
 * per micro-batch (a launch, a pass over the weights) plus a cost per
 * sample that triples once a micro-batch's activations leave the cache —
 * past 16 samples here, as on a CPU; `cliff` 0 has no cliff (a GPU: larger
 * is faster).  The first step after a change also pays a large warm-up
 * cost, and every other step some noise, which tuning must see through. */
typedef struct {
    uint32_t cliff;
    uint32_t last_micro;
    uint64_t steps;
} cost_model;

static double step_cost(cost_model *m, uint32_t n)
{
    double per_sample = m->cliff && n > m->cliff ? 30e-6 : 10e-6;
    double t = batch_accum(64, n) * 0.2e-3 + 64 * per_sample;
    if (n != m->last_micro)
        t += 50e-3;
    else if (m->steps % 2)
        t *= 1.03;
    m->last_micro = n;
    m->steps++;
    return t;
}

/* A controller for a batch of 64 whose fit is 40 (peak 10M + 1M·n, budget
 * 50M), tuning as asked. */
static void fit_40(batch_ctl *c, bool tune, uint64_t grow_after)
{
    batch_init(c, 64, 64, 0, grow_after);
    batch_set_tune(c, tune);
    batch_prior(c, 10 << 20, 1 << 20);
    uint32_t n;
    while ((n = batch_probe_next(c, 50u << 20)) != 0)
        batch_probe_result(c, n, (10u << 20) + ((size_t)n << 20), true, 50u << 20);
    assert_int_equal(c->micro, 40);
    assert_int_equal(c->max_fit, 40);
}

/* Run steps until the tuner decides (at most `limit`); the sizes tried, in
 * order, into tried[], and how many steps it took. */
static uint64_t tune_until_done(batch_ctl *c, cost_model *m, size_t budget, uint32_t *tried, int *ntried,
                                uint64_t limit)
{
    batch_reason why;
    uint64_t s;
    *ntried = 0;
    tried[(*ntried)++] = c->micro;
    m->last_micro = c->micro + 1; /* the first step pays for the fit's allocation */
    for (s = 1; s <= limit; s++) {
        double t = step_cost(m, c->micro);
        batch_step_end(c, s, budget, budget, t, &why);
        if (why == BATCH_REASON_TUNING) {
            assert_true(*ntried < BATCH_TUNE_MAX);
            tried[(*ntried)++] = c->micro;
        }
        if (why == BATCH_REASON_TUNED)
            return s;
        assert_true(why == BATCH_REASON_NONE || why == BATCH_REASON_TUNING);
    }
    fail_msg("no tuning decision within %llu steps", (unsigned long long)limit);
    return 0;
}

static void test_tune_candidates(void **state)
{
    (void)state;
    uint32_t out[BATCH_TUNE_MAX];
    static const uint32_t c38[] = {38, 32, 16, 8, 4, 2, 1}, c20[] = {20, 16, 8, 4, 2, 1},
                          c64[] = {64, 32, 16, 8, 4, 2, 1}, c50[] = {50, 25, 13, 7, 4, 2, 1};
    assert_int_equal(batch_tune_candidates(64, 38, out, BATCH_TUNE_MAX), 7);
    assert_memory_equal(out, c38, sizeof c38);
    assert_int_equal(batch_tune_candidates(48, 20, out, BATCH_TUNE_MAX), 6);
    assert_memory_equal(out, c20, sizeof c20);
    assert_int_equal(batch_tune_candidates(64, 64, out, BATCH_TUNE_MAX), 7);
    assert_memory_equal(out, c64, sizeof c64);
    assert_int_equal(batch_tune_candidates(50, 50, out, BATCH_TUNE_MAX), 7);
    assert_memory_equal(out, c50, sizeof c50);
    assert_int_equal(batch_tune_candidates(64, 64, out, 3), 3);
    assert_int_equal(batch_tune_candidates(1, 1, out, BATCH_TUNE_MAX), 1);
    assert_int_equal(batch_tune_candidates(1 << 20, 1 << 20, out, BATCH_TUNE_MAX), BATCH_TUNE_MAX);
}

/* CPU-like: 40 (ragged: 40 + 24) and 32 are slow, 16 is the fastest, and
 * 8 and 4 are clearly slower, which ends the search before 2. */
static void test_tune_picks_fastest(void **state)
{
    (void)state;
    batch_ctl c;
    cost_model m = {.cliff = 16};
    uint32_t tried[BATCH_TUNE_MAX];
    int ntried;
    fit_40(&c, true, 3);
    uint64_t steps = tune_until_done(&c, &m, 50u << 20, tried, &ntried, 40);
    static const uint32_t want[] = {40, 32, 16, 8, 4};
    assert_int_equal(ntried, 2 + 1 + BATCH_TUNE_PATIENCE);
    assert_memory_equal(tried, want, sizeof want);
    /* Each candidate: BATCH_TUNE_WARM steps skipped, BATCH_TUNE_STEPS timed. */
    assert_int_equal(steps, (uint64_t)ntried * (BATCH_TUNE_WARM + BATCH_TUNE_STEPS));
    assert_int_equal(c.micro, 16);
    assert_int_equal(c.best, 16);
    assert_int_equal(c.last.from, 4);
    assert_int_equal(c.last.to, 16);
    assert_int_equal(c.last.reason, BATCH_REASON_TUNED);
    assert_string_equal(batch_reason_name(c.last.reason), "tuned");
    assert_string_equal(batch_reason_name(BATCH_REASON_TUNING), "tuning");
    /* The fit is still the fit: tuning chose below it. */
    assert_int_equal(c.max_fit, 40);

    /* Nothing changes while the budget stays. */
    batch_reason why;
    for (uint64_t s = steps + 1; s < steps + 10; s++) {
        assert_int_equal(batch_step_end(&c, s, 50u << 20, 50u << 20, step_cost(&m, c.micro), &why), 16);
        assert_int_equal(why, BATCH_REASON_NONE);
    }
    /* Pressure takes the budget under 16's need, then leaves: growth goes
     * back to the tuned 16 after grow_after steps, not to the fit's 40. */
    uint64_t s = steps + 10;
    uint32_t n = batch_step_end(&c, s++, 20u << 20, 20u << 20, 1e-3, &why);
    assert_int_equal(why, BATCH_REASON_PRESSURE);
    assert_true(n < 16);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(batch_step_end(&c, s++, 50u << 20, 50u << 20, 1e-3, &why), n);
        assert_int_equal(why, BATCH_REASON_NONE);
    }
    assert_int_equal(batch_step_end(&c, s++, 50u << 20, 50u << 20, 1e-3, &why), 16);
    assert_int_equal(why, BATCH_REASON_GROW);
    for (int i = 0; i < 10; i++)
        assert_int_equal(batch_step_end(&c, s++, 50u << 20, 50u << 20, 1e-3, &why), 16);
}

/* GPU-like: larger is faster.  From a fit of 64 the tuner tries 32 and 16,
 * finds them clearly slower and goes back: the fastest, 64, is kept. */
static void test_tune_keeps_faster_of_two(void **state)
{
    (void)state;
    batch_ctl c;
    cost_model m = {.cliff = 0};
    uint32_t tried[BATCH_TUNE_MAX];
    int ntried;
    batch_init(&c, 64, 64, 0, 3);
    batch_set_tune(&c, true);
    batch_prior(&c, 10 << 20, 1 << 20);
    uint32_t n;
    while ((n = batch_probe_next(&c, 100u << 20)) != 0)
        batch_probe_result(&c, n, (10u << 20) + ((size_t)n << 20), true, 100u << 20);
    assert_int_equal(c.micro, 64);
    tune_until_done(&c, &m, 100u << 20, tried, &ntried, 40);
    assert_int_equal(ntried, 1 + BATCH_TUNE_PATIENCE);
    assert_int_equal(tried[1], 32);
    assert_int_equal(tried[2], 16);
    assert_int_equal(c.micro, 64);
    assert_int_equal(c.best, 64);
    assert_int_equal(c.last.reason, BATCH_REASON_TUNED);

    /* From a fit of 40, the cost alone (the same controller, a different
     * clock) makes 32 the fastest: tried after 40, kept over 16 and 8,
     * which are clearly slower and end the search. */
    fit_40(&c, true, 0);
    batch_reason why;
    uint64_t s = 1;
    for (; c.tune != BATCH_TUNE_DONE && s < 40; s++)
        batch_step_end(&c, s, 50u << 20, 50u << 20, c.micro == 32 ? 1e-3 : c.micro == 40 ? 1.2e-3 : 2e-3, &why);
    assert_int_equal(c.best, 32);
    assert_int_equal(c.micro, 32);
}

/* Tuning off: the fit stays, no tuning events; a fixed micro_batch is never
 * tuned by the engine (batch_set_tune is not called for it). */
static void test_tune_off(void **state)
{
    (void)state;
    batch_ctl c;
    cost_model m = {.cliff = 16};
    fit_40(&c, false, 3);
    batch_reason why;
    for (uint64_t s = 1; s < 30; s++) {
        assert_int_equal(batch_step_end(&c, s, 50u << 20, 50u << 20, step_cost(&m, c.micro), &why), 40);
        assert_int_equal(why, BATCH_REASON_NONE);
    }
    assert_int_equal(c.best, 0);
    assert_int_equal(c.last.reason, BATCH_REASON_FIT);
}

/* A job fitted while memory was short (another job probing, a process
 * since gone) is not held to that fit: once the budget has grown well past
 * the one it was found under, it grows to what the model says fits now and
 * tunes again among the larger sizes.  A small rise, or an OOM under an
 * unchanged budget, keeps the old limits. */
static void test_refit_when_memory_frees(void **state)
{
    (void)state;
    batch_ctl c;
    batch_reason why;
    uint32_t n, tried[BATCH_TUNE_MAX];
    int ntried;
    batch_init(&c, 64, 64, 0, 3);
    batch_set_tune(&c, true);
    batch_prior(&c, 10 << 20, 1 << 20);
    while ((n = batch_probe_next(&c, 20u << 20)) != 0)
        batch_probe_result(&c, n, (10u << 20) + ((size_t)n << 20), true, 20u << 20);
    assert_int_equal(c.micro, 10);
    cost_model gpu = {.cliff = 0};
    uint64_t s = tune_until_done(&c, &gpu, 20u << 20, tried, &ntried, 40) + 1;
    assert_int_equal(c.best, 10);

    /* 5% more: ordinary wobble, nothing changes. */
    for (int i = 0; i < 10; i++) {
        assert_int_equal(batch_step_end(&c, s++, 21u << 20, 21u << 20, 1e-3, &why), 10);
        assert_int_equal(why, BATCH_REASON_NONE);
    }
    /* 50M: after grow_after steps, a new fit of 40 (10M + 1M·40). */
    for (int i = 0; i < 2; i++)
        assert_int_equal(batch_step_end(&c, s++, 50u << 20, 50u << 20, 1e-3, &why), 10);
    assert_int_equal(batch_step_end(&c, s++, 50u << 20, 50u << 20, 1e-3, &why), 40);
    assert_int_equal(why, BATCH_REASON_GROW);
    assert_int_equal(c.max_fit, 40);
    assert_int_equal(c.fit_budget, 50u << 20);
    assert_int_equal(c.tune, BATCH_TUNE_WAIT);
    /* ...then tunes among 40 and below; CPU-like, 16 is fastest. */
    cost_model cpu = {.cliff = 16, .last_micro = 10};
    for (int i = 0; i < 40 && c.tune != BATCH_TUNE_DONE; i++)
        batch_step_end(&c, s++, 50u << 20, 50u << 20, step_cost(&cpu, c.micro), &why);
    assert_int_equal(c.tune, BATCH_TUNE_DONE);
    assert_int_equal(c.best, 16);
    assert_int_equal(c.micro, 16);

    /* An OOM at 40 under the same budget lowers the fit; growth never
     * returns past it, since the budget has not grown since. */
    fit_40(&c, false, 3);
    assert_int_equal(batch_on_oom(&c, 1, 50u << 20, 50u << 20, 0), 20);
    assert_true(c.max_fit < 40);
    uint32_t fit = c.max_fit;
    for (uint64_t t = 2; t < 20; t++)
        assert_true(batch_step_end(&c, t, 52u << 20, 52u << 20, 1e-3, &why) <= fit);
}

/* Pressure in the middle of tuning ends it with the fastest size measured
 * so far as the size growth returns to. */
static void test_tune_cut_short(void **state)
{
    (void)state;
    batch_ctl c;
    fit_40(&c, true, 2);
    batch_reason why;
    uint64_t s = 1;
    /* 40 measured (slow), then 32 measured (fast): 32 becomes the best so far. */
    while (c.micro != 16 && s < 20) {
        batch_step_end(&c, s++, 50u << 20, 50u << 20, c.micro == 40 ? 3e-3 : 1e-3, &why);
    }
    assert_int_equal(c.micro, 16);
    assert_int_equal(c.tune, BATCH_TUNE_RUN);
    uint32_t n = batch_step_end(&c, s++, 15u << 20, 15u << 20, 1e-3, &why);
    assert_int_equal(why, BATCH_REASON_PRESSURE);
    assert_true(n < 16);
    assert_int_equal(c.tune, BATCH_TUNE_DONE);
    assert_int_equal(c.best, 32);
    batch_step_end(&c, s++, 50u << 20, 50u << 20, 1e-3, &why);
    assert_int_equal(batch_step_end(&c, s++, 50u << 20, 50u << 20, 1e-3, &why), 32);
    assert_int_equal(why, BATCH_REASON_GROW);
}

/* Resuming: the earlier run's size is verified by one probe and the job
 * goes on as that run did; a size that no longer fits starts the search
 * from that measurement. */
static void test_resume_controller(void **state)
{
    (void)state;
    const size_t budget = 50u << 20;
    batch_ctl c;
    /* The fit of 40 (as fit_40 finds it), tuning off. */
    batch_init(&c, 64, 64, 0, 3);
    batch_prior(&c, 1 << 20, 2 << 20); /* a poor estimate: the earlier run's line replaces it */
    batch_resume(&c, 40, 16, 10 << 20, 1 << 20);
    assert_int_equal(batch_probe_next(&c, budget), 40); /* tuning is off: the tuned 16 is not used */
    batch_probe_result(&c, 40, 50u << 20, true, budget);
    assert_int_equal(batch_probe_next(&c, budget), 0);
    assert_int_equal(c.probes, 1);
    assert_int_equal(c.micro, 40);
    assert_int_equal(c.max_fit, 40);
    assert_int_equal(c.last.reason, BATCH_REASON_FIT);
    assert_int_equal(c.tune, BATCH_TUNE_OFF);

    /* Tuned to 16 before: 16 is verified and runs, tuning is over, and
     * growth may go back to 40's fit only up to the tuned 16. */
    batch_init(&c, 64, 64, 0, 3);
    batch_set_tune(&c, true);
    batch_prior(&c, 1 << 20, 2 << 20);
    batch_resume(&c, 40, 16, 10 << 20, 1 << 20);
    assert_int_equal(batch_probe_next(&c, budget), 16);
    batch_probe_result(&c, 16, 26u << 20, true, budget);
    assert_int_equal(batch_probe_next(&c, budget), 0);
    assert_int_equal(c.probes, 1);
    assert_int_equal(c.micro, 16);
    assert_int_equal(c.best, 16);
    assert_int_equal(c.max_fit, 40);
    assert_int_equal(c.tune, BATCH_TUNE_DONE);
    assert_int_equal(c.last.reason, BATCH_REASON_TUNED);
    batch_reason why;
    for (uint64_t s = 1; s < 10; s++) {
        assert_int_equal(batch_step_end(&c, s, budget, budget, 1e-3, &why), 16);
        assert_int_equal(why, BATCH_REASON_NONE);
    }

    /* 40 no longer fits (its peak is now 10M + 1.5M·n): the search goes on
     * from that measurement, below 40, and lands on the new truth, 26. */
    batch_init(&c, 64, 64, 0, 3);
    batch_prior(&c, 1 << 20, 2 << 20);
    batch_resume(&c, 40, 0, 10 << 20, 1 << 20);
    uint32_t n;
    while ((n = batch_probe_next(&c, budget)) != 0) {
        assert_true(n < 40 || c.probes == 0);
        batch_probe_result(&c, n, (10u << 20) + (size_t)n * (3u << 19), true, budget);
    }
    assert_true(c.probes <= 1 + BATCH_MAX_PROBES);
    assert_int_equal(c.micro, 26);
    assert_int_equal(c.max_fit, 26);
    assert_int_equal(c.last.reason, BATCH_REASON_FIT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_controller_model),
        cmocka_unit_test(test_controller_rounded_peaks),
        cmocka_unit_test(test_pressure_shrink_waits_for_memory),
        cmocka_unit_test(test_tune_candidates),
        cmocka_unit_test(test_tune_picks_fastest),
        cmocka_unit_test(test_tune_keeps_faster_of_two),
        cmocka_unit_test(test_tune_off),
        cmocka_unit_test(test_tune_cut_short),
        cmocka_unit_test(test_refit_when_memory_frees),
        cmocka_unit_test(test_resume_controller),
        cmocka_unit_test(test_probe_largest_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
