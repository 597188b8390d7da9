/* bench_pool_cuda.c — the pool trace benchmark on one CUDA device.
 *
 *   bench_pool_cuda TRACE [--repeat N] [--warm-steps N] [--device N]
 *                         [--module DIR|PATH] [--no-timeline] [--timer tsc|clock]
 *                         [--only NAME,...]
 *
 * bench_pool.c's header defines the trace, the figures and the output; this
 * is its "CUDA variant" section built.  The same parsed trace replays on one
 * CUDA device from one host thread, each allocator in turn with the device
 * otherwise idle, repeats interleaved (--repeat, default 5; each timing
 * figure is the median run).  What is timed is the host time of each call —
 * what a training thread waits for; none of these calls launches a kernel.
 *
 *   pool             gradd's pool (pool_config_default) on the cuda backend,
 *                    the very gradd-cuda.so module gradd loads (dev_cuda_probe)
 *   pool_expandable  the same with expandable_segments: cuMemAddressReserve,
 *                    then cuMemCreate/cuMemMap per granularity chunk
 *   cudaMalloc       cudaMalloc/cudaFree for every request: the no-caching
 *                    baseline (cudaFree synchronises the device)
 *   cudaMallocAsync  cudaMallocAsync/cudaFreeAsync on one non-blocking stream,
 *                    from a cudaMemPool_t made the device's current pool, its
 *                    cudaMemPoolAttrReleaseThreshold at UINT64_MAX so that it
 *                    keeps what is freed (it caches); one stream sync at the end
 * PyTorch's caching allocator is the fifth peer, from Python:
 * peer_torch_gpu.py, joined to these lines by bench/pool/run_gpu.sh.
 *
 * Device allocations ("device_allocs_per_1000", overall and steady):
 *   pool*            device calls that obtain memory — dev_alloc (cudaMalloc)
 *                    and dev_va_map — counted by the wrapper of trace.h and
 *                    cross-checked against pool_stats.device_allocs.  One
 *                    dev_va_map maps one or more granularity chunks with one
 *                    cuMemCreate each; stderr gives the cuMemCreate count too.
 *   cudaMalloc       every request: 1000.
 *   cudaMallocAsync  requests during which the pool's
 *                    cudaMemPoolAttrReservedMemCurrent grew (read after each
 *                    allocation, untimed): the pool had to get memory from
 *                    the driver.  The driver's own calls are not visible.
 * Peak reserved / peak allocated: pool_stats for gradd (as bench_pool);
 * cudaMemPoolAttrReservedMemHigh / cudaMemPoolAttrUsedMemHigh for
 * cudaMallocAsync (a fresh pool per run, so the highs are the run's).
 *
 * Output: JSON lines as bench_pool's, benches "pool_trace_cuda" and
 * "pool_trace_cuda_expandable", peers cudaMallocAsync and cudaMalloc (and
 * "ideal" for the peak ratio); ratio < 1: gradd's pool is better.
 *
 * Exit 77 (meson's "skipped") with the reason on stderr where no CUDA
 * device can be used — e.g. on a build machine without a driver, where the
 * runtime says "CUDA driver version is insufficient for CUDA runtime
 * version".  The driver API is never linked (see dev_cuda.c): everything
 * here is the runtime, and the pool's device is the module's.
 */
#include "trace.h"

#include <cuda_runtime_api.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { A_POOL, A_POOL_EXP, A_CUDAMALLOC, A_ASYNC, A_COUNT };
static const char *const alloc_names[A_COUNT] = {"pool", "pool_expandable", "cudaMalloc",
                                                  "cudaMallocAsync"};

/* ==== cudaMalloc every time ================================================================== */

static void *cm_a(void *c, size_t size, int tag)
{
    (void)c;
    (void)tag;
    void *p = NULL;
    dev_calls++; /* each one is a device allocation, by definition */
    return cudaMalloc(&p, size) == cudaSuccess ? p : NULL;
}
static void cm_f(void *c, void *ptr, size_t size)
{
    (void)c;
    (void)size;
    cudaFree(ptr);
}

/* ==== cudaMallocAsync from a caching cudaMemPool_t =============================================== */

typedef struct {
    cudaStream_t stream;
    cudaMemPool_t pool;
    unsigned long long reserved; /* ReservedMemCurrent after the last allocation */
} async_ctx;

static void *as_a(void *c, size_t size, int tag)
{
    (void)tag;
    void *p = NULL;
    return cudaMallocAsync(&p, size, ((async_ctx *)c)->stream) == cudaSuccess ? p : NULL;
}
static void as_f(void *c, void *ptr, size_t size)
{
    (void)size;
    cudaFreeAsync(ptr, ((async_ctx *)c)->stream);
}
/* After each allocation, untimed: did the pool grow? */
static void as_p(void *cv)
{
    async_ctx *c = cv;
    unsigned long long cur = 0;
    if (cudaMemPoolGetAttribute(c->pool, cudaMemPoolAttrReservedMemCurrent, &cur) == cudaSuccess &&
        cur > c->reserved) {
        dev_calls++;
        c->reserved = cur;
    }
}

static bool cuda_ok(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return true;
    fprintf(stderr, "%s: %s: %s\n", bench_prog, what, cudaGetErrorString(e));
    return false;
}

static int run_async(int device, const trace *t, replay_buf *rb, const bench_opts *o, run_result *r)
{
    async_ctx c = {0};
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t old = NULL;
    if (!cuda_ok(cudaDeviceGetMemPool(&old, device), "cudaDeviceGetMemPool") ||
        !cuda_ok(cudaMemPoolCreate(&c.pool, &props), "cudaMemPoolCreate"))
        return -1;
    /* Without a release threshold the pool gives memory back at every
     * synchronisation; UINT64_MAX makes it a caching allocator. */
    unsigned long long threshold = UINT64_MAX;
    int rc = -1;
    if (!cuda_ok(cudaMemPoolSetAttribute(c.pool, cudaMemPoolAttrReleaseThreshold, &threshold),
                 "cudaMemPoolSetAttribute(ReleaseThreshold)") ||
        !cuda_ok(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking), "cudaStreamCreate"))
        goto out_pool;
    /* cudaMallocAsync itself (not cudaMallocFromPoolAsync) takes the
     * device's current pool: the call frameworks make. */
    if (!cuda_ok(cudaDeviceSetMemPool(device, c.pool), "cudaDeviceSetMemPool"))
        goto out_stream;

    rc = replay_timed(t, rb, &c, as_a, as_f, as_p, r);
    if (!cuda_ok(cudaStreamSynchronize(c.stream), "cudaStreamSynchronize"))
        rc = -1;
    unsigned long long high_res = 0, high_used = 0;
    if (!cuda_ok(cudaMemPoolGetAttribute(c.pool, cudaMemPoolAttrReservedMemHigh, &high_res),
                 "cudaMemPoolGetAttribute(ReservedMemHigh)") ||
        !cuda_ok(cudaMemPoolGetAttribute(c.pool, cudaMemPoolAttrUsedMemHigh, &high_used),
                 "cudaMemPoolGetAttribute(UsedMemHigh)"))
        rc = -1;
    r->peak_reserved = (int64_t)high_res;
    r->peak_allocated = (int64_t)high_used;
    if (rc == 0) {
        r->hot_ns = hot_pairs(rb->pairs, 4 * t->nallocs, &c, as_a, as_f);
        cudaStreamSynchronize(c.stream);
    }
    cudaDeviceSetMemPool(device, old);
out_stream:
    cudaStreamDestroy(c.stream);
out_pool:
    cudaMemPoolDestroy(c.pool);
    return run_finish(t, rb, o->warm_steps, rc, r);
}

/* ==== one run ================================================================================ */

static int run_one(int which, dev *d, const trace *t, replay_buf *rb, const bench_opts *o,
                   run_result *r)
{
    if (which == A_POOL || which == A_POOL_EXP)
        return pool_run(d, which == A_POOL_EXP, t, rb, o, alloc_names[which], r);

    run_reset(t, rb, r);
    if (which == A_ASYNC)
        return run_async(d->index, t, rb, o, r);

    int rc = replay_timed(t, rb, NULL, cm_a, cm_f, NULL, r);
    return run_finish(t, rb, o->warm_steps, rc, r);
}

/* ==== main ======================================================================================= */

static void usage(void)
{
    fprintf(stderr,
            "usage: bench_pool_cuda TRACE [--repeat N] [--warm-steps N] [--device N]\n"
            "                             [--module DIR|PATH] [--no-timeline] [--timer tsc|clock]\n"
            "                             [--only NAME,...]\n"
            "names: pool pool_expandable cudaMalloc cudaMallocAsync\n"
            "--module: gradd-cuda.so or its directory (default: ../../daemon from this\n"
            "          program, as in a build tree, else where gradd looks)\n");
}

/* The module's directory: given, or the build tree's daemon/ beside bench/,
 * or NULL (dev_cuda_probe then looks beside the program and where gradd is
 * installed). */
static const char *module_dir(const char *arg, char *buf, size_t len)
{
    if (arg) {
        snprintf(buf, len, "%s", arg);
        size_t n = strlen(buf);
        if (n > 3 && !strcmp(buf + n - 3, ".so")) {
            char *slash = strrchr(buf, '/');
            if (!slash)
                snprintf(buf, len, ".");
            else
                *slash = '\0';
        }
        return buf;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return NULL;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash)
        return NULL;
    *slash = '\0';
    snprintf(buf, len, "%s/../../daemon", exe);
    char probe[PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/gradd-cuda.so", buf);
    return access(probe, F_OK) == 0 ? buf : NULL;
}

int main(int argc, char **argv)
{
    bench_prog = "bench_pool_cuda";
    const char *module = NULL;
    int device = 0;
    bench_args args = {.repeat = 5};
    bench_opts o = {.timeline = true, .warm_steps = 2, .trim_at_step = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (bench_arg(argc, argv, &i, &args, &o))
            continue;
        if (!strcmp(a, "--device") && v) {
            device = atoi(v);
            i++;
        } else if (!strcmp(a, "--module") && v) {
            module = v;
            i++;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else {
            usage();
            return 2;
        }
    }
    if (!args.path || args.repeat < 1 || o.warm_steps < 0 || device < 0) {
        usage();
        return 2;
    }
    bool want[A_COUNT];
    if (only_select(args.only, alloc_names, A_COUNT, want) != 0)
        return 2;

    trace t;
    if (trace_load(args.path, &t) != 0)
        return 1;

    /* No usable GPU is a skip, not a failure: ask the runtime first, so the
     * reason is the runtime's own words. */
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        fprintf(stderr, "%s: skipped, no usable CUDA device: %s\n", bench_prog,
                e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports no devices");
        trace_free(&t);
        return 77;
    }
    if (device >= ndev) {
        fprintf(stderr, "%s: --device %d, but there are %d CUDA device(s)\n", bench_prog, device,
                ndev);
        return 2;
    }

    /* The pool's device comes from the module gradd itself loads. */
    char dirbuf[PATH_MAX];
    const char *mdir = module_dir(module, dirbuf, sizeof dirbuf);
    dev *devs[16];
    char why[256] = "";
    int n = dev_cuda_probe(mdir, devs, 16, why, sizeof why);
    dev *d = NULL;
    for (int i = 0; i < n; i++) {
        if (devs[i]->index == device)
            d = devs[i];
        else
            dev_destroy(devs[i]);
    }
    if (!d) {
        fprintf(stderr, "%s: the runtime sees %d CUDA device(s), but the gradd-cuda module%s%s "
                "gave no device %d: %s\n", bench_prog, ndev, mdir ? " in " : "", mdir ? mdir : "",
                device, why[0] ? why : "not among those it opened");
        return 1;
    }
    counting_wrap(d);
    /* The context exists before anything is timed. */
    if (!cuda_ok(cudaSetDevice(device), "cudaSetDevice") || !cuda_ok(cudaFree(NULL), "cudaFree(0)"))
        return 1;
    size_t gran = dev_va_granularity(d);
    if (want[A_POOL_EXP] && gran == 0) {
        fprintf(stderr, "%s: %s has no virtual memory management here; pool_expandable skipped\n",
                bench_prog, d->id);
        want[A_POOL_EXP] = false;
    }
    size_t dfree = 0, dtotal = 0;
    dev_mem_info(d, &dfree, &dtotal);
    if (t.peak_live > dfree) {
        fprintf(stderr, "%s: the trace's peak (%" PRIu64 " bytes) exceeds the %zu bytes free on %s\n",
                bench_prog, t.peak_live, dfree, d->id);
        return 1;
    }
    int rtver = 0, drver = 0;
    cudaRuntimeGetVersion(&rtver);
    cudaDriverGetVersion(&drver);

    timer_setup(args.timer);

    replay_buf rb;
    if (replay_buf_init(&rb, &t) != 0)
        return 1;

    trace_describe(args.path, &t);
    fprintf(stderr, "device: %s (%s), %.1f GiB free of %.1f GiB; runtime %d, driver %d; "
            "vmm granularity %zu KiB; module %s\n", d->id, d->name, (double)dfree / (1 << 30),
            (double)dtotal / (1 << 30), rtver, drver, gran >> 10, mdir ? mdir : "(default)");
    timer_describe();
    fprintf(stderr, "timing: host time per call; pairs allocated from step %d on; steady: steps "
            ">= %d of each phase; %d repeats, figures are the median run\n", o.warm_steps,
            o.warm_steps, args.repeat);
    fprintf(stderr, "pool config: default, timeline %s\n", o.timeline ? "on" : "off");

    run_result *runs = calloc((size_t)args.repeat * A_COUNT, sizeof *runs);
    if (!runs)
        return 1;
    for (int r = 0; r < args.repeat; r++) {
        for (int k = 0; k < A_COUNT; k++) {
            if (!want[k])
                continue;
            if (run_one(k, d, &t, &rb, &o, &runs[r * A_COUNT + k]) != 0) {
                fprintf(stderr, "%s: %s failed\n", bench_prog, alloc_names[k]);
                return 1;
            }
        }
    }
    run_result res[A_COUNT];
    for (int k = 0; k < A_COUNT; k++)
        res[k] = want[k] ? median_result(&runs[k], args.repeat, A_COUNT) : runs[k];

    /* ---- stderr: for people ---- */
    fprintf(stderr, "\n%-16s %9s %9s %9s %9s %9s %9s %8s %8s %8s %8s %8s\n", "allocator",
            "median", "p99", "mean", "hit med", "small", "large", "hot", "replay", "dev",
            "/1000", "/1000");
    fprintf(stderr, "%-16s %9s %9s %9s %9s %9s %9s %8s %8s %8s %8s %8s\n", "(ns per pair)", "",
            "", "", "", "med", "med", "512B", "ms", "allocs", "all", "steady");
    for (int k = 0; k < A_COUNT; k++) {
        if (!want[k])
            continue;
        const run_result *r = &res[k];
        fprintf(stderr, "%-16s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %8.1f %8.1f %8" PRIu64
                " %8.3f %8.3f\n", alloc_names[k], r->median_ns, r->p99_ns, r->mean_ns,
                r->hit_median_ns, r->small_median_ns, r->large_median_ns, r->hot_ns, r->wall_ms,
                r->dev_allocs, per_1000(&t, r), per_1000_steady(r));
    }
    for (int k = 0; k < A_COUNT; k++) {
        if (!want[k])
            continue;
        fprintf(stderr, "(%" PRIu64 " pairs timed: %" PRIu64 " small <= 1 MiB, %" PRIu64
                " large; \"hit\": pairs whose alloc obtained no device memory;\n"
                " hot: one %d-byte request allocated and freed %d times; cudaMalloc: not run)\n",
                res[k].npairs, res[k].nsmall, res[k].nlarge, HOT_SIZE, HOT_PAIRS);
        break;
    }
    for (int k = A_POOL; k <= A_POOL_EXP; k++)
        if (want[k])
            pool_report(alloc_names[k], &t, &res[k], &runs[k]); /* runs[k]: the first repeat */
    if (want[A_POOL_EXP] && gran)
        fprintf(stderr, "pool_expandable: %" PRIu64 " dev_va_map calls mapped %" PRIu64
                " chunks of %zu KiB (one cuMemCreate each): %.3f cuMemCreate per 1000 requests\n",
                res[A_POOL_EXP].dev_allocs, res[A_POOL_EXP].va_bytes / gran, gran >> 10,
                1000.0 * (double)(res[A_POOL_EXP].va_bytes / gran) / (double)t.nallocs);
    if (want[A_ASYNC]) {
        const run_result *r = &res[A_ASYNC];
        fprintf(stderr, "cudaMallocAsync: ReservedMemHigh %.3f GiB / UsedMemHigh %.3f GiB = %.4f; "
                "release threshold UINT64_MAX\n", (double)r->peak_reserved / (1 << 30),
                (double)r->peak_allocated / (1 << 30),
                r->peak_allocated ? (double)r->peak_reserved / (double)r->peak_allocated : 0.0);
    }
    fprintf(stderr, "\n");

    /* ---- stdout: JSON lines, gradd's pool against each peer ---- */
    for (int k = A_POOL; k <= A_POOL_EXP; k++) {
        if (!want[k])
            continue;
        const char *bench = k == A_POOL ? "pool_trace_cuda" : "pool_trace_cuda_expandable";
        const run_result *r = &res[k];
        static const int peers[] = {A_ASYNC, A_CUDAMALLOC};
        emit_pair_ns(bench, r, peers, 2, A_ASYNC, alloc_names, res, want);
        for (size_t i = 0; i < 2; i++)
            if (want[peers[i]])
                emit(bench, "device_allocs_per_1000", round_to(per_1000(&t, r), 1e-4),
                     "per_1000_requests", alloc_names[peers[i]],
                     round_to(per_1000(&t, &res[peers[i]]), 1e-4));
        for (size_t i = 0; i < 2; i++)
            if (want[peers[i]])
                emit(bench, "device_allocs_per_1000_steady", round_to(per_1000_steady(r), 1e-4),
                     "per_1000_requests", alloc_names[peers[i]],
                     round_to(per_1000_steady(&res[peers[i]]), 1e-4));
        double ratio = r->peak_allocated ? (double)r->peak_reserved / (double)r->peak_allocated
                                         : NAN;
        if (want[A_ASYNC]) {
            const run_result *a = &res[A_ASYNC];
            emit(bench, "reserved_over_allocated_peak", round_to(ratio, 1e-4), "ratio",
                 "cudaMallocAsync",
                 round_to(a->peak_allocated ? (double)a->peak_reserved / (double)a->peak_allocated
                                            : NAN,
                          1e-4));
        }
        emit(bench, "reserved_over_allocated_peak", round_to(ratio, 1e-4), "ratio", "ideal", 1.0);
    }
    fflush(stdout);
    free(runs);
    replay_buf_free(&rb);
    dev_destroy(d);
    trace_free(&t);
    return 0;
}
