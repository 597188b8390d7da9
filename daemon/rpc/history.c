/* history.c — the history request: finished jobs' accounting records
 * (jobs/acct.h), filtered, newest first, or summed per user.
 *
 * The files may hold hundreds of thousands of lines, so reading them is
 * deferred work, off the loop; what it keeps is bounded by the limit (the
 * newest matches, in a ring) and by the users seen, never by the files.
 * Everyone may read everyone's records: `gradctl list` already shows every
 * user's jobs while they are kept, and the records hold nothing more
 * private than that. */
#include "rpc_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "jobs/acct.h"
#include "jobs/queue.h"

#define HISTORY_DEFAULT_LIMIT 100
/* Sent in one go when the work is done: the most there can be (about
 * 1.4 KiB a record with a long reason) stays below what a connection may
 * queue (1 MiB), so a slow reader gets all of it. */
#define HISTORY_MAX_LIMIT 500
#define HISTORY_FRAME 100 /* records per frame: far below any frame cap */
#define HISTORY_WARN_MAX 5 /* damaged lines named in the log per request */

typedef struct {
    uint32_t uid;
    char user[64];
    uint64_t jobs, completed, failed, cancelled;
    double device_hours, elapsed_s;
} history_user;

typedef struct {
    rpc_work base; /* first: the server holds &base */
    /* in, filled in by rpc_history on the loop */
    acct_log *acct;
    char user[64]; /* empty: every user */
    char state[16]; /* empty: every state */
    double since, until;
    uint32_t limit;
    bool summary;
    /* out, filled in by history_run */
    acct_record *ring; /* the newest `limit` matches: ring[(head + k) % limit] */
    size_t head, n;
    history_user *users;
    size_t nusers, cap_users;
    uint64_t skipped;
    bool oom;
} history_op;

static bool wanted(const history_op *op, const acct_record *r)
{
    if (op->state[0] && strcmp(op->state, r->state) != 0)
        return false;
    if (op->since > 0 && r->finished_at < op->since)
        return false;
    if (op->until > 0 && r->finished_at >= op->until)
        return false;
    if (op->user[0]) {
        char uid[16];
        snprintf(uid, sizeof uid, "%u", (unsigned)r->uid);
        if (strcmp(op->user, r->user) != 0 && strcmp(op->user, uid) != 0)
            return false;
    }
    return true;
}

static void add_to_summary(history_op *op, const acct_record *r)
{
    history_user *u = NULL;
    for (size_t i = 0; i < op->nusers && !u; i++)
        if (op->users[i].uid == r->uid)
            u = &op->users[i];
    if (!u) {
        if (op->nusers == op->cap_users) {
            size_t cap = op->cap_users ? op->cap_users * 2 : 16;
            history_user *nu = realloc(op->users, cap * sizeof *nu);
            if (!nu) {
                op->oom = true;
                return;
            }
            op->users = nu;
            op->cap_users = cap;
        }
        u = &op->users[op->nusers++];
        memset(u, 0, sizeof *u);
        u->uid = r->uid;
    }
    /* The name it had in its latest record. */
    snprintf(u->user, sizeof u->user, "%s", r->user);
    u->jobs++;
    u->completed += strcmp(r->state, "completed") == 0;
    u->failed += strcmp(r->state, "failed") == 0;
    u->cancelled += strcmp(r->state, "cancelled") == 0;
    u->device_hours += r->device_hours;
    u->elapsed_s += r->elapsed_s;
}

static void keep(history_op *op, const acct_record *r)
{
    if (op->summary) {
        add_to_summary(op, r);
    } else if (op->n < op->limit) {
        op->ring[(op->head + op->n++) % op->limit] = *r;
    } else {
        op->ring[op->head] = *r;
        op->head = (op->head + 1) % op->limit;
    }
}

static void history_run(rpc_work *w)
{
    history_op *op = (history_op *)w;
    FILE *f[2];
    char paths[2][PATH_MAX + 8];
    acct_open_read(op->acct, f, paths);
    char *line = malloc(ACCT_LINE_MAX + 2);
    acct_record *r = malloc(sizeof *r);
    if (!op->summary)
        op->ring = malloc(op->limit * sizeof *op->ring);
    if (!line || !r || (!op->summary && !op->ring))
        op->oom = true;
    for (int i = 0; i < 2 && !op->oom; i++) {
        unsigned lineno = 0;
        size_t len;
        int rc;
        while (f[i] && !op->oom && (rc = acct_next_line(f[i], line, ACCT_LINE_MAX + 2, &len, &lineno)) != 0) {
            /* A daemon that stops, or a client that left, waits for no
             * more than a few thousand lines. */
            if (lineno % 4096 == 0 && atomic_load(&op->base.cancelled))
                break;
            char err[256];
            if (rc < 0)
                snprintf(err, sizeof err, "longer than %zu bytes", ACCT_LINE_MAX);
            if (rc < 0 || acct_parse_line(line, len, r, err, sizeof err) != 0) {
                if (op->skipped++ < HISTORY_WARN_MAX)
                    log_warn("accounting: %s:%u: %s; line skipped", paths[i], lineno, err);
                continue;
            }
            if (wanted(op, r))
                keep(op, r);
        }
    }
    if (op->skipped > HISTORY_WARN_MAX)
        log_warn("accounting: %llu more damaged lines skipped", (unsigned long long)(op->skipped - HISTORY_WARN_MAX));
    for (int i = 0; i < 2; i++)
        if (f[i])
            fclose(f[i]);
    free(line);
    free(r);
}

/* One record as a message; its strings point into r, its tags into tags
 * and ptrs. */
static void record_msg(const acct_record *r, Gradd__AccountRecord *m, Gradd__TagUsage tags[POOL_TAG_COUNT],
                       Gradd__TagUsage *ptrs[POOL_TAG_COUNT])
{
    gradd__account_record__init(m);
    m->id = r->id;
    m->name = (char *)r->name;
    m->uid = r->uid;
    m->user = (char *)r->user;
    m->type = (char *)r->type;
    m->state = (char *)r->state;
    m->reason = (char *)r->reason;
    m->device = (char *)r->device;
    m->devices = r->devices;
    m->submitted_at = r->submitted_at;
    m->started_at = r->started_at;
    m->finished_at = r->finished_at;
    m->elapsed_s = r->elapsed_s;
    m->device_hours = r->device_hours;
    m->mem_peak = r->mem_peak;
    m->resumes = r->resumes;
    m->oom_recoveries = r->oom_recoveries;
    m->steps_done = r->steps_done;
    m->steps = r->steps;
    m->mem_tags = ptrs;
    for (int t = 0; t < POOL_TAG_COUNT; t++) {
        if (!r->tag_peak[t])
            continue;
        Gradd__TagUsage *u = &tags[m->n_mem_tags];
        gradd__tag_usage__init(u);
        u->tag = (char *)pool_tag_name((pool_tag)t);
        u->peak = r->tag_peak[t];
        ptrs[m->n_mem_tags++] = u;
    }
}

static int by_uid(const void *a, const void *b)
{
    uint32_t x = ((const history_user *)a)->uid, y = ((const history_user *)b)->uid;
    return x < y ? -1 : x > y;
}

static void send_summary(const rpc_call *c, history_op *op)
{
    qsort(op->users, op->nusers, sizeof *op->users, by_uid);
    Gradd__UserSummary *us = calloc(op->nusers ? op->nusers : 1, sizeof *us);
    Gradd__UserSummary **ptrs = calloc(op->nusers ? op->nusers : 1, sizeof *ptrs);
    if (!us || !ptrs) {
        rpc_error(c, GRADD__ERROR__CODE__INTERNAL, "out of memory");
    } else {
        for (size_t i = 0; i < op->nusers; i++) {
            const history_user *u = &op->users[i];
            gradd__user_summary__init(&us[i]);
            us[i].uid = u->uid;
            us[i].user = (char *)u->user;
            us[i].jobs = u->jobs;
            us[i].completed = u->completed;
            us[i].failed = u->failed;
            us[i].cancelled = u->cancelled;
            us[i].device_hours = u->device_hours;
            us[i].elapsed_s = u->elapsed_s;
            ptrs[i] = &us[i];
        }
        Gradd__HistoryResponse hr;
        gradd__history_response__init(&hr);
        hr.n_users = op->nusers;
        hr.users = ptrs;
        hr.skipped = op->skipped;
        RPC_SEND(c, HISTORY, history, &hr);
    }
    free(us);
    free(ptrs);
}

/* The records, newest first, HISTORY_FRAME to a frame. */
static void send_records(const rpc_call *c, history_op *op)
{
    Gradd__AccountRecord *msgs = calloc(HISTORY_FRAME, sizeof *msgs);
    Gradd__AccountRecord **ptrs = calloc(HISTORY_FRAME, sizeof *ptrs);
    Gradd__TagUsage(*tags)[POOL_TAG_COUNT] = calloc(HISTORY_FRAME, sizeof *tags);
    Gradd__TagUsage *(*tag_ptrs)[POOL_TAG_COUNT] = calloc(HISTORY_FRAME, sizeof *tag_ptrs);
    if (!msgs || !ptrs || !tags || !tag_ptrs) {
        rpc_error(c, GRADD__ERROR__CODE__INTERNAL, "out of memory");
    } else {
        size_t sent = 0;
        do {
            size_t k = 0;
            for (; k < HISTORY_FRAME && sent + k < op->n; k++) {
                size_t newest = op->n - 1 - (sent + k);
                record_msg(&op->ring[(op->head + newest) % op->limit], &msgs[k], tags[k], tag_ptrs[k]);
                ptrs[k] = &msgs[k];
            }
            sent += k;
            Gradd__HistoryResponse hr;
            gradd__history_response__init(&hr);
            hr.n_records = k;
            hr.records = ptrs;
            hr.more = sent < op->n;
            hr.skipped = op->skipped;
            if (RPC_SEND(c, HISTORY, history, &hr) != 0)
                break;
        } while (sent < op->n);
    }
    free(msgs);
    free(ptrs);
    free(tags);
    free(tag_ptrs);
}

static void history_done(rpc_work *w, const rpc_call *c, rpc_work_status status)
{
    history_op *op = (history_op *)w;
    if (c && status != RPC_WORK_RAN)
        rpc_error(c, GRADD__ERROR__CODE__INTERNAL,
                  status == RPC_WORK_UNSTARTED ? "cannot start reading the accounting" : "history was cancelled");
    else if (c && op->oom)
        rpc_error(c, GRADD__ERROR__CODE__INTERNAL, "out of memory");
    else if (c && op->summary)
        send_summary(c, op);
    else if (c)
        send_records(c, op);
    free(op->ring);
    free(op->users);
    free(op);
}

rpc_work *rpc_history(const rpc_call *c, const Gradd__Request *req)
{
    const Gradd__HistoryRequest *rq = req->history;
    gradd_ctx *ctx = c->ctx;
    char msg[256] = "";
    Gradd__Error__Code code = GRADD__ERROR__CODE__BAD_REQUEST;
    static const char *const states[] = {"completed", "failed", "cancelled"};
    bool state_ok = !rq->state || !*rq->state;
    for (size_t i = 0; i < 3 && !state_ok; i++)
        state_ok = strcmp(rq->state, states[i]) == 0;
    if (!state_ok)
        snprintf(msg, sizeof msg, "history: state: not a final state (completed, failed or cancelled)");
    else if (rq->user && strlen(rq->user) >= sizeof ((history_op *)0)->user)
        snprintf(msg, sizeof msg, "history: user: longer than a user name");
    else if (rq->limit > HISTORY_MAX_LIMIT)
        snprintf(msg, sizeof msg, "history: limit: %u is more than %d", rq->limit, HISTORY_MAX_LIMIT);
    else if (!(rq->since >= 0) || !(rq->until >= 0))
        snprintf(msg, sizeof msg, "history: since and until are unix seconds, 0 or more");
    else if (c->work_pending)
        snprintf(msg, sizeof msg, "history: this connection is already waiting for an answer"),
            code = GRADD__ERROR__CODE__UNAVAILABLE;
    else if (c->work_running >= c->work_slots)
        snprintf(msg, sizeof msg, "history: the daemon is busy with %d slow requests; try again shortly",
                 c->work_slots),
            code = GRADD__ERROR__CODE__UNAVAILABLE;
    acct_log *acct = NULL;
    if (!msg[0] && ctx->q) {
        pthread_mutex_lock(&ctx->q->lock);
        acct = ctx->q->acct;
        pthread_mutex_unlock(&ctx->q->lock);
    }
    if (!msg[0] && !acct)
        snprintf(msg, sizeof msg, "this gradd keeps no accounting"), code = GRADD__ERROR__CODE__UNAVAILABLE;
    history_op *op = msg[0] ? NULL : calloc(1, sizeof *op);
    if (!msg[0] && !op)
        snprintf(msg, sizeof msg, "out of memory"), code = GRADD__ERROR__CODE__INTERNAL;
    if (msg[0]) {
        rpc_error(c, code, msg);
        return NULL;
    }
    op->base.run = history_run;
    op->base.done = history_done;
    op->acct = acct;
    snprintf(op->user, sizeof op->user, "%s", rq->user ? rq->user : "");
    snprintf(op->state, sizeof op->state, "%s", rq->state ? rq->state : "");
    op->since = rq->since;
    op->until = rq->until;
    op->limit = rq->limit ? rq->limit : HISTORY_DEFAULT_LIMIT;
    op->summary = rq->summary;
    return &op->base;
}
