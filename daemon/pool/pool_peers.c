/* pool_peers.c — the program jobs' pools on one device (pool_peers.h): the
 * list of their pages, the thread that answers their reclaim requests and
 * keeps the idle trim, the simulated device's sharing and the timeline,
 * and the hook that reclaims from them for the daemon's own pool.
 *
 * A peer is reference-counted: the thread, a reclaim in a job thread and a
 * reader in the event loop each take references under the list's lock,
 * then work on the pages without it, so nobody waits on a program while
 * holding the lock another caller needs.  A removed peer is freed by
 * whoever drops its last reference.
 */
#include "pool_peers.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "pool_shm.h"

#define PEERS_TICK_NS ((uint64_t)100000000)
/* A program's reclaim requests closer together than this are answered at
 * once, without asking the others again: a program retrying in a loop
 * (or a hostile one) cannot keep the other jobs' caches at zero. */
#define PEERS_RECLAIM_SPACING_NS ((uint64_t)50000000)
/* A page whose writer is mid-publish for longer than this is read as not
 * live this time. */
#define PEERS_READ_NS ((uint64_t)1000000)

typedef struct peer {
    uint32_t job;
    pool_shm_page *pg;
    int efd;
    int refs; /* under pp->lock */
    bool removed;
    _Atomic uint64_t reclaims;
    _Atomic uint64_t last_reserved; /* as last read, for when a read fails */
    /* The thread's own (no lock): what the last tick saw. */
    uint64_t activity, active_ns, last_reclaim_ns;
    bool idle_trimmed, seen;
    uint64_t reserved, trims, trimmed_bytes, ooms;
} peer;

struct pool_peers {
    dev *d;
    pool *own;
    uint64_t idle_trim_ns;
    pthread_mutex_t lock;
    peer *peers[POOL_PEERS_MAX];
    size_t n;
    int wake_fd;
    _Atomic uint64_t last_hook_ns; /* the daemon's pool's last reclaim */
    pthread_t thread;
    bool running;
    _Atomic bool stop;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void nap_ms(unsigned ms)
{
    struct timespec ts = {0, (long)ms * 1000000};
    nanosleep(&ts, NULL);
}

static void peer_free(peer *p)
{
    pool_shm_unmap(p->pg);
    if (p->efd >= 0)
        close(p->efd);
    free(p);
}

/* References to every peer still added; returns how many. */
static size_t grab(pool_peers *pp, peer **out)
{
    pthread_mutex_lock(&pp->lock);
    size_t n = pp->n;
    for (size_t i = 0; i < n; i++) {
        out[i] = pp->peers[i];
        out[i]->refs++;
    }
    pthread_mutex_unlock(&pp->lock);
    return n;
}

static void drop(pool_peers *pp, peer **ps, size_t n)
{
    peer *gone[POOL_PEERS_MAX];
    size_t ngone = 0;
    pthread_mutex_lock(&pp->lock);
    for (size_t i = 0; i < n; i++)
        if (--ps[i]->refs == 0 && ps[i]->removed)
            gone[ngone++] = ps[i];
    pthread_mutex_unlock(&pp->lock);
    for (size_t i = 0; i < ngone; i++)
        peer_free(gone[i]);
}

static void wake(pool_peers *pp)
{
    uint64_t one = 1;
    if (pp->wake_fd >= 0 && write(pp->wake_fd, &one, sizeof one) < 0) {
        /* Full: the thread has a wake-up pending already. */
    }
}

static bool read_page(const peer *p, pool_stats *s)
{
    return pool_shm_read(p->pg, s, PEERS_READ_NS) == 0;
}

static size_t cached_of(const pool_stats *s)
{
    int64_t res = s->reserved_bytes[POOL_ALL].current, all = s->allocated_bytes[POOL_ALL].current;
    return res > all ? (size_t)(res - all) : 0;
}

/* ==== the simulated device ========================================================= */

/* Each process's copy of the device counts what the others hold. */
static void share(pool_peers *pp, peer **ps, size_t n, pool_stats *s)
{
    if (pp->d->kind != DEV_KIND_CPU)
        return;
    uint64_t res[POOL_PEERS_MAX], sum = 0;
    for (size_t i = 0; i < n; i++) {
        if (read_page(ps[i], s))
            atomic_store(&ps[i]->last_reserved, (uint64_t)s->reserved_bytes[POOL_ALL].current);
        res[i] = atomic_load(&ps[i]->last_reserved);
        sum += res[i];
    }
    dev_cpu_set_shared(pp->d, (size_t)sum);
    pool_stats_read(pp->own, s);
    uint64_t daemon = (uint64_t)s->reserved_bytes[POOL_ALL].current + dev_cpu_external(pp->d);
    for (size_t i = 0; i < n; i++)
        pool_shm_set_shared(ps[i]->pg, daemon + sum - res[i]);
}

/* ==== trims and reclaims ============================================================ */

/* Ask each of ps (but job `except`, 0: none) that caches anything to give
 * it all back for reason why, and wait at most timeout_ns for the
 * answers.  Returns how far their reserved bytes dropped. */
static size_t trim_peers(pool_peers *pp, peer **ps, size_t n, uint32_t except, pool_trim_reason why,
                         uint64_t timeout_ns, size_t *answered, pool_stats *s)
{
    (void)pp;
    uint64_t req[POOL_PEERS_MAX] = {0}, before[POOL_PEERS_MAX] = {0};
    size_t asked = 0;
    for (size_t i = 0; i < n; i++) {
        if (ps[i]->job == except || !read_page(ps[i], s))
            continue;
        before[i] = (uint64_t)s->reserved_bytes[POOL_ALL].current;
        if (why == POOL_TRIM_RECLAIM && !cached_of(s))
            continue;
        req[i] = pool_shm_request_trim(ps[i]->pg, 0, why);
        asked++;
    }
    size_t done = 0;
    uint64_t deadline = now_ns() + timeout_ns;
    for (;;) {
        done = 0;
        for (size_t i = 0; i < n; i++)
            done += req[i] && pool_shm_trim_done(ps[i]->pg, req[i]);
        if (done == asked || now_ns() >= deadline)
            break;
        nap_ms(1);
    }
    size_t freed = 0;
    for (size_t i = 0; i < n; i++)
        if (req[i] && read_page(ps[i], s) && (uint64_t)s->reserved_bytes[POOL_ALL].current < before[i])
            freed += (size_t)(before[i] - (uint64_t)s->reserved_bytes[POOL_ALL].current);
    if (answered)
        *answered = done;
    return freed;
}

/* Another job on the device (`job`) needs `bytes`: the programs but that
 * one give back their caches, and, for a program, the daemon's pool too
 * (an engine job's miss has trimmed it already). */
static bool reclaim(pool_peers *pp, uint32_t job, size_t bytes, bool trim_own)
{
    (void)bytes;
    pool_stats *s = malloc(sizeof *s);
    if (!s)
        return false;
    peer *ps[POOL_PEERS_MAX];
    size_t n = grab(pp, ps);
    size_t freed = trim_peers(pp, ps, n, job, POOL_TRIM_RECLAIM, POOL_PEERS_RECLAIM_NS, NULL, s);
    if (trim_own) {
        pool_stats_read(pp->own, s);
        if (cached_of(s))
            freed += pool_trim(pp->own, POOL_TRIM_RECLAIM, 0).bytes;
    }
    share(pp, ps, n, s);
    drop(pp, ps, n);
    free(s);
    return freed > 0;
}

bool pool_peers_reclaim_hook(void *user, size_t bytes, uint32_t job)
{
    pool_peers *pp = user;
    /* An engine job probing for the largest micro-batch that fits fails
     * allocations on purpose, many in a row: the programs give back what
     * they cache once, not at every probe, and a program that does not
     * answer costs one wait. */
    uint64_t now = now_ns(), last = atomic_load(&pp->last_hook_ns);
    if (last && now - last < PEERS_RECLAIM_SPACING_NS)
        return false;
    if (!pool_peers_count(pp))
        return false;
    atomic_store(&pp->last_hook_ns, now);
    return reclaim(pp, job, bytes, false);
}

size_t pool_peers_trim(pool_peers *pp, uint64_t timeout_ns, size_t *answered)
{
    *answered = 0;
    pool_stats *s = malloc(sizeof *s);
    if (!s)
        return 0;
    peer *ps[POOL_PEERS_MAX];
    size_t n = grab(pp, ps);
    size_t freed = trim_peers(pp, ps, n, 0, POOL_TRIM_REQUEST, timeout_ns, answered, s);
    share(pp, ps, n, s);
    drop(pp, ps, n);
    free(s);
    return freed;
}

/* ==== the thread ====================================================================== */

/* What changed in a program's pool since the last tick, on the device's
 * timeline under its job; and its idle trim. */
static void tick_peer(pool_peers *pp, peer *p, const pool_stats *s, uint64_t now)
{
    uint64_t reserved = (uint64_t)s->reserved_bytes[POOL_ALL].current;
    uint64_t activity = s->allocations[POOL_ALL].allocated + s->allocations[POOL_ALL].freed;
    if (!p->seen) {
        p->seen = true;
        p->active_ns = now;
    } else {
        if (reserved > p->reserved)
            pool_timeline_mark(pp->own, POOL_EV_SEGMENT_MAP, p->job, (size_t)(reserved - p->reserved), "program");
        if (reserved < p->reserved)
            pool_timeline_mark(pp->own, POOL_EV_SEGMENT_UNMAP, p->job, (size_t)(p->reserved - reserved),
                               "program");
        if (s->trims > p->trims)
            pool_timeline_mark(pp->own, POOL_EV_TRIM, p->job,
                               (size_t)(s->trimmed_bytes >= p->trimmed_bytes ? s->trimmed_bytes - p->trimmed_bytes : 0),
                               "program");
        if (s->ooms > p->ooms)
            pool_timeline_mark(pp->own, POOL_EV_OOM, p->job, 0, "program");
    }
    p->reserved = reserved;
    p->trims = s->trims;
    p->trimmed_bytes = s->trimmed_bytes;
    p->ooms = s->ooms;
    if (activity != p->activity) {
        p->activity = activity;
        p->active_ns = now;
        p->idle_trimmed = false;
    } else if (pp->idle_trim_ns && !p->idle_trimmed && now - p->active_ns >= pp->idle_trim_ns &&
               cached_of(s)) {
        /* No allocation or free for idle_trim: the cache is better off
         * with the device.  Not waited for; the next tick sees it. */
        pool_shm_request_trim(p->pg, 0, POOL_TRIM_IDLE);
        p->idle_trimmed = true;
    }
}

static void serve(pool_peers *pp, peer **ps, size_t n, pool_stats *s, uint64_t now)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t bytes = 0, seq = pool_shm_reclaim_pending(ps[i]->pg, &bytes);
        if (!seq)
            continue;
        if (now - ps[i]->last_reclaim_ns >= PEERS_RECLAIM_SPACING_NS || !ps[i]->last_reclaim_ns) {
            reclaim(pp, ps[i]->job, (size_t)bytes, true);
            now = now_ns();
            ps[i]->last_reclaim_ns = now;
        } else {
            share(pp, ps, n, s);
        }
        atomic_fetch_add(&ps[i]->reclaims, 1);
        pool_shm_reclaim_answer(ps[i]->pg, seq);
    }
}

static void *peers_main(void *arg)
{
    pool_peers *pp = arg;
    pool_stats *s = malloc(sizeof *s);
    uint64_t next_tick = 0;
    while (s && !atomic_load(&pp->stop)) {
        peer *ps[POOL_PEERS_MAX];
        size_t n = grab(pp, ps);
        struct pollfd fds[POOL_PEERS_MAX + 1];
        size_t nf = 0;
        fds[nf++] = (struct pollfd){pp->wake_fd, POLLIN, 0};
        for (size_t i = 0; i < n; i++)
            if (ps[i]->efd >= 0)
                fds[nf++] = (struct pollfd){ps[i]->efd, POLLIN, 0};
        uint64_t now = now_ns();
        int wait_ms = next_tick > now ? (int)((next_tick - now) / 1000000u) + 1 : 0;
        if (poll(fds, (nfds_t)nf, wait_ms) > 0)
            for (size_t i = 0; i < nf; i++) {
                uint64_t v;
                if (fds[i].revents & POLLIN && read(fds[i].fd, &v, sizeof v) < 0) {
                    /* Another reader cannot exist; EAGAIN only. */
                }
            }
        now = now_ns();
        /* need_seq is read whether or not the eventfd was written: a
         * program without one is still answered within a tick. */
        serve(pp, ps, n, s, now);
        if (now >= next_tick) {
            for (size_t i = 0; i < n; i++)
                if (read_page(ps[i], s))
                    tick_peer(pp, ps[i], s, now);
            share(pp, ps, n, s);
            next_tick = now + PEERS_TICK_NS;
        }
        drop(pp, ps, n);
        /* However often a program writes its eventfd, this thread takes
         * at most a share of a core. */
        nap_ms(1);
    }
    free(s);
    return NULL;
}

/* ==== the list ========================================================================= */

pool_peers *pool_peers_create(dev *d, pool *own, uint64_t idle_trim_ms)
{
    pool_peers *pp = calloc(1, sizeof *pp);
    if (!pp)
        return NULL;
    pp->d = d;
    pp->own = own;
    pp->idle_trim_ns = idle_trim_ms * 1000000u;
    pp->wake_fd = -1;
    pthread_mutex_init(&pp->lock, NULL);
    return pp;
}

void pool_peers_destroy(pool_peers *pp)
{
    if (!pp)
        return;
    if (pp->running) {
        atomic_store(&pp->stop, true);
        wake(pp);
        pthread_join(pp->thread, NULL);
    }
    for (size_t i = 0; i < pp->n; i++)
        peer_free(pp->peers[i]);
    if (pp->wake_fd >= 0)
        close(pp->wake_fd);
    pthread_mutex_destroy(&pp->lock);
    free(pp);
}

/* The thread, at the first program: a device that never runs one has none. */
static int start_thread(pool_peers *pp)
{
    if (pp->running)
        return 0;
    pp->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (pp->wake_fd < 0)
        return -1;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&pp->thread, NULL, peers_main, pp);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        close(pp->wake_fd);
        pp->wake_fd = -1;
        errno = rc;
        return -1;
    }
    pp->running = true;
    return 0;
}

int pool_peers_add(pool_peers *pp, uint32_t job, int page_fd, int event_fd, uint64_t budget, char *err,
                   size_t err_len)
{
    peer *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    p->job = job;
    p->efd = -1;
    if (!(p->pg = pool_shm_map(page_fd, err, err_len))) {
        free(p);
        return -1;
    }
    if (event_fd >= 0 && (p->efd = fcntl(event_fd, F_DUPFD_CLOEXEC, 3)) < 0) {
        snprintf(err, err_len, "cannot keep the program's eventfd: %s", strerror(errno));
        peer_free(p);
        return -1;
    }
    pool_shm_set_budget(p->pg, budget);
    pthread_mutex_lock(&pp->lock);
    int rc = 0;
    if (pp->n == POOL_PEERS_MAX) {
        snprintf(err, err_len, "%d program jobs run on this device already", POOL_PEERS_MAX);
        rc = -1;
    } else if (start_thread(pp) != 0) {
        snprintf(err, err_len, "cannot start the thread that serves program pools: %s", strerror(errno));
        rc = -1;
    } else {
        pp->peers[pp->n++] = p;
    }
    pthread_mutex_unlock(&pp->lock);
    if (rc != 0) {
        peer_free(p);
        return -1;
    }
    wake(pp);
    return 0;
}

void pool_peers_remove(pool_peers *pp, uint32_t job)
{
    peer *gone = NULL;
    pthread_mutex_lock(&pp->lock);
    for (size_t i = 0; i < pp->n; i++) {
        if (pp->peers[i]->job != job)
            continue;
        peer *p = pp->peers[i];
        memmove(&pp->peers[i], &pp->peers[i + 1], (pp->n - i - 1) * sizeof pp->peers[0]);
        pp->n--;
        p->removed = true;
        if (p->refs == 0)
            gone = p;
        break;
    }
    size_t left = pp->n;
    pthread_mutex_unlock(&pp->lock);
    if (gone)
        peer_free(gone);
    /* Its memory no longer counts against the others' copies. */
    if (pp->d->kind == DEV_KIND_CPU) {
        pool_stats *s = malloc(sizeof *s);
        peer *ps[POOL_PEERS_MAX];
        size_t n = grab(pp, ps);
        if (s)
            share(pp, ps, n, s);
        drop(pp, ps, n);
        free(s);
        if (!left)
            dev_cpu_set_shared(pp->d, 0);
    }
}

static void view_of(peer *p, pool_peer_view *v)
{
    memset(v, 0, sizeof *v);
    v->job = p->job;
    v->pid = atomic_load_explicit(&p->pg->pid, memory_order_relaxed);
    v->reclaims = atomic_load(&p->reclaims);
    v->live = read_page(p, &v->stats);
}

pool_peer_view *pool_peers_read(pool_peers *pp, size_t *n)
{
    peer *ps[POOL_PEERS_MAX];
    size_t got = grab(pp, ps);
    pool_peer_view *out = got ? malloc(got * sizeof *out) : NULL;
    *n = out ? got : 0;
    for (size_t i = 0; i < *n; i++)
        view_of(ps[i], &out[i]);
    drop(pp, ps, got);
    return out;
}

bool pool_peers_read_job(pool_peers *pp, uint32_t job, pool_peer_view *out)
{
    peer *ps[POOL_PEERS_MAX];
    size_t n = grab(pp, ps);
    bool found = false;
    for (size_t i = 0; i < n && !found; i++)
        if (ps[i]->job == job) {
            view_of(ps[i], out);
            found = true;
        }
    drop(pp, ps, n);
    return found;
}

size_t pool_peers_reserved(pool_peers *pp, size_t *allocated)
{
    if (allocated)
        *allocated = 0;
    pool_stats *s = malloc(sizeof *s);
    if (!s)
        return 0;
    peer *ps[POOL_PEERS_MAX];
    size_t n = grab(pp, ps), sum = 0;
    for (size_t i = 0; i < n; i++)
        if (read_page(ps[i], s)) {
            sum += (size_t)s->reserved_bytes[POOL_ALL].current;
            if (allocated)
                *allocated += (size_t)s->allocated_bytes[POOL_ALL].current;
        }
    drop(pp, ps, n);
    free(s);
    return sum;
}

size_t pool_peers_count(pool_peers *pp)
{
    pthread_mutex_lock(&pp->lock);
    size_t n = pp->n;
    pthread_mutex_unlock(&pp->lock);
    return n;
}
