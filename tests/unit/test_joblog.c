/* test_joblog.c — a job's log never passes its bound: it keeps its head,
 * one marker line with the count of bytes dropped, and the newest lines;
 * a reopened log continues with the same head and marker; a stopped log
 * is cut back to its head and grows no more; a FIFO or a symbolic link is refused without
 * blocking. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jobs/joblog.h"
#include "tmpdir.h"

#define MAX (64u << 10)

static int setup(void **state)
{
    (void)state;
    return td_make("joblog");
}

static int teardown(void **state)
{
    (void)state;
    return td_remove();
}

static char log_path[128];

static uint64_t disk_size(void)
{
    struct stat st;
    assert_int_equal(stat(log_path, &st), 0);
    return (uint64_t)st.st_size;
}

/* As the worker writes: a full log is rewritten, then written again. */
static void put(joblog *l, const char *text)
{
    size_t len = strlen(text);
    joblog_result r = joblog_write(l, text, len);
    if (r == JOBLOG_FULL) {
        char err[256];
        assert_int_equal(joblog_rewrite(l, len, err, sizeof err), 0);
        r = joblog_write(l, text, len);
    }
    assert_int_equal(r, JOBLOG_WRITTEN);
}

static void put_lines(joblog *l, int from, int to)
{
    char line[96];
    for (int i = from; i < to; i++) {
        snprintf(line, sizeof line, "step %d loss 1.2345 lr 3.00e-04 norm 0.512 mem 1.2M/2.0M\n", i);
        put(l, line);
        assert_true(disk_size() <= MAX);
        assert_int_equal(disk_size(), l->size);
    }
}

static char *slurp(size_t *len)
{
    FILE *f = fopen(log_path, "r");
    assert_non_null(f);
    char *buf = malloc(2 * MAX);
    assert_non_null(buf);
    *len = fread(buf, 1, 2 * MAX - 1, f);
    buf[*len] = '\0';
    fclose(f);
    return buf;
}

/* The file's shape: lines 0..head_last, one marker, then consecutive
 * lines ending at `last`.  Returns the marker's count. */
static unsigned long long check_shape(int last)
{
    size_t len;
    char *buf = slurp(&len);
    char *marker = strstr(buf, JOBLOG_MARKER);
    assert_non_null(marker);
    assert_null(strstr(marker + 1, JOBLOG_MARKER)); /* one marker */
    assert_true((size_t)(marker - buf) <= MAX / 2);
    assert_true(marker == buf || marker[-1] == '\n');
    unsigned long long dropped = strtoull(marker + strlen(JOBLOG_MARKER), NULL, 10);
    /* The head: lines 0, 1, 2 ... in order. */
    int want = 0, n;
    for (char *p = buf; p < marker; p = strchr(p, '\n') + 1) {
        assert_int_equal(sscanf(p, "step %d ", &n), 1);
        assert_int_equal(n, want++);
    }
    /* The tail: consecutive lines up to the last. */
    char *p = strchr(marker, '\n') + 1;
    assert_int_equal(sscanf(p, "step %d ", &n), 1);
    assert_true(n > want);
    for (want = n; *p; p = strchr(p, '\n') + 1) {
        assert_int_equal(sscanf(p, "step %d ", &n), 1);
        assert_int_equal(n, want++);
    }
    assert_int_equal(n, last);
    free(buf);
    return dropped;
}

static void test_bounded(void **state)
{
    (void)state;
    snprintf(log_path, sizeof log_path, "%s/log", td_path);
    joblog l;
    char err[256];
    assert_int_equal(joblog_open(&l, log_path, MAX, err, sizeof err), 0);
    put_lines(&l, 0, 200); /* well under the bound: as written */
    size_t len;
    char *buf = slurp(&len);
    assert_null(strstr(buf, JOBLOG_MARKER));
    free(buf);
    int total = 20000;
    put_lines(&l, 200, total);
    unsigned long long dropped = check_shape(total - 1);
    /* Every byte written is either in the file or counted as dropped. */
    uint64_t written = 0;
    char line[96];
    for (int i = 0; i < total; i++)
        written += (uint64_t)snprintf(line, sizeof line,
                                      "step %d loss 1.2345 lr 3.00e-04 norm 0.512 mem 1.2M/2.0M\n", i);
    assert_int_equal(written, l.size - l.marker_len + dropped);
    /* Rewritten about once per quarter of the bound: it keeps room. */
    assert_true(l.size <= MAX - MAX / 8);
    joblog_close(&l);

    /* Resumed after a restart: the same head and marker, the count goes on. */
    assert_int_equal(joblog_open(&l, log_path, MAX, err, sizeof err), 0);
    assert_true(l.has_marker);
    assert_int_equal(l.dropped, dropped);
    put_lines(&l, total, total + 5000);
    assert_true(check_shape(total + 4999) > dropped);
    joblog_close(&l);
}

static void test_reader_sees_whole_versions(void **state)
{
    (void)state;
    snprintf(log_path, sizeof log_path, "%s/log", td_path);
    joblog l;
    char err[256];
    assert_int_equal(joblog_open(&l, log_path, MAX, err, sizeof err), 0);
    put_lines(&l, 0, 1400);
    /* A reader that opened before a rewrite keeps the version it opened:
     * whole lines, which nothing changes once the rewrite has replaced it. */
    int rfd = open(log_path, O_RDONLY);
    assert_true(rfd >= 0);
    struct stat rst, st;
    assert_int_equal(fstat(rfd, &rst), 0);
    int i = 1400;
    do {
        put_lines(&l, i, i + 1);
        i++;
        assert_int_equal(stat(log_path, &st), 0);
    } while (st.st_ino == rst.st_ino);
    assert_int_equal(fstat(rfd, &rst), 0);
    put_lines(&l, i, 2000);
    assert_int_equal(fstat(rfd, &st), 0);
    assert_int_equal(st.st_size, rst.st_size);
    char *old = malloc((size_t)rst.st_size + 1);
    assert_non_null(old);
    assert_int_equal(pread(rfd, old, (size_t)rst.st_size, 0), rst.st_size);
    old[rst.st_size] = '\0';
    assert_int_equal(strncmp(old, "step 0 ", 7), 0);
    assert_int_equal(old[rst.st_size - 1], '\n');
    free(old);
    close(rfd);
    check_shape(1999);
    joblog_close(&l);
}

static void test_stop(void **state)
{
    (void)state;
    snprintf(log_path, sizeof log_path, "%s/log", td_path);
    joblog l;
    char err[256];
    assert_int_equal(joblog_open(&l, log_path, MAX, err, sizeof err), 0);
    put_lines(&l, 0, 3000);
    joblog_stop(&l, "uid 7's jobs hold more than [daemon] max_bytes_per_user = 1.0M in the state dir");
    put_lines(&l, 3000, 3001);
    uint64_t size = disk_size();
    assert_true(size <= MAX / 2 + 320);
    put_lines(&l, 3001, 4000);
    assert_int_equal(disk_size(), size);
    size_t len;
    char *buf = slurp(&len);
    char *marker = strstr(buf, JOBLOG_MARKER);
    assert_non_null(marker);
    assert_non_null(strstr(marker, "nothing after this is kept: uid 7's jobs hold more than [daemon] "
                                   "max_bytes_per_user = 1.0M in the state dir]\n"));
    assert_string_equal(strchr(marker, '\n'), "\n"); /* the marker ends the file */
    free(buf);
    joblog_close(&l);

    /* Stopped before its head is full: it keeps what it has. */
    unlink(log_path);
    assert_int_equal(joblog_open(&l, log_path, MAX, err, sizeof err), 0);
    put_lines(&l, 0, 10);
    joblog_stop(&l, "why");
    put_lines(&l, 10, 3000);
    buf = slurp(&len);
    char *end = strstr(buf, "step 9 ");
    assert_non_null(end);
    end = strchr(end, '\n') + 1;
    assert_string_equal(end, JOBLOG_MARKER "0 bytes dropped; nothing after this is kept: why]\n");
    assert_int_equal(strncmp(buf, "step 0 ", 7), 0);
    free(buf);
    joblog_close(&l);
}

static void test_special_files(void **state)
{
    (void)state;
    char path[160], err[256];
    joblog l;
    snprintf(path, sizeof path, "%s/fifo", td_path);
    assert_int_equal(mkfifo(path, 0600), 0);
    assert_int_equal(joblog_open(&l, path, MAX, err, sizeof err), -1);
    assert_int_equal(l.fd, -1);
    char want[256];
    snprintf(want, sizeof want, "%s: not a regular file (a FIFO)", path);
    assert_string_equal(err, want);
    /* A job with no log runs: writes go nowhere. */
    assert_int_equal(joblog_write(&l, "x\n", 2), JOBLOG_WRITTEN);

    snprintf(path, sizeof path, "%s/link", td_path);
    assert_int_equal(symlink("/etc/passwd", path), 0);
    assert_int_equal(joblog_open(&l, path, MAX, err, sizeof err), -1);
    snprintf(want, sizeof want, "%s: not a regular file (a symbolic link)", path);
    assert_string_equal(err, want);

    snprintf(path, sizeof path, "%s/dir", td_path);
    assert_int_equal(mkdir(path, 0700), 0);
    assert_int_equal(joblog_open(&l, path, MAX, err, sizeof err), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reader_sees_whole_versions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_special_files, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
