/* bench_batch.c — the batch controller against Lightning's batch-size
 * finder and against hand tuning, on the simulated cpu device with the real
 * engine (and a GEMM workspace taken from the pool, as on CUDA).
 *
 * One JSON object per line:
 *   {"bench", "metric", "value", "unit", "peer", "peer_value", "ratio"}
 * ratio = value / peer_value, except where "unit" says otherwise.
 *
 *   probes_to_fit   trial runs to find the micro-batch (gradd: probes),
 *                   against Lightning's `power` and `binsearch` modes
 *                   (scale_batch_size: start at 2, double until OOM; binsearch
 *                   then bisects), reimplemented here over the same engine:
 *                   a trial is one step at a fixed micro-batch under the
 *                   job's limit.  Lower is better.
 *   chosen_micro    the size found; ratio = gradd / peer (>= 1: gradd found
 *                   at least as large a fitting size).
 *   throughput      samples/s of a whole run with micro_batch = auto
 *                   (probing and tuning included) against a run at the
 *                   best static micro-batch of a sweep (see throughput());
 *                   ratio = peer / gradd (< 1: gradd faster; issue 6 asks
 *                   for <= 1/0.97).
 *   oom_cost        wall time lost to one injected mid-step OOM: the
 *                   abandoned attempt and the shrink (the engine's
 *                   oom_lost_s), in median steps of the same run before the
 *                   OOM (fitted size: [memory] tune = off); best of 3 runs.
 *                   The steps after it run smaller until they grow back: on
 *                   a CPU that is no slower (often faster), so whole-run
 *                   differences measured noise, not the OOM.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pool/dev.h"
#include "jobcfg.h"
#include "kern_ws.h"
#include "kernels.h"
#include "pool/pool.h"
#include "engine/train.h"

typedef struct {
    char dir[64];
    dev *d;
    pool *p;
    const kern_ops *k;
} bench;

typedef struct {
    const char *name;
    uint32_t layers, heads, width, context, batch;
} shape;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void emit(const char *b, const char *metric, double value, const char *unit, const char *peer, double pv,
                 double ratio)
{
    printf("{\"bench\":\"%s\",\"metric\":\"%s\",\"value\":%.6g,\"unit\":\"%s\",\"peer\":\"%s\",\"peer_value\":%.6g,"
           "\"ratio\":%.4f}\n",
           b, metric, value, unit, peer, pv, ratio);
    fflush(stdout);
}

static void job(const bench *B, job_config *j, const shape *s, uint32_t micro, uint64_t steps, size_t limit)
{
    jobcfg_defaults(j);
    snprintf(j->model, sizeof j->model, "gpt");
    j->layers = s->layers;
    j->heads = s->heads;
    j->width = s->width;
    j->context = s->context;
    j->vocab = 256;
    j->format = JOBCFG_DATA_TEXT;
    snprintf(j->train, sizeof j->train, "%s/corpus.txt", B->dir);
    j->val_fraction = 0.05;
    j->steps = steps;
    j->batch = s->batch;
    j->micro_batch = micro;
    j->lr = 1e-3;
    j->threads = 1;
    j->eval_batches = 1;
    j->mem_limit = limit;
    j->margin = 0;
    snprintf(j->out_dir, sizeof j->out_dir, "%s/out", B->dir);
    snprintf(j->source, sizeof j->source, "bench");
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", j->out_dir);
    if (system(cmd) != 0)
        exit(1);
}

static train_outcome run(const bench *B, const job_config *j, const train_hooks *h, train_result *res)
{
    train_outcome o = train_run(j, B->p, B->k, 1, h, res);
    pool_job_forget(B->p, 1);
    return o;
}

/* One Lightning trial: does one step at micro-batch n run without OOM? */
static bool trial(const bench *B, const shape *s, uint32_t n, size_t limit)
{
    job_config j;
    train_result res;
    job(B, &j, s, n, 1, limit);
    return run(B, &j, NULL, &res) == TRAIN_DONE && res.oom_recoveries == 0 && res.micro == n;
}

/* Lightning's scale_batch_size(mode="power"|"binsearch", init_val=2), over
 * sizes capped at the effective batch. */
static uint32_t lightning(const bench *B, const shape *s, size_t limit, bool binsearch, uint32_t *trials)
{
    uint32_t n = 2 < s->batch ? 2 : s->batch, good = 0, bad = 0;
    *trials = 0;
    for (;;) {
        ++*trials;
        if (trial(B, s, n, limit)) {
            good = n;
            if (n == s->batch)
                return good;
            n = n * 2 > s->batch ? s->batch : n * 2;
        } else {
            bad = n;
            break;
        }
    }
    if (!binsearch)
        return good;
    while (bad - good > 1) {
        uint32_t mid = (good + bad) / 2;
        ++*trials;
        if (trial(B, s, mid, limit))
            good = mid;
        else
            bad = mid;
    }
    return good;
}

static size_t limit_for(const bench *B, const shape *s, double frac)
{
    job_config j;
    train_result res;
    job(B, &j, s, 1, 1, 0);
    if (run(B, &j, NULL, &res) != TRAIN_DONE) {
        fprintf(stderr, "%s\n", res.message);
        exit(1);
    }
    return res.persistent_bytes + res.act_fixed + (size_t)((double)res.act_per_sample * frac * s->batch) + (4u << 20);
}

static void probes_to_fit(const bench *B, const shape *s)
{
    size_t limit = limit_for(B, s, 0.6);
    job_config j;
    train_result res;
    job(B, &j, s, 0, 1, limit);
    if (run(B, &j, NULL, &res) != TRAIN_DONE)
        exit(1);
    char name[64];
    snprintf(name, sizeof name, "probes_to_fit/%s", s->name);
    for (int bs = 0; bs < 2; bs++) {
        uint32_t trials, chosen = lightning(B, s, limit, bs == 1, &trials);
        const char *peer = bs ? "lightning_binsearch" : "lightning_power";
        emit(name, "probes", res.probes, "trials", peer, trials, (double)res.probes / trials);
        emit(name, "chosen_micro", res.micro_fit, "samples (ratio gradd/peer, >=1 better)", peer, chosen,
             (double)res.micro_fit / chosen);
    }
}

static double run_rate(const bench *B, const shape *s, uint32_t micro, uint64_t steps, size_t limit,
                       train_result *res)
{
    job_config j;
    job(B, &j, s, micro, steps, limit);
    double t0 = now_s();
    if (run(B, &j, NULL, res) != TRAIN_DONE || res->oom_recoveries)
        return 0;
    return (double)steps * s->batch / (now_s() - t0);
}

/* Hand tuning as a person does it: a sweep of static sizes picks the best,
 * then the job runs at it.  The sweep's own numbers would flatter the peer:
 * on a shared machine a run's rate varies by several percent, and the best
 * of many noisy runs of near-equal sizes is biased upwards (the winner's
 * curse), so the chosen size is measured again, in rounds interleaved with
 * the auto runs.  Each side keeps its fastest run of those rounds: other
 * work only ever slows a run down, and interleaving gives both the same
 * chances of a quiet moment. */
#define SWEEP_ROUNDS 2
#define COMPARE_ROUNDS 5

static void throughput(const bench *B, const shape *s, uint64_t steps)
{
    size_t limit = limit_for(B, s, 0.5);
    /* The static sizes: powers of two while they fit, and the largest size
     * that fits, which a careful person would also try. */
    uint32_t sizes[40];
    int ns = 0;
    for (uint32_t n = 1; n <= s->batch && trial(B, s, n, limit); n *= 2)
        sizes[ns++] = n;
    uint32_t trials, top = lightning(B, s, limit, true, &trials);
    if (ns == 0 || sizes[ns - 1] != top)
        sizes[ns++] = top;
    double rate[40] = {0};
    train_result res;
    for (int round = 0; round < SWEEP_ROUNDS; round++)
        for (int i = 0; i < ns; i++) {
            double r = run_rate(B, s, sizes[i], steps, limit, &res);
            if (r > rate[i])
                rate[i] = r;
        }
    uint32_t best_n = 0;
    double sweep_best = 0;
    for (int i = 0; i < ns; i++) {
        fprintf(stderr, "throughput/%s: sweep: static micro %u%s: %.1f samples/s\n", s->name, sizes[i],
                sizes[i] == top ? " (largest that fits)" : "", rate[i]);
        if (rate[i] > sweep_best) {
            sweep_best = rate[i];
            best_n = sizes[i];
        }
    }
    double best = 0, a = 0;
    for (int round = 0; round < COMPARE_ROUNDS; round++) {
        double r = run_rate(B, s, best_n, steps, limit, &res);
        if (r > best)
            best = r;
        r = run_rate(B, s, 0, steps, limit, &res);
        if (r > a)
            a = r;
        fprintf(stderr, "throughput/%s: round %d: auto fit %u, tuned to %u (%u changes)\n", s->name, round + 1,
                res.micro_fit, res.micro, (unsigned)res.batch_changes);
    }
    fprintf(stderr,
            "throughput/%s: static micro %u: %.1f samples/s, auto: %.1f samples/s (against the sweep's own best, "
            "%.1f: ratio %.4f)\n",
            s->name, best_n, best, a, sweep_best, sweep_best / a);
    char peer[64], name[64];
    snprintf(peer, sizeof peer, "best_static_micro_%u", best_n);
    snprintf(name, sizeof name, "throughput/%s", s->name);
    emit(name, "samples_per_s", a, "samples/s (ratio peer/gradd, <1 gradd faster)", peer, best, best / a);
}

/* ---- the cost of an OOM ---------------------------------------------------------------- */

typedef struct {
    const bench *B;
    uint64_t at, done; /* at = 0: never inject */
    int calls;
    bool injected;
    double *t; /* wall time at the end of each step (index = step) */
} inject;

static bool press(void *user)
{
    inject *x = user;
    if (x->injected || x->done + 1 != x->at || ++x->calls < 2)
        return false;
    x->injected = true;
    pool_trim(x->B->p, POOL_TRIM_REQUEST, 0);
    size_t f, t;
    dev_mem_info(x->B->d, &f, &t);
    dev_cpu_set_external(x->B->d, f);
    return false;
}

static void seen(void *user, const train_progress *pr)
{
    inject *x = user;
    x->done = pr->step;
    x->t[pr->step] = now_s();
    /* The other process leaves right after the step that hit it. */
    if (x->injected && pr->step == x->at)
        dev_cpu_set_external(x->B->d, 0);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void oom_cost(const bench *B, const shape *s, uint64_t steps)
{
    size_t limit = limit_for(B, s, 0.5);
    enum { at = 10 }; /* the step the simulated process arrives in */
    double best = 1e30, steps_ms[at];
    uint64_t recov = 0;
    if (steps < at + 2)
        steps = at + 2;
    double *t = calloc(steps + 1, sizeof *t); /* wall time at the end of each step */
    if (!t)
        exit(1);
    for (int rep = 0; rep < 3; rep++) {
        job_config j;
        train_result res;
        job(B, &j, s, 0, steps, limit);
        j.margin = 0.05;
        j.grow_after = 5;
        /* The recovery from the fitted size: a tuned, smaller micro-batch
         * holds less memory, and the simulated process, which takes all
         * that is free, would leave it none to recover into. */
        j.tune = false;
        inject x = {B, at, 0, 0, false, t};
        train_hooks h = {.on_step = seen, .should_stop = press, .user = &x};
        train_outcome o = run(B, &j, &h, &res);
        dev_cpu_set_external(B->d, 0);
        if (o != TRAIN_DONE) {
            fprintf(stderr, "oom_cost (with the OOM): %s\n", res.message);
            exit(1);
        }
        recov = res.oom_recoveries;
        /* The median step before the OOM (step 1 also carries the setup). */
        int n = 0;
        for (uint64_t i = 2; i < at; i++)
            steps_ms[n++] = t[i] - t[i - 1];
        qsort(steps_ms, (size_t)n, sizeof *steps_ms, cmp_double);
        double lost = res.oom_lost_s / steps_ms[n / 2];
        fprintf(stderr, "oom_cost/%s: run %d: %.2f ms lost, median step %.2f ms: %.2f steps\n", s->name, rep,
                res.oom_lost_s * 1e3, steps_ms[n / 2] * 1e3, lost);
        if (lost < best)
            best = lost;
    }
    char name[64];
    snprintf(name, sizeof name, "oom_cost/%s", s->name);
    emit(name, "steps_lost", best, "steps (peer: the same run without the OOM)", "undisturbed_run", 0,
         (double)recov);
    free(t);
}

int main(int argc, char **argv)
{
    uint64_t steps = argc > 1 ? strtoull(argv[1], NULL, 10) : 60;
    bench B;
    snprintf(B.dir, sizeof B.dir, "/tmp/gradd-bench-batch-XXXXXX");
    if (!mkdtemp(B.dir))
        return 1;
    char path[128];
    snprintf(path, sizeof path, "%s/corpus.txt", B.dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return 1;
    for (int i = 0; i < 2000; i++)
        fprintf(f, "the quick brown fox %d jumps over the lazy dog; pack my box with five dozen jugs.\n", i % 37);
    fclose(f);
    pool_config pc;
    pool_config_default(&pc);
    pc.expandable_segments = true;
    if (dev_cpu_create((size_t)512 << 20, 0, &B.d) != DEV_OK || pool_create(B.d, &pc, &B.p) != 0)
        return 1;
    B.k = kern_ws_ops((size_t)2 << 20, 2);

    static const shape shapes[] = {
        {"gpt_L2_C32_T16", 2, 2, 32, 16, 64},
        {"gpt_L2_C64_T32", 2, 4, 64, 32, 32},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        probes_to_fit(&B, &shapes[i]);
    throughput(&B, &shapes[0], steps);
    oom_cost(&B, &shapes[1], steps / 2 > 20 ? steps / 2 : 20);

    pool_destroy(B.p);
    dev_destroy(B.d);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", B.dir);
    return system(cmd) == 0 ? 0 : 1;
}
