/* rpc.c — the table from request body to command, and what more than one
 * command uses: error answers and a job's JobInfo. */
#include "rpc_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/batch.h"
#include "jobs/access.h"
#include "jobs/worker.h"
#include "jobs/queue.h"
#include "models/model.h"

/* ---- the table --------------------------------------------------------------- */

/* One command: exactly one of the three is set.  answer sends everything
 * before it returns; stream and defer leave the rest to the server. */
typedef struct {
    void (*answer)(const rpc_call *c, const Gradd__Request *req);
    rpc_stream *(*stream)(const rpc_call *c, const Gradd__Request *req);
    rpc_work *(*defer)(const rpc_call *c, const Gradd__Request *req);
} rpc_command;

static const rpc_command commands[] = {
    [GRADD__REQUEST__BODY_STATUS] = {.answer = rpc_status},
    [GRADD__REQUEST__BODY_STATS] = {.answer = rpc_stats},
    [GRADD__REQUEST__BODY_TRIM] = {.answer = rpc_trim},
    [GRADD__REQUEST__BODY_TIMELINE] = {.stream = rpc_timeline},
    [GRADD__REQUEST__BODY_TEST_PRESSURE] = {.answer = rpc_test_pressure},
    [GRADD__REQUEST__BODY_TEST_ALLOC] = {.answer = rpc_test_alloc},
    [GRADD__REQUEST__BODY_TEST_HANG] = {.answer = rpc_test_hang},
    [GRADD__REQUEST__BODY_SUBMIT] = {.answer = rpc_submit},
    [GRADD__REQUEST__BODY_LIST] = {.stream = rpc_list},
    [GRADD__REQUEST__BODY_JOB] = {.answer = rpc_job},
    [GRADD__REQUEST__BODY_CANCEL] = {.answer = rpc_cancel},
    [GRADD__REQUEST__BODY_WATCH] = {.stream = rpc_watch},
    [GRADD__REQUEST__BODY_LOGS] = {.stream = rpc_logs},
    [GRADD__REQUEST__BODY_METRICS] = {.answer = rpc_metrics},
    [GRADD__REQUEST__BODY_SAMPLE] = {.defer = rpc_sample},
    [GRADD__REQUEST__BODY_REMOVE] = {.answer = rpc_remove},
    [GRADD__REQUEST__BODY_REPORT] = {.answer = rpc_report},
    [GRADD__REQUEST__BODY_HISTORY] = {.defer = rpc_history},
    [GRADD__REQUEST__BODY_HOLD] = {.answer = rpc_hold},
    [GRADD__REQUEST__BODY_RELEASE] = {.answer = rpc_release},
    [GRADD__REQUEST__BODY_REQUEUE] = {.answer = rpc_requeue},
};

rpc_reply rpc_dispatch(const rpc_call *c, const Gradd__Request *req)
{
    rpc_reply r = {0};
    size_t i = (size_t)req->body_case;
    const rpc_command *cmd = i < sizeof commands / sizeof commands[0] ? &commands[i] : NULL;
    if (cmd && cmd->answer)
        cmd->answer(c, req);
    else if (cmd && cmd->stream)
        r.stream = cmd->stream(c, req);
    else if (cmd && cmd->defer)
        r.work = cmd->defer(c, req);
    else
        rpc_error(c, GRADD__ERROR__CODE__BAD_REQUEST, "request has no body this daemon knows (a newer gradctl?)");
    return r;
}

/* ---- shared by the commands ------------------------------------------------------ */

void rpc_error(const rpc_call *c, Gradd__Error__Code code, const char *msg)
{
    Gradd__Response resp;
    Gradd__Error err;
    wire_error_response(&resp, &err, code, msg);
    c->send(c->conn, &resp);
}

bool rpc_peer_admin(const rpc_call *c)
{
    uid_t uid = c->peer->uid;
    return uid == geteuid() || access_is_admin(uid, c->peer->gid, c->ctx->cfg.admin_group);
}

bool rpc_need_admin(const rpc_call *c, const char *what)
{
    if (rpc_peer_admin(c))
        return true;
    char msg[256];
    snprintf(msg, sizeof msg, "%s is for root and group '%s' only ([daemon] admin_group)", what,
             c->ctx->cfg.admin_group);
    rpc_error(c, GRADD__ERROR__CODE__PERMISSION_DENIED, msg);
    return false;
}

/* ---- a job, as JobInfo ---------------------------------------------------------- */

rpc_job_store *rpc_job_answer(const rpc_call *c, const job *j)
{
    rpc_job_store *st = malloc(sizeof *st);
    if (st)
        rpc_job_info(c->ctx, j, st);
    pthread_mutex_unlock(&c->ctx->q->lock);
    if (!st)
        rpc_error(c, GRADD__ERROR__CODE__INTERNAL, "out of memory");
    return st;
}

/* Unix seconds, as a job's started_at. */
static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A running job over several devices: what it holds on each, from each
 * device's pool. */
static void device_parts(gradd_ctx *ctx, const job *j, rpc_job_store *st)
{
    Gradd__JobInfo *m = &st->msg;
    m->n_device_parts = 0;
    m->device_parts = st->part_ptrs;
    if (j->state != JOB_RUNNING || !j->cfg.ndevices)
        return;
    pool_stats *ps = malloc(sizeof *ps);
    for (int k = 0; ps && k < j->cfg.ndevices; k++) {
        Gradd__DevicePart *u = &st->parts[m->n_device_parts];
        gradd__device_part__init(u);
        u->device = (char *)j->cfg.device_ids[k];
        int di = ctx_find_device(ctx, j->cfg.device_ids[k]);
        if (di >= 0) {
            pool_stats_read(ctx->pools[di], ps);
            for (size_t r = 0; r < ps->njobs; r++)
                if (ps->jobs[r].job == j->id) {
                    u->allocated = (uint64_t)ps->jobs[r].current;
                    u->peak = (uint64_t)ps->jobs[r].peak;
                }
        }
        st->part_ptrs[m->n_device_parts++] = u;
    }
    free(ps);
}

void rpc_job_info(gradd_ctx *ctx, const job *j, rpc_job_store *st)
{
    Gradd__JobInfo *m = &st->msg;
    gradd__job_info__init(m);
    snprintf(st->name, sizeof st->name, "%s", j->name);
    snprintf(st->user, sizeof st->user, "%s", j->user);
    snprintf(st->device, sizeof st->device, "%s", j->device[0] ? j->device : j->cfg.device);
    /* A job over several devices: all of them, rank 0's first. */
    for (int k = 0; k < j->cfg.ndevices; k++)
        snprintf(st->device + (k ? strlen(st->device) : 0), sizeof st->device - (k ? strlen(st->device) : 0), "%s%s",
                 k ? "," : "", j->cfg.device_ids[k]);
    snprintf(st->reason, sizeof st->reason, "%s", j->reason);
    snprintf(st->out_dir, sizeof st->out_dir, "%s", j->cfg.out_dir);
    snprintf(st->job_file, sizeof st->job_file, "%s", j->source);
    m->id = j->id;
    m->name = st->name;
    m->uid = (uint32_t)j->uid;
    m->umask = (uint32_t)j->umask;
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
        /* Held while it runs, as mem_allocated: a finished job holds none. */
        if (j->state == JOB_RUNNING)
            m->data_bytes = j->prog.data_bytes;
        if (j->prog.batch_changes) {
            m->change_from = j->prog.change_from;
            m->change_to = j->prog.change_to;
            m->change_step = j->prog.change_step;
            snprintf(st->change_reason, sizeof st->change_reason, "%s", j->prog.change_reason);
            m->change_reason = st->change_reason;
        }
        snprintf(st->levers, sizeof st->levers, "%s", j->prog.levers);
        m->levers = st->levers;
    }
    m->submitted_at = j->submitted_at;
    m->started_at = j->started_at;
    m->finished_at = j->finished_at;
    m->reason = st->reason;
    m->out_dir = st->out_dir;
    m->job_file = st->job_file;
    m->resumes = j->resumes;
    m->continued = j->continued_at > 0;
    snprintf(st->on_end, sizeof st->on_end, "%s", j->cfg.on_end);
    snprintf(st->on_end_result, sizeof st->on_end_result, "%s", j->on_end_result);
    m->on_end = st->on_end;
    m->on_end_result = st->on_end_result;
    m->resumed_from_step = j->continued_at ? j->continued_at - 1 : 0;
    uint64_t limit_ms = j->time_limit_ms ? j->time_limit_ms : j->cfg.time_limit_ms;
    m->time_limit_s = (double)limit_ms / 1e3;
    if (limit_ms && (j->state == JOB_QUEUED || j->state == JOB_RUNNING)) {
        double ran = j->ran_s >= 0 ? j->ran_s : 0;
        if (j->state == JOB_RUNNING && j->started_at > 0)
            ran += wall_now() - j->started_at;
        m->time_left_s = m->time_limit_s > ran ? m->time_limit_s - ran : 0;
    }
    m->type = j->cfg.type == JOBCFG_PROGRAM ? "program" : "engine";
    snprintf(st->command, sizeof st->command, "%s", j->cfg.command);
    m->command = st->command;
    m->n_depends_on = j->after.n;
    memcpy(st->depends_on, j->after.id, j->after.n * sizeof j->after.id[0]);
    m->depends_on = st->depends_on;
    m->held = j->held && j->state == JOB_QUEUED; /* a hold is on a start: a cancelled job has none */
    queue_deps_waiting(ctx->q, j, st->waiting, sizeof st->waiting);
    /* A job over several devices: which of them it waits for. */
    if (j->state == JOB_QUEUED && !j->held && j->cfg.ndevices && ctx->ws) {
        size_t n = strlen(st->waiting);
        const char *sep = n ? "; a free slot on " : "waiting for a free slot on ";
        for (int k = 0; k < j->cfg.ndevices && n < sizeof st->waiting; k++) {
            int di = ctx_find_device(ctx, j->cfg.device_ids[k]);
            if (di < 0 || workers_device_free(ctx->ws, di))
                continue;
            n += (size_t)snprintf(st->waiting + n, sizeof st->waiting - n, "%s%s", sep, j->cfg.device_ids[k]);
            sep = ", ";
        }
    }
    m->waiting = st->waiting;
    /* Memory by tag from the pool the job runs in. */
    m->n_mem_tags = 0;
    m->mem_tags = st->tag_ptrs;
    if (j->state != JOB_RUNNING && j->state != JOB_QUEUED) {
        /* Ended: its pool forgot it; its peaks were kept. */
        m->mem_peak = j->mem_peak;
        for (int t = 0; t < POOL_TAG_COUNT; t++) {
            if (!j->mem_tag_peak[t])
                continue;
            Gradd__TagUsage *u = &st->tags[m->n_mem_tags];
            gradd__tag_usage__init(u);
            u->tag = (char *)pool_tag_name((pool_tag)t);
            u->peak = j->mem_tag_peak[t];
            st->tag_ptrs[m->n_mem_tags++] = u;
        }
    }
    device_parts(ctx, j, st);
    int di = j->state == JOB_RUNNING ? ctx_find_device(ctx, j->device) : -1;
    pool_peer_view *pv = di >= 0 && j->cfg.type == JOBCFG_PROGRAM ? malloc(sizeof *pv) : NULL;
    if (pv) {
        /* A program's memory is in its own pool, as its page shows it. */
        if (pool_peers_read_job(ctx->peers[di], j->id, pv) && pv->live) {
            m->mem_allocated = (uint64_t)pv->stats.allocated_bytes[POOL_ALL].current;
            m->mem_peak = (uint64_t)pv->stats.allocated_bytes[POOL_ALL].peak;
            for (int t = 0; t < POOL_TAG_COUNT; t++) {
                if (!pv->stats.tag_current[t] && !pv->stats.tag_peak[t])
                    continue;
                Gradd__TagUsage *u = &st->tags[m->n_mem_tags];
                gradd__tag_usage__init(u);
                u->tag = (char *)pool_tag_name((pool_tag)t);
                u->allocated = (uint64_t)pv->stats.tag_current[t];
                u->peak = (uint64_t)pv->stats.tag_peak[t];
                st->tag_ptrs[m->n_mem_tags++] = u;
            }
        }
        free(pv);
    } else if (di >= 0) {
        pool_stats *ps = malloc(sizeof *ps);
        if (ps) {
            pool_stats_read(ctx->pools[di], ps);
            for (size_t r = 0; r < ps->njobs; r++) {
                if (ps->jobs[r].job != j->id)
                    continue;
                m->mem_allocated = (uint64_t)ps->jobs[r].current;
                m->mem_peak = (uint64_t)ps->jobs[r].peak;
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
}
