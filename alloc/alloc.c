/* alloc.c — libgradd-alloc's state and entry points: the environment, one
 * pool per device on the chosen backend, allocation with the budget and
 * the reclaim hook, frees, fork, and the helper thread that keeps the
 * shared page (daemon/pool/pool_shm.h) current and serves the daemon's
 * trim requests and budget changes.
 */
#include "alloc_internal.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "units.h"

alloc_state alloc_g = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .pub_lock = PTHREAD_MUTEX_INITIALIZER,
    .shared_lock = PTHREAD_MUTEX_INITIALIZER,
    .event_fd = -1,
    .page_device = -1,
};

static _Thread_local char last_error[768];

void alloc_set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
}

const char *gradd_alloc_last_error(void) { return last_error; }

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u), .tv_nsec = (long)(ns % 1000000000u)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* ==== fork ===================================================================== */

/* The child inherits the pools' memory but not the device (CUDA cannot be
 * used across fork) nor the helper thread, and any mutex another thread
 * held at the fork stays locked there.  So the child never touches a pool
 * or the page: it refuses to allocate and ignores frees. */
static void atfork_child(void)
{
    atomic_store(&alloc_g.forked, 1);
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    alloc_g.lock = fresh;
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void atfork_register(void) { pthread_atfork(NULL, NULL, atfork_child); }

/* ==== the environment ============================================================ */

static int env_size(const char *name, uint64_t *out)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    char why[128];
    if (units_parse_size(v, out, why, sizeof why) != 0) {
        snprintf(alloc_g.init_error, sizeof alloc_g.init_error, "gradd allocator: %s=%.64s: %s", name,
                 v, why);
        return -1;
    }
    return 0;
}

/* A number in [0, 1]; unset leaves *out alone. */
static int env_fraction(const char *name, double *out)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (*end || errno || !(x >= 0 && x <= 1)) {
        snprintf(alloc_g.init_error, sizeof alloc_g.init_error,
                 "gradd allocator: %s=%.64s: not a number from 0 to 1", name, v);
        return -1;
    }
    *out = x;
    return 0;
}

/* A whole number in [0, max]; unset leaves *out alone. */
static int env_uint(const char *name, uint64_t max, uint64_t *out)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    char *end;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (*v < '0' || *v > '9' || *end || errno || n > max) {
        snprintf(alloc_g.init_error, sizeof alloc_g.init_error,
                 "gradd allocator: %s=%.64s: not a whole number from 0 to %llu", name, v,
                 (unsigned long long)max);
        return -1;
    }
    *out = n;
    return 0;
}

static int read_env(void)
{
    alloc_state *g = &alloc_g;
    const char *be = getenv("GRADD_ALLOC_BACKEND");
    if (!be || !*be)
        be = GRADD_ALLOC_HAVE_CUDA ? "cuda" : "cpu";
    if (strcmp(be, "cpu") == 0) {
        g->cpu = true;
    } else if (strcmp(be, "cuda") == 0) {
        if (!GRADD_ALLOC_HAVE_CUDA) {
            snprintf(g->init_error, sizeof g->init_error,
                     "gradd allocator: GRADD_ALLOC_BACKEND=cuda: this library was built without CUDA");
            return -1;
        }
        g->cpu = false;
    } else {
        snprintf(g->init_error, sizeof g->init_error,
                 "gradd allocator: GRADD_ALLOC_BACKEND=%.64s: expected cuda or cpu", be);
        return -1;
    }
    uint64_t cap = (uint64_t)1 << 30, external = 0, limit = 0, job = 0, ms = 200, expandable = 0, fd = UINT64_MAX,
             efd = UINT64_MAX;
    if (env_size("GRADD_ALLOC_CPU_CAPACITY", &cap) || env_size("GRADD_ALLOC_CPU_EXTERNAL", &external) ||
        env_size("GRADD_ALLOC_LIMIT", &limit) ||
        env_uint("GRADD_ALLOC_EXPANDABLE", 1, &expandable) || env_uint("GRADD_JOB_ID", UINT32_MAX, &job) ||
        env_uint("GRADD_RECLAIM_MS", 10000, &ms) || env_uint("GRADD_POOL_FD", INT_MAX, &fd) ||
        env_uint("GRADD_POOL_EVENTFD", INT_MAX, &efd))
        return -1;
    /* The daemon's [pool] policies, so that a program's pool trims as an
     * engine job's does. */
    pool_config *pc = &g->pool_cfg;
    pool_config_default(pc);
    uint64_t max_split = 0, low = 0, every_ms = 0;
    if (env_fraction("GRADD_ALLOC_GC_THRESHOLD", &pc->gc_threshold) ||
        env_size("GRADD_ALLOC_LOW_WATERMARK", &low) || env_size("GRADD_ALLOC_MAX_SPLIT", &max_split) ||
        env_uint("GRADD_ALLOC_TRIM_EVERY_MS", UINT32_MAX, &every_ms))
        return -1;
    pc->low_watermark = (size_t)low;
    if (max_split)
        pc->max_split_size = (size_t)max_split;
    pc->trim_every_ms = every_ms;
    if (cap == 0 || cap > SIZE_MAX || external > cap) {
        snprintf(g->init_error, sizeof g->init_error,
                 "gradd allocator: GRADD_ALLOC_CPU_CAPACITY must be above 0 and at least "
                 "GRADD_ALLOC_CPU_EXTERNAL");
        return -1;
    }
    g->cpu_capacity = (size_t)cap;
    g->cpu_external = (size_t)external;
    g->env_budget = limit;
    g->expandable = expandable != 0;
    g->job = (uint32_t)job;
    g->reclaim_ns = ms * 1000000u;
    g->event_fd = efd == UINT64_MAX ? -1 : (int)efd;
    if (fd != UINT64_MAX) {
        char why[200];
        g->pg = pool_shm_map((int)fd, why, sizeof why);
        if (!g->pg) {
            snprintf(g->init_error, sizeof g->init_error, "gradd allocator: GRADD_POOL_FD: %s", why);
            return -1;
        }
        atomic_store(&g->pg->pid, (uint64_t)getpid());
    }
    return 0;
}

static void *helper_main(void *arg);

/* 0 once the environment is read (first call), -1 with the error set. */
static int ensure_init(void)
{
    alloc_state *g = &alloc_g;
    int r = atomic_load_explicit(&g->ready, memory_order_acquire);
    if (r == 0) {
        pthread_once(&atfork_once, atfork_register);
        pthread_mutex_lock(&g->lock);
        r = atomic_load(&g->ready);
        if (r == 0) {
            r = read_env() == 0 ? 1 : -1;
            if (r == 1 && g->pg) {
                atomic_store(&g->helper_stop, 0);
                /* The program's signals are for its own threads: the
                 * helper starts (and stays) with all of them blocked. */
                sigset_t all, old;
                sigfillset(&all);
                pthread_sigmask(SIG_SETMASK, &all, &old);
                int rc = pthread_create(&g->helper, NULL, helper_main, NULL);
                pthread_sigmask(SIG_SETMASK, &old, NULL);
                if (rc != 0) {
                    snprintf(g->init_error, sizeof g->init_error,
                             "gradd allocator: cannot start the statistics thread");
                    pool_shm_unmap(g->pg);
                    g->pg = NULL;
                    r = -1;
                } else {
                    g->helper_running = true;
                }
            }
            atomic_store_explicit(&g->ready, r, memory_order_release);
        }
        pthread_mutex_unlock(&g->lock);
    }
    if (r < 0) {
        alloc_set_error("%s", g->init_error);
        return -1;
    }
    return 0;
}

int gradd_alloc_init(void)
{
    if (atomic_load(&alloc_g.forked)) {
        alloc_set_error(ALLOC_FORKED_MSG);
        return -1;
    }
    return ensure_init();
}

/* ==== pools ======================================================================= */

static uint64_t budget_now(void)
{
    alloc_state *g = &alloc_g;
    uint64_t b = g->pg ? atomic_load_explicit(&g->pg->budget, memory_order_relaxed) : 0;
    return b ? b : g->env_budget;
}

static bool reclaim_hook(void *user, size_t bytes, uint32_t job);

/* Device `device`'s pool, made at its first use; NULL with the error set. */
pool *alloc_pool(int device, bool create)
{
    alloc_state *g = &alloc_g;
    if (atomic_load_explicit(&g->forked, memory_order_relaxed)) {
        alloc_set_error(ALLOC_FORKED_MSG);
        return NULL;
    }
    if (device < 0 || device >= ALLOC_MAX_DEVICES) {
        alloc_set_error("gradd allocator: device %d is outside 0..%d", device, ALLOC_MAX_DEVICES - 1);
        return NULL;
    }
    pool *p = atomic_load_explicit(&g->pools[device], memory_order_acquire);
    if (p || !create)
        return p;
    if (ensure_init() != 0)
        return NULL;
    pthread_mutex_lock(&g->lock);
    p = atomic_load(&g->pools[device]);
    if (!p) {
        dev *d = NULL;
        dev_status st = g->cpu ? dev_cpu_create(g->cpu_capacity, device, &d) : alloc_cuda_create(device, &d);
        if (st == DEV_OK && g->cpu)
            st = dev_cpu_set_external(d, g->cpu_external);
        pool_config c = g->pool_cfg;
        c.expandable_segments = g->expandable;
        /* The page carries event counts, not the ring; a short ring keeps
         * each program's host memory small. */
        c.timeline_capacity = 1024;
        if (st != DEV_OK) {
            alloc_set_error("gradd allocator: cannot open device %d: %s%s%s", device, dev_status_str(st),
                            d ? ": " : "", d ? dev_last_error(d) : "");
            dev_destroy(d);
        } else if (pool_create(d, &c, &p) != 0) {
            alloc_set_error("gradd allocator: cannot make a pool on device %d", device);
            dev_destroy(d);
            p = NULL;
        } else {
            g->devs[device] = d;
            if (g->pg)
                pool_set_reclaim(p, reclaim_hook, NULL);
            uint64_t b = budget_now();
            pool_job_set_limit(p, g->job, (size_t)b);
            g->budget_applied[device] = b;
            if (g->page_device < 0)
                g->page_device = device;
            atomic_store_explicit(&g->pools[device], p, memory_order_release);
        }
    }
    pthread_mutex_unlock(&g->lock);
    return p;
}

/* ==== the page ====================================================================== */

void alloc_publish(void)
{
    alloc_state *g = &alloc_g;
    if (!g->pg || g->page_device < 0)
        return;
    pool *p = atomic_load(&g->pools[g->page_device]);
    if (!p)
        return;
    pool_stats *s = &g->pub_stats;
    pthread_mutex_lock(&g->pub_lock);
    atomic_store(&g->dirty, 0);
    pool_stats_read(p, s);
    pool_shm_publish(g->pg, s);
    pthread_mutex_unlock(&g->pub_lock);
}

/* On a simulated device, take what the daemon says gradd's other
 * processes hold as taken from this process's copy of the device.  The
 * word is read again under the lock: two threads that saw different words
 * would otherwise race, and the older could be applied last. */
static void apply_shared(void)
{
    alloc_state *g = &alloc_g;
    if (!g->cpu || !g->pg || g->page_device < 0)
        return;
    if (pool_shm_shared(g->pg) == atomic_load_explicit(&g->shared_applied, memory_order_relaxed))
        return;
    pthread_mutex_lock(&g->shared_lock);
    uint64_t v = pool_shm_shared(g->pg);
    if (v != atomic_load_explicit(&g->shared_applied, memory_order_relaxed)) {
        atomic_store_explicit(&g->shared_applied, v, memory_order_relaxed);
        dev_cpu_set_shared(g->devs[g->page_device], (size_t)(v > SIZE_MAX ? SIZE_MAX : v));
    }
    pthread_mutex_unlock(&g->shared_lock);
}

/* One tick; whether the program or the daemon did anything since the
 * last (an allocation or free, a budget change, a trim request). */
static bool helper_tick(void)
{
    alloc_state *g = &alloc_g;
    bool busy = atomic_load_explicit(&g->dirty, memory_order_relaxed);
    uint64_t b = budget_now();
    for (int i = 0; i < ALLOC_MAX_DEVICES; i++) {
        pool *p = atomic_load(&g->pools[i]);
        if (p && g->budget_applied[i] != b) {
            pool_job_set_limit(p, g->job, (size_t)b);
            g->budget_applied[i] = b;
            busy = true;
        }
    }
    /* The pool's own policies (gc_threshold, low_watermark, periodic)
     * every 50 ticks: often enough for them, rarely enough that allocating
     * threads seldom meet this thread on the pool's lock. */
    if (++g->ticks % 50 == 0) {
        /* low_watermark asks the device what is free; on a simulated one
         * that is only true once the others' share is applied, and an idle
         * program allocates nothing that would apply it. */
        apply_shared();
        for (int i = 0; i < ALLOC_MAX_DEVICES; i++) {
            pool *p = atomic_load(&g->pools[i]);
            if (p)
                pool_tick(p, 0);
        }
        /* What a policy trimmed is on the page within the tick. */
        atomic_store_explicit(&g->dirty, 1, memory_order_relaxed);
    }
    uint64_t target = 0;
    pool_trim_reason why;
    uint64_t req = pool_shm_trim_pending(g->pg, &target, &why);
    if (req) {
        for (int i = 0; i < ALLOC_MAX_DEVICES; i++) {
            pool *p = atomic_load(&g->pools[i]);
            if (p)
                pool_trim(p, why, (size_t)target);
        }
        alloc_publish();
        pool_shm_trim_ack(g->pg, req);
        busy = true;
    } else if (atomic_load_explicit(&g->dirty, memory_order_relaxed)) {
        alloc_publish();
    }
    return busy;
}

/* The helper thread: every tick (alloc_internal.h: ALLOC_TICK_NS, or
 * ALLOC_IDLE_TICK_NS once the program is quiet) it applies a changed
 * budget, serves a trim request and publishes what changed.  Doing this here
 * rather than in gradd_alloc keeps the allocation path off the page (a
 * snapshot and its publication cost about 0.5 us, three times a cached
 * allocation and free) and lets a process that has gone quiet still
 * answer a trim. */
static void *helper_main(void *arg)
{
    (void)arg;
    alloc_state *g = &alloc_g;
    unsigned quiet = 0;
    while (!atomic_load(&g->helper_stop)) {
        sleep_ns(quiet >= ALLOC_QUIET_TICKS ? ALLOC_IDLE_TICK_NS : ALLOC_TICK_NS);
        quiet = helper_tick() ? 0 : quiet + 1;
    }
    return NULL;
}

/* ==== allocation ===================================================================== */

/* The pool's reclaim hook: ask the daemon to have the other jobs on the
 * device give back their caches, and wait a bounded time for its answer. */
static bool reclaim_hook(void *user, size_t bytes, uint32_t job)
{
    (void)user;
    (void)job;
    alloc_state *g = &alloc_g;
    if (!g->reclaim_ns)
        return false;
    uint64_t seq = pool_shm_reclaim_ask(g->pg, bytes);
    if (g->event_fd >= 0) {
        uint64_t one = 1;
        if (write(g->event_fd, &one, sizeof one) < 0) {
            /* The daemon polls need_seq as well; a full or closed eventfd
             * only costs it the early wake-up. */
        }
    }
    uint64_t deadline = mono_ns() + g->reclaim_ns;
    while (!pool_shm_reclaim_answered(g->pg, seq) && mono_ns() < deadline)
        sleep_ns(1000000);
    bool done = pool_shm_reclaim_answered(g->pg, seq);
    apply_shared();
    return done;
}

static void set_oom_error(int device, size_t bytes, const pool_oom_report *oom)
{
    char rq[16], lim[16], held[16];
    units_format_size(bytes, rq, sizeof rq);
    if (oom->job_limit_hit) {
        units_format_size(oom->job_limit, lim, sizeof lim);
        units_format_size(oom->job_allocated, held, sizeof held);
        alloc_set_error("CUDA out of memory. Tried to allocate %s on device %d, over the job's "
                        "budget ([memory] limit) of %s: it holds %s. (gradd: %s)",
                        rq, device, lim, held, oom->message);
    } else {
        alloc_set_error("CUDA out of memory. Tried to allocate %s on device %d. (gradd: %s)", rq,
                        device, oom->message);
    }
}

void *gradd_alloc(ssize_t size, int device, void *stream)
{
    last_error[0] = 0;
    if (size <= 0) {
        if (size < 0)
            alloc_set_error("gradd allocator: negative size %zd", size);
        return NULL;
    }
    pool *p = alloc_pool(device, true);
    if (!p)
        return NULL;
    alloc_state *g = &alloc_g;
    uint32_t job = g->job;
    pool_oom_report oom;
    apply_shared();
    /* The pool calls reclaim_hook when the device is short. */
    void *ptr = pool_alloc_stream(p, (size_t)size, POOL_TAG_OTHER, job, (uintptr_t)stream, &oom);
    if (!ptr)
        set_oom_error(device, (size_t)size, &oom);
    atomic_store_explicit(&g->dirty, 1, memory_order_relaxed);
    return ptr;
}

void gradd_free(void *ptr, ssize_t size, int device, void *stream)
{
    (void)size;
    (void)stream;
    if (!ptr || atomic_load_explicit(&alloc_g.forked, memory_order_relaxed))
        return;
    /* A device never allocated on owns no pointer: nothing to free. */
    pool *p = alloc_pool(device, false);
    if (!p)
        return;
    pool_free(p, ptr);
    atomic_store_explicit(&alloc_g.dirty, 1, memory_order_relaxed);
}

void gradd_alloc_shutdown(void)
{
    alloc_state *g = &alloc_g;
    if (atomic_load(&g->forked))
        return;
    if (g->helper_running) {
        atomic_store(&g->helper_stop, 1);
        pthread_join(g->helper, NULL);
        g->helper_running = false;
    }
    if (g->pg) {
        alloc_publish();
        pool_shm_unmap(g->pg);
        g->pg = NULL;
    }
    for (int i = 0; i < ALLOC_MAX_DEVICES; i++) {
        pool *p = atomic_load(&g->pools[i]);
        atomic_store(&g->pools[i], NULL);
        pool_destroy(p);
        if (g->devs[i])
            dev_destroy(g->devs[i]);
        g->devs[i] = NULL;
        g->budget_applied[i] = 0;
    }
    g->page_device = -1;
    g->event_fd = -1;
    g->ticks = 0;
    atomic_store(&g->shared_applied, 0);
    g->init_error[0] = 0;
    atomic_store(&g->dirty, 0);
    atomic_store(&g->ready, 0);
}
