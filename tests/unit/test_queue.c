/* test_queue.c — the job queue's state files: what queue_persist writes
 * parses back to the same job, every kind of damage is an error naming the
 * line and key, and queue_open skips a damaged job (saying which file, line
 * and key) while still reserving its id. */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <cmocka.h>

#include "base/log.h"
#include "jobs/queue.h"
#include "tmpdir.h"

static int setup(void **state)
{
    (void)state;
    return td_make("queue");
}

static int teardown(void **state)
{
    (void)state;
    return td_remove();
}

/* ---- helpers ------------------------------------------------------------------------ */

/* Job 7 as a run of it might leave it; lines: 1 id, 2 name, 3 uid, 4 gid,
 * 5 user, 6 state, 7 priority, 8 seq, 9-11 times, 12 device, 13 reason,
 * 14 source, 15 resumes. */
static void base_job(job *j, uint32_t id)
{
    memset(j, 0, sizeof *j);
    j->id = id;
    strcpy(j->name, "tiny");
    j->uid = 1000;
    j->gid = 1000;
    strcpy(j->user, "alice");
    j->state = JOB_COMPLETED;
    j->priority = 5;
    j->seq = id;
    j->submitted_at = 1712345678.5;
    j->started_at = 1712345679.25;
    j->finished_at = 1712345680.125;
    strcpy(j->device, "cpu0");
    strcpy(j->source, "/home/alice/tiny.cfg");
    j->resumes = 2;
    j->umask = 027;
}

static char *base_text(uint32_t id, size_t *len)
{
    job j;
    base_job(&j, id);
    char *t = queue_format_state(&j, len);
    assert_non_null(t);
    return t;
}

/* "LINE: rest" where LINE is `past` lines after the base text's last. */
static const char *past_end(char *buf, size_t len, int past, const char *rest)
{
    size_t n;
    char *t = base_text(7, &n);
    int lines = 0;
    for (size_t i = 0; i < n; i++)
        lines += t[i] == '\n';
    free(t);
    snprintf(buf, len, "%d: %s", lines + past, rest);
    return buf;
}

/* Job 7's text with the line of `key` replaced by rep[0..rep_len) (which
 * carries its own newline; an empty one deletes the line).  malloc'd. */
static char *edit(const char *key, const char *rep, size_t rep_len, size_t *len)
{
    size_t n;
    char *t = base_text(7, &n);
    char want[32];
    snprintf(want, sizeof want, "%s=", key);
    char *at = t;
    while (strncmp(at, want, strlen(want)) != 0) {
        at = strchr(at, '\n');
        assert_non_null(at);
        at++;
    }
    char *end = strchr(at, '\n') + 1;
    char *out = malloc(n + rep_len + 1);
    assert_non_null(out);
    size_t pre = (size_t)(at - t), post = n - (size_t)(end - t);
    memcpy(out, t, pre);
    memcpy(out + pre, rep, rep_len);
    memcpy(out + pre + rep_len, end, post);
    *len = pre + rep_len + post;
    out[*len] = '\0';
    free(t);
    return out;
}

static void assert_same_job(const job *a, const job *b)
{
    assert_int_equal(a->id, b->id);
    assert_string_equal(a->name, b->name);
    assert_int_equal(a->uid, b->uid);
    assert_int_equal(a->gid, b->gid);
    assert_string_equal(a->user, b->user);
    assert_int_equal(a->state, b->state);
    assert_true(a->priority == b->priority);
    assert_true(a->seq == b->seq);
    assert_true(a->submitted_at == b->submitted_at);
    assert_true(a->started_at == b->started_at);
    assert_true(a->finished_at == b->finished_at);
    assert_string_equal(a->device, b->device);
    assert_string_equal(a->reason, b->reason);
    assert_string_equal(a->source, b->source);
    assert_int_equal(a->resumes, b->resumes);
    assert_int_equal(a->umask, b->umask);
    const double da[] = {a->prog.loss, a->prog.val_loss, a->prog.val_accuracy, a->prog.units_per_s, a->prog.elapsed_s};
    const double db[] = {b->prog.loss, b->prog.val_loss, b->prog.val_accuracy, b->prog.units_per_s, b->prog.elapsed_s};
    for (size_t i = 0; i < sizeof da / sizeof da[0]; i++)
        if (isnan(da[i]) ? !isnan(db[i]) : memcmp(&da[i], &db[i], sizeof(double)) != 0)
            fail_msg("progress double %zu: %.17g != %.17g", i, da[i], db[i]);
    assert_true(a->prog.step == b->prog.step);
    assert_int_equal(a->prog.micro, b->prog.micro);
    assert_int_equal(a->prog.accum, b->prog.accum);
    assert_int_equal(a->prog.micro_max, b->prog.micro_max);
    assert_int_equal(a->prog.micro_fit, b->prog.micro_fit);
    assert_true(a->prog.oom_recoveries == b->prog.oom_recoveries);
    assert_true(a->prog.batch_changes == b->prog.batch_changes);
    assert_int_equal(a->prog.change_from, b->prog.change_from);
    assert_int_equal(a->prog.change_to, b->prog.change_to);
    assert_true(a->prog.change_step == b->prog.change_step);
    assert_string_equal(a->prog.change_reason, b->prog.change_reason);
}

/* Parsing text[0..len) for directory want_id fails with an error that
 * contains `want`, and leaves the output alone. */
static void expect_error_in(const char *text, size_t len, uint32_t want_id, const char *want)
{
    static job j, canary;
    memset(&j, 0x5A, sizeof j);
    memset(&canary, 0x5A, sizeof canary);
    char err[512] = "";
    if (queue_parse_state(text, len, want_id, &j, err, sizeof err) != -1)
        fail_msg("parsed, but want an error containing '%s'", want);
    if (!strstr(err, want))
        fail_msg("got '%s', want it to contain '%s'", err, want);
    if (memcmp(&j, &canary, sizeof j) != 0)
        fail_msg("the job changed on a failed parse ('%s')", err);
}

/* Job 7 with the line of `key` replaced by `line` (a C string). */
static void expect_edit_error(const char *key, const char *line, const char *want)
{
    size_t len;
    char *t = edit(key, line, strlen(line), &len);
    expect_error_in(t, len, 7, want);
    free(t);
}

/* ---- round trips -------------------------------------------------------------------- */

static void test_round_trip_through_persist(void **state)
{
    (void)state;
    queue q;
    char err[512];
    if (queue_open(&q, td_path, err, sizeof err) != 0)
        fail_msg("%s", err);
    job j;
    base_job(&j, 7);
    /* Exactly 63 bytes, the most name holds: backslashes, newlines and the
     * escapes' own letters, so a parser that counted escaped bytes, or
     * unescaped "\\n" as a newline, would differ. */
    const char *piece = "a\\b\nc\\n=d\\\\";
    size_t pl = strlen(piece), k = 0;
    while (k < sizeof j.name - 1) {
        j.name[k] = piece[k % pl];
        k++;
    }
    j.name[k] = '\0';
    strcpy(j.user, "\\");
    strcpy(j.reason, "line one\nline two\\\n\n\\n literally, tab\t, cr\r, =, \xc3\xa9\\");
    strcpy(j.device, "cuda:0123456789"); /* 15 of 15 */
    memset(j.source, '\\', sizeof j.source - 1); /* doubles to 8190 bytes on disk */
    j.source[sizeof j.source - 1] = '\0';
    j.uid = UINT32_MAX - 1;
    j.gid = 0;
    j.state = JOB_RUNNING;
    j.priority = INT64_MIN;
    j.seq = UINT64_MAX;
    j.submitted_at = 0;
    j.started_at = 1712345678.123456;
    j.finished_at = 999999999999.999;
    j.resumes = UINT32_MAX;
    /* A finished job's results, exactly: %.17g round-trips any double. */
    j.prog.step = UINT64_MAX;
    j.prog.loss = 0.1 + 0.2;
    j.prog.val_loss = -1.5e-300;
    j.prog.val_accuracy = NAN;
    j.prog.units_per_s = 1.7976931348623157e308;
    j.prog.elapsed_s = 4.9406564584124654e-324;
    j.prog.micro = UINT32_MAX;
    j.prog.accum = 1;
    j.prog.micro_max = 7;
    j.prog.micro_fit = 9;
    j.prog.oom_recoveries = 3;
    j.prog.batch_changes = UINT64_MAX;
    j.prog.change_from = 16;
    j.prog.change_to = 8;
    j.prog.change_step = 1234;
    strcpy(j.prog.change_reason, "pressure");

    char dir[128], path[160];
    snprintf(dir, sizeof dir, "%s/7", q.dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    if (queue_persist(&q, &j, err, sizeof err) != 0)
        fail_msg("%s", err);
    snprintf(path, sizeof path, "%s/state", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char text[1 << 16];
    size_t len = fread(text, 1, sizeof text, f);
    fclose(f);
    assert_true(len > 8190 && len < sizeof text);

    static job back;
    if (queue_parse_state(text, len, 7, &back, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_same_job(&back, &j);

    /* And the parsed job writes the same bytes again. */
    size_t len2;
    char *again = queue_format_state(&back, &len2);
    assert_non_null(again);
    assert_int_equal(len2, len);
    assert_memory_equal(again, text, len);
    free(again);
    queue_close(&q);
}

static void test_round_trip_every_state(void **state)
{
    (void)state;
    for (int s = 0; s < JOB_STATE_COUNT; s++) {
        job j;
        base_job(&j, 3);
        j.state = (job_state)s;
        size_t len;
        char *t = queue_format_state(&j, &len);
        assert_non_null(t);
        job back;
        char err[512];
        if (queue_parse_state(t, len, 3, &back, err, sizeof err) != 0)
            fail_msg("%s: %s", job_state_name(j.state), err);
        assert_same_job(&back, &j);
        free(t);
    }
}

/* ---- errors ------------------------------------------------------------------------- */

static void test_numbers(void **state)
{
    (void)state;
    expect_edit_error("uid", "uid=abc\n", "3: uid: 'abc' is not a number");
    expect_edit_error("uid", "uid=\n", "3: uid: '' is not a number");
    expect_edit_error("uid", "uid=-1\n", "3: uid: '-1' is not a number");
    expect_edit_error("uid", "uid= 5\n", "3: uid: ' 5' is not a number");
    expect_edit_error("uid", "uid=+5\n", "3: uid: '+5' is not a number");
    expect_edit_error("uid", "uid=0x10\n", "3: uid: '0x10' is not a number");
    expect_edit_error("uid", "uid=1000 \n", "3: uid: '1000 ' is not a number");
    /* (uid_t)-1 is "no change" to setfsuid, never an owner. */
    expect_edit_error("uid", "uid=4294967295\n", "3: uid: '4294967295' is out of range (0 to 4294967294)");
    expect_edit_error("uid", "uid=4294967296\n", "3: uid: '4294967296' is out of range");
    expect_edit_error("gid", "gid=99999999999999999999999\n", "4: gid: '99999999999999999999999' is out of range");
    expect_edit_error("gid", "gid=4294967295\n", "4: gid: '4294967295' is out of range");
    expect_edit_error("resumes", "resumes=4294967296\n", "15: resumes: '4294967296' is out of range");
    expect_edit_error("seq", "seq=18446744073709551616\n", "8: seq: '18446744073709551616' is out of range");
    expect_edit_error("priority", "priority=9223372036854775808\n", "7: priority: '9223372036854775808' is out of range");
    expect_edit_error("priority", "priority=-9223372036854775809\n", "7: priority: '-9223372036854775809' is out of range");
    expect_edit_error("priority", "priority=-\n", "7: priority: '-' is not a number");
    expect_edit_error("priority", "priority=--1\n", "7: priority: '--1' is not a number");
    expect_edit_error("submitted_at", "submitted_at=1e9\n", "9: submitted_at: '1e9' is not a time");
    expect_edit_error("submitted_at", "submitted_at=nan\n", "9: submitted_at: 'nan' is not a time");
    expect_edit_error("submitted_at", "submitted_at=inf\n", "9: submitted_at: 'inf' is not a time");
    expect_edit_error("started_at", "started_at=-1.0\n", "10: started_at: '-1.0' is not a time");
    expect_edit_error("started_at", "started_at=.5\n", "10: started_at: '.5' is not a time");
    expect_edit_error("started_at", "started_at=5.\n", "10: started_at: '5.' is not a time");
    expect_edit_error("finished_at", "finished_at=1.1234567\n", "11: finished_at: '1.1234567' is not a time");
    expect_edit_error("finished_at", "finished_at=1000000000000.0\n", "11: finished_at: '1000000000000.0' is out of range");
    /* Rounds to 1e12 as a double, so it would not survive the next persist. */
    expect_edit_error("finished_at", "finished_at=999999999999.999999\n",
                      "11: finished_at: '999999999999.999999' is out of range (times are below 1000000000000)");
    expect_edit_error("state", "state=paused\n", "6: state: 'paused' is not a job state");
    expect_edit_error("state", "state=queuedx\n", "6: state: 'queuedx' is not a job state");
    expect_edit_error("state", "state=\n", "6: state: '' is not a job state");

    /* The extremes that are in range parse. */
    const char *ok[][2] = {{"uid", "uid=4294967294\n"},
                           {"priority", "priority=-9223372036854775808\n"},
                           {"priority", "priority=9223372036854775807\n"},
                           {"seq", "seq=18446744073709551615\n"},
                           {"submitted_at", "submitted_at=999999999999.999\n"},
                           {"submitted_at", "submitted_at=12\n"}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        size_t len;
        char *t = edit(ok[i][0], ok[i][1], strlen(ok[i][1]), &len);
        job j;
        char err[512];
        if (queue_parse_state(t, len, 7, &j, err, sizeof err) != 0)
            fail_msg("%s: %s", ok[i][1], err);
        free(t);
    }
}

/* A state file written before the results were kept still loads, with
 * none; malformed results are damage like any other field's. */
static void test_progress_fields(void **state)
{
    (void)state;
    size_t n;
    char *t = base_text(7, &n);
    char *cut = strstr(t, "step=");
    assert_non_null(cut);
    static job j;
    char err[512];
    if (queue_parse_state(t, (size_t)(cut - t), 7, &j, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_true(j.prog.step == 0);
    assert_true(isnan(j.prog.loss) && isnan(j.prog.val_loss) && isnan(j.prog.val_accuracy));
    free(t);
    expect_edit_error("loss", "loss=inf\n", ": loss: 'inf' is not a number (or nan)");
    expect_edit_error("loss", "loss=0x1p3\n", ": loss: '0x1p3' is not a number");
    expect_edit_error("loss", "loss= 1\n", ": loss: ' 1' is not a number");
    expect_edit_error("loss", "loss=+1\n", ": loss: '+1' is not a number");
    expect_edit_error("loss", "loss=1e999\n", ": loss: '1e999' is not a number");
    expect_edit_error("loss", "loss=\n", ": loss: '' is not a number");
    expect_edit_error("loss", "loss=-nan\n", ": loss: '-nan' is not a number");
    expect_edit_error("step", "step=-1\n", ": step: '-1' is not a number");
}

/* The umask a job's outputs get: octal as written; a file from before it
 * was kept gives 022; anything else is damage. */
static void test_umask_field(void **state)
{
    (void)state;
    static job j;
    char err[512];
    size_t len;
    char *t = base_text(7, &len);
    assert_non_null(strstr(t, "\numask=0027\n"));
    free(t);
    const struct {
        const char *line;
        mode_t want;
    } ok[] = {{"", 022}, {"umask=0\n", 0}, {"umask=777\n", 0777}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        t = edit("umask", ok[i].line, strlen(ok[i].line), &len);
        if (queue_parse_state(t, len, 7, &j, err, sizeof err) != 0)
            fail_msg("'%s': %s", ok[i].line, err);
        assert_int_equal(j.umask, ok[i].want);
        free(t);
    }
    const char *bad[] = {"01000", "0078", "-1", "", "00777", "0x1f"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char line[32], want[64];
        snprintf(line, sizeof line, "umask=%s\n", bad[i]);
        snprintf(want, sizeof want, ": umask: '%s' is not a umask (octal, 0 to 0777)", bad[i]);
        expect_edit_error("umask", line, want);
    }
}

/* The state directory: made private, refused where another could have
 * made or may change it (the ownership cases need other users: see
 * tests/integration/test_hostile_ident.py). */
static void test_prepare_dir(void **state)
{
    (void)state;
    char path[128], want[256], err[1024];
    struct stat st;
    snprintf(path, sizeof path, "%s/a/b/state//", td_path);
    assert_int_equal(queue_prepare_dir(path, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/a/b/state", td_path);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0700);

    assert_int_equal(chmod(path, 0750), 0); /* readable by a group is fine */
    assert_int_equal(queue_prepare_dir(path, err, sizeof err), 0);
    assert_int_equal(chmod(path, 0770), 0);
    assert_int_equal(queue_prepare_dir(path, err, sizeof err), -1);
    snprintf(want, sizeof want, "state directory %s is writable by its group (mode 0770)", path);
    assert_non_null(strstr(err, want));

    snprintf(path, sizeof path, "%s/a", td_path);
    assert_int_equal(chmod(path, 0707), 0);
    snprintf(path, sizeof path, "%s/a/b/state", td_path);
    assert_int_equal(queue_prepare_dir(path, err, sizeof err), -1);
    snprintf(want, sizeof want, "state directory: %s/a is writable by others (mode 0707), who could replace %s/a/b",
             td_path, td_path);
    assert_non_null(strstr(err, want));

    snprintf(path, sizeof path, "%s/file", td_path);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(path, sizeof path, "%s/file/state", td_path);
    assert_int_equal(queue_prepare_dir(path, err, sizeof err), -1);
    snprintf(want, sizeof want, "state directory: %s/file is not a directory", td_path);
    assert_non_null(strstr(err, want));
    assert_int_equal(queue_prepare_dir("", err, sizeof err), -1);
    assert_non_null(strstr(err, "state directory: '' is empty"));
}

static void test_keys(void **state)
{
    (void)state;
    size_t len;
    /* A missing uid must not become root. */
    char want[64];
    char *t = edit("uid", "", 0, &len);
    expect_error_in(t, len, 7, past_end(want, sizeof want, 0, "uid: missing"));
    free(t);
    t = edit("resumes", "", 0, &len);
    expect_error_in(t, len, 7, past_end(want, sizeof want, 0, "resumes: missing"));
    free(t);
    expect_error_in("", 0, 7, "1: id: missing");

    /* Nor may a second uid line override the first. */
    t = base_text(7, &len);
    char *t2 = malloc(len + 16);
    memcpy(t2, t, len);
    memcpy(t2 + len, "uid=0\n", 6);
    expect_error_in(t2, len + 6, 7, past_end(want, sizeof want, 1, "uid: given twice (first on line 3)"));
    memcpy(t2 + len, "color=red\n", 10);
    expect_error_in(t2, len + 10, 7, past_end(want, sizeof want, 1, "'color' is not a key"));
    memcpy(t2 + len, "\n", 1);
    expect_error_in(t2, len + 1, 7, past_end(want, sizeof want, 1, "an empty line"));
    free(t2);
    free(t);

    expect_edit_error("user", "user\n", "5: 'user' is not key=value");
    expect_edit_error("user", "=alice\n", "5: '' is not a key");
    expect_edit_error("user", "User=alice\n", "5: 'User' is not a key");
    expect_edit_error("id", "id=8\n", "1: id: 8 does not match the directory's id 7");
    t = base_text(7, &len);
    expect_error_in(t, len, 70, "1: id: 7 does not match the directory's id 70");
    free(t);
}

static void test_strings(void **state)
{
    (void)state;
    char line[1200];
    /* 64 bytes where name holds 63. */
    snprintf(line, sizeof line, "name=%064d\n", 0);
    expect_edit_error("name", line, "2: name: longer than the 63 bytes this field holds");
    expect_edit_error("device", "device=cuda:01234567890\n", "12: device: longer than the 15 bytes");
    memset(line, 'r', sizeof line);
    memcpy(line, "reason=", 7);
    strcpy(line + 7 + 1024, "\n");
    expect_edit_error("reason", line, "13: reason: longer than the 1023 bytes");
    /* Escapes count once: 62 letters and one escaped newline fit. */
    snprintf(line, sizeof line, "name=%062d\\n\n", 0);
    size_t len;
    char *t = edit("name", line, strlen(line), &len);
    job j;
    char err[512];
    if (queue_parse_state(t, len, 7, &j, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(strlen(j.name), 63);
    assert_int_equal(j.name[62], '\n');
    free(t);

    expect_edit_error("name", "name=a\\tb\n", "2: name: unknown escape '\\t'");
    expect_edit_error("name", "name=a\\\n", "2: name: a backslash at the end of the value");
    expect_edit_error("source", "source=\\x41\n", "14: source: unknown escape '\\x'");
}

static void test_nul_and_truncation(void **state)
{
    (void)state;
    size_t len;
    char *t = edit("name", "name=ti\0ny\n", 11, &len);
    expect_error_in(t, len, 7, "2: name: a NUL byte in the value");
    free(t);
    t = edit("uid", "uid=1000\0\n", 10, &len);
    expect_error_in(t, len, 7, "3: uid: a NUL byte in the value");
    free(t);
    t = edit("user", "us\0er=alice\n", 12, &len);
    expect_error_in(t, len, 7, "5: a NUL byte");
    free(t);

    /* Cut inside the last line, inside a middle line, and at a line end. */
    t = base_text(7, &len);
    char want[96], last[64];
    /* The last line's key, whichever field the table ends with. */
    const char *k = t + len - 1;
    while (k > t && k[-1] != '\n')
        k--;
    snprintf(last, sizeof last, "%.*s: no newline at the end (the file is cut short)", (int)strcspn(k, "="), k);
    expect_error_in(t, len - 1, 7, past_end(want, sizeof want, 0, last));
    char *at = strstr(t, "source=") + 10;
    expect_error_in(t, (size_t)(at - t), 7, "14: source: no newline at the end");
    at = strstr(t, "uid=");
    expect_error_in(t, (size_t)(at - t), 7, "3: uid: missing");
    free(t);
}

/* A finished job's kept peaks read back; a file from before accounting
 * (no accounted_at) counts as accounted at its end, so that a restart
 * does not account old jobs late. */
static void test_kept_memory_and_accounted(void **state)
{
    (void)state;
    job j, back;
    base_job(&j, 7);
    j.mem_peak = 123 * 512;
    j.mem_tag_peak[POOL_TAG_PARAMS] = 100 * 512;
    j.mem_tag_peak[POOL_TAG_OTHER] = 3 * 512;
    j.mem_tag_peak[POOL_TAG_FROZEN] = 7 * 512;
    j.finished_at = 1700000000.5;
    j.accounted_at = 0;
    size_t len;
    char *t = queue_format_state(&j, &len);
    assert_non_null(t);
    assert_non_null(strstr(t, "\nmem_peak=62976\nmem_peak_params=51200\n"));
    assert_non_null(strstr(t, "\nmem_peak_other=1536\nmem_peak_frozen=3584\naccounted_at=0.000000\n"));
    char err[256];
    if (queue_parse_state(t, len, 7, &back, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_true(back.mem_peak == j.mem_peak && back.accounted_at == 0);
    assert_memory_equal(back.mem_tag_peak, j.mem_tag_peak, sizeof j.mem_tag_peak);
    free(t);
    t = edit("accounted_at", "", 0, &len);
    if (queue_parse_state(t, len, 7, &back, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_true(back.accounted_at == back.finished_at);
    free(t);
    expect_edit_error("mem_peak_grads", "mem_peak_grads=-1\n", "mem_peak_grads: '-1' is not a number");
}

static void test_next_id(void **state)
{
    (void)state;
    uint64_t id = 99;
    char err[256];
    assert_int_equal(queue_parse_next_id("12\n", 3, &id, err, sizeof err), 0);
    assert_int_equal(id, 12);
    assert_int_equal(queue_parse_next_id("4294967295\n", 11, &id, err, sizeof err), 0);
    assert_int_equal(id, UINT32_MAX);
    /* One past the last id: what a queue that has given them all writes. */
    assert_int_equal(queue_parse_next_id("4294967296\n", 11, &id, err, sizeof err), 0);
    assert_int_equal(id, QUEUE_ID_END);
    const char *bad[][2] = {
        {"", "1: '' is not a job id"},
        {"\n", "1: '' is not a job id"},
        {"abc\n", "1: 'abc' is not a job id"},
        {"0\n", "1: '0' is not a job id"},
        {"-3\n", "1: '-3' is not a job id"},
        {"12 \n", "1: '12 ' is not a job id"},
        {"12\n\n", "1: '12?' is not a job id"},
        {"12", "1: no newline at the end"},
        {"4294967297\n", "1: '4294967297' is out of range (1 to 4294967296)"},
        {"18446744073709551616\n", "1: '18446744073709551616' is out of range"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        id = 99;
        err[0] = '\0';
        assert_int_equal(queue_parse_next_id(bad[i][0], strlen(bad[i][0]), &id, err, sizeof err), -1);
        if (!strstr(err, bad[i][1]))
            fail_msg("'%s': got '%s', want '%s'", bad[i][0], err, bad[i][1]);
        assert_int_equal(id, 99);
    }
    assert_int_equal(queue_parse_next_id("1\0\n", 3, &id, err, sizeof err), -1);
}

/* ---- queue_open --------------------------------------------------------------------- */

static char logged[8192];

static int capture(void *user, const struct iovec *iov, int n)
{
    (void)user;
    for (int i = 0; i < n; i++)
        if (iov[i].iov_len > 8 && memcmp(iov[i].iov_base, "MESSAGE=", 8) == 0) {
            size_t have = strlen(logged);
            snprintf(logged + have, sizeof logged - have, "%.*s\n", (int)iov[i].iov_len - 8,
                     (const char *)iov[i].iov_base + 8);
        }
    return 0;
}

static void put_file(const char *path, const char *text, size_t len)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* jobs/ID/state holding text[0..len). */
static void put_job(const char *jobs, uint32_t id, const char *text, size_t len)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%u", jobs, id);
    assert_int_equal(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/%u/state", jobs, id);
    put_file(path, text, len);
}

/* jobs/ID/state as queue_persist would write j's record. */
static void put_state(const char *jobs, const job *j)
{
    size_t len;
    char *t = queue_format_state(j, &len);
    assert_non_null(t);
    put_job(jobs, j->id, t, len);
    free(t);
}

static void open_capturing(queue *q)
{
    logged[0] = '\0';
    log_set_sink(capture, NULL);
    char err[512];
    int rc = queue_open(q, td_path, err, sizeof err);
    log_set_sink(NULL, NULL);
    if (rc != 0)
        fail_msg("%s", err);
}

static void expect_logged(const char *want)
{
    if (!strstr(logged, want))
        fail_msg("the log lacks '%s'; it has:\n%s", want, logged);
}

static void test_open_skips_damaged_jobs(void **state)
{
    (void)state;
    char jobs[128], path[192], want[256];
    snprintf(jobs, sizeof jobs, "%s/jobs", td_path);
    assert_int_equal(mkdir(jobs, 0700), 0);

    size_t len;
    char *t = base_text(1, &len);
    put_job(jobs, 1, t, len);
    free(t);

    t = base_text(2, &len);
    char *uid = strstr(t, "uid=1000\n");
    memcpy(uid, "uid=abc", 7); /* "uid=abc0\n" */
    put_job(jobs, 2, t, len);
    free(t);

    t = base_text(3, &len);
    put_job(jobs, 3, t, (size_t)(strstr(t, "source=") + 10 - t));
    free(t);

    /* Stale, as after a crash between a job's mkdir and next_id (it cannot
     * happen in that order today, but the scan must not depend on it). */
    snprintf(path, sizeof path, "%s/next_id", jobs);
    put_file(path, "2\n", 2);

    queue q;
    open_capturing(&q);
    assert_int_equal(q.n, 1);
    job *j = queue_find(&q, 1);
    assert_non_null(j);
    job want_j;
    base_job(&want_j, 1);
    assert_same_job(j, &want_j);
    assert_null(queue_find(&q, 2));
    assert_null(queue_find(&q, 3));
    assert_int_equal(q.next_id, 4);

    snprintf(want, sizeof want, "queue: %s/2/state:3: uid: 'abc0' is not a number; job 2 skipped", jobs);
    expect_logged(want);
    snprintf(want, sizeof want, "queue: %s/3/state:14: source: no newline at the end", jobs);
    expect_logged(want);
    expect_logged("job 3 skipped");
    queue_close(&q);
}

static void test_open_with_bad_next_id(void **state)
{
    (void)state;
    char jobs[128], path[192], want[256];
    snprintf(jobs, sizeof jobs, "%s/jobs", td_path);
    assert_int_equal(mkdir(jobs, 0700), 0);
    size_t len;
    char *t = base_text(5, &len);
    put_job(jobs, 5, t, len);
    free(t);

    /* No next_id at all: a fresh state dir, nothing to say. */
    queue q;
    open_capturing(&q);
    assert_int_equal(q.next_id, 6);
    assert_null(strstr(logged, "next_id"));
    queue_close(&q);

    snprintf(path, sizeof path, "%s/next_id", jobs);
    put_file(path, "banana\n", 7);
    open_capturing(&q);
    assert_int_equal(q.n, 1);
    assert_int_equal(q.next_id, 6);
    snprintf(want, sizeof want,
             "queue: %s/next_id:1: 'banana' is not a job id (1 to 4294967296); the next id comes from the job "
             "directories",
             jobs);
    expect_logged(want);
    queue_close(&q);

    /* A good one further on than the directories is kept: ids are never
     * reused, even those of jobs whose directory is gone. */
    put_file(path, "40\n", 3);
    open_capturing(&q);
    assert_int_equal(q.next_id, 40);
    queue_close(&q);
}

/* A job whose job.cfg is gone: a finished one stays, marked and logged; a
 * queued one cannot run and fails, saying why. */
static void test_open_without_job_file(void **state)
{
    (void)state;
    char jobs[128], want[512];
    snprintf(jobs, sizeof jobs, "%s/jobs", td_path);
    assert_int_equal(mkdir(jobs, 0700), 0);
    job j;
    base_job(&j, 1);
    put_state(jobs, &j);
    base_job(&j, 2);
    j.state = JOB_QUEUED;
    j.started_at = j.finished_at = 0;
    put_state(jobs, &j);
    /* And one whose kept copy is damaged: its source file is what the
     * parser names, so the log names the copy it read. */
    base_job(&j, 3);
    put_state(jobs, &j);
    char cfgp[256];
    snprintf(cfgp, sizeof cfgp, "%s/3/job.cfg", jobs);
    FILE *f = fopen(cfgp, "w");
    assert_non_null(f);
    fputs("this is not a job file\n", f);
    fclose(f);

    queue q;
    open_capturing(&q);
    assert_int_equal(q.n, 3);
    snprintf(want, sizeof want, "syntax error (expected [section] or key = value) (its job file as kept in %s); "
             "listed without its settings", cfgp);
    expect_logged(want);
    job *done = queue_find(&q, 1), *queued = queue_find(&q, 2);
    assert_non_null(done);
    assert_non_null(queued);
    assert_true(done->cfg_unread);
    assert_int_equal(done->state, JOB_COMPLETED);
    snprintf(want, sizeof want,
             "queue: job 1 (tiny, completed): cannot read %s/1/job.cfg: No such file or directory; listed without "
             "its settings",
             jobs);
    expect_logged(want);
    assert_true(queued->cfg_unread);
    assert_int_equal(queued->state, JOB_FAILED);
    snprintf(want, sizeof want, "at restart: cannot read %s/2/job.cfg: No such file or directory", jobs);
    assert_string_equal(queued->reason, want);
    expect_logged("queue: job 2 (tiny) failed at restart: cannot read");
    queue_close(&q);

    /* The failure was persisted: the next start reads it as failed. */
    open_capturing(&q);
    assert_int_equal(queue_find(&q, 2)->state, JOB_FAILED);
    queue_close(&q);
}

/* A finished job is removed whole, its id stays used, and a removal a
 * crash cut short (the tombstone) is finished at the next open. */
static void test_remove(void **state)
{
    (void)state;
    char jobs[128], path[256], err[256];
    snprintf(jobs, sizeof jobs, "%s/jobs", td_path);
    assert_int_equal(mkdir(jobs, 0700), 0);
    for (uint32_t id = 1; id <= 3; id++) {
        job j;
        base_job(&j, id);
        if (id == 2)
            j.state = JOB_QUEUED;
        put_state(jobs, &j);
    }
    snprintf(path, sizeof path, "%s/1/log", jobs);
    put_file(path, "step 1\n", 7);

    queue q;
    open_capturing(&q);
    assert_int_equal(q.n, 3);
    assert_int_equal(queue_remove(&q, 1, err, sizeof err), 0);
    assert_null(queue_find(&q, 1));
    assert_int_equal(q.n, 2);
    snprintf(path, sizeof path, "%s/1", jobs);
    assert_int_not_equal(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/.removed-1", jobs);
    assert_int_not_equal(access(path, F_OK), 0);
    /* Queued (here: failed at restart, its job.cfg missing, so finished)
     * vs not there at all. */
    assert_int_equal(queue_remove(&q, 1, err, sizeof err), -1);
    assert_string_equal(err, "no job 1");
    job *three = queue_find(&q, 3);
    three->state = JOB_RUNNING;
    assert_int_equal(queue_remove(&q, 3, err, sizeof err), -1);
    assert_string_equal(err, "job 3 is running; cancel it first");
    three->state = JOB_COMPLETED;
    assert_int_equal(q.next_id, 4);
    queue_close(&q);

    /* A crash between the rename and the emptying: the tombstone holds
     * files; the next open removes it, and its id is not given again. */
    snprintf(path, sizeof path, "%s/.removed-9", jobs);
    assert_int_equal(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/.removed-9/log", jobs);
    put_file(path, "x\n", 2);
    open_capturing(&q);
    snprintf(path, sizeof path, "%s/.removed-9", jobs);
    assert_int_not_equal(access(path, F_OK), 0);
    assert_int_equal(q.n, 2);
    assert_true(q.next_id >= 10);
    queue_close(&q);
}

/* keep_finished: only jobs that ended more than max_age ago go; queued and
 * running ones stay whatever their age. */
static void test_prune(void **state)
{
    (void)state;
    char jobs[128];
    snprintf(jobs, sizeof jobs, "%s/jobs", td_path);
    assert_int_equal(mkdir(jobs, 0700), 0);
    for (uint32_t id = 1; id <= 3; id++) {
        job j;
        base_job(&j, id); /* finished at 1712345680.125 */
        put_state(jobs, &j);
    }
    queue q;
    open_capturing(&q);
    /* Their job.cfg is missing, so they load as finished; make 2 a live one. */
    queue_find(&q, 2)->state = JOB_RUNNING;
    queue_find(&q, 3)->finished_at += 100;
    double t0 = 1712345680.125;
    assert_int_equal(queue_prune(&q, t0 + 50, 60), 0);
    logged[0] = '\0';
    log_set_sink(capture, NULL);
    assert_int_equal(queue_prune(&q, t0 + 70, 60), 1);
    log_set_sink(NULL, NULL);
    expect_logged("queue: job 1 (tiny) forgotten 70 s after it ended ([daemon] keep_finished)");
    assert_null(queue_find(&q, 1));
    assert_non_null(queue_find(&q, 2));
    assert_non_null(queue_find(&q, 3));
    assert_int_equal(queue_prune(&q, t0 + 1e6, 60), 1);
    assert_int_equal(q.n, 1);
    assert_non_null(queue_find(&q, 2));
    queue_close(&q);
}

/* One queue per state dir: a second open is refused, naming the holder,
 * and succeeds once the first is closed. */
static void test_state_dir_locked(void **state)
{
    (void)state;
    queue a, b;
    char err[512], want[512];
    open_capturing(&a);
    assert_int_equal(queue_open(&b, td_path, err, sizeof err), -1);
    snprintf(want, sizeof want, "state directory %s is in use by another gradd (pid %ld)", td_path, (long)getpid());
    if (!strstr(err, want))
        fail_msg("got '%s'", err);
    queue_close(&a);
    open_capturing(&b);
    queue_close(&b);
}

/* The last id is given, then submit refuses: the id must not wrap to 0 or
 * to 1, whose directory may hold an old job. */
static void test_ids_run_out(void **state)
{
    (void)state;
    char jobs[128], path[192], err[256];
    snprintf(jobs, sizeof jobs, "%s/jobs", td_path);
    assert_int_equal(mkdir(jobs, 0700), 0);
    snprintf(path, sizeof path, "%s/next_id", jobs);
    put_file(path, "4294967295\n", 11);

    queue q;
    open_capturing(&q);
    job_config cfg = {0};
    snprintf(cfg.name, sizeof cfg.name, "last");
    uint32_t id = 0;
    assert_int_equal(queue_submit(&q, &cfg, "x\n", 2, 1000, 1000, 022, "alice", &id, err, sizeof err), 0);
    assert_int_equal(id, UINT32_MAX);
    id = 7;
    assert_int_equal(queue_submit(&q, &cfg, "x\n", 2, 1000, 1000, 022, "alice", &id, err, sizeof err), -1);
    assert_non_null(strstr(err, "every job id (1 to 4294967295) has been given"));
    assert_int_equal(id, 7);
    assert_int_equal(q.n, 1);
    queue_close(&q);

    /* Read back from next_id, and from the directory alone. */
    open_capturing(&q);
    assert_int_equal(q.next_id, QUEUE_ID_END);
    assert_null(strstr(logged, "next_id"));
    assert_non_null(queue_find(&q, UINT32_MAX));
    queue_close(&q);
    assert_int_equal(unlink(path), 0);
    open_capturing(&q);
    assert_int_equal(q.next_id, QUEUE_ID_END);
    assert_int_equal(queue_submit(&q, &cfg, "x\n", 2, 1000, 1000, 022, "alice", &id, err, sizeof err), -1);
    queue_close(&q);
}

/* A state write that fails (a full disk: /dev/full here) is tried again
 * until it lands, so a job's end is never left recorded as running; a
 * submit that cannot be written leaves no half job. */
static void test_full_state_dir(void **state)
{
    (void)state;
    char jobs[128], path[256], err[512];
    snprintf(jobs, sizeof jobs, "%s/jobs", td_path);
    queue q;
    open_capturing(&q);
    log_set_sink(capture, NULL);
    job_config cfg = {0};
    snprintf(cfg.name, sizeof cfg.name, "j");
    uint32_t id = 0;
    assert_int_equal(queue_submit(&q, &cfg, "x\n", 2, 1000, 1000, 022, "alice", &id, err, sizeof err), 0);
    assert_int_equal(id, 1);

    snprintf(path, sizeof path, "%s/1/.state.tmp", jobs);
    assert_int_equal(symlink("/dev/full", path), 0);
    pthread_mutex_lock(&q.lock);
    job *j = queue_find(&q, 1);
    j->state = JOB_CANCELLED;
    queue_persist_or_retry(&q, j, NULL);
    assert_true(j->unsaved && q.any_unsaved);
    pthread_mutex_unlock(&q.lock);
    assert_non_null(strstr(logged, "job 1: cannot record its state"));
    static job back;
    snprintf(path, sizeof path, "%s/1/state", jobs);
    FILE *f = fopen(path, "r");
    static char text[1 << 14];
    size_t n = fread(text, 1, sizeof text, f);
    fclose(f);
    assert_int_equal(queue_parse_state(text, n, 1, &back, err, sizeof err), 0);
    assert_int_equal(back.state, JOB_QUEUED); /* the write did not land */
    /* The disk has room again (the failed write removed its temp file):
     * the next try records it. */
    queue_save_unsaved(&q);
    assert_false(q.any_unsaved);
    f = fopen(path, "r");
    n = fread(text, 1, sizeof text, f);
    fclose(f);
    assert_int_equal(queue_parse_state(text, n, 1, &back, err, sizeof err), 0);
    assert_int_equal(back.state, JOB_CANCELLED);
    assert_non_null(strstr(logged, "job 1: its state is recorded now"));

    /* A submit whose files cannot be written: refused, nothing left. */
    snprintf(path, sizeof path, "%s/2", jobs);
    assert_int_equal(mkdir(path, 0750), 0);
    snprintf(path, sizeof path, "%s/2/.job.cfg.tmp", jobs);
    assert_int_equal(symlink("/dev/full", path), 0);
    assert_int_equal(queue_submit(&q, &cfg, "x\n", 2, 1000, 1000, 022, "alice", &id, err, sizeof err), -1);
    assert_non_null(strstr(err, "the job was not queued: cannot write"));
    snprintf(path, sizeof path, "%s/2", jobs);
    assert_int_not_equal(access(path, F_OK), 0);
    assert_int_equal(q.n, 1);
    assert_int_equal(queue_submit(&q, &cfg, "x\n", 2, 1000, 1000, 022, "alice", &id, err, sizeof err), 0);
    assert_int_equal(id, 3);
    log_set_sink(NULL, NULL);
    queue_close(&q);
}

/* The daemon's shutdown (server_stop) clears q->notify under the lock and
 * then closes the event loop's async handle: from then on no worker may be
 * in the callback or about to make it.  A thread notifying in a loop stands
 * for the workers; the callback counts calls made after the clear.  (With
 * notify read outside the lock, ThreadSanitizer reports the race here.) */
typedef struct {
    queue *q;
    atomic_bool stop, cleared;
    atomic_ulong calls, late;
} notify_shared;

static void count_notify(void *user)
{
    notify_shared *sh = user;
    atomic_fetch_add(&sh->calls, 1);
    if (atomic_load(&sh->cleared))
        atomic_fetch_add(&sh->late, 1);
}

static void *notifier(void *arg)
{
    notify_shared *sh = arg;
    while (!atomic_load(&sh->stop))
        queue_notify(sh->q);
    return NULL;
}

static void test_notify_stops_when_cleared(void **state)
{
    (void)state;
    queue q;
    memset(&q, 0, sizeof q);
    pthread_mutex_init(&q.lock, NULL);
    notify_shared sh = {.q = &q};
    q.notify = count_notify;
    q.notify_user = &sh;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, notifier, &sh), 0);
    while (atomic_load(&sh.calls) < 1000)
        sched_yield();
    pthread_mutex_lock(&q.lock); /* as server_stop does */
    q.notify = NULL;
    q.notify_user = NULL;
    pthread_mutex_unlock(&q.lock);
    atomic_store(&sh.cleared, true); /* ... and then uv_close */
    for (int i = 0; i < 1000; i++)
        sched_yield();
    atomic_store(&sh.stop, true);
    pthread_join(t, NULL);
    assert_int_equal(atomic_load(&sh.late), 0);
    pthread_mutex_destroy(&q.lock);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip_through_persist, setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_state_dir, setup, teardown),
        cmocka_unit_test(test_round_trip_every_state),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_progress_fields),
        cmocka_unit_test(test_umask_field),
        cmocka_unit_test_setup_teardown(test_prepare_dir, setup, teardown),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_nul_and_truncation),
        cmocka_unit_test(test_kept_memory_and_accounted),
        cmocka_unit_test(test_next_id),
        cmocka_unit_test_setup_teardown(test_open_skips_damaged_jobs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_with_bad_next_id, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_without_job_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ids_run_out, setup, teardown),
        cmocka_unit_test_setup_teardown(test_state_dir_locked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prune, setup, teardown),
        cmocka_unit_test(test_notify_stops_when_cleared),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
