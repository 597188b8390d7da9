/* test_pool_shm.c — the program job's shared page (pool/pool_shm.h):
 * mapping refuses what is not a sealed page of this version; a pool's
 * statistics survive publish and read exactly; a torn write is never
 * seen while a writer thread publishes; a writer stuck mid-write or a
 * rewritten header makes the reader give up in bounded time; hostile
 * figures come back with sane arithmetic; trim and reclaim words.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "pool/dev.h"
#include "pool/pool.h"
#include "pool/pool_shm.h"
#include "pool_fx.h"

static void expect_refused(int fd, const char *why)
{
    char err[256] = "";
    assert_null(pool_shm_map(fd, err, sizeof err));
    if (!strstr(err, why))
        fail_msg("expected \"%s\" in \"%s\"", why, err);
    char fdname[32];
    snprintf(fdname, sizeof fdname, "fd %d", fd);
    assert_non_null(strstr(err, fdname));
}

/* A fresh page, mapped. */
static pool_shm_page *open_page(int *fd)
{
    *fd = pool_shm_create();
    assert_true(*fd >= 0);
    char err[256];
    pool_shm_page *pg = pool_shm_map(*fd, err, sizeof err);
    if (!pg)
        fail_msg("%s", err);
    return pg;
}

static void test_map_checks(void **state)
{
    (void)state;
    int fd = pool_shm_create();
    assert_true(fd >= 0);
    assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    char err[256];
    pool_shm_page *pg = pool_shm_map(fd, err, sizeof err);
    assert_non_null(pg);
    assert_int_equal(pg->magic, POOL_SHM_MAGIC);
    assert_int_equal(pg->version, POOL_SHM_VERSION);
    assert_int_equal(pg->nfig, POOL_SHM_NFIG);
    /* The seals hold: nobody can shrink it under the daemon. */
    assert_int_equal(ftruncate(fd, 100), -1);
    assert_int_equal(errno, EPERM);
    pg->version = 99;
    pool_shm_unmap(pg);
    expect_refused(fd, "not a version 2 gradd pool page");
    close(fd);

    /* Unsealed, of the wrong size, or not a file at all. */
    int raw = memfd_create("t", MFD_ALLOW_SEALING);
    assert_int_equal(ftruncate(raw, POOL_SHM_SIZE), 0);
    expect_refused(raw, "not sealed against resizing");
    assert_int_equal(ftruncate(raw, 100), 0);
    assert_int_equal(fcntl(raw, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    expect_refused(raw, "100 bytes, expected 4096");
    close(raw);
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    expect_refused(pfd[0], "not a memfd");
    close(pfd[0]);
    close(pfd[1]);
    expect_refused(1000, "Bad file descriptor");
}

static void test_round_trip(void **state)
{
    (void)state;
    fx f;
    pool_config c = cfg_default();
    fx_open(&f, 256 * MiB, &c);
    void *a = pool_alloc(f.p, 3000, POOL_TAG_ACTIVATIONS, 1, NULL);
    void *b = pool_alloc(f.p, 5 * MiB, POOL_TAG_PARAMS, 1, NULL);
    void *d = pool_alloc(f.p, 100 * KiB, POOL_TAG_ACTIVATIONS, 1, NULL);
    pool_free(f.p, a);
    assert_null(pool_alloc(f.p, 300 * MiB, POOL_TAG_OTHER, 1, NULL));
    pool_stats want = *stats(f.p);

    int fd;
    pool_shm_page *pg = open_page(&fd);
    pool_shm_publish(pg, &want);
    pool_stats got;
    assert_int_equal(pool_shm_read(pg, &got, 1000000), 0);
    assert_memory_equal(got.allocated_bytes, want.allocated_bytes,
                        offsetof(pool_stats, device_allocs) - offsetof(pool_stats, allocated_bytes));
    assert_memory_equal(&got.device_allocs, &want.device_allocs,
                        offsetof(pool_stats, largest_free_block) - offsetof(pool_stats, device_allocs));
    assert_int_equal(got.ooms, 1);
    assert_int_equal(got.largest_free_block, want.largest_free_block);
    assert_true(got.fragmentation == want.fragmentation);
    assert_int_equal(got.cap, want.cap);
    assert_int_equal(got.device_total, want.device_total);
    assert_int_equal(got.device_free, want.device_free);
    assert_int_equal(got.max_split_size, want.max_split_size);
    assert_memory_equal(got.tag_current, want.tag_current, sizeof want.tag_current);
    assert_memory_equal(got.tag_peak, want.tag_peak, sizeof want.tag_peak);
    assert_int_equal(got.timeline_events, want.timeline_events);
    assert_int_equal(got.njobs, 0);
    assert_int_equal(got.allocated_bytes[POOL_ALL].current, 5 * MiB + 100 * KiB);
    pool_shm_unmap(pg);
    close(fd);
    pool_free(f.p, b);
    pool_free(f.p, d);
    fx_close(&f);
}

/* ---- a writer thread against a reader ---------------------------------------- */

typedef struct {
    pool_shm_page *pg;
    _Atomic int stop;
} writer_arg;

static void *writer(void *arg)
{
    writer_arg *w = arg;
    pool_stats s;
    memset(&s, 0, sizeof s);
    for (uint64_t k = 1; !atomic_load(&w->stop); k++) {
        /* Every figure of one snapshot is k: a torn read mixes two. */
        for (int i = 0; i < 3; i++)
            s.allocated_bytes[i].allocated = s.reserved_bytes[i].allocated = k;
        s.device_allocs = s.cache_hits = s.ooms = s.timeline_events = k;
        pool_shm_publish(w->pg, &s);
    }
    return NULL;
}

static void test_no_torn_reads(void **state)
{
    (void)state;
    int fd;
    writer_arg w = {.pg = open_page(&fd)};
    pool_stats first = {0};
    pool_shm_publish(w.pg, &first);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, writer, &w), 0);
    uint64_t last = 0;
    for (int i = 0; i < 20000; i++) {
        pool_stats s;
        /* 1 s: the writer may be descheduled mid-section on a busy box. */
        assert_int_equal(pool_shm_read(w.pg, &s, 1000000000), 0);
        uint64_t k = s.device_allocs;
        assert_int_equal(s.cache_hits, k);
        assert_int_equal(s.ooms, k);
        assert_int_equal(s.timeline_events, k);
        for (int j = 0; j < 3; j++) {
            assert_int_equal(s.allocated_bytes[j].allocated, k);
            assert_int_equal(s.reserved_bytes[j].allocated, k);
        }
        assert_true(k >= last);
        last = k;
    }
    atomic_store(&w.stop, 1);
    pthread_join(t, NULL);
    pool_shm_unmap(w.pg);
    close(fd);
}

static void test_hostile_page(void **state)
{
    (void)state;
    int fd;
    pool_shm_page *pg = open_page(&fd);
    pool_stats s;

    /* A writer that never finishes: the reader gives up on time. */
    atomic_store(&pg->seq, 7);
    uint64_t t0 = mono_ns();
    assert_int_equal(pool_shm_read(pg, &s, 5000000), -1);
    assert_int_equal(errno, ETIMEDOUT);
    uint64_t took = mono_ns() - t0;
    assert_true(took >= 5000000 && took < 500000000);

    /* Nonsense figures come back with sane arithmetic. */
    atomic_store(&pg->seq, 8);
    for (size_t i = 0; i < POOL_SHM_NFIG; i++)
        atomic_store(&pg->fig[i], UINT64_MAX - i * 977);
    assert_int_equal(pool_shm_read(pg, &s, 1000000), 0);
    for (int i = 0; i < 3; i++) {
        pool_stat x = s.allocated_bytes[i];
        assert_true(x.current == (int64_t)(x.allocated - x.freed));
        assert_true(x.peak >= x.current);
    }
    assert_true(s.fragmentation >= 0 && s.fragmentation <= 1);
    int64_t res = s.reserved_bytes[POOL_ALL].current, all = s.allocated_bytes[POOL_ALL].current;
    uint64_t cached = res <= all ? 0 : (uint64_t)res - (uint64_t)all;
    assert_true(cached == 0 ? s.largest_free_block == 0 : s.largest_free_block <= cached);
    assert_int_equal(s.njobs, 0);

    /* A header rewritten after mapping. */
    pg->magic = 0;
    assert_int_equal(pool_shm_read(pg, &s, 1000000), -1);
    assert_int_equal(errno, EPROTO);
    pool_shm_unmap(pg);
    close(fd);
}

/* One request and its answer through the page, seen from both sides. */
static void exchange(pool_shm_page *asker, pool_shm_page *answerer,
                     uint64_t (*ask)(pool_shm_page *, uint64_t),
                     uint64_t (*pending)(const pool_shm_page *, uint64_t *),
                     void (*answer)(pool_shm_page *, uint64_t),
                     bool (*done)(const pool_shm_page *, uint64_t), uint64_t value)
{
    uint64_t got = 1;
    assert_int_equal(pending(answerer, &got), 0);
    uint64_t n = ask(asker, value);
    assert_int_equal(n, 1);
    assert_false(done(asker, n));
    assert_int_equal(pending(answerer, &got), n);
    assert_int_equal(got, value);
    answer(answerer, n);
    assert_true(done(asker, n));
    assert_int_equal(pending(answerer, &got), 0);
}

/* Trims carry a reason: these ask with idle and check it arrives. */
static uint64_t ask_idle_trim(pool_shm_page *pg, uint64_t target)
{
    return pool_shm_request_trim(pg, target, POOL_TRIM_IDLE);
}

static uint64_t trim_pending_idle(const pool_shm_page *pg, uint64_t *target)
{
    pool_trim_reason why = POOL_TRIM_REQUEST;
    uint64_t n = pool_shm_trim_pending(pg, target, &why);
    if (n)
        assert_int_equal(why, POOL_TRIM_IDLE);
    return n;
}

static void test_control_words(void **state)
{
    (void)state;
    int fd;
    pool_shm_page *daemon = open_page(&fd);
    char err[256];
    pool_shm_page *lib = pool_shm_map(fd, err, sizeof err);
    assert_non_null(lib);
    /* Trims: the daemon asks, the library answers; reclaims the other
     * way round. */
    exchange(daemon, lib, ask_idle_trim, trim_pending_idle, pool_shm_trim_ack,
             pool_shm_trim_done, 4 * MiB);
    exchange(lib, daemon, pool_shm_reclaim_ask, pool_shm_reclaim_pending, pool_shm_reclaim_answer,
             pool_shm_reclaim_answered, 40 * MiB);

    pool_shm_set_budget(daemon, 64 * MiB);
    assert_int_equal(atomic_load(&lib->budget), 64 * MiB);
    pool_shm_set_shared(daemon, 24 * MiB);
    assert_int_equal(pool_shm_shared(lib), 24 * MiB);
    /* A reason word out of range reads as a plain request. */
    atomic_store(&daemon->trim_why, 99);
    uint64_t target;
    pool_trim_reason why = POOL_TRIM_IDLE;
    pool_shm_trim_pending(lib, &target, &why);
    assert_int_equal(why, POOL_TRIM_REQUEST);
    pool_shm_unmap(daemon);
    pool_shm_unmap(lib);
    close(fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_map_checks),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_no_torn_reads),
        cmocka_unit_test(test_hostile_page),
        cmocka_unit_test(test_control_words),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
