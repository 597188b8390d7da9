/* watch.c — the watch request: one job's JobInfo again each time it
 * changes, until it is completed, failed or cancelled.  The server calls
 * watch_next whenever a worker reports a change, whenever the client has
 * taken what it was sent, and once at the start; the stream only remembers
 * which version of the job the client has. */
#include "rpc_internal.h"

#include <stdio.h>
#include <stdlib.h>

#include "jobs/queue.h"

typedef struct {
    rpc_stream base; /* first: the server holds &base */
    uint32_t id;
    uint64_t version; /* the job version last sent */
} watch_stream;

/* Send the watched job if it changed since the last event; the stream ends
 * (final) once the job is completed, failed or cancelled. */
static bool watch_next(rpc_stream *s, const rpc_call *c)
{
    watch_stream *w = (watch_stream *)s;
    gradd_ctx *ctx = c->ctx;
    if (!ctx->q)
        return true;
    /* A watcher that has not taken its last event gets the state the job
     * has once it does, not every change in between: one event waits for
     * it at most, however fast the job changes and however many watch.
     * The version is marked only once sent, so the final event follows. */
    if (c->queued(c->conn) > 0)
        return true;
    rpc_job_store *st = malloc(sizeof *st);
    if (!st)
        return true;
    pthread_mutex_lock(&ctx->q->lock);
    job *j = queue_find(ctx->q, w->id);
    bool changed = j && j->version != w->version;
    bool final = !j || (j->state != JOB_QUEUED && j->state != JOB_RUNNING);
    if (changed) {
        rpc_job_info(ctx, j, st);
        w->version = j->version;
    }
    pthread_mutex_unlock(&ctx->q->lock);
    if (changed) {
        Gradd__WatchEvent ev;
        gradd__watch_event__init(&ev);
        ev.job = &st->msg;
        ev.final = final;
        RPC_SEND(c, WATCH, watch, &ev);
    }
    free(st);
    if (!j) {
        /* Removed before the watcher saw it end: say so rather than leave
         * it waiting for an event that cannot come. */
        char msg[64];
        snprintf(msg, sizeof msg, "job %u was removed", w->id);
        rpc_error(c, GRADD__ERROR__CODE__NOT_FOUND, msg);
    }
    return !final;
}

static void watch_free(rpc_stream *s)
{
    free(s);
}

rpc_stream *rpc_watch(const rpc_call *c, const Gradd__Request *req)
{
    gradd_ctx *ctx = c->ctx;
    uint32_t id = req->watch->id;
    bool found = false;
    if (ctx->q) {
        pthread_mutex_lock(&ctx->q->lock);
        found = queue_find(ctx->q, id) != NULL;
        pthread_mutex_unlock(&ctx->q->lock);
    }
    if (!found) {
        char msg[64];
        snprintf(msg, sizeof msg, "no job %u", id);
        rpc_error(c, GRADD__ERROR__CODE__NOT_FOUND, msg);
        return NULL;
    }
    watch_stream *w = malloc(sizeof *w);
    if (!w) {
        rpc_error(c, GRADD__ERROR__CODE__INTERNAL, "out of memory");
        return NULL;
    }
    w->base.next = watch_next;
    w->base.free = watch_free;
    w->id = id;
    w->version = UINT64_MAX; /* no version yet: the first call sends the job */
    return &w->base;
}
