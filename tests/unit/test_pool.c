/* test_pool.c — the memory pool on the simulated cpu device.
 *
 * Targeted scenarios for each rule of the pool (rounding, placement,
 * splitting, max_split_size, coalescing, expandable segments, caps, job
 * limits, OOM handling, every trim trigger, breakdowns, the timeline), then
 * seeded random load with pool_check after every operation.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* for clock_gettime etc. under -std=c11 */
#endif
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

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* ==== fixture ================================================================= */

typedef struct {
    dev *d;
    pool *p;
} fx;

#define CHECK(p)                                                  \
    do {                                                          \
        char err_[256];                                           \
        if (pool_check((p), err_, sizeof err_) != 0)              \
            fail_msg("pool_check: %s", err_);                     \
    } while (0)

static void fx_open(fx *f, size_t capacity, const pool_config *c)
{
    assert_int_equal(dev_cpu_create(capacity, 0, &f->d), DEV_OK);
    assert_int_equal(pool_create(f->d, c, &f->p), 0);
    CHECK(f->p);
}

/* Destroying the pool must hand every byte back to the device. */
static void fx_close(fx *f)
{
    CHECK(f->p);
    pool_destroy(f->p);
    size_t fr = 0, total = 0;
    dev_mem_info(f->d, &fr, &total);
    assert_int_equal(fr + dev_cpu_external(f->d), total);
    dev_destroy(f->d);
}

static pool_config cfg_default(void)
{
    pool_config c;
    pool_config_default(&c);
    return c;
}

static pool_stats *stats(pool *p)
{
    static pool_stats s; /* tests are single-threaded */
    pool_stats_read(p, &s);
    return &s;
}

static size_t device_free(dev *d)
{
    size_t fr = 0, total = 0;
    dev_mem_info(d, &fr, &total);
    return fr;
}

/* Count timeline events of a kind (and trim reason, when >= 0). */
static size_t count_events(pool *p, pool_event_kind kind, int reason)
{
    pool_event *ev = calloc(65536, sizeof *ev);
    assert_non_null(ev);
    size_t n = pool_timeline_snapshot(p, ev, 65536), k = 0;
    for (size_t i = 0; i < n; i++)
        if (ev[i].kind == kind && (reason < 0 || ev[i].aux == (uint64_t)reason))
            k++;
    free(ev);
    return k;
}

/* splitmix64: reproducible streams for the placement and random tests. */
typedef struct {
    uint64_t s;
} rng;

static uint64_t rnd(rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ==== names ===================================================================== */

static void test_names(void **state)
{
    (void)state;
    for (int t = 0; t < POOL_TAG_COUNT; t++) {
        pool_tag back;
        assert_int_equal(pool_tag_parse(pool_tag_name((pool_tag)t), &back), 0);
        assert_int_equal(back, t);
    }
    pool_tag x;
    assert_int_equal(pool_tag_parse("bogus", &x), -1);
    assert_string_equal(pool_tag_name(POOL_TAG_ACTIVATIONS), "activations");
    assert_string_equal(pool_trim_reason_name(POOL_TRIM_GC), "gc");
    assert_string_equal(pool_trim_reason_name(POOL_TRIM_PRESSURE), "pressure");
    assert_string_equal(pool_event_kind_name(POOL_EV_BATCH_CHANGE), "batch_change");
}

static void test_bad_config(void **state)
{
    (void)state;
    dev *d;
    pool *p = (pool *)1;
    assert_int_equal(dev_cpu_create(64 * MiB, 0, &d), DEV_OK);
    pool_config c = cfg_default();
    c.memory_fraction = 0;
    assert_int_equal(pool_create(d, &c, &p), -1);
    assert_null(p);
    c.memory_fraction = 1.5;
    assert_int_equal(pool_create(d, &c, &p), -1);
    c = cfg_default();
    c.gc_threshold = -0.1;
    assert_int_equal(pool_create(d, &c, &p), -1);
    assert_int_equal(pool_create(d, NULL, &p), 0); /* NULL config: defaults */
    assert_int_equal(stats(p)->cap, 64 * MiB);
    pool_destroy(p);
    dev_destroy(d);
}

/* ==== sizes and placement ========================================================= */

static void test_rounding(void **state)
{
    (void)state;
    fx f;
    fx_open(&f, 256 * MiB, NULL);
    static const size_t asks[][2] = {{0, 512}, {1, 512}, {512, 512}, {513, 1024}, {1000, 1024},
                                     {MiB - 1, MiB}, {MiB + 1, MiB + 512}};
    void *ptr[7];
    size_t want_alloc = 0, want_req = 0;
    for (int i = 0; i < 7; i++) {
        ptr[i] = pool_alloc(f.p, asks[i][0], POOL_TAG_OTHER, 1, NULL);
        assert_non_null(ptr[i]);
        assert_int_equal((uintptr_t)ptr[i] % 512, 0);
        assert_int_equal(pool_block_size(f.p, ptr[i]), asks[i][1]);
        want_alloc += asks[i][1];
        want_req += asks[i][0];
        CHECK(f.p);
    }
    pool_stats *s = stats(f.p);
    assert_int_equal(s->allocated_bytes[POOL_ALL].current, want_alloc);
    assert_int_equal(s->requested_bytes[POOL_ALL].current, want_req);
    assert_int_equal(s->active_bytes[POOL_ALL].current, want_alloc);
    for (int i = 0; i < 7; i++)
        pool_free(f.p, ptr[i]);
    assert_int_equal(stats(f.p)->allocated_bytes[POOL_ALL].current, 0);
    fx_close(&f);
}

static void test_small_large_placement(void **state)
{
    (void)state;
    fx f;
    fx_open(&f, 512 * MiB, NULL);
    void *a = pool_alloc(f.p, MiB, POOL_TAG_PARAMS, 1, NULL); /* largest small request */
    pool_stats *s = stats(f.p);
    assert_int_equal(s->segments[POOL_SMALL].current, 1);
    assert_int_equal(s->reserved_bytes[POOL_SMALL].current, 2 * MiB);
    assert_int_equal(s->reserved_bytes[POOL_LARGE].current, 0);

    void *b = pool_alloc(f.p, MiB + 1, POOL_TAG_PARAMS, 1, NULL); /* smallest large: 20 MiB segment */
    s = stats(f.p);
    assert_int_equal(s->segments[POOL_LARGE].current, 1);
    assert_int_equal(s->reserved_bytes[POOL_LARGE].current, 20 * MiB);
    assert_int_equal(s->allocated_bytes[POOL_LARGE].current, MiB + 512);

    void *c = pool_alloc(f.p, 9 * MiB, POOL_TAG_PARAMS, 1, NULL); /* shares the 20 MiB segment */
    s = stats(f.p);
    assert_int_equal(s->segments[POOL_LARGE].current, 1);
    assert_int_equal(s->cache_hits, 1);

    void *d = pool_alloc(f.p, 11 * MiB, POOL_TAG_PARAMS, 1, NULL); /* >= 10 MiB: own segment, 2 MiB rounded */
    s = stats(f.p);
    assert_int_equal(s->segments[POOL_LARGE].current, 2);
    assert_int_equal(s->reserved_bytes[POOL_LARGE].current, 32 * MiB);
    assert_int_equal(s->device_allocs, 3);
    assert_int_equal(s->reserved_bytes[POOL_ALL].current, 34 * MiB);
    assert_int_equal(s->reserved_bytes[POOL_ALL].current,
                     s->reserved_bytes[POOL_SMALL].current + s->reserved_bytes[POOL_LARGE].current);
    assert_int_equal(512 * MiB - device_free(f.d), 34 * MiB); /* the device agrees */
    CHECK(f.p);
    pool_free(f.p, a);
    pool_free(f.p, b);
    pool_free(f.p, c);
    pool_free(f.p, d);
    fx_close(&f);
}

static void test_split_rules(void **state)
{
    (void)state;
    fx f;
    fx_open(&f, 512 * MiB, NULL);
    /* Small pool: any remainder of 512 B or more splits off. */
    void *a = pool_alloc(f.p, 512, POOL_TAG_OTHER, 1, NULL);
    pool_stats *s = stats(f.p);
    assert_int_equal(s->inactive_split_blocks[POOL_SMALL].current, 1);
    assert_int_equal(s->inactive_split_bytes[POOL_SMALL].current, 2 * MiB - 512);

    /* Large pool: a remainder of 1 MiB or less stays with the block. */
    void *b = pool_alloc(f.p, 19 * MiB + 512 * KiB, POOL_TAG_OTHER, 1, NULL);
    assert_int_equal(pool_block_size(f.p, b), 20 * MiB);
    pool_free(f.p, b);
    b = pool_alloc(f.p, 19 * MiB, POOL_TAG_OTHER, 1, NULL); /* remainder exactly 1 MiB */
    assert_int_equal(pool_block_size(f.p, b), 20 * MiB);
    pool_free(f.p, b);
    b = pool_alloc(f.p, 18 * MiB, POOL_TAG_OTHER, 1, NULL); /* remainder 2 MiB: split */
    assert_int_equal(pool_block_size(f.p, b), 18 * MiB);
    s = stats(f.p);
    assert_int_equal(s->inactive_split_bytes[POOL_LARGE].current, 2 * MiB);
    assert_int_equal(s->requested_bytes[POOL_LARGE].current, 18 * MiB);
    assert_int_equal(s->device_allocs, 2);
    CHECK(f.p);
    pool_free(f.p, a);
    pool_free(f.p, b);
    fx_close(&f);
}

static void test_max_split_size(void **state)
{
    (void)state;
    fx f;
    pool_config c = cfg_default();
    c.max_split_size = 32 * MiB;
    fx_open(&f, 1024 * MiB, &c);

    void *big = pool_alloc(f.p, 40 * MiB, POOL_TAG_OTHER, 1, NULL);
    pool_free(f.p, big); /* a cached 40 MiB oversize block */
    assert_int_equal(stats(f.p)->reserved_bytes[POOL_ALL].current, 40 * MiB);

    /* A normal request never takes (and splits) an oversize block. */
    void *x = pool_alloc(f.p, 8 * MiB, POOL_TAG_OTHER, 1, NULL);
    assert_true((uintptr_t)x < (uintptr_t)big || (uintptr_t)x >= (uintptr_t)big + 40 * MiB);
    assert_int_equal(stats(f.p)->reserved_bytes[POOL_ALL].current, 60 * MiB);

    /* An oversize request takes it whole, unsplit. */
    void *y = pool_alloc(f.p, 36 * MiB, POOL_TAG_OTHER, 1, NULL);
    assert_ptr_equal(y, big);
    assert_int_equal(pool_block_size(f.p, y), 40 * MiB);
    assert_int_equal(stats(f.p)->inactive_split_blocks[POOL_LARGE].current, 1); /* only x's remainder */
    pool_free(f.p, y);

    /* ... but not when the waste would be 20 MiB or more. */
    void *z = pool_alloc(f.p, 100 * MiB, POOL_TAG_OTHER, 1, NULL);
    pool_free(f.p, z);
    void *w = pool_alloc(f.p, 34 * MiB, POOL_TAG_OTHER, 1, NULL); /* best fit is big (40) */
    assert_ptr_equal(w, big);
    void *v = pool_alloc(f.p, 70 * MiB, POOL_TAG_OTHER, 1, NULL); /* 100 - 70 >= 20: not z */
    assert_ptr_not_equal(v, z);
    assert_int_equal(pool_block_size(f.p, v), 70 * MiB);
    /* 85 MiB: z wastes 15 MiB, fine, and is not split. */
    void *u = pool_alloc(f.p, 85 * MiB, POOL_TAG_OTHER, 1, NULL);
    assert_ptr_equal(u, z);
    assert_int_equal(pool_block_size(f.p, u), 100 * MiB);
    CHECK(f.p);
    pool_free(f.p, x);
    pool_free(f.p, w);
    pool_free(f.p, v);
    pool_free(f.p, u);
    fx_close(&f);
}

static void test_coalescing(void **state)
{
    (void)state;
    fx f;
    fx_open(&f, 64 * MiB, NULL);
    void *a = pool_alloc(f.p, 4 * KiB, POOL_TAG_OTHER, 1, NULL);
    void *b = pool_alloc(f.p, 4 * KiB, POOL_TAG_OTHER, 1, NULL);
    void *c = pool_alloc(f.p, 4 * KiB, POOL_TAG_OTHER, 1, NULL);
    assert_ptr_equal((char *)b, (char *)a + 4 * KiB); /* best fit packs from the segment start */
    assert_ptr_equal((char *)c, (char *)b + 4 * KiB);
    pool_free(f.p, a);
    pool_free(f.p, c); /* c merges with the tail */
    pool_stats *s = stats(f.p);
    assert_int_equal(s->inactive_split_blocks[POOL_SMALL].current, 2);
    pool_free(f.p, b); /* all three and the tail become one block */
    s = stats(f.p);
    assert_int_equal(s->inactive_split_blocks[POOL_SMALL].current, 0);
    assert_int_equal(s->largest_free_block, 2 * MiB);
    assert_true(s->fragmentation == 0.0);
    /* The same space is reused from its start. */
    void *d = pool_alloc(f.p, 12 * KiB, POOL_TAG_OTHER, 1, NULL);
    assert_ptr_equal(d, a);
    pool_free(f.p, d);

    /* Fragmentation: a live block splits the free space 1 MiB + 512 KiB,
     * so a third of what is cached is not in the largest block. */
    void *e = pool_alloc(f.p, MiB, POOL_TAG_OTHER, 1, NULL);
    void *g = pool_alloc(f.p, 512 * KiB, POOL_TAG_OTHER, 1, NULL);
    pool_free(f.p, e);
    s = stats(f.p);
    assert_int_equal(s->largest_free_block, MiB);
    assert_true(s->fragmentation > 0.333 && s->fragmentation < 0.334);
    pool_free(f.p, g);
    fx_close(&f);
}

/* Best fit, checked against a model: every request takes the smallest free
 * block that fits, the lowest address among blocks of that size, and what
 * it leaves over stays free at the same place.  The holes are freed in a
 * scrambled order, so the pool's choice cannot come from free order, and
 * several holes share each size. */
typedef struct {
    uintptr_t addr;
    size_t size;
} hole;

static void test_best_fit_order(void **state)
{
    (void)state;
    fx f;
    fx_open(&f, 64 * MiB, NULL);
    enum { N = 40 };
    void *h[N], *sep[N];
    hole model[2 * N + 1];
    size_t nm = 0;
    for (int i = 0; i < N; i++) {
        size_t sz = (size_t)(1 + (i * 7) % 5) * 2 * KiB; /* 2K .. 10K, 8 holes each */
        h[i] = pool_alloc(f.p, sz, POOL_TAG_OTHER, 1, NULL);
        sep[i] = pool_alloc(f.p, 512, POOL_TAG_OTHER, 1, NULL); /* keeps holes apart */
        assert_non_null(h[i]);
        assert_non_null(sep[i]);
        model[nm++] = (hole){(uintptr_t)h[i], sz};
    }
    /* One segment from its start, so the tail is the rest of it. */
    uintptr_t tail = (uintptr_t)sep[N - 1] + 512;
    assert_int_equal(tail - (uintptr_t)h[0] < 2 * MiB, 1);
    model[nm++] = (hole){tail, (uintptr_t)h[0] + 2 * MiB - tail};
    for (int k = 0; k < N; k++)
        pool_free(f.p, h[(k * 17) % N]); /* 17 is prime to N: each once */
    CHECK(f.p);

    rng r = {7};
    void *got[3 * N];
    for (int k = 0; k < 3 * N; k++) {
        size_t want = 512 * (1 + (size_t)(rnd(&r) % 22)); /* up to 11K: some fit no hole */
        size_t best = SIZE_MAX;
        for (size_t m = 0; m < nm; m++)
            if (model[m].size >= want &&
                (best == SIZE_MAX || model[m].size < model[best].size ||
                 (model[m].size == model[best].size && model[m].addr < model[best].addr)))
                best = m;
        assert_true(best != SIZE_MAX);
        got[k] = pool_alloc(f.p, want, POOL_TAG_OTHER, 1, NULL);
        assert_int_equal((uintptr_t)got[k], model[best].addr);
        model[best].addr += want;
        model[best].size -= want;
        if (!model[best].size)
            model[best] = model[--nm];
        CHECK(f.p);
    }
    for (int k = 0; k < 3 * N; k++)
        pool_free(f.p, got[k]);
    for (int i = 0; i < N; i++)
        pool_free(f.p, sep[i]);
    pool_stats *s = stats(f.p);
    assert_int_equal(s->largest_free_block, 2 * MiB);
    assert_int_equal(s->inactive_split_blocks[POOL_ALL].current, 0);
    fx_close(&f);
}

/* With expandable segments a small run can grow past 2 MiB, so a small
 * pool can hold free blocks too big for any size bin; best fit must still
 * prefer a smaller binned block and fall back to the big one. */
static void test_expandable_small_big_blocks(void **state)
{
    (void)state;
    fx f;
    pool_config c = cfg_default();
    c.expandable_segments = true;
    fx_open(&f, 256 * MiB, &c);
    void *v[6];
    for (int i = 0; i < 6; i++) {
        v[i] = pool_alloc(f.p, MiB, POOL_TAG_OTHER, 1, NULL);
        assert_non_null(v[i]);
        if (i)
            assert_ptr_equal((char *)v[i], (char *)v[i - 1] + MiB); /* one growing run */
    }
    pool_stats *s = stats(f.p);
    assert_int_equal(s->segments[POOL_SMALL].current, 1);
    assert_int_equal(s->reserved_bytes[POOL_SMALL].current, 6 * MiB);
    pool_free(f.p, v[0]); /* a 1 MiB hole */
    for (int i = 2; i < 6; i++)
        pool_free(f.p, v[i]); /* a 4 MiB free tail */
    CHECK(f.p);
    s = stats(f.p);
    assert_int_equal(s->largest_free_block, 4 * MiB);
    void *a = pool_alloc(f.p, 512 * KiB, POOL_TAG_OTHER, 1, NULL);
    assert_ptr_equal(a, v[0]); /* the smaller block fits: it wins */
    void *b = pool_alloc(f.p, 768 * KiB, POOL_TAG_OTHER, 1, NULL);
    assert_ptr_equal(b, v[2]); /* only the big one fits */
    CHECK(f.p);
    s = stats(f.p);
    assert_int_equal(s->largest_free_block, 4 * MiB - 768 * KiB);
    assert_int_equal(s->device_allocs, 3);
    pool_free(f.p, a);
    pool_free(f.p, b);
    pool_free(f.p, v[1]);
    CHECK(f.p);
    assert_int_equal(stats(f.p)->largest_free_block, 6 * MiB);
    fx_close(&f);
}

/* Parameters, gradients and optimizer state get segments of their own:
 * state allocated after a step's activations were freed does not fill (and
 * pin) the activations' holes.  Only when nothing else works does a
 * request cross over. */
static void test_lifetime_classes(void **state)
{
    (void)state;
    fx f;
    fx_open(&f, 256 * MiB, NULL);
    void *act = pool_alloc(f.p, 8 * MiB, POOL_TAG_ACTIVATIONS, 1, NULL);
    void *ws = pool_alloc(f.p, 4 * MiB, POOL_TAG_WORKSPACE, 1, NULL);
    pool_free(f.p, act); /* an 8 MiB hole in the transient segment */
    void *grads = pool_alloc(f.p, 8 * MiB, POOL_TAG_GRADS, 1, NULL);
    assert_ptr_not_equal(grads, act);
    pool_stats *s = stats(f.p);
    assert_int_equal(s->segments[POOL_LARGE].current, 2);
    /* The hole still serves the next step's activations. */
    void *act2 = pool_alloc(f.p, 8 * MiB, POOL_TAG_ACTIVATIONS, 1, NULL);
    assert_ptr_equal(act2, act);
    void *opt = pool_alloc(f.p, 4 * MiB, POOL_TAG_OPTIMIZER, 1, NULL); /* shares the grads' segment */
    assert_int_equal(stats(f.p)->segments[POOL_LARGE].current, 2);
    CHECK(f.p);
    pool_free(f.p, act2);
    pool_free(f.p, grads);
    pool_free(f.p, opt);
    pool_free(f.p, ws);
    fx_close(&f);

    /* A device with room for one segment: a persistent request takes the
     * transient hole rather than fail. */
    fx_open(&f, 24 * MiB, NULL);
    act = pool_alloc(f.p, 8 * MiB, POOL_TAG_ACTIVATIONS, 1, NULL);
    ws = pool_alloc(f.p, 4 * MiB, POOL_TAG_WORKSPACE, 1, NULL);
    pool_free(f.p, act);
    void *params = pool_alloc(f.p, 8 * MiB, POOL_TAG_PARAMS, 1, NULL);
    assert_ptr_equal(params, act);
    s = stats(f.p);
    assert_int_equal(s->ooms, 0);
    assert_int_equal(s->segments[POOL_ALL].current, 1);
    CHECK(f.p);
    pool_free(f.p, params);
    pool_free(f.p, ws);
    fx_close(&f);
}

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

/* ==== breakdowns and peaks ========================================================================= */

static void test_breakdowns(void **state)
{
    (void)state;
    fx f;
    fx_open(&f, 512 * MiB, NULL);
    void *p1 = pool_alloc(f.p, 8 * MiB, POOL_TAG_PARAMS, 1, NULL);
    void *g1 = pool_alloc(f.p, 8 * MiB, POOL_TAG_GRADS, 1, NULL);
    void *o1 = pool_alloc(f.p, 16 * MiB, POOL_TAG_OPTIMIZER, 1, NULL);
    void *a2 = pool_alloc(f.p, 2 * MiB, POOL_TAG_ACTIVATIONS, 2, NULL);
    void *w2 = pool_alloc(f.p, 100 * KiB, POOL_TAG_WORKSPACE, 2, NULL);
    pool_stats *s = stats(f.p);
    assert_int_equal(s->tag_current[POOL_TAG_PARAMS], 8 * MiB);
    assert_int_equal(s->tag_current[POOL_TAG_GRADS], 8 * MiB);
    assert_int_equal(s->tag_current[POOL_TAG_OPTIMIZER], 16 * MiB);
    assert_int_equal(s->tag_current[POOL_TAG_ACTIVATIONS], 2 * MiB);
    assert_int_equal(s->tag_current[POOL_TAG_WORKSPACE], 100 * KiB);
    int64_t sum = 0;
    for (int t = 0; t < POOL_TAG_COUNT; t++)
        sum += s->tag_current[t];
    assert_int_equal(sum, s->allocated_bytes[POOL_ALL].current);
    assert_int_equal(s->njobs, 2);
    for (size_t j = 0; j < s->njobs; j++) {
        if (s->jobs[j].job == 1) {
            assert_int_equal(s->jobs[j].current, 32 * MiB);
            assert_int_equal(s->jobs[j].tag_current[POOL_TAG_OPTIMIZER], 16 * MiB);
        } else {
            assert_int_equal(s->jobs[j].job, 2);
            assert_int_equal(s->jobs[j].current, 2 * MiB + 100 * KiB);
        }
    }
    /* Peaks stay after frees, and reset to current. */
    pool_free(f.p, a2);
    s = stats(f.p);
    assert_int_equal(s->tag_current[POOL_TAG_ACTIVATIONS], 0);
    assert_int_equal(s->tag_peak[POOL_TAG_ACTIVATIONS], 2 * MiB);
    assert_int_equal(s->allocated_bytes[POOL_ALL].peak, 34 * MiB + 100 * KiB);
    assert_int_equal(s->allocations[POOL_ALL].current, 4);
    assert_int_equal(s->allocations[POOL_ALL].allocated, 5);
    assert_int_equal(s->allocations[POOL_ALL].freed, 1);
    pool_stats_reset_peaks(f.p);
    s = stats(f.p);
    assert_int_equal(s->tag_peak[POOL_TAG_ACTIVATIONS], 0);
    assert_int_equal(s->allocated_bytes[POOL_ALL].peak, 32 * MiB + 100 * KiB);
    assert_int_equal(s->allocated_bytes[POOL_LARGE].peak, 32 * MiB);
    assert_int_equal(s->allocated_bytes[POOL_ALL].allocated, 34 * MiB + 100 * KiB); /* totals stay */
    for (size_t j = 0; j < s->njobs; j++)
        if (s->jobs[j].job == 2)
            assert_int_equal(s->jobs[j].peak, 100 * KiB);
    /* A job that freed everything can be forgotten; one holding memory not. */
    pool_free(f.p, w2);
    pool_job_forget(f.p, 2);
    pool_job_forget(f.p, 1);
    s = stats(f.p);
    assert_int_equal(s->njobs, 1);
    assert_int_equal(s->jobs[0].job, 1);
    pool_free(f.p, p1);
    pool_free(f.p, g1);
    pool_free(f.p, o1);
    /* Bad frees are counted, not fatal. */
    int x;
    pool_free(f.p, &x);
    pool_free(f.p, NULL);
    assert_int_equal(stats(f.p)->invalid_frees, 1);
    assert_int_equal(pool_block_size(f.p, &x), 0);
    fx_close(&f);
}

static void test_many_jobs(void **state)
{
    (void)state;
    fx f;
    fx_open(&f, 512 * MiB, NULL);
    void *keep[POOL_MAX_JOBS];
    for (uint32_t j = 0; j < POOL_MAX_JOBS; j++)
        keep[j] = pool_alloc(f.p, 512, POOL_TAG_OTHER, 1000 + j, NULL);
    pool_oom_report r;
    /* The table is full of jobs holding memory. */
    assert_null(pool_alloc(f.p, 512, POOL_TAG_OTHER, 5000, &r));
    assert_non_null(strstr(r.message, "jobs"));
    assert_int_equal(pool_job_set_limit(f.p, 5000, MiB), -1);
    /* A job that freed everything gives its row up on demand. */
    pool_free(f.p, keep[0]);
    void *n = pool_alloc(f.p, 512, POOL_TAG_OTHER, 5000, NULL);
    assert_non_null(n);
    CHECK(f.p);
    pool_free(f.p, n);
    for (uint32_t j = 1; j < POOL_MAX_JOBS; j++)
        pool_free(f.p, keep[j]);
    fx_close(&f);
}

/* Thousands of live blocks: the pointer map grows, the trees stay balanced. */
static void test_many_blocks(void **state)
{
    (void)state;
    fx f;
    fx_open(&f, 256 * MiB, NULL);
    enum { N = 5000 };
    void **v = calloc(N, sizeof *v);
    assert_non_null(v);
    for (int i = 0; i < N; i++) {
        /* Out-of-range tags are filed under "other". */
        v[i] = pool_alloc(f.p, 512 * (size_t)(1 + i % 7), i == 0 ? (pool_tag)99 : POOL_TAG_DATA, 1, NULL);
        assert_non_null(v[i]);
    }
    CHECK(f.p);
    assert_int_equal(stats(f.p)->tag_current[POOL_TAG_OTHER], 512);
    uint64_t seed = 12345;
    for (int i = N - 1; i > 0; i--) { /* shuffle */
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int j = (int)((seed >> 33) % (uint64_t)(i + 1));
        void *t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
    for (int i = 0; i < N; i++) {
        assert_true(pool_block_size(f.p, v[i]) >= 512);
        pool_free(f.p, v[i]);
        if (i % 500 == 0)
            CHECK(f.p);
    }
    pool_stats *s = stats(f.p);
    assert_int_equal(s->allocations[POOL_ALL].current, 0);
    assert_int_equal(s->allocations[POOL_ALL].peak, N);
    assert_int_equal(s->inactive_split_blocks[POOL_ALL].current, 0);
    free(v);
    fx_close(&f);
}

/* ==== timeline =========================================================================================== */

static void test_timeline(void **state)
{
    (void)state;
    fx f;
    pool_config c = cfg_default();
    c.timeline_capacity = 16;
    fx_open(&f, 256 * MiB, &c);
    void *keep = pool_alloc(f.p, 5 * MiB, POOL_TAG_PARAMS, 4, NULL); /* map + alloc */
    for (int i = 0; i < 20; i++) {
        /* Short-lived tags only: one small segment serves them all. */
        pool_tag t = (pool_tag)(POOL_TAG_ACTIVATIONS + i % 4);
        void *x = pool_alloc(f.p, (size_t)(i + 1) * 4 * KiB, t, 4, NULL);
        pool_free(f.p, x);
    }
    pool_timeline_mark(f.p, POOL_EV_BATCH_CHANGE, 4, 16, "micro 32->16 \"oom\"\n");
    pool_stats *s = stats(f.p);
    uint64_t recorded = 2 + 1 + 40 + 1; /* large map+alloc, small map, 20 pairs, the mark */
    assert_int_equal(s->timeline_events, recorded);
    assert_int_equal(s->timeline_dropped, recorded - 16);

    pool_event ev[16];
    assert_int_equal(pool_timeline_snapshot(f.p, ev, 16), 16);
    assert_int_equal(ev[15].kind, POOL_EV_BATCH_CHANGE);
    assert_int_equal(ev[15].external, 1);
    assert_string_equal(ev[15].note, "micro 32->16 \"oom\"\n");
    for (int i = 1; i < 16; i++)
        assert_true(ev[i].ns >= ev[i - 1].ns);

    char path[] = "/tmp/test_pool_timeline_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *out = fdopen(fd, "w+");
    assert_non_null(out);
    assert_int_equal(pool_timeline_write_json(f.p, out), 0);
    fclose(out);

    /* Parse it and check the rebuilt counters end at today's figures. */
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import json,sys\n"
             "d=json.load(open(sys.argv[1]))\n"
             "ev=d[\"traceEvents\"]\n"
             "a=[e for e in ev if e[\"ph\"]==\"C\" and e[\"name\"]==\"allocated\"][-1][\"args\"]\n"
             "r=[e for e in ev if e[\"ph\"]==\"C\" and e[\"name\"]==\"reserved\"][-1][\"args\"]\n"
             "n=sum(1 for e in ev if e[\"ph\"]==\"i\")\n"
             "print(a[\"params\"], sum(a.values()), sum(r.values()), n, d[\"otherData\"][\"events_dropped\"])' %s",
             path);
    FILE *py = popen(cmd, "r");
    assert_non_null(py);
    long long params = -1, alloc = -1, res = -1, instants = -1, dropped = -1;
    int got = fscanf(py, "%lld %lld %lld %lld %lld", &params, &alloc, &res, &instants, &dropped);
    int rc = pclose(py);
    unlink(path);
    if (got == EOF && rc != 0)
        skip(); /* no python3 here: pool_timeline_write_json still returned 0 */
    assert_int_equal(got, 5);
    assert_int_equal(params, 5 * MiB);
    assert_int_equal(alloc, 5 * MiB);
    assert_int_equal(res, 22 * MiB);
    assert_int_equal(instants, 16);
    assert_int_equal(dropped, recorded - 16);
    pool_free(f.p, keep);
    fx_close(&f);
}

/* Events are stamped with a cheaper clock than CLOCK_MONOTONIC where there is
 * one (the TSC), but what comes out is CLOCK_MONOTONIC ns: each event lies
 * between clock readings taken around it, and the gap between two events
 * is the time that passed. */
static void test_timeline_clock(void **state)
{
    (void)state;
    fx f;
    fx_open(&f, 64 * MiB, NULL);
    const uint64_t slack = 5000000; /* 5 ms: a descheduled test thread, not clock error */
    uint64_t t0 = mono_ns();
    void *x = pool_alloc(f.p, 4 * KiB, POOL_TAG_OTHER, 1, NULL); /* map + alloc */
    uint64_t t1 = mono_ns();
    struct timespec nap = {0, 50000000};
    nanosleep(&nap, NULL);
    uint64_t t2 = mono_ns();
    pool_free(f.p, x);
    uint64_t t3 = mono_ns();
    pool_event ev[3];
    assert_int_equal(pool_timeline_snapshot(f.p, ev, 3), 3);
    assert_int_equal(ev[1].kind, POOL_EV_ALLOC);
    assert_int_equal(ev[2].kind, POOL_EV_FREE);
    assert_true(ev[1].ns + slack >= t0 && ev[1].ns <= t1 + slack);
    assert_true(ev[2].ns + slack >= t2 && ev[2].ns <= t3 + slack);
    assert_true(ev[2].ns - ev[1].ns + slack >= t2 - t1);
    assert_true(ev[2].ns - ev[1].ns <= t3 - t0 + slack);
    /* A later export converts the same stamps to the same times, give or
     * take the clock's jitter. */
    nanosleep(&nap, NULL);
    pool_event again[3];
    assert_int_equal(pool_timeline_snapshot(f.p, again, 3), 3);
    for (int i = 0; i < 3; i++) {
        uint64_t d = again[i].ns > ev[i].ns ? again[i].ns - ev[i].ns : ev[i].ns - again[i].ns;
        assert_true(d < slack);
    }
    fx_close(&f);
}

static void test_timeline_off(void **state)
{
    (void)state;
    fx f;
    pool_config c = cfg_default();
    c.timeline_capacity = 0;
    fx_open(&f, 64 * MiB, &c);
    void *x = pool_alloc(f.p, 4 * KiB, POOL_TAG_OTHER, 1, NULL);
    pool_free(f.p, x);
    pool_timeline_mark(f.p, POOL_EV_BATCH_CHANGE, 1, 8, "x");
    assert_int_equal(stats(f.p)->timeline_events, 0);
    FILE *out = tmpfile();
    assert_non_null(out);
    assert_int_equal(pool_timeline_write_json(f.p, out), 0);
    fclose(out);
    fx_close(&f);
}

/* ==== random load ================================================================================================ */

/* Log-uniform in [lo, hi]: many small sizes, some big. */
static size_t rnd_size(rng *r, size_t lo, size_t hi)
{
    double u = (double)(rnd(r) >> 11) / 9007199254740992.0;
    double l = log((double)lo), h = log((double)hi);
    size_t v = (size_t)exp(l + u * (h - l));
    v += rnd(r) % 512; /* off the 512 grid too */
    return v < lo ? lo : v > hi ? hi : v;
}

typedef struct {
    void *ptr;
    size_t size;
    uint64_t id;
} live_rec;

static void stamp(void *p, size_t size, uint64_t id)
{
    memcpy(p, &id, sizeof id);
    memcpy((char *)p + size - sizeof id, &id, sizeof id);
}

static void verify_stamp(const live_rec *l)
{
    uint64_t a, b;
    memcpy(&a, l->ptr, sizeof a);
    memcpy(&b, (char *)l->ptr + l->size - sizeof b, sizeof b);
    if (a != l->id || b != l->id)
        fail_msg("block %p (%zu bytes) was overwritten: another block overlaps it", l->ptr, l->size);
}

static void random_load(bool expandable, size_t max_split, uint64_t seed, int ops)
{
    fx f;
    pool_config c = cfg_default();
    c.expandable_segments = expandable;
    c.max_split_size = max_split;
    c.timeline_capacity = 1024;
    fx_open(&f, 768 * MiB, &c);
    rng r = {seed};
    enum { MAXLIVE = 400 };
    live_rec *live = calloc(MAXLIVE, sizeof *live);
    assert_non_null(live);
    size_t nlive = 0, ooms = 0;
    uint64_t next_id = 1;
    for (int op = 0; op < ops; op++) {
        uint64_t dice = rnd(&r) % 1000;
        if (dice < 5) {
            pool_trim(f.p, POOL_TRIM_REQUEST, (rnd(&r) & 1) ? 0 : rnd_size(&r, MiB, 64 * MiB));
        } else if (dice < 10) {
            pool_tick(f.p, (uint64_t)op);
        } else if (nlive && (nlive == MAXLIVE || dice < 480)) {
            size_t i = rnd(&r) % nlive;
            verify_stamp(&live[i]);
            pool_free(f.p, live[i].ptr);
            live[i] = live[--nlive];
        } else {
            uint64_t kind = rnd(&r) % 100;
            size_t size = kind < 70 ? rnd_size(&r, 512, MiB)
                        : kind < 95 ? rnd_size(&r, MiB, 16 * MiB)
                                    : rnd_size(&r, 16 * MiB, 64 * MiB);
            pool_oom_report rep;
            uint32_t job = (uint32_t)(rnd(&r) % 3);
            void *p = pool_alloc(f.p, size, (pool_tag)(rnd(&r) % POOL_TAG_COUNT), job, &rep);
            if (!p) {
                /* Only a full pool may say no (after trimming its
                 * cache), and it says why. */
                ooms++;
                assert_true(rep.reserved + size + 2 * MiB > rep.cap);
                assert_int_equal(rep.requested, size);
                assert_true(rep.message[0] != 0);
            } else {
                size_t bs = pool_block_size(f.p, p);
                assert_true(bs >= size && bs % 512 == 0);
                /* Waste is bounded: under 512 B where blocks always
                 * split, under 20 MiB for oversize blocks, else an
                 * unsplit remainder of at most 1 MiB, or under 2 MiB
                 * when a fresh 2 MiB-rounded segment reaches
                 * max_split_size and so stays whole. */
                if (expandable || size <= MiB)
                    assert_true(bs - size < 512);
                else if (size >= max_split)
                    assert_true(bs - size < 20 * MiB + 512);
                else
                    assert_true(bs - size < 2 * MiB);
                live[nlive] = (live_rec){p, size < 16 ? 512 : size, next_id++};
                stamp(p, live[nlive].size, live[nlive].id);
                nlive++;
            }
        }
        CHECK(f.p);
        pool_stats *s = stats(f.p);
        assert_true(s->reserved_bytes[POOL_ALL].current <= (int64_t)s->cap);
        assert_true(s->allocated_bytes[POOL_ALL].current <= s->reserved_bytes[POOL_ALL].current);
        assert_int_equal(768 * MiB - device_free(f.d), (size_t)s->reserved_bytes[POOL_ALL].current);
    }
    for (size_t i = 0; i < nlive; i++) {
        verify_stamp(&live[i]);
        pool_free(f.p, live[i].ptr);
    }
    CHECK(f.p);
    pool_stats *s = stats(f.p);
    assert_int_equal(s->allocated_bytes[POOL_ALL].current, 0);
    assert_int_equal(s->requested_bytes[POOL_ALL].current, 0);
    assert_int_equal(s->inactive_split_blocks[POOL_ALL].current, 0); /* all coalesced to whole segments */
    pool_trim(f.p, POOL_TRIM_REQUEST, 0);
    assert_int_equal(stats(f.p)->reserved_bytes[POOL_ALL].current, 0);
    free(live);
    fx_close(&f);
    (void)ooms;
}

static void test_random_fixed(void **state) { (void)state; random_load(false, SIZE_MAX, 1, 5000); }
static void test_random_fixed_split(void **state) { (void)state; random_load(false, 24 * MiB, 2, 5000); }
static void test_random_expandable(void **state) { (void)state; random_load(true, SIZE_MAX, 3, 5000); }
static void test_random_expandable_split(void **state) { (void)state; random_load(true, 24 * MiB, 4, 5000); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_rounding),
        cmocka_unit_test(test_small_large_placement),
        cmocka_unit_test(test_split_rules),
        cmocka_unit_test(test_max_split_size),
        cmocka_unit_test(test_coalescing),
        cmocka_unit_test(test_best_fit_order),
        cmocka_unit_test(test_expandable_small_big_blocks),
        cmocka_unit_test(test_lifetime_classes),
        cmocka_unit_test(test_expandable_basic),
        cmocka_unit_test(test_expandable_holes),
        cmocka_unit_test(test_expandable_aligned_tail),
        cmocka_unit_test(test_expandable_capacity),
        cmocka_unit_test(test_memory_fraction_cap),
        cmocka_unit_test(test_job_limit),
        cmocka_unit_test(test_oom_trim_retry),
        cmocka_unit_test(test_oom_report),
        cmocka_unit_test(test_trim_request),
        cmocka_unit_test(test_trim_periodic_steps),
        cmocka_unit_test(test_trim_periodic_ms),
        cmocka_unit_test(test_trim_gc_lru),
        cmocka_unit_test(test_trim_low_watermark),
        cmocka_unit_test(test_breakdowns),
        cmocka_unit_test(test_many_jobs),
        cmocka_unit_test(test_many_blocks),
        cmocka_unit_test(test_timeline),
        cmocka_unit_test(test_timeline_clock),
        cmocka_unit_test(test_timeline_off),
        cmocka_unit_test(test_random_fixed),
        cmocka_unit_test(test_random_fixed_split),
        cmocka_unit_test(test_random_expandable),
        cmocka_unit_test(test_random_expandable_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
