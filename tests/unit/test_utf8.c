/* test_utf8.c — common/utf8.c: decoding, and the safe form in which text
 * from users reaches other users' terminals, JSON and the daemon's log. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "utf8.h"

/* The whole safe form of s, with flags, in a static buffer; each step
 * checked against utf8_safe_step's bounds. */
static const char *safe(const char *s, unsigned flags)
{
    static char buf[1024];
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0, n = strlen(s); i < n;) {
        char step[UTF8_SAFE_MAX];
        size_t len;
        size_t k = utf8_safe_step(p + i, n - i, flags, step, &len);
        assert_true(k >= 1 && k <= 4 && k <= n - i);
        assert_true(len <= 4 * k);
        i += k;
    }
    return utf8_safe(s, flags, buf, sizeof buf);
}

static void test_decode(void **state)
{
    (void)state;
    uint32_t cp = 0;
    assert_int_equal(utf8_decode((const unsigned char *)"A", 1, &cp), 1);
    assert_int_equal(cp, 'A');
    assert_int_equal(utf8_decode((const unsigned char *)"\xc2\x9b", 2, &cp), 2);
    assert_int_equal(cp, 0x9b);
    assert_int_equal(utf8_decode((const unsigned char *)"\xe2\x80\xae", 3, &cp), 3);
    assert_int_equal(cp, 0x202e);
    assert_int_equal(utf8_decode((const unsigned char *)"\xf0\x9f\x98\x80", 4, &cp), 4);
    assert_int_equal(cp, 0x1f600);
    /* A lone continuation byte, an overlong form, a surrogate, a cut. */
    assert_int_equal(utf8_decode((const unsigned char *)"\x9b", 1, &cp), 0);
    assert_int_equal(utf8_decode((const unsigned char *)"\xc0\x9b", 2, &cp), 0);
    assert_int_equal(utf8_decode((const unsigned char *)"\xed\xa0\x80", 3, &cp), 0);
    assert_int_equal(utf8_decode((const unsigned char *)"\xe2\x80", 2, &cp), 0);
    assert_true(utf8_valid("d\xc3\xa9j\xc3\xa0"));
    assert_false(utf8_valid("d\xe9j\xe0"));
}

static void test_unsafe_code_points(void **state)
{
    (void)state;
    static const uint32_t unsafe[] = {0x00,   0x07,   0x1b,   0x1f,   0x7f,   0x80,   0x9b,   0x9f,
                                      0x061c, 0x200e, 0x200f, 0x2028, 0x2029, 0x202a, 0x202e, 0x2066,
                                      0x2069};
    static const uint32_t fine[] = {' ', '~', 0xa0, 0xe9, 0x061b, 0x200d, 0x2030, 0x2065, 0x206a, 0x1f600};
    for (size_t i = 0; i < sizeof unsafe / sizeof unsafe[0]; i++)
        assert_true(utf8_unsafe_cp(unsafe[i]));
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++)
        assert_false(utf8_unsafe_cp(fine[i]));
}

static void test_safe_form(void **state)
{
    (void)state;
    /* What a hostile output dir held: ESC[2J, a raw C1 CSI byte, the same
     * CSI as a valid code point, and a right-to-left override. */
    assert_string_equal(safe("/home/m/\x1b[2J\x9b""31m\xc2\x9b""1m\xe2\x80\xae""gpj.exe", 0),
                        "/home/m/\\x1b[2J\\x9b31m\\u009b1m\\u202egpj.exe");
    assert_string_equal(safe("a\x7f\xe2\x81\xa6""b\xe2\x81\xa9\xe2\x80\x8e\xd8\x9c\xe2\x80\xa8", 0),
                        "a\\x7f\\u2066b\\u2069\\u200e\\u061c\\u2028");
    /* Accents, emoji and a zero-width joiner are text, kept as they are. */
    assert_string_equal(safe("d\xc3\xa9j\xc3\xa0 \xf0\x9f\x98\x80\xe2\x80\x8d", 0),
                        "d\xc3\xa9j\xc3\xa0 \xf0\x9f\x98\x80\xe2\x80\x8d");
    /* Lines kept only when asked; backslashes doubled only when asked. */
    assert_string_equal(safe("a\nb\tc\\d", 0), "a\\x0ab\\x09c\\d");
    assert_string_equal(safe("a\nb\tc\\d\r", UTF8_SAFE_LINES), "a\nb\tc\\d\\x0d");
    assert_string_equal(safe("c\\d", UTF8_SAFE_BACKSLASH), "c\\\\d");
    /* A sequence cut at the end is its bytes, one by one. */
    assert_string_equal(safe("x\xe2\x80", 0), "x\\xe2\\x80");
    /* A buffer too small ends before the escape that does not fit. */
    char small[7];
    assert_string_equal(utf8_safe("a\xe2\x80\xae", 0, small, 7), "a");
    assert_string_equal(utf8_safe("\xe2\x80\xae""b", 0, small, 7), "\\u202e");
}

/* Every byte string of up to two bytes, and each 3-byte one over a few
 * lead bytes: the form is valid UTF-8 free of unsafe code points. */
static void check_clean(const unsigned char *s, size_t n)
{
    char buf[64];
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t len;
        i += utf8_safe_step(s + i, n - i, 0, buf + o, &len);
        o += len;
    }
    buf[o] = '\0';
    assert_true(utf8_valid(buf));
    for (size_t i = 0; i < o;) {
        uint32_t cp;
        size_t k = utf8_decode((const unsigned char *)buf + i, o - i, &cp);
        assert_true(k > 0);
        assert_false(utf8_unsafe_cp(cp));
        i += k;
    }
}

static void test_safe_form_is_clean(void **state)
{
    (void)state;
    unsigned char s[3];
    for (unsigned a = 1; a < 256; a++) {
        s[0] = (unsigned char)a;
        check_clean(s, 1);
        for (unsigned b = 1; b < 256; b++) {
            s[1] = (unsigned char)b;
            check_clean(s, 2);
        }
    }
    static const unsigned char leads[] = {0xd8, 0xe2, 0xef};
    for (size_t l = 0; l < sizeof leads; l++)
        for (unsigned b = 0x80; b < 0xc0; b++)
            for (unsigned c = 0x80; c < 0xc0; c++) {
                s[0] = leads[l];
                s[1] = (unsigned char)b;
                s[2] = (unsigned char)c;
                check_clean(s, 3);
            }
}

static void test_cut_short(void **state)
{
    (void)state;
    assert_true(utf8_cut_short((const unsigned char *)"\xe2\x80", 2));
    assert_true(utf8_cut_short((const unsigned char *)"\xf0", 1));
    assert_false(utf8_cut_short((const unsigned char *)"\xe2\x80\xae", 3));
    assert_false(utf8_cut_short((const unsigned char *)"\xe2x", 2));
    assert_false(utf8_cut_short((const unsigned char *)"\x9b", 1));
    assert_false(utf8_cut_short((const unsigned char *)"a", 1));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode),
        cmocka_unit_test(test_unsafe_code_points),
        cmocka_unit_test(test_safe_form),
        cmocka_unit_test(test_safe_form_is_clean),
        cmocka_unit_test(test_cut_short),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
