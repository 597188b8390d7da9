/* report.c — report: a program job's own micro-batching (python/gradd)
 * tells the daemon the micro-batch it trains with.
 *
 * The figures land in the job's train_progress, where a worker puts an
 * engine job's after every step, so JobInfo, status, list and watch show
 * a program job's micro-batch x accumulation, step, loss and last change
 * exactly as they show an engine job's.  Only the job's own program may
 * report for it: the owner's uid, from a process in the session the
 * program was started in, while the job runs.  Every field is fixed-size
 * or checked against a short list, so reports never grow the daemon. */
#include "rpc_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "jobs/queue.h"

/* Far above any micro-batch or accumulation a device holds, far below
 * where micro × accum would overflow what prints it. */
#define REPORT_MAX_BATCH (1u << 24)

static bool reason_known(const char *r)
{
    return !strcmp(r, "start") || !strcmp(r, "oom") || !strcmp(r, "grow");
}

/* Whether the request's fields hold together; if not, msg names the field. */
static bool report_valid(const Gradd__ReportRequest *r, char *msg, size_t len)
{
    const char *reason = r->reason ? r->reason : "";
    if (r->job_id == 0)
        snprintf(msg, len, "report: job_id must be set (the job's GRADD_JOB_ID)");
    else if (r->micro == 0 || r->micro > REPORT_MAX_BATCH)
        snprintf(msg, len, "report: micro must be 1 to %u, not %u", REPORT_MAX_BATCH, r->micro);
    else if (r->accum == 0 || r->accum > REPORT_MAX_BATCH)
        snprintf(msg, len, "report: accum must be 1 to %u, not %u", REPORT_MAX_BATCH, r->accum);
    else if (*reason && !reason_known(reason))
        snprintf(msg, len, "report: reason must be \"start\", \"oom\", \"grow\" or empty");
    else if (!*reason && (r->change_from || r->change_to))
        snprintf(msg, len, "report: change_from and change_to need a reason");
    else if (*reason && r->change_to != r->micro)
        snprintf(msg, len, "report: change_to (%u) must be the micro-batch it changed to, micro (%u)",
                 r->change_to, r->micro);
    else if (*reason && r->change_from > REPORT_MAX_BATCH)
        snprintf(msg, len, "report: change_from must be 0 to %u, not %u", REPORT_MAX_BATCH, r->change_from);
    else if (!strcmp(reason, "oom") && r->change_from <= r->change_to)
        snprintf(msg, len, "report: an \"oom\" change shrinks: change_from (%u) must be above change_to (%u)",
                 r->change_from, r->change_to);
    else if (!strcmp(reason, "grow") && r->change_from >= r->change_to)
        snprintf(msg, len, "report: a \"grow\" change grows: change_from (%u) must be below change_to (%u)",
                 r->change_from, r->change_to);
    else
        return true;
    return false;
}

/* Whether the peer may report for j: its owner, from the program's own
 * session (the program's setsid made its pgid the session's id).  The uid
 * alone would let any other program of the same user write over the job's
 * figures.  If not, msg and *code say why. */
static bool report_allowed(const rpc_call *c, const job *j, char *msg, size_t len, Gradd__Error__Code *code)
{
    *code = GRADD__ERROR__CODE__PERMISSION_DENIED;
    if (j->uid != c->peer->uid) {
        snprintf(msg, len, "job %u belongs to %s; only its own program may report for it", j->id, j->user);
        return false;
    }
    *code = GRADD__ERROR__CODE__BAD_REQUEST;
    if (j->cfg.type != JOBCFG_PROGRAM) {
        snprintf(msg, len, "job %u is an engine job: gradd sizes its batches itself", j->id);
        return false;
    }
    if (j->state != JOB_RUNNING || !j->pgid) {
        snprintf(msg, len, "job %u is %s, not running: reports are taken while its program runs", j->id,
                 j->state == JOB_RUNNING ? "starting" : job_state_name(j->state));
        return false;
    }
    *code = GRADD__ERROR__CODE__PERMISSION_DENIED;
    pid_t sid = c->peer->pid > 0 ? getsid(c->peer->pid) : -1;
    if (sid <= 0 || (uint32_t)sid != j->pgid) {
        snprintf(msg, len, "pid %d is not in job %u's session (%u): only the job's own program may report for it",
                 (int)c->peer->pid, j->id, (unsigned)j->pgid);
        return false;
    }
    return true;
}

void rpc_report(const rpc_call *c, const Gradd__Request *req)
{
    gradd_ctx *ctx = c->ctx;
    const Gradd__ReportRequest *r = req->report;
    char msg[256];
    if (!report_valid(r, msg, sizeof msg)) {
        rpc_error(c, GRADD__ERROR__CODE__BAD_REQUEST, msg);
        return;
    }
    if (!ctx->q) {
        rpc_error(c, GRADD__ERROR__CODE__UNAVAILABLE, "this gradd has no job queue");
        return;
    }
    queue *q = ctx->q;
    pthread_mutex_lock(&q->lock);
    job *j = queue_find(q, r->job_id);
    Gradd__Error__Code code = GRADD__ERROR__CODE__NOT_FOUND;
    if (!j)
        snprintf(msg, sizeof msg, "no job %u", r->job_id);
    if (!j || !report_allowed(c, j, msg, sizeof msg, &code)) {
        pthread_mutex_unlock(&q->lock);
        rpc_error(c, code, msg);
        return;
    }
    train_progress *p = &j->prog;
    if (!j->have_progress) {
        /* A restarted job's figures are its last run's until this. */
        *p = (train_progress){.loss = NAN, .val_loss = NAN, .val_accuracy = NAN};
    }
    p->micro = r->micro;
    p->accum = r->accum;
    p->step = r->step;
    if (r->has_loss)
        p->loss = r->loss;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    double t = (double)now.tv_sec + (double)now.tv_nsec / 1e9;
    p->elapsed_s = j->started_at > 0 && t > j->started_at ? t - j->started_at : 0;
    if (r->reason && *r->reason) {
        p->batch_changes++;
        p->change_from = r->change_from;
        p->change_to = r->change_to;
        p->change_step = r->step;
        snprintf(p->change_reason, sizeof p->change_reason, "%s", r->reason);
        if (!strcmp(r->reason, "oom"))
            p->oom_recoveries++;
    }
    j->have_progress = true;
    queue_touch(q, j);
    pthread_mutex_unlock(&q->lock);
    queue_notify(q);
    Gradd__ReportResponse rr;
    gradd__report_response__init(&rr);
    RPC_SEND(c, REPORT, report, &rr);
}
