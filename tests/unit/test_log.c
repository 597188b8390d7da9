/* test_log.c — the log's journal entries (fields, priorities, job and
 * device), its fallback to stderr, and the JOURNAL_STREAM check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "base/log.h"

/* What the capturing sink saw of the last entry. */
typedef struct {
    int calls;
    int rc; /* what the sink returns */
    char fields[16][1200];
    int n;
} capture;

static int capture_sink(void *user, const struct iovec *iov, int n)
{
    capture *c = user;
    c->calls++;
    c->n = n < 16 ? n : 16;
    for (int i = 0; i < c->n; i++)
        snprintf(c->fields[i], sizeof c->fields[i], "%.*s", (int)iov[i].iov_len, (const char *)iov[i].iov_base);
    return c->rc;
}

/* The value of KEY in the captured entry, or NULL. */
static const char *field(const capture *c, const char *key)
{
    size_t kl = strlen(key);
    for (int i = 0; i < c->n; i++)
        if (strncmp(c->fields[i], key, kl) == 0 && c->fields[i][kl] == '=')
            return c->fields[i] + kl + 1;
    return NULL;
}

static int teardown(void **state)
{
    (void)state;
    log_set_sink(NULL, NULL);
    log_set_level(LOG_INFO);
    unsetenv("JOURNAL_STREAM");
    return 0;
}

static void test_job_fields(void **state)
{
    (void)state;
    capture c = {0};
    log_set_sink(capture_sink, &c);
    int line = __LINE__ + 1;
    log_job(LOG_WARN, 7, "cpu0", "job %u: %s", 7u, "out of memory, shrinking");
    assert_int_equal(c.calls, 1);
    assert_string_equal(field(&c, "MESSAGE"), "job 7: out of memory, shrinking");
    assert_string_equal(field(&c, "PRIORITY"), "4");
    assert_string_equal(field(&c, "SYSLOG_IDENTIFIER"), "gradd");
    assert_string_equal(field(&c, "GRADD_JOB_ID"), "7");
    assert_string_equal(field(&c, "GRADD_DEVICE"), "cpu0");
    assert_non_null(strstr(field(&c, "CODE_FILE"), "test_log.c"));
    char l[16];
    snprintf(l, sizeof l, "%d", line);
    assert_string_equal(field(&c, "CODE_LINE"), l);
    assert_string_equal(field(&c, "CODE_FUNC"), "test_job_fields");
}

static void test_plain_and_device_lines(void **state)
{
    (void)state;
    capture c = {0};
    log_set_sink(capture_sink, &c);
    log_error("listening failed: %s", "no");
    assert_string_equal(field(&c, "PRIORITY"), "3");
    assert_null(field(&c, "GRADD_JOB_ID"));
    assert_null(field(&c, "GRADD_DEVICE"));
    log_dev(LOG_INFO, "cuda0", "trim on %s", "cuda0");
    assert_string_equal(field(&c, "GRADD_DEVICE"), "cuda0");
    assert_null(field(&c, "GRADD_JOB_ID"));
    /* A job not yet placed on a device: no empty GRADD_DEVICE field. */
    log_job(LOG_INFO, 12, "", "job %u queued", 12u);
    assert_string_equal(field(&c, "GRADD_JOB_ID"), "12");
    assert_null(field(&c, "GRADD_DEVICE"));
    /* Below the threshold nothing reaches the sink. */
    int before = c.calls;
    log_debug("noise");
    assert_int_equal(c.calls, before);
    log_set_level(LOG_DEBUG);
    log_debug("wanted");
    assert_int_equal(c.calls, before + 1);
    assert_string_equal(field(&c, "PRIORITY"), "7");
}

/* What users wrote is quoted in messages: it can neither start a line of
 * its own nor act on a terminal, and valid UTF-8 stays as it is. */
static void test_user_text_is_escaped(void **state)
{
    (void)state;
    capture c = {0};
    log_set_sink(capture_sink, &c);
    log_info("job 3 (%s) from %s", "a\nb\x1b[2J\x07", "/home/d\xc3\xa9j\xe0/x\\y\x7f\xff.cfg");
    assert_string_equal(field(&c, "MESSAGE"),
                        "job 3 (a\\x0ab\\x1b[2J\\x07) from /home/d\xc3\xa9j\\xe0/x\\\\y\\x7f\\xff.cfg");
}

/* A sink that refuses a line (journald gone) sends it to stderr instead;
 * with no sink every line is a plain stderr line. */
static void test_fallback_to_stderr(void **state)
{
    (void)state;
    char path[] = "/tmp/gradd-log-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    capture c = {.rc = -1};
    log_set_sink(capture_sink, &c);
    log_job(LOG_INFO, 3, "cpu0", "journal is down %d", 1);
    log_set_sink(NULL, NULL);
    log_info("plain %d", 2);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char buf[512] = "";
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    close(fd);
    unlink(path);
    assert_true(n > 0);
    buf[n] = '\0';
    assert_int_equal(c.calls, 1);
    assert_non_null(strstr(buf, "gradd info: journal is down 1\n"));
    assert_non_null(strstr(buf, "gradd info: plain 2\n"));
    assert_null(strstr(buf, "GRADD_JOB_ID"));
}

static void test_journal_stream(void **state)
{
    (void)state;
    struct stat st;
    assert_int_equal(fstat(2, &st), 0);
    char v[64];
    unsetenv("JOURNAL_STREAM");
    assert_false(log_stderr_is_journal());
    snprintf(v, sizeof v, "%llu:%llu", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
    setenv("JOURNAL_STREAM", v, 1);
    assert_true(log_stderr_is_journal());
    /* Inherited from a parent whose stderr was the journal, but ours was
     * redirected: not ours. */
    snprintf(v, sizeof v, "%llu:%llu", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino + 1);
    setenv("JOURNAL_STREAM", v, 1);
    assert_false(log_stderr_is_journal());
    setenv("JOURNAL_STREAM", "garbage", 1);
    assert_false(log_stderr_is_journal());
    snprintf(v, sizeof v, "%llu:%llux", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
    setenv("JOURNAL_STREAM", v, 1);
    assert_false(log_stderr_is_journal());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_job_fields, teardown),
        cmocka_unit_test_teardown(test_plain_and_device_lines, teardown),
        cmocka_unit_test_teardown(test_user_text_is_escaped, teardown),
        cmocka_unit_test_teardown(test_fallback_to_stderr, teardown),
        cmocka_unit_test_teardown(test_journal_stream, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
