/* test_table.c — gradctl's tables (client/table.c, laid out by
 * libsmartcols) and its reader of Prometheus text (client/promtext.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "jout.h"
#include "promtext.h"
#include "table.h"

static const char *const head[] = {">ID", "NAME", "STATE", "LAST CHANGE"};

/* The table as it prints; malloc'd. */
static char *printed(const table *t)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    table_print(t, f);
    fclose(f);
    return text;
}

static void fill(table *t)
{
    table_init(t, 4, head);
    /* An ESC from another user's job name, shown escaped: four characters
     * wide on the screen, and the columns after it line up. */
    table_cell(t, "%u", 1);
    table_cell(t, "%s", "a\x1b" "b");
    table_cell(t, "queued");
    table_cell(t, "-");
    table_cell(t, "%u", 10);
    table_cell(t, "caf\xc3\xa9");
    table_cell(t, "running");
    table_cell(t, "1->2 fit@3");
}

static void test_layout(void **state)
{
    (void)state;
    table t;
    fill(&t);
    char *s = printed(&t);
    assert_string_equal(s, "ID  NAME    STATE    LAST CHANGE\n"
                           " 1  a\\x1bb  queued   -\n"
                           "10  caf\xc3\xa9    running  1->2 fit@3\n");
    free(s);
    table_free(&t);
}

static void test_select(void **state)
{
    (void)state;
    table t;
    fill(&t);
    char err[256];
    assert_int_equal(table_select(&t, "State,id,last_change", err, sizeof err), 0);
    table_noheadings(&t);
    char *s = printed(&t);
    /* No heading, so no column as wide as one. */
    assert_string_equal(s, "queued    1  -\n"
                           "running  10  1->2 fit@3\n");
    free(s);
    assert_int_equal(table_select(&t, "id,bogus", err, sizeof err), -1);
    assert_string_equal(err, "no column 'bogus'; the columns are ID,NAME,STATE,LAST CHANGE");
    assert_int_equal(table_select(&t, "id,", err, sizeof err), -1);
    table_free(&t);
    /* A heading with a sign a shell user cannot type: x or _ for it. */
    static const char *const h[] = {"ID", "MICRO\xc3\x97" "ACC"};
    table_init(&t, 2, h);
    const char *names[] = {"micro_acc", "MicroxAcc", "MICRO\xc3\x97" "ACC"};
    for (int i = 0; i < 3; i++)
        assert_int_equal(table_select(&t, names[i], err, sizeof err), 0);
    assert_int_equal(table_select(&t, "micro", err, sizeof err), -1);
    assert_int_equal(table_select(&t, "micro_ac", err, sizeof err), -1);
    assert_int_equal(table_select(&t, "micro_accc", err, sizeof err), -1);
    table_free(&t);
    /* With no rows, the headings alone (libsmartcols would print none). */
    static const char *const two[] = {"ID", ">STEP"};
    table_init(&t, 2, two);
    s = printed(&t);
    assert_string_equal(s, "ID  STEP\n");
    free(s);
    table_noheadings(&t);
    s = printed(&t);
    assert_string_equal(s, "");
    free(s);
    table_free(&t);
}

static void test_standin_in_a_cell(void **state)
{
    (void)state;
    /* U+E000 stands for a backslash inside table_print: a cell's own is
     * shown escaped, never turned into a backslash. */
    static const char *const h[] = {"A", "B"};
    table t;
    table_init(&t, 2, h);
    table_cell(&t, "x\xee\x80\x80y");
    table_cell(&t, "z");
    char *s = printed(&t);
    assert_string_equal(s, "A         B\nx\\uE000y  z\n");
    free(s);
    table_free(&t);
}

static void test_promtext(void **state)
{
    (void)state;
    json_t *doc = promtext_json("# HELP up Whether it \\\\ runs.\n"
                                "# TYPE up gauge\n"
                                "up 1\n"
                                "# TYPE lat histogram\n"
                                "lat_bucket{le=\"+Inf\",x=\"a\\\"b\"} 3 1700000000\n"
                                "lat_sum 0.25\n"
                                "bad line\n"
                                "odd{x=\"unterminated} 4\n");
    char *text = json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER);
    assert_string_equal(text, "{\"metrics\":["
                              "{\"name\":\"up\",\"labels\":{},\"value\":1,\"type\":\"gauge\","
                              "\"help\":\"Whether it \\\\ runs.\"},"
                              "{\"name\":\"lat_bucket\",\"labels\":{\"le\":\"+Inf\",\"x\":\"a\\\"b\"},\"value\":3,"
                              "\"type\":\"histogram\",\"help\":\"\"},"
                              "{\"name\":\"lat_sum\",\"labels\":{},\"value\":0.25,\"type\":\"histogram\","
                              "\"help\":\"\"}]}");
    free(text);
    json_decref(doc);
}

int main(void)
{
    jout_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_select),
        cmocka_unit_test(test_standin_in_a_cell),
        cmocka_unit_test(test_promtext),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
