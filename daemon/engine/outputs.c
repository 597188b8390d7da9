/* outputs.c — the output directory, metrics.jsonl, TensorBoard events and
 * the progress report a run publishes. */
#include "run.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fileio.h"

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- metrics ------------------------------------------------------------------------------ */

/* fopen for the files a run keeps in its output directory, which its
 * owner may have replaced with a FIFO, a device or a link: opened without
 * blocking, not through a link, and only if regular (fileio.h).  NULL
 * with errno and the reason in err. */
static FILE *open_regular(const char *path, int flags, const char *fmode, char *err, size_t err_len)
{
    int fd = fileio_open_regular(path, flags | O_NOFOLLOW, 0666, err, err_len);
    FILE *f = fd >= 0 ? fdopen(fd, fmode) : NULL;
    if (fd >= 0 && !f) {
        int e = errno;
        snprintf(err, err_len, "%s: %s", path, strerror(e));
        close(fd);
        errno = e;
    }
    return f;
}

/* On resume keep the lines of steps the checkpoint covers and drop the
 * rest: they belong to work that is about to be redone, and so does a last
 * line cut short by a crash or a full disk.  The copy replaces the file
 * only when all of it was written: 0, or -1 with err (the file as it was). */
static int trim_metrics(const char *path, uint64_t upto, char *err, size_t err_len)
{
    char why[4300];
    FILE *in = open_regular(path, O_RDONLY, "r", why, sizeof why);
    if (!in && errno == ENOENT)
        return 0; /* none yet: nothing to keep */
    if (!in) {
        snprintf(err, err_len, "cannot trim %s (for the resumed run): %s", path, why);
        return -1;
    }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *out = open_regular(tmp, O_WRONLY | O_CREAT | O_TRUNC, "w", why, sizeof why);
    if (!out) {
        snprintf(err, err_len, "cannot trim %s (for the resumed run): %s", path, why);
        fclose(in);
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, in)) > 0) {
        const char *s = strstr(line, "\"step\":");
        unsigned long long st = s ? strtoull(s + 7, NULL, 10) : 0;
        if (st <= upto && line[n - 1] == '\n')
            fwrite(line, 1, (size_t)n, out);
    }
    free(line);
    int e = ferror(in) ? EIO : 0;
    fclose(in);
    if (!e && (fflush(out) != 0 || ferror(out) || fsync(fileno(out)) != 0))
        e = errno ? errno : EIO;
    if (fclose(out) != 0 && !e)
        e = errno;
    if (!e && rename(tmp, path) != 0)
        e = errno;
    if (e) {
        snprintf(err, err_len, "cannot trim %s (for the resumed run): %s", path, strerror(e));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* A metrics or TensorBoard write failed (a full disk, say): the run stops
 * at the step's end, before any checkpoint, naming the file, rather than
 * finishing "done" with its logs cut short.  The first failure is kept. */
static void log_failed(run *r, const char *why)
{
    if (!r->out.err[0])
        snprintf(r->out.err, sizeof r->out.err, "%s", why);
}

/* Every real in a line is rounded first (number()) to fewer than 15
 * significant digits: at most 9 (%.9g, %.6g), milliseconds under 10^12
 * (%.3f), accuracies in [0,1] (%.6f); fp16's loss scale, a power of two
 * up to 2^24, is an integer.  Printed with 15, a double gives those digits
 * back, so each value reads as the printf of its format would. */
#define METRICS_JSON (JSON_COMPACT | JSON_ENSURE_ASCII | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15))

/* v printed with fmt, as a JSON value: the number that text stands for (an
 * integer when the text is one, as a reader parses it), so that a field
 * keeps its precision, "%.9g" for a loss and "%.3f" for milliseconds; or
 * null, as JSON has neither inf nor nan (a skipped fp16 step's gradient
 * norm is infinite, its loss may be too). */
static json_t *number(double v, const char *fmt)
{
    if (!isfinite(v))
        return json_null();
    char text[64];
    snprintf(text, sizeof text, fmt, v);
    if (text[strspn(text, "-0123456789")] == '\0')
        return json_integer(strtoll(text, NULL, 10));
    return json_real(strtod(text, NULL));
}

/* One line of metrics.jsonl, taking `line`'s reference. */
static void metrics_line(run *r, json_t *line)
{
    char *text = line ? json_dumps(line, METRICS_JSON) : NULL;
    json_decref(line);
    char why[4200];
    if (!text) {
        snprintf(why, sizeof why, "cannot write %s: out of memory", r->out.path_metrics);
        log_failed(r, why);
        return;
    }
    fprintf(r->out.metrics, "%s\n", text);
    free(text);
    if (fflush(r->out.metrics) != 0 || ferror(r->out.metrics)) {
        snprintf(why, sizeof why, "cannot write %s: %s", r->out.path_metrics, strerror(errno));
        log_failed(r, why);
    }
}

/* ---- the output directory -------------------------------------------------------------- */

/* Hold out_dir/.lock for the run: two runs writing one directory (two
 * devices given the same job file, or `gradd run` beside the daemon)
 * would interleave checkpoints and metrics, and each would resume from
 * the other's state.  flock, so that a crash or kill -9 releases it. */
static train_outcome lock_out_dir(run *r)
{
    char path[4200], note[64], holder[128];
    snprintf(path, sizeof path, "%s/.lock", r->j->out_dir);
    snprintf(note, sizeof note, "pid %ld, job %u", (long)getpid(), r->job);
    r->out.lock_fd = fileio_lock(path, 0666, note, holder, sizeof holder);
    if (r->out.lock_fd >= 0)
        return TRAIN_DONE;
    if (errno != EWOULDBLOCK)
        return run_fail(r, "cannot lock %s: %s", path, strerror(errno));
    return run_fail(r, "output directory %s is in use by another run (%s); give this job another [output] dir, or "
                   "wait for that one to end",
                    r->j->out_dir, holder[0] ? holder : "holder unknown");
}

train_outcome outputs_claim_dir(run *r)
{
    char err[1024];
    if (fileio_mkdirs(r->j->out_dir, 0777, "output directory", err, sizeof err) != 0)
        return run_fail(r, "%s", err);
    if (lock_out_dir(r) != TRAIN_DONE)
        return TRAIN_FAILED;
    snprintf(r->out.path_metrics, sizeof r->out.path_metrics, "%s/metrics.jsonl", r->j->out_dir);
    return TRAIN_DONE;
}

train_outcome outputs_open(run *r, bool resumed)
{
    char err[1024];
    if (resumed && trim_metrics(r->out.path_metrics, r->progress.step, err, sizeof err) != 0)
        return run_fail(r, "%s", err);
    r->out.metrics = open_regular(r->out.path_metrics, O_WRONLY | O_CREAT | (resumed ? O_APPEND : O_TRUNC),
                                  resumed ? "a" : "w", err, sizeof err);
    if (!r->out.metrics)
        return run_fail(r, "cannot write %s", err);
    char tbdir[4200];
    snprintf(tbdir, sizeof tbdir, "%s/tensorboard", r->j->out_dir);
    if (fileio_mkdirs(tbdir, 0777, "output directory", err, sizeof err) != 0 ||
        tb_open(tbdir, &r->out.tb, err, sizeof err) != 0)
        return run_fail(r, "%s", err);
    /* The next step is the first this run logs: earlier files' events from
     * it on are a crashed run's, past the checkpoint resumed from. */
    if (tb_session_start(r->out.tb, (int64_t)r->progress.step + 1, wall_s()) != 0)
        return run_fail(r, "%s", tb_error(r->out.tb));
    return TRAIN_DONE;
}

bool outputs_flush(run *r)
{
    if (r->out.tb && tb_flush(r->out.tb) != 0)
        log_failed(r, tb_error(r->out.tb));
    return !r->out.err[0];
}

train_outcome outputs_close(run *r, train_outcome o)
{
    if (r->out.metrics && fclose(r->out.metrics) != 0 && o == TRAIN_DONE)
        o = run_fail(r, "cannot write %s: %s", r->out.path_metrics, strerror(errno));
    r->out.metrics = NULL;
    if (r->out.tb) {
        char err[600];
        if (tb_close(r->out.tb, err, sizeof err) != 0 && o == TRAIN_DONE)
            o = run_fail(r, "%s", err);
        r->out.tb = NULL;
    }
    return o;
}

void outputs_release(run *r)
{
    if (r->out.lock_fd >= 0)
        close(r->out.lock_fd);
    r->out.lock_fd = -1;
}

/* ---- reports ---------------------------------------------------------------------------- */

void outputs_step(run *r, double loss, double lr, double norm, double ups, double dt, bool skipped)
{
    train_progress *pr = &r->prog;
    pool_stats *ps = malloc(sizeof *ps);
    if (ps) {
        pool_stats_read(r->p, ps);
        pr->allocated = (size_t)ps->allocated_bytes[POOL_ALL].current;
        pr->reserved = (size_t)ps->reserved_bytes[POOL_ALL].current;
        free(ps);
    }
    pr->step = r->progress.step;
    pr->loss = loss;
    pr->lr = lr;
    pr->grad_norm = norm;
    pr->units_per_s = ups;
    /* Here, not only in outputs_sync: the last step has no step boundary
     * after it, and its overflow or doubling is still news. */
    pr->loss_scale = r->progress.loss_scale;
    if (r->out.metrics && (r->progress.step % r->j->log_every == 0 || r->progress.step == r->j->steps)) {
        /* fp16 adds the scale after the step (what the next one runs with,
         * as the progress report and the checkpoint have it) and marks a
         * skipped step; other precisions have no scale to show. */
        json_t *line = json_object();
        char per_s[32];
        snprintf(per_s, sizeof per_s, "%s_per_s", r->kind->units);
        json_object_set_new(line, "step", json_integer((json_int_t)r->progress.step));
        json_object_set_new(line, "loss", number(loss, "%.9g"));
        json_object_set_new(line, "lr", number(lr, "%.9g"));
        json_object_set_new(line, "grad_norm", number(norm, "%.9g"));
        json_object_set_new(line, per_s, number(ups, "%.6g"));
        json_object_set_new(line, "step_ms", number(dt * 1e3, "%.3f"));
        json_object_set_new(line, "micro", json_integer(pr->micro));
        json_object_set_new(line, "accum", json_integer(pr->accum));
        json_object_set_new(line, "allocated", json_integer((json_int_t)pr->allocated));
        json_object_set_new(line, "reserved", json_integer((json_int_t)pr->reserved));
        if (r->dist) {
            /* Whether summing the gradients while the backward runs pays:
             * how much of them started early, and what was left to wait. */
            json_object_set_new(line, "allreduce_early", number(r->gsum.early, "%.4f"));
            json_object_set_new(line, "allreduce_wait_ms", number(r->gsum.wait_s * 1e3, "%.3f"));
        }
        if (r->j->precision == JOBCFG_FP16) {
            json_object_set_new(line, "loss_scale", number(r->progress.loss_scale, "%.17g"));
            if (skipped)
                json_object_set_new(line, "skipped", json_true());
        }
        metrics_line(r, line);
    }
    if (r->out.tb) {
        /* Beside the curves, what a slow or memory-bound step is read from:
         * throughput in the model's unit, the pool's figures after the step
         * (float, as every scalar: exact to 2^24 bytes, to 7 digits above)
         * and the micro-batch, as metrics.jsonl has them.  fp16 adds the
         * loss scale, as metrics.jsonl does. */
        char per_s[32];
        snprintf(per_s, sizeof per_s, "perf/%s_per_s", r->kind->units);
        const char *tags[] = {"train/loss",    "train/lr",    "train/grad_norm",
                              per_s,           "memory/allocated_bytes", "memory/reserved_bytes",
                              "batch/micro",   "train/loss_scale"};
        const float vals[] = {(float)loss,      (float)lr,            (float)norm,
                              (float)ups,       (float)pr->allocated, (float)pr->reserved,
                              (float)pr->micro, (float)r->progress.loss_scale};
        /* To the kernel at every logged step, as metrics.jsonl: a live
         * tensorboard sees it, and a kill -9 loses nothing logged before
         * the checkpoint a resume starts after. */
        size_t n = r->j->precision == JOBCFG_FP16 ? 8 : 7;
        if (tb_scalars(r->out.tb, (int64_t)r->progress.step, wall_s(), n, tags, vals) != 0 ||
            tb_flush(r->out.tb) != 0)
            log_failed(r, tb_error(r->out.tb));
    }
}

void outputs_eval(run *r, uint64_t units)
{
    if (r->out.metrics) {
        json_t *line = json_object();
        char count[32];
        snprintf(count, sizeof count, "val_%s", r->kind->units);
        json_object_set_new(line, "step", json_integer((json_int_t)r->progress.step));
        json_object_set_new(line, "val_loss", number(r->prog.val_loss, "%.9g"));
        if (r->kind->classifies)
            json_object_set_new(line, "val_accuracy", number(r->prog.val_accuracy, "%.6f"));
        json_object_set_new(line, count, json_integer((json_int_t)units));
        metrics_line(r, line);
    }
    if (r->out.tb) {
        int64_t step = (int64_t)r->progress.step;
        if (tb_scalar(r->out.tb, "val/loss", step, (float)r->prog.val_loss, wall_s()) != 0 ||
            (r->kind->classifies &&
             tb_scalar(r->out.tb, "val/accuracy", step, (float)r->prog.val_accuracy, wall_s()) != 0))
            log_failed(r, tb_error(r->out.tb));
    }
}

/* Publish the controller's state in the progress report. */
void outputs_sync(run *r)
{
    const batch_ctl *c = &r->ctl;
    train_progress *pr = &r->prog;
    pr->micro = r->mem.micro ? r->mem.micro : c->micro;
    pr->accum = batch_accum(r->rank_batch, pr->micro);
    pr->micro_max = c->predicted_max;
    pr->micro_fit = c->max_fit;
    pr->oom_recoveries = c->oom_recoveries;
    pr->batch_changes = c->changes;
    pr->loss_scale = r->progress.loss_scale;
    if (c->changes) {
        pr->change_from = c->last.from;
        pr->change_to = c->last.to;
        pr->change_step = c->last.step;
        snprintf(pr->change_reason, sizeof pr->change_reason, "%s", batch_reason_name(c->last.reason));
    }
    train_result *res = r->res;
    res->micro = pr->micro;
    res->micro_fit = c->max_fit;
    res->oom_recoveries = c->oom_recoveries;
    res->probes = c->probes;
    res->batch_changes = c->changes;
    res->peak_fixed = c->fixed;
    res->peak_per_sample = c->per_sample;
}

/* A change of micro-batch: into metrics.jsonl, the pool's timeline and the
 * progress report. */
void outputs_batch_change(run *r)
{
    const batch_change *ch = &r->ctl.last;
    outputs_sync(r);
    if (r->out.metrics) {
        json_t *line = json_object();
        json_object_set_new(line, "step", json_integer((json_int_t)ch->step));
        json_object_set_new(line, "event", json_string("batch_change"));
        json_object_set_new(line, "from", json_integer(ch->from));
        json_object_set_new(line, "to", json_integer(ch->to));
        json_object_set_new(line, "reason", json_string(batch_reason_name(ch->reason)));
        json_object_set_new(line, "accum", json_integer(batch_accum(r->rank_batch, ch->to)));
        json_object_set_new(line, "predicted_max", json_integer(r->ctl.predicted_max));
        json_object_set_new(line, "fit_max", json_integer(r->ctl.max_fit));
        json_object_set_new(line, "oom_recoveries", json_integer((json_int_t)r->ctl.oom_recoveries));
        metrics_line(r, line);
    }
    char note[24];
    snprintf(note, sizeof note, "%u>%u %s", ch->from, ch->to, batch_reason_name(ch->reason));
    pool_timeline_mark(r->p, POOL_EV_BATCH_CHANGE, r->job, r->mem.act_bytes, note);
}

