/* test_pool_threads.c — statistics read under load.
 *
 * Two jobs allocate and free on one pool while a control thread trims and
 * ticks and a reader reads pool_stats_read as fast as it can.  Every
 * snapshot must be internally consistent: the seqlock either gives a
 * snapshot from one moment or retries.  The reader must also keep getting
 * snapshots while the allocators never pause (the snapshot-request path).
 * Run it under TSan once: every shared access must be atomic or locked.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* for clock_gettime etc. under -std=c11 */
#endif
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "pool/dev.h"
#include "pool/pool.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

typedef struct {
    pool *p;
    atomic_bool stop;
    atomic_int writers_left;
    atomic_ulong reads, reads_while_busy;
    char error[512]; /* the reader's first inconsistency; written by the reader only */
    bool failed;
} shared;

typedef struct {
    shared *sh;
    uint32_t job;
    uint64_t seed;
    long ops;
} writer_arg;

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void *writer(void *arg)
{
    writer_arg *w = arg;
    enum { N = 64 };
    void *live[N] = {0};
    uint64_t s = w->seed;
    for (long i = 0; i < w->ops; i++) {
        size_t k = rnd(&s) % N;
        if (live[k]) {
            pool_free(w->sh->p, live[k]);
            live[k] = NULL;
        } else {
            uint64_t r = rnd(&s);
            size_t size = r % 10 < 8 ? 512 + r % (256 * KiB) : MiB + r % (12 * MiB);
            live[k] = pool_alloc(w->sh->p, size, (pool_tag)(r % POOL_TAG_COUNT), w->job, NULL);
        }
    }
    for (size_t k = 0; k < N; k++)
        pool_free(w->sh->p, live[k]);
    atomic_fetch_sub(&w->sh->writers_left, 1);
    return NULL;
}

static void *controller(void *arg)
{
    shared *sh = arg;
    uint64_t step = 0;
    FILE *null = fopen("/dev/null", "w");
    while (atomic_load(&sh->writers_left) > 0) {
        pool_tick(sh->p, ++step);
        if (step % 50 == 0)
            pool_trim(sh->p, POOL_TRIM_REQUEST, 0);
        if (step % 200 == 0)
            pool_stats_reset_peaks(sh->p);
        if (step % 500 == 0 && null)
            pool_timeline_write_json(sh->p, null);
        struct timespec ts = {0, 200 * 1000};
        nanosleep(&ts, NULL);
    }
    if (null)
        fclose(null);
    return NULL;
}

static bool bad(shared *sh, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sh->error, sizeof sh->error, fmt, ap);
    va_end(ap);
    sh->failed = true;
    return false;
}

static bool consistent(shared *sh, const pool_stats *s)
{
    const pool_stat *all[] = {s->allocated_bytes, s->reserved_bytes, s->requested_bytes,
                              s->allocations, s->segments, s->inactive_split_bytes,
                              s->inactive_split_blocks, s->active_bytes};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        const pool_stat *v = all[i];
        if (v[POOL_ALL].current != v[POOL_SMALL].current + v[POOL_LARGE].current)
            return bad(sh, "stat %zu: all != small + large", i);
        for (int k = 0; k < 3; k++) {
            if (v[k].current < 0 || v[k].peak < v[k].current)
                return bad(sh, "stat %zu[%d]: current %lld, peak %lld", i, k, (long long)v[k].current,
                           (long long)v[k].peak);
            if ((int64_t)(v[k].allocated - v[k].freed) != v[k].current)
                return bad(sh, "stat %zu[%d]: allocated - freed != current", i, k);
        }
    }
    for (int k = 0; k < 3; k++) {
        int64_t a = s->allocated_bytes[k].current, r = s->reserved_bytes[k].current;
        if (a > r)
            return bad(sh, "pool %d: allocated %lld > reserved %lld", k, (long long)a, (long long)r);
        if (s->inactive_split_bytes[k].current > r - a)
            return bad(sh, "pool %d: inactive split exceeds the cached bytes", k);
        if (s->requested_bytes[k].current > a)
            return bad(sh, "pool %d: requested > allocated", k);
        if ((s->allocations[k].current == 0) != (a == 0))
            return bad(sh, "pool %d: %lld allocations hold %lld bytes", k,
                       (long long)s->allocations[k].current, (long long)a);
    }
    int64_t alloc = s->allocated_bytes[POOL_ALL].current;
    if ((int64_t)s->largest_free_block > s->reserved_bytes[POOL_ALL].current - alloc)
        return bad(sh, "largest free block %zu exceeds the cached bytes", s->largest_free_block);
    if (s->reserved_bytes[POOL_ALL].current > (int64_t)s->cap)
        return bad(sh, "reserved above the cap");
    int64_t tags = 0;
    for (int t = 0; t < POOL_TAG_COUNT; t++)
        tags += s->tag_current[t];
    if (tags != alloc)
        return bad(sh, "tags sum to %lld, allocated %lld", (long long)tags, (long long)alloc);
    int64_t jobs = 0;
    for (size_t j = 0; j < s->njobs; j++) {
        int64_t jt = 0;
        for (int t = 0; t < POOL_TAG_COUNT; t++)
            jt += s->jobs[j].tag_current[t];
        if (jt != s->jobs[j].current)
            return bad(sh, "job %u tags sum to %lld, current %lld", s->jobs[j].job, (long long)jt,
                       (long long)s->jobs[j].current);
        jobs += s->jobs[j].current;
    }
    if (jobs != alloc)
        return bad(sh, "jobs sum to %lld, allocated %lld", (long long)jobs, (long long)alloc);
    if (s->fragmentation < 0 || s->fragmentation > 1)
        return bad(sh, "fragmentation %f", s->fragmentation);
    return true;
}

static void *reader(void *arg)
{
    shared *sh = arg;
    pool_stats *s = malloc(sizeof *s);
    if (!s)
        return NULL;
    while (!atomic_load(&sh->stop)) {
        pool_stats_read(sh->p, s);
        atomic_fetch_add(&sh->reads, 1);
        if (atomic_load(&sh->writers_left) > 0)
            atomic_fetch_add(&sh->reads_while_busy, 1);
        if (!sh->failed && !consistent(sh, s))
            break;
    }
    free(s);
    return NULL;
}

static void run(bool expandable, long ops)
{
    dev *d;
    assert_int_equal(dev_cpu_create(1024 * MiB, 0, &d), DEV_OK);
    pool_config c;
    pool_config_default(&c);
    c.expandable_segments = expandable;
    c.gc_threshold = 0.5;
    c.trim_every_steps = 97;
    c.timeline_capacity = 4096;
    shared sh = {0};
    assert_int_equal(pool_create(d, &c, &sh.p), 0);
    atomic_store(&sh.writers_left, 2);

    pthread_t w[2], ctl, rd;
    writer_arg wa[2] = {{&sh, 1, 11, ops}, {&sh, 2, 22, ops}};
    assert_int_equal(pthread_create(&rd, NULL, reader, &sh), 0);
    assert_int_equal(pthread_create(&ctl, NULL, controller, &sh), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&w[i], NULL, writer, &wa[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(w[i], NULL);
    pthread_join(ctl, NULL);
    atomic_store(&sh.stop, true);
    pthread_join(rd, NULL);

    if (sh.failed)
        fail_msg("inconsistent snapshot: %s", sh.error);
    printf("  %s: %lu reads, %lu while allocating\n", expandable ? "expandable" : "fixed",
           atomic_load(&sh.reads), atomic_load(&sh.reads_while_busy));
    assert_true(atomic_load(&sh.reads_while_busy) > 10);

    char err[256];
    if (pool_check(sh.p, err, sizeof err) != 0)
        fail_msg("pool_check: %s", err);
    pool_stats s;
    pool_stats_read(sh.p, &s);
    assert_int_equal(s.allocated_bytes[POOL_ALL].current, 0);
    pool_destroy(sh.p);
    size_t fr, total;
    dev_mem_info(d, &fr, &total);
    assert_int_equal(fr, total);
    dev_destroy(d);
}

static long ops_from_env(void)
{
    const char *e = getenv("POOL_THREADS_OPS");
    return e ? atol(e) : 200000;
}

static void test_read_under_load_fixed(void **state)
{
    (void)state;
    run(false, ops_from_env());
}

static void test_read_under_load_expandable(void **state)
{
    (void)state;
    run(true, ops_from_env());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_under_load_fixed),
        cmocka_unit_test(test_read_under_load_expandable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
