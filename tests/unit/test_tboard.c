/* test_tboard.c — CRC32C against published vectors (both code paths),
 * TFRecord framing, and event files that parse back into the Events that
 * were logged; corrupted and truncated files are refused by the reader. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/tboard.h"
#include "tensorboard.pb-c.h"
#include "tmpdir.h"

static int setup_dir(void **state)
{
    (void)state;
    return td_make("tb");
}

static int teardown_dir(void **state)
{
    (void)state;
    return td_remove();
}

/* ---- CRC32C ------------------------------------------------------------------ */

static void test_crc32c_vectors(void **state)
{
    (void)state;
    /* "123456789" is the standard check value; the 32-byte ones are the
     * iSCSI vectors of RFC 3720, appendix B.4. */
    uint8_t zeros[32] = {0}, ones[32], inc[32], dec[32];
    for (int i = 0; i < 32; i++) {
        ones[i] = 0xff;
        inc[i] = (uint8_t)i;
        dec[i] = (uint8_t)(31 - i);
    }
    static const uint8_t iscsi_read[48] = {
        0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
        0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
    struct {
        const void *data;
        size_t n;
        uint32_t crc;
    } v[] = {
        {"123456789", 9, 0xE3069283u}, {"", 0, 0},
        {zeros, 32, 0x8A9136AAu},       {ones, 32, 0x62A8AB43u},
        {inc, 32, 0x46DD794Eu},         {dec, 32, 0x113FDB5Cu},
        {iscsi_read, 48, 0xD9963A56u},  {"a", 1, 0xC1D04330u},
    };
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        assert_int_equal(tb_crc32c(0, v[i].data, v[i].n), v[i].crc);
        assert_int_equal(tb_crc32c_portable(0, v[i].data, v[i].n), v[i].crc);
    }
    /* Continuation: crc(a ‖ b) == crc(crc(a), b), split anywhere. */
    for (size_t k = 0; k <= 9; k++)
        assert_int_equal(tb_crc32c(tb_crc32c(0, "123456789", k), "123456789" + k, 9 - k),
                         0xE3069283u);
}

static void test_crc32c_paths_agree(void **state)
{
    (void)state;
    enum { N = 4096 };
    uint8_t *buf = malloc(N + 16);
    uint32_t x = 12345;
    for (int i = 0; i < N + 16; i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = (uint8_t)(x >> 16);
    }
    /* every alignment and many lengths */
    for (size_t off = 0; off < 16; off++)
        for (size_t n = 0; n < N; n = n * 3 / 2 + 1)
            assert_int_equal(tb_crc32c(0x1234u * (uint32_t)off, buf + off, n),
                             tb_crc32c_portable(0x1234u * (uint32_t)off, buf + off, n));
    free(buf);
}

static void test_crc_mask(void **state)
{
    (void)state;
    assert_int_equal(tb_crc_mask(0), 0xa282ead8u);
    uint32_t c = 0xE3069283u;
    assert_int_equal(tb_crc_mask(c), ((c >> 15) | (c << 17)) + 0xa282ead8u);
    for (uint32_t v = 1; v != 0 && v < 0xF0000000u; v = v * 5 + 7)
        assert_int_equal(tb_crc_unmask(tb_crc_mask(v)), v);
}

/* ---- event files ------------------------------------------------------------- */

typedef struct {
    Gradd__Tb__Event *ev[64];
    size_t n;
} events;

static int collect(void *ctx, const uint8_t *data, size_t len)
{
    events *e = ctx;
    Gradd__Tb__Event *ev = gradd__tb__event__unpack(NULL, len, data);
    assert_non_null(ev);
    if (e->n < 64)
        e->ev[e->n++] = ev;
    else
        gradd__tb__event__free_unpacked(ev, NULL);
    return 0;
}

static void free_events(events *e)
{
    for (size_t i = 0; i < e->n; i++)
        gradd__tb__event__free_unpacked(e->ev[i], NULL);
    e->n = 0;
}

static void test_event_file_round_trip(void **state)
{
    (void)state;
    char err[512];
    tb_writer *w;
    time_t before = time(NULL);
    if (tb_open(td_path, &w, err, sizeof err) != 0)
        fail_msg("%s", err);
    /* name: DIR/events.out.tfevents.<time>.<host>.<pid>.gradd */
    char path[512];
    snprintf(path, sizeof path, "%s", tb_path(w));
    char prefix[128];
    snprintf(prefix, sizeof prefix, "%s/events.out.tfevents.", td_path);
    assert_int_equal(strncmp(path, prefix, strlen(prefix)), 0);
    long long t = atoll(path + strlen(prefix));
    assert_true(t >= (long long)before && t <= (long long)time(NULL));
    char suffix[64];
    snprintf(suffix, sizeof suffix, ".%ld.gradd", (long)getpid());
    assert_string_equal(path + strlen(path) - strlen(suffix), suffix);

    /* The file_version record is on disk as soon as tb_open returns. */
    events e = {0};
    assert_int_equal(tb_read_records(path, 0, collect, &e, err, sizeof err), 1);
    assert_int_equal(e.ev[0]->what_case, GRADD__TB__EVENT__WHAT_FILE_VERSION);
    assert_string_equal(e.ev[0]->file_version, "brain.Event:2");
    assert_true(e.ev[0]->wall_time >= (double)before);
    free_events(&e);

    for (int s = 0; s < 10; s++)
        assert_int_equal(tb_scalar(w, "train/loss", s * 10, 5.0f / (float)(s + 1),
                                   1700000000.0 + s),
                         0);
    assert_int_equal(tb_scalar(w, "train/zero", 100, 0.0f, 1700000100.5), 0);
    assert_int_equal(tb_scalar(w, "train/nan", 101, NAN, 0), 0); /* wall time: now */
    const char *tags[] = {"val/loss", "val/acc"};
    const float vals[] = {1.5f, 0.875f};
    assert_int_equal(tb_scalars(w, 1LL << 40, 1700000200.0, 2, tags, vals), 0);
    /* Buffered until flushed. */
    assert_int_equal(tb_read_records(path, 0, NULL, NULL, err, sizeof err), 1);
    assert_int_equal(tb_flush(w), 0);
    assert_int_equal(tb_read_records(path, 0, NULL, NULL, err, sizeof err), 14);
    assert_int_equal(tb_close(w, err, sizeof err), 0);

    assert_int_equal(tb_read_records(path, 0, collect, &e, err, sizeof err), 14);
    for (int s = 0; s < 10; s++) {
        Gradd__Tb__Event *ev = e.ev[1 + s];
        assert_int_equal(ev->what_case, GRADD__TB__EVENT__WHAT_SUMMARY);
        assert_int_equal(ev->step, s * 10);
        assert_true(ev->wall_time == 1700000000.0 + s);
        assert_int_equal(ev->summary->n_value, 1);
        assert_string_equal(ev->summary->value[0]->tag, "train/loss");
        assert_int_equal(ev->summary->value[0]->value_case,
                         GRADD__TB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE);
        assert_true(ev->summary->value[0]->simple_value == 5.0f / (float)(s + 1));
    }
    /* 0.0 is still present as a simple_value (a oneof member). */
    Gradd__Tb__Event *z = e.ev[11];
    assert_int_equal(z->summary->value[0]->value_case,
                     GRADD__TB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE);
    assert_true(z->summary->value[0]->simple_value == 0.0f);
    assert_true(z->wall_time == 1700000100.5);
    Gradd__Tb__Event *nn = e.ev[12];
    assert_true(isnan(nn->summary->value[0]->simple_value));
    assert_true(nn->wall_time >= (double)before);
    Gradd__Tb__Event *m = e.ev[13];
    assert_int_equal(m->step, 1LL << 40);
    assert_int_equal(m->summary->n_value, 2);
    assert_string_equal(m->summary->value[1]->tag, "val/acc");
    assert_true(m->summary->value[1]->simple_value == 0.875f);
    free_events(&e);
}

/* SessionLog START goes to disk at once, with its step: the event on which
 * TensorBoard drops a crashed run's events from that step on. */
static void test_session_start(void **state)
{
    (void)state;
    char err[512], path[512];
    tb_writer *w;
    if (tb_open(td_path, &w, err, sizeof err) != 0)
        fail_msg("%s", err);
    snprintf(path, sizeof path, "%s", tb_path(w));
    assert_int_equal(tb_session_start(w, 42, 1700000000.25), 0);
    events e = {0};
    assert_int_equal(tb_read_records(path, 0, collect, &e, err, sizeof err), 2);
    Gradd__Tb__Event *ev = e.ev[1];
    assert_int_equal(ev->what_case, GRADD__TB__EVENT__WHAT_SESSION_LOG);
    assert_int_equal(ev->step, 42);
    assert_true(ev->wall_time == 1700000000.25);
    assert_int_equal(ev->session_log->status, GRADD__TB__SESSION_LOG__SESSION_STATUS__START);
    free_events(&e);
    assert_int_equal(tb_close(w, err, sizeof err), 0);
}

static void test_many_records_and_second_file(void **state)
{
    (void)state;
    char err[512];
    tb_writer *a, *b;
    assert_int_equal(tb_open(td_path, &a, err, sizeof err), 0);
    assert_int_equal(tb_open(td_path, &b, err, sizeof err), 0);
    /* Same second, same pid: still two distinct files. */
    assert_string_not_equal(tb_path(a), tb_path(b));
    enum { N = 20000 }; /* well past the 64 KiB buffer */
    for (int i = 0; i < N; i++)
        assert_int_equal(tb_scalar(a, "train/loss", i, (float)i, 1.0), 0);
    char pa[512];
    snprintf(pa, sizeof pa, "%s", tb_path(a));
    assert_int_equal(tb_close(a, err, sizeof err), 0);
    assert_int_equal(tb_read_records(pa, 0, NULL, NULL, err, sizeof err), N + 1);
    assert_int_equal(tb_close(b, err, sizeof err), 0);
    assert_int_equal(tb_close(NULL, err, sizeof err), 0);
}

static void test_bad_input_to_writer(void **state)
{
    (void)state;
    char err[512];
    tb_writer *w = (tb_writer *)(uintptr_t)1;
    char missing[256];
    snprintf(missing, sizeof missing, "%s/no/such", td_path);
    assert_int_equal(tb_open(missing, &w, err, sizeof err), -1);
    assert_null(w);
    assert_non_null(strstr(err, "/no/such/events.out.tfevents."));
    assert_non_null(strstr(err, "No such file or directory"));

    assert_int_equal(tb_open(td_path, &w, err, sizeof err), 0);
    assert_string_equal(tb_error(w), "");
    assert_int_equal(tb_scalar(w, "bad\xff", 1, 1.0f, 0), -1);
    assert_non_null(strstr(tb_error(w), "not UTF-8"));
    /* the writer stays failed */
    assert_int_equal(tb_scalar(w, "ok", 1, 1.0f, 0), -1);
    assert_int_equal(tb_flush(w), -1);
    assert_int_equal(tb_close(w, err, sizeof err), -1);
    assert_non_null(strstr(err, "not UTF-8"));

    assert_int_equal(tb_open(td_path, &w, err, sizeof err), 0);
    assert_int_equal(tb_scalar(w, "", 1, 1.0f, 0), -1);
    assert_int_equal(tb_close(w, err, sizeof err), -1);
}

/* ---- the reader on damaged files ---------------------------------------------- */

static void write_file(const char *path, const uint8_t *b, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, b, n), (ssize_t)n);
    close(fd);
}

static void test_reader_refuses_damage(void **state)
{
    (void)state;
    char err[512], path[512];
    tb_writer *w;
    assert_int_equal(tb_open(td_path, &w, err, sizeof err), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(tb_scalar(w, "loss", i, (float)i, 2.0), 0);
    snprintf(path, sizeof path, "%s", tb_path(w));
    assert_int_equal(tb_close(w, err, sizeof err), 0);

    FILE *f = fopen(path, "rb");
    uint8_t orig[4096];
    size_t n = fread(orig, 1, sizeof orig, f);
    fclose(f);
    /* record boundaries */
    size_t off[5] = {0};
    for (int r = 0; r < 4; r++) {
        uint64_t len = 0;
        for (int i = 7; i >= 0; i--)
            len = len << 8 | orig[off[r] + (size_t)i];
        off[r + 1] = off[r] + 16 + (size_t)len;
    }
    assert_int_equal(off[4], n);

    char bad[600];
    snprintf(bad, sizeof bad, "%s/damaged", td_path);
    uint8_t b[4096];
    char want[700];

    /* a flipped data byte in record 2 */
    memcpy(b, orig, n);
    b[off[2] + 14] ^= 0x40;
    write_file(bad, b, n);
    assert_int_equal(tb_read_records(bad, 0, NULL, NULL, err, sizeof err), -1);
    snprintf(want, sizeof want, "%s: record 2 at byte %zu: data CRC mismatch", bad, off[2]);
    if (strncmp(err, want, strlen(want)) != 0)
        fail_msg("'%s' does not start with '%s'", err, want);

    /* a flipped length byte in record 1 */
    memcpy(b, orig, n);
    b[off[1] + 1] ^= 0x01;
    write_file(bad, b, n);
    assert_int_equal(tb_read_records(bad, 0, NULL, NULL, err, sizeof err), -1);
    snprintf(want, sizeof want, "%s: record 1 at byte %zu: length CRC mismatch", bad, off[1]);
    assert_int_equal(strncmp(err, want, strlen(want)), 0);

    /* a damaged data CRC itself */
    memcpy(b, orig, n);
    b[off[4] - 1] ^= 0x80;
    write_file(bad, b, n);
    assert_int_equal(tb_read_records(bad, 0, NULL, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "record 3"));

    /* truncation at every byte of the last record: an error, unless the
     * caller allows a truncated tail (a file still being written) */
    for (size_t cut = off[3] + 1; cut < n; cut++) {
        write_file(bad, orig, cut);
        assert_int_equal(tb_read_records(bad, 0, NULL, NULL, err, sizeof err), -1);
        snprintf(want, sizeof want, "%s: record 3 at byte %zu: ", bad, off[3]);
        if (strncmp(err, want, strlen(want)) != 0)
            fail_msg("cut %zu: '%s'", cut, err);
        assert_int_equal(
            tb_read_records(bad, TB_READ_ALLOW_TRUNCATED_TAIL, NULL, NULL, err, sizeof err), 3);
    }
    /* a huge length with a valid length CRC is refused without allocating */
    memcpy(b, orig, n);
    uint8_t *r = b + off[3];
    uint64_t huge = 1ULL << 60;
    for (int i = 0; i < 8; i++)
        r[i] = (uint8_t)(huge >> (8 * i));
    uint32_t m = tb_crc_mask(tb_crc32c(0, r, 8));
    for (int i = 0; i < 4; i++)
        r[8 + i] = (uint8_t)(m >> (8 * i));
    write_file(bad, b, n);
    assert_int_equal(tb_read_records(bad, 0, NULL, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "runs past the end of the file"));

    /* empty file: zero records; missing file: an error naming it */
    write_file(bad, orig, 0);
    assert_int_equal(tb_read_records(bad, 0, NULL, NULL, err, sizeof err), 0);
    snprintf(bad, sizeof bad, "%s/none", td_path);
    assert_int_equal(tb_read_records(bad, 0, NULL, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "/none: cannot open"));
}

static int stop_after_two(void *ctx, const uint8_t *data, size_t len)
{
    (void)data;
    (void)len;
    return ++*(int *)ctx == 2;
}

static void test_reader_callback_stops(void **state)
{
    (void)state;
    char err[512];
    tb_writer *w;
    assert_int_equal(tb_open(td_path, &w, err, sizeof err), 0);
    for (int i = 0; i < 5; i++)
        assert_int_equal(tb_scalar(w, "x", i, 1.0f, 1.0), 0);
    char path[512];
    snprintf(path, sizeof path, "%s", tb_path(w));
    assert_int_equal(tb_close(w, err, sizeof err), 0);
    int calls = 0;
    assert_int_equal(tb_read_records(path, 0, stop_after_two, &calls, err, sizeof err), 2);
    assert_int_equal(calls, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_vectors),
        cmocka_unit_test(test_crc32c_paths_agree),
        cmocka_unit_test(test_crc_mask),
        cmocka_unit_test_setup_teardown(test_event_file_round_trip, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_session_start, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_many_records_and_second_file, setup_dir,
                                        teardown_dir),
        cmocka_unit_test_setup_teardown(test_bad_input_to_writer, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_reader_refuses_damage, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_reader_callback_stops, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
