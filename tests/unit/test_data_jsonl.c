/* test_data_jsonl.c — fine-tuning samples (io/data.h, data_jsonl.c): the
 * reader's results and every refusal (each naming the file, the line and
 * the field), the label shift against its definition, rows packed and
 * padded with exact positions and starts, the seeded stream's position
 * (counting ahead moves nothing; a saved position replays the same rows),
 * the held-out tail, and what the budget is charged. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include <cmocka.h>

#include "io/data.h"
#include "tmpdir.h"

static char err[1024];

/* The tests run in the scratch directory: a file's name is its path. */
static const char *put(const char *name, const char *text)
{
    FILE *f = fopen(name, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
    return name;
}

static void load_ok(data_sft *d, const char *path, uint32_t vocab, uint32_t context, bool truncate)
{
    if (data_sft_load(d, path, vocab, context, truncate, NULL, err, sizeof err) != 0)
        fail_msg("%s: %s", path, err);
}

/* The load fails, and its message holds each of the strings (NULL-ended). */
static void refused(const char *text, uint32_t context, bool truncate, ...)
{
    const char *p = put("bad.jsonl", text);
    data_sft d;
    err[0] = 0;
    if (data_sft_load(&d, p, 256, context, truncate, NULL, err, sizeof err) == 0)
        fail_msg("accepted: %s", text);
    assert_null(d.ids);
    va_list ap;
    va_start(ap, truncate);
    for (const char *want; (want = va_arg(ap, const char *)) != NULL;)
        if (!strstr(err, want))
            fail_msg("'%s' lacks '%s' (input %s)", err, want, text);
    va_end(ap);
}

/* ---- reading ------------------------------------------------------------------- */

static void test_reads_samples(void **state)
{
    (void)state;
    const char *p = put("a.jsonl",
                        "{\"input_ids\": [1, 2, 3, 4], \"labels\": [-100, -100, 3, 4]}\n"
                        "\n"
                        "  \r\n"
                        "{\"text\": \"a \\\"quoted\\\" \\u00e9 \\n\", \"input_ids\":[5,6],\"meta\":{\"x\":[1,{\"y\":null}],"
                        "\"z\":-1.5e3,\"t\":true},\"attention_mask\":[1,1]}\r\n"
                        "{\"labels\": [7, -100, 9], \"input_ids\": [8, 8, 9]}");
    data_sft d;
    load_ok(&d, p, 16, 8, false);
    assert_int_equal(d.n, 3);
    assert_int_equal(d.ntok, 9);
    /* Targets after the shift: labels[1..]: 2, 1, 1 (labels[0] is never one). */
    assert_int_equal(d.targets[0], 2);
    assert_int_equal(d.targets[1], 1);
    assert_int_equal(d.targets[2], 1);
    assert_int_equal(d.ntargets, 4);
    /* The third sample's first label (7) is not its token (8): the labels
     * are then held explicitly, and still unused for that position. */
    assert_non_null(d.labels);
    int32_t x[8], y[8];
    data_sft_shift(&d, 0, x, y);
    int32_t x0[] = {1, 2, 3, 4}, y0[] = {-100, 3, 4, -100};
    assert_memory_equal(x, x0, sizeof x0);
    assert_memory_equal(y, y0, sizeof y0);
    data_sft_shift(&d, 1, x, y);
    assert_int_equal(x[0], 5), assert_int_equal(x[1], 6);
    assert_int_equal(y[0], 6), assert_int_equal(y[1], -100);
    data_sft_shift(&d, 2, x, y);
    int32_t x2[] = {8, 8, 9}, y2[] = {-100, 9, -100};
    assert_memory_equal(x, x2, sizeof x2);
    assert_memory_equal(y, y2, sizeof y2);
    data_sft_free(&d);

    /* Labels equal to the tokens (or -100) need no label array. */
    p = put("b.jsonl", "{\"input_ids\": [1, 2, 3], \"labels\": [-100, 2, 3]}\n{\"input_ids\": [4, 5]}\n");
    load_ok(&d, p, 16, 8, false);
    assert_null(d.labels);
    data_sft_free(&d);
}

/* The shift, against its definition (transformers' logits[:, :-1] against
 * labels[:, 1:]), over random samples with random masks and labels. */
static void test_shift_definition(void **state)
{
    (void)state;
    srand(7);
    FILE *f = fopen("r.jsonl", "w");
    assert_non_null(f);
    enum { N = 40, L = 12 };
    int32_t ids[N][L], lab[N][L], len[N];
    for (int i = 0; i < N; i++) {
        len[i] = 2 + rand() % (L - 1);
        fprintf(f, "{\"input_ids\": [");
        for (int t = 0; t < len[i]; t++) {
            ids[i][t] = rand() % 50;
            fprintf(f, "%s%d", t ? ", " : "", ids[i][t]);
        }
        fprintf(f, "], \"labels\": [");
        for (int t = 0; t < len[i]; t++) {
            int r = rand() % 3;
            /* t = 1 always labelled, so no sample is refused. */
            lab[i][t] = t != 1 && r == 0 ? -100 : r == 1 ? rand() % 50 : ids[i][t];
            fprintf(f, "%s%d", t ? ", " : "", lab[i][t]);
        }
        fprintf(f, "]}\n");
    }
    fclose(f);
    data_sft d;
    load_ok(&d, "r.jsonl", 50, L, false);
    assert_int_equal(d.n, N);
    for (int i = 0; i < N; i++) {
        int32_t x[L], y[L];
        assert_int_equal(data_sft_len(&d, (size_t)i), len[i]);
        data_sft_shift(&d, (size_t)i, x, y);
        uint32_t targets = 0;
        for (int t = 0; t < len[i]; t++) {
            assert_int_equal(x[t], ids[i][t]);
            assert_int_equal(y[t], t + 1 < len[i] ? lab[i][t + 1] : -100);
            targets += y[t] != -100;
        }
        assert_int_equal(d.targets[i], targets);
    }
    data_sft_free(&d);
}

static void test_refusals(void **state)
{
    (void)state;
    const char *ok = "{\"input_ids\": [1, 2]}\n";
    char text[512];
    /* Each refusal names the file and the line (3: after two good lines). */
#define AT3(s) (snprintf(text, sizeof text, "%s%s%s", ok, ok, s), text)
    refused(AT3("[1, 2]\n"), 8, false, "bad.jsonl:3: ", "not a JSON object", NULL);
    refused(AT3("{\"input_ids\": [1, 2]\n"), 8, false, "bad.jsonl:3: ", "not valid JSON", "',' or '}'", NULL);
    refused(AT3("{\"input_ids\": [1, 2]} x\n"), 8, false, "bad.jsonl:3: ", "column 23", NULL);
    refused(AT3("{\"labels\": [1, 2]}\n"), 8, false, "bad.jsonl:3: ", "input_ids: missing", NULL);
    refused(AT3("{\"input_ids\": \"12\"}\n"), 8, false, "bad.jsonl:3: ", "input_ids: expected an array of integers",
            NULL);
    refused(AT3("{\"input_ids\": [1, 2.5]}\n"), 8, false, "bad.jsonl:3: ", "input_ids[1]: 2.5 is not an integer",
            NULL);
    refused(AT3("{\"input_ids\": [1, \"2\"]}\n"), 8, false, "bad.jsonl:3: ", "input_ids[1]: expected an integer",
            NULL);
    refused(AT3("{\"input_ids\": [1, 256]}\n"), 8, false, "bad.jsonl:3: ", "input_ids[1]: 256 is out of range for vocab 256",
            NULL);
    refused(AT3("{\"input_ids\": [-1, 2]}\n"), 8, false, "bad.jsonl:3: ", "input_ids[0]: -1", NULL);
    refused(AT3("{\"input_ids\": [1, 2], \"input_ids\": [1, 2]}\n"), 8, false, "bad.jsonl:3: ",
            "input_ids: given twice", NULL);
    refused(AT3("{\"input_ids\": [1, 2, 3], \"labels\": [1, 2]}\n"), 8, false, "bad.jsonl:3: ",
            "labels: 2 of them for 3 input_ids", NULL);
    refused(AT3("{\"input_ids\": [1, 2, 3], \"labels\": [1, -1, 3]}\n"), 8, false, "bad.jsonl:3: ",
            "labels[1]: -1 is neither -100", NULL);
    refused(AT3("{\"input_ids\": [1, 2, 3], \"labels\": [1, 2, 999]}\n"), 8, false, "bad.jsonl:3: ", "labels[2]: 999",
            NULL);
    refused(AT3("{\"input_ids\": [1, 2], \"attention_mask\": [1, 0]}\n"), 8, false, "bad.jsonl:3: ",
            "attention_mask[1]: 0", "all 1s", NULL);
    refused(AT3("{\"input_ids\": [1, 2], \"attention_mask\": [1]}\n"), 8, false, "bad.jsonl:3: ",
            "attention_mask: 1 entries for 2", NULL);
    refused(AT3("{\"input_ids\": []}\n"), 8, false, "bad.jsonl:3: ", "input_ids: an empty sample", NULL);
    refused(AT3("{\"input_ids\": [5]}\n"), 8, false, "bad.jsonl:3: ", "one token", NULL);
    refused(AT3("{\"input_ids\": [1, 2, 3], \"labels\": [1, -100, -100]}\n"), 8, false, "bad.jsonl:3: ",
            "no labelled token", "labels[1..2] are all -100", NULL);
    refused(AT3("{\"input_ids\": [1, 2, 3, 4, 5]}\n"), 4, false, "bad.jsonl:3: ", "5 tokens", "context 4",
            "overlong = truncate", NULL);
    /* Truncated to 3 tokens, its one labelled target (at 4) is gone. */
    refused(AT3("{\"input_ids\": [1, 2, 3, 4], \"labels\": [-100, -100, -100, 4]}\n"), 3, true, "bad.jsonl:3: ",
            "no labelled token to learn from within the first [model] context tokens", NULL);
    refused(AT3("{\"input_ids\": [1, 2], \"x\": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
                "[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}\n"),
            8, false, "bad.jsonl:3: ", "nested deeper", NULL);
    refused(AT3("{\"input_ids\": [1, 2], \"s\": \"a\tb\"}\n"), 8, false, "bad.jsonl:3: ", "control characters",
            NULL);
    refused(AT3("{\"input_ids\": [1, 2], \"s\": \"\\q\"}\n"), 8, false, "bad.jsonl:3: ", "an escape", NULL);
    refused(AT3("{\"input_ids\": [1, 2], \"s\": tru}\n"), 8, false, "bad.jsonl:3: ", "a JSON value", NULL);
    refused(AT3("{\"input_ids\": [01]}\n"), 8, false, "bad.jsonl:3: ", "not valid JSON", NULL);
#undef AT3
    /* A NUL byte is no JSON. */
    FILE *f = fopen("nul.jsonl", "wb");
    assert_non_null(f);
    fwrite("{\"input_ids\": [1, 2]}\n{\"input_ids\": [1, 2]}\0\n", 1, 46, f);
    fclose(f);
    data_sft n;
    assert_int_equal(data_sft_load(&n, "nul.jsonl", 256, 8, false, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "nul.jsonl:2: not valid JSON at column 22: byte 0x00"));
    refused("\n\n  \n", 8, false, "bad.jsonl: no samples", NULL);
    data_sft d;
    assert_int_equal(data_sft_load(&d, "missing.jsonl", 256, 8, false, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "missing.jsonl"));
}

static void test_overlong_truncate(void **state)
{
    (void)state;
    const char *p = put("long.jsonl", "{\"input_ids\": [1, 2, 3, 4, 5, 6], \"labels\": [-100, 2, 3, 4, 5, 6]}\n");
    data_sft d;
    load_ok(&d, p, 256, 4, true);
    assert_int_equal(data_sft_len(&d, 0), 4);
    int32_t x[4], y[4], wx[] = {1, 2, 3, 4}, wy[] = {2, 3, 4, -100};
    data_sft_shift(&d, 0, x, y);
    assert_memory_equal(x, wx, sizeof wx);
    assert_memory_equal(y, wy, sizeof wy);
    assert_int_equal(d.targets[0], 3);
    data_sft_free(&d);
    /* Exactly the context is not over-long. */
    load_ok(&d, p, 256, 6, false);
    assert_int_equal(data_sft_len(&d, 0), 6);
    data_sft_free(&d);
}

/* A line longer than the reader's chunk, and a gzip'd file. */
static void test_long_line_and_gzip(void **state)
{
    (void)state;
    enum { N = 30000 };
    FILE *f = fopen("big.jsonl", "w");
    gzFile g = gzopen("big.jsonl.gz", "wb");
    assert_non_null(f);
    assert_non_null(g);
    for (int rep = 0; rep < 2; rep++) {
        fprintf(f, "{\"input_ids\": [");
        gzprintf(g, "{\"input_ids\": [");
        for (int t = 0; t < N; t++) {
            fprintf(f, "%s%d", t ? ", " : "", (t * 7 + rep) % 1000);
            gzprintf(g, "%s%d", t ? ", " : "", (t * 7 + rep) % 1000);
        }
        fprintf(f, "]}\n");
        gzprintf(g, "]}\n");
    }
    fclose(f);
    gzclose(g);
    const char *paths[] = {"big.jsonl", "big.jsonl.gz"};
    for (int k = 0; k < 2; k++) {
        data_sft d;
        load_ok(&d, paths[k], 1000, N, false);
        assert_int_equal(d.n, 2);
        assert_int_equal(d.ntok, 2 * N);
        for (int t = 0; t < N; t++)
            if (d.ids[N + t] != (t * 7 + 1) % 1000)
                fail_msg("%s: token %d is %d", paths[k], t, d.ids[N + t]);
        data_sft_free(&d);
        /* format = auto knows either by its name. */
        assert_true(data_is_jsonl(DATA_FMT_AUTO, paths[k]));
    }
    assert_false(data_is_jsonl(DATA_FMT_AUTO, "corpus.txt.gz"));
    assert_false(data_is_jsonl(DATA_FMT_AUTO, "x.gz"));
    assert_false(data_is_jsonl(DATA_FMT_TEXT, "big.jsonl"));
}

/* ---- rows ------------------------------------------------------------------------ */

/* Samples of 3, 2, 4 and 2 tokens into rows of 6.  Packed: [3 2 pad]
 * [4 2], every position's token, target, position and start exact.
 * Padded: one sample a row. */
static void test_rows_packed_and_padded(void **state)
{
    (void)state;
    const char *p = put("rows.jsonl",
                        "{\"input_ids\": [10, 11, 12]}\n"
                        "{\"input_ids\": [20, 21]}\n"
                        "{\"input_ids\": [30, 31, 32, 33], \"labels\": [-100, -100, 32, 33]}\n"
                        "{\"input_ids\": [40, 41]}\n");
    data_sft d;
    load_ok(&d, p, 256, 6, false);
    enum { T = 6, R = 4 };
    int32_t x[R * T], y[R * T], pos[R * T], start[R * T];
    data_rows r;
    data_rows_begin(&r, x, y, pos, start, T, true);
    for (size_t i = 0; i < 4; i++)
        data_rows_add(&r, &d, i);
    assert_int_equal(data_rows_end(&r), 2);
    assert_int_equal(r.tokens, 11);
    assert_int_equal(r.targets, 2 + 1 + 2 + 1);
    const int32_t wx[2 * T] = {10, 11, 12, 20, 21, 0, 30, 31, 32, 33, 40, 41};
    const int32_t wy[2 * T] = {11, 12, -100, 21, -100, -100, -100, 32, 33, -100, 41, -100};
    const int32_t wp[2 * T] = {0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 0, 1};
    const int32_t ws[2 * T] = {0, 0, 0, 3, 3, 5, 0, 0, 0, 0, 4, 4};
    assert_memory_equal(x, wx, sizeof wx);
    assert_memory_equal(y, wy, sizeof wy);
    assert_memory_equal(pos, wp, sizeof wp);
    assert_memory_equal(start, ws, sizeof ws);

    /* Unpacked: four rows, each a sample then padding; no pos or start. */
    memset(pos, 0x55, sizeof pos);
    data_rows_begin(&r, x, y, pos, start, T, false);
    assert_null(r.pos);
    for (size_t i = 0; i < 4; i++)
        data_rows_add(&r, &d, i);
    assert_int_equal(data_rows_end(&r), 4);
    assert_int_equal(r.targets, 6);
    const int32_t ux[R * T] = {10, 11, 12, 0, 0, 0, 20, 21, 0, 0, 0, 0, 30, 31, 32, 33, 0, 0, 40, 41, 0, 0, 0, 0};
    const int32_t uy[R * T] = {11, 12, -100, -100, -100, -100, 21, -100, -100, -100, -100, -100,
                               -100, 32, 33, -100, -100, -100, 41, -100, -100, -100, -100, -100};
    assert_memory_equal(x, ux, sizeof ux);
    assert_memory_equal(y, uy, sizeof uy);
    assert_int_equal(pos[0], 0x55555555);
    data_sft_free(&d);
}

/* ---- the stream, the evaluation pass, the held-out tail, the budget ------------------ */

static void write_numbered(const char *path, int n)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    /* Sample i: 2 + i % 3 tokens, the first one i; labels from the second. */
    for (int i = 0; i < n; i++) {
        fprintf(f, "{\"input_ids\": [%d", i);
        for (int t = 1; t < 2 + i % 3; t++)
            fprintf(f, ", %d", t);
        fprintf(f, "]}\n");
    }
    fclose(f);
}

/* The first token of each row's samples (packing off: one a row). */
static void next_firsts(data_stream *s, size_t n, int32_t *firsts, uint64_t *targets)
{
    int32_t x[16 * 4], y[16 * 4];
    data_rows r;
    data_rows_begin(&r, x, y, NULL, NULL, 4, false);
    assert_int_equal(data_stream_next_sft(s, n, &r), n);
    for (size_t i = 0; i < n; i++)
        firsts[i] = x[i * 4];
    *targets = r.targets;
}

static void test_stream_position(void **state)
{
    (void)state;
    write_numbered("s.jsonl", 10);
    data_sft d;
    load_ok(&d, "s.jsonl", 256, 4, false);
    data_stream a, b;
    assert_int_equal(data_stream_sft(&a, &d, 42, NULL, err, sizeof err), 0);
    assert_int_equal(data_stream_sft(&b, &d, 42, NULL, err, sizeof err), 0);
    assert_int_equal(data_stream_epoch_size(&a), 10);
    /* An epoch is a permutation of the samples. */
    int32_t f[16];
    uint64_t tg, tk, tg2;
    next_firsts(&a, 10, f, &tg);
    int seen = 0;
    for (int i = 0; i < 10; i++)
        seen |= 1 << f[i];
    assert_int_equal(seen, (1 << 10) - 1);
    /* Counting ahead (across the epoch's end) moves nothing, and counts
     * what is then taken. */
    next_firsts(&b, 7, f, &tg);
    uint64_t e0, i0, e1, i1;
    data_stream_state(&b, &e0, &i0);
    data_stream_sft_count(&b, 6, &tg, &tk);
    data_stream_state(&b, &e1, &i1);
    assert_true(e0 == e1 && i0 == i1);
    int32_t g[16];
    next_firsts(&b, 6, g, &tg2);
    assert_int_equal(tg, tg2);
    uint64_t want_tok = 0;
    for (int i = 0; i < 6; i++)
        want_tok += 2 + (uint64_t)g[i] % 3;
    assert_int_equal(tk, want_tok);
    /* A saved position replays the same samples in a fresh stream. */
    data_stream_state(&b, &e0, &i0);
    assert_int_equal(e0, 1);
    next_firsts(&b, 9, f, &tg);
    data_stream c;
    assert_int_equal(data_stream_sft(&c, &d, 42, NULL, err, sizeof err), 0);
    assert_int_equal(data_stream_set_state(&c, e0, i0, err, sizeof err), 0);
    next_firsts(&c, 9, g, &tg2);
    assert_memory_equal(f, g, 9 * sizeof *f);
    assert_int_equal(tg, tg2);
    assert_int_equal(data_stream_set_state(&c, 0, 10, err, sizeof err), -1);
    assert_non_null(strstr(err, "s.jsonl"));
    data_stream_free(&a);
    data_stream_free(&b);
    data_stream_free(&c);

    /* The held-out tail: the last 3 samples, in order, as a view. */
    data_sft val;
    assert_int_equal(data_sft_split(&d, &val, 0.3, err, sizeof err), 0);
    assert_int_equal(d.n, 7);
    assert_int_equal(val.n, 3);
    assert_non_null(strstr(val.source, "validation"));
    data_eval e;
    data_eval_sft(&e, &val);
    int32_t x[16 * 4], y[16 * 4];
    data_rows r;
    data_rows_begin(&r, x, y, NULL, NULL, 4, false);
    assert_int_equal(data_eval_next_sft(&e, 2, &r), 2);
    assert_int_equal(x[0], 7);
    assert_int_equal(x[4], 8);
    data_rows_begin(&r, x, y, NULL, NULL, 4, false);
    assert_int_equal(data_eval_next_sft(&e, 2, &r), 1);
    assert_int_equal(x[0], 9);
    assert_int_equal(r.targets, val.targets[2]);
    data_rows_begin(&r, x, y, NULL, NULL, 4, false);
    assert_int_equal(data_eval_next_sft(&e, 2, &r), 0);
    data_eval_reset(&e);
    data_rows_begin(&r, x, y, NULL, NULL, 4, false);
    assert_int_equal(data_eval_next_sft(&e, 5, &r), 3);
    assert_int_equal(d.ntargets + val.ntargets, 19); /* Σ 1 + i % 3 */
    data_sft_free(&val);
    data_sft_free(&d);
}

/* What a load holds is charged, exactly, and a tight budget refuses it
 * naming the file and the key, leaving nothing charged. */
static void test_budget(void **state)
{
    (void)state;
    write_numbered("b.jsonl", 100);
    data_budget b = {.key = "[daemon] max_job_data"};
    data_sft d;
    assert_int_equal(data_sft_load(&d, "b.jsonl", 256, 4, false, &b, err, sizeof err), 0);
    uint64_t held = d.ntok * 4 + (d.ntok + 7) / 8 + (d.n + 1) * 8 + d.n * 4;
    assert_int_equal(b.used, held);
    data_sft_free(&d);
    data_budget tight = {.limit = held - 1, .key = "[daemon] max_job_data"};
    assert_int_equal(data_sft_load(&d, "b.jsonl", 256, 4, false, &tight, err, sizeof err), -1);
    assert_non_null(strstr(err, "b.jsonl"));
    assert_non_null(strstr(err, "[daemon] max_job_data"));
    assert_int_equal(tight.used, 0);
}

static int setup(void **state)
{
    (void)state;
    return td_make("data-jsonl") != 0 || chdir(td_path) != 0 ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    return chdir("/") != 0 ? -1 : td_remove();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_samples),
        cmocka_unit_test(test_shift_definition),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_overlong_truncate),
        cmocka_unit_test(test_long_line_and_gzip),
        cmocka_unit_test(test_rows_packed_and_padded),
        cmocka_unit_test(test_stream_position),
        cmocka_unit_test(test_budget),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
