/* rpc.c — request handlers.  Each handler builds its response on the stack
 * (protobuf-c messages point into caller-owned storage) and sends it. */
#include "rpc.h"

#include <math.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "jobs/access.h"
#include "engine/batch.h"
#include "gradd-config.h"
#include "base/log.h"
#include "jobs/queue.h"
#include "jobs/worker.h"
#include "models/model.h"

#define TIMELINE_CHUNK ((size_t)256 << 10)

static void send_error(rpc_send_fn send, void *conn, Gradd__Error__Code code, const char *msg)
{
    Gradd__Response resp;
    Gradd__Error err;
    wire_error_response(&resp, &err, code, msg);
    send(conn, &resp);
}

static void response_init(Gradd__Response *r)
{
    gradd__response__init(r);
    r->version = WIRE_PROTOCOL_VERSION;
}

/* Resolve a request's device selector: "" means all.  Returns the number of
 * indices written, or -1 after sending NOT_FOUND. */
static int select_devices(gradd_ctx *ctx, const char *want, int *idx, rpc_send_fn send, void *conn)
{
    if (!want || !*want) {
        for (int i = 0; i < ctx->ndev; i++)
            idx[i] = i;
        return ctx->ndev;
    }
    int i = ctx_find_device(ctx, want);
    if (i < 0) {
        char msg[256];
        int n = snprintf(msg, sizeof msg, "no device '%s'; this daemon has:", want);
        for (int k = 0; k < ctx->ndev && n < (int)sizeof msg - 20; k++)
            n += snprintf(msg + n, sizeof msg - (size_t)n, " %s", ctx->devs[k]->id);
        send_error(send, conn, GRADD__ERROR__CODE__NOT_FOUND, msg);
        return -1;
    }
    idx[0] = i;
    return 1;
}

/* ---- status -------------------------------------------------------------- */

static void do_status(gradd_ctx *ctx, const rpc_peer *peer, rpc_send_fn send, void *conn)
{
    Gradd__StatusResponse st;
    gradd__status_response__init(&st);
    Gradd__Device devs[CTX_MAX_DEVICES];
    Gradd__Device *ptrs[CTX_MAX_DEVICES];
    pool_stats *ps = malloc(sizeof *ps);
    if (!ps) {
        send_error(send, conn, GRADD__ERROR__CODE__INTERNAL, "out of memory");
        return;
    }
    for (int i = 0; i < ctx->ndev; i++) {
        dev *d = ctx->devs[i];
        Gradd__Device *g = &devs[i];
        gradd__device__init(g);
        g->id = d->id;
        g->name = d->name;
        g->kind = (char *)dev_kind_str(d->kind);
        size_t f = 0, t = 0;
        dev_mem_info(d, &f, &t);
        g->mem_total = t;
        g->mem_free = f;
        pool_stats_read(ctx->pools[i], ps);
        g->pool_reserved = (uint64_t)ps->reserved_bytes[POOL_ALL].current;
        g->pool_allocated = (uint64_t)ps->allocated_bytes[POOL_ALL].current;
        g->fragmentation = ps->fragmentation;
        ptrs[i] = g;
    }
    free(ps);
    st.daemon_version = GRADD_VERSION;
    st.protocol_version = WIRE_PROTOCOL_VERSION;
    st.pid = (int32_t)getpid();
    st.uptime_s = (double)(ctx_now_ns() - ctx->start_ns) / 1e9;
    st.n_devices = (size_t)ctx->ndev;
    st.devices = ptrs;
    st.cuda_note = ctx->cuda_note;
    st.peer_uid = (uint32_t)peer->uid;

    Gradd__Response resp;
    response_init(&resp);
    resp.body_case = GRADD__RESPONSE__BODY_STATUS;
    resp.status = &st;
    send(conn, &resp);
}

/* ---- stats ----------------------------------------------------------------- */

/* Storage for one device's PoolStats message and everything it points to. */
typedef struct {
    Gradd__PoolStats msg;
    Gradd__Stat stat[9][3];
    Gradd__PoolStat pstat[9];
    Gradd__TagUsage tags[POOL_TAG_COUNT];
    Gradd__TagUsage *tag_ptrs[POOL_TAG_COUNT];
    Gradd__JobUsage jobs[POOL_MAX_JOBS];
    Gradd__JobUsage *job_ptrs[POOL_MAX_JOBS];
    Gradd__TagUsage job_tags[POOL_MAX_JOBS][POOL_TAG_COUNT];
    Gradd__TagUsage *job_tag_ptrs[POOL_MAX_JOBS][POOL_TAG_COUNT];
    pool_stats ps;
} stats_store;

static Gradd__PoolStat *fill_pool_stat(stats_store *s, int k, const pool_stat v[3])
{
    static const int order[3] = {POOL_ALL, POOL_SMALL, POOL_LARGE};
    Gradd__Stat *out[3];
    for (int j = 0; j < 3; j++) {
        Gradd__Stat *g = &s->stat[k][j];
        gradd__stat__init(g);
        g->current = v[order[j]].current;
        g->peak = v[order[j]].peak;
        g->allocated = v[order[j]].allocated;
        g->freed = v[order[j]].freed;
        out[j] = g;
    }
    Gradd__PoolStat *p = &s->pstat[k];
    gradd__pool_stat__init(p);
    p->all = out[0];
    p->small = out[1];
    p->large = out[2];
    return p;
}

static void fill_pool_stats(stats_store *s, const char *device_id)
{
    const pool_stats *ps = &s->ps;
    Gradd__PoolStats *m = &s->msg;
    gradd__pool_stats__init(m);
    m->device = (char *)device_id;
    m->cap = ps->cap;
    m->device_total = ps->device_total;
    m->device_free = ps->device_free;
    m->expandable_segments = ps->expandable_segments;
    m->max_split_size = ps->max_split_size;
    m->allocated_bytes = fill_pool_stat(s, 0, ps->allocated_bytes);
    m->reserved_bytes = fill_pool_stat(s, 1, ps->reserved_bytes);
    m->active_bytes = fill_pool_stat(s, 2, ps->active_bytes);
    m->inactive_split_bytes = fill_pool_stat(s, 3, ps->inactive_split_bytes);
    m->requested_bytes = fill_pool_stat(s, 4, ps->requested_bytes);
    m->allocations = fill_pool_stat(s, 5, ps->allocations);
    m->segments = fill_pool_stat(s, 6, ps->segments);
    m->active_blocks = fill_pool_stat(s, 7, ps->active_blocks);
    m->inactive_split_blocks = fill_pool_stat(s, 8, ps->inactive_split_blocks);
    m->device_allocs = ps->device_allocs;
    m->device_frees = ps->device_frees;
    m->cache_hits = ps->cache_hits;
    m->alloc_retries = ps->alloc_retries;
    m->ooms = ps->ooms;
    m->trims = ps->trims;
    m->trimmed_bytes = ps->trimmed_bytes;
    m->trim_ns = ps->trim_ns;
    m->largest_free_block = ps->largest_free_block;
    m->fragmentation = ps->fragmentation;
    for (int t = 0; t < POOL_TAG_COUNT; t++) {
        Gradd__TagUsage *u = &s->tags[t];
        gradd__tag_usage__init(u);
        u->tag = (char *)pool_tag_name((pool_tag)t);
        u->allocated = (uint64_t)ps->tag_current[t];
        u->peak = (uint64_t)ps->tag_peak[t];
        s->tag_ptrs[t] = u;
    }
    m->n_tags = POOL_TAG_COUNT;
    m->tags = s->tag_ptrs;
    for (size_t j = 0; j < ps->njobs && j < POOL_MAX_JOBS; j++) {
        Gradd__JobUsage *u = &s->jobs[j];
        gradd__job_usage__init(u);
        u->job = ps->jobs[j].job;
        u->allocated = (uint64_t)ps->jobs[j].current;
        u->peak = (uint64_t)ps->jobs[j].peak;
        u->limit = ps->jobs[j].limit;
        u->need = ps->jobs[j].need;
        size_t nt = 0;
        for (int t = 0; t < POOL_TAG_COUNT; t++) {
            if (!ps->jobs[j].tag_current[t] && !ps->jobs[j].tag_peak[t])
                continue;
            Gradd__TagUsage *tu = &s->job_tags[j][nt];
            gradd__tag_usage__init(tu);
            tu->tag = (char *)pool_tag_name((pool_tag)t);
            tu->allocated = (uint64_t)ps->jobs[j].tag_current[t];
            tu->peak = (uint64_t)ps->jobs[j].tag_peak[t];
            s->job_tag_ptrs[j][nt++] = tu;
        }
        u->n_tags = nt;
        u->tags = s->job_tag_ptrs[j];
        s->job_ptrs[j] = u;
    }
    m->n_jobs = ps->njobs < POOL_MAX_JOBS ? ps->njobs : POOL_MAX_JOBS;
    m->jobs = s->job_ptrs;
    m->timeline_events = ps->timeline_events;
    m->timeline_dropped = ps->timeline_dropped;
}

static void do_stats(gradd_ctx *ctx, const Gradd__StatsRequest *rq, rpc_send_fn send, void *conn)
{
    int idx[CTX_MAX_DEVICES];
    int n = select_devices(ctx, rq->device, idx, send, conn);
    if (n < 0)
        return;
    stats_store *store = calloc((size_t)(n ? n : 1), sizeof *store);
    Gradd__PoolStats **ptrs = calloc((size_t)(n ? n : 1), sizeof *ptrs);
    if (!store || !ptrs) {
        free(store);
        free(ptrs);
        send_error(send, conn, GRADD__ERROR__CODE__INTERNAL, "out of memory");
        return;
    }
    for (int k = 0; k < n; k++) {
        pool *p = ctx->pools[idx[k]];
        /* Read first, then reset: the reply shows the peaks being cleared. */
        pool_stats_read(p, &store[k].ps);
        if (rq->reset_peaks)
            pool_stats_reset_peaks(p);
        fill_pool_stats(&store[k], ctx->devs[idx[k]]->id);
        ptrs[k] = &store[k].msg;
    }
    Gradd__StatsResponse sr;
    gradd__stats_response__init(&sr);
    sr.n_pools = (size_t)n;
    sr.pools = ptrs;
    Gradd__Response resp;
    response_init(&resp);
    resp.body_case = GRADD__RESPONSE__BODY_STATS;
    resp.stats = &sr;
    send(conn, &resp);
    free(ptrs);
    free(store);
}

/* ---- trim ------------------------------------------------------------------ */

static void do_trim(gradd_ctx *ctx, const rpc_peer *peer, const Gradd__TrimRequest *rq, rpc_send_fn send,
                    void *conn)
{
    int idx[CTX_MAX_DEVICES];
    int n = select_devices(ctx, rq->device, idx, send, conn);
    if (n < 0)
        return;
    Gradd__TrimResult res[CTX_MAX_DEVICES];
    Gradd__TrimResult *ptrs[CTX_MAX_DEVICES];
    for (int k = 0; k < n; k++) {
        pool_trim_result r = pool_trim(ctx->pools[idx[k]], POOL_TRIM_REQUEST, 0);
        gradd__trim_result__init(&res[k]);
        res[k].device = ctx->devs[idx[k]]->id;
        res[k].bytes = r.bytes;
        res[k].segments = r.segments;
        res[k].ns = r.ns;
        res[k].reserved_after = r.reserved_after;
        ptrs[k] = &res[k];
        log_dev(LOG_INFO, ctx->devs[idx[k]]->id, "trim on %s requested by uid %u: released %zu bytes in %zu segments", ctx->devs[idx[k]]->id,
                 (unsigned)peer->uid, r.bytes, r.segments);
    }
    Gradd__TrimResponse tr;
    gradd__trim_response__init(&tr);
    tr.n_results = (size_t)n;
    tr.results = ptrs;
    Gradd__Response resp;
    response_init(&resp);
    resp.body_case = GRADD__RESPONSE__BODY_TRIM;
    resp.trim = &tr;
    send(conn, &resp);
}

/* ---- timeline -------------------------------------------------------------- */

static void do_timeline(gradd_ctx *ctx, const Gradd__TimelineRequest *rq, rpc_send_fn send, void *conn)
{
    int idx[CTX_MAX_DEVICES];
    if ((!rq->device || !*rq->device) && ctx->ndev > 1) {
        send_error(send, conn, GRADD__ERROR__CODE__BAD_REQUEST,
                   "this daemon has several devices; name one with -d DEV");
        return;
    }
    int n = select_devices(ctx, rq->device, idx, send, conn);
    if (n < 0)
        return;
    if (n == 0) {
        send_error(send, conn, GRADD__ERROR__CODE__NOT_FOUND, "this daemon has no devices");
        return;
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    pool_stats ps;
    pool_stats_read(ctx->pools[idx[0]], &ps);
    int rc = f ? pool_timeline_write_json(ctx->pools[idx[0]], f) : -1;
    if (f)
        fclose(f);
    if (rc != 0 || !buf) {
        free(buf);
        send_error(send, conn, GRADD__ERROR__CODE__INTERNAL, "cannot render the timeline");
        return;
    }
    /* Chunks keep every frame far below the cap whatever the ring holds. */
    size_t off = 0;
    do {
        size_t n_chunk = len - off < TIMELINE_CHUNK ? len - off : TIMELINE_CHUNK;
        Gradd__TimelineResponse tl;
        gradd__timeline_response__init(&tl);
        tl.device = ctx->devs[idx[0]]->id;
        tl.chunk.data = (uint8_t *)buf + off;
        tl.chunk.len = n_chunk;
        off += n_chunk;
        tl.last = off >= len;
        tl.events = ps.timeline_events;
        Gradd__Response resp;
        response_init(&resp);
        resp.body_case = GRADD__RESPONSE__BODY_TIMELINE;
        resp.timeline = &tl;
        if (send(conn, &resp) != 0)
            break;
    } while (off < len);
    free(buf);
}

/* ---- test hooks ------------------------------------------------------------- */

static void do_test_pressure(gradd_ctx *ctx, const Gradd__TestPressureRequest *rq, rpc_send_fn send,
                             void *conn)
{
    if (!ctx->test_hooks) {
        send_error(send, conn, GRADD__ERROR__CODE__PERMISSION_DENIED,
                   "test hooks are off; start gradd with --test-hooks to simulate device pressure");
        return;
    }
    int i = ctx_find_device(ctx, rq->device ? rq->device : "");
    if (i < 0 || ctx->devs[i]->kind != DEV_KIND_CPU) {
        send_error(send, conn, GRADD__ERROR__CODE__NOT_FOUND,
                   "simulated pressure needs a cpu device id, e.g. cpu0");
        return;
    }
    if (dev_cpu_set_external(ctx->devs[i], rq->bytes) != DEV_OK) {
        send_error(send, conn, GRADD__ERROR__CODE__UNAVAILABLE,
                   "the device has less free memory than the simulated process asks for");
        return;
    }
    log_dev(LOG_INFO, ctx->devs[i]->id, "test hook: simulated external process now holds %llu bytes of %s",
             (unsigned long long)rq->bytes, ctx->devs[i]->id);
    Gradd__TestPressureResponse tp;
    gradd__test_pressure_response__init(&tp);
    size_t f = 0, t = 0;
    dev_mem_info(ctx->devs[i], &f, &t);
    tp.external = dev_cpu_external(ctx->devs[i]);
    tp.device_free = f;
    Gradd__Response resp;
    response_init(&resp);
    resp.body_case = GRADD__RESPONSE__BODY_TEST_PRESSURE;
    resp.test_pressure = &tp;
    send(conn, &resp);
}

static void do_test_alloc(gradd_ctx *ctx, const Gradd__TestAllocRequest *rq, rpc_send_fn send, void *conn)
{
    if (!ctx->test_hooks) {
        send_error(send, conn, GRADD__ERROR__CODE__PERMISSION_DENIED,
                   "test hooks are off; start gradd with --test-hooks to allocate from a pool by hand");
        return;
    }
    int i = ctx_find_device(ctx, rq->device ? rq->device : "");
    if (i < 0) {
        send_error(send, conn, GRADD__ERROR__CODE__NOT_FOUND, "no such device");
        return;
    }
    pool_tag tag = POOL_TAG_OTHER;
    if (rq->tag && *rq->tag && pool_tag_parse(rq->tag, &tag) != 0) {
        send_error(send, conn, GRADD__ERROR__CODE__BAD_REQUEST, "unknown tag");
        return;
    }
    Gradd__TestAllocResponse ta;
    gradd__test_alloc_response__init(&ta);
    pool_oom_report oom;
    char oom_msg[sizeof oom.message] = "";
    ctx_held *h = &ctx->test_held[i];
    if (rq->free_all) {
        for (size_t k = 0; k < h->n; k++)
            pool_free(ctx->pools[i], h->ptrs[k]);
        h->n = 0;
    } else {
        if (h->n == h->cap) {
            size_t ncap = h->cap ? h->cap * 2 : 64;
            void **np = realloc(h->ptrs, ncap * sizeof *np);
            if (!np) {
                send_error(send, conn, GRADD__ERROR__CODE__INTERNAL, "out of memory");
                return;
            }
            h->ptrs = np;
            h->cap = ncap;
        }
        void *ptr = pool_alloc(ctx->pools[i], rq->bytes, tag, rq->job, &oom);
        if (ptr)
            h->ptrs[h->n++] = ptr;
        else
            snprintf(oom_msg, sizeof oom_msg, "%s", oom.message);
    }
    ta.held = (uint32_t)h->n;
    ta.oom = oom_msg;
    Gradd__Response resp;
    response_init(&resp);
    resp.body_case = GRADD__RESPONSE__BODY_TEST_ALLOC;
    resp.test_alloc = &ta;
    send(conn, &resp);
}

static void do_test_hang(gradd_ctx *ctx, const Gradd__TestHangRequest *rq, rpc_send_fn send, void *conn)
{
    if (!ctx->test_hooks) {
        send_error(send, conn, GRADD__ERROR__CODE__PERMISSION_DENIED,
                   "test hooks are off; start gradd with --test-hooks to hang a job thread");
        return;
    }
    int i = ctx_find_device(ctx, rq->device ? rq->device : "");
    if (i < 0 || !ctx->ws || !ctx->q) {
        send_error(send, conn, GRADD__ERROR__CODE__NOT_FOUND, "test-hang needs a device id with job threads, e.g. cpu0");
        return;
    }
    Gradd__TestHangResponse th;
    gradd__test_hang_response__init(&th);
    pthread_mutex_lock(&ctx->q->lock);
    for (int k = 0; k < ctx->ws->n; k++) {
        worker *w = &ctx->ws->w[k];
        if (w->dev != i)
            continue;
        w->hang = !rq->release;
        th.workers++;
        th.busy += w->busy;
    }
    /* Released threads wait on the queue's condition variable. */
    pthread_cond_broadcast(&ctx->q->cond);
    pthread_mutex_unlock(&ctx->q->lock);
    log_dev(LOG_WARN, ctx->devs[i]->id, "test hook: %u job thread%s of %s %s", th.workers, th.workers == 1 ? "" : "s",
            ctx->devs[i]->id, rq->release ? "released" : "told to hang at the next poll");
    Gradd__Response resp;
    response_init(&resp);
    resp.body_case = GRADD__RESPONSE__BODY_TEST_HANG;
    resp.test_hang = &th;
    send(conn, &resp);
}

/* ---- jobs ----------------------------------------------------------------------- */

int rpc_job_info(gradd_ctx *ctx, const job *j, rpc_job_store *st)
{
    Gradd__JobInfo *m = &st->msg;
    gradd__job_info__init(m);
    snprintf(st->name, sizeof st->name, "%s", j->name);
    snprintf(st->user, sizeof st->user, "%s", j->user);
    snprintf(st->device, sizeof st->device, "%s", j->device[0] ? j->device : j->cfg.device);
    snprintf(st->reason, sizeof st->reason, "%s", j->reason);
    snprintf(st->out_dir, sizeof st->out_dir, "%s", j->cfg.out_dir);
    snprintf(st->job_file, sizeof st->job_file, "%s", j->source);
    m->id = j->id;
    m->name = st->name;
    m->uid = (uint32_t)j->uid;
    m->user = st->user;
    m->state = (char *)job_state_name(j->state);
    m->device = st->device;
    m->priority = j->priority;
    m->steps = j->cfg.steps;
    m->val_loss = NAN;
    m->val_accuracy = NAN;
    m->loss = NAN;
    m->unit = (char *)model_unit(&j->cfg);
    if (!j->have_progress && j->cfg.micro_batch) {
        /* Not started yet: a fixed micro-batch is already known. */
        m->micro = j->cfg.micro_batch;
        m->accum = batch_accum(j->cfg.batch, j->cfg.micro_batch);
    }
    if (j->have_progress) {
        m->step = j->prog.step;
        m->loss = j->prog.loss;
        m->val_loss = j->prog.val_loss;
        m->val_accuracy = j->prog.val_accuracy;
        m->micro = j->prog.micro;
        m->accum = j->prog.accum;
        m->units_per_s = j->prog.units_per_s;
        m->elapsed_s = j->prog.elapsed_s;
        m->micro_max = j->prog.micro_max;
        m->micro_fit = j->prog.micro_fit;
        m->oom_recoveries = j->prog.oom_recoveries;
        if (j->prog.batch_changes) {
            m->change_from = j->prog.change_from;
            m->change_to = j->prog.change_to;
            m->change_step = j->prog.change_step;
            snprintf(st->change_reason, sizeof st->change_reason, "%s", j->prog.change_reason);
            m->change_reason = st->change_reason;
        }
    }
    m->submitted_at = j->submitted_at;
    m->started_at = j->started_at;
    m->finished_at = j->finished_at;
    m->reason = st->reason;
    m->out_dir = st->out_dir;
    m->job_file = st->job_file;
    m->resumes = j->resumes;
    /* Memory by tag from the pool the job runs in. */
    m->n_mem_tags = 0;
    m->mem_tags = st->tag_ptrs;
    int di = j->state == JOB_RUNNING ? ctx_find_device(ctx, j->device) : -1;
    if (di >= 0) {
        pool_stats *ps = malloc(sizeof *ps);
        if (ps) {
            pool_stats_read(ctx->pools[di], ps);
            for (size_t r = 0; r < ps->njobs; r++) {
                if (ps->jobs[r].job != j->id)
                    continue;
                m->mem_allocated = (uint64_t)ps->jobs[r].current;
                for (int t = 0; t < POOL_TAG_COUNT; t++) {
                    if (!ps->jobs[r].tag_current[t] && !ps->jobs[r].tag_peak[t])
                        continue;
                    Gradd__TagUsage *u = &st->tags[m->n_mem_tags];
                    gradd__tag_usage__init(u);
                    u->tag = (char *)pool_tag_name((pool_tag)t);
                    u->allocated = (uint64_t)ps->jobs[r].tag_current[t];
                    u->peak = (uint64_t)ps->jobs[r].tag_peak[t];
                    st->tag_ptrs[m->n_mem_tags++] = u;
                }
            }
            free(ps);
        }
    }
    return 0;
}

static void send_job(gradd_ctx *ctx, job *j, rpc_send_fn send, void *conn, bool cancel_reply)
{
    rpc_job_store *st = malloc(sizeof *st);
    if (!st) {
        pthread_mutex_unlock(&ctx->q->lock);
        send_error(send, conn, GRADD__ERROR__CODE__INTERNAL, "out of memory");
        return;
    }
    rpc_job_info(ctx, j, st);
    pthread_mutex_unlock(&ctx->q->lock);
    Gradd__Response resp;
    response_init(&resp);
    Gradd__CancelResponse cr;
    if (cancel_reply) {
        gradd__cancel_response__init(&cr);
        cr.job = &st->msg;
        resp.body_case = GRADD__RESPONSE__BODY_CANCEL;
        resp.cancel = &cr;
    } else {
        resp.body_case = GRADD__RESPONSE__BODY_JOB;
        resp.job = &st->msg;
    }
    send(conn, &resp);
    free(st);
}

/* Look a job up with the queue locked; on failure the lock is released and
 * an error sent. */
static job *locked_job(gradd_ctx *ctx, uint32_t id, rpc_send_fn send, void *conn)
{
    if (!ctx->q) {
        send_error(send, conn, GRADD__ERROR__CODE__UNAVAILABLE, "this gradd has no job queue");
        return NULL;
    }
    pthread_mutex_lock(&ctx->q->lock);
    job *j = queue_find(ctx->q, id);
    if (!j) {
        pthread_mutex_unlock(&ctx->q->lock);
        char msg[64];
        snprintf(msg, sizeof msg, "no job %u", id);
        send_error(send, conn, GRADD__ERROR__CODE__NOT_FOUND, msg);
    }
    return j;
}

/* locked_job, for what only its owner, root or the admin group may do
 * (`what`, e.g. "cancel it"): NULL, unlocked and answered, for anyone else. */
static job *owned_job(gradd_ctx *ctx, const rpc_peer *peer, uint32_t id, const char *what, rpc_send_fn send,
                      void *conn)
{
    job *j = locked_job(ctx, id, send, conn);
    if (!j || j->uid == peer->uid || access_is_admin(peer->uid, peer->gid, ctx->cfg.admin_group))
        return j;
    char msg[256];
    snprintf(msg, sizeof msg, "job %u belongs to %s; only its owner, root or group '%s' may %s", id, j->user,
             ctx->cfg.admin_group, what);
    pthread_mutex_unlock(&ctx->q->lock);
    send_error(send, conn, GRADD__ERROR__CODE__PERMISSION_DENIED, msg);
    return NULL;
}

static void user_name(uid_t uid, char *buf, size_t len)
{
    struct passwd pw, *res = NULL;
    char tmp[4096];
    if (getpwuid_r(uid, &pw, tmp, sizeof tmp, &res) == 0 && res)
        snprintf(buf, len, "%s", pw.pw_name);
    else
        snprintf(buf, len, "%u", (unsigned)uid);
}

static void do_submit(gradd_ctx *ctx, const rpc_peer *peer, const Gradd__SubmitRequest *rq, rpc_send_fn send,
                      void *conn)
{
    char msg[1400];
    if (!ctx->q) {
        send_error(send, conn, GRADD__ERROR__CODE__UNAVAILABLE, "this gradd has no job queue");
        return;
    }
    const char *path = rq->path && *rq->path ? rq->path : "";
    if (path[0] != '/') {
        send_error(send, conn, GRADD__ERROR__CODE__BAD_REQUEST, "submit: the job file path must be absolute");
        return;
    }
    uint64_t limit = config_job_file_limit(&ctx->cfg);
    if (rq->contents.len > limit) {
        snprintf(msg, sizeof msg,
                 "%s: %zu bytes is more than this daemon accepts (%llu: [daemon] max_job_file, at most max_frame "
                 "less %d)",
                 path, rq->contents.len, (unsigned long long)limit, CONFIG_SUBMIT_ENVELOPE);
        send_error(send, conn, GRADD__ERROR__CODE__BAD_JOB, msg);
        return;
    }
    job_config *cfg = malloc(sizeof *cfg);
    if (!cfg) {
        send_error(send, conn, GRADD__ERROR__CODE__INTERNAL, "out of memory");
        return;
    }
    char err[1024];
    /* Parsed as the submitter: the parser checks that the data files are
     * readable, and that is the owner's question, not the daemon's. */
    access_saved saved;
    if (access_become(peer->uid, peer->gid, &saved, err, sizeof err) != 0) {
        send_error(send, conn, GRADD__ERROR__CODE__BAD_JOB, err);
        goto out;
    }
    int lrc = jobcfg_load_mem(rq->contents.data, rq->contents.len, path, cfg, err, sizeof err);
    if (lrc == 0)
        lrc = model_check_job(cfg, err, sizeof err);
    access_restore(&saved);
    if (lrc != 0) {
        send_error(send, conn, GRADD__ERROR__CODE__BAD_JOB, err);
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
            send_error(send, conn, GRADD__ERROR__CODE__BAD_REQUEST, msg);
            goto out;
        }
        snprintf(cfg->name, sizeof cfg->name, "%s", rq->name);
    }
    if (rq->has_priority) {
        if (rq->priority < 0 || rq->priority > JOBCFG_PRIORITY_MAX) {
            snprintf(msg, sizeof msg, "submit: priority %lld is not from 0 to %d", (long long)rq->priority,
                     JOBCFG_PRIORITY_MAX);
            send_error(send, conn, GRADD__ERROR__CODE__BAD_REQUEST, msg);
            goto out;
        }
        cfg->priority = rq->priority;
    }
    char where[PATH_MAX + 64];
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
        snprintf(msg, sizeof msg, "%s: no device '%s' on this daemon%s%s",
                 jobcfg_where(cfg, "job", "device", where, sizeof where), cfg->device, ctx->cuda_note[0] ? "; " : "",
                 ctx->cuda_note);
        send_error(send, conn, GRADD__ERROR__CODE__BAD_JOB, msg);
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
        send_error(send, conn, GRADD__ERROR__CODE__BAD_JOB, msg);
        goto out;
    }
    pthread_mutex_lock(&ctx->q->lock);
    size_t active = queue_active_for(ctx->q, peer->uid);
    pthread_mutex_unlock(&ctx->q->lock);
    if (active >= ctx->cfg.max_queued_per_user) {
        snprintf(msg, sizeof msg, "uid %u already has %zu queued or running jobs ([daemon] max_queued_per_user)",
                 (unsigned)peer->uid, active);
        send_error(send, conn, GRADD__ERROR__CODE__PERMISSION_DENIED, msg);
        goto out;
    }
    /* Everything the job will read or write, checked as its owner. */
    if (access_check_job(peer->uid, peer->gid, cfg, err, sizeof err) != 0) {
        send_error(send, conn, GRADD__ERROR__CODE__BAD_JOB, err);
        goto out;
    }
    char user[64];
    user_name(peer->uid, user, sizeof user);
    uint32_t id;
    if (queue_submit(ctx->q, cfg, rq->contents.data, rq->contents.len, peer->uid, peer->gid, user, &id, err,
                     sizeof err) != 0) {
        send_error(send, conn, GRADD__ERROR__CODE__INTERNAL, err);
        goto out;
    }
    log_job(LOG_INFO, id, NULL, "job %u (%s) submitted by %s (uid %u) from %s", id, cfg->name, user, (unsigned)peer->uid, path);
    Gradd__SubmitResponse sr;
    gradd__submit_response__init(&sr);
    sr.id = id;
    sr.name = cfg->name;
    Gradd__Response resp;
    response_init(&resp);
    resp.body_case = GRADD__RESPONSE__BODY_SUBMIT;
    resp.submit = &sr;
    send(conn, &resp);
out:
    free(cfg);
}

/* Jobs per ListResponse frame: a few MB of rpc_job_store at most, and a
 * frame far below any cap, however many finished jobs are kept. */
#define LIST_CHUNK 256

static bool list_wants(const Gradd__ListRequest *rq, job_state want_state, const job *j)
{
    if (want_state != JOB_STATE_COUNT && j->state != want_state)
        return false;
    if (rq->user && *rq->user) {
        char uid[16];
        snprintf(uid, sizeof uid, "%u", (unsigned)j->uid);
        if (strcmp(rq->user, j->user) != 0 && strcmp(rq->user, uid) != 0)
            return false;
    }
    return true;
}

static void do_list(gradd_ctx *ctx, const Gradd__ListRequest *rq, rpc_send_fn send, void *conn)
{
    if (!ctx->q) {
        send_error(send, conn, GRADD__ERROR__CODE__UNAVAILABLE, "this gradd has no job queue");
        return;
    }
    job_state want_state = JOB_STATE_COUNT;
    if (rq->state && *rq->state && job_state_parse(rq->state, &want_state) != 0) {
        send_error(send, conn, GRADD__ERROR__CODE__BAD_REQUEST,
                   "unknown state; use queued, running, completed, failed or cancelled");
        return;
    }
    rpc_job_store *st = calloc(LIST_CHUNK, sizeof *st);
    Gradd__JobInfo **ptrs = calloc(LIST_CHUNK, sizeof *ptrs);
    if (!st || !ptrs) {
        free(st);
        free(ptrs);
        send_error(send, conn, GRADD__ERROR__CODE__INTERNAL, "out of memory");
        return;
    }
    /* Frame by frame, each under the lock on its own: a chunk starts after
     * the last id sent, so jobs that come or go in between are listed at
     * most once. */
    uint32_t after = 0;
    bool more = true;
    while (more) {
        size_t k = 0;
        pthread_mutex_lock(&ctx->q->lock);
        size_t i = 0, n = ctx->q->n;
        while (i < n && ctx->q->jobs[i]->id <= after)
            i++;
        for (; i < n && k < LIST_CHUNK; i++) {
            job *j = ctx->q->jobs[i];
            if (!list_wants(rq, want_state, j))
                continue;
            rpc_job_info(ctx, j, &st[k]);
            ptrs[k] = &st[k].msg;
            k++;
            after = j->id;
        }
        more = i < n;
        pthread_mutex_unlock(&ctx->q->lock);
        Gradd__ListResponse lr;
        gradd__list_response__init(&lr);
        lr.n_jobs = k;
        lr.jobs = ptrs;
        lr.more = more;
        Gradd__Response resp;
        response_init(&resp);
        resp.body_case = GRADD__RESPONSE__BODY_LIST;
        resp.list = &lr;
        if (send(conn, &resp) != 0)
            break;
    }
    free(st);
    free(ptrs);
}

static double now_unix(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void do_cancel(gradd_ctx *ctx, const rpc_peer *peer, uint32_t id, rpc_send_fn send, void *conn)
{
    job *j = owned_job(ctx, peer, id, "cancel it", send, conn);
    if (!j)
        return;
    char msg[256];
    if (j->state == JOB_QUEUED) {
        j->state = JOB_CANCELLED;
        j->finished_at = now_unix();
        snprintf(j->reason, sizeof j->reason, "cancelled by uid %u before it started", (unsigned)peer->uid);
        queue_persist_or_retry(ctx->q, j, NULL);
    } else if (j->state == JOB_RUNNING) {
        /* The worker stops at its next poll (between layers) and checkpoints. */
        j->cancel_requested = true;
    } else {
        snprintf(msg, sizeof msg, "job %u is already %s", id, job_state_name(j->state));
        pthread_mutex_unlock(&ctx->q->lock);
        send_error(send, conn, GRADD__ERROR__CODE__BAD_REQUEST, msg);
        return;
    }
    queue_touch(ctx->q, j);
    log_job(LOG_INFO, id, j->device, "job %u cancel requested by uid %u", id, (unsigned)peer->uid);
    send_job(ctx, j, send, conn, true); /* unlocks */
    queue_notify(ctx->q);
}

static void do_remove(gradd_ctx *ctx, const rpc_peer *peer, uint32_t id, rpc_send_fn send, void *conn)
{
    job *j = owned_job(ctx, peer, id, "remove it", send, conn);
    if (!j)
        return;
    char msg[512], name[sizeof j->name];
    snprintf(name, sizeof name, "%s", j->name);
    int rc = queue_remove(ctx->q, id, msg, sizeof msg);
    pthread_mutex_unlock(&ctx->q->lock);
    if (rc != 0) {
        send_error(send, conn, GRADD__ERROR__CODE__BAD_REQUEST, msg);
        return;
    }
    log_job(LOG_INFO, id, NULL, "job %u (%s) removed by uid %u", id, name, (unsigned)peer->uid);
    Gradd__RemoveResponse rr;
    gradd__remove_response__init(&rr);
    rr.id = id;
    rr.name = name;
    Gradd__Response resp;
    response_init(&resp);
    resp.body_case = GRADD__RESPONSE__BODY_REMOVE;
    resp.remove = &rr;
    send(conn, &resp);
}

/* A job's log is its owner's, as a batch job's output file would be: it
 * can name their files and say why they failed. */
static void do_logs(gradd_ctx *ctx, const rpc_peer *peer, uint32_t id, rpc_send_fn send, void *conn)
{
    job *j = owned_job(ctx, peer, id, "read its log", send, conn);
    if (!j)
        return;
    char path[PATH_MAX + 32];
    queue_log_path(ctx->q, id, path, sizeof path);
    pthread_mutex_unlock(&ctx->q->lock);
    FILE *f = fopen(path, "r");
    char *buf = malloc(TIMELINE_CHUNK);
    if (!buf) {
        if (f)
            fclose(f);
        send_error(send, conn, GRADD__ERROR__CODE__INTERNAL, "out of memory");
        return;
    }
    bool last = false;
    while (!last) {
        size_t n = f ? fread(buf, 1, TIMELINE_CHUNK, f) : 0;
        last = n < TIMELINE_CHUNK;
        Gradd__LogsResponse lr;
        gradd__logs_response__init(&lr);
        lr.chunk.data = (uint8_t *)buf;
        lr.chunk.len = n;
        lr.last = last;
        Gradd__Response resp;
        response_init(&resp);
        resp.body_case = GRADD__RESPONSE__BODY_LOGS;
        resp.logs = &lr;
        if (send(conn, &resp) != 0)
            break;
    }
    free(buf);
    if (f)
        fclose(f);
}

/* Prometheus text exposition (0.0.4): the daemon, devices, pools, jobs. */
static void do_metrics(gradd_ctx *ctx, rpc_send_fn send, void *conn)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    pool_stats *ps = malloc(sizeof *ps);
    if (!f || !ps) {
        if (f)
            fclose(f);
        free(text);
        free(ps);
        send_error(send, conn, GRADD__ERROR__CODE__INTERNAL, "out of memory");
        return;
    }
    fprintf(f, "# HELP gradd_up Whether gradd is serving.\n# TYPE gradd_up gauge\ngradd_up 1\n");
    fprintf(f, "# HELP gradd_uptime_seconds Seconds since gradd started.\n# TYPE gradd_uptime_seconds gauge\n");
    fprintf(f, "gradd_uptime_seconds %.3f\n", (double)(ctx_now_ns() - ctx->start_ns) / 1e9);
    /* The type is spelled out: "_total" in a name is no guide, since
     * gradd_device_memory_total_bytes is a gauge. */
    static const struct {
        const char *name, *type, *help;
    } dm[] = {
        {"gradd_device_memory_total_bytes", "gauge", "Device memory as the device reports it."},
        {"gradd_device_memory_free_bytes", "gauge", "Free device memory, other processes included."},
        {"gradd_pool_allocated_bytes", "gauge", "Bytes in live blocks of the pool."},
        {"gradd_pool_reserved_bytes", "gauge", "Bytes the pool holds from the device."},
        {"gradd_pool_cap_bytes", "gauge", "The pool's cap (memory_fraction of the device)."},
        {"gradd_pool_largest_free_block_bytes", "gauge", "Largest cached free block."},
        {"gradd_pool_fragmentation_ratio", "gauge", "1 - largest free block / cached bytes."},
        {"gradd_pool_device_allocs_total", "counter", "Device allocations made by the pool."},
        {"gradd_pool_cache_hits_total", "counter", "Allocations served from the cache."},
        {"gradd_pool_ooms_total", "counter", "Allocations that failed."},
        {"gradd_pool_trims_total", "counter", "Cache trims."},
        {"gradd_pool_trimmed_bytes_total", "counter", "Bytes returned to the device by trims."},
    };
    enum { NDM = sizeof dm / sizeof dm[0] };
    /* One reading per device, so that the families agree with each other. */
    double(*dv)[NDM] = calloc(ctx->ndev > 0 ? (size_t)ctx->ndev : 1, sizeof *dv);
    if (!dv) {
        fclose(f);
        free(text);
        free(ps);
        send_error(send, conn, GRADD__ERROR__CODE__INTERNAL, "out of memory");
        return;
    }
    for (int i = 0; i < ctx->ndev; i++) {
        size_t fr = 0, tot = 0;
        dev_mem_info(ctx->devs[i], &fr, &tot);
        pool_stats_read(ctx->pools[i], ps);
        double v[NDM] = {(double)tot, (double)fr, (double)ps->allocated_bytes[POOL_ALL].current,
                         (double)ps->reserved_bytes[POOL_ALL].current, (double)ps->cap,
                         (double)ps->largest_free_block, ps->fragmentation, (double)ps->device_allocs,
                         (double)ps->cache_hits, (double)ps->ooms, (double)ps->trims, (double)ps->trimmed_bytes};
        memcpy(dv[i], v, sizeof v);
    }
    for (size_t m = 0; m < NDM; m++) {
        fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", dm[m].name, dm[m].help, dm[m].name, dm[m].type);
        for (int i = 0; i < ctx->ndev; i++)
            fprintf(f, "%s{device=\"%s\",kind=\"%s\"} %.17g\n", dm[m].name, ctx->devs[i]->id,
                    dev_kind_str(ctx->devs[i]->kind), dv[i][m]);
    }
    free(dv);
    fprintf(f, "# HELP gradd_pool_tag_allocated_bytes Live bytes by tag.\n# TYPE gradd_pool_tag_allocated_bytes gauge\n");
    for (int i = 0; i < ctx->ndev; i++) {
        pool_stats_read(ctx->pools[i], ps);
        for (int t = 0; t < POOL_TAG_COUNT; t++)
            fprintf(f, "gradd_pool_tag_allocated_bytes{device=\"%s\",tag=\"%s\"} %lld\n", ctx->devs[i]->id,
                    pool_tag_name((pool_tag)t), (long long)ps->tag_current[t]);
    }
    if (ctx->q) {
        pthread_mutex_lock(&ctx->q->lock);
        size_t counts[JOB_STATE_COUNT] = {0};
        for (size_t i = 0; i < ctx->q->n; i++)
            counts[ctx->q->jobs[i]->state]++;
        fprintf(f, "# HELP gradd_jobs Jobs by state.\n# TYPE gradd_jobs gauge\n");
        for (int s = 0; s < JOB_STATE_COUNT; s++)
            fprintf(f, "gradd_jobs{state=\"%s\"} %zu\n", job_state_name((job_state)s), counts[s]);
        static const char *const jm[][2] = {
            {"gradd_job_step", "Optimizer steps done."},
            {"gradd_job_steps", "Optimizer steps in the job."},
            {"gradd_job_loss", "Training loss of the last step."},
            {"gradd_job_units_per_second", "Tokens (gpt) or samples (mlp) per second."},
            {"gradd_job_micro_batch", "Current micro-batch size."},
        };
        for (size_t m = 0; m < sizeof jm / sizeof jm[0]; m++) {
            fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", jm[m][0], jm[m][1], jm[m][0]);
            for (size_t i = 0; i < ctx->q->n; i++) {
                job *j = ctx->q->jobs[i];
                if (j->state != JOB_RUNNING || !j->have_progress)
                    continue;
                double v[] = {(double)j->prog.step, (double)j->prog.steps, j->prog.loss, j->prog.units_per_s,
                              (double)j->prog.micro};
                /* Names and users are user-controlled: escape for the format. */
                char name[160];
                size_t o = 0;
                for (const char *c = j->name; *c && o < sizeof name - 3; c++) {
                    if (*c == '"' || *c == '\\')
                        name[o++] = '\\';
                    name[o++] = *c == '\n' ? ' ' : *c;
                }
                name[o] = '\0';
                /* The exposition format spells these out; a skipped fp16
                 * step's loss is not 0. */
                char val[32];
                if (isnan(v[m]))
                    snprintf(val, sizeof val, "NaN");
                else if (isinf(v[m]))
                    snprintf(val, sizeof val, "%cInf", v[m] > 0 ? '+' : '-');
                else
                    snprintf(val, sizeof val, "%.17g", v[m]);
                fprintf(f, "%s{job=\"%u\",name=\"%s\",user=\"%s\",device=\"%s\"} %s\n", jm[m][0], j->id,
                        name, j->user, j->device, val);
            }
        }
        pthread_mutex_unlock(&ctx->q->lock);
    }
    fclose(f);
    free(ps);
    Gradd__MetricsResponse mr;
    gradd__metrics_response__init(&mr);
    mr.text = text;
    Gradd__Response resp;
    response_init(&resp);
    resp.body_case = GRADD__RESPONSE__BODY_METRICS;
    resp.metrics = &mr;
    send(conn, &resp);
    free(text);
}

/* ---- dispatch ---------------------------------------------------------------- */

void rpc_dispatch(gradd_ctx *ctx, const rpc_peer *peer, const Gradd__Request *req, rpc_send_fn send,
                  void *conn)
{
    switch (req->body_case) {
    case GRADD__REQUEST__BODY_STATUS:
        do_status(ctx, peer, send, conn);
        return;
    case GRADD__REQUEST__BODY_STATS:
        do_stats(ctx, req->stats, send, conn);
        return;
    case GRADD__REQUEST__BODY_TRIM:
        do_trim(ctx, peer, req->trim, send, conn);
        return;
    case GRADD__REQUEST__BODY_TIMELINE:
        do_timeline(ctx, req->timeline, send, conn);
        return;
    case GRADD__REQUEST__BODY_TEST_PRESSURE:
        do_test_pressure(ctx, req->test_pressure, send, conn);
        return;
    case GRADD__REQUEST__BODY_TEST_ALLOC:
        do_test_alloc(ctx, req->test_alloc, send, conn);
        return;
    case GRADD__REQUEST__BODY_TEST_HANG:
        do_test_hang(ctx, req->test_hang, send, conn);
        return;
    case GRADD__REQUEST__BODY_SUBMIT:
        do_submit(ctx, peer, req->submit, send, conn);
        return;
    case GRADD__REQUEST__BODY_LIST:
        do_list(ctx, req->list, send, conn);
        return;
    case GRADD__REQUEST__BODY_JOB: {
        job *j = locked_job(ctx, req->job->id, send, conn);
        if (j)
            send_job(ctx, j, send, conn, false); /* unlocks */
        return;
    }
    case GRADD__REQUEST__BODY_CANCEL:
        do_cancel(ctx, peer, req->cancel->id, send, conn);
        return;
    case GRADD__REQUEST__BODY_REMOVE:
        do_remove(ctx, peer, req->remove->id, send, conn);
        return;
    case GRADD__REQUEST__BODY_LOGS:
        do_logs(ctx, peer, req->logs->id, send, conn);
        return;
    case GRADD__REQUEST__BODY_METRICS:
        do_metrics(ctx, send, conn);
        return;
    case GRADD__REQUEST__BODY_WATCH:
        send_error(send, conn, GRADD__ERROR__CODE__INTERNAL, "watch is handled by the server");
        return;
    case GRADD__REQUEST__BODY_SAMPLE:
        send_error(send, conn, GRADD__ERROR__CODE__INTERNAL, "sample is handled by the server");
        return;
    case GRADD__REQUEST__BODY__NOT_SET:
    default:
        send_error(send, conn, GRADD__ERROR__CODE__BAD_REQUEST,
                   "request has no body this daemon knows (a newer gradctl?)");
        return;
    }
}
