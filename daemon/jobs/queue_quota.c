/* queue_quota.c — what one user's job records may hold of the daemon's
 * memory and disk: [daemon] max_records_per_user records (finished ones
 * included) and max_bytes_per_user bytes of job files, state files and
 * logs in the state dir.  Room is made by forgetting that user's oldest
 * finished records, as `gradctl rm` would (their outputs stay). */
#include "queue.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "units.h"

void queue_set_limits(queue *q, uint64_t max_records, uint64_t max_bytes)
{
    pthread_mutex_lock(&q->lock);
    q->max_records_per_user = max_records;
    q->max_bytes_per_user = max_bytes;
    pthread_mutex_unlock(&q->lock);
}

uint64_t queue_job_bytes(const job *j)
{
    return j->cfg_bytes + j->state_bytes + j->log_bytes;
}

static void user_usage(const queue *q, uid_t uid, size_t *records, uint64_t *bytes)
{
    *records = 0;
    *bytes = 0;
    for (size_t i = 0; i < q->n; i++)
        if (q->jobs[i]->uid == uid) {
            (*records)++;
            *bytes += queue_job_bytes(q->jobs[i]);
        }
}

/* The user's finished job that ended first (one whose end was never
 * recorded counts as oldest); NULL when none is left to forget. */
static job *oldest_finished(const queue *q, uid_t uid)
{
    job *best = NULL;
    for (size_t i = 0; i < q->n; i++) {
        job *j = q->jobs[i];
        if (j->uid != uid || j->state == JOB_QUEUED || j->state == JOB_RUNNING || j->prune_failed)
            continue;
        if (!best || j->finished_at < best->finished_at)
            best = j; /* ascending ids: the first of equal times stays */
    }
    return best;
}

/* Forget the user's oldest finished job, saying which limit asked for it.
 * false when there was none to forget. */
static bool forget_oldest(queue *q, uid_t uid, const char *key, uint64_t limit, bool size)
{
    job *j;
    while ((j = oldest_finished(q, uid))) {
        uint32_t id = j->id;
        char name[sizeof j->name], err[512], lim[32];
        snprintf(name, sizeof name, "%s", j->name);
        if (size)
            units_format_size(limit, lim, sizeof lim);
        else
            snprintf(lim, sizeof lim, "%" PRIu64, limit);
        if (queue_remove(q, id, err, sizeof err) == 0) {
            log_job(LOG_INFO, id, NULL, "queue: job %u (%s) of uid %u forgotten to make room ([daemon] %s = %s)", id,
                    name, (unsigned)uid, key, lim);
            return true;
        }
        j->prune_failed = true;
        log_job(LOG_WARN, id, NULL, "queue: job %u (%s) of uid %u cannot be forgotten to make room: %s", id, name,
                (unsigned)uid, err);
    }
    return false;
}

int queue_make_room(queue *q, uid_t uid, uint64_t add_bytes, char *err, size_t err_len)
{
    size_t gone = 0;
    int rc = 0;
    pthread_mutex_lock(&q->lock);
    for (;;) {
        size_t records;
        uint64_t bytes;
        user_usage(q, uid, &records, &bytes);
        bool too_many = records + 1 > q->max_records_per_user;
        bool too_big = bytes + add_bytes > q->max_bytes_per_user;
        if (!too_many && !too_big)
            break;
        if (too_many ? forget_oldest(q, uid, "max_records_per_user", q->max_records_per_user, false)
                     : forget_oldest(q, uid, "max_bytes_per_user", q->max_bytes_per_user, true)) {
            gone++;
            continue;
        }
        char a[16], b[16], c[16];
        if (too_many)
            snprintf(err, err_len,
                     "uid %u has %zu job records and none has finished that could be forgotten to make room for "
                     "another ([daemon] max_records_per_user = %" PRIu64 ")",
                     (unsigned)uid, records, q->max_records_per_user);
        else
            snprintf(err, err_len,
                     "uid %u's jobs hold %s in the state dir and this one adds %s, more than [daemon] "
                     "max_bytes_per_user = %s allows, and none has finished that could be forgotten to make room",
                     (unsigned)uid, units_format_size(bytes, a, sizeof a), units_format_size(add_bytes, b, sizeof b),
                     units_format_size(q->max_bytes_per_user, c, sizeof c));
        rc = -1;
        break;
    }
    pthread_mutex_unlock(&q->lock);
    if (gone)
        queue_notify(q);
    return rc;
}

uint64_t queue_log_grew(queue *q, job *j, uint64_t log_bytes)
{
    j->log_bytes = log_bytes;
    if (j->log_stop || j->bytes_over)
        return 0;
    size_t records;
    uint64_t bytes;
    user_usage(q, j->uid, &records, &bytes);
    if (bytes <= q->max_bytes_per_user)
        return q->max_bytes_per_user - bytes;
    /* Removing files is for the daemon's identity, and this thread runs
     * as the job's owner: the loop does it (queue_save_unsaved). */
    j->bytes_over = true;
    q->any_bytes_over = true;
    return 0;
}

void queue_room_for_logs(queue *q)
{
    if (!atomic_load(&q->any_bytes_over))
        return;
    size_t gone = 0;
    pthread_mutex_lock(&q->lock);
    q->any_bytes_over = false;
    /* One flagged job at a time, looked for afresh: forgetting a job
     * moves the table. */
    for (;;) {
        job *j = NULL;
        for (size_t i = 0; i < q->n && !j; i++)
            if (q->jobs[i]->bytes_over)
                j = q->jobs[i];
        if (!j)
            break;
        j->bytes_over = false;
        uid_t uid = j->uid;
        size_t records;
        uint64_t bytes;
        for (;;) {
            user_usage(q, uid, &records, &bytes);
            if (bytes <= q->max_bytes_per_user ||
                !forget_oldest(q, uid, "max_bytes_per_user", q->max_bytes_per_user, true))
                break;
            gone++;
        }
        if (bytes <= q->max_bytes_per_user)
            continue;
        char a[16], b[16];
        log_warn("queue: uid %u's jobs hold %s in the state dir, more than [daemon] max_bytes_per_user = %s, "
                 "and none has finished that could be forgotten: the logs of its running jobs stop at their heads",
                 (unsigned)uid, units_format_size(bytes, a, sizeof a),
                 units_format_size(q->max_bytes_per_user, b, sizeof b));
        for (size_t k = 0; k < q->n; k++)
            if (q->jobs[k]->uid == uid && q->jobs[k]->state == JOB_RUNNING) {
                q->jobs[k]->log_stop = true;
                q->jobs[k]->bytes_over = false;
            }
    }
    /* Their workers wait for the answer. */
    pthread_cond_broadcast(&q->cond);
    pthread_mutex_unlock(&q->lock);
    if (gone)
        queue_notify(q);
}
