/* test_units.c — sizes and durations as users write them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "units.h"

static void test_sizes(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        uint64_t want;
    } ok[] = {
        {"0", 0}, {"4096", 4096}, {"512K", 512ull << 10}, {"512M", 512ull << 20}, {"4G", 4ull << 30},
        {"4g", 4ull << 30}, {"1.5G", 3ull << 29}, {"2T", 2ull << 40}, {"4GiB", 4ull << 30}, {"4GB", 4ull << 30},
        {"100B", 100}, {" 8M ", 8ull << 20}, {"18446744073709551615", UINT64_MAX},
        /* Found by fuzzing: leading zeros beyond any fixed buffer. */
        {"00000000000000000000000000000000000000000000000000000000000000000000000000000000004555555555555",
         4555555555555ull},
    };
    char err[128];
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        uint64_t v = 1;
        assert_int_equal(units_parse_size(ok[i].in, &v, err, sizeof err), 0);
        assert_int_equal(v, ok[i].want);
    }
    static const char *bad[] = {"", "G", "-1G", "4X", "4 GG", "1.3B", "inf", "nan", "4Gx", "99999999999P", "0x10", "1e3", "18446744073709551616", "16384P"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v = 7;
        err[0] = 0;
        assert_int_equal(units_parse_size(bad[i], &v, err, sizeof err), -1);
        assert_int_equal(v, 7); /* untouched on error */
        assert_true(strlen(err) > 0);
    }
}

static void test_durations(void **state)
{
    (void)state;
    uint64_t ms;
    char err[128];
    assert_int_equal(units_parse_duration_ms("250ms", &ms, err, sizeof err), 0);
    assert_int_equal(ms, 250);
    assert_int_equal(units_parse_duration_ms("30s", &ms, err, sizeof err), 0);
    assert_int_equal(ms, 30000);
    assert_int_equal(units_parse_duration_ms("30", &ms, err, sizeof err), 0);
    assert_int_equal(ms, 30000);
    assert_int_equal(units_parse_duration_ms("1.5m", &ms, err, sizeof err), 0);
    assert_int_equal(ms, 90000);
    assert_int_equal(units_parse_duration_ms("2h", &ms, err, sizeof err), 0);
    assert_int_equal(ms, 7200000);
    assert_int_equal(units_parse_duration_ms("30d", &ms, err, sizeof err), 0);
    assert_int_equal(ms, 30ull * 86400000);
    assert_int_equal(units_parse_duration_ms("5 parsecs", &ms, err, sizeof err), -1);
    assert_non_null(strstr(err, "unknown unit"));
}

static void test_format(void **state)
{
    (void)state;
    char b[16];
    assert_string_equal(units_format_size(0, b, sizeof b), "0");
    assert_string_equal(units_format_size(1023, b, sizeof b), "1023");
    assert_string_equal(units_format_size(1024, b, sizeof b), "1.00K");
    assert_string_equal(units_format_size(3ull << 29, b, sizeof b), "1.50G");
    assert_string_equal(units_format_size(812ull << 10, b, sizeof b), "812K");
    assert_string_equal(units_format_size(UINT64_MAX, b, sizeof b), "16384P");
    assert_string_equal(units_format_duration(45, b, sizeof b), "45s");
    assert_string_equal(units_format_duration(723, b, sizeof b), "12m03s");
    assert_string_equal(units_format_duration(3 * 3600 + 7 * 60, b, sizeof b), "3h07m");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_durations),
        cmocka_unit_test(test_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
