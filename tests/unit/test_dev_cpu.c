/* test_dev_cpu.c — the simulated device: capacity, OOM, external pressure,
 * and virtual-memory commit/decommit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "pool/dev.h"
#include "kernels.h"

#define MiB ((size_t)1 << 20)

static void test_capacity_and_oom(void **state)
{
    (void)state;
    dev *d;
    assert_int_equal(dev_cpu_create(64 * MiB, 0, &d), DEV_OK);
    assert_string_equal(d->id, "cpu0");
    size_t f, t;
    dev_mem_info(d, &f, &t);
    assert_int_equal(t, 64 * MiB);
    assert_int_equal(f, 64 * MiB);
    void *a, *b, *c;
    assert_int_equal(dev_alloc(d, 40 * MiB, &a), DEV_OK);
    /* The memory is real and writable. */
    kern_cpu_fill_pattern(a, 40 * MiB / 4, 7);
    assert_int_equal(kern_cpu_check_pattern(a, 40 * MiB / 4, 7), 0);
    assert_int_equal(dev_alloc(d, 24 * MiB, &b), DEV_OK);
    dev_mem_info(d, &f, &t);
    assert_int_equal(f, 0);
    assert_int_equal(dev_alloc(d, 1, &c), DEV_ERR_OOM);
    assert_non_null(strstr(dev_last_error(d), "out of memory"));
    dev_free(d, a, 40 * MiB);
    dev_free(d, b, 24 * MiB);
    dev_mem_info(d, &f, &t);
    assert_int_equal(f, 64 * MiB);
    assert_int_equal(dev_alloc(d, 0, &c), DEV_ERR_INVALID);
    dev_destroy(d);
}

static void test_external_pressure(void **state)
{
    (void)state;
    dev *d;
    assert_int_equal(dev_cpu_create(64 * MiB, 0, &d), DEV_OK);
    void *a;
    assert_int_equal(dev_alloc(d, 32 * MiB, &a), DEV_OK);
    /* Another "process" cannot take more than is free... */
    assert_int_equal(dev_cpu_set_external(d, 33 * MiB), DEV_ERR_OOM);
    assert_int_equal(dev_cpu_external(d), 0);
    /* ...but can take what is. */
    assert_int_equal(dev_cpu_set_external(d, 30 * MiB), DEV_OK);
    size_t f, t;
    dev_mem_info(d, &f, &t);
    assert_int_equal(f, 2 * MiB);
    void *b;
    assert_int_equal(dev_alloc(d, 4 * MiB, &b), DEV_ERR_OOM);
    /* It shrinks and grows again. */
    assert_int_equal(dev_cpu_set_external(d, 10 * MiB), DEV_OK);
    assert_int_equal(dev_alloc(d, 4 * MiB, &b), DEV_OK);
    assert_int_equal(dev_cpu_set_external(d, 0), DEV_OK);
    dev_mem_info(d, &f, &t);
    assert_int_equal(f, 28 * MiB);
    dev_free(d, a, 32 * MiB);
    dev_free(d, b, 4 * MiB);
    dev_destroy(d);
}

static void test_virtual_memory(void **state)
{
    (void)state;
    dev *d;
    assert_int_equal(dev_cpu_create(16 * MiB, 0, &d), DEV_OK);
    size_t g = dev_va_granularity(d);
    assert_int_equal(g, 2 * MiB);
    void *base;
    /* Reserving far more address space than capacity costs nothing. */
    assert_int_equal(dev_va_reserve(d, 1024 * MiB, &base), DEV_OK);
    size_t f, t;
    dev_mem_info(d, &f, &t);
    assert_int_equal(f, 16 * MiB);
    assert_int_equal(dev_va_map(d, base, 8 * MiB), DEV_OK);
    kern_cpu_fill_pattern(base, 8 * MiB / 4, 3);
    assert_int_equal(kern_cpu_check_pattern(base, 8 * MiB / 4, 3), 0);
    dev_mem_info(d, &f, &t);
    assert_int_equal(f, 8 * MiB);
    /* Committing past capacity fails like an OOM and maps nothing. */
    assert_int_equal(dev_va_map(d, (char *)base + 8 * MiB, 10 * MiB), DEV_ERR_OOM);
    dev_mem_info(d, &f, &t);
    assert_int_equal(f, 8 * MiB);
    assert_int_equal(dev_va_map(d, (char *)base + 1, g), DEV_ERR_INVALID);
    dev_va_unmap(d, (char *)base + 4 * MiB, 4 * MiB);
    dev_mem_info(d, &f, &t);
    assert_int_equal(f, 12 * MiB);
    /* Re-mapped memory comes back zeroed: no data survives a trim. */
    assert_int_equal(dev_va_map(d, (char *)base + 4 * MiB, 2 * MiB), DEV_OK);
    const uint32_t *w = (const uint32_t *)((char *)base + 4 * MiB);
    for (size_t i = 0; i < 2 * MiB / 4; i++)
        if (w[i] != 0)
            fail_msg("word %zu survived unmap", i);
    dev_va_unmap(d, (char *)base + 4 * MiB, 2 * MiB);
    dev_va_unmap(d, base, 4 * MiB);
    dev_va_release(d, base, 1024 * MiB);
    dev_mem_info(d, &f, &t);
    assert_int_equal(f, 16 * MiB);
    dev_destroy(d);
}

static void test_cuda_probe_without_gpu(void **state)
{
    (void)state;
    dev *found[4];
    char why[256] = "";
    /* A directory without the module: no devices and a reason, never a crash. */
    int n = dev_cuda_probe("/nonexistent", found, 4, why, sizeof why);
    assert_int_equal(n, 0);
    assert_non_null(strstr(why, "/nonexistent/gradd-cuda.so"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capacity_and_oom),
        cmocka_unit_test(test_external_pressure),
        cmocka_unit_test(test_virtual_memory),
        cmocka_unit_test(test_cuda_probe_without_gpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
