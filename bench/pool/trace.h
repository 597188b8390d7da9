/* trace.h — what the pool trace benchmarks share (bench_pool on the cpu
 * device, bench_pool_cuda on a GPU): the timer, the trace reader, the
 * replay loop, the pair statistics, gradd's pool run, the options both
 * take, and the JSON lines.
 *
 * bench_pool.c's header defines what is measured and why; this file only
 * holds the code, so that both programs measure the very same way.
 *
 * The replay loop and the hot-path loop are inline functions here rather
 * than functions in trace.c: each caller passes its allocator's functions
 * as constants, and only inlining turns those into the one direct call per
 * timed region that the figures assume.
 */
#ifndef GRADD_BENCH_TRACE_H
#define GRADD_BENCH_TRACE_H

#include "pool/dev.h"
#include "pool/pool.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* Program name for messages ("bench_pool", "bench_pool_cuda"). */
extern const char *bench_prog;

/* ==== timing ========================================================================= */

extern bool use_tsc;
extern double ticks_per_ns;
extern uint64_t tick_overhead; /* median cost of an empty timed region, ticks */

static inline uint64_t clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#if defined(__x86_64__)
/* lfence before rdtsc: earlier instructions have finished; rdtscp then
 * lfence: the timed code has finished and nothing later started early. */
static inline uint64_t tsc_begin(void)
{
    uint32_t lo, hi;
    __asm__ volatile("lfence\n\trdtsc" : "=a"(lo), "=d"(hi) : : "memory");
    return ((uint64_t)hi << 32) | lo;
}
static inline uint64_t tsc_end(void)
{
    uint32_t lo, hi, aux;
    __asm__ volatile("rdtscp\n\tlfence" : "=a"(lo), "=d"(hi), "=c"(aux) : : "memory");
    return ((uint64_t)hi << 32) | lo;
}
#else
static inline uint64_t tsc_begin(void) { return clock_ns(); }
static inline uint64_t tsc_end(void) { return clock_ns(); }
#endif

static inline uint64_t tick_begin(void)
{
    if (use_tsc)
        return tsc_begin();
    return clock_ns();
}
static inline uint64_t tick_end(void)
{
    if (use_tsc)
        return tsc_end();
    return clock_ns();
}

/* Sets ticks_per_ns (TSC against CLOCK_MONOTONIC) and tick_overhead. */
void timer_calibrate(void);
/* --timer: the TSC where `timer` is "tsc", or with no --timer (NULL) where
 * it is invariant and has rdtscp (a warning when it is asked for but is
 * not); then timer_calibrate. */
void timer_setup(const char *timer);
/* The stderr line that says which clock times the calls and what it costs. */
void timer_describe(void);
double ticks_to_ns(uint64_t ticks);
int cmp_u64(const void *a, const void *b);

/* ==== the trace ======================================================================== */

enum { OP_ALLOC, OP_FREE, OP_STEP };

typedef struct {
    uint64_t size;
    uint32_t id; /* block id; OP_STEP: the step */
    uint8_t kind;
    uint8_t tag;
} trace_op;

typedef struct {
    int32_t phase, in_phase; /* in_phase: 0 for a phase's first step */
    uint64_t allocs;         /* requests made during the step */
} trace_step;

typedef struct trace {
    trace_op *ops;
    size_t nops, nallocs, nfrees;
    uint32_t nids;
    trace_step *steps;
    uint32_t nsteps;
    int nphases;
    int phase_micro[64];
    uint64_t setup_allocs; /* requests before the first step */
    int32_t *alloc_step;   /* per id; -1: setup */
    uint64_t peak_live;
} trace;

/* gen_trace.py's format; 0, or -1 with the reason on stderr. */
int trace_load(const char *path, trace *t);
void trace_free(trace *t);
/* The stderr line that describes a loaded trace. */
void trace_describe(const char *path, const trace *t);

/* ==== counting device calls ============================================================== */

/* Device calls that obtain memory (dev_alloc, dev_va_map) since the last
 * reset, and the bytes va_map mapped.  The replay reads dev_calls around
 * every allocation to tell hits from misses and per step for the steady
 * figure; peers without a dev count their own "device allocation" into it. */
extern uint64_t dev_calls;
extern uint64_t dev_va_bytes;

/* Give `d` a copy of its function table whose alloc and va_map count into
 * the two counters above.  One device at a time. */
void counting_wrap(dev *d);

/* ==== the replay ================================================================================ */

typedef struct {
    void **ptr;         /* per id */
    uint32_t *at, *ft;  /* ticks of each id's alloc and free */
    uint8_t *miss;      /* the alloc called the device */
    uint64_t *step_dev; /* dev_calls when step s began; [nsteps] = at the end */
    uint64_t *pairs;    /* scratch: 4 × nallocs */
} replay_buf;

int replay_buf_init(replay_buf *rb, const trace *t);
void replay_buf_free(replay_buf *rb);

typedef struct run_result {
    bool ok;
    double median_ns, p99_ns, mean_ns, hit_median_ns, wall_ms;
    double small_median_ns, large_median_ns; /* requests <= 1 MiB / above */
    double hot_ns;                           /* hot_pairs(); 0 where not run */
    uint64_t npairs, nmiss_pairs, nsmall, nlarge;
    uint64_t dev_allocs, dev_allocs_steady, requests_steady;
    /* pool only */
    bool is_pool;
    uint64_t stat_device_allocs;
    uint64_t va_bytes;                     /* dev_va_bytes at the end of the replay */
    int64_t peak_reserved, peak_allocated; /* the pool's: the maxima of the phases' */
    int64_t phase_peak_reserved[64], phase_peak_allocated[64], phase_end_reserved[64];
    uint64_t phase_dev_allocs[64];
    bool check_ok;
} run_result;

static inline uint32_t clamp32(uint64_t v) { return v > UINT32_MAX ? UINT32_MAX : (uint32_t)v; }

/* One pass over the trace: A allocates, F frees (both timed alone), P (may
 * be NULL) runs right after each allocation, untimed, and S (may be NULL)
 * at each step boundary, untimed.  Always inlined into each caller with
 * constant functions, so every peer's timed region holds one direct call. */
static inline __attribute__((always_inline)) int
replay(const trace *t, replay_buf *rb, void *ctx, void *(*A)(void *, size_t, int),
       void (*F)(void *, void *, size_t), void (*P)(void *), void (*S)(void *, uint32_t))
{
    for (size_t i = 0; i < t->nops; i++) {
        const trace_op *o = &t->ops[i];
        if (o->kind == OP_ALLOC) {
            uint64_t dc = dev_calls;
            uint64_t t0 = tick_begin();
            void *p = A(ctx, o->size, o->tag);
            uint64_t t1 = tick_end();
            if (!p) {
                fprintf(stderr, "%s: allocation %u of %" PRIu64 " bytes failed\n", bench_prog,
                        o->id, o->size);
                return -1;
            }
            if (P)
                P(ctx);
            rb->ptr[o->id] = p;
            rb->at[o->id] = clamp32(t1 - t0);
            rb->miss[o->id] = dev_calls != dc;
        } else if (o->kind == OP_FREE) {
            void *p = rb->ptr[o->id];
            uint64_t t0 = tick_begin();
            F(ctx, p, o->size);
            uint64_t t1 = tick_end();
            rb->ft[o->id] = clamp32(t1 - t0);
            rb->ptr[o->id] = NULL;
        } else {
            if (S)
                S(ctx, o->id);
            rb->step_dev[o->id] = dev_calls;
        }
    }
    rb->step_dev[t->nsteps] = dev_calls;
    return 0;
}

/* The hit path alone: one 512-byte request allocated and freed again and
 * again, everything hot in cache — the best case of every allocator, with
 * no trace around it.  Median ns per pair. */
#define HOT_PAIRS 100000
#define HOT_SIZE 512

static inline __attribute__((always_inline)) double
hot_pairs(uint64_t *buf, size_t cap, void *ctx, void *(*A)(void *, size_t, int),
          void (*F)(void *, void *, size_t))
{
    size_t n = cap < HOT_PAIRS ? cap : HOT_PAIRS;
    for (size_t i = 0; i < 1000; i++)
        F(ctx, A(ctx, HOT_SIZE, POOL_TAG_WORKSPACE), HOT_SIZE);
    for (size_t i = 0; i < n; i++) {
        uint64_t t0 = tick_begin();
        void *p = A(ctx, HOT_SIZE, POOL_TAG_WORKSPACE);
        uint64_t t1 = tick_end();
        uint64_t t2 = tick_begin();
        F(ctx, p, HOT_SIZE);
        uint64_t t3 = tick_end();
        uint64_t a = t1 - t0 > tick_overhead ? t1 - t0 - tick_overhead : 0;
        uint64_t f = t3 - t2 > tick_overhead ? t3 - t2 - tick_overhead : 0;
        buf[i] = a + f;
    }
    qsort(buf, n, sizeof *buf, cmp_u64);
    return (double)buf[(n - 1) / 2] / ticks_per_ns;
}

/* Free what the trace left live (untimed), in id order. */
static inline __attribute__((always_inline)) void
free_leftovers(const trace *t, replay_buf *rb, void *ctx, void (*F)(void *, void *, size_t))
{
    for (size_t i = 0; i < t->nops; i++) {
        const trace_op *o = &t->ops[i];
        if (o->kind == OP_ALLOC && rb->ptr[o->id]) {
            F(ctx, rb->ptr[o->id], o->size);
            rb->ptr[o->id] = NULL;
        }
    }
}

/* A peer's whole run: replay (no step hook), timed end to end into
 * r->wall_ms, then free_leftovers.  0, or -1 when an allocation failed. */
static inline __attribute__((always_inline)) int
replay_timed(const trace *t, replay_buf *rb, void *ctx, void *(*A)(void *, size_t, int),
             void (*F)(void *, void *, size_t), void (*P)(void *), run_result *r)
{
    uint64_t w0 = clock_ns();
    int rc = replay(t, rb, ctx, A, F, P, NULL);
    r->wall_ms = (double)(clock_ns() - w0) / 1e6;
    free_leftovers(t, rb, ctx, F);
    return rc;
}

/* Pair figures and device counts from the buffers of one replay. */
void summarise(const trace *t, replay_buf *rb, int warm_steps, run_result *r);

/* Before a run: a zeroed result, and the device counters at zero. */
void run_reset(const trace *t, replay_buf *rb, run_result *r);
/* After a peer's replay, which returned `rc`: its figures (summarise) and
 * r->ok.  0, or -1 where rc says the replay failed. */
int run_finish(const trace *t, replay_buf *rb, int warm_steps, int rc, run_result *r);

/* ==== gradd's pool ================================================================================ */

typedef struct {
    size_t capacity; /* the cpu device's; bench_pool only */
    bool timeline;
    int warm_steps;
    uint64_t trim_every_steps; /* pool_config's, for experiments; 0 = default (off) */
    double gc_threshold;
    long trim_at_step; /* experiment: pool_trim(REQUEST) once, before this step; -1 = never */
} bench_opts;

/* Replay the trace through a fresh pool (pool_config_default, as adjusted
 * by `o`) on `d`, whose ops counting_wrap has wrapped; check it, free the
 * leftovers, check again, time the hot path, destroy the pool (not `d`).
 * `name` labels messages.  0, or -1 when anything failed. */
int pool_run(dev *d, bool expandable, const trace *t, replay_buf *rb, const bench_opts *o,
             const char *name, run_result *r);

/* The stderr lines about a pool's runs: peaks, device-allocation cross-check
 * and pool_check (from `med`), and the per-phase table (from `first`, the
 * first repeat: those figures never vary). */
void pool_report(const char *name, const trace *t, const run_result *med,
                 const run_result *first);

/* Medians over `repeat` runs of the timing figures, the rest from the first
 * run (counts are the same in every run).  runs[r * stride]. */
run_result median_result(const run_result *runs, int repeat, int stride);

/* ==== the command line ========================================================================== */

/* What both programs' command lines hold besides their own options. */
typedef struct {
    const char *path;  /* TRACE */
    const char *only;  /* --only LIST; NULL: every allocator */
    const char *timer; /* --timer tsc|clock; NULL: timer_setup decides */
    int repeat;        /* --repeat N */
} bench_args;

/* Takes argv[*i] when it is TRACE (the first argument that is no option)
 * or one of the options both programs share, --repeat, --warm-steps,
 * --timer, --only with their values (*i then points at the value) and
 * --no-timeline: true.  false for anything else, which is the program's
 * own to take or refuse. */
bool bench_arg(int argc, char **argv, int *i, bench_args *a, bench_opts *o);

/* --only LIST: want[k] says whether the comma-separated LIST names
 * names[k] (every one with no --only, NULL).  A name in LIST that is none of
 * names is an error, reported with the names there are: -1, else 0. */
int only_select(const char *only, const char *const *names, int n, bool *want);

/* ==== output ==================================================================================== */

double median_of(double *v, int n);
double round_to(double v, double q);
/* One JSON line: {"bench","metric","value","unit","peer","peer_value","ratio"},
 * ratio = value / peer_value (null where undefined). */
void emit(const char *bench, const char *metric, double value, const char *unit,
          const char *peer, double peer_value);
/* Device allocations per 1,000 requests: overall, and steady (NAN if no
 * steady request). */
double per_1000(const trace *t, const run_result *r);
double per_1000_steady(const run_result *r);
/* The pair-time lines of gradd's pool (`pool`, its median run) against its
 * peers: pair_ns_median, then pair_ns_p99, against each wanted one of the
 * npeers `peers`; then the small/large split and the hot path against
 * `cache`, the peer that caches as the pool does, where it is wanted.
 * names, res and want are the program's tables, by allocator number. */
void emit_pair_ns(const char *bench, const run_result *pool, const int *peers, size_t npeers,
                  int cache, const char *const *names, const run_result *res, const bool *want);

#endif
