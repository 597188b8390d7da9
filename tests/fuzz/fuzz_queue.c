/* fuzz_queue.c — libFuzzer harness for daemon/jobs/queue_state.c: a job's state
 * file as queue_open reads it (queue_parse_state, for the directory of job
 * 7), and the same bytes as a next_id file (queue_parse_next_id).
 * Properties (abort() on violation):
 *   - on failure err is non-empty and starts with "LINE: ", and the output
 *     is untouched;
 *   - on success id is 7, every string is terminated inside its field, the
 *     state is a known one, no uid or gid is (uid_t)-1, the umask has no
 *     bit above 0777, and every time is finite, at least 0 and below 1e12;
 *   - its dependencies are at most QUEUE_AFTER_MAX ids, ascending, each
 *     from 1 to 6 (a job waits only for earlier ones: no cycle), and the
 *     forgotten ones among them are a part of them;
 *   - what parses, written by queue_format_state (what queue_persist
 *     writes), parses back to the same job, and writing that gives the
 *     same bytes again;
 *   - a next_id that parses is 1 to QUEUE_ID_END and reads back from
 *     "%" PRIu64 "\n".
 */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobs/queue.h"

#define CHECK(cond)                                                                                         \
    do {                                                                                                    \
        if (!(cond)) {                                                                                      \
            fprintf(stderr, "fuzz_queue: property failed at %s:%d: %s\n", __FILE__, __LINE__, #cond);       \
            abort();                                                                                        \
        }                                                                                                   \
    } while (0)

enum { WANT_ID = 7 };

static int is_line_error(const char *err)
{
    size_t i = 0;
    while (err[i] >= '0' && err[i] <= '9')
        i++;
    return i > 0 && err[i] == ':' && err[i + 1] == ' ';
}

static int terminated(const char *s, size_t size)
{
    return memchr(s, '\0', size) != NULL;
}

static int time_ok(double t)
{
    return isfinite(t) && t >= 0 && t < 1e12;
}

static void check_same(const job *a, const job *b)
{
    CHECK(a->id == b->id);
    CHECK(strcmp(a->name, b->name) == 0);
    CHECK(a->uid == b->uid && a->gid == b->gid);
    CHECK(strcmp(a->user, b->user) == 0);
    CHECK(a->state == b->state);
    CHECK(a->priority == b->priority && a->seq == b->seq);
    CHECK(a->submitted_at == b->submitted_at);
    CHECK(a->started_at == b->started_at);
    CHECK(a->finished_at == b->finished_at);
    CHECK(strcmp(a->device, b->device) == 0);
    CHECK(strcmp(a->reason, b->reason) == 0);
    CHECK(strcmp(a->source, b->source) == 0);
    CHECK(a->resumes == b->resumes);
    CHECK(a->umask == b->umask);
    /* The progress fields: nan reads back as nan. */
    const double da[] = {a->prog.loss, a->prog.val_loss, a->prog.val_accuracy, a->prog.units_per_s, a->prog.elapsed_s};
    const double db[] = {b->prog.loss, b->prog.val_loss, b->prog.val_accuracy, b->prog.units_per_s, b->prog.elapsed_s};
    for (size_t i = 0; i < sizeof da / sizeof da[0]; i++)
        CHECK(isnan(da[i]) ? isnan(db[i]) : da[i] == db[i] && isfinite(da[i]));
    CHECK(a->prog.step == b->prog.step && a->prog.micro == b->prog.micro && a->prog.accum == b->prog.accum);
    CHECK(a->prog.micro_max == b->prog.micro_max && a->prog.micro_fit == b->prog.micro_fit);
    CHECK(a->prog.oom_recoveries == b->prog.oom_recoveries && a->prog.batch_changes == b->prog.batch_changes);
    CHECK(a->prog.change_from == b->prog.change_from && a->prog.change_to == b->prog.change_to);
    CHECK(a->prog.change_step == b->prog.change_step);
    CHECK(strcmp(a->prog.change_reason, b->prog.change_reason) == 0);
    CHECK(a->mem_peak == b->mem_peak && memcmp(a->mem_tag_peak, b->mem_tag_peak, sizeof a->mem_tag_peak) == 0);
    CHECK(a->accounted_at == b->accounted_at);
    CHECK(memcmp(&a->after, &b->after, sizeof a->after) == 0);
    CHECK(memcmp(&a->after_done, &b->after_done, sizeof a->after_done) == 0);
    CHECK(a->held == b->held);
}

/* Ascending ids from 1 to WANT_ID - 1, each also in `of` when given. */
static int ids_ok(const queue_ids *s, const queue_ids *of)
{
    if (s->n > QUEUE_AFTER_MAX)
        return 0;
    for (uint32_t i = 0; i < s->n; i++) {
        if (s->id[i] == 0 || s->id[i] >= WANT_ID || (i > 0 && s->id[i] <= s->id[i - 1]))
            return 0;
        int found = !of;
        for (uint32_t k = 0; of && k < of->n; k++)
            found |= of->id[k] == s->id[i];
        if (!found)
            return 0;
    }
    return 1;
}

static void fuzz_state(const char *data, size_t size)
{
    /* Static: a job is tens of KiB, three of them on the stack is a lot for
     * a fuzzer's frame under ASan. */
    static job j, canary, back;
    memset(&j, 0xA5, sizeof j);
    memset(&canary, 0xA5, sizeof canary);
    char err[512] = "";
    if (queue_parse_state(data, size, WANT_ID, &j, err, sizeof err) != 0) {
        CHECK(is_line_error(err));
        CHECK(memcmp(&j, &canary, sizeof j) == 0);
        return;
    }
    CHECK(j.id == WANT_ID);
    CHECK(terminated(j.name, sizeof j.name) && terminated(j.user, sizeof j.user));
    CHECK(terminated(j.device, sizeof j.device) && terminated(j.reason, sizeof j.reason));
    CHECK(terminated(j.source, sizeof j.source) && terminated(j.prog.change_reason, sizeof j.prog.change_reason));
    CHECK(j.state < JOB_STATE_COUNT);
    CHECK(j.uid != (uid_t)-1 && j.gid != (gid_t)-1);
    CHECK((j.umask & ~(mode_t)0777) == 0);
    CHECK(time_ok(j.submitted_at) && time_ok(j.started_at) && time_ok(j.finished_at));
    CHECK(ids_ok(&j.after, NULL) && ids_ok(&j.after_done, &j.after));
    unsigned char held;
    memcpy(&held, &j.held, 1);
    CHECK(held <= 1);

    size_t len1, len2;
    char *text1 = queue_format_state(&j, &len1);
    CHECK(text1 != NULL);
    memset(&back, 0x5A, sizeof back);
    if (queue_parse_state(text1, len1, WANT_ID, &back, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_queue: what queue_format_state wrote does not parse: %s\n", err);
        abort();
    }
    check_same(&j, &back);
    char *text2 = queue_format_state(&back, &len2);
    CHECK(text2 != NULL);
    CHECK(len1 == len2 && memcmp(text1, text2, len1) == 0);
    free(text1);
    free(text2);
}

static void fuzz_next_id(const char *data, size_t size)
{
    uint64_t id = 0xA5A5A5A5A5A5u, again = 0;
    char err[256] = "";
    if (queue_parse_next_id(data, size, &id, err, sizeof err) != 0) {
        CHECK(is_line_error(err));
        CHECK(id == 0xA5A5A5A5A5A5u);
        return;
    }
    CHECK(id >= 1 && id <= QUEUE_ID_END);
    char buf[24];
    int n = snprintf(buf, sizeof buf, "%" PRIu64 "\n", id);
    CHECK(queue_parse_next_id(buf, (size_t)n, &again, err, sizeof err) == 0 && again == id);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_state((const char *)data, size);
    fuzz_next_id((const char *)data, size);
    return 0;
}
