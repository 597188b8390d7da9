/* test_queue_deps.c — jobs that wait for others and held jobs in the queue
 * (daemon/jobs/queue_deps.c), and their lines in the state file: what a
 * submit refuses, what a failure cancels down a chain, what a removed
 * dependency leaves behind, and what survives a reopen. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "base/log.h"
#include "jobs/queue.h"
#include "tmpdir.h"

static int setup(void **state)
{
    (void)state;
    return td_make("queue-deps");
}

static int teardown(void **state)
{
    (void)state;
    return td_remove();
}

static int quiet(void *user, const struct iovec *fields, int n)
{
    (void)user;
    (void)fields;
    (void)n;
    return 0;
}

static void open_queue(queue *q)
{
    char err[512];
    log_set_sink(quiet, NULL);
    if (queue_open(q, td_path, err, sizeof err) != 0)
        fail_msg("%s", err);
}

/* Submit a job that waits for the n ids given; its id, or 0 with err. */
static uint32_t submit(queue *q, bool hold, char *err, size_t err_len, int rc_want, uint32_t n, ...)
{
    job_config cfg = {0};
    snprintf(cfg.name, sizeof cfg.name, "j");
    snprintf(cfg.device, sizeof cfg.device, "cpu");
    queue_ids after = {.n = n};
    va_list ap;
    va_start(ap, n);
    for (uint32_t i = 0; i < n; i++)
        after.id[i] = va_arg(ap, uint32_t);
    va_end(ap);
    /* A job file that parses again when the queue is reopened. */
    static const char text[] = "[job]\nname = j\ntype = program\n[program]\ncommand = true\n";
    uint32_t id = 0;
    int rc = queue_submit_after(q, &cfg, text, sizeof text - 1, 1000, 1000, 022, "alice", &after, hold, &id, err,
                                err_len);
    if (rc != rc_want)
        fail_msg("submit: %d, want %d (%s)", rc, rc_want, err);
    return rc == 0 ? id : 0;
}

static void set_state(queue *q, uint32_t id, job_state s)
{
    char err[256];
    pthread_mutex_lock(&q->lock);
    job *j = queue_find(q, id);
    assert_non_null(j);
    j->state = s;
    assert_int_equal(queue_persist(q, j, err, sizeof err), 0);
    queue_deps_settle(q);
    pthread_mutex_unlock(&q->lock);
}

static job *find(queue *q, uint32_t id)
{
    job *j = queue_find(q, id);
    assert_non_null(j);
    return j;
}

/* ---- submit ----------------------------------------------------------------------- */

static void test_submit_checks_dependencies(void **state)
{
    (void)state;
    queue q;
    open_queue(&q);
    char err[512] = "";
    uint32_t a = submit(&q, false, err, sizeof err, 0, 0);
    submit(&q, false, err, sizeof err, -2, 2, a, 9u);
    assert_string_equal(err, "submit: --after 9: no such job (it never existed or was forgotten)");
    /* Refused without spending an id. */
    assert_int_equal(q.next_id, a + 1);
    /* Sorted and deduplicated. */
    uint32_t b = submit(&q, false, err, sizeof err, 0, 0);
    uint32_t c = submit(&q, false, err, sizeof err, 0, 3, b, a, b);
    assert_int_equal(find(&q, c)->after.n, 2);
    assert_int_equal(find(&q, c)->after.id[0], a);
    assert_int_equal(find(&q, c)->after.id[1], b);

    pthread_mutex_lock(&q.lock);
    char why[128];
    queue_deps_waiting(&q, find(&q, c), why, sizeof why);
    assert_string_equal(why, "waiting for 1, 2");
    assert_false(queue_deps_ready(&q, find(&q, c)));
    assert_ptr_equal(queue_next_for(&q, "cpu0", false, false, NULL, NULL), find(&q, a));
    pthread_mutex_unlock(&q.lock);

    /* A failed job cannot be waited for. */
    set_state(&q, a, JOB_FAILED);
    submit(&q, false, err, sizeof err, -2, 1, a);
    assert_string_equal(err, "submit: --after 1: that job is failed, so this one could never start");
    queue_close(&q);
}

/* ---- what the queue runs ---------------------------------------------------------- */

static void test_next_skips_waiting_and_held(void **state)
{
    (void)state;
    queue q;
    open_queue(&q);
    char err[512], why[128];
    uint32_t a = submit(&q, false, err, sizeof err, 0, 0);
    uint32_t b = submit(&q, false, err, sizeof err, 0, 1, a);
    uint32_t h = submit(&q, true, err, sizeof err, 0, 0);
    pthread_mutex_lock(&q.lock);
    assert_ptr_equal(queue_next_for(&q, "cpu0", false, false, NULL, NULL), find(&q, a));
    queue_deps_waiting(&q, find(&q, h), why, sizeof why);
    assert_string_equal(why, "held");
    find(&q, a)->state = JOB_RUNNING;
    /* b waits for a, h is held: nothing to run. */
    assert_null(queue_next_for(&q, "cpu0", false, false, NULL, NULL));
    find(&q, a)->state = JOB_COMPLETED;
    assert_ptr_equal(queue_next_for(&q, "cpu0", false, false, NULL, NULL), find(&q, b));
    find(&q, b)->held = true;
    queue_deps_waiting(&q, find(&q, b), why, sizeof why);
    assert_string_equal(why, "held");
    find(&q, a)->state = JOB_QUEUED;
    queue_deps_waiting(&q, find(&q, b), why, sizeof why);
    assert_string_equal(why, "held; waiting for 1");
    find(&q, h)->held = false;
    assert_ptr_equal(queue_next_for(&q, "cpu0", false, false, NULL, NULL), find(&q, a));
    pthread_mutex_unlock(&q.lock);
    queue_close(&q);
}

/* a fails: b (after a) and c (after b) are cancelled in one settle, each
 * naming its own dependency; d (after nothing) stays. */
static void test_failure_cancels_the_chain(void **state)
{
    (void)state;
    queue q;
    open_queue(&q);
    char err[512];
    uint32_t a = submit(&q, false, err, sizeof err, 0, 0);
    uint32_t b = submit(&q, false, err, sizeof err, 0, 1, a);
    uint32_t c = submit(&q, true, err, sizeof err, 0, 1, b);
    uint32_t d = submit(&q, false, err, sizeof err, 0, 0);
    set_state(&q, a, JOB_FAILED);
    assert_int_equal(find(&q, b)->state, JOB_CANCELLED);
    assert_string_equal(find(&q, b)->reason, "dependency 1 failed");
    assert_true(find(&q, b)->finished_at > 0);
    assert_int_equal(find(&q, c)->state, JOB_CANCELLED);
    assert_string_equal(find(&q, c)->reason, "dependency 2 was cancelled");
    assert_int_equal(find(&q, d)->state, JOB_QUEUED);
    queue_close(&q);

    /* As written to disk. */
    open_queue(&q);
    assert_int_equal(find(&q, c)->state, JOB_CANCELLED);
    assert_string_equal(find(&q, c)->reason, "dependency 2 was cancelled");
    assert_true(find(&q, c)->held);
    queue_close(&q);
}

/* A completed dependency that is removed still counts as completed; one
 * gone without a record (its directory lost) cancels at the next open. */
static void test_removed_dependency(void **state)
{
    (void)state;
    queue q;
    open_queue(&q);
    char err[512];
    uint32_t a = submit(&q, false, err, sizeof err, 0, 0);
    uint32_t x = submit(&q, false, err, sizeof err, 0, 0);
    uint32_t b = submit(&q, false, err, sizeof err, 0, 2, a, x);
    set_state(&q, a, JOB_COMPLETED);
    pthread_mutex_lock(&q.lock);
    assert_int_equal(queue_remove(&q, a, err, sizeof err), 0);
    assert_int_equal(find(&q, b)->after_done.n, 1);
    assert_int_equal(find(&q, b)->after_done.id[0], a);
    char why[128];
    queue_deps_waiting(&q, find(&q, b), why, sizeof why);
    assert_string_equal(why, "waiting for 2");
    pthread_mutex_unlock(&q.lock);
    queue_close(&q);

    /* Reopened: a's outcome is b's to remember.  x's directory is lost. */
    char path[256];
    snprintf(path, sizeof path, "rm -rf %s/jobs/%u", td_path, x);
    assert_int_equal(system(path), 0);
    open_queue(&q);
    assert_int_equal(find(&q, b)->after_done.n, 1);
    if (find(&q, b)->state != JOB_CANCELLED)
        fail_msg("job %u: %s: %s", b, job_state_name(find(&q, b)->state), find(&q, b)->reason);
    assert_string_equal(find(&q, b)->reason, "dependency 2 is gone without a record of its outcome");
    queue_close(&q);
}

/* ---- the state file --------------------------------------------------------------- */

static void expect_parse_error(const char *lines, const char *want)
{
    job j = {0};
    j.id = 7;
    strcpy(j.name, "t");
    strcpy(j.user, "alice");
    strcpy(j.device, "cpu0");
    size_t len;
    char *base = queue_format_state(&j, &len);
    assert_non_null(base);
    size_t n = strlen(lines);
    char *t = malloc(len + n);
    assert_non_null(t);
    /* The base's own after, after_done and held lines go; `lines` replace them. */
    size_t k = 0;
    for (const char *p = base; p < base + len;) {
        const char *nl = memchr(p, '\n', (size_t)(base + len - p));
        size_t ln = (size_t)(nl - p) + 1;
        if (strncmp(p, "after=", 6) != 0 && strncmp(p, "after_done=", 11) != 0 && strncmp(p, "held=", 5) != 0) {
            memcpy(t + k, p, ln);
            k += ln;
        }
        p += ln;
    }
    memcpy(t + k, lines, n);
    char err[512] = "";
    job out;
    int rc = queue_parse_state(t, k + n, 7, &out, err, sizeof err);
    if (want) {
        if (rc == 0 || !strstr(err, want))
            fail_msg("'%s': got %d '%s', want '%s'", lines, rc, err, want);
    } else if (rc != 0) {
        fail_msg("'%s': %s", lines, err);
    }
    free(t);
    free(base);
}

static void test_state_lines(void **state)
{
    (void)state;
    job j = {0};
    j.id = 7;
    j.after = (queue_ids){.n = 3, .id = {1, 4, 6}};
    j.after_done = (queue_ids){.n = 1, .id = {4}};
    j.held = true;
    size_t len;
    char *t = queue_format_state(&j, &len);
    assert_non_null(t);
    assert_non_null(strstr(t, "\nafter=1,4,6\nafter_done=4\nheld=1\n"));
    job back;
    char err[256];
    assert_int_equal(queue_parse_state(t, len, 7, &back, err, sizeof err), 0);
    assert_memory_equal(&back.after, &j.after, sizeof j.after);
    assert_memory_equal(&back.after_done, &j.after_done, sizeof j.after_done);
    assert_true(back.held);
    free(t);

    expect_parse_error("", NULL); /* a state file from before: none, not held */
    expect_parse_error("after=\nafter_done=\nheld=0\n", NULL);
    expect_parse_error("after=7\n", "after: job 7 is not one before job 7");
    expect_parse_error("after=0\n", "after: job 0 is not one before job 7");
    expect_parse_error("after=3,2\n", "after: job 2 is out of order");
    expect_parse_error("after=2,2\n", "after: job 2 is out of order");
    expect_parse_error("after=1,\n", "after: a comma at the end");
    expect_parse_error("after=1,,2\n", "after: '' is not a number");
    expect_parse_error("after= 1\n", "after: ' 1' is not a number");
    expect_parse_error("after=1\nafter_done=2\n", "after_done: job 2 is not one of after");
    expect_parse_error("after_done=1\n", "after_done: job 1 is not one of after");
    expect_parse_error("held=2\n", "held: '2' is not 0 or 1");
    expect_parse_error("held=\n", "held: '' is not 0 or 1");
}

static void test_at_most_sixteen(void **state)
{
    (void)state;
    char line[256] = "after=";
    size_t n = strlen(line);
    for (int i = 1; i <= QUEUE_AFTER_MAX + 1; i++)
        n += (size_t)snprintf(line + n, sizeof line - n, "%s%d", i > 1 ? "," : "", i);
    snprintf(line + n, sizeof line - n, "\n");
    /* Ids 1..17 need a job above 17. */
    job j = {0};
    j.id = 30;
    size_t len;
    char *base = queue_format_state(&j, &len);
    char *at = strstr(base, "after=");
    char *end = strchr(at, '\n') + 1;
    char t[16384];
    size_t k = (size_t)(at - base);
    memcpy(t, base, k);
    memcpy(t + k, line, strlen(line));
    memcpy(t + k + strlen(line), end, (size_t)(base + len - end));
    size_t tl = k + strlen(line) + (size_t)(base + len - end);
    job out;
    char err[256];
    assert_int_equal(queue_parse_state(t, tl, 30, &out, err, sizeof err), -1);
    assert_non_null(strstr(err, "after: more than 16 jobs"));
    free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_submit_checks_dependencies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_next_skips_waiting_and_held, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failure_cancels_the_chain, setup, teardown),
        cmocka_unit_test_setup_teardown(test_removed_dependency, setup, teardown),
        cmocka_unit_test(test_state_lines),
        cmocka_unit_test(test_at_most_sixteen),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
