/* test_dev_nvml.c — the NVML loader: what it says where there is no
 * library or only an unusable one, and with a stand-in library
 * (fake_nvml.c), that it reads the versioned process records right and
 * asks again with room when the first buffer is too small. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <dlfcn.h>

#include "pool/dev.h"

static void test_absent_library(void **state)
{
    (void)state;
    char why[256] = "";
    assert_null(dev_nvml_open("/nonexistent/libnvidia-ml.so.1", why, sizeof why));
    assert_string_equal(why, "NVML not available: /nonexistent/libnvidia-ml.so.1: cannot open shared object file: "
                             "No such file or directory");
    /* The default name: on a machine without the driver, the same words
     * that status shows. */
    dev_nvml *n = dev_nvml_open(NULL, why, sizeof why);
    if (n)
        dev_nvml_close(n);
    else
        assert_true(strncmp(why, "NVML not available: ", 20) == 0);
    dev_nvml_close(NULL);
}

static void test_library_without_the_functions(void **state)
{
    (void)state;
    char why[256] = "";
    assert_null(dev_nvml_open("libm.so.6", why, sizeof why));
    assert_string_equal(why, "NVML not available: libm.so.6 lacks the functions gradd uses (driver too old)");
}

static const char *fake_path(void)
{
    const char *p = getenv("FAKE_NVML");
    assert_non_null(p);
    return p;
}

static void test_processes(void **state)
{
    (void)state;
    char why[256] = "";
    dev_nvml *n = dev_nvml_open(fake_path(), why, sizeof why);
    assert_non_null(n);
    /* dlopen hands back the library the loader holds. */
    void *h = dlopen(fake_path(), RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(h);
    void (*set)(unsigned int) = (void (*)(unsigned int))dlsym(h, "fake_nvml_set");
    int (*inits)(void) = (int (*)(void))dlsym(h, "fake_nvml_inits");
    assert_int_equal(inits(), 1);

    dev d = {.kind = DEV_KIND_CUDA};
    snprintf(d.id, sizeof d.id, "cuda0");
    dev_nvml_proc out[200];
    assert_int_equal(dev_nvml_procs(n, &d, out, 200, why, sizeof why), -1);
    assert_string_equal(why, "cuda0 has no PCI bus id to find it in NVML");
    snprintf(d.pci_bus_id, sizeof d.pci_bus_id, "0000:af:00.0");
    assert_int_equal(dev_nvml_procs(n, &d, out, 200, why, sizeof why), -1);
    assert_string_equal(why, "NVML has no device at 0000:af:00.0: Not Found");

    snprintf(d.pci_bus_id, sizeof d.pci_bus_id, "0000:3b:00.0");
    assert_int_equal(dev_nvml_procs(n, &d, out, 200, why, sizeof why), 2);
    assert_int_equal(out[0].pid, 100);
    assert_int_equal(out[0].used_bytes, 1ull << 30);
    assert_int_equal(out[1].pid, 200);
    assert_int_equal(out[1].used_bytes, 0); /* not available: not a huge number */

    /* More than the first buffer holds: asked again with room. */
    set(150);
    assert_int_equal(dev_nvml_procs(n, &d, out, 200, why, sizeof why), 150);
    assert_int_equal(out[149].pid, 200);
    assert_int_equal(out[148].pid, 100);
    /* More than the caller takes: the first max. */
    assert_int_equal(dev_nvml_procs(n, &d, out, 10, why, sizeof why), 10);
    /* More than the bound: refused with NVML's words, not looped on. */
    set(5000);
    assert_int_equal(dev_nvml_procs(n, &d, out, 200, why, sizeof why), -1);
    assert_string_equal(why, "NVML cannot list the processes on cuda0: Insufficient Size");
    set(2);

    dev_nvml_close(n);
    assert_int_equal(inits(), 0);
    dlclose(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_absent_library),
        cmocka_unit_test(test_library_without_the_functions),
        cmocka_unit_test(test_processes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
