/* test_batch.c — the batch controller, with the real engine on the simulated
 * cpu device: probes against an exhaustive search, an OOM in the middle of a
 * step that changes nothing but the split, growing back when the pressure
 * leaves, tuning for throughput with a cost the test controls, and the
 * report when micro-batch 1 does not fit. */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "engine/batch.h"
#include "pool/dev.h"
#include "fixture.h"
#include "jobcfg.h"
#include "kern_ws.h"
#include "kernels.h"
#include "pool/pool.h"
#include "io/safetensors.h"
#include "engine/tboard.h"
#include "tensorboard.pb-c.h"
#include "engine/train.h"

/* A workspace of 2 MiB + 2 × the output of each matmul: large-pool sized,
 * and growing with the micro-batch, like a GEMM's. */
#define WS_FIXED ((size_t)2 << 20)
#define WS_FACTOR 2

static const kern_ops *kops;

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

static int setup(void **state)
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

static int teardown(void **state)
{
    (void)state;
    return fx_teardown();
}

typedef struct {
    const char *name;
    bool mlp;
    uint32_t layers, heads, width, context;
    uint32_t batch;
} shape;

static void make_job(job_config *j, const shape *s, const char *out, uint32_t micro, uint64_t steps)
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

/* ---- probes against an exhaustive search ------------------------------------------- */

/* As a worker runs a job: its pool row (limit, peak) goes with it. */
static train_outcome run(const job_config *j, const train_hooks *h, train_result *res)
{
    train_outcome o = train_run(j, fx_pool, kops, 1, h, res);
    pool_job_forget(fx_pool, 1);
    return o;
}

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

/* ---- an OOM in the middle of a step --------------------------------------------------- */

/* A simulated other process.  At step `at` (1-based), before the step's
 * second micro-batch, the cache goes back to the device and the process
 * takes everything free, so the next workspace allocation fails; at step
 * `release` it exits.  With stop_after the run is stopped (cleanly, as a
 * cancel stops it) once that step is done. */
typedef struct {
    uint64_t at, release, stop_after;
    uint64_t done;  /* steps finished */
    int calls;      /* should_stop calls in the step `at` */
    bool injected;
    uint32_t micro[64];
    train_progress last;
    size_t limit_to; /* instead of the process: lower the job's pool limit to this */
} pressure;

static bool press(void *user)
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

static void watch(void *user, const train_progress *pr)
{
    pressure *x = user;
    x->done = pr->step;
    if (pr->step < 64)
        x->micro[pr->step] = pr->micro;
    x->last = *pr;
    if (x->release && pr->step == x->release)
        assert_int_equal(dev_cpu_set_external(fx_dev, 0), DEV_OK);
}

static bool metrics_has(const char *dir, const char *needle)
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

static const shape oom_shape = {"gpt L2 C64 T32", false, 2, 4, 64, 32, 16};

/* A limit that makes auto choose about half the batch, so steps have
 * several micro-batches. */
static size_t half_limit(void)
{
    job_config j;
    train_result res;
    make_job(&j, &oom_shape, "estimate", 1, 1);
    assert_int_equal(run(&j, NULL, &res), TRAIN_DONE);
    return res.persistent_bytes + res.act_fixed + res.act_per_sample * (oom_shape.batch / 2) + 3 * WS_FIXED;
}

static void test_oom_mid_step_same_result(void **state)
{
    (void)state;
    size_t limit = half_limit();
    job_config j;
    train_result res;
    make_job(&j, &oom_shape, "undisturbed", 0, 16);
    j.mem_limit = limit;
    j.margin = 0.05; /* covers what allocated bytes do not show: mapping granularity */
    /* Both runs at the fitted size: tuning picks by timing, which may
     * differ between the runs, and this compares the sizes step by step. */
    j.tune = false;
    pressure calm = {0};
    train_hooks hc = {.on_step = watch, .user = &calm};
    if (run(&j, &hc, &res) != TRAIN_DONE)
        fail_msg("%s", res.message);
    uint32_t m0 = res.micro;
    assert_true(m0 < oom_shape.batch);
    assert_int_equal(res.oom_recoveries, 0);

    make_job(&j, &oom_shape, "oom10", 0, 16);
    j.mem_limit = limit;
    j.margin = 0.05;
    j.tune = false;
    pressure x = {.at = 10};
    train_hooks h = {.on_step = watch, .should_stop = press, .user = &x};
    train_outcome o = run(&j, &h, &res);
    dev_cpu_set_external(fx_dev, 0);
    if (o != TRAIN_DONE)
        fail_msg("%s", res.message);
    assert_true(x.injected);
    /* The shrink is visible where status and metrics read it... */
    assert_true(res.oom_recoveries >= 1);
    assert_int_equal(x.micro[9], m0);
    assert_true(x.micro[10] < m0);
    assert_true(x.last.oom_recoveries >= 1);
    assert_string_equal(x.last.change_reason, "oom");
    assert_int_equal(x.last.change_step, 9);
    assert_true(metrics_has(j.out_dir, "\"reason\":\"oom\""));
    /* ...and the parameters are the undisturbed run's, up to reassociation. */
    char ref[128];
    snprintf(ref, sizeof ref, "%s/undisturbed", fx_dir);
    double worst = fx_worst_tensor_diff(j.out_dir, ref, NULL, 0);
    printf("oom at step 10: micro %u -> %u, worst tensor difference %.3g\n", m0, x.micro[10], worst);
    assert_true(worst <= 1e-5);
}

/* ---- pressure that leaves ------------------------------------------------------------- */

static void test_grows_back(void **state)
{
    (void)state;
    size_t limit = half_limit();
    job_config j;
    train_result res;
    make_job(&j, &oom_shape, "grow", 0, 20);
    j.mem_limit = limit;
    j.margin = 0.05;
    j.grow_after = 3;
    j.tune = false; /* the fitted size, from the first step (test_tune_* cover the tuned one) */
    pressure x = {.at = 5, .release = 8};
    train_hooks h = {.on_step = watch, .should_stop = press, .user = &x};
    train_outcome o = run(&j, &h, &res);
    dev_cpu_set_external(fx_dev, 0);
    if (o != TRAIN_DONE)
        fail_msg("%s", res.message);
    uint32_t m0 = x.micro[4];
    printf("micro by step:");
    for (int s = 1; s <= 20; s++)
        printf(" %u", x.micro[s]);
    printf("\n");
    assert_true(x.micro[5] < m0);
    /* Released after step 8; 3 steps of headroom later it is back. */
    assert_int_equal(x.micro[11], m0);
    assert_int_equal(x.micro[20], m0);
    assert_string_equal(x.last.change_reason, "grow");
    assert_true(metrics_has(j.out_dir, "\"reason\":\"grow\""));
}

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

static void expect_meta(const char *dir, const char *key, const char *want)
{
    char got[64];
    fx_resume_meta(dir, key, got, sizeof got);
    if (strcmp(got, want) != 0)
        fail_msg("resume.safetensors %s: '%s', expected '%s'", key, got, want);
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

/* ---- micro-batch 1 and still out of memory --------------------------------------------- */

static void test_micro1_fails_with_report(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    make_job(&j, &oom_shape, "nofit", 0, 12);
    j.mem_limit = half_limit();
    j.checkpoint_every = 3;
    /* At step 5 the job's limit drops under what its parameters and
     * optimizer alone take. */
    pressure x = {.at = 5, .limit_to = 64 << 10};
    train_hooks h = {.on_step = watch, .should_stop = press, .user = &x};
    assert_int_equal(run(&j, &h, &res), TRAIN_FAILED);
    printf("%s\n", res.message);
    const char *want[] = {"micro-batch 1", "requested", "params", "device free", "To fix: raise [memory] limit",
                          "checkpoint"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(res.message, want[i]))
            fail_msg("the report lacks '%s': %s", want[i], res.message);
    /* The last checkpoint (step 3) survives. */
    char step[32];
    assert_string_equal(fx_resume_meta(j.out_dir, "step", step, sizeof step), "3");
}

/* ---- a device failure is not an OOM ------------------------------------------------- */

/* The workspace kernels, except that the first sync of step flt_at
 * reports flt_code, as the CUDA backend reports a faulting kernel
 * (KERN_ERR_DEVICE) or memory a library could not get outside the pool
 * (KERN_ERR_OOM). */
static kern_ops flt_ops;
static uint64_t flt_at, flt_done;
static int flt_code;

static int flt_sync(kern_ctx *k)
{
    int e = kops->sync(k);
    if (e == KERN_OK && flt_code && flt_done + 1 == flt_at) {
        e = flt_code;
        flt_code = 0;
    }
    return e;
}

static const char *flt_error(const kern_ctx *k)
{
    (void)k;
    return "attention_fused_backward16: an illegal memory access was encountered";
}

static void flt_watch(void *user, const train_progress *pr)
{
    watch(user, pr);
    flt_done = pr->step;
}

static const kern_ops *fault_at(uint64_t step, int code)
{
    flt_ops = *kops;
    flt_ops.sync = flt_sync;
    flt_ops.error = flt_error;
    flt_at = step;
    flt_done = 0;
    flt_code = code;
    return &flt_ops;
}

static void test_device_fault_is_not_an_oom(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    /* A faulting kernel fails the job with the kernel's message at once:
     * no smaller micro-batch cures it, and shrinking to 1 would end as a
     * misleading "does not fit".  The last checkpoint stays. */
    make_job(&j, &oom_shape, "fault", 4, 6);
    j.checkpoint_every = 2;
    pressure x = {0};
    train_hooks h = {.on_step = flt_watch, .user = &x};
    const kern_ops *k = fault_at(3, KERN_ERR_DEVICE);
    assert_int_equal(train_run(&j, fx_pool, k, 1, &h, &res), TRAIN_FAILED);
    pool_job_forget(fx_pool, 1);
    assert_string_equal(res.message, "the device failed in step 3: attention_fused_backward16: an illegal memory "
                                     "access was encountered");
    assert_int_equal(res.oom_recoveries, 0);
    char step[32];
    assert_string_equal(fx_resume_meta(j.out_dir, "step", step, sizeof step), "2");

    /* Memory a library could not get is an OOM: the step is redone smaller
     * and the run goes on. */
    make_job(&j, &oom_shape, "libfull", 8, 6);
    x = (pressure){0};
    k = fault_at(3, KERN_ERR_OOM);
    train_outcome o = train_run(&j, fx_pool, k, 1, &h, &res);
    pool_job_forget(fx_pool, 1);
    if (o != TRAIN_DONE)
        fail_msg("%s", res.message);
    assert_int_equal(res.oom_recoveries, 1);
    assert_int_equal(x.micro[2], 8);
    assert_true(x.micro[3] < 8);
    assert_true(metrics_has(j.out_dir, "\"reason\":\"oom\""));
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
        cmocka_unit_test(test_controller_model),
        cmocka_unit_test(test_controller_rounded_peaks),
        cmocka_unit_test(test_pressure_shrink_waits_for_memory),
        cmocka_unit_test(test_tune_candidates),
        cmocka_unit_test(test_tune_picks_fastest),
        cmocka_unit_test(test_tune_keeps_faster_of_two),
        cmocka_unit_test(test_tune_off),
        cmocka_unit_test(test_tune_cut_short),
        cmocka_unit_test(test_refit_when_memory_frees),
        cmocka_unit_test(test_budget_counts_others_need),
        cmocka_unit_test(test_resume_controller),
        cmocka_unit_test(test_probes_mlp),
        cmocka_unit_test(test_probes_gpt_small),
        cmocka_unit_test(test_probes_gpt_wide),
        cmocka_unit_test(test_oom_mid_step_same_result),
        cmocka_unit_test(test_grows_back),
        cmocka_unit_test(test_fp16_scale_across_oom_and_resume),
        cmocka_unit_test(test_fp16_scale_doubles),
        cmocka_unit_test(test_fp16_resume_across_precisions),
        cmocka_unit_test(test_tuned_run_visible),
        cmocka_unit_test(test_resume_keeps_fit),
        cmocka_unit_test(test_resume_keeps_tuned),
        cmocka_unit_test(test_micro1_fails_with_report),
        cmocka_unit_test(test_device_fault_is_not_an_oom),
        cmocka_unit_test(test_val_subset_of_held_out),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
