/* pool_shm.c — the shared-memory statistics and control page of a program
 * job (layout and protocols in pool_shm.h): creating and mapping it, the
 * seqlock writer the allocator library uses, and the reader the daemon
 * uses on a page an untrusted process writes.
 */
#include "pool_shm.h"
#include "pool_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LD(x) atomic_load_explicit(&(x), memory_order_relaxed)
#define ST(x, v) atomic_store_explicit(&(x), (v), memory_order_relaxed)
/* The page is const to a side that only reads; C11 atomics are read
 * through non-const pointers. */
#define RW(pg) ((pool_shm_page *)(pg))

static const unsigned seals_needed = F_SEAL_SHRINK | F_SEAL_GROW;

/* ==== creating and mapping =============================================== */

int pool_shm_create(void)
{
    int fd = memfd_create("gradd-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    if (ftruncate(fd, POOL_SHM_SIZE) != 0)
        goto fail;
    pool_shm_page *pg = mmap(NULL, POOL_SHM_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (pg == MAP_FAILED)
        goto fail;
    pg->magic = POOL_SHM_MAGIC;
    pg->version = POOL_SHM_VERSION;
    pg->size = (uint32_t)sizeof *pg;
    pg->nfig = POOL_SHM_NFIG;
    munmap(pg, POOL_SHM_SIZE);
    if (fcntl(fd, F_ADD_SEALS, seals_needed | F_SEAL_SEAL) != 0)
        goto fail;
    return fd;
fail:;
    int e = errno;
    close(fd);
    errno = e;
    return -1;
}

static bool header_ok(const pool_shm_page *pg)
{
    /* The program may rewrite the header at any time: read each word once. */
    const volatile uint32_t *h = &pg->magic;
    return h[0] == POOL_SHM_MAGIC && h[1] == POOL_SHM_VERSION && h[2] == sizeof *pg &&
           h[3] == POOL_SHM_NFIG;
}

pool_shm_page *pool_shm_map(int fd, char *err, size_t err_len)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(err, err_len, "pool page fd %d: %s", fd, strerror(errno));
        return NULL;
    }
    int seals = fcntl(fd, F_GET_SEALS);
    if (!S_ISREG(st.st_mode) || seals < 0) {
        snprintf(err, err_len, "pool page fd %d: not a memfd", fd);
        return NULL;
    }
    /* Unsealed, the other side could shrink the file under our mapping
     * and turn the next read into SIGBUS. */
    if (((unsigned)seals & seals_needed) != seals_needed) {
        snprintf(err, err_len, "pool page fd %d: not sealed against resizing", fd);
        return NULL;
    }
    if (st.st_size != POOL_SHM_SIZE) {
        snprintf(err, err_len, "pool page fd %d: %lld bytes, expected %u", fd, (long long)st.st_size,
                 POOL_SHM_SIZE);
        return NULL;
    }
    pool_shm_page *pg = mmap(NULL, POOL_SHM_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (pg == MAP_FAILED) {
        snprintf(err, err_len, "pool page fd %d: mmap: %s", fd, strerror(errno));
        return NULL;
    }
    if (!header_ok(pg)) {
        snprintf(err, err_len,
                 "pool page fd %d: not a version %u gradd pool page (magic %#x, version %u)", fd,
                 POOL_SHM_VERSION, pg->magic, pg->version);
        munmap(pg, POOL_SHM_SIZE);
        return NULL;
    }
    return pg;
}

void pool_shm_unmap(pool_shm_page *pg)
{
    if (pg)
        munmap(pg, POOL_SHM_SIZE);
}

/* ==== the statistics as words ================================================ */

/* The one order both sides agree on; pack and unpack walk it alike. */
#define FIGS(X)                                                                        \
    X(allocated_bytes) X(reserved_bytes) X(active_bytes) X(inactive_split_bytes)       \
    X(requested_bytes) X(allocations) X(segments) X(active_blocks) X(inactive_split_blocks)
#define CTRS(X)                                                                        \
    X(device_allocs) X(device_frees) X(cache_hits) X(alloc_retries) X(ooms) X(trims)   \
    X(trimmed_bytes) X(trim_ns) X(invalid_frees) X(idle_trims) X(idle_trimmed_bytes)

void pool_shm_pack(const pool_stats *s, uint64_t *fig)
{
    size_t n = 0;
#define PACK_STAT(name)                                                                \
    for (int i = 0; i < 3; i++) {                                                      \
        fig[n++] = (uint64_t)s->name[i].current;                                       \
        fig[n++] = (uint64_t)s->name[i].peak;                                          \
        fig[n++] = s->name[i].allocated;                                               \
        fig[n++] = s->name[i].freed;                                                   \
    }
    FIGS(PACK_STAT)
#define PACK_CTR(name) fig[n++] = s->name;
    CTRS(PACK_CTR)
    fig[n++] = s->largest_free_block;
    fig[n++] = s->cap;
    fig[n++] = s->device_total;
    fig[n++] = s->device_free;
    fig[n++] = s->expandable_segments;
    fig[n++] = s->max_split_size;
    for (int t = 0; t < POOL_TAG_COUNT; t++) {
        fig[n++] = (uint64_t)s->tag_current[t];
        fig[n++] = (uint64_t)s->tag_peak[t];
    }
    fig[n++] = s->timeline_events;
    fig[n++] = s->timeline_dropped;
}

/* current from the running totals; a peak below it is raised to it. */
static pool_stat sane_stat(const uint64_t *w)
{
    pool_stat st = {.allocated = w[2], .freed = w[3]};
    st.current = (int64_t)(st.allocated - st.freed);
    st.peak = (int64_t)w[1] > st.current ? (int64_t)w[1] : st.current;
    return st;
}

void pool_shm_unpack(const uint64_t *fig, pool_stats *out)
{
    memset(out, 0, sizeof *out);
    size_t n = 0;
#define UNPACK_STAT(name)                                                              \
    for (int i = 0; i < 3; i++, n += 4)                                                \
        out->name[i] = sane_stat(&fig[n]);
    FIGS(UNPACK_STAT)
#define UNPACK_CTR(name) out->name = fig[n++];
    CTRS(UNPACK_CTR)
    out->largest_free_block = (size_t)fig[n++];
    out->cap = (size_t)fig[n++];
    out->device_total = (size_t)fig[n++];
    out->device_free = (size_t)fig[n++];
    out->expandable_segments = fig[n++] != 0;
    out->max_split_size = (size_t)fig[n++];
    for (int t = 0; t < POOL_TAG_COUNT; t++) {
        out->tag_current[t] = (int64_t)fig[n++];
        out->tag_peak[t] = (int64_t)fig[n++];
    }
    out->timeline_events = fig[n++];
    out->timeline_dropped = fig[n++];

    int64_t res = out->reserved_bytes[POOL_ALL].current, all = out->allocated_bytes[POOL_ALL].current;
    if (res <= all) {
        out->largest_free_block = 0;
        out->fragmentation = 0;
    } else {
        uint64_t cached = (uint64_t)res - (uint64_t)all;
        if (out->largest_free_block > cached)
            out->largest_free_block = (size_t)cached;
        out->fragmentation = 1.0 - (double)out->largest_free_block / (double)cached;
    }
}

_Static_assert(9 * 3 * 4 + 11 + 6 + 2 * POOL_TAG_COUNT + 2 == POOL_SHM_NFIG,
               "pack and unpack walk POOL_SHM_NFIG words");

/* ==== the seqlock ============================================================== */

void pool_shm_publish(pool_shm_page *pg, const pool_stats *s)
{
    uint64_t fig[POOL_SHM_NFIG];
    pool_shm_pack(s, fig);
    uint64_t seq = LD(pg->seq);
    /* Resume from an even number whatever the other side wrote there. */
    seq += 1 + (seq & 1);
    ST(pg->seq, seq);
    atomic_thread_fence(memory_order_release);
    for (size_t i = 0; i < POOL_SHM_NFIG; i++)
        ST(pg->fig[i], fig[i]);
    atomic_store_explicit(&pg->seq, seq + 1, memory_order_release);
}

int pool_shm_read(const pool_shm_page *pg, pool_stats *out, uint64_t timeout_ns)
{
    pool_shm_page *w = RW(pg);
    uint64_t fig[POOL_SHM_NFIG];
    uint64_t deadline = pool_now_ns() + timeout_ns;
    for (unsigned tries = 0;; tries++) {
        if (!header_ok(pg)) {
            errno = EPROTO;
            return -1;
        }
        uint64_t s1 = atomic_load_explicit(&w->seq, memory_order_acquire);
        if (!(s1 & 1)) {
            for (size_t i = 0; i < POOL_SHM_NFIG; i++)
                fig[i] = LD(w->fig[i]);
            atomic_thread_fence(memory_order_acquire);
            if (LD(w->seq) == s1) {
                pool_shm_unpack(fig, out);
                return 0;
            }
        }
        /* The clock only every few tries: a writer's section is short. */
        if (tries % 16 == 15) {
            if (pool_now_ns() >= deadline) {
                errno = ETIMEDOUT;
                return -1;
            }
            sched_yield();
        }
    }
}

/* ==== control words ================================================================ */

void pool_shm_set_budget(pool_shm_page *pg, uint64_t bytes) { ST(pg->budget, bytes); }

void pool_shm_set_shared(pool_shm_page *pg, uint64_t bytes) { ST(pg->shared, bytes); }

uint64_t pool_shm_shared(const pool_shm_page *pg) { return LD(RW(pg)->shared); }

/* Trim and reclaim are one protocol: the asking side stores its argument
 * and bumps a request number; the other side sees a pending request while
 * the number differs from its answer, and answers by storing the number.
 * The number is stored last (release), so the argument read after seeing
 * it (acquire) is the one that came with it. */
static uint64_t ask(_Atomic uint64_t *req, _Atomic uint64_t *arg, uint64_t value)
{
    atomic_store_explicit(arg, value, memory_order_relaxed);
    uint64_t n = atomic_load_explicit(req, memory_order_relaxed) + 1;
    atomic_store_explicit(req, n, memory_order_release);
    return n;
}

static uint64_t pending(_Atomic uint64_t *req, _Atomic uint64_t *ack, _Atomic uint64_t *arg,
                        uint64_t *value)
{
    uint64_t n = atomic_load_explicit(req, memory_order_acquire);
    if (n == atomic_load_explicit(ack, memory_order_relaxed))
        return 0;
    *value = atomic_load_explicit(arg, memory_order_relaxed);
    return n;
}

static bool answered(_Atomic uint64_t *ack, uint64_t n)
{
    return atomic_load_explicit(ack, memory_order_acquire) >= n;
}

static void answer(_Atomic uint64_t *ack, uint64_t n) { atomic_store_explicit(ack, n, memory_order_release); }

uint64_t pool_shm_request_trim(pool_shm_page *pg, uint64_t target, pool_trim_reason why)
{
    ST(pg->trim_why, (uint64_t)why);
    return ask(&pg->trim_req, &pg->trim_target, target);
}

bool pool_shm_trim_done(const pool_shm_page *pg, uint64_t req) { return answered(&RW(pg)->trim_ack, req); }

uint64_t pool_shm_trim_pending(const pool_shm_page *pg, uint64_t *target, pool_trim_reason *why)
{
    uint64_t n = pending(&RW(pg)->trim_req, &RW(pg)->trim_ack, &RW(pg)->trim_target, target);
    uint64_t w = LD(RW(pg)->trim_why);
    *why = w < POOL_TRIM_REASONS ? (pool_trim_reason)w : POOL_TRIM_REQUEST;
    return n;
}

void pool_shm_trim_ack(pool_shm_page *pg, uint64_t req) { answer(&pg->trim_ack, req); }

uint64_t pool_shm_reclaim_ask(pool_shm_page *pg, uint64_t bytes)
{
    return ask(&pg->need_seq, &pg->need_bytes, bytes);
}

bool pool_shm_reclaim_answered(const pool_shm_page *pg, uint64_t seq)
{
    return answered(&RW(pg)->reclaim_ack, seq);
}

uint64_t pool_shm_reclaim_pending(const pool_shm_page *pg, uint64_t *bytes)
{
    return pending(&RW(pg)->need_seq, &RW(pg)->reclaim_ack, &RW(pg)->need_bytes, bytes);
}

void pool_shm_reclaim_answer(pool_shm_page *pg, uint64_t seq) { answer(&pg->reclaim_ack, seq); }
