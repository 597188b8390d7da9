/* worker.c — one thread per job slot of a device. */
#include "worker.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "access.h"
#include "jobend.h"
#include "joblog.h"
#include "runner.h"
#include "base/log.h"
#include "dist/dist.h"
#include "models/model.h"
#include "units.h"

typedef struct {
    worker *w;
    job *j;
    uint32_t id;
    joblog log; /* the job's log, opened with the daemon's identity */
    bool counted_resume;
    bool as_owner;       /* the thread has the owner's identity; `saved` holds the daemon's */
    access_saved saved;
    bool identity_lost;  /* the owner's identity could not be taken back: stop the job */
    char lost_why[256];
    uint64_t checked_log; /* the log's size when its owner's bytes were last counted */
    uint64_t next_check;  /* ... and when they are counted again */
    /* [job] time_limit: the wall time this run may take (0: no limit),
     * from when it started (ctx_now_ns); time_up once it has been
     * reached, which stops the job as a cancel would, but failed. */
    uint64_t limit_ns, run_start_ns;
    bool time_up;
    bool first_run; /* the job has not run before: a checkpoint found is another run's */
    char levers[sizeof ((train_progress *)0)->levers]; /* as last logged */
} job_run;

/* Counting a user's bytes looks at every record: done once per this much
 * log growth, or sooner when less is left below the limit (then at every
 * line: a user's jobs pass it by a line each at most). */
#define LOG_CHECK_EVERY (16u << 10)

static double now_unix(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The owner's bytes, counted as the log grows; and the log stopped at its
 * head when the loop could not make room for them. */
static void log_account(job_run *r)
{
    queue *q = r->w->q;
    pthread_mutex_lock(&q->lock);
    uint64_t size = r->log.size;
    if (size >= r->next_check || size < r->checked_log) {
        uint64_t left = queue_log_grew(q, r->j, size);
        r->checked_log = size;
        r->next_check = size + (left < LOG_CHECK_EVERY ? left : LOG_CHECK_EVERY);
    } else {
        r->j->log_bytes = size;
    }
    if (r->j->bytes_over) {
        /* The loop makes room or stops this log; lines written meanwhile
         * would only pass the limit further, so wait for it (bounded: a
         * queue without a loop, as in tests, must not hang the job). */
        pthread_mutex_unlock(&q->lock);
        queue_notify(q);
        pthread_mutex_lock(&q->lock);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 2;
        while (r->j->bytes_over && !q->stopping)
            if (pthread_cond_timedwait(&q->cond, &q->lock, &until) != 0)
                break;
    }
    bool stop = r->j->log_stop;
    pthread_mutex_unlock(&q->lock);
    if (stop && !r->log.stop_wanted) {
        char why[160], lim[16];
        snprintf(why, sizeof why, "uid %u's jobs hold more than [daemon] max_bytes_per_user = %s in the state dir",
                 (unsigned)r->j->uid, units_format_size(r->w->ctx->cfg.max_bytes_per_user, lim, sizeof lim));
        joblog_stop(&r->log, why);
    }
}

/* One or more whole lines into the job's log, within its bound; r->j only
 * while the thread has the owner's identity (after the job's end it may be
 * gone). */
static void log_line(job_run *r, const char *text)
{
    size_t len = strlen(text);
    joblog_result res = joblog_write(&r->log, text, len);
    if (res == JOBLOG_FULL) {
        char err[512];
        /* The rewrite makes a file in the state dir, which is the
         * daemon's: the owner, whose identity the thread has while the
         * job runs, may not write there. */
        if (r->as_owner)
            access_restore(&r->saved);
        int rc = joblog_rewrite(&r->log, len, err, sizeof err);
        if (r->as_owner && access_become(r->j->uid, r->j->gid, &r->saved, r->lost_why, sizeof r->lost_why) != 0) {
            /* Never go on as the daemon: the job stops at its next poll. */
            r->as_owner = false;
            r->identity_lost = true;
        }
        if (rc != 0)
            log_job(LOG_WARN, r->id, NULL, "job %u: %s; lines past its bound are dropped", r->id, err);
        res = joblog_write(&r->log, text, len);
        if (res == JOBLOG_FULL)
            r->log.dropped += len; /* longer than all the room there is */
    }
    if (res == JOBLOG_ERROR && !r->log.rewrite_failed) {
        log_job(LOG_WARN, r->id, NULL, "job %u: cannot write %s: %s", r->id, r->log.path, strerror(errno));
        r->log.rewrite_failed = true;
    }
}

/* log_line, counted against the owner's bytes: while the job runs. */
static void log_put(job_run *r, const char *text)
{
    log_line(r, text);
    log_account(r);
}

static void on_step(void *user, const train_progress *p)
{
    job_run *r = user;
    queue *q = r->w->q;
    pthread_mutex_lock(&q->lock);
    r->j->prog = *p;
    r->j->have_progress = true;
    bool note_resume = false;
    if (p->resumed && !r->counted_resume) {
        /* Saved by the loop on the notify below, not at the job's end: a
         * crash before then would lose the count (this thread, as the
         * owner, cannot write the state dir).  The first run of a job
         * found another run's checkpoint in its directory ([output]
         * resume); later ones resume the job's own. */
        if (r->first_run)
            r->j->continued_at = p->step + 1;
        else
            r->j->resumes++;
        r->j->unsaved = true;
        q->any_unsaved = true;
        r->counted_resume = true;
        note_resume = true;
    }
    queue_touch(q, r->j);
    r->w->beats++;
    pthread_mutex_unlock(&q->lock);
    queue_notify(q);
    if (note_resume) {
        char line[PATH_MAX + 128];
        if (r->first_run)
            snprintf(line, sizeof line, "== continuing the unfinished run in %s from its checkpoint at step %llu "
                     "([output] resume)\n", r->j->cfg.out_dir, (unsigned long long)p->step);
        else
            snprintf(line, sizeof line, "== resuming from its checkpoint at step %llu\n", (unsigned long long)p->step);
        log_put(r, line);
    }
    /* The memory levers in the log when they change, with why. */
    if (strcmp(p->levers, r->levers) != 0) {
        char line[sizeof r->levers + 32];
        snprintf(r->levers, sizeof r->levers, "%s", p->levers);
        snprintf(line, sizeof line, "== levers: %s\n", p->levers[0] ? p->levers : "none");
        log_put(r, line);
    }
    /* Where a resume starts is no step of this run: its "== resuming"
     * line says it. */
    if (p->trained && (p->step % r->j->cfg.log_every == 0 || p->step == p->steps || p->step == 1)) {
        char a[16], b[16], line[512];
        size_t n = 0;
        n += (size_t)snprintf(line + n, sizeof line - n, "step %llu/%llu loss %.4f", (unsigned long long)p->step,
                              (unsigned long long)p->steps, p->loss);
        if (!isnan(p->val_loss))
            n += (size_t)snprintf(line + n, sizeof line - n, " val %.4f", p->val_loss);
        if (!isnan(p->val_accuracy))
            n += (size_t)snprintf(line + n, sizeof line - n, " acc %.2f%%", p->val_accuracy * 100);
        snprintf(line + n, sizeof line - n, " lr %.2e norm %.3f %.0f %s/s micro %u×%u mem %s/%s%s\n", p->lr,
                 p->grad_norm, p->units_per_s, model_unit(&r->j->cfg), p->micro, p->accum,
                 units_format_size(p->allocated, a, sizeof a), units_format_size(p->reserved, b, sizeof b),
                 p->recompute ? " recompute" : "");
        log_put(r, line);
    }
}

static bool should_stop(void *user)
{
    job_run *r = user;
    queue *q = r->w->q;
    pthread_mutex_lock(&q->lock);
    r->w->beats++;
    /* Test hook (--test-hooks, TestHangRequest): a job thread stuck
     * without exiting, as a deadlocked kernel or a hung driver call would
     * leave it.  No beats while here, and a shutdown cannot get it out
     * either: only a release does (workers_stop gives up on it). */
    while (r->w->hang)
        pthread_cond_wait(&q->cond, &q->lock);
    bool stop = r->j->cancel_requested || r->j->requeue_requested || q->stopping || r->identity_lost;
    if (!stop && r->limit_ns && !r->time_up && ctx_now_ns() - r->run_start_ns >= r->limit_ns)
        r->time_up = true;
    stop |= r->time_up;
    pthread_mutex_unlock(&q->lock);
    return stop;
}

/* A program job's output, whole lines. */
static void on_output(void *user, const char *text)
{
    log_put(user, text);
}

static bool daemon_stopping(void *user)
{
    job_run *r = user;
    pthread_mutex_lock(&r->w->q->lock);
    bool stopping = r->w->q->stopping;
    pthread_mutex_unlock(&r->w->q->lock);
    return stopping;
}

/* Recorded by the loop (this thread, as the owner, cannot write the state
 * dir), so that a daemon killed while the program runs ends its group at
 * the next start. */
static void on_started(void *user, uint32_t pgid)
{
    job_run *r = user;
    queue *q = r->w->q;
    pthread_mutex_lock(&q->lock);
    r->j->pgid = pgid;
    r->j->unsaved = true;
    q->any_unsaved = true;
    pthread_mutex_unlock(&q->lock);
    queue_notify(q);
}

/* A program has no steps to report: its watchers are told, once a second,
 * that its time and memory have moved on. */
static void on_changed(void *user)
{
    job_run *r = user;
    queue *q = r->w->q;
    pthread_mutex_lock(&q->lock);
    queue_touch(q, r->j);
    pthread_mutex_unlock(&q->lock);
    queue_notify(q);
}

/* threads = 0 ("all cores") on a daemon that runs more than one CPU job at
 * a time: each job gets an even share of the cores it may use, rather than
 * every job's OpenMP threads contending for all of them (two such jobs on
 * two cores: 3.2 s together, 2.3 s with a core each).  Fixed by the
 * configuration, not by load, so a job's thread count, and with it its
 * bits, is the same on every run and resume. */
static int cpu_slots(const gradd_ctx *ctx)
{
    int n = 0;
    for (int i = 0; i < ctx->ndev; i++)
        n += ctx->devs[i]->kind == DEV_KIND_CPU;
    return n * (int)ctx->cfg.max_jobs_per_device;
}

/* The threads for such a job; 0 where it runs alone (all cores). */
static int cpu_share(const gradd_ctx *ctx)
{
    int slots = cpu_slots(ctx);
    if (slots <= 1)
        return 0;
    int cores = ctx_cores();
    return cores / slots > 1 ? cores / slots : 1;
}

/* A runner's note, in the job's log. */
static void log_note(void *user, const char *fmt, va_list ap)
{
    char line[4096];
    memcpy(line, "== ", 3);
    int n = vsnprintf(line + 3, sizeof line - 4, fmt, ap);
    size_t end = n < 0 ? 3 : 3 + ((size_t)n < sizeof line - 4 ? (size_t)n : sizeof line - 5);
    line[end] = '\n';
    line[end + 1] = '\0';
    log_put(user, line);
}

/* ---- [job] on_end ---------------------------------------------------------------- */

static void hook_copy(const job *j, jobend_job *hj)
{
    memset(hj, 0, sizeof *hj);
    hj->id = j->id;
    hj->uid = j->uid;
    hj->gid = j->gid;
    snprintf(hj->command, sizeof hj->command, "%s", j->cfg.on_end);
    jobcfg_where(&j->cfg, "job", "on_end", hj->where, sizeof hj->where);
    jobend_workdir(&j->cfg, hj->workdir, sizeof hj->workdir);
    snprintf(hj->out_dir, sizeof hj->out_dir, "%s", j->cfg.out_dir);
    snprintf(hj->name, sizeof hj->name, "%s", j->name);
    snprintf(hj->state, sizeof hj->state, "%s", job_state_name(j->state));
    snprintf(hj->reason, sizeof hj->reason, "%s", j->reason);
}

/* Its output, after the job's end: not counted in log_bytes (the job may
 * be gone), as the final line. */
static void hook_output(void *user, const char *lines)
{
    log_line(user, lines);
}

/* Polled by the hook every 100 ms: the thread stays busy while it runs,
 * so it beats as a job's polls do, or the watchdog would take a hook
 * that runs for seconds for a hung job thread. */
static bool hook_poll(void *user)
{
    job_run *r = user;
    queue *q = r->w->q;
    pthread_mutex_lock(&q->lock);
    r->w->beats++;
    bool stopping = q->stopping;
    pthread_mutex_unlock(&q->lock);
    return stopping;
}

/* The state a run's end leaves job j in, and why (q's lock held; j is not
 * changed). */
static job_state end_state(const job *j, train_outcome o, const train_result *res, const job_run *r,
                           uint64_t limit_ms, char *reason, size_t reason_len)
{
    reason[0] = '\0';
    /* gradctl requeue: back in the queue however the run ended; an engine
     * job resumes from the checkpoint it has just written. */
    if (j->requeue_requested)
        return JOB_QUEUED;
    switch (o) {
    case TRAIN_DONE:
        return JOB_COMPLETED;
    case TRAIN_STOPPED:
        if (j->cancel_requested && j->cfg.type == JOBCFG_PROGRAM) {
            snprintf(reason, reason_len, "cancelled: %s", res->message);
            return JOB_CANCELLED;
        }
        if (j->cancel_requested) {
            snprintf(reason, reason_len, "cancelled at step %llu; checkpoint in %s",
                     (unsigned long long)res->steps_done, j->cfg.out_dir);
            return JOB_CANCELLED;
        }
        if (r->time_up) {
            char lim[32];
            units_format_duration((double)limit_ms / 1e3, lim, sizeof lim);
            if (j->cfg.type == JOBCFG_PROGRAM)
                snprintf(reason, reason_len, "time limit (%s) reached: %s", lim, res->message);
            else
                snprintf(reason, reason_len,
                         "time limit (%s) reached at step %llu; checkpoint written in %s: submitting the job again "
                         "continues from it",
                         lim, (unsigned long long)res->steps_done, j->cfg.out_dir);
            return JOB_FAILED;
        }
        /* A program: left recorded as running, as after a crash (the next
         * start fails it or queues it again by its [program] restart).  An
         * engine job at a daemon shutdown: resumes at the next start. */
        return j->cfg.type == JOBCFG_PROGRAM ? JOB_RUNNING : JOB_QUEUED;
    case TRAIN_FAILED:
    default:
        snprintf(reason, reason_len, "%s", res->message);
        return JOB_FAILED;
    }
}

/* The thread has the daemon's identity again here, and the job's outcome
 * is on disk: the hook cannot change it, only say how it went. */
static void run_hook(job_run *r, const jobend_job *hj)
{
    queue *q = r->w->q;
    gradd_ctx *ctx = r->w->ctx;
    jobend_hooks h = {.output = r->log.fd >= 0 ? hook_output : NULL, .stopping = hook_poll, .user = r};
    char result[256];
    jobend_run(hj, ctx->cfg.socket_path, ctx->cfg.on_end_timeout_ms, &h, result, sizeof result);
    pthread_mutex_lock(&q->lock);
    job *j = queue_find(q, hj->id);
    if (j) {
        snprintf(j->on_end_result, sizeof j->on_end_result, "%s", result);
        queue_touch(q, j);
        queue_persist_or_retry(q, j, ctx->devs[r->w->dev]->id);
    }
    pthread_mutex_unlock(&q->lock);
    queue_notify(q);
}

/* Before this thread runs a job (or a rank of one): a runner for it, a
 * filesystem context of the thread's own, and the owner's identity.  True
 * once the thread is the owner (saved holds the daemon's), else false with
 * why in msg. */
static bool become_owner(worker *w, const job *j, const runner *run, access_saved *saved, char *msg, size_t len)
{
    char err[512];
    if (!run)
        snprintf(msg, len, "no runner takes this job");
    else if (w->own_fs_err[0])
        snprintf(msg, len, "%s", w->own_fs_err);
    else if (access_become(j->uid, j->gid, saved, err, sizeof err) != 0)
        snprintf(msg, len, "%s", err);
    else
        return true;
    return false;
}

/* The ranks of a job over several devices (worker.h): rank 0 runs in the
 * worker that took the job, rank k in ranks[k]'s recruited worker. */
typedef struct worker_group {
    job *j;
    int n;
    dist_group *g;
    int ended; /* ranks 1.. that have ended (queue lock) */
    train_outcome o[JOBCFG_MAX_DEVICES];
    train_result res[JOBCFG_MAX_DEVICES];
} worker_group;

/* A worker of device `dev` that runs nothing and is recruited by no job.
 * Lock held. */
static worker *idle_on(workers *ws, int dev)
{
    for (int k = 0; k < ws->n; k++)
        if (ws->w[k].dev == dev && !ws->w[k].busy && !ws->w[k].follow)
            return &ws->w[k];
    return NULL;
}

bool workers_device_free(workers *ws, int dev)
{
    return idle_on(ws, dev) != NULL;
}

/* queue_next_for's can_start: a job over several devices starts when each
 * of its other devices has a free worker.  Lock held. */
static bool can_start_here(void *user, const job *j)
{
    worker *w = user;
    for (int k = 1; k < j->cfg.ndevices; k++) {
        int di = ctx_find_device(w->ctx, j->cfg.device_ids[k]);
        if (di < 0 || di == w->dev || !idle_on(w->set, di))
            return false;
    }
    return true;
}

/* A rank waiting for the others is alive: the watchdog's beat. */
static void rank_beat(void *user)
{
    worker *w = user;
    pthread_mutex_lock(&w->q->lock);
    w->beats++;
    pthread_mutex_unlock(&w->q->lock);
}

/* Rank k's worker on each other device of j, recruited for the run (the
 * workers can_start_here found).  Lock held.  NULL with err. */
static worker_group *recruit(worker *w, job *j, char *err, size_t err_len)
{
    worker_group *grp = calloc(1, sizeof *grp);
    if (!grp) {
        snprintf(err, err_len, "out of host memory for the job's ranks");
        return NULL;
    }
    grp->j = j;
    grp->n = j->cfg.ndevices;
    if (!(grp->g = dist_group_new(grp->n, (double)j->cfg.rank_timeout_ms / 1000.0, err, err_len))) {
        free(grp);
        return NULL;
    }
    dist_set_beat(dist_group_rank(grp->g, 0), rank_beat, w);
    for (int k = 1; k < grp->n; k++) {
        worker *f = idle_on(w->set, ctx_find_device(w->ctx, j->cfg.device_ids[k]));
        dist_set_beat(dist_group_rank(grp->g, k), rank_beat, f);
        f->busy = true;
        f->job = j->id;
        f->follow = grp;
        f->rank = k;
    }
    pthread_cond_broadcast(&w->q->cond);
    return grp;
}

/* A recruited rank's poll: a sign of life for the watchdog.  Stopping is
 * rank 0's to decide, and the ranks agree on it at the step's end. */
static bool rank_poll(void *user)
{
    worker *w = user;
    pthread_mutex_lock(&w->q->lock);
    w->beats++;
    while (w->hang)
        pthread_cond_wait(&w->q->cond, &w->q->lock);
    pthread_mutex_unlock(&w->q->lock);
    return false;
}

/* Rank k (k > 0) of grp's job, on this worker's device, as the job's owner. */
static void run_rank(worker *w, worker_group *grp, int k)
{
    gradd_ctx *ctx = w->ctx;
    job *j = grp->j;
    train_result *res = &grp->res[k];
    train_outcome o = TRAIN_FAILED;
    const runner *run = runner_for(&j->cfg);
    access_saved saved;
    if (become_owner(w, j, run, &saved, res->message, sizeof res->message)) {
        mode_t daemon_mask = umask(j->umask);
        runner_env env = {
            .ctx = ctx,
            .dev = w->dev,
            .job_id = j->id,
            .cpu_share = cpu_share(ctx),
            .cpu_slots = cpu_slots(ctx),
            .hooks = {.poll = rank_poll, .user = w, .dist = dist_group_rank(grp->g, k)},
            .uid = j->uid,
            .gid = j->gid,
        };
        o = run->run(&env, &j->cfg, res);
        umask(daemon_mask);
        access_restore(&saved);
    }
    if (o == TRAIN_FAILED)
        dist_fail(dist_group_rank(grp->g, k), res->message);
    /* Its device's part of the job's peak, before the pool forgets it. */
    if (!res->mem_own)
        pool_job_peak(ctx->pools[w->dev], j->id, &res->mem_peak, res->mem_tag_peak);
    pool_job_forget(ctx->pools[w->dev], j->id);
    grp->o[k] = o;
}

/* Rank 0 has ended: wait for the others, and take the first failure among
 * them as the job's should rank 0 itself not have failed.  The job's peak
 * (*peak, tag_peak, rank 0's on entry) becomes the largest of its
 * devices'. */
static train_outcome join_ranks(worker *w, worker_group *grp, train_outcome o, train_result *res, uint64_t *peak,
                                uint64_t *tag_peak)
{
    pthread_mutex_lock(&w->q->lock);
    while (grp->ended < grp->n - 1)
        pthread_cond_wait(&w->q->cond, &w->q->lock);
    pthread_mutex_unlock(&w->q->lock);
    for (int k = 1; k < grp->n; k++) {
        if (grp->res[k].mem_peak <= *peak)
            continue;
        *peak = grp->res[k].mem_peak;
        memcpy(tag_peak, grp->res[k].mem_tag_peak, sizeof grp->res[k].mem_tag_peak);
    }
    for (int k = 1; k < grp->n && o != TRAIN_FAILED; k++) {
        if (grp->o[k] != TRAIN_FAILED)
            continue;
        o = TRAIN_FAILED;
        snprintf(res->message, sizeof res->message, "rank %d on %s: %s", k, grp->j->cfg.device_ids[k],
                 grp->res[k].message);
    }
    dist_group_free(grp->g);
    free(grp);
    return o;
}

static void run_one(worker *w, job *j, bool first_run, worker_group *grp)
{
    gradd_ctx *ctx = w->ctx;
    queue *q = w->q;
    dev *d = ctx->devs[w->dev];
    char path[PATH_MAX + 32];
    queue_log_path(q, j->id, path, sizeof path);
    job_run r = {.w = w, .j = j, .id = j->id, .run_start_ns = ctx_now_ns(), .first_run = first_run};
    char err[512], line[1024];
    pthread_mutex_lock(&q->lock);
    uint64_t limit_ms = j->time_limit_ms ? j->time_limit_ms : j->cfg.time_limit_ms;
    double ran_s = j->ran_s >= 0 ? j->ran_s : 0;
    pthread_mutex_unlock(&q->lock);
    if (limit_ms) {
        /* What earlier runs took is taken off this one's share; a job
         * with none left still starts, to stop at once with a checkpoint. */
        double left_ms = (double)limit_ms - ran_s * 1e3;
        r.limit_ns = left_ms > 1 ? (uint64_t)(left_ms * 1e6) : 1;
    }
    if (joblog_open(&r.log, path, ctx->cfg.max_job_log, err, sizeof err) != 0)
        log_job(LOG_WARN, j->id, d->id, "job %u: %s; it runs without a log", j->id, err);
    pthread_mutex_lock(&q->lock);
    r.checked_log = j->log_bytes = r.log.size;
    pthread_mutex_unlock(&q->lock);
    snprintf(line, sizeof line, "== job %u (%s) starting on %s, owner %s (uid %u)\n", j->id, j->name, d->id, j->user,
             (unsigned)j->uid);
    log_put(&r, line);

    train_result res;
    memset(&res, 0, sizeof res);
    train_outcome o = TRAIN_FAILED;
    const runner *run = runner_for(&j->cfg);
    if (become_owner(w, j, run, &r.saved, res.message, sizeof res.message)) {
        r.as_owner = true;
        /* Everything the run creates gets the owner's umask; this thread's
         * own (access_own_fs), so the daemon's files keep theirs. */
        mode_t daemon_mask = umask(j->umask);
        runner_env env = {
            .ctx = ctx,
            .dev = w->dev,
            .job_id = j->id,
            .cpu_share = cpu_share(ctx),
            .cpu_slots = cpu_slots(ctx),
            .hooks = {.on_step = on_step, .should_stop = should_stop, .poll = should_stop, .user = &r,
                      .dist = grp ? dist_group_rank(grp->g, 0) : NULL},
            .note = r.log.fd >= 0 ? log_note : NULL,
            .note_user = &r,
            .uid = j->uid,
            .gid = j->gid,
            .output = r.log.fd >= 0 ? on_output : NULL,
            .daemon_stopping = daemon_stopping,
            .started = on_started,
            .changed = on_changed,
        };
        o = run->run(&env, &j->cfg, &res);
        if (grp && o == TRAIN_FAILED)
            dist_fail(dist_group_rank(grp->g, 0), res.message);
        umask(daemon_mask);
        if (r.as_owner)
            access_restore(&r.saved);
        r.as_owner = false;
    }
    uint64_t peak = res.mem_peak, tag_peak[POOL_TAG_COUNT];
    memcpy(tag_peak, res.mem_tag_peak, sizeof tag_peak);
    if (!res.mem_own)
        pool_job_peak(ctx->pools[w->dev], j->id, &peak, tag_peak);
    pool_job_forget(ctx->pools[w->dev], j->id);
    if (grp) {
        /* Before it ran, too: the recruited ranks wait for rank 0. */
        if (o == TRAIN_FAILED)
            dist_fail(dist_group_rank(grp->g, 0), res.message);
        o = join_ranks(w, grp, o, &res, &peak, tag_peak);
    }
    if (r.identity_lost) {
        o = TRAIN_FAILED;
        snprintf(res.message, sizeof res.message, "stopped: after rewriting its log, %s", r.lost_why);
    }

    /* How the run ended, decided under the lock (a cancel or requeue
     * request changes it) but published only after the job's log has its
     * last line: whoever sees the job end and reads its log then finds
     * all of it.  Until published the job is still running, so nobody
     * removes it meanwhile. */
    pthread_mutex_lock(&q->lock);
    char reason[sizeof j->reason];
    job_state logged = end_state(j, o, &res, &r, limit_ms, reason, sizeof reason);
    uint32_t id = j->id;
    char outcome[1200], name[sizeof j->name];
    snprintf(outcome, sizeof outcome, "%s%s%s", job_state_name(logged), reason[0] ? ": " : "", reason);
    snprintf(name, sizeof name, "%s", j->name);
    pthread_mutex_unlock(&q->lock);
    /* Not counted in log_bytes (the job may be gone once published): its
     * next load counts it. */
    snprintf(line, sizeof line, "== job %u %.1000s\n", id, outcome);
    log_line(&r, line);

    pthread_mutex_lock(&q->lock);
    /* Decided again: a cancel or requeue asked for while the line was
     * written is the later request, and wins. */
    job_state state = end_state(j, o, &res, &r, limit_ms, reason, sizeof reason);
    if (j->requeue_requested) {
        j->requeue_requested = false;
        j->started_at = 0;
    }
    j->mem_peak = peak;
    memcpy(j->mem_tag_peak, tag_peak, sizeof tag_peak);
    j->state = state;
    /* A run that ended before it reported a step (its checkpoint refused,
     * its data gone) leaves the figures its earlier runs reached, not 0. */
    if (!j->have_progress && j->prog.step > 0 && state != JOB_QUEUED)
        j->have_progress = true;
    snprintf(j->reason, sizeof j->reason, "%s", reason);
    if (j->state != JOB_QUEUED && j->state != JOB_RUNNING)
        j->finished_at = now_unix();
    j->ran_s = ran_s + (double)(ctx_now_ns() - r.run_start_ns) / 1e9;
    queue_touch(q, j);
    queue_persist_or_retry(q, j, d->id);
    /* Its end may let jobs that wait for it start, or cancel them. */
    queue_deps_settle(q);
    /* Said from copies: once the lock is let go a finished job may be
     * removed (gradctl rm) and freed. */
    jobend_job *hook = NULL;
    if (j->cfg.on_end[0] && j->state != JOB_QUEUED && j->state != JOB_RUNNING && (hook = malloc(sizeof *hook)))
        hook_copy(j, hook);
    snprintf(outcome, sizeof outcome, "%s%s%s", job_state_name(j->state), j->reason[0] ? ": " : "", j->reason);
    pthread_mutex_unlock(&q->lock);
    queue_notify(q);
    log_job(LOG_INFO, id, d->id, "job %u (%s) on %s: %s", id, name, d->id, outcome);
    if (state != logged) {
        snprintf(line, sizeof line, "== job %u %.1000s\n", id, outcome);
        log_line(&r, line);
    }
    if (hook)
        run_hook(&r, hook);
    free(hook);
    joblog_close(&r.log);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    gradd_ctx *ctx = w->ctx;
    queue *q = w->q;
    dev *d = ctx->devs[w->dev];
    /* Failing that, every job here fails saying why, rather than run
     * with a umask that is not its owner's. */
    if (access_own_fs(w->own_fs_err, sizeof w->own_fs_err) != 0)
        log_error("%s", w->own_fs_err);
    bool have_cuda = false;
    for (int i = 0; i < ctx->ndev; i++)
        have_cuda |= ctx->devs[i]->kind == DEV_KIND_CUDA;
    for (;;) {
        pthread_mutex_lock(&q->lock);
        job *j = NULL;
        while (!w->follow && !q->stopping &&
               !(j = queue_next_for(q, d->id, d->kind == DEV_KIND_CUDA, have_cuda, can_start_here, w)))
            pthread_cond_wait(&q->cond, &q->lock);
        if (w->follow) {
            /* Recruited: a rank of another worker's job, even while the
             * daemon stops (rank 0 stops it, and the ranks agree). */
            worker_group *grp = w->follow;
            pthread_mutex_unlock(&q->lock);
            pool_use_begin(ctx->pools[w->dev]);
            run_rank(w, grp, w->rank);
            pool_use_end(ctx->pools[w->dev]);
            pthread_mutex_lock(&q->lock);
            w->follow = NULL;
            w->busy = false;
            grp->ended++;
            pthread_cond_broadcast(&q->cond);
            pthread_mutex_unlock(&q->lock);
            continue;
        }
        if (q->stopping) {
            w->exited = true;
            pthread_cond_broadcast(&q->cond); /* workers_stop waits for it */
            pthread_mutex_unlock(&q->lock);
            return NULL;
        }
        char gerr[256];
        worker_group *grp = j->cfg.ndevices ? recruit(w, j, gerr, sizeof gerr) : NULL;
        if (j->cfg.ndevices && !grp) {
            j->state = JOB_FAILED;
            snprintf(j->reason, sizeof j->reason, "%s", gerr);
            j->finished_at = now_unix();
            queue_touch(q, j);
            queue_persist_or_retry(q, j, d->id);
            pthread_mutex_unlock(&q->lock);
            queue_notify(q);
            continue;
        }
        j->state = JOB_RUNNING;
        w->busy = true;
        w->job = j->id;
        /* Never run before: not restarted after a crash (started_at kept),
         * nor requeued after a run (started_at cleared, ran_s counted). */
        bool first_run = j->started_at == 0 && !(j->ran_s > 0);
        j->started_at = now_unix();
        j->have_progress = false;
        snprintf(j->device, sizeof j->device, "%s", d->id);
        queue_touch(q, j);
        queue_persist_or_retry(q, j, d->id);
        pthread_mutex_unlock(&q->lock);
        queue_notify(q);
        log_job(LOG_INFO, j->id, d->id, "job %u (%s, uid %u) running on %s", j->id, j->name, (unsigned)j->uid,
                j->cfg.ndevices ? j->cfg.devices : d->id);
        /* The pool's idle trim waits while any job runs on the device. */
        pool_use_begin(ctx->pools[w->dev]);
        run_one(w, j, first_run, grp);
        pool_use_end(ctx->pools[w->dev]);
        pthread_mutex_lock(&q->lock);
        w->busy = false;
        /* A job over several devices may have waited for this one. */
        pthread_cond_broadcast(&q->cond);
        pthread_mutex_unlock(&q->lock);
    }
}

int workers_start(workers *ws, gradd_ctx *ctx, queue *q, int per_device, char *err, size_t err_len)
{
    ws->n = ctx->ndev * per_device;
    ws->w = calloc((size_t)(ws->n ? ws->n : 1), sizeof *ws->w);
    if (!ws->w) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    /* Every worker's device first: a job over several devices recruits
     * workers by theirs as soon as the first thread runs. */
    for (int i = 0; i < ws->n; i++) {
        worker *w = &ws->w[i];
        w->ctx = ctx;
        w->q = q;
        w->dev = i / per_device;
        w->set = ws;
    }
    for (int i = 0; i < ws->n; i++) {
        worker *w = &ws->w[i];
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            snprintf(err, err_len, "cannot start a worker thread");
            workers_stop(ws, UINT64_MAX);
            return -1;
        }
        w->started = true;
    }
    return 0;
}

void workers_set_hang(workers *ws, int dev, bool hang, uint32_t *nworkers, uint32_t *nbusy)
{
    *nworkers = *nbusy = 0;
    if (!ws->n)
        return;
    queue *q = ws->w[0].q;
    pthread_mutex_lock(&q->lock);
    for (int k = 0; k < ws->n; k++) {
        worker *w = &ws->w[k];
        if (w->dev != dev)
            continue;
        w->hang = hang;
        (*nworkers)++;
        *nbusy += w->busy;
    }
    /* Released threads wait on the queue's condition variable. */
    pthread_cond_broadcast(&q->cond);
    pthread_mutex_unlock(&q->lock);
}

int workers_stop(workers *ws, uint64_t timeout_ms)
{
    if (!ws->w)
        return 0;
    queue *q = ws->w[0].q;
    struct timespec end;
    clock_gettime(CLOCK_MONOTONIC, &end);
    uint64_t ns = (uint64_t)end.tv_nsec + (timeout_ms % 1000) * 1000000u;
    bool forever = timeout_ms / 1000 > (uint64_t)INT32_MAX;
    end.tv_sec += (time_t)(timeout_ms / 1000 + ns / 1000000000u);
    end.tv_nsec = (long)(ns % 1000000000u);
    int left = 0;
    pthread_mutex_lock(&q->lock);
    q->stopping = true;
    pthread_cond_broadcast(&q->cond);
    for (;;) {
        left = 0;
        for (int i = 0; i < ws->n; i++)
            left += ws->w[i].started && !ws->w[i].exited;
        if (!left)
            break;
        if (forever)
            pthread_cond_wait(&q->cond, &q->lock);
        else if (pthread_cond_clockwait(&q->cond, &q->lock, CLOCK_MONOTONIC, &end) == ETIMEDOUT)
            break;
    }
    /* A thread that did not stop in time is stuck where no poll reaches it
     * (a hung device call, a kernel that never returns): it still holds
     * its job, which stays recorded as running and so resumes from its
     * last checkpoint at the next start, as after a crash. */
    for (int i = 0; left && i < ws->n; i++) {
        worker *w = &ws->w[i];
        if (!w->started || w->exited)
            continue;
        if (w->busy)
            log_job(LOG_ERR, w->job, w->ctx->devs[w->dev]->id,
                    "job %u on %s did not stop within %llums ([daemon] stop_timeout): its thread is stuck; it "
                    "resumes from its last checkpoint at the next start",
                    w->job, w->ctx->devs[w->dev]->id, (unsigned long long)timeout_ms);
        else
            log_error("a job thread of %s did not stop within %llums ([daemon] stop_timeout)",
                      w->ctx->devs[w->dev]->id, (unsigned long long)timeout_ms);
    }
    pthread_mutex_unlock(&q->lock);
    if (left)
        return left;
    for (int i = 0; i < ws->n; i++)
        if (ws->w[i].started)
            pthread_join(ws->w[i].thread, NULL);
    free(ws->w);
    ws->w = NULL;
    ws->n = 0;
    return 0;
}
