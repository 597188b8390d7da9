/* test_config.c — gradd.conf parsing: values, per-device overrides, and
 * errors that name file, line, section and key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "base/config.h"

static char path[64];

static const char *write_conf(const char *text)
{
    snprintf(path, sizeof path, "/tmp/gradd-test-conf-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

/* Load text that must fail; check the message and that *out is untouched. */
static void expect_error(const char *text, int line, const char *fragment)
{
    gradd_config c;
    memset(&c, 0xAB, sizeof c);
    char err[512] = "";
    const char *p = write_conf(text);
    assert_int_equal(config_load(p, &c, err, sizeof err), -1);
    char want[128];
    snprintf(want, sizeof want, "%s:%d:", p, line);
    if (strncmp(err, want, strlen(want)) != 0 || !strstr(err, fragment))
        fail_msg("error '%s' lacks '%s' or '%s'", err, want, fragment);
    unsigned char *bytes = (unsigned char *)&c;
    for (size_t i = 0; i < sizeof c; i++)
        if (bytes[i] != 0xAB)
            fail_msg("config changed at byte %zu on a failed load", i);
    unlink(p);
}

static void test_shipped_file_equals_defaults(void **state)
{
    (void)state;
    const char *root = getenv("GRADD_SOURCE_ROOT");
    assert_non_null(root);
    char file[4096];
    snprintf(file, sizeof file, "%s/etc/gradd.conf", root);
    gradd_config a, b;
    char err[512];
    if (config_load(file, &a, err, sizeof err) != 0)
        fail_msg("%s", err);
    config_defaults(&b);
    /* The shipped file documents the defaults: they must agree. */
    snprintf(b.source, sizeof b.source, "%s", a.source);
    assert_memory_equal(&a, &b, sizeof a);
}

static void test_values(void **state)
{
    (void)state;
    gradd_config c;
    char err[512];
    const char *p = write_conf("[daemon]\nsocket = /tmp/x.sock\nmax_frame = 64K\nclient_timeout = 500ms\n"
                               "[cpu]\ncapacity = 1.5G\ndevices = 2\n"
                               "[pool.cpu1]\nexpandable_segments = yes\nmemory_fraction = 0.5\nidle_trim = 0\n"
                               "[pool]\nmax_split_size = 64M\ngc_threshold = 0.8\ntrim_interval = 2m\n");
    if (config_load(p, &c, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_string_equal(c.socket_path, "/tmp/x.sock");
    assert_int_equal(c.max_frame, 64 << 10);
    assert_int_equal(c.client_timeout_ms, 500);
    assert_int_equal(c.cpu_capacity, 3ull << 29);
    assert_int_equal(c.cpu_devices, 2);
    assert_int_equal(c.pool.max_split_size, 64 << 20);
    assert_int_equal(c.pool.trim_every_ms, 120000);
    assert_false(c.pool.expandable_segments);

    pool_config pc;
    config_pool_for(&c, "cpu0", &pc);
    assert_false(pc.expandable_segments);
    assert_true(pc.memory_fraction == 1.0);
    assert_int_equal(pc.idle_trim_ms, 60000);
    config_pool_for(&c, "cpu1", &pc);
    assert_int_equal(pc.idle_trim_ms, 0);
    /* The override applies on top of [pool], even though [pool] came later. */
    assert_true(pc.expandable_segments);
    assert_true(pc.memory_fraction == 0.5);
    assert_int_equal(pc.max_split_size, 64 << 20);
    assert_true(pc.gc_threshold == 0.8);
    unlink(p);
}

static void test_errors(void **state)
{
    (void)state;
    expect_error("[daemon]\nmax_frame = 1M\nfrobnicate = 3\n", 3, "[daemon] frobnicate: unknown key");
    expect_error("\n[gpu]\ncapacity = 4G\n", 3, "[gpu]: unknown section");
    expect_error("[cpu]\ncapacity = lots\n", 2, "[cpu] capacity: 'lots' is not a size");
    expect_error("[cpu]\ncapacity = 4Q\n", 2, "unknown unit");
    expect_error("[pool]\nmemory_fraction = 1.5\n", 2, "[pool] memory_fraction: '1.5' is not a number from 0.01 to 1");
    expect_error("[pool]\nexpandable_segments = maybe\n", 2, "not a boolean");
    expect_error("[cpu]\ncapacity = 1G\ncapacity = 2G\n", 3, "given twice (first on line 2)");
    expect_error("[pool.gpu0]\nmax_split_size = 1G\n", 2, "[pool.gpu0]: unknown section");
    expect_error("[pool.cpu0]\nfraction = 1\n", 2, "[pool.cpu0] fraction: unknown key");
    expect_error("max_frame = 1M\n", 1, "outside any section");
    expect_error("[daemon]\nthis line has no equals sign\n", 2, "syntax error");
    expect_error("[daemon]\nclient_timeout = 0\n", 2, "out of range");
    expect_error("[cpu]\ndevices = -1\n", 2, "not a whole number");
    expect_error("[cpu]\ncapacity = 4G\n[bogus]\n", 3, "[bogus]: unknown section (known: daemon, cpu");
    expect_error("[pool.gpu1]\n", 1, "[pool.gpu1]: unknown section: per-device pool sections");
    /* The file's bytes come back safe to print: a terminal's escape and
     * bytes that are not UTF-8, escaped. */
    expect_error("[cpu]\ncapacity = 4G\033[2J\xff\n", 2, "'4G\\x1b[2J\\xff' has an unknown unit");
    /* A socket path that cannot be bound: found with its line, before the
     * daemon tries (95 bytes: config.h). */
    char sock[160];
    snprintf(sock, sizeof sock, "[daemon]\nsocket = /%095d\n", 0);
    expect_error(sock, 2, "[daemon] socket: 96 bytes is too long for a socket path (at most 95)");
    snprintf(sock, sizeof sock, "[daemon]\nsocket = /%094d\n", 0);
    gradd_config ok;
    char e[512];
    assert_int_equal(config_load(write_conf(sock), &ok, e, sizeof e), 0);
    unlink(path);

    gradd_config c;
    char err[512];
    assert_int_equal(config_load("/nonexistent/gradd.conf", &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "/nonexistent/gradd.conf: cannot open"));
    /* Nothing that blocks or never ends: a directory, a device. */
    assert_int_equal(config_load("/tmp", &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "/tmp: not a regular file"));
    assert_int_equal(config_load("/dev/zero", &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "/dev/zero: not a regular file"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shipped_file_equals_defaults),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
