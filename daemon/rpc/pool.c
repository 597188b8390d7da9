/* pool.c — the requests about devices and their pools: status, stats,
 * trim and timeline.  Each reads what the pools publish; only trim asks a
 * pool to act. */
#include "rpc_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/log.h"
#include "gradd-config.h"

/* How long gradctl trim waits for the program jobs' pools to answer. */
#define RPC_TRIM_WAIT_NS ((uint64_t)200000000)

/* Resolve a request's device selector: "" means all.  Returns the number of
 * indices written, or -1 after sending NOT_FOUND. */
static int select_devices(const rpc_call *c, const char *want, int *idx)
{
    gradd_ctx *ctx = c->ctx;
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
        rpc_error(c, GRADD__ERROR__CODE__NOT_FOUND, msg);
        return -1;
    }
    idx[0] = i;
    return 1;
}

/* ---- status -------------------------------------------------------------- */

void rpc_status(const rpc_call *c, const Gradd__Request *req)
{
    (void)req;
    gradd_ctx *ctx = c->ctx;
    Gradd__StatusResponse st;
    gradd__status_response__init(&st);
    Gradd__Device devs[CTX_MAX_DEVICES];
    Gradd__Device *ptrs[CTX_MAX_DEVICES];
    rpc_procs *procs[CTX_MAX_DEVICES] = {0};
    pool_stats *ps = malloc(sizeof *ps);
    if (!ps) {
        rpc_error(c, GRADD__ERROR__CODE__INTERNAL, "out of memory");
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
        size_t prog_alloc = 0, prog_res = pool_peers_reserved(ctx->peers[i], &prog_alloc);
        /* The device's figures: the daemon's pool and the programs' own. */
        g->pool_reserved = (uint64_t)ps->reserved_bytes[POOL_ALL].current + prog_res;
        g->pool_allocated = (uint64_t)ps->allocated_bytes[POOL_ALL].current + prog_alloc;
        g->fragmentation = ps->fragmentation;
        procs[i] = rpc_procs_fill(ctx, i, (uint64_t)ps->reserved_bytes[POOL_ALL].current, g);
        if (!procs[i])
            g->process_note = (char *)"out of memory listing the processes";
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
    st.peer_uid = (uint32_t)c->peer->uid;

    RPC_SEND(c, STATUS, status, &st);
    for (int i = 0; i < ctx->ndev; i++)
        rpc_procs_free(procs[i]);
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
    m->idle_trims = ps->idle_trims;
    m->idle_trimmed_bytes = ps->idle_trimmed_bytes;
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

void rpc_stats(const rpc_call *c, const Gradd__Request *req)
{
    gradd_ctx *ctx = c->ctx;
    const Gradd__StatsRequest *rq = req->stats;
    int idx[CTX_MAX_DEVICES];
    /* Plain statistics are for everyone; clearing the peaks that every
     * user reads is not. */
    if (rq->reset_peaks && !rpc_need_admin(c, "resetting the peaks of pools that all users share"))
        return;
    int n = select_devices(c, rq->device, idx);
    if (n < 0)
        return;
    /* Each device's pool, then the program jobs' pools on it. */
    pool_peer_view *views[CTX_MAX_DEVICES] = {0};
    size_t nviews[CTX_MAX_DEVICES] = {0}, total = (size_t)n;
    for (int k = 0; k < n; k++) {
        views[k] = pool_peers_read(ctx->peers[idx[k]], &nviews[k]);
        total += nviews[k];
    }
    stats_store *store = calloc(total ? total : 1, sizeof *store);
    Gradd__PoolStats **ptrs = calloc(total ? total : 1, sizeof *ptrs);
    if (!store || !ptrs) {
        free(store);
        free(ptrs);
        for (int k = 0; k < n; k++)
            free(views[k]);
        rpc_error(c, GRADD__ERROR__CODE__INTERNAL, "out of memory");
        return;
    }
    size_t m = 0;
    for (int k = 0; k < n; k++) {
        pool *p = ctx->pools[idx[k]];
        /* Read first, then reset: the reply shows the peaks being cleared. */
        pool_stats_read(p, &store[m].ps);
        if (rq->reset_peaks)
            pool_stats_reset_peaks(p);
        fill_pool_stats(&store[m], ctx->devs[idx[k]]->id);
        ptrs[m] = &store[m].msg;
        m++;
        for (size_t v = 0; v < nviews[k]; v++) {
            if (!views[k][v].live)
                continue;
            store[m].ps = views[k][v].stats;
            fill_pool_stats(&store[m], ctx->devs[idx[k]]->id);
            store[m].msg.job = views[k][v].job;
            store[m].msg.pid = views[k][v].pid;
            store[m].msg.reclaims = views[k][v].reclaims;
            ptrs[m] = &store[m].msg;
            m++;
        }
    }
    Gradd__StatsResponse sr;
    gradd__stats_response__init(&sr);
    sr.n_pools = m;
    sr.pools = ptrs;
    RPC_SEND(c, STATS, stats, &sr);
    free(ptrs);
    free(store);
    for (int k = 0; k < n; k++)
        free(views[k]);
}

/* ---- trim ------------------------------------------------------------------ */

void rpc_trim(const rpc_call *c, const Gradd__Request *req)
{
    gradd_ctx *ctx = c->ctx;
    const Gradd__TrimRequest *rq = req->trim;
    /* A trim empties the cache that every user's jobs allocate from: at
     * will, one user could keep everyone's jobs paying for device allocs. */
    if (!rpc_need_admin(c, "trimming pools that all users share"))
        return;
    int idx[CTX_MAX_DEVICES];
    int n = select_devices(c, rq->device, idx);
    if (n < 0)
        return;
    Gradd__TrimResult res[CTX_MAX_DEVICES];
    Gradd__TrimResult *ptrs[CTX_MAX_DEVICES];
    for (int k = 0; k < n; k++) {
        uint64_t t0 = ctx_now_ns();
        pool_trim_result r = pool_trim(ctx->pools[idx[k]], POOL_TRIM_REQUEST, 0);
        /* And the program jobs' own pools: a program that does not answer
         * within the wait is reported, not waited for. */
        size_t answered = 0, programs = pool_peers_count(ctx->peers[idx[k]]);
        size_t prog_bytes = programs ? pool_peers_trim(ctx->peers[idx[k]], RPC_TRIM_WAIT_NS, &answered) : 0;
        size_t prog_alloc = 0, prog_res = programs ? pool_peers_reserved(ctx->peers[idx[k]], &prog_alloc) : 0;
        gradd__trim_result__init(&res[k]);
        res[k].device = ctx->devs[idx[k]]->id;
        res[k].bytes = r.bytes + prog_bytes;
        res[k].segments = r.segments;
        res[k].ns = programs ? ctx_now_ns() - t0 : r.ns;
        res[k].reserved_after = r.reserved_after + prog_res;
        ptrs[k] = &res[k];
        log_dev(LOG_INFO, ctx->devs[idx[k]]->id,
                "trim on %s requested by uid %u: released %zu bytes in %zu segments, and %zu bytes of %zu "
                "program pools (%zu answered)",
                ctx->devs[idx[k]]->id, (unsigned)c->peer->uid, r.bytes, r.segments, prog_bytes, programs, answered);
    }
    Gradd__TrimResponse tr;
    gradd__trim_response__init(&tr);
    tr.n_results = (size_t)n;
    tr.results = ptrs;
    RPC_SEND(c, TRIM, trim, &tr);
}

/* ---- timeline -------------------------------------------------------------- */

/* timeline, as a stream: the ring is copied when asked (a few MB at
 * most), and rendered a chunk per turn while the client keeps up, so a
 * client that stops reading holds one copy of the ring, never its whole
 * JSON (tens of MB) queued on the connection. */
typedef struct {
    rpc_stream base; /* first: the server holds &base */
    pool_tl_export *x;
    const char *device;
    uint64_t events;
    bool done;
} timeline_stream;

static bool timeline_next(rpc_stream *s, const rpc_call *c)
{
    timeline_stream *ts = (timeline_stream *)s;
    while (!ts->done && c->queued(c->conn) < RPC_STREAM_WINDOW) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        int rc = f ? pool_timeline_export_next(ts->x, f, RPC_CHUNK / 2) : -1;
        if (f)
            fclose(f);
        if (rc < 0 || !buf) {
            free(buf);
            rpc_error(c, GRADD__ERROR__CODE__INTERNAL, "cannot render the timeline");
            return false;
        }
        Gradd__TimelineResponse tl;
        gradd__timeline_response__init(&tl);
        tl.device = (char *)ts->device;
        tl.chunk.data = (uint8_t *)buf;
        tl.chunk.len = len;
        tl.last = rc == 0;
        tl.events = ts->events;
        ts->done = tl.last;
        int sent = RPC_SEND(c, TIMELINE, timeline, &tl);
        free(buf);
        if (sent != 0)
            return false;
    }
    return !ts->done;
}

static void timeline_free(rpc_stream *s)
{
    timeline_stream *ts = (timeline_stream *)s;
    pool_timeline_export_free(ts->x);
    free(ts);
}

rpc_stream *rpc_timeline(const rpc_call *c, const Gradd__Request *req)
{
    gradd_ctx *ctx = c->ctx;
    const Gradd__TimelineRequest *rq = req->timeline;
    int idx[CTX_MAX_DEVICES];
    if ((!rq->device || !*rq->device) && ctx->ndev > 1) {
        rpc_error(c, GRADD__ERROR__CODE__BAD_REQUEST,
                   "this daemon has several devices; name one with -d DEV");
        return NULL;
    }
    int n = select_devices(c, rq->device, idx);
    if (n < 0)
        return NULL;
    if (n == 0) {
        rpc_error(c, GRADD__ERROR__CODE__NOT_FOUND, "this daemon has no devices");
        return NULL;
    }
    pool_stats ps;
    pool_stats_read(ctx->pools[idx[0]], &ps);
    timeline_stream *ts = calloc(1, sizeof *ts);
    if (ts)
        ts->x = pool_timeline_export_begin(ctx->pools[idx[0]]);
    if (!ts || !ts->x) {
        free(ts);
        rpc_error(c, GRADD__ERROR__CODE__INTERNAL, "cannot render the timeline: out of memory");
        return NULL;
    }
    ts->base.next = timeline_next;
    ts->base.free = timeline_free;
    ts->device = ctx->devs[idx[0]]->id;
    ts->events = ps.timeline_events;
    return &ts->base;
}
