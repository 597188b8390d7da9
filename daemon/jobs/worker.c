/* worker.c — one thread per job slot of a device. */
#include "worker.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "access.h"
#include "runner.h"
#include "base/log.h"
#include "models/model.h"
#include "units.h"

typedef struct {
    worker *w;
    job *j;
    FILE *log; /* the job's log, opened with the daemon's identity */
    bool counted_resume;
} job_run;

static double now_unix(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void on_step(void *user, const train_progress *p)
{
    job_run *r = user;
    queue *q = r->w->q;
    pthread_mutex_lock(&q->lock);
    r->j->prog = *p;
    r->j->have_progress = true;
    if (p->resumed && !r->counted_resume) {
        /* Saved by the loop on the notify below, not at the job's end: a
         * crash before then would lose the count (this thread, as the
         * owner, cannot write the state dir). */
        r->j->resumes++;
        r->j->unsaved = true;
        q->any_unsaved = true;
        r->counted_resume = true;
    }
    queue_touch(q, r->j);
    r->w->beats++;
    pthread_mutex_unlock(&q->lock);
    queue_notify(q);
    if (r->log && (p->step % r->j->cfg.log_every == 0 || p->step == p->steps || p->step == 1)) {
        char a[16], b[16];
        fprintf(r->log, "step %llu/%llu loss %.4f", (unsigned long long)p->step, (unsigned long long)p->steps,
                p->loss);
        if (!isnan(p->val_loss))
            fprintf(r->log, " val %.4f", p->val_loss);
        if (!isnan(p->val_accuracy))
            fprintf(r->log, " acc %.2f%%", p->val_accuracy * 100);
        fprintf(r->log, " lr %.2e norm %.3f %.0f %s/s micro %u×%u mem %s/%s\n", p->lr, p->grad_norm,
                p->units_per_s, model_unit(&r->j->cfg), p->micro, p->accum,
                units_format_size(p->allocated, a, sizeof a), units_format_size(p->reserved, b, sizeof b));
        fflush(r->log);
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
     * leave it.  No beats while here; shutdown still gets it out. */
    while (r->w->hang && !q->stopping)
        pthread_cond_wait(&q->cond, &q->lock);
    bool stop = r->j->cancel_requested || q->stopping;
    pthread_mutex_unlock(&q->lock);
    return stop;
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
    FILE *f = user;
    fputs("== ", f);
    vfprintf(f, fmt, ap);
    fputc('\n', f);
}

static void run_one(worker *w, job *j)
{
    gradd_ctx *ctx = w->ctx;
    queue *q = w->q;
    dev *d = ctx->devs[w->dev];
    char path[PATH_MAX + 32];
    queue_log_path(q, j->id, path, sizeof path);
    job_run r = {w, j, fopen(path, "a"), false};
    if (r.log)
        fprintf(r.log, "== job %u (%s) starting on %s, owner %s (uid %u)\n", j->id, j->name, d->id, j->user,
                (unsigned)j->uid);

    train_result res;
    memset(&res, 0, sizeof res);
    train_outcome o = TRAIN_FAILED;
    char err[512];
    access_saved saved;
    const runner *run = runner_for(&j->cfg);
    if (!run) {
        snprintf(res.message, sizeof res.message, "no runner takes this job");
    } else if (w->own_fs_err[0]) {
        snprintf(res.message, sizeof res.message, "%s", w->own_fs_err);
    } else if (access_become(j->uid, j->gid, &saved, err, sizeof err) != 0) {
        snprintf(res.message, sizeof res.message, "%s", err);
    } else {
        /* Everything the run creates gets the owner's umask; this thread's
         * own (access_own_fs), so the daemon's files keep theirs. */
        mode_t daemon_mask = umask(j->umask);
        runner_env env = {
            .ctx = ctx,
            .dev = w->dev,
            .job_id = j->id,
            .cpu_share = cpu_share(ctx),
            .cpu_slots = cpu_slots(ctx),
            .hooks = {.on_step = on_step, .should_stop = should_stop, .poll = should_stop, .user = &r},
            .note = r.log ? log_note : NULL,
            .note_user = r.log,
        };
        o = run->run(&env, &j->cfg, &res);
        umask(daemon_mask);
        access_restore(&saved);
    }
    pool_job_forget(ctx->pools[w->dev], j->id);

    pthread_mutex_lock(&q->lock);
    switch (o) {
    case TRAIN_DONE:
        j->state = JOB_COMPLETED;
        break;
    case TRAIN_STOPPED:
        if (j->cancel_requested) {
            j->state = JOB_CANCELLED;
            snprintf(j->reason, sizeof j->reason, "cancelled at step %llu; checkpoint in %s",
                     (unsigned long long)res.steps_done, j->cfg.out_dir);
        } else {
            j->state = JOB_QUEUED; /* daemon shutdown: resume at the next start */
        }
        break;
    case TRAIN_FAILED:
    default:
        j->state = JOB_FAILED;
        snprintf(j->reason, sizeof j->reason, "%s", res.message);
        break;
    }
    if (j->state != JOB_QUEUED)
        j->finished_at = now_unix();
    queue_touch(q, j);
    queue_persist_or_retry(q, j, d->id);
    /* Said from copies: once the lock is let go a finished job may be
     * removed (gradctl rm) and freed. */
    uint32_t id = j->id;
    char outcome[1200], name[sizeof j->name];
    snprintf(outcome, sizeof outcome, "%s%s%s", job_state_name(j->state), j->reason[0] ? ": " : "", j->reason);
    snprintf(name, sizeof name, "%s", j->name);
    pthread_mutex_unlock(&q->lock);
    queue_notify(q);
    log_job(LOG_INFO, id, d->id, "job %u (%s) on %s: %s", id, name, d->id, outcome);
    if (r.log) {
        fprintf(r.log, "== job %u %s\n", id, outcome);
        fclose(r.log);
    }
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
        while (!q->stopping && !(j = queue_next_for(q, d->id, d->kind == DEV_KIND_CUDA, have_cuda)))
            pthread_cond_wait(&q->cond, &q->lock);
        if (q->stopping) {
            pthread_mutex_unlock(&q->lock);
            return NULL;
        }
        j->state = JOB_RUNNING;
        w->busy = true;
        w->job = j->id;
        j->started_at = now_unix();
        j->have_progress = false;
        snprintf(j->device, sizeof j->device, "%s", d->id);
        queue_touch(q, j);
        queue_persist_or_retry(q, j, d->id);
        pthread_mutex_unlock(&q->lock);
        queue_notify(q);
        log_job(LOG_INFO, j->id, d->id, "job %u (%s, uid %u) running on %s", j->id, j->name, (unsigned)j->uid, d->id);
        run_one(w, j);
        pthread_mutex_lock(&q->lock);
        w->busy = false;
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
    for (int i = 0; i < ws->n; i++) {
        worker *w = &ws->w[i];
        w->ctx = ctx;
        w->q = q;
        w->dev = i / per_device;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            snprintf(err, err_len, "cannot start a worker thread");
            workers_stop(ws);
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

void workers_stop(workers *ws)
{
    if (!ws->w)
        return;
    queue *q = ws->w[0].q;
    if (q) {
        pthread_mutex_lock(&q->lock);
        q->stopping = true;
        pthread_cond_broadcast(&q->cond);
        pthread_mutex_unlock(&q->lock);
    }
    for (int i = 0; i < ws->n; i++)
        if (ws->w[i].started)
            pthread_join(ws->w[i].thread, NULL);
    free(ws->w);
    ws->w = NULL;
    ws->n = 0;
}
