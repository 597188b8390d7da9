/* queue_deps.c — jobs that wait for other jobs (gradctl submit --after) and
 * held jobs: whether a queued job may start, why not in words, and the
 * cancel that follows a dependency's failure.
 *
 * A job waits only for jobs that existed when it was submitted, so every
 * id in j->after is below j->id: no cycle can form, and one pass over the
 * table in id order settles a whole chain.
 */
#include "queue.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/log.h"

static bool ids_have(const queue_ids *s, uint32_t id)
{
    for (uint32_t i = 0; i < s->n; i++)
        if (s->id[i] == id)
            return true;
    return false;
}

/* Why dependency `id` of j can never be met, into why; false while it
 * still can (or is met). */
static bool dep_broken(queue *q, const job *j, uint32_t id, char *why, size_t len)
{
    if (ids_have(&j->after_done, id))
        return false;
    const job *d = queue_find(q, id);
    if (!d)
        snprintf(why, len, "dependency %u is gone without a record of its outcome", id);
    else if (d->state == JOB_FAILED)
        snprintf(why, len, "dependency %u failed", id);
    else if (d->state == JOB_CANCELLED)
        snprintf(why, len, "dependency %u was cancelled", id);
    else
        return false;
    return true;
}

bool queue_deps_broken(queue *q, const job *j, char *why, size_t len)
{
    for (uint32_t k = 0; k < j->after.n; k++)
        if (dep_broken(q, j, j->after.id[k], why, len))
            return true;
    return false;
}

bool queue_deps_ready(queue *q, const job *j)
{
    if (j->held)
        return false;
    for (uint32_t i = 0; i < j->after.n; i++) {
        uint32_t id = j->after.id[i];
        if (ids_have(&j->after_done, id))
            continue;
        const job *d = queue_find(q, id);
        if (!d || d->state != JOB_COMPLETED)
            return false;
    }
    return true;
}

void queue_deps_waiting(queue *q, const job *j, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    if (j->state != JOB_QUEUED || len == 0)
        return;
    if (j->held)
        n += (size_t)snprintf(buf, len, "held");
    const char *sep = n ? "; waiting for " : "waiting for ";
    for (uint32_t i = 0; i < j->after.n && n < len; i++) {
        uint32_t id = j->after.id[i];
        const job *d = ids_have(&j->after_done, id) ? NULL : queue_find(q, id);
        if (!d || d->state == JOB_COMPLETED)
            continue;
        n += (size_t)snprintf(buf + n, len - n, "%s%u", sep, id);
        sep = ", ";
    }
}

static void cancel_waiting(queue *q, job *j, const char *why)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    j->state = JOB_CANCELLED;
    j->finished_at = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    snprintf(j->reason, sizeof j->reason, "%s", why);
    queue_touch(q, j);
    queue_persist_or_retry(q, j, NULL);
    log_job(LOG_INFO, j->id, NULL, "job %u (%s) cancelled: %s", j->id, j->name, why);
}

size_t queue_deps_settle(queue *q)
{
    size_t gone = 0;
    char why[128];
    for (size_t i = 0; i < q->n; i++) {
        job *j = q->jobs[i];
        if (j->state == JOB_QUEUED && queue_deps_broken(q, j, why, sizeof why)) {
            cancel_waiting(q, j, why);
            gone++;
        }
    }
    pthread_cond_broadcast(&q->cond);
    return gone;
}

void queue_deps_forget(queue *q, const job *gone)
{
    char why[128];
    for (size_t i = 0; i < q->n; i++) {
        job *j = q->jobs[i];
        if (j->id <= gone->id || j->state != JOB_QUEUED || !ids_have(&j->after, gone->id) ||
            ids_have(&j->after_done, gone->id))
            continue;
        if (gone->state != JOB_COMPLETED) {
            if (dep_broken(q, j, gone->id, why, sizeof why))
                cancel_waiting(q, j, why);
            continue;
        }
        /* Kept ascending, as the parser wants it; there is room, as
         * after_done is part of after. */
        queue_ids *s = &j->after_done;
        uint32_t at = s->n;
        while (at > 0 && s->id[at - 1] > gone->id) {
            s->id[at] = s->id[at - 1];
            at--;
        }
        s->id[at] = gone->id;
        s->n++;
        queue_touch(q, j);
        queue_persist_or_retry(q, j, NULL);
    }
}
