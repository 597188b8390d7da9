/* jobs.c — the requests about jobs: submit, list, job, cancel, remove and
 * logs.  Everyone may see every job; changing one, or reading its log, is
 * for its owner, root and the admin group (owned_job). */
#include "rpc_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "fileio.h"
#include "jobs/access.h"
#include "jobs/outdir.h"
#include "jobs/queue.h"
#include "models/model.h"
#include "units.h"

/* Answer with j as a Job or a Cancel response; the caller holds the queue
 * lock, which this releases. */
static void send_job(const rpc_call *c, job *j, bool cancel_reply)
{
    rpc_job_store *st = rpc_job_answer(c, j);
    if (!st)
        return;
    if (cancel_reply) {
        Gradd__CancelResponse cr;
        gradd__cancel_response__init(&cr);
        cr.job = &st->msg;
        RPC_SEND(c, CANCEL, cancel, &cr);
    } else {
        RPC_SEND(c, JOB, job, &st->msg);
    }
    free(st);
}

/* Look a job up with the queue locked; on failure the lock is released and
 * an error sent. */
static job *locked_job(const rpc_call *c, uint32_t id)
{
    gradd_ctx *ctx = c->ctx;
    if (!ctx->q) {
        rpc_error(c, GRADD__ERROR__CODE__UNAVAILABLE, "this gradd has no job queue");
        return NULL;
    }
    pthread_mutex_lock(&ctx->q->lock);
    job *j = queue_find(ctx->q, id);
    if (!j) {
        pthread_mutex_unlock(&ctx->q->lock);
        char msg[64];
        snprintf(msg, sizeof msg, "no job %u", id);
        rpc_error(c, GRADD__ERROR__CODE__NOT_FOUND, msg);
    }
    return j;
}

/* rpc_owned_job (rpc_internal.h). */
static job *owned_job(const rpc_call *c, uint32_t id, const char *what)
{
    gradd_ctx *ctx = c->ctx;
    const rpc_peer *peer = c->peer;
    job *j = locked_job(c, id);
    if (!j || j->uid == peer->uid || access_is_admin(peer->uid, peer->gid, ctx->cfg.admin_group))
        return j;
    char msg[256];
    snprintf(msg, sizeof msg, "job %u belongs to %s; only its owner, root or group '%s' may %s", id, j->user,
             ctx->cfg.admin_group, what);
    pthread_mutex_unlock(&ctx->q->lock);
    rpc_error(c, GRADD__ERROR__CODE__PERMISSION_DENIED, msg);
    return NULL;
}

job *rpc_owned_job(const rpc_call *c, uint32_t id, const char *what)
{
    return owned_job(c, id, what);
}

/* "no device 'cpu3' on this daemon (it has cpu0, cuda0)", and why there
 * is no CUDA device when one was asked for. */
static void no_device(const gradd_ctx *ctx, const char *where, const char *want, char *msg, size_t len)
{
    int n = snprintf(msg, len, "%s: no device '%s' on this daemon (it has", where, want);
    for (int i = 0; i < ctx->ndev && n > 0 && (size_t)n < len; i++)
        n += snprintf(msg + n, len - (size_t)n, "%s %s", i ? "," : "", ctx->devs[i]->id);
    if (n > 0 && (size_t)n < len)
        n += snprintf(msg + n, len - (size_t)n, "%s)", ctx->ndev ? "" : " none");
    if (n > 0 && (size_t)n < len && ctx->cuda_note[0] && strncmp(want, "cuda", 4) == 0)
        snprintf(msg + n, len - (size_t)n, "; %s", ctx->cuda_note);
}

void rpc_submit(const rpc_call *c, const Gradd__Request *req)
{
    gradd_ctx *ctx = c->ctx;
    const rpc_peer *peer = c->peer;
    const Gradd__SubmitRequest *rq = req->submit;
    char msg[1400];
    if (!ctx->q) {
        rpc_error(c, GRADD__ERROR__CODE__UNAVAILABLE, "this gradd has no job queue");
        return;
    }
    const char *path = rq->path && *rq->path ? rq->path : "";
    if (path[0] != '/') {
        rpc_error(c, GRADD__ERROR__CODE__BAD_REQUEST, "submit: the job file path must be absolute");
        return;
    }
    uint64_t limit = config_job_file_limit(&ctx->cfg);
    if (rq->contents.len > limit) {
        snprintf(msg, sizeof msg,
                 "%s: %zu bytes is more than this daemon accepts (%llu: [daemon] max_job_file, at most max_frame "
                 "less %d)",
                 path, rq->contents.len, (unsigned long long)limit, CONFIG_SUBMIT_ENVELOPE);
        rpc_error(c, GRADD__ERROR__CODE__BAD_JOB, msg);
        return;
    }
    job_config *cfg = malloc(sizeof *cfg);
    if (!cfg) {
        rpc_error(c, GRADD__ERROR__CODE__INTERNAL, "out of memory");
        return;
    }
    char err[1024];
    /* Parsed as the submitter: the parser checks that the data files are
     * readable, and that is the owner's question, not the daemon's. */
    access_saved saved;
    if (access_become(peer->uid, peer->gid, &saved, err, sizeof err) != 0) {
        rpc_error(c, GRADD__ERROR__CODE__BAD_JOB, err);
        goto out;
    }
    /* A job that runs after others may read what they make (a data file,
     * a model): what is not there yet is checked when it starts. */
    int lrc = rq->n_after ? jobcfg_load_later(rq->contents.data, rq->contents.len, path, cfg, err, sizeof err)
                          : jobcfg_load_mem(rq->contents.data, rq->contents.len, path, cfg, err, sizeof err);
    if (lrc == 0 && cfg->type == JOBCFG_ENGINE)
        lrc = model_check_job(cfg, err, sizeof err);
    access_restore(&saved);
    if (lrc != 0) {
        rpc_error(c, GRADD__ERROR__CODE__BAD_JOB, err);
        goto out;
    }
    /* The overrides are checked as the file's keys are: gradctl checks
     * them too, but any client can send a request. */
    if (rq->name && *rq->name) {
        const char *bad = jobcfg_name_problem(rq->name);
        if (!bad && strlen(rq->name) >= sizeof cfg->name)
            bad = "is too long";
        if (bad) {
            snprintf(msg, sizeof msg, "submit: the job name %s", bad);
            rpc_error(c, GRADD__ERROR__CODE__BAD_REQUEST, msg);
            goto out;
        }
        snprintf(cfg->name, sizeof cfg->name, "%s", rq->name);
    }
    if (rq->has_priority) {
        if (rq->priority < 0 || rq->priority > JOBCFG_PRIORITY_MAX) {
            snprintf(msg, sizeof msg, "submit: priority %lld is not from 0 to %d", (long long)rq->priority,
                     JOBCFG_PRIORITY_MAX);
            rpc_error(c, GRADD__ERROR__CODE__BAD_REQUEST, msg);
            goto out;
        }
        cfg->priority = rq->priority;
    }
    /* Priorities above the ceiling would let one user's queue pass everyone
     * else's for good: they are for admin_group. */
    if ((uint64_t)cfg->priority > ctx->cfg.max_user_priority && !rpc_peer_admin(c)) {
        char at[PATH_MAX + 64];
        snprintf(msg, sizeof msg,
                 "%s%s%lld is above %llu, the highest that users outside group '%s' may ask for "
                 "([daemon] max_user_priority)",
                 rq->has_priority ? "submit: --priority" : jobcfg_where(cfg, "job", "priority", at, sizeof at),
                 rq->has_priority ? " " : ": ", (long long)cfg->priority,
                 (unsigned long long)ctx->cfg.max_user_priority, ctx->cfg.admin_group);
        rpc_error(c, GRADD__ERROR__CODE__PERMISSION_DENIED, msg);
        goto out;
    }
    /* Fixed now, as the job's own: a later change of gradd.conf does not
     * move the limit of a job already queued. */
    if (!cfg->time_limit_ms)
        cfg->time_limit_ms = ctx->cfg.default_time_limit_ms ? ctx->cfg.default_time_limit_ms
                                                            : ctx->cfg.max_time_limit_ms;
    if (ctx->cfg.max_time_limit_ms && cfg->time_limit_ms > ctx->cfg.max_time_limit_ms) {
        char at[PATH_MAX + 64], a[32], b[32];
        snprintf(msg, sizeof msg, "%s: %s is above %s, the longest this daemon allows ([daemon] max_time_limit)",
                 jobcfg_where(cfg, "job", "time_limit", at, sizeof at),
                 units_format_duration((double)cfg->time_limit_ms / 1e3, a, sizeof a),
                 units_format_duration((double)ctx->cfg.max_time_limit_ms / 1e3, b, sizeof b));
        rpc_error(c, GRADD__ERROR__CODE__BAD_JOB, msg);
        goto out;
    }
    if (rq->umask > 0777) {
        snprintf(msg, sizeof msg, "submit: umask %#o is not from 0 to 0777", (unsigned)rq->umask);
        rpc_error(c, GRADD__ERROR__CODE__BAD_REQUEST, msg);
        goto out;
    }
    /* A client that does not say gets what outputs always had. */
    mode_t mask = rq->has_umask ? (mode_t)rq->umask : 022;
    char where[PATH_MAX + 64];
    for (int k = 0; k < cfg->ndevices; k++) {
        int i = ctx_find_device(ctx, cfg->device_ids[k]);
        if (i >= 0 && (ctx->devs[i]->kind != DEV_KIND_CUDA || ctx->devs[i]->collectives))
            continue;
        if (i >= 0)
            snprintf(msg, sizeof msg, "%s: ranks on CUDA devices share gradients over NCCL, and this daemon's CUDA "
                     "module was built without it", jobcfg_where(cfg, "job", "devices", where, sizeof where));
        else
            no_device(ctx, jobcfg_where(cfg, "job", "devices", where, sizeof where), cfg->device_ids[k], msg,
                      sizeof msg);
        rpc_error(c, GRADD__ERROR__CODE__BAD_JOB, msg);
        goto out;
    }
    bool have_cuda = false, found = false, found_cuda = false;
    for (int i = 0; i < ctx->ndev; i++)
        have_cuda |= ctx->devs[i]->kind == DEV_KIND_CUDA;
    for (int i = 0; i < ctx->ndev; i++) {
        bool is_cuda = ctx->devs[i]->kind == DEV_KIND_CUDA;
        if (queue_device_matches(cfg->device, ctx->devs[i]->id, is_cuda, have_cuda)) {
            found = true;
            found_cuda |= is_cuda;
        }
    }
    if (!found) {
        no_device(ctx, jobcfg_where(cfg, "job", "device", where, sizeof where), cfg->device, msg, sizeof msg);
        rpc_error(c, GRADD__ERROR__CODE__BAD_JOB, msg);
        goto out;
    }
    /* Refused now rather than queued to fail when it starts: the devices
     * it may run on are all CPUs, which train in fp32 only. */
    if (cfg->precision != JOBCFG_FP32 && !found_cuda) {
        snprintf(msg, sizeof msg, "%s: %s needs a CUDA device, and [job] device '%s' runs on a CPU "
                 "on this daemon (use precision = fp32)%s%s",
                 jobcfg_where(cfg, "train", "precision", where, sizeof where),
                 cfg->precision == JOBCFG_BF16 ? "bf16" : "fp16", cfg->device, ctx->cuda_note[0] ? "; " : "",
                 ctx->cuda_note);
        rpc_error(c, GRADD__ERROR__CODE__BAD_JOB, msg);
        goto out;
    }
    pthread_mutex_lock(&ctx->q->lock);
    size_t active = queue_active_for(ctx->q, peer->uid);
    pthread_mutex_unlock(&ctx->q->lock);
    if (active >= ctx->cfg.max_queued_per_user) {
        snprintf(msg, sizeof msg, "uid %u already has %zu queued or running jobs ([daemon] max_queued_per_user)",
                 (unsigned)peer->uid, active);
        rpc_error(c, GRADD__ERROR__CODE__PERMISSION_DENIED, msg);
        goto out;
    }
    /* Everything the job will read or write, checked as its owner. */
    if (access_check_job(peer->uid, peer->gid, mask, cfg, err, sizeof err) != 0) {
        rpc_error(c, GRADD__ERROR__CODE__BAD_JOB, err);
        goto out;
    }
    char real[PATH_MAX];
    if (outdir_check_live(ctx->q, peer->uid, peer->gid, cfg, real, sizeof real, err, sizeof err) != 0) {
        rpc_error(c, GRADD__ERROR__CODE__BAD_JOB, err);
        goto out;
    }
    /* The job file and a state file (a few KiB): room for both, made by
     * forgetting the submitter's oldest finished jobs if need be. */
    if (queue_make_room(ctx->q, peer->uid, rq->contents.len + QUEUE_STATE_RESERVE, err, sizeof err) != 0) {
        rpc_error(c, GRADD__ERROR__CODE__PERMISSION_DENIED, err);
        goto out;
    }
    char user[64];
    rpc_user_name(peer->uid, user, sizeof user);
    uint32_t id;
    /* Any job may be waited for, another user's too: everyone sees every
     * job, and waiting changes nothing for its owner. */
    if (rq->n_after > QUEUE_AFTER_MAX) {
        snprintf(msg, sizeof msg, "submit: --after names %zu jobs; at most %d", rq->n_after, QUEUE_AFTER_MAX);
        rpc_error(c, GRADD__ERROR__CODE__BAD_REQUEST, msg);
        goto out;
    }
    queue_ids after = {.n = (uint32_t)rq->n_after};
    if (rq->n_after) /* else after may be NULL */
        memcpy(after.id, rq->after, rq->n_after * sizeof rq->after[0]);
    int src = queue_submit_after(ctx->q, cfg, rq->contents.data, rq->contents.len, peer->uid, peer->gid, mask, user,
                                 &after, rq->hold, &id, err, sizeof err);
    if (src != 0) {
        rpc_error(c, src == -2 ? GRADD__ERROR__CODE__BAD_REQUEST : GRADD__ERROR__CODE__INTERNAL, err);
        goto out;
    }
    /* Kept in its state file from its next change on (no extra write
     * per submit): until then a restarted daemon compares the lexical path. */
    pthread_mutex_lock(&ctx->q->lock);
    job *added = queue_find(ctx->q, id);
    if (added)
        snprintf(added->out_real, sizeof added->out_real, "%s", real);
    pthread_mutex_unlock(&ctx->q->lock);
    log_job(LOG_INFO, id, NULL, "job %u (%s) submitted by %s (uid %u) from %s", id, cfg->name, user, (unsigned)peer->uid, path);
    Gradd__SubmitResponse sr;
    gradd__submit_response__init(&sr);
    sr.id = id;
    sr.name = cfg->name;
    RPC_SEND(c, SUBMIT, submit, &sr);
out:
    free(cfg);
}

/* Jobs per ListResponse frame: a few MB of rpc_job_store at most, and a
 * frame far below any cap, however many finished jobs are kept. */
#define LIST_CHUNK 256

/* list, as a stream: a frame of jobs per turn while the client keeps up. */
typedef struct {
    rpc_stream base; /* first: the server holds &base */
    job_state want_state;
    char *user;     /* the filter, copied: the request is freed */
    uint32_t after; /* the last id sent */
} list_stream;

static bool list_wants(const list_stream *ls, const job *j)
{
    if (ls->want_state != JOB_STATE_COUNT && j->state != ls->want_state)
        return false;
    if (ls->user) {
        char uid[16];
        snprintf(uid, sizeof uid, "%u", (unsigned)j->uid);
        if (strcmp(ls->user, j->user) != 0 && strcmp(ls->user, uid) != 0)
            return false;
    }
    return true;
}

static bool list_next(rpc_stream *s, const rpc_call *c)
{
    list_stream *ls = (list_stream *)s;
    gradd_ctx *ctx = c->ctx;
    if (c->queued(c->conn) >= RPC_STREAM_WINDOW)
        return true;
    rpc_job_store *st = calloc(LIST_CHUNK, sizeof *st);
    Gradd__JobInfo **ptrs = calloc(LIST_CHUNK, sizeof *ptrs);
    if (!st || !ptrs) {
        free(st);
        free(ptrs);
        rpc_error(c, GRADD__ERROR__CODE__INTERNAL, "out of memory");
        return false;
    }
    /* Frame by frame, each under the lock on its own: a chunk starts after
     * the last id sent, so jobs that come or go in between are listed at
     * most once. */
    bool more = true;
    while (more && c->queued(c->conn) < RPC_STREAM_WINDOW) {
        size_t k = 0;
        pthread_mutex_lock(&ctx->q->lock);
        size_t i = 0, n = ctx->q->n;
        while (i < n && ctx->q->jobs[i]->id <= ls->after)
            i++;
        for (; i < n && k < LIST_CHUNK; i++) {
            job *j = ctx->q->jobs[i];
            if (!list_wants(ls, j))
                continue;
            rpc_job_info(ctx, j, &st[k]);
            ptrs[k] = &st[k].msg;
            k++;
            ls->after = j->id;
        }
        more = i < n;
        pthread_mutex_unlock(&ctx->q->lock);
        Gradd__ListResponse lr;
        gradd__list_response__init(&lr);
        lr.n_jobs = k;
        lr.jobs = ptrs;
        lr.more = more;
        if (RPC_SEND(c, LIST, list, &lr) != 0)
            more = false;
    }
    free(st);
    free(ptrs);
    return more;
}

static void list_free(rpc_stream *s)
{
    list_stream *ls = (list_stream *)s;
    free(ls->user);
    free(ls);
}

rpc_stream *rpc_list(const rpc_call *c, const Gradd__Request *req)
{
    gradd_ctx *ctx = c->ctx;
    const Gradd__ListRequest *rq = req->list;
    if (!ctx->q) {
        rpc_error(c, GRADD__ERROR__CODE__UNAVAILABLE, "this gradd has no job queue");
        return NULL;
    }
    job_state want_state = JOB_STATE_COUNT;
    if (rq->state && *rq->state && job_state_parse(rq->state, &want_state) != 0) {
        rpc_error(c, GRADD__ERROR__CODE__BAD_REQUEST,
                   "unknown state; use queued, running, completed, failed or cancelled");
        return NULL;
    }
    list_stream *ls = calloc(1, sizeof *ls);
    if (ls && rq->user && *rq->user && !(ls->user = strdup(rq->user))) {
        free(ls);
        ls = NULL;
    }
    if (!ls) {
        rpc_error(c, GRADD__ERROR__CODE__INTERNAL, "out of memory");
        return NULL;
    }
    ls->base.next = list_next;
    ls->base.free = list_free;
    ls->want_state = want_state;
    return &ls->base;
}

void rpc_job(const rpc_call *c, const Gradd__Request *req)
{
    job *j = locked_job(c, req->job->id);
    if (j)
        send_job(c, j, false); /* unlocks */
}

static double now_unix(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void rpc_cancel(const rpc_call *c, const Gradd__Request *req)
{
    gradd_ctx *ctx = c->ctx;
    const rpc_peer *peer = c->peer;
    uint32_t id = req->cancel->id;
    job *j = owned_job(c, id, "cancel it");
    if (!j)
        return;
    char msg[256];
    if (j->state == JOB_QUEUED) {
        j->state = JOB_CANCELLED;
        j->finished_at = now_unix();
        snprintf(j->reason, sizeof j->reason, "cancelled by uid %u before it started", (unsigned)peer->uid);
        queue_persist_or_retry(ctx->q, j, NULL);
        queue_deps_settle(ctx->q); /* the jobs that wait for it */
    } else if (j->state == JOB_RUNNING) {
        /* The worker stops at its next poll (between layers) and checkpoints. */
        j->cancel_requested = true;
        j->requeue_requested = false; /* the later request wins */
    } else {
        snprintf(msg, sizeof msg, "job %u is already %s", id, job_state_name(j->state));
        pthread_mutex_unlock(&ctx->q->lock);
        rpc_error(c, GRADD__ERROR__CODE__BAD_REQUEST, msg);
        return;
    }
    queue_touch(ctx->q, j);
    log_job(LOG_INFO, id, j->device, "job %u cancel requested by uid %u", id, (unsigned)peer->uid);
    send_job(c, j, true); /* unlocks */
    queue_notify(ctx->q);
}

void rpc_remove(const rpc_call *c, const Gradd__Request *req)
{
    gradd_ctx *ctx = c->ctx;
    uint32_t id = req->remove->id;
    job *j = owned_job(c, id, "remove it");
    if (!j)
        return;
    char msg[512], name[sizeof j->name];
    snprintf(name, sizeof name, "%s", j->name);
    int rc = queue_remove(ctx->q, id, msg, sizeof msg);
    pthread_mutex_unlock(&ctx->q->lock);
    if (rc != 0) {
        rpc_error(c, GRADD__ERROR__CODE__BAD_REQUEST, msg);
        return;
    }
    log_job(LOG_INFO, id, NULL, "job %u (%s) removed by uid %u", id, name, (unsigned)c->peer->uid);
    Gradd__RemoveResponse rr;
    gradd__remove_response__init(&rr);
    rr.id = id;
    rr.name = name;
    RPC_SEND(c, REMOVE, remove, &rr);
}

/* A job's log is its owner's, as a batch job's output file would be: it
 * can name their files and say why they failed. */
rpc_stream *rpc_logs(const rpc_call *c, const Gradd__Request *req)
{
    gradd_ctx *ctx = c->ctx;
    uint32_t id = req->logs->id;
    job *j = owned_job(c, id, "read its log");
    if (!j)
        return NULL;
    char path[PATH_MAX + 32];
    queue_log_path(ctx->q, id, path, sizeof path);
    pthread_mutex_unlock(&ctx->q->lock);
    return rpc_logs_stream(c, id, path, req->logs->follow, req->logs->tail);
}
