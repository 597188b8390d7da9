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
 * TRACE comes from bench/gen_trace.py (its docstring defines the format).
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
 * ---- The CUDA variant (not built yet) ------------------------------------------
 * When a GPU is lent, the same parsed trace replays on one CUDA device, from
 * one host thread, each peer in turn with the device otherwise idle.  The
 * timed figure is the host time of each call, which is what a training
 * thread waits for (none of these calls launches kernels):
 *   pool / pool_expandable  gradd's pool on the cuda backend (dev_cuda_probe,
 *                           pool_create on the device it returns);
 *                           expandable = cuMemAddressReserve + cuMemCreate/
 *                           cuMemMap chunks
 *   cudaMalloc              cudaMalloc/cudaFree every time: the device
 *                           every-time baseline (cudaFree synchronises)
 *   cudaMallocAsync         cudaMallocAsync/cudaFreeAsync on one stream from
 *                           a cudaMemPool_t with cudaMemPoolAttrReleaseThreshold
 *                           UINT64_MAX (it caches); one stream sync at the end
 *   torch                   PyTorch's caching allocator through
 *                           torch.cuda.caching_allocator_alloc/delete, from a
 *                           small Python driver reading the same trace and
 *                           timing each call with time.perf_counter_ns; it
 *                           prints the same JSON lines with peer "torch" and,
 *                           beside them, the cost of an empty Python call,
 *                           since its figure includes that overhead
 * Device allocations: the pool's device_allocs (the same counting wrapper
 * works on the cuda device's ops table); every cudaMalloc call; for
 * cudaMallocAsync, cudaMemPoolAttrReservedMemHigh / UsedMemHigh give the
 * reserved/allocated peaks; for torch, torch.cuda.memory_stats()'s
 * num_device_alloc and reserved/allocated_bytes.all.peak.  The trace's peak
 * (~5 GiB) fits any lent GPU.  Build: a second executable here, linked with
 * cudart, only when have_cuda; the trace reader and the statistics above
 * move to a shared bench/trace.c then.
 */
#include "dev.h"
#include "pool.h"

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ==== timing ========================================================================= */

static bool use_tsc;
static double ticks_per_ns = 1.0;
static uint64_t tick_overhead; /* median cost of an empty timed region */

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

/* The TSC is a clock only where it is invariant (constant and nonstop). */
static bool tsc_invariant(void)
{
#if defined(__x86_64__)
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return false;
    char line[8192];
    bool ok = false;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) == 0) {
            ok = strstr(line, " constant_tsc") && strstr(line, " nonstop_tsc") &&
                 strstr(line, " rdtscp");
            break;
        }
    }
    fclose(f);
    return ok;
#else
    return false;
#endif
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void timer_calibrate(void)
{
    if (use_tsc) {
        /* 100 ms of busy waiting against CLOCK_MONOTONIC. */
        uint64_t n0 = clock_ns(), t0 = tsc_begin();
        while (clock_ns() - n0 < 100000000u)
            ;
        uint64_t t1 = tsc_end(), n1 = clock_ns();
        ticks_per_ns = (double)(t1 - t0) / (double)(n1 - n0);
    }
    enum { N = 200001 };
    static uint64_t v[N];
    for (int i = 0; i < N; i++) {
        uint64_t a = tick_begin();
        uint64_t b = tick_end();
        v[i] = b - a;
    }
    qsort(v, N, sizeof v[0], cmp_u64);
    tick_overhead = v[N / 2];
}

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

static void *xgrow(void *p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return p;
    size_t nc = *cap ? *cap : 4096;
    while (nc < need)
        nc *= 2;
    char *np = realloc(p, nc * elem);
    if (!np) {
        fprintf(stderr, "bench_pool: out of memory reading the trace\n");
        exit(1);
    }
    memset(np + *cap * elem, 0, (nc - *cap) * elem);
    *cap = nc;
    return np;
}

static void trace_free(trace *t)
{
    free(t->ops);
    free(t->steps);
    free(t->alloc_step);
    memset(t, 0, sizeof *t);
}

static int trace_load(const char *path, trace *t)
{
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "bench_pool: cannot open trace %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t ops_cap = 0, steps_cap = 0, ids_cap = 0;
    uint64_t *id_size = NULL;
    uint8_t *id_state = NULL; /* 0 unseen, 1 live, 2 freed; sized like alloc_step */
    size_t size_cap = 0, state_cap = 0;
    uint64_t live = 0;
    int32_t cur_step = -1, phase_first_step = 0;
    char *line = NULL;
    size_t len = 0;
    unsigned long lineno = 0;
    int rc = -1;

    while (getline(&line, &len, f) > 0) {
        lineno++;
        const char *s = line;
        if (*s == '\n')
            continue;
        if (*s == '#') {
            int a, b;
            if (sscanf(s, "# phase %d micro=%d", &a, &b) == 2) {
                if (a != t->nphases || a >= 64) {
                    fprintf(stderr, "%s:%lu: phase %d out of order\n", path, lineno, a);
                    goto out;
                }
                t->phase_micro[t->nphases++] = b;
                phase_first_step = (int32_t)t->nsteps;
            } else if (sscanf(s, "# step %d", &a) == 1) {
                if (a != (int)t->nsteps || t->nphases == 0) {
                    fprintf(stderr, "%s:%lu: step %d out of order or before a phase\n", path,
                            lineno, a);
                    goto out;
                }
                t->steps = xgrow(t->steps, &steps_cap, t->nsteps + 1, sizeof *t->steps);
                t->steps[t->nsteps++] = (trace_step){
                    .phase = t->nphases - 1, .in_phase = a - phase_first_step};
                cur_step = a;
                t->ops = xgrow(t->ops, &ops_cap, t->nops + 1, sizeof *t->ops);
                t->ops[t->nops++] = (trace_op){.kind = OP_STEP, .id = (uint32_t)a};
            }
            continue;
        }
        char op = 0;
        unsigned long long id = 0, size = 0;
        char tagname[32] = "";
        int n = sscanf(s, "%c %llu %llu %31s", &op, &id, &size, tagname);
        if (op == 'a' && n == 4) {
            pool_tag tag;
            if (pool_tag_parse(tagname, &tag) != 0 || id >= (1ull << 31) || size == 0) {
                fprintf(stderr, "%s:%lu: bad alloc line: %s", path, lineno, s);
                goto out;
            }
            id_size = xgrow(id_size, &size_cap, id + 1, sizeof *id_size);
            id_state = xgrow(id_state, &state_cap, id + 1, sizeof *id_state);
            t->alloc_step = xgrow(t->alloc_step, &ids_cap, id + 1, sizeof *t->alloc_step);
            if (id_state[id]) {
                fprintf(stderr, "%s:%lu: id %llu allocated twice\n", path, lineno, id);
                goto out;
            }
            id_state[id] = 1;
            id_size[id] = size;
            t->alloc_step[id] = cur_step;
            if (id + 1 > t->nids)
                t->nids = (uint32_t)(id + 1);
            if (cur_step < 0)
                t->setup_allocs++;
            else
                t->steps[cur_step].allocs++;
            t->ops = xgrow(t->ops, &ops_cap, t->nops + 1, sizeof *t->ops);
            t->ops[t->nops++] = (trace_op){
                .kind = OP_ALLOC, .id = (uint32_t)id, .size = size, .tag = (uint8_t)tag};
            t->nallocs++;
            live += size;
            if (live > t->peak_live)
                t->peak_live = live;
        } else if (op == 'f' && n >= 2) {
            if (id >= state_cap || id_state[id] != 1) {
                fprintf(stderr, "%s:%lu: free of id %llu, which is not live\n", path, lineno, id);
                goto out;
            }
            id_state[id] = 2;
            live -= id_size[id];
            t->ops = xgrow(t->ops, &ops_cap, t->nops + 1, sizeof *t->ops);
            t->ops[t->nops++] =
                (trace_op){.kind = OP_FREE, .id = (uint32_t)id, .size = id_size[id]};
            t->nfrees++;
        } else {
            fprintf(stderr, "%s:%lu: cannot parse: %s", path, lineno, s);
            goto out;
        }
    }
    if (ferror(f)) {
        fprintf(stderr, "bench_pool: reading %s: %s\n", path, strerror(errno));
        goto out;
    }
    if (t->nallocs == 0 || t->nsteps == 0) {
        fprintf(stderr, "bench_pool: %s has no allocations or no steps\n", path);
        goto out;
    }
    rc = 0;
out:
    if (rc != 0)
        trace_free(t);
    free(line);
    fclose(f);
    free(id_size);
    free(id_state);
    return rc;
}

/* ==== a counting cpu device ============================================================= */

/* The cpu device with its function table copied and the two calls that
 * obtain memory counted: what "device allocation" means for every peer
 * that uses the device. */
static uint64_t dev_calls;
static const dev_ops *cpu_real_ops;
static dev_ops counting_ops;

static dev_status counting_alloc(dev *d, size_t bytes, void **ptr)
{
    dev_calls++;
    return cpu_real_ops->alloc(d, bytes, ptr);
}

static dev_status counting_va_map(dev *d, void *addr, size_t bytes)
{
    dev_calls++;
    return cpu_real_ops->va_map(d, addr, bytes);
}

static dev *counting_cpu_create(size_t capacity)
{
    dev *d = NULL;
    dev_status st = dev_cpu_create(capacity, 0, &d);
    if (st != DEV_OK) {
        fprintf(stderr, "bench_pool: dev_cpu_create(%zu): %s\n", capacity, dev_status_str(st));
        return NULL;
    }
    cpu_real_ops = d->ops;
    counting_ops = *d->ops;
    counting_ops.alloc = counting_alloc;
    if (counting_ops.va_map)
        counting_ops.va_map = counting_va_map;
    d->ops = &counting_ops;
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

typedef struct run_result run_result;

typedef struct {
    dev *d;
    pool *p;
    const struct trace *t;
    run_result *r;
    pool_stats *st;
    long trim_at_step;
} alloc_ctx;

static void *pool_a(void *c, size_t size, int tag)
{
    return pool_alloc(((alloc_ctx *)c)->p, size, (pool_tag)tag, 1, NULL);
}
static void pool_f(void *c, void *ptr, size_t size)
{
    (void)size;
    pool_free(((alloc_ctx *)c)->p, ptr);
}
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

/* ==== the replay ================================================================================ */

typedef struct {
    void **ptr;        /* per id */
    uint32_t *at, *ft; /* ticks of each id's alloc and free */
    uint8_t *miss;     /* the alloc called the device */
    uint64_t *step_dev; /* dev_calls when step s began; [nsteps] = at the end */
    uint64_t *pairs;   /* scratch */
} replay_buf;

struct run_result {
    bool ok;
    double median_ns, p99_ns, mean_ns, hit_median_ns, wall_ms;
    double small_median_ns, large_median_ns; /* requests <= 1 MiB / above */
    double hot_ns;                           /* hot_pairs(); 0 where not run */
    uint64_t npairs, nmiss_pairs, nsmall, nlarge;
    uint64_t dev_allocs, dev_allocs_steady, requests_steady;
    /* pool only */
    bool is_pool;
    uint64_t stat_device_allocs;
    int64_t peak_reserved, peak_allocated; /* the maxima of the phases' */
    int64_t phase_peak_reserved[64], phase_peak_allocated[64], phase_end_reserved[64];
    uint64_t phase_dev_allocs[64];
    bool check_ok;
};

/* A phase ends: note its peaks and start the next phase's from here. */
static void pool_phase_close(alloc_ctx *c, int phase)
{
    pool_stats_read(c->p, c->st);
    c->r->phase_peak_allocated[phase] = c->st->allocated_bytes[POOL_ALL].peak;
    c->r->phase_peak_reserved[phase] = c->st->reserved_bytes[POOL_ALL].peak;
    c->r->phase_end_reserved[phase] = c->st->reserved_bytes[POOL_ALL].current;
    pool_stats_reset_peaks(c->p);
}

/* Between steps, untimed: what a training worker does (pool_tick), plus
 * the per-phase figures. */
static void pool_s(void *cv, uint32_t step)
{
    alloc_ctx *c = cv;
    const trace_step *ts = &c->t->steps[step];
    if (ts->in_phase == 0 && step > 0)
        pool_phase_close(c, ts->phase - 1);
    pool_tick(c->p, (uint64_t)step + 1);
    if ((long)step == c->trim_at_step)
        pool_trim(c->p, POOL_TRIM_REQUEST, 0);
}

/* The pool's small-pool limit: the split of the summary's medians. */
#define SMALL_REQUEST ((uint64_t)1 << 20)

static inline uint32_t clamp32(uint64_t v) { return v > UINT32_MAX ? UINT32_MAX : (uint32_t)v; }

/* Always inlined into each caller with constant A and F, so every peer's
 * timed region holds one direct call. */
static inline __attribute__((always_inline)) int
replay(const trace *t, replay_buf *rb, void *ctx, void *(*A)(void *, size_t, int),
       void (*F)(void *, void *, size_t), void (*S)(void *, uint32_t))
{
    for (size_t i = 0; i < t->nops; i++) {
        const trace_op *o = &t->ops[i];
        if (o->kind == OP_ALLOC) {
            uint64_t dc = dev_calls;
            uint64_t t0 = tick_begin();
            void *p = A(ctx, o->size, o->tag);
            uint64_t t1 = tick_end();
            if (!p) {
                fprintf(stderr, "bench_pool: allocation %u of %" PRIu64 " bytes failed\n", o->id,
                        o->size);
                return -1;
            }
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
static void free_leftovers(const trace *t, replay_buf *rb, void *ctx,
                           void (*F)(void *, void *, size_t))
{
    for (size_t i = 0; i < t->nops; i++) {
        const trace_op *o = &t->ops[i];
        if (o->kind == OP_ALLOC && rb->ptr[o->id]) {
            F(ctx, rb->ptr[o->id], o->size);
            rb->ptr[o->id] = NULL;
        }
    }
}

static double ticks_to_ns(uint64_t ticks) { return (double)ticks / ticks_per_ns; }

static double median_ticks(uint64_t *v, size_t n)
{
    if (!n)
        return 0;
    qsort(v, n, sizeof *v, cmp_u64);
    return ticks_to_ns(v[(n - 1) / 2]);
}

/* Pair figures and device counts from the buffers of one replay.  Pairs are
 * the ids freed during the trace, in free order. */
static void summarise(const trace *t, replay_buf *rb, int warm_steps, run_result *r)
{
    size_t n = 0, nh = 0, ns = 0, nl = 0, nmiss = 0;
    uint64_t sum = 0;
    uint64_t *hits = rb->pairs + t->nallocs, *smalls = hits + t->nallocs,
             *larges = smalls + t->nallocs;
    for (size_t i = 0; i < t->nops; i++) {
        const trace_op *o = &t->ops[i];
        if (o->kind != OP_FREE)
            continue;
        int32_t s = t->alloc_step[o->id];
        if (s < warm_steps)
            continue;
        uint64_t a = rb->at[o->id] > tick_overhead ? rb->at[o->id] - tick_overhead : 0;
        uint64_t f = rb->ft[o->id] > tick_overhead ? rb->ft[o->id] - tick_overhead : 0;
        rb->pairs[n++] = a + f;
        sum += a + f;
        if (rb->miss[o->id])
            nmiss++;
        else
            hits[nh++] = a + f;
        if (o->size <= SMALL_REQUEST)
            smalls[ns++] = a + f;
        else
            larges[nl++] = a + f;
    }
    r->npairs = n;
    r->nmiss_pairs = nmiss;
    r->median_ns = median_ticks(rb->pairs, n);
    if (n) {
        size_t k = (size_t)ceil(0.99 * (double)n);
        r->p99_ns = ticks_to_ns(rb->pairs[(k ? k : 1) - 1]);
        r->mean_ns = ticks_to_ns(sum) / (double)n;
    }
    r->hit_median_ns = median_ticks(hits, nh);
    r->small_median_ns = median_ticks(smalls, ns);
    r->large_median_ns = median_ticks(larges, nl);
    r->nsmall = ns;
    r->nlarge = nl;

    r->dev_allocs = rb->step_dev[t->nsteps];
    for (uint32_t s = 0; s < t->nsteps; s++)
        r->phase_dev_allocs[t->steps[s].phase] += rb->step_dev[s + 1] - rb->step_dev[s];
    r->phase_dev_allocs[0] += rb->step_dev[0]; /* the setup */
    r->dev_allocs_steady = 0;
    r->requests_steady = 0;
    for (uint32_t s = 0; s < t->nsteps; s++) {
        if (t->steps[s].in_phase < warm_steps)
            continue;
        r->dev_allocs_steady += rb->step_dev[s + 1] - rb->step_dev[s];
        r->requests_steady += t->steps[s].allocs;
    }
}

typedef struct {
    size_t capacity;
    bool timeline;
    int warm_steps;
    uint64_t trim_every_steps; /* pool_config's, for experiments; 0 = default (off) */
    double gc_threshold;
    long trim_at_step; /* experiment: pool_trim(REQUEST) once, before this step; -1 = never */
} bench_opts;

static int run_one(int which, const trace *t, replay_buf *rb, const bench_opts *o, run_result *r)
{
    memset(r, 0, sizeof *r);
    alloc_ctx c = {0};
    dev_calls = 0;
    memset(rb->step_dev, 0, (t->nsteps + 1) * sizeof *rb->step_dev);
    int rc = 0;
    uint64_t w0 = clock_ns();

    if (which == A_POOL || which == A_POOL_EXP) {
        r->is_pool = true;
        c.d = counting_cpu_create(o->capacity);
        if (!c.d)
            return -1;
        pool_config cfg;
        pool_config_default(&cfg);
        cfg.expandable_segments = which == A_POOL_EXP;
        if (!o->timeline)
            cfg.timeline_capacity = 0;
        cfg.trim_every_steps = o->trim_every_steps;
        cfg.gc_threshold = o->gc_threshold;
        if (pool_create(c.d, &cfg, &c.p) != 0) {
            fprintf(stderr, "bench_pool: pool_create failed\n");
            dev_destroy(c.d);
            return -1;
        }
        pool_stats *st = calloc(1, sizeof *st);
        if (!st) {
            pool_destroy(c.p);
            dev_destroy(c.d);
            return -1;
        }
        c.t = t;
        c.r = r;
        c.st = st;
        c.trim_at_step = o->trim_at_step;
        rc = replay(t, rb, &c, pool_a, pool_f, pool_s);
        r->wall_ms = (double)(clock_ns() - w0) / 1e6;
        if (rc == 0)
            pool_phase_close(&c, t->nphases - 1);

        char err[512] = "";
        r->check_ok = pool_check(c.p, err, sizeof err) == 0;
        if (!r->check_ok)
            fprintf(stderr, "bench_pool: %s: pool_check failed with blocks live: %s\n",
                    alloc_names[which], err);
        pool_stats_read(c.p, st);
        r->stat_device_allocs = st->device_allocs;
        for (int ph = 0; ph < t->nphases; ph++) {
            if (r->phase_peak_reserved[ph] > r->peak_reserved)
                r->peak_reserved = r->phase_peak_reserved[ph];
            if (r->phase_peak_allocated[ph] > r->peak_allocated)
                r->peak_allocated = r->phase_peak_allocated[ph];
        }
        if (which == A_POOL_EXP && !st->expandable_segments) {
            fprintf(stderr, "bench_pool: expandable segments are not in effect\n");
            rc = -1;
        }
        free_leftovers(t, rb, &c, pool_f);
        if (pool_check(c.p, err, sizeof err) != 0) {
            fprintf(stderr, "bench_pool: %s: pool_check failed after freeing all: %s\n",
                    alloc_names[which], err);
            r->check_ok = false;
        }
        {
            pool_stats_read(c.p, st);
            if (st->allocated_bytes[POOL_ALL].current != 0 || st->invalid_frees != 0) {
                fprintf(stderr, "bench_pool: %s: %" PRId64 " bytes still allocated, %" PRIu64
                        " invalid frees after freeing all\n",
                        alloc_names[which], st->allocated_bytes[POOL_ALL].current,
                        st->invalid_frees);
                r->check_ok = false;
            }
        }
        free(st);
        r->hot_ns = hot_pairs(rb->pairs, 4 * t->nallocs, &c, pool_a, pool_f);
        pool_destroy(c.p);
        dev_destroy(c.d);
    } else if (which == A_DEVICE) {
        c.d = counting_cpu_create(o->capacity);
        if (!c.d)
            return -1;
        rc = replay(t, rb, &c, devall_a, devall_f, NULL);
        r->wall_ms = (double)(clock_ns() - w0) / 1e6;
        free_leftovers(t, rb, &c, devall_f);
        dev_destroy(c.d);
    } else if (which == A_GLIBC) {
        rc = replay(t, rb, &c, glibc_a, glibc_f, NULL);
        r->wall_ms = (double)(clock_ns() - w0) / 1e6;
        free_leftovers(t, rb, &c, glibc_f);
        r->hot_ns = hot_pairs(rb->pairs, 4 * t->nallocs, &c, glibc_a, glibc_f);
    } else {
        rc = replay(t, rb, &c, je_a, je_f, NULL);
        r->wall_ms = (double)(clock_ns() - w0) / 1e6;
        free_leftovers(t, rb, &c, je_f);
        r->hot_ns = hot_pairs(rb->pairs, 4 * t->nallocs, &c, je_a, je_f);
    }
    if (rc != 0)
        return -1;
    summarise(t, rb, o->warm_steps, r);
    r->ok = !r->is_pool || r->check_ok;
    return r->ok ? 0 : -1;
}

/* ==== output ==================================================================================== */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void json_num(double v)
{
    if (!isfinite(v))
        fputs("null", stdout);
    else if (v == floor(v) && fabs(v) < 1e15)
        printf("%.0f", v);
    else
        printf("%.6g", v);
}

static void emit(const char *bench, const char *metric, double value, const char *unit,
                 const char *peer, double peer_value)
{
    printf("{\"bench\":\"%s\",\"metric\":\"%s\",\"value\":", bench, metric);
    json_num(value);
    printf(",\"unit\":\"%s\",\"peer\":\"%s\",\"peer_value\":", unit, peer);
    json_num(peer_value);
    printf(",\"ratio\":");
    json_num(peer_value != 0 ? value / peer_value : NAN);
    printf("}\n");
}

static double round_to(double v, double q) { return round(v / q) * q; }

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
    const char *path = NULL, *only = NULL, *timer = NULL;
    int repeat = 5;
    bench_opts o = {.capacity = (size_t)16 << 30, .timeline = true, .warm_steps = 2,
                    .trim_at_step = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--repeat") && v) {
            repeat = atoi(v);
            i++;
        } else if (!strcmp(a, "--warm-steps") && v) {
            o.warm_steps = atoi(v);
            i++;
        } else if (!strcmp(a, "--capacity") && v) {
            o.capacity = strtoull(v, NULL, 0);
            i++;
        } else if (!strcmp(a, "--timer") && v) {
            timer = v;
            i++;
        } else if (!strcmp(a, "--only") && v) {
            only = v;
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
        } else if (!strcmp(a, "--no-timeline")) {
            o.timeline = false;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else if (a[0] != '-' && !path) {
            path = a;
        } else {
            usage();
            return 2;
        }
    }
    if (!path || repeat < 1 || o.warm_steps < 0 || o.capacity == 0) {
        usage();
        return 2;
    }
    bool want[A_COUNT];
    for (int k = 0; k < A_COUNT; k++) {
        if (!only) {
            want[k] = true;
            continue;
        }
        size_t l = strlen(alloc_names[k]);
        const char *s = only;
        want[k] = false;
        while (s && *s) {
            if (!strncmp(s, alloc_names[k], l) && (s[l] == ',' || s[l] == 0))
                want[k] = true;
            s = strchr(s, ',');
            if (s)
                s++;
        }
    }

    if (want[A_JEMALLOC] && jemalloc_load(argv) != 0) {
        fprintf(stderr, "bench_pool: jemalloc unavailable (Debian: apt-get install libjemalloc2)\n");
        return 1;
    }

    use_tsc = timer ? !strcmp(timer, "tsc") : tsc_invariant();
    if (use_tsc && !tsc_invariant())
        fprintf(stderr, "bench_pool: warning: the TSC is not invariant here; use --timer clock\n");
    timer_calibrate();

    trace t;
    if (trace_load(path, &t) != 0)
        return 1;
    if (t.peak_live > o.capacity) {
        fprintf(stderr, "bench_pool: the trace's peak (%" PRIu64 " bytes) exceeds the device's %zu\n",
                t.peak_live, o.capacity);
        return 1;
    }

    replay_buf rb = {
        .ptr = calloc(t.nids, sizeof(void *)),
        .at = calloc(t.nids, sizeof(uint32_t)),
        .ft = calloc(t.nids, sizeof(uint32_t)),
        .miss = calloc(t.nids, 1),
        .step_dev = calloc(t.nsteps + 1, sizeof(uint64_t)),
        .pairs = calloc(4 * t.nallocs + 1, sizeof(uint64_t)),
    };
    if (!rb.ptr || !rb.at || !rb.ft || !rb.miss || !rb.step_dev || !rb.pairs) {
        fprintf(stderr, "bench_pool: out of memory\n");
        return 1;
    }

    fprintf(stderr, "trace %s: %zu ops (%zu allocs, %zu frees), %u steps in %d phases (micro",
            path, t.nops, t.nallocs, t.nfrees, t.nsteps, t.nphases);
    for (int k = 0; k < t.nphases; k++)
        fprintf(stderr, "%c%d", k ? ',' : ' ', t.phase_micro[k]);
    fprintf(stderr, "), peak live %.2f GiB\n", (double)t.peak_live / (1 << 30));
    fprintf(stderr, "timer: %s, %.3f ticks/ns, %.1f ns overhead subtracted per call\n",
            use_tsc ? "rdtsc" : "clock_gettime", ticks_per_ns, ticks_to_ns(tick_overhead));
    fprintf(stderr, "timing: pairs allocated from step %d on; steady: steps >= %d of each phase; "
            "%d repeats, figures are the median run\n", o.warm_steps, o.warm_steps, repeat);
    fprintf(stderr, "pool config: default, timeline %s, trim_every_steps %" PRIu64
            ", gc_threshold %g, trim at step %ld\n", o.timeline ? "on" : "off",
            o.trim_every_steps, o.gc_threshold, o.trim_at_step);
    if (want[A_JEMALLOC])
        fprintf(stderr, "jemalloc %s from %s\n", je.version, je.path);

    /* Repeats interleaved across allocators, so slow drift of the machine
     * (another build, frequency) hits everyone alike. */
    run_result *runs = calloc((size_t)repeat * A_COUNT, sizeof *runs);
    if (!runs)
        return 1;
    for (int r = 0; r < repeat; r++) {
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
    double *v = calloc((size_t)repeat, sizeof *v);
    for (int k = 0; k < A_COUNT; k++) {
        res[k] = runs[k];
        if (!want[k])
            continue;
#define MED(field)                                   \
    do {                                             \
        for (int r = 0; r < repeat; r++)             \
            v[r] = runs[r * A_COUNT + k].field;      \
        res[k].field = median_of(v, repeat);         \
    } while (0)
        MED(median_ns);
        MED(p99_ns);
        MED(mean_ns);
        MED(hit_median_ns);
        MED(wall_ms);
        MED(small_median_ns);
        MED(large_median_ns);
        MED(hot_ns);
#undef MED
    }
    free(v);

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
    for (int k = A_POOL; k <= A_POOL_EXP; k++) {
        if (!want[k])
            continue;
        run_result *r = &res[k];
        fprintf(stderr,
                "%s: peak reserved %.3f GiB / peak allocated %.3f GiB = %.4f; "
                "pool_stats.device_allocs %" PRIu64 "%s; pool_check %s\n",
                alloc_names[k], (double)r->peak_reserved / (1 << 30),
                (double)r->peak_allocated / (1 << 30),
                r->peak_allocated ? (double)r->peak_reserved / (double)r->peak_allocated : 0.0,
                r->stat_device_allocs,
                r->stat_device_allocs == r->dev_allocs ? " (matches the device's count)"
                                                       : " (DIFFERS from the device's count)",
                r->check_ok ? "ok" : "FAILED");
    }
    for (int k = A_POOL; k <= A_POOL_EXP; k++) {
        if (!want[k])
            continue;
        run_result *r = &runs[k]; /* the first repeat; these figures never vary */
        fprintf(stderr, "%s by phase:  micro  peak alloc  peak reserved  res/alloc  end reserved"
                "  dev allocs\n", alloc_names[k]);
        for (int ph = 0; ph < t.nphases; ph++)
            fprintf(stderr, "%*d  %5d  %8.3f GiB  %9.3f GiB  %9.4f  %8.3f GiB  %10" PRIu64 "\n",
                    (int)strlen(alloc_names[k]) + 10, ph, t.phase_micro[ph],
                    (double)r->phase_peak_allocated[ph] / (1 << 30),
                    (double)r->phase_peak_reserved[ph] / (1 << 30),
                    r->phase_peak_allocated[ph]
                        ? (double)r->phase_peak_reserved[ph] / (double)r->phase_peak_allocated[ph]
                        : 0.0,
                    (double)r->phase_end_reserved[ph] / (1 << 30), r->phase_dev_allocs[ph]);
    }
    fprintf(stderr, "\n");

    /* JSON lines: gradd's pool against each peer; ratio < 1: gradd is better. */
    for (int k = A_POOL; k <= A_POOL_EXP; k++) {
        if (!want[k])
            continue;
        const char *bench = k == A_POOL ? "pool_trace" : "pool_trace_expandable";
        run_result *r = &res[k];
        static const int peers[] = {A_JEMALLOC, A_GLIBC, A_DEVICE};
        for (size_t i = 0; i < 3; i++)
            if (want[peers[i]])
                emit(bench, "pair_ns_median", round_to(r->median_ns, 0.1), "ns",
                     alloc_names[peers[i]], round_to(res[peers[i]].median_ns, 0.1));
        for (size_t i = 0; i < 3; i++)
            if (want[peers[i]])
                emit(bench, "pair_ns_p99", round_to(r->p99_ns, 0.1), "ns", alloc_names[peers[i]],
                     round_to(res[peers[i]].p99_ns, 0.1));
        /* The same split the summary shows: the bookkeeping cost where
         * jemalloc makes no system call (small), and the hit path alone. */
        if (want[A_JEMALLOC]) {
            emit(bench, "pair_ns_median_small", round_to(r->small_median_ns, 0.1), "ns",
                 "jemalloc", round_to(res[A_JEMALLOC].small_median_ns, 0.1));
            emit(bench, "pair_ns_median_large", round_to(r->large_median_ns, 0.1), "ns",
                 "jemalloc", round_to(res[A_JEMALLOC].large_median_ns, 0.1));
            emit(bench, "pair_ns_hot_512B", round_to(r->hot_ns, 0.1), "ns", "jemalloc",
                 round_to(res[A_JEMALLOC].hot_ns, 0.1));
        }
        double all = 1000.0 * (double)r->dev_allocs / (double)t.nallocs;
        double steady = r->requests_steady
                            ? 1000.0 * (double)r->dev_allocs_steady / (double)r->requests_steady
                            : NAN;
        /* The every-time baseline makes one device call per request: 1000. */
        double base_all = 1000.0, base_steady = 1000.0;
        if (want[A_DEVICE]) {
            base_all = 1000.0 * (double)res[A_DEVICE].dev_allocs / (double)t.nallocs;
            base_steady = res[A_DEVICE].requests_steady
                              ? 1000.0 * (double)res[A_DEVICE].dev_allocs_steady /
                                    (double)res[A_DEVICE].requests_steady
                              : NAN;
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
    free(rb.ptr);
    free(rb.at);
    free(rb.ft);
    free(rb.miss);
    free(rb.step_dev);
    free(rb.pairs);
    trace_free(&t);
    return 0;
}
