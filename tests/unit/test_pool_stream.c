/* test_pool_stream.c — the pool keys cached blocks by stream: a block
 * freed on one stream is reused only on that stream, fixed and expandable;
 * trims and OOM retries reach every stream's cache; a pool serves 16
 * streams and refuses a 17th as an OOM that says so.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "pool/dev.h"
#include "pool/pool.h"
#include "pool_fx.h"

#define S1 ((uintptr_t)0x1000)
#define S2 ((uintptr_t)0x2000)

static void reuse_per_stream(bool expandable)
{
    fx f;
    pool_config c = cfg_default();
    c.expandable_segments = expandable;
    fx_open(&f, 256 * MiB, &c);
    size_t sizes[] = {4 * KiB, 3 * MiB};
    for (size_t k = 0; k < 2; k++) {
        size_t n = sizes[k];
        void *a = pool_alloc_stream(f.p, n, POOL_TAG_ACTIVATIONS, 1, S1, NULL);
        assert_non_null(a);
        pool_free(f.p, a);
        CHECK(f.p);
        uint64_t hits = stats(f.p)->cache_hits;
        /* Stream 2 must not get stream 1's freed block. */
        void *b = pool_alloc_stream(f.p, n, POOL_TAG_ACTIVATIONS, 1, S2, NULL);
        assert_non_null(b);
        assert_ptr_not_equal(a, b);
        assert_int_equal(stats(f.p)->cache_hits, hits);
        /* Stream 1 gets it back from its cache, and so does stream 2. */
        void *a2 = pool_alloc_stream(f.p, n, POOL_TAG_ACTIVATIONS, 1, S1, NULL);
        assert_ptr_equal(a2, a);
        assert_int_equal(stats(f.p)->cache_hits, hits + 1);
        pool_free(f.p, b);
        void *b2 = pool_alloc_stream(f.p, n, POOL_TAG_ACTIVATIONS, 1, S2, NULL);
        assert_ptr_equal(b2, b);
        /* Stream 0 (pool_alloc) is a stream of its own. */
        pool_free(f.p, a2);
        void *z = pool_alloc(f.p, n, POOL_TAG_ACTIVATIONS, 1, NULL);
        assert_non_null(z);
        assert_ptr_not_equal(z, a);
        CHECK(f.p);
        pool_free(f.p, z);
        pool_free(f.p, b2);
        CHECK(f.p);
    }
    /* A trim returns every stream's cache. */
    pool_trim_result r = pool_trim(f.p, POOL_TRIM_REQUEST, 0);
    assert_true(r.bytes > 0);
    assert_int_equal(stats(f.p)->reserved_bytes[POOL_ALL].current, 0);
    CHECK(f.p);
    fx_close(&f);
}

static void test_reuse_fixed(void **state)
{
    (void)state;
    reuse_per_stream(false);
}

static void test_reuse_expandable(void **state)
{
    (void)state;
    reuse_per_stream(true);
}

/* A miss on one stream that would OOM releases what other streams cache
 * and retries. */
static void test_oom_retry_across_streams(void **state)
{
    (void)state;
    fx f;
    pool_config c = cfg_default();
    fx_open(&f, 64 * MiB, &c);
    void *a = pool_alloc_stream(f.p, 48 * MiB, POOL_TAG_ACTIVATIONS, 1, S1, NULL);
    assert_non_null(a);
    pool_free(f.p, a);
    pool_oom_report oom;
    void *b = pool_alloc_stream(f.p, 40 * MiB, POOL_TAG_ACTIVATIONS, 1, S2, &oom);
    assert_non_null(b);
    assert_int_equal(stats(f.p)->alloc_retries, 1);
    assert_int_equal(stats(f.p)->ooms, 0);
    pool_free(f.p, b);
    CHECK(f.p);
    fx_close(&f);
}

static void test_stream_table_full(void **state)
{
    (void)state;
    fx f;
    pool_config c = cfg_default();
    fx_open(&f, 256 * MiB, &c);
    void *ptr[16];
    /* Stream 0 and 15 others fill the table. */
    ptr[0] = pool_alloc(f.p, 512, POOL_TAG_OTHER, 1, NULL);
    for (uintptr_t s = 1; s < 16; s++) {
        ptr[s] = pool_alloc_stream(f.p, 512, POOL_TAG_OTHER, 1, s * 16, NULL);
        assert_non_null(ptr[s]);
    }
    pool_oom_report oom;
    assert_null(pool_alloc_stream(f.p, 512, POOL_TAG_OTHER, 1, 17 * 16, &oom));
    assert_non_null(strstr(oom.message, "a new stream, and the pool already serves 16"));
    assert_int_equal(stats(f.p)->ooms, 1);
    /* Known streams still work. */
    void *again = pool_alloc_stream(f.p, 512, POOL_TAG_OTHER, 1, 15 * 16, NULL);
    assert_non_null(again);
    pool_free(f.p, again);
    for (int s = 0; s < 16; s++)
        pool_free(f.p, ptr[s]);
    CHECK(f.p);
    fx_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reuse_fixed),
        cmocka_unit_test(test_reuse_expandable),
        cmocka_unit_test(test_oom_retry_across_streams),
        cmocka_unit_test(test_stream_table_full),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
