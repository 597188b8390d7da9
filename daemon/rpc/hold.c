/* hold.c — hold, release and requeue: what the owner of a job (or root, or
 * the admin group) may do to when it runs.
 *
 * A held job stays queued, as a Slurm job held by its user stays pending:
 * it keeps its place and priority, and its dependencies are still settled
 * (a held job whose dependency fails is cancelled).  Requeue takes a
 * finished job back into the queue, or stops a running one as cancel does
 * (an engine job after a checkpoint, which it resumes from) and queues it
 * again; the worker does the second half when the job has stopped. */
#include "rpc_internal.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/log.h"
#include "jobs/queue.h"

/* Answer the request of `body` with j as it is now; the caller holds the
 * queue lock, which this releases. */
static void answer(const rpc_call *c, job *j, Gradd__Request__BodyCase body)
{
    rpc_job_store *st = rpc_job_answer(c, j);
    if (!st)
        return;
    if (body == GRADD__REQUEST__BODY_HOLD) {
        Gradd__HoldResponse r = GRADD__HOLD_RESPONSE__INIT;
        r.job = &st->msg;
        RPC_SEND(c, HOLD, hold, &r);
    } else if (body == GRADD__REQUEST__BODY_RELEASE) {
        Gradd__ReleaseResponse r = GRADD__RELEASE_RESPONSE__INIT;
        r.job = &st->msg;
        RPC_SEND(c, RELEASE, release, &r);
    } else {
        Gradd__RequeueResponse r = GRADD__REQUEUE_RESPONSE__INIT;
        r.job = &st->msg;
        RPC_SEND(c, REQUEUE, requeue, &r);
    }
    free(st);
    queue_notify(c->ctx->q);
}

/* Unlock and answer a refusal. */
static void refuse(const rpc_call *c, Gradd__Error__Code code, const char *msg)
{
    pthread_mutex_unlock(&c->ctx->q->lock);
    rpc_error(c, code, msg);
}

/* hold and release: only a queued job has a start to keep back. */
static void set_held(const rpc_call *c, uint32_t id, bool held, Gradd__Request__BodyCase body)
{
    gradd_ctx *ctx = c->ctx;
    const char *verb = held ? "hold" : "release";
    char what[32], msg[160];
    snprintf(what, sizeof what, "%s it", verb);
    job *j = rpc_owned_job(c, id, what);
    if (!j)
        return;
    if (j->state != JOB_QUEUED) {
        snprintf(msg, sizeof msg, "job %u is %s; only a queued job can be %s", id, job_state_name(j->state),
                 held ? "held" : "released");
        refuse(c, GRADD__ERROR__CODE__BAD_REQUEST, msg);
        return;
    }
    /* Asked twice, it is still what was asked for: no error, nothing written. */
    if (j->held != held) {
        j->held = held;
        queue_touch(ctx->q, j);
        queue_persist_or_retry(ctx->q, j, NULL);
        if (!held)
            pthread_cond_broadcast(&ctx->q->cond); /* a worker may take it now */
        log_job(LOG_INFO, id, NULL, "job %u %s by uid %u", id, held ? "held" : "released", (unsigned)c->peer->uid);
    }
    answer(c, j, body);
}

void rpc_hold(const rpc_call *c, const Gradd__Request *req)
{
    set_held(c, req->hold->id, true, GRADD__REQUEST__BODY_HOLD);
}

void rpc_release(const rpc_call *c, const Gradd__Request *req)
{
    set_held(c, req->release->id, false, GRADD__REQUEST__BODY_RELEASE);
}

void rpc_requeue(const rpc_call *c, const Gradd__Request *req)
{
    gradd_ctx *ctx = c->ctx;
    uint32_t id = req->requeue->id;
    char msg[1400];
    job *j = rpc_owned_job(c, id, "requeue it");
    if (!j)
        return;
    if (j->state == JOB_QUEUED) {
        snprintf(msg, sizeof msg, "job %u is queued already", id);
        refuse(c, GRADD__ERROR__CODE__BAD_REQUEST, msg);
        return;
    }
    if (j->state == JOB_RUNNING) {
        /* Stopped at its next poll, as a cancel; the later request wins. */
        j->requeue_requested = true;
        j->cancel_requested = false;
        queue_touch(ctx->q, j);
        log_job(LOG_INFO, id, j->device, "job %u requeue requested by uid %u", id, (unsigned)c->peer->uid);
        answer(c, j, GRADD__REQUEST__BODY_REQUEUE);
        return;
    }
    if (j->cfg_unread) {
        snprintf(msg, sizeof msg, "job %u: its job file could not be read back at start; submit it again", id);
        refuse(c, GRADD__ERROR__CODE__BAD_REQUEST, msg);
        return;
    }
    /* Its run is finished ([output] resume would find the final
     * checkpoint): queued again, it would "complete" with nothing trained. */
    if (j->state == JOB_COMPLETED && j->cfg.type == JOBCFG_ENGINE) {
        snprintf(msg, sizeof msg, "job %u completed: its run in %.1024s is finished, and would train nothing again; "
                 "submit its job file with more [train] steps to train it further, or with another [output] dir",
                 id, j->cfg.out_dir);
        refuse(c, GRADD__ERROR__CODE__BAD_REQUEST, msg);
        return;
    }
    char why[128];
    if (queue_deps_broken(ctx->q, j, why, sizeof why)) {
        snprintf(msg, sizeof msg, "job %u cannot start again: %s", id, why);
        refuse(c, GRADD__ERROR__CODE__BAD_REQUEST, msg);
        return;
    }
    /* Back among its owner's active jobs: the same bound as a submit. */
    size_t active = queue_active_for(ctx->q, j->uid);
    if (active >= ctx->cfg.max_queued_per_user) {
        snprintf(msg, sizeof msg, "uid %u already has %zu queued or running jobs ([daemon] max_queued_per_user)",
                 (unsigned)j->uid, active);
        refuse(c, GRADD__ERROR__CODE__PERMISSION_DENIED, msg);
        return;
    }
    char was[sizeof j->reason + 32];
    snprintf(was, sizeof was, "%s%s%s", job_state_name(j->state), j->reason[0] ? ": " : "", j->reason);
    j->state = JOB_QUEUED;
    j->reason[0] = '\0';
    j->started_at = j->finished_at = 0;
    j->cancel_requested = j->requeue_requested = false;
    j->held = false; /* one cancelled while held: asked to run again, it runs */
    queue_touch(ctx->q, j);
    queue_persist_or_retry(ctx->q, j, NULL);
    pthread_cond_broadcast(&ctx->q->cond);
    log_job(LOG_INFO, id, NULL, "job %u requeued by uid %u (it was %.1100s)", id, (unsigned)c->peer->uid, was);
    answer(c, j, GRADD__REQUEST__BODY_REQUEUE);
}
