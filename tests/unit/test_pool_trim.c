/* test_pool_trim.c — how the memory pool on the simulated cpu device gives
 * memory back and refuses it: expandable segments mapping and unmapping
 * chunks, the memory-fraction cap and per-job limits, an OOM released by a
 * trim and retried, the OOM report, and every trim trigger (request,
 * periodic by steps and by time, the GC threshold in LRU order, the low
 * watermark under another process's pressure, and the idle trim once no
 * job runs), and one job's cache reclaimed for another before an OOM.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "pool/dev.h"
#include "pool/pool.h"
#include "pool_fx.h"

/* ==== expandable segments ============================================================ */

static void test_expandable_basic(void **state)
{
    (void)state;
    fx f;
    pool_config c = cfg_default();
    c.expandable_segments = true;
    fx_open(&f, 256 * MiB, &c);
    assert_true(stats(f.p)->expandable_segments);

    void *a = pool_alloc(f.p, 3 * MiB, POOL_TAG_OTHER, 1, NULL);
    pool_stats *s = stats(f.p);
    assert_int_equal(s->reserved_bytes[POOL_LARGE].current, 4 * MiB); /* mapped in 2 MiB chunks */
    assert_int_equal(256 * MiB - device_free(f.d), 4 * MiB);         /* committed = charged */
    /* The free 1 MiB tail plus one new chunk serve the next request in place. */
    void *b = pool_alloc(f.p, 2 * MiB, POOL_TAG_OTHER, 1, NULL);
    assert_ptr_equal((char *)b, (char *)a + 3 * MiB);
    s = stats(f.p);
    assert_int_equal(s->reserved_bytes[POOL_LARGE].current, 6 * MiB);
    assert_int_equal(s->segments[POOL_LARGE].current, 1);
    assert_int_equal(s->device_allocs, 2);
    /* A 30 MiB request costs 30 MiB more, not a 20 MiB-rounded segment. */
    void *c2 = pool_alloc(f.p, 30 * MiB, POOL_TAG_OTHER, 1, NULL);
    s = stats(f.p);
    assert_int_equal(s->reserved_bytes[POOL_LARGE].current, 36 * MiB);
    assert_int_equal(s->allocated_bytes[POOL_LARGE].current, 35 * MiB);
    /* Small requests have their own range. */
    void *d = pool_alloc(f.p, 4 * KiB, POOL_TAG_OTHER, 1, NULL);
    s = stats(f.p);
    assert_int_equal(s->reserved_bytes[POOL_SMALL].current, 2 * MiB);
    CHECK(f.p);

    /* Trim unmaps the whole chunks inside a free block: a and b coalesce
     * into [0, 5) MiB, whose chunks [0, 2) and [2, 4) go back; [4, 5) stays
     * mapped because c2 lives in the rest of that chunk. */
    pool_free(f.p, a);
    pool_free(f.p, b);
    pool_trim_result r = pool_trim(f.p, POOL_TRIM_REQUEST, 0);
    assert_int_equal(r.bytes, 4 * MiB);
    s = stats(f.p);
    assert_int_equal(s->reserved_bytes[POOL_LARGE].current, 32 * MiB);
    assert_int_equal(256 * MiB - device_free(f.d), 34 * MiB);
    CHECK(f.p);
    pool_free(f.p, c2);
    pool_free(f.p, d);
    r = pool_trim(f.p, POOL_TRIM_REQUEST, 0);
    s = stats(f.p);
    assert_int_equal(s->reserved_bytes[POOL_ALL].current, 0);
    assert_int_equal(s->segments[POOL_ALL].current, 0);
    assert_int_equal(device_free(f.d), 256 * MiB);
    assert_int_equal(s->device_frees, count_events(f.p, POOL_EV_SEGMENT_UNMAP, -1));
    fx_close(&f);
}

static void test_expandable_holes(void **state)
{
    (void)state;
    fx f;
    pool_config c = cfg_default();
    c.expandable_segments = true;
    fx_open(&f, 256 * MiB, &c);
    void *a = pool_alloc(f.p, 8 * MiB, POOL_TAG_OTHER, 1, NULL);
    void *b = pool_alloc(f.p, 8 * MiB, POOL_TAG_OTHER, 1, NULL);
    void *cc = pool_alloc(f.p, 8 * MiB, POOL_TAG_OTHER, 1, NULL);
    assert_ptr_equal((char *)b, (char *)a + 8 * MiB);
    pool_free(f.p, b);
    pool_trim(f.p, POOL_TRIM_REQUEST, 0); /* a hole where b was: two runs */
    pool_stats *s = stats(f.p);
    assert_int_equal(s->segments[POOL_LARGE].current, 2);
    assert_int_equal(s->reserved_bytes[POOL_LARGE].current, 16 * MiB);
    CHECK(f.p);
    /* Refilling the hole is the cheapest growth, and merges the runs. */
    void *b2 = pool_alloc(f.p, 8 * MiB, POOL_TAG_OTHER, 1, NULL);
    assert_ptr_equal(b2, b);
    s = stats(f.p);
    assert_int_equal(s->segments[POOL_LARGE].current, 1);
    assert_int_equal(s->reserved_bytes[POOL_LARGE].current, 24 * MiB);
    CHECK(f.p);
    /* Free all but the last: trim leaves one run holding cc only. */
    pool_free(f.p, a);
    pool_free(f.p, b2);
    pool_trim(f.p, POOL_TRIM_REQUEST, 0);
    s = stats(f.p);
    assert_int_equal(s->segments[POOL_LARGE].current, 1);
    assert_int_equal(s->reserved_bytes[POOL_LARGE].current, 8 * MiB);
    CHECK(f.p);
    pool_free(f.p, cc);
    fx_close(&f);
}

/* A free tail block that starts on a chunk boundary goes entirely. */
static void test_expandable_aligned_tail(void **state)
{
    (void)state;
    fx f;
    pool_config c = cfg_default();
    c.expandable_segments = true;
    fx_open(&f, 256 * MiB, &c);
    void *a = pool_alloc(f.p, 4 * MiB, POOL_TAG_OTHER, 1, NULL);
    void *b = pool_alloc(f.p, 6 * MiB, POOL_TAG_OTHER, 1, NULL);
    assert_ptr_equal((char *)b, (char *)a + 4 * MiB);
    pool_free(f.p, b);
    pool_trim_result r = pool_trim(f.p, POOL_TRIM_REQUEST, 0);
    assert_int_equal(r.bytes, 6 * MiB);
    pool_stats *s = stats(f.p);
    assert_int_equal(s->reserved_bytes[POOL_LARGE].current, 4 * MiB);
    assert_int_equal(s->segments[POOL_LARGE].current, 1);
    assert_int_equal(s->inactive_split_blocks[POOL_ALL].current, 0);
    CHECK(f.p);
    pool_free(f.p, a);
    fx_close(&f);
}

static void test_expandable_capacity(void **state)
{
    (void)state;
    fx f;
    pool_config c = cfg_default();
    c.expandable_segments = true;
    fx_open(&f, 64 * MiB, &c);
    void *a = pool_alloc(f.p, 60 * MiB, POOL_TAG_OTHER, 1, NULL);
    assert_non_null(a);
    /* Committed memory is charged: the device has 4 MiB left. */
    assert_int_equal(device_free(f.d), 4 * MiB);
    assert_int_equal(dev_cpu_set_external(f.d, 8 * MiB), DEV_ERR_OOM);
    pool_oom_report r;
    assert_null(pool_alloc(f.p, 6 * MiB, POOL_TAG_OTHER, 1, &r));
    assert_int_equal(r.reserved, 60 * MiB);
    pool_free(f.p, a);
    /* A trim releases it for the other process. */
    pool_trim(f.p, POOL_TRIM_REQUEST, 0);
    assert_int_equal(dev_cpu_set_external(f.d, 8 * MiB), DEV_OK);
    assert_int_equal(dev_cpu_set_external(f.d, 0), DEV_OK);
    fx_close(&f);
}

/* ==== caps, limits and OOM ============================================================== */

static void test_memory_fraction_cap(void **state)
{
    (void)state;
    fx f;
    pool_config c = cfg_default();
    c.memory_fraction = 0.25;
    fx_open(&f, 256 * MiB, &c);
    assert_int_equal(stats(f.p)->cap, 64 * MiB);
    void *a = pool_alloc(f.p, 60 * MiB, POOL_TAG_PARAMS, 3, NULL);
    assert_non_null(a);
    pool_oom_report r;
    assert_null(pool_alloc(f.p, 10 * MiB, POOL_TAG_ACTIVATIONS, 3, &r));
    assert_int_equal(r.cap, 64 * MiB);
    assert_true(r.device_free >= 190 * MiB); /* the device had room: the cap said no */
    assert_int_equal(r.reserved, 60 * MiB);
    assert_false(r.job_limit_hit);
    assert_non_null(strstr(r.message, "cap"));
    pool_stats *s = stats(f.p);
    assert_int_equal(s->ooms, 1);
    assert_int_equal(s->alloc_retries, 0); /* nothing cached could help */
    assert_true(s->reserved_bytes[POOL_ALL].current <= (int64_t)s->cap);
    pool_free(f.p, a);
    fx_close(&f);
}

static void test_job_limit(void **state)
{
    (void)state;
    fx f;
    fx_open(&f, 256 * MiB, NULL);
    assert_int_equal(pool_job_set_limit(f.p, 7, 10 * MiB), 0);
    void *a = pool_alloc(f.p, 8 * MiB, POOL_TAG_PARAMS, 7, NULL);
    assert_non_null(a);
    pool_oom_report r;
    assert_null(pool_alloc(f.p, 4 * MiB, POOL_TAG_GRADS, 7, &r));
    assert_true(r.job_limit_hit);
    assert_int_equal(r.job, 7);
    assert_int_equal(r.tag, POOL_TAG_GRADS);
    assert_int_equal(r.job_allocated, 8 * MiB);
    assert_int_equal(r.job_limit, 10 * MiB);
    assert_int_equal(r.requested, 4 * MiB);
    assert_non_null(strstr(r.message, "job 7"));
    assert_non_null(strstr(r.message, "10M"));
    /* Other jobs are not affected; the limit can be lifted. */
    void *b = pool_alloc(f.p, 4 * MiB, POOL_TAG_GRADS, 8, NULL);
    assert_non_null(b);
    assert_int_equal(pool_job_set_limit(f.p, 7, 0), 0);
    void *c = pool_alloc(f.p, 4 * MiB, POOL_TAG_GRADS, 7, NULL);
    assert_non_null(c);
    pool_stats *s = stats(f.p);
    assert_int_equal(s->ooms, 1);
    assert_int_equal(s->njobs, 2);
    pool_free(f.p, a);
    pool_free(f.p, b);
    pool_free(f.p, c);
    fx_close(&f);
}

static void test_oom_trim_retry(void **state)
{
    (void)state;
    fx f;
    fx_open(&f, 64 * MiB, NULL);
    void *a = pool_alloc(f.p, 24 * MiB, POOL_TAG_OTHER, 1, NULL);
    void *b = pool_alloc(f.p, 24 * MiB, POOL_TAG_OTHER, 1, NULL);
    pool_free(f.p, a);
    pool_free(f.p, b); /* 48 MiB cached in two segments, neither fits 40 MiB */
    pool_oom_report r;
    void *c = pool_alloc(f.p, 40 * MiB, POOL_TAG_OTHER, 1, &r);
    assert_non_null(c);
    pool_stats *s = stats(f.p);
    assert_int_equal(s->alloc_retries, 1);
    assert_int_equal(s->trims, 1);
    assert_int_equal(s->trimmed_bytes, 48 * MiB);
    assert_int_equal(s->ooms, 0);
    assert_int_equal(s->reserved_bytes[POOL_ALL].current, 40 * MiB);
    assert_int_equal(count_events(f.p, POOL_EV_TRIM, POOL_TRIM_OOM), 1);
    pool_free(f.p, c);
    fx_close(&f);
}

static void test_oom_report(void **state)
{
    (void)state;
    fx f;
    fx_open(&f, 64 * MiB, NULL);
    void *a = pool_alloc(f.p, 50 * MiB, POOL_TAG_PARAMS, 2, NULL);
    void *s1 = pool_alloc(f.p, 4 * KiB, POOL_TAG_DATA, 2, NULL);
    pool_oom_report r;
    assert_null(pool_alloc(f.p, 30 * MiB, POOL_TAG_ACTIVATIONS, 2, &r));
    assert_int_equal(r.requested, 30 * MiB);
    assert_int_equal(r.allocated, 50 * MiB + 4 * KiB);
    assert_int_equal(r.reserved, 52 * MiB);
    assert_int_equal(r.cap, 64 * MiB);
    assert_int_equal(r.device_total, 64 * MiB);
    assert_int_equal(r.device_free, 12 * MiB);
    assert_int_equal(r.largest_free_block, 2 * MiB - 4 * KiB);
    assert_int_equal(r.job, 2);
    assert_int_equal(r.tag, POOL_TAG_ACTIVATIONS);
    assert_false(r.job_limit_hit);
    assert_int_equal(r.job_allocated, 50 * MiB + 4 * KiB);
    assert_null(strchr(r.message, '\n'));
    assert_non_null(strstr(r.message, "30M"));
    assert_non_null(strstr(r.message, "activations"));
    assert_non_null(strstr(r.message, "reserved 52M"));
    assert_non_null(strstr(r.message, "device free 12M"));
    assert_non_null(strstr(r.message, "largest free block 2M"));
    pool_stats *s = stats(f.p);
    assert_int_equal(s->ooms, 1);
    assert_int_equal(count_events(f.p, POOL_EV_OOM, -1), 1);

    /* Another process takes the room: the device, not the cap, refuses. */
    pool_free(f.p, a);
    pool_trim(f.p, POOL_TRIM_REQUEST, 0);
    assert_int_equal(dev_cpu_set_external(f.d, 40 * MiB), DEV_OK);
    assert_null(pool_alloc(f.p, 30 * MiB, POOL_TAG_ACTIVATIONS, 2, &r));
    assert_int_equal(r.device_free, 22 * MiB);
    assert_non_null(strstr(r.message, "device refused"));
    /* A NULL report is allowed. */
    assert_null(pool_alloc(f.p, 30 * MiB, POOL_TAG_ACTIVATIONS, 2, NULL));
    dev_cpu_set_external(f.d, 0);
    void *ok = pool_alloc(f.p, 30 * MiB, POOL_TAG_ACTIVATIONS, 2, &r);
    assert_non_null(ok);
    pool_free(f.p, ok);
    pool_free(f.p, s1);
    /* Requests beyond the cap, up to beyond the address space. */
    pool_stats *before = stats(f.p);
    uint64_t retries = before->alloc_retries, trims = before->trims;
    assert_null(pool_alloc(f.p, 64 * MiB + 1, POOL_TAG_OTHER, 2, &r));
    assert_null(pool_alloc(f.p, SIZE_MAX - 1000, POOL_TAG_OTHER, 2, &r));
    assert_null(pool_alloc(f.p, SIZE_MAX - 10, POOL_TAG_OTHER, 2, &r));
    assert_int_equal(r.requested, SIZE_MAX - 10);
    assert_non_null(strstr(r.message, "cap"));
    s = stats(f.p);
    assert_int_equal(s->alloc_retries, retries); /* hopeless: no trim, no retry */
    assert_int_equal(s->trims, trims);
    fx_close(&f);
}

/* ==== trim triggers ============================================================================ */

/* Three idle large segments of distinct sizes, released in the order
 * given, so the LRU order and which one went are both visible. */
static void make_idle(fx *f, size_t first, size_t second, size_t third)
{
    void *a = pool_alloc(f->p, first, POOL_TAG_OTHER, 1, NULL);
    void *b = pool_alloc(f->p, second, POOL_TAG_OTHER, 1, NULL);
    void *c = pool_alloc(f->p, third, POOL_TAG_OTHER, 1, NULL);
    assert_true(a && b && c);
    pool_free(f->p, a);
    pool_free(f->p, b);
    pool_free(f->p, c);
}

static void test_trim_request(void **state)
{
    (void)state;
    fx f;
    fx_open(&f, 512 * MiB, NULL);
    make_idle(&f, 40 * MiB, 42 * MiB, 44 * MiB);
    void *live = pool_alloc(f.p, 4 * KiB, POOL_TAG_OTHER, 1, NULL);
    /* A target takes the least recently used first, and only as many as needed. */
    pool_trim_result r = pool_trim(f.p, POOL_TRIM_REQUEST, 1);
    assert_int_equal(r.bytes, 40 * MiB);
    assert_int_equal(r.segments, 1);
    r = pool_trim(f.p, POOL_TRIM_REQUEST, 0);
    assert_int_equal(r.bytes, 86 * MiB);
    assert_int_equal(r.reserved_after, 2 * MiB); /* the small segment with a live block stays */
    pool_stats *s = stats(f.p);
    assert_int_equal(s->trims, 2);
    assert_int_equal(s->trimmed_bytes, 126 * MiB);
    assert_true(s->trim_ns > 0);
    assert_int_equal(count_events(f.p, POOL_EV_TRIM, POOL_TRIM_REQUEST), 2);
    /* A trim with nothing to give still counts: the user asked. */
    r = pool_trim(f.p, POOL_TRIM_REQUEST, 0);
    assert_int_equal(r.bytes, 0);
    assert_int_equal(stats(f.p)->trims, 3);
    pool_free(f.p, live);
    fx_close(&f);
}

/* A device that reads the pool's published figures (lock-free, as gradctl
 * and the shm page do) from inside each release the pool makes. */
static struct {
    dev_ops ops;
    const dev_ops *real;
    pool *p;
    int calls;
    uint64_t trims_seen, reserved_seen;
} spy;

static void spy_look(void)
{
    pool_stats s;
    pool_stats_read(spy.p, &s);
    spy.calls++;
    spy.trims_seen = s.trims;
    spy.reserved_seen = s.reserved_bytes[POOL_ALL].current;
}

static void spy_free(dev *d, void *ptr, size_t bytes)
{
    spy_look();
    spy.real->free(d, ptr, bytes);
}

static void spy_va_unmap(dev *d, void *addr, size_t bytes)
{
    spy_look();
    spy.real->va_unmap(d, addr, bytes);
}

/* A trim's released bytes and its count change together: a reader that
 * sees the memory gone sees the trim that gave it back.  The device calls
 * come after the figures are published, never inside their section. */
static void test_trim_published_as_one(void **state)
{
    (void)state;
    for (int expandable = 0; expandable < 2; expandable++) {
        fx f;
        pool_config c = cfg_default();
        c.expandable_segments = expandable;
        fx_open(&f, 512 * MiB, &c);
        make_idle(&f, 40 * MiB, 42 * MiB, 44 * MiB);
        size_t before = stats(f.p)->trims;
        memset(&spy, 0, sizeof spy);
        spy.real = f.d->ops;
        spy.ops = *f.d->ops;
        spy.ops.free = spy_free;
        spy.ops.va_unmap = spy_va_unmap;
        spy.p = f.p;
        f.d->ops = &spy.ops;

        pool_trim_result r = pool_trim(f.p, POOL_TRIM_IDLE, 0);
        assert_int_equal(r.reserved_after, 0);
        assert_true(spy.calls >= 1);
        assert_int_equal(spy.trims_seen, before + 1);
        assert_int_equal(spy.reserved_seen, 0);
        pool_stats *s = stats(f.p);
        assert_int_equal(s->idle_trims, 1);
        assert_int_equal(s->idle_trimmed_bytes, r.bytes);
        assert_true(s->trim_ns > 0);
        assert_int_equal(device_free(f.d), 512 * MiB);
        f.d->ops = spy.real;
        fx_close(&f);
    }
}

static void test_trim_periodic_steps(void **state)
{
    (void)state;
    fx f;
    pool_config c = cfg_default();
    c.trim_every_steps = 3;
    fx_open(&f, 256 * MiB, &c);
    make_idle(&f, 20 * MiB, 22 * MiB, 24 * MiB);
    pool_tick(f.p, 1);
    pool_tick(f.p, 2);
    pool_tick(f.p, 0); /* timer ticks are not steps */
    assert_int_equal(stats(f.p)->trims, 0);
    pool_tick(f.p, 3);
    pool_stats *s = stats(f.p);
    assert_int_equal(s->trims, 1);
    assert_int_equal(s->reserved_bytes[POOL_ALL].current, 0);
    assert_int_equal(count_events(f.p, POOL_EV_TRIM, POOL_TRIM_PERIODIC), 1);
    /* With nothing cached, a due periodic trim is skipped, not counted. */
    for (uint64_t i = 4; i <= 9; i++)
        pool_tick(f.p, i);
    assert_int_equal(stats(f.p)->trims, 1);
    fx_close(&f);
}

static void test_trim_periodic_ms(void **state)
{
    (void)state;
    fx f;
    pool_config c = cfg_default();
    c.trim_every_ms = 2;
    fx_open(&f, 256 * MiB, &c);
    make_idle(&f, 20 * MiB, 22 * MiB, 24 * MiB);
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
    pool_tick(f.p, 0);
    pool_stats *s = stats(f.p);
    assert_int_equal(s->trims, 1);
    assert_int_equal(s->reserved_bytes[POOL_ALL].current, 0);
    assert_int_equal(count_events(f.p, POOL_EV_TRIM, POOL_TRIM_PERIODIC), 1);
    fx_close(&f);
}

static void test_trim_gc_lru(void **state)
{
    (void)state;
    fx f;
    pool_config c = cfg_default();
    c.gc_threshold = 0.5; /* 128 MiB of 256 */
    fx_open(&f, 256 * MiB, &c);
    void *a = pool_alloc(f.p, 40 * MiB, POOL_TAG_OTHER, 1, NULL);
    void *b = pool_alloc(f.p, 42 * MiB, POOL_TAG_OTHER, 1, NULL);
    void *cc = pool_alloc(f.p, 44 * MiB, POOL_TAG_OTHER, 1, NULL);
    void *e = pool_alloc(f.p, 30 * MiB, POOL_TAG_OTHER, 1, NULL); /* 156 MiB reserved */
    assert_true(a && b && cc && e);
    assert_int_equal(stats(f.p)->trims, 0); /* above the threshold, but nothing cached */
    pool_free(f.p, b);
    pool_free(f.p, a);
    pool_free(f.p, cc); /* LRU order: b, a, cc */
    pool_tick(f.p, 0);
    pool_stats *s = stats(f.p);
    /* Releasing b (42 MiB) alone gets below 128 MiB: 114 MiB means b went
     * first, not a (116) or cc (112). */
    assert_int_equal(s->reserved_bytes[POOL_ALL].current, 114 * MiB);
    assert_int_equal(s->trims, 1);
    assert_int_equal(count_events(f.p, POOL_EV_TRIM, POOL_TRIM_GC), 1);

    /* On growth: 114 + 30 > 128, so a (next in LRU order) goes first. */
    void *g = pool_alloc(f.p, 46 * MiB, POOL_TAG_OTHER, 1, NULL);
    s = stats(f.p);
    assert_int_equal(s->trims, 2);
    assert_int_equal(s->reserved_bytes[POOL_ALL].current, (114 - 40 + 46) * MiB);
    assert_int_equal(count_events(f.p, POOL_EV_TRIM, POOL_TRIM_GC), 2);
    pool_free(f.p, e);
    pool_free(f.p, g);
    fx_close(&f);
}

static void test_trim_low_watermark(void **state)
{
    (void)state;
    fx f;
    pool_config c = cfg_default();
    c.low_watermark = 32 * MiB;
    fx_open(&f, 128 * MiB, &c);
    make_idle(&f, 20 * MiB, 22 * MiB, 24 * MiB); /* LRU: 20, 22, 24 */
    void *live = pool_alloc(f.p, 4 * KiB, POOL_TAG_OTHER, 1, NULL);
    pool_tick(f.p, 0);
    assert_int_equal(stats(f.p)->trims, 0); /* 60 MiB free: no pressure */
    /* Another process takes 50 MiB: 128 - 68 - 50 = 10 MiB free < 32. */
    assert_int_equal(dev_cpu_set_external(f.d, 50 * MiB), DEV_OK);
    pool_tick(f.p, 0);
    pool_stats *s = stats(f.p);
    assert_int_equal(s->trims, 1);
    /* 22 MiB short: 20 + 22 MiB go, the most recently used 24 MiB stays. */
    assert_int_equal(s->trimmed_bytes, 42 * MiB);
    assert_int_equal(s->reserved_bytes[POOL_ALL].current, 26 * MiB);
    assert_true(device_free(f.d) >= 32 * MiB);
    assert_int_equal(count_events(f.p, POOL_EV_TRIM, POOL_TRIM_PRESSURE), 1);
    dev_cpu_set_external(f.d, 0);
    pool_free(f.p, live);
    fx_close(&f);
}


/* ==== the idle trim ========================================================================= */

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000 * 1000};
    nanosleep(&ts, NULL);
}

static void test_trim_idle(void **state)
{
    (void)state;
    fx f;
    pool_config c = cfg_default();
    c.idle_trim_ms = 50;
    fx_open(&f, 256 * MiB, &c);
    /* Two jobs run; one ends with its cache left behind. */
    pool_use_begin(f.p);
    pool_use_begin(f.p);
    make_idle(&f, 20 * MiB, 22 * MiB, 24 * MiB);
    pool_use_end(f.p);
    sleep_ms(80);
    pool_tick(f.p, 0);
    assert_int_equal(stats(f.p)->trims, 0); /* the other job still runs */
    pool_use_end(f.p);
    pool_tick(f.p, 0);
    assert_int_equal(stats(f.p)->trims, 0); /* idle, but not for idle_trim yet */
    sleep_ms(80);
    pool_tick(f.p, 0);
    pool_stats *s = stats(f.p);
    assert_int_equal(s->trims, 1);
    assert_int_equal(s->idle_trims, 1);
    assert_int_equal(s->trimmed_bytes, 66 * MiB);
    assert_int_equal(s->idle_trimmed_bytes, 66 * MiB);
    assert_int_equal(s->reserved_bytes[POOL_ALL].current, 0);
    assert_int_equal(device_free(f.d), 256 * MiB);
    assert_int_equal(count_events(f.p, POOL_EV_TRIM, POOL_TRIM_IDLE), 1);
    assert_string_equal(pool_trim_reason_name(POOL_TRIM_IDLE), "idle");
    CHECK(f.p);

    /* Once per idle spell: memory cached without a job stays until a job
     * has come and gone. */
    make_idle(&f, 20 * MiB, 22 * MiB, 24 * MiB);
    sleep_ms(80);
    pool_tick(f.p, 0);
    assert_int_equal(stats(f.p)->trims, 1);
    pool_use_begin(f.p);
    pool_use_end(f.p);
    sleep_ms(80);
    pool_tick(f.p, 0);
    s = stats(f.p);
    assert_int_equal(s->idle_trims, 2);
    assert_int_equal(s->idle_trimmed_bytes, 132 * MiB);
    assert_int_equal(s->reserved_bytes[POOL_ALL].current, 0);
    fx_close(&f);
}

static void test_trim_idle_keeps_live_blocks(void **state)
{
    (void)state;
    fx f;
    pool_config c = cfg_default();
    c.idle_trim_ms = 1;
    fx_open(&f, 256 * MiB, &c);
    make_idle(&f, 20 * MiB, 22 * MiB, 24 * MiB);
    void *live = pool_alloc(f.p, 30 * MiB, POOL_TAG_PARAMS, 1, NULL);
    sleep_ms(5);
    pool_tick(f.p, 0);
    pool_stats *s = stats(f.p);
    assert_int_equal(s->idle_trimmed_bytes, 66 * MiB);
    assert_int_equal(s->reserved_bytes[POOL_ALL].current, 30 * MiB);
    pool_free(f.p, live);
    fx_close(&f);
}

static void test_trim_idle_off(void **state)
{
    (void)state;
    fx f;
    fx_open(&f, 256 * MiB, NULL); /* pool_config_default: idle_trim_ms = 0 */
    make_idle(&f, 20 * MiB, 22 * MiB, 24 * MiB);
    pool_use_begin(f.p);
    pool_use_end(f.p);
    sleep_ms(5);
    pool_tick(f.p, 0);
    pool_stats *s = stats(f.p);
    assert_int_equal(s->trims, 0);
    assert_int_equal(s->reserved_bytes[POOL_ALL].current, 66 * MiB);
    fx_close(&f);
}

/* One pool, two jobs: what job 1 freed is cached, and job 2's miss gets
 * it back through the OOM trim before any OOM, while job 1's live block
 * stays where it is. */
static void test_oom_reclaims_other_jobs_cache(void **state)
{
    (void)state;
    fx f;
    fx_open(&f, 64 * MiB, NULL);
    void *held = pool_alloc(f.p, 20 * MiB, POOL_TAG_PARAMS, 1, NULL);
    void *freed = pool_alloc(f.p, 20 * MiB, POOL_TAG_ACTIVATIONS, 1, NULL);
    assert_true(held && freed);
    pool_free(f.p, freed);
    /* 40 MiB reserved, 20 cached: job 2's 30 MiB fits no cached block and
     * 40 + 30 is past the 64 MiB cap. */
    pool_oom_report r;
    void *b = pool_alloc(f.p, 30 * MiB, POOL_TAG_ACTIVATIONS, 2, &r);
    assert_non_null(b);
    pool_stats *s = stats(f.p);
    assert_int_equal(s->ooms, 0);
    assert_int_equal(s->alloc_retries, 1);
    assert_int_equal(s->trimmed_bytes, 20 * MiB);
    assert_int_equal(s->reserved_bytes[POOL_ALL].current, 50 * MiB);
    assert_int_equal(count_events(f.p, POOL_EV_TRIM, POOL_TRIM_OOM), 1);
    assert_int_equal(count_events(f.p, POOL_EV_OOM, -1), 0);
    for (size_t i = 0; i < s->njobs; i++)
        assert_int_equal(s->jobs[i].current, s->jobs[i].job == 1 ? 20 * MiB : 30 * MiB);
    CHECK(f.p);
    pool_free(f.p, held);
    pool_free(f.p, b);
    fx_close(&f);
}


int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expandable_basic),
        cmocka_unit_test(test_expandable_holes),
        cmocka_unit_test(test_expandable_aligned_tail),
        cmocka_unit_test(test_expandable_capacity),
        cmocka_unit_test(test_memory_fraction_cap),
        cmocka_unit_test(test_job_limit),
        cmocka_unit_test(test_oom_trim_retry),
        cmocka_unit_test(test_oom_report),
        cmocka_unit_test(test_trim_request),
        cmocka_unit_test(test_trim_published_as_one),
        cmocka_unit_test(test_trim_periodic_steps),
        cmocka_unit_test(test_trim_periodic_ms),
        cmocka_unit_test(test_trim_gc_lru),
        cmocka_unit_test(test_trim_low_watermark),
        cmocka_unit_test(test_trim_idle),
        cmocka_unit_test(test_trim_idle_keeps_live_blocks),
        cmocka_unit_test(test_trim_idle_off),
        cmocka_unit_test(test_oom_reclaims_other_jobs_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
