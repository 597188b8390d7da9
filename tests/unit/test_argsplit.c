/* test_argsplit.c — common/argsplit.c: a job's [program] command and env
 * read as sh would quote them, and the errors that name the column. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "argsplit.h"

/* The words of s joined with '|', or "ERR: why". */
static const char *split(const char *s)
{
    static char joined[512];
    char out[256], why[128];
    int n = argsplit(s, out, sizeof out, why, sizeof why);
    if (n < 0) {
        snprintf(joined, sizeof joined, "ERR: %s", why);
        return joined;
    }
    joined[0] = '\0';
    const char *w = out;
    for (int i = 0; i < n; i++, w = argsplit_next(w))
        snprintf(joined + strlen(joined), sizeof joined - strlen(joined), "%s%s", i ? "|" : "", w);
    return joined;
}

static void test_words(void **state)
{
    (void)state;
    assert_string_equal(split("python3 train.py --lr 1e-3"), "python3|train.py|--lr|1e-3");
    assert_string_equal(split("  a \t b  "), "a|b");
    assert_string_equal(split(""), "");
    assert_string_equal(split("   "), "");
}

static void test_quotes(void **state)
{
    (void)state;
    assert_string_equal(split("'a b' c"), "a b|c");
    assert_string_equal(split("'a \\ \" $x'"), "a \\ \" $x");
    assert_string_equal(split("\"a b\""), "a b");
    /* In double quotes only \" \\ \$ are escapes; other backslashes stay. */
    assert_string_equal(split("\"q\\\"q \\\\ \\$HOME \\n\""), "q\"q \\ $HOME \\n");
    /* Outside quotes a backslash keeps the next character. */
    assert_string_equal(split("a\\ b \\'c \\\\"), "a b|'c|\\");
    /* Pieces join into one word; empty quotes make an empty word. */
    assert_string_equal(split("x'y'\"z\"w"), "xyzw");
    assert_string_equal(split("'' \"\" a"), "||a");
    /* No expansion of any kind. */
    assert_string_equal(split("$HOME * ~ a>b |"), "$HOME|*|~|a>b||");
}

static void test_errors(void **state)
{
    (void)state;
    assert_string_equal(split("a 'b"), "ERR: unterminated single quote starting at column 3");
    assert_string_equal(split("ab \"c\\\""), "ERR: unterminated double quote starting at column 4");
    assert_string_equal(split("a\\"), "ERR: ends with a backslash (column 2)");
    char out[3], why[64];
    assert_int_equal(argsplit("abc", out, sizeof out, why, sizeof why), -1);
    assert_int_equal(argsplit("ab", out, sizeof out, why, sizeof why), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_words),
        cmocka_unit_test(test_quotes),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
