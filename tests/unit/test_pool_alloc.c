/* test_pool_alloc.c — how the memory pool on the simulated cpu device
 * places allocations: tag and trim-reason names, bad configurations,
 * rounding, the small and large pools, splitting, max_split_size,
 * coalescing, best fit against a model, and where expandable segments put
 * small, big and long-lived blocks; then seeded random load, fixed and
 * expandable, with pool_check after every operation and every block
 * stamped to catch overlaps.
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
        cmocka_unit_test(test_random_fixed),
        cmocka_unit_test(test_random_fixed_split),
        cmocka_unit_test(test_random_expandable),
        cmocka_unit_test(test_random_expandable_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
