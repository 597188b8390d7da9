/* bench_pool.c — replay a training allocation trace through gradd's pool
 * and its peers, and print one JSON line per figure.
 *
 *   bench_pool TRACE [--repeat N] [--warm-steps N] [--capacity BYTES]
 *                    [--no-timeline] [--timer tsc|clock] [--only NAME,...]
 *                    [--trim-every-steps N] [--gc-threshold X] [--trim-at-step N]
 *
 * The defaults measure what gradd runs: pool_config_default (timeline on,
 * no trim policy), pool_tick at every step boundary as a worker calls it.
 * The last three switch trimming on, for experiments (--trim-at-step N:
 * one full pool_trim just before optimizer step N).
 *
 * TRACE comes from gen_trace.py (its docstring defines the format).
 * Every allocator serves the very same requests on the same single thread,
 * in the order the trace gives:
 *
 *   pool              gradd's pool (pool_config_default) on a simulated cpu
 *                     device of --capacity bytes (default 16 GiB)
 *   pool_expandable   the same with expandable_segments on
 *   device_every_time dev_alloc/dev_free on the cpu device for every request:
 *                     the no-caching baseline
 *   glibc             malloc/free of this process
 *   jemalloc          malloc/free of libjemalloc.so.2, loaded with dlopen
 *                     (RTLD_LOCAL|RTLD_DEEPBIND) so that it serves only the
 *                     calls made through it; mallctl("version") proves it
 *                     is jemalloc.  (Its initial-exec TLS needs a bigger
 *                     static TLS surplus: the program re-executes itself
 *                     once with GLIBC_TUNABLES set when dlopen says so.)
 *
 * Nobody touches the memory it gets: the cpu device and both mallocs map
 * large blocks lazily, so a 5 GiB peak costs no RAM.
 *
 * ---- What is measured --------------------------------------------------------
 * pair time   each alloc and each free call is timed alone (rdtsc, fenced,
 *             calibrated against CLOCK_MONOTONIC; the median cost of an
 *             empty timed region is subtracted); a pair is one request's
 *             alloc time plus its free time.  Median and p99 (nearest rank)
 *             are over the pairs whose alloc comes after the warm-up: the
 *             setup (parameters) and the trace's first --warm-steps optimizer
 *             steps (default 2: the first step also creates grads and AdamW
 *             state).  Phase changes stay in: they are part of the workload.
 *             Blocks still live at the end (parameters, ...) are no pairs.
 *             The medians are also split by request size (<= 1 MiB: small,
 *             where jemalloc makes no system call; above: large), and a
 *             "hot" figure times one 512-byte request allocated and freed
 *             100,000 times in a row: the hit path alone, caches hot.
 *             With --repeat N (default 5) every allocator replays N times,
 *             interleaved, and each timing figure is the median of the N.
 * device allocations per 1,000 requests
 *             device calls that obtain memory — dev_alloc, and for
 *             expandable segments dev_va_map — counted by a wrapper around
 *             the cpu device's function table and cross-checked against
 *             pool_stats.device_allocs.  "overall": every request of the
 *             trace.  "steady": only the requests of optimizer steps whose
 *             index within their phase is >= --warm-steps, i.e. without the
 *             setup, the first steps of the run, and the first steps after
 *             each micro-batch change.
 * peak reserved / peak allocated
 *             pool_stats reserved_bytes[POOL_ALL].peak over
 *             allocated_bytes[POOL_ALL].peak, over the whole replay (read
 *             per phase, peaks reset between phases, so stderr shows each).
 * pool_check runs once at the end of every pool replay (blocks still live),
 * and once more after the leftovers are freed.
 *
 * ---- Output ---------------------------------------------------------------------
 * stdout, one JSON object per line, for bench "pool_trace" (fixed segments)
 * and "pool_trace_expandable":
 *   {"bench":B,"metric":M,"value":V,"unit":U,"peer":P,"peer_value":PV,"ratio":V/PV}
 *   pair_ns_median, pair_ns_p99      vs jemalloc, glibc, device_every_time
 *   pair_ns_median_small/_large, pair_ns_hot_512B               vs jemalloc
 *   device_allocs_per_1000, device_allocs_per_1000_steady vs device_every_time
 *   reserved_over_allocated_peak                        vs "ideal" (1.0)
 * ratio < 1: gradd's pool is better.  stderr: a table for people.
 *
 * The CUDA variant is bench_pool_cuda.c (built where CUDA is): the same
 * trace and figures on one GPU, against cudaMalloc, cudaMallocAsync and
 * PyTorch's caching allocator.  Both programs share trace.c: the timer,
 * the trace reader, the replay loop, the statistics, the pool run, the
 * options both take and the pair-time JSON lines.
 */
#include "trace.h"

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ==== a counting cpu device ============================================================= */

/* The cpu device with the calls that obtain memory counted (trace.h). */
static dev *counting_cpu_create(size_t capacity)
{
    dev *d = NULL;
    dev_status st = dev_cpu_create(capacity, 0, &d);
    if (st != DEV_OK) {
        fprintf(stderr, "bench_pool: dev_cpu_create(%zu): %s\n", capacity, dev_status_str(st));
        return NULL;
    }
    counting_wrap(d);
    return d;
}

/* ==== jemalloc, loaded beside glibc ====================================================== */

static struct {
    void *handle;
    void *(*malloc)(size_t);
    void (*free)(void *);
    int (*mallctl)(const char *, void *, size_t *, void *, size_t);
    const char *version;
    char path[256];
} je;

/* Debian's libjemalloc uses initial-exec TLS, which dlopen can place only
 * in the static TLS surplus glibc reserves at startup — too small by
 * default.  The surplus is a startup tunable, so on that failure the
 * program runs itself again once with a bigger one. */
#define REEXEC_ENV "BENCH_POOL_REEXEC"
#define TLS_TUNABLE "glibc.rtld.optional_static_tls=65536"

static void reexec_with_static_tls(char **argv)
{
    if (getenv(REEXEC_ENV))
        return;
    const char *old = getenv("GLIBC_TUNABLES");
    char buf[1024];
    snprintf(buf, sizeof buf, "%s%s%s", old && *old ? old : "", old && *old ? ":" : "",
             TLS_TUNABLE);
    setenv("GLIBC_TUNABLES", buf, 1);
    setenv(REEXEC_ENV, "1", 1);
    fflush(NULL);
    execv("/proc/self/exe", argv);
    fprintf(stderr, "bench_pool: re-executing with %s failed: %s\n", TLS_TUNABLE, strerror(errno));
}

/* The sanitizers' runtimes abort on RTLD_DEEPBIND; there jemalloc still
 * resolves its own functions internally, only less strictly. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define JE_DEEPBIND 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define JE_DEEPBIND 0
#endif
#endif
#ifndef JE_DEEPBIND
#define JE_DEEPBIND RTLD_DEEPBIND
#endif

static int jemalloc_load(char **argv)
{
    const char *cands[] = {getenv("BENCH_JEMALLOC"), "libjemalloc.so.2",
                           "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0] && !je.handle; i++) {
        if (!cands[i] || !*cands[i])
            continue;
        /* DEEPBIND: jemalloc's own references resolve inside it; LOCAL: its
         * malloc never becomes this process's malloc. */
        je.handle = dlopen(cands[i], RTLD_NOW | RTLD_LOCAL | JE_DEEPBIND);
        if (je.handle) {
            snprintf(je.path, sizeof je.path, "%s", cands[i]);
        } else {
            const char *e = dlerror();
            if (e && strstr(e, "static TLS"))
                reexec_with_static_tls(argv); /* returns only if it cannot */
            fprintf(stderr, "bench_pool: dlopen %s: %s\n", cands[i], e ? e : "?");
        }
    }
    if (!je.handle)
        return -1;
    void *je_malloc_sym = dlsym(je.handle, "malloc");
    *(void **)&je.malloc = je_malloc_sym;
    *(void **)&je.free = dlsym(je.handle, "free");
    *(void **)&je.mallctl = dlsym(je.handle, "mallctl");
    void *glibc_malloc = dlsym(RTLD_DEFAULT, "malloc");
    if (!je.malloc || !je.free || !je.mallctl) {
        fprintf(stderr, "bench_pool: %s lacks malloc/free/mallctl\n", je.path);
        return -1;
    }
    if (je_malloc_sym == glibc_malloc) {
        fprintf(stderr, "bench_pool: %s's malloc is the process's malloc; not a separate peer\n",
                je.path);
        return -1;
    }
    size_t sz = sizeof je.version;
    if (je.mallctl("version", &je.version, &sz, NULL, 0) != 0 || !je.version) {
        fprintf(stderr, "bench_pool: mallctl(\"version\") failed: %s is not jemalloc\n", je.path);
        return -1;
    }
    return 0;
}

/* ==== the allocators ========================================================================= */

typedef struct {
    dev *d;
} alloc_ctx;

static void *devall_a(void *c, size_t size, int tag)
{
    (void)tag;
    void *ptr = NULL;
    return dev_alloc(((alloc_ctx *)c)->d, size, &ptr) == DEV_OK ? ptr : NULL;
}
static void devall_f(void *c, void *ptr, size_t size)
{
    dev_free(((alloc_ctx *)c)->d, ptr, size);
}
static void *glibc_a(void *c, size_t size, int tag)
{
    (void)c;
    (void)tag;
    return malloc(size);
}
static void glibc_f(void *c, void *ptr, size_t size)
{
    (void)c;
    (void)size;
    free(ptr);
}
static void *je_a(void *c, size_t size, int tag)
{
    (void)c;
    (void)tag;
    return je.malloc(size);
}
static void je_f(void *c, void *ptr, size_t size)
{
    (void)c;
    (void)size;
    je.free(ptr);
}

enum { A_POOL, A_POOL_EXP, A_DEVICE, A_GLIBC, A_JEMALLOC, A_COUNT };
static const char *const alloc_names[A_COUNT] = {"pool", "pool_expandable", "device_every_time",
                                                  "glibc", "jemalloc"};

/* ==== one run ================================================================================ */

static int run_one(int which, const trace *t, replay_buf *rb, const bench_opts *o, run_result *r)
{
    if (which == A_POOL || which == A_POOL_EXP) {
        dev *d = counting_cpu_create(o->capacity);
        if (!d)
            return -1;
        int rc = pool_run(d, which == A_POOL_EXP, t, rb, o, alloc_names[which], r);
        dev_destroy(d);
        return rc;
    }

    run_reset(t, rb, r);
    alloc_ctx c = {0};
    int rc = 0;
    if (which == A_DEVICE) {
        c.d = counting_cpu_create(o->capacity);
        if (!c.d)
            return -1;
        rc = replay_timed(t, rb, &c, devall_a, devall_f, NULL, r);
        dev_destroy(c.d);
    } else if (which == A_GLIBC) {
        rc = replay_timed(t, rb, &c, glibc_a, glibc_f, NULL, r);
        r->hot_ns = hot_pairs(rb->pairs, 4 * t->nallocs, &c, glibc_a, glibc_f);
    } else {
        rc = replay_timed(t, rb, &c, je_a, je_f, NULL, r);
        r->hot_ns = hot_pairs(rb->pairs, 4 * t->nallocs, &c, je_a, je_f);
    }
    return run_finish(t, rb, o->warm_steps, rc, r);
}

/* ==== main ======================================================================================= */

static void usage(void)
{
    fprintf(stderr,
            "usage: bench_pool TRACE [--repeat N] [--warm-steps N] [--capacity BYTES]\n"
            "                        [--no-timeline] [--timer tsc|clock] [--only NAME,...]\n"
            "                        [--trim-every-steps N] [--gc-threshold X] [--trim-at-step N]\n"
            "names: pool pool_expandable device_every_time glibc jemalloc\n");
}

int main(int argc, char **argv)
{
    bench_args args = {.repeat = 5};
    bench_opts o = {.capacity = (size_t)16 << 30, .timeline = true, .warm_steps = 2,
                    .trim_at_step = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (bench_arg(argc, argv, &i, &args, &o))
            continue;
        if (!strcmp(a, "--capacity") && v) {
            o.capacity = strtoull(v, NULL, 0);
            i++;
        } else if (!strcmp(a, "--trim-every-steps") && v) {
            o.trim_every_steps = strtoull(v, NULL, 0);
            i++;
        } else if (!strcmp(a, "--trim-at-step") && v) {
            o.trim_at_step = atol(v);
            i++;
        } else if (!strcmp(a, "--gc-threshold") && v) {
            o.gc_threshold = atof(v);
            i++;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else {
            usage();
            return 2;
        }
    }
    if (!args.path || args.repeat < 1 || o.warm_steps < 0 || o.capacity == 0) {
        usage();
        return 2;
    }
    bool want[A_COUNT];
    if (only_select(args.only, alloc_names, A_COUNT, want) != 0)
        return 2;

    if (want[A_JEMALLOC] && jemalloc_load(argv) != 0) {
        fprintf(stderr, "bench_pool: jemalloc unavailable (Debian: apt-get install libjemalloc2)\n");
        return 1;
    }

    timer_setup(args.timer);

    trace t;
    if (trace_load(args.path, &t) != 0)
        return 1;
    if (t.peak_live > o.capacity) {
        fprintf(stderr, "bench_pool: the trace's peak (%" PRIu64 " bytes) exceeds the device's %zu\n",
                t.peak_live, o.capacity);
        return 1;
    }

    replay_buf rb;
    if (replay_buf_init(&rb, &t) != 0)
        return 1;

    trace_describe(args.path, &t);
    timer_describe();
    fprintf(stderr, "timing: pairs allocated from step %d on; steady: steps >= %d of each phase; "
            "%d repeats, figures are the median run\n", o.warm_steps, o.warm_steps, args.repeat);
    fprintf(stderr, "pool config: default, timeline %s, trim_every_steps %" PRIu64
            ", gc_threshold %g, trim at step %ld\n", o.timeline ? "on" : "off",
            o.trim_every_steps, o.gc_threshold, o.trim_at_step);
    if (want[A_JEMALLOC])
        fprintf(stderr, "jemalloc %s from %s\n", je.version, je.path);

    /* Repeats interleaved across allocators, so slow drift of the machine
     * (another build, frequency) hits everyone alike. */
    run_result *runs = calloc((size_t)args.repeat * A_COUNT, sizeof *runs);
    if (!runs)
        return 1;
    for (int r = 0; r < args.repeat; r++) {
        for (int k = 0; k < A_COUNT; k++) {
            if (!want[k])
                continue;
            if (run_one(k, &t, &rb, &o, &runs[r * A_COUNT + k]) != 0) {
                fprintf(stderr, "bench_pool: %s failed\n", alloc_names[k]);
                return 1;
            }
        }
    }

    /* Medians over the repeats; the counts are the same in every run. */
    run_result res[A_COUNT];
    for (int k = 0; k < A_COUNT; k++)
        res[k] = want[k] ? median_result(&runs[k], args.repeat, A_COUNT) : runs[k];

    fprintf(stderr, "\n%-18s %8s %8s %8s %8s %8s %8s %7s %7s %9s %8s %8s\n", "allocator",
            "median", "p99", "mean", "hit med", "small", "large", "hot", "replay", "dev", "/1000",
            "/1000");
    fprintf(stderr, "%-18s %8s %8s %8s %8s %8s %8s %7s %7s %9s %8s %8s\n", "(ns per pair)", "", "",
            "", "", "med", "med", "512B", "ms", "allocs", "all", "steady");
    for (int k = 0; k < A_COUNT; k++) {
        if (!want[k])
            continue;
        run_result *r = &res[k];
        bool dev = k == A_POOL || k == A_POOL_EXP || k == A_DEVICE;
        char c1[32] = "-", c2[32] = "-", c3[32] = "-";
        if (dev) {
            snprintf(c1, sizeof c1, "%" PRIu64, r->dev_allocs);
            snprintf(c2, sizeof c2, "%.3f", 1000.0 * (double)r->dev_allocs / (double)t.nallocs);
            snprintf(c3, sizeof c3, "%.3f",
                     r->requests_steady ? 1000.0 * (double)r->dev_allocs_steady /
                                              (double)r->requests_steady
                                        : 0.0);
        }
        fprintf(stderr, "%-18s %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %7.1f %7.1f %9s %8s %8s\n",
                alloc_names[k], r->median_ns, r->p99_ns, r->mean_ns, r->hit_median_ns,
                r->small_median_ns, r->large_median_ns, r->hot_ns, r->wall_ms, c1, c2, c3);
    }
    {
        run_result *r = NULL;
        for (int k = 0; k < A_COUNT && !r; k++)
            if (want[k])
                r = &res[k];
        fprintf(stderr, "(%" PRIu64 " pairs timed: %" PRIu64 " small <= 1 MiB, %" PRIu64
                " large; \"hit\": pairs whose alloc made no device call;\n"
                " hot: one %d-byte request allocated and freed %d times, caches hot)\n",
                r->npairs, r->nsmall, r->nlarge, HOT_SIZE, HOT_PAIRS);
    }
    for (int k = A_POOL; k <= A_POOL_EXP; k++)
        if (want[k])
            pool_report(alloc_names[k], &t, &res[k], &runs[k]); /* runs[k]: the first repeat */
    fprintf(stderr, "\n");

    /* JSON lines: gradd's pool against each peer; ratio < 1: gradd is better. */
    for (int k = A_POOL; k <= A_POOL_EXP; k++) {
        if (!want[k])
            continue;
        const char *bench = k == A_POOL ? "pool_trace" : "pool_trace_expandable";
        run_result *r = &res[k];
        static const int peers[] = {A_JEMALLOC, A_GLIBC, A_DEVICE};
        emit_pair_ns(bench, r, peers, 3, A_JEMALLOC, alloc_names, res, want);
        double all = per_1000(&t, r);
        double steady = per_1000_steady(r);
        /* The every-time baseline makes one device call per request: 1000. */
        double base_all = 1000.0, base_steady = 1000.0;
        if (want[A_DEVICE]) {
            base_all = per_1000(&t, &res[A_DEVICE]);
            base_steady = per_1000_steady(&res[A_DEVICE]);
        }
        emit(bench, "device_allocs_per_1000", round_to(all, 1e-4), "per_1000_requests",
             "device_every_time", base_all);
        emit(bench, "device_allocs_per_1000_steady", round_to(steady, 1e-4), "per_1000_requests",
             "device_every_time", base_steady);
        emit(bench, "reserved_over_allocated_peak",
             round_to(r->peak_allocated ? (double)r->peak_reserved / (double)r->peak_allocated : NAN,
                      1e-4),
             "ratio", "ideal", 1.0);
    }
    fflush(stdout);
    free(runs);
    replay_buf_free(&rb);
    trace_free(&t);
    return 0;
}
