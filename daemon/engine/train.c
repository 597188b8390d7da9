/* train.c — the training run: its data, the loop, one optimizer step.
 *
 * The run's device memory and the batch controller's decisions are in
 * memory.c, the resume state in checkpoint.c, the logs and the progress
 * report in outputs.c (run.h joins them). */
#include "train.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "run.h"
#include "models/lora.h"
#include "pool/dev.h"

/* train_step's outcome when memory ran out inside the step (internal). */
#define STEP_OOM 3

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A collective failed: the other ranks died, hang or gave up.  Nothing
 * can go on with fewer ranks: the run fails from wherever it is, back in
 * train_run (which releases what the run holds), and the last checkpoint
 * stands for a resume. */
static _Noreturn void run_collective_failed(run *r, const char *err)
{
    run_fail(r, "%s; the job resumes from its last checkpoint when started again", err);
    longjmp(r->unwind, 1);
}

void run_agree(run *r, double *v, size_t n, dist_op op, const char *what)
{
    char err[1024];
    if (r->dist && dist_allreduce_f64(r->dist, v, n, op, what, err, sizeof err) != 0)
        run_collective_failed(r, err);
}

train_outcome run_fail(run *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->res->message, sizeof r->res->message, fmt, ap);
    va_end(ap);
    r->res->outcome = TRAIN_FAILED;
    return TRAIN_FAILED;
}

double train_lr(const job_config *j, uint64_t step)
{
    if (j->warmup && step < j->warmup)
        return j->lr * (double)(step + 1) / (double)j->warmup;
    if (j->steps <= j->warmup + 1)
        return j->lr;
    double progress = (double)(step - j->warmup) / (double)(j->steps - j->warmup - 1);
    if (progress > 1)
        progress = 1;
    return j->min_lr + 0.5 * (j->lr - j->min_lr) * (1.0 + cos(M_PI * progress));
}

/* ---- data ------------------------------------------------------------------------------ */

static train_outcome load_data_(run *r);
/* The job's data, within its share of host memory; what it holds is part
 * of the job's progress from its first step. */
static train_outcome load_data(run *r, const train_hooks *h)
{
    r->data.budget.limit = h ? h->data_limit : 0;
    r->data.budget.key = h ? h->data_limit_key : NULL;
    train_outcome o = load_data_(r);
    r->prog.data_bytes = r->data.budget.used;
    return o;
}

/* Fine-tuning samples (jsonl): a val file is read as jsonl too.  Rows are
 * packed where the job asks and the model keeps samples apart; pos and
 * start then travel with each micro-batch. */
static train_outcome load_sft(run *r)
{
    const job_config *j = r->j;
    data_budget *b = &r->data.budget;
    char err[1024];
    bool cut = j->overlong == JOBCFG_OVERLONG_TRUNCATE;
    if (data_sft_load(&r->data.sft_train, j->train, j->vocab, j->context, cut, b, err, sizeof err) != 0)
        return run_fail(r, "%s", err);
    if (j->val[0]) {
        if (data_sft_load(&r->data.sft_val, j->val, j->vocab, j->context, cut, b, err, sizeof err) != 0)
            return run_fail(r, "%s", err);
        r->data.have_val = true;
    } else if (j->val_fraction > 0) {
        if (data_sft_split(&r->data.sft_train, &r->data.sft_val, j->val_fraction, err, sizeof err) != 0)
            return run_fail(r, "%s", err);
        r->data.have_val = true;
    }
    if (data_stream_sft(&r->data.stream, &r->data.sft_train, j->seed, b, err, sizeof err) != 0)
        return run_fail(r, "%s", err);
    if (r->data.have_val)
        data_eval_sft(&r->data.eval, &r->data.sft_val);
    r->data.sft = true;
    r->data.pack = j->packing && r->kind->packs;
    r->data.x_bytes = r->data.y_bytes = (size_t)j->context * sizeof(int32_t);
    r->data.aux_bytes = r->data.pack ? 2 * (size_t)j->context * sizeof(int32_t) : 0;
    return TRAIN_DONE;
}

static train_outcome load_data_(run *r)
{
    const job_config *j = r->j;
    data_budget *b = &r->data.budget;
    char err[1024];
    if (r->kind->data == MODEL_DATA_TOKENS) {
        data_format fmt = j->format == JOBCFG_DATA_TEXT     ? DATA_FMT_TEXT
                          : j->format == JOBCFG_DATA_TOKENS ? DATA_FMT_LLMC
                          : j->format == JOBCFG_DATA_NPY    ? DATA_FMT_NPY
                          : j->format == JOBCFG_DATA_JSONL  ? DATA_FMT_JSONL
                                                            : DATA_FMT_AUTO;
        if (data_is_jsonl(fmt, j->train))
            return load_sft(r);
        if (data_tokens_load(&r->data.tok_train, j->train, fmt, j->vocab, b, err, sizeof err) != 0)
            return run_fail(r, "%s", err);
        if (j->val[0]) {
            if (data_tokens_load(&r->data.tok_val, j->val, fmt, j->vocab, b, err, sizeof err) != 0)
                return run_fail(r, "%s", err);
            r->data.have_val = true;
        } else if (j->val_fraction > 0) {
            if (data_tokens_split(&r->data.tok_train, &r->data.tok_val, j->val_fraction, b, err, sizeof err) != 0)
                return run_fail(r, "%s", err);
            r->data.have_val = true;
        }
        if (r->data.tok_train.n < (size_t)j->context + 1)
            return run_fail(r, "%s: %zu tokens is less than one window of context %u + 1", j->train,
                            r->data.tok_train.n, j->context);
        if (data_stream_tokens(&r->data.stream, &r->data.tok_train, j->context, j->seed, b, err, sizeof err) != 0)
            return run_fail(r, "%s", err);
        if (r->data.have_val && data_eval_tokens(&r->data.eval, &r->data.tok_val, j->context, err, sizeof err) != 0)
            return run_fail(r, "%s", err);
        r->data.x_bytes = r->data.y_bytes = (size_t)j->context * sizeof(int32_t);
        return TRAIN_DONE;
    }
    if (data_images_load(&r->data.img_train, j->train, j->train_labels, 0, j->subset, b, err, sizeof err) != 0)
        return run_fail(r, "%s", err);
    r->data.input_dim = (uint32_t)r->data.img_train.dim;
    r->data.classes = r->data.img_train.classes;
    if (j->val[0]) {
        if (data_images_load(&r->data.img_val, j->val, j->val_labels, r->data.classes, j->val_subset, b, err,
                             sizeof err) != 0)
            return run_fail(r, "%s", err);
        if (r->data.img_val.dim != r->data.img_train.dim)
            return run_fail(r, "%s: images of %zu pixels, but the training images have %zu", j->val,
                            r->data.img_val.dim, r->data.img_train.dim);
        r->data.val_images = &r->data.img_val;
        r->data.have_val = true;
    } else if (j->val_fraction > 0) {
        /* Hold out the tail: a view into the training arrays, which then
         * stop short of it. */
        size_t nval = (size_t)((double)r->data.img_train.n * j->val_fraction);
        if (nval == 0 || nval >= r->data.img_train.n)
            return run_fail(r, "%s: val_fraction %.3f of %zu images leaves no validation or no training set", j->train,
                            j->val_fraction, r->data.img_train.n);
        size_t ntrain = r->data.img_train.n - nval;
        r->data.img_val_view = r->data.img_train;
        r->data.img_val_view.n = nval;
        r->data.img_val_view.labels = r->data.img_train.labels + ntrain;
        if (r->data.img_train.u8)
            r->data.img_val_view.u8 = r->data.img_train.u8 + ntrain * r->data.img_train.dim;
        if (r->data.img_train.f32)
            r->data.img_val_view.f32 = r->data.img_train.f32 + ntrain * r->data.img_train.dim;
        r->data.img_train.n = ntrain;
        /* As for a val file: its first val_subset images. */
        if (j->val_subset && r->data.img_val_view.n > j->val_subset)
            r->data.img_val_view.n = (size_t)j->val_subset;
        r->data.val_images = &r->data.img_val_view;
        r->data.have_val = true;
    }
    if (data_stream_images(&r->data.stream, &r->data.img_train, j->seed, b, err, sizeof err) != 0)
        return run_fail(r, "%s", err);
    if (r->data.have_val)
        data_eval_images(&r->data.eval, r->data.val_images);
    r->data.x_bytes = (size_t)r->data.input_dim * sizeof(float);
    r->data.y_bytes = sizeof(int32_t);
    return TRAIN_DONE;
}

static void free_data(run *r)
{
    data_stream_free(&r->data.stream);
    data_tokens_free(&r->data.tok_train);
    data_tokens_free(&r->data.tok_val);
    /* The held-out view shares img_train's arrays: restore n before freeing
     * is unnecessary, free releases the arrays whatever n says. */
    data_images_free(&r->data.img_train);
    data_images_free(&r->data.img_val);
    data_sft_free(&r->data.sft_val); /* a view of sft_train's arrays, or its own */
    data_sft_free(&r->data.sft_train);
}

/* Fine-tuning samples into rows (at most one a sample), and with packing
 * their positions and starts. */
static size_t next_sft(run *r, size_t n, bool eval, model_batch *mb, uint64_t *units)
{
    size_t T = r->j->context, cap = (size_t)r->mem.micro * T;
    int32_t *aux = r->host_visible ? r->mem.aux : r->mem.aux_host;
    data_rows rows;
    data_rows_begin(&rows, r->host_visible ? r->mem.x : r->mem.x_host, r->host_visible ? r->mem.y : r->mem.y_host,
                    aux, aux ? aux + cap : NULL, T, r->data.pack);
    size_t got = n;
    if (eval)
        got = data_eval_next_sft(&r->data.eval, n, &rows);
    else
        data_stream_next_sft(&r->data.stream, n, &rows);
    size_t used = (size_t)rows.rows * T * sizeof(int32_t);
    if (!r->host_visible && rows.rows) {
        r->k->copy_h2d(r->kc, r->mem.x, rows.x, used);
        r->k->copy_h2d(r->kc, r->mem.y, rows.y, used);
        if (r->data.pack) {
            r->k->copy_h2d(r->kc, r->mem.aux, rows.pos, used);
            r->k->copy_h2d(r->kc, r->mem.aux + cap, rows.start, used);
        }
    }
    *mb = (model_batch){.x = r->mem.x, .y = r->mem.y, .n = rows.rows,
                        .pos = r->data.pack ? r->mem.aux : NULL, .start = r->data.pack ? r->mem.aux + cap : NULL};
    if (units)
        *units = rows.targets;
    return got;
}

size_t run_next_batch(run *r, size_t n, bool eval, model_batch *mb, uint64_t *units)
{
    if (r->data.sft)
        return next_sft(r, n, eval, mb, units);
    void *x = r->host_visible ? r->mem.x : r->mem.x_host;
    void *y = r->host_visible ? r->mem.y : r->mem.y_host;
    size_t got = n;
    if (r->kind->data == MODEL_DATA_TOKENS) {
        if (eval)
            got = data_eval_next_tokens(&r->data.eval, n, x, y);
        else
            data_stream_next_tokens(&r->data.stream, n, x, y);
    } else {
        if (eval)
            got = data_eval_next_images(&r->data.eval, n, x, y);
        else
            data_stream_next_images(&r->data.stream, n, x, y);
    }
    if (!r->host_visible && got) {
        r->k->copy_h2d(r->kc, r->mem.x, x, got * r->data.x_bytes);
        r->k->copy_h2d(r->kc, r->mem.y, y, got * r->data.y_bytes);
    }
    *mb = (model_batch){.x = r->mem.x, .y = r->mem.y, .n = (uint32_t)got};
    if (units)
        *units = (uint64_t)got * r->m->ops->units_per_sample(r->m);
    return got;
}

/* ---- evaluation -------------------------------------------------------------------------- */

/* After a pass run with m->stoppable set: whether the run's poll cut it
 * short (what it computed is then to be thrown away); the model is ready
 * for the next pass either way, not stoppable until it is set again. */
static bool cut_short(model *m)
{
    bool stopped = m->stopped;
    m->stoppable = m->stopped = false;
    return stopped;
}

/* Evaluate on the validation set and report it; true when a stop cut it
 * short on any rank (nothing reported).  Ranks evaluate their dist_shard
 * parts of the samples and add up the sums. */
static bool evaluate(run *r)
{
    if (!r->data.have_val)
        return false;
    data_eval *e = &r->data.eval;
    data_eval_reset(e);
    /* eval_batches counts effective batches, run in micro-batches: the set
     * is the same whatever the micro-batch (which tuning chooses by speed),
     * so validation losses compare across runs and across size changes. */
    uint64_t want = r->j->eval_batches ? (uint64_t)r->j->eval_batches * r->j->batch : UINT64_MAX;
    if (want > e->size)
        want = e->size;
    size_t first, count;
    dist_shard((size_t)want, dist_size(r->dist), dist_rank(r->dist), &first, &count);
    data_eval_seek(e, first);
    /* loss, units, correct, samples, stopped */
    double sum[5] = {0, 0, 0, 0, 0};
    while (sum[3] < (double)count) {
        uint64_t left = count - (uint64_t)sum[3];
        model_batch mb;
        uint64_t u = 0, c = 0;
        size_t n = run_next_batch(r, left < r->mem.micro ? (size_t)left : r->mem.micro, true, &mb, &u);
        if (n == 0)
            break;
        r->m->stoppable = true;
        sum[0] += r->m->ops->forward(r->m, &mb, r->kind->classifies ? &c : NULL);
        if (cut_short(r->m)) {
            sum[4] = 1;
            break;
        }
        sum[1] += (double)u;
        sum[2] += (double)c;
        sum[3] += (double)n;
    }
    run_agree(r, sum, 5, DIST_SUM, "adding up the evaluation");
    if (sum[4] > 0)
        return true;
    if (sum[1] == 0)
        return false;
    r->prog.val_loss = sum[0] / sum[1];
    r->prog.val_accuracy = r->kind->classifies ? sum[2] / sum[3] : NAN;
    outputs_eval(r, (uint64_t)sum[1]);
    return false;
}

/* A micro-batch's forward and backward, in one call where the model has
 * one (it may fuse across the two); Σ of its losses.  An allocation that
 * fails on the way sets r->mem.oom (the step is then redone smaller). */
double run_forward_backward(run *r, const model_batch *mb, float dloss)
{
    model *m = r->m;
    if (m->ops->forward_backward)
        return m->ops->forward_backward(m, mb, dloss);
    double loss = m->ops->forward(m, mb, NULL);
    if (!r->mem.oom)
        m->ops->backward(m, mb, dloss);
    return loss;
}

/* ---- the gradients' sum over the ranks -------------------------------------------------- */

/* The buckets are fixed, from the end of the gradients down: every rank
 * starts the same ones in the same order, whenever its backward gets
 * there.  Those of the step's last micro-batch start as its backward
 * finishes their parameters (the model's grads_final); what has not
 * started by the end of the micro-batches (a kind that does not report, a
 * pass cut short, an out of memory, LoRA's adapters) starts then.  A step
 * thrown away afterwards (an OOM or a stop on any rank) has summed for
 * nothing, but every rank has taken part in the same collectives. */
static void gradsum_start_to(run *r, size_t from)
{
    const run_trained *tr = &r->mem.trained;
    while (!r->gsum.failed && r->gsum.next > from) {
        size_t hi = r->gsum.next, n = r->gsum.bucket && r->gsum.bucket < hi ? r->gsum.bucket : hi;
        if (hi - n < from)
            break;
        if (dist_allreduce_start(r->dist, tr->grads + hi - n, n, "the gradients' all-reduce", r->gsum.err,
                                 sizeof r->gsum.err) != 0)
            r->gsum.failed = true;
        r->gsum.next = hi - n;
    }
}

static void grads_final(void *user, size_t from)
{
    run *r = user;
    gradsum_start_to(r, from);
    dist_progress(r->dist);
}

/* The step's first micro-batch: nothing started. */
static void gradsum_begin(run *r)
{
    r->gsum.next = r->mem.trained.count;
    r->gsum.bucket = r->j->allreduce_bucket / sizeof(float);
}

/* Before the last micro-batch's pass: its backward starts the buckets. */
static void gradsum_arm(run *r, bool on)
{
    r->m->grads_final = on && r->dist && r->gsum.bucket && r->mem.trained.grads == r->m->grads ? grads_final : NULL;
    r->m->grads_user = r;
}

/* Every bucket started and summed. */
static void gradsum_finish(run *r)
{
    size_t P = r->mem.trained.count;
    r->gsum.early = P ? (double)(P - r->gsum.next) / (double)P : 0;
    double t0 = now_s();
    gradsum_start_to(r, 0);
    if (!r->gsum.failed &&
        dist_allreduce_finish(r->dist, "the gradients' all-reduce", r->gsum.err, sizeof r->gsum.err) != 0)
        r->gsum.failed = true;
    r->gsum.wait_s = now_s() - t0;
    if (r->gsum.failed)
        run_collective_failed(r, r->gsum.err);
}

/* ---- one optimizer step -------------------------------------------------------------------- */

/* A non-finite training loss: what led there and what to change.  The
 * step before says whether it grew (a learning rate too high for the
 * model: norms climbing) or jumped; no clipping lets one bad batch throw
 * the weights far. */
static train_outcome diverged(run *r, double loss)
{
    const job_config *j = r->j;
    char before[192] = "", clip[64] = "";
    const train_progress *p = &r->prog;
    if (r->progress.step > 0 && p->step == r->progress.step && isfinite(p->loss))
        snprintf(before, sizeof before, " (step %llu: loss %.4g, gradient norm %.4g, lr %.3g)",
                 (unsigned long long)r->progress.step, p->loss, p->grad_norm, p->lr);
    if (j->grad_clip <= 0)
        snprintf(clip, sizeof clip, ", or set [train] grad_clip (e.g. 1.0)");
    return run_fail(r, "the training loss became %s at step %llu%s; lower [train] lr (now %g), raise [train] warmup "
                   "(now %llu)%s; the last checkpoint is kept",
                    isnan(loss) ? "NaN" : "infinite", (unsigned long long)r->progress.step + 1, before, j->lr,
                    (unsigned long long)j->warmup, clip);
}

/* One attempt at the step at the current micro-batch.  Returns TRAIN_DONE
 * after an applied (or, fp16, skipped) step, TRAIN_STOPPED if asked to stop
 * before it was applied (between micro-batches, or between the layers of
 * one), STEP_OOM when memory ran out inside it, and TRAIN_FAILED on a
 * non-finite loss or a device failure.  Nothing but the gradients and the
 * data position changes before the optimizer runs, and the optimizer runs
 * only after every micro-batch went through: a partial gradient is never
 * applied. */
static int try_step(run *r, const train_hooks *h)
{
    const job_config *j = r->j;
    const kern_ops *k = r->k;
    model *m = r->m;
    double t0 = now_s();
    uint32_t upb = m->ops->units_per_sample(m);
    /* The loss averages over the step's targets (fine-tuning samples: its
     * labelled ones, counted before the first micro-batch so that every
     * micro-batch weighs its tokens alike); throughput counts its tokens,
     * padding left out. */
    double units = (double)j->batch * upb, tokens = units;
    if (r->data.sft) {
        uint64_t lab, tok;
        data_stream_sft_count(&r->data.stream, j->batch, &lab, &tok);
        units = (double)lab;
        tokens = (double)tok;
    }
    /* The scale these gradients carry, whatever the schedule does below. */
    const double ls = r->progress.loss_scale;
    float dloss = (float)(ls / units);

    const run_trained *tr = &r->mem.trained;
    r->mem.oom = false;
    k->zero(r->kc, tr->grads, tr->count);
    double loss_sum = 0;
    uint32_t accum = 0;
    bool stopped = false;
    /* This rank's share of the step's samples: the others' pass by. */
    data_stream_skip(&r->data.stream, r->rank_first);
    gradsum_begin(r);
    /* Every attempt at a step draws the same masks (an OOM's redo too). */
    m->dropout.on = true;
    m->dropout.seed = model_rand_u64(j->seed ^ 0x64726f706f7574ull, r->progress.step);
    for (uint32_t done = 0; done < r->rank_samples;) {
        if (h && h->should_stop && h->should_stop(h->user)) {
            stopped = true;
            break;
        }
        uint32_t n = r->rank_samples - done < r->mem.micro ? r->rank_samples - done : r->mem.micro;
        model_batch mb;
        run_next_batch(r, n, false, &mb, NULL);
        m->stoppable = true;
        gradsum_arm(r, done + n == r->rank_samples);
        m->dropout.first = r->rank_first + done;
        loss_sum += run_forward_backward(r, &mb, dloss);
        gradsum_arm(r, false);
        if (cut_short(m)) {
            stopped = true;
            break;
        }
        if (h && h->test_oom_step == r->progress.step + 1 && !r->mem.test_oom_done && !r->mem.oom) {
            r->mem.test_oom_done = r->mem.oom = true;
            pool_oom_report *o = &r->mem.last_oom;
            memset(o, 0, sizeof *o);
            o->job = r->job;
            o->job_allocated = r->mem.persistent + r->mem.act_bytes;
            o->requested = r->mem.act_per;
            snprintf(o->message, sizeof o->message, "test hook: a simulated out-of-memory in step %llu",
                     (unsigned long long)r->progress.step + 1);
        }
        if (r->mem.oom)
            break;
        done += n;
        accum++;
    }
    m->dropout.on = false;
    data_stream_skip(&r->data.stream, j->batch - r->rank_first - r->rank_samples);
    /* Queued device work may still fail for memory (CUDA's sticky error). */
    if (!stopped && !r->mem.oom) {
        char during[64];
        snprintf(during, sizeof during, "in step %llu", (unsigned long long)r->progress.step + 1);
        if (memory_device_check(r, during) < 0)
            return TRAIN_FAILED;
    }
    /* The step's gradient: the sum of the ranks' (each scaled by the
     * whole step's units).  Ranks stop, redo smaller, or go on together;
     * the loss is the sum of theirs. */
    bool oom = r->mem.oom;
    if (r->dist) {
        gradsum_finish(r);
        double v[3] = {loss_sum, oom ? 1 : 0, stopped ? 1 : 0};
        run_agree(r, v, 3, DIST_SUM, "agreeing on the step's outcome");
        loss_sum = v[0];
        oom = v[1] > 0;
        stopped = v[2] > 0;
    }
    if (stopped)
        return TRAIN_STOPPED;
    if (oom && memory_oom_agree(r, r->mem.oom))
        return STEP_OOM;
    double loss = loss_sum / units;
    /* The split this attempt ran, for the step's report, skipped or not. */
    r->prog.micro = r->mem.micro;
    r->prog.accum = accum;
    if (!isfinite(loss) && j->precision != JOBCFG_FP16)
        return diverged(r, loss);

    double sumsq = 0;
    k->sumsq(r->kc, &sumsq, tr->grads, tr->count);
    double norm = sqrt(sumsq) / ls;
    double lr = train_lr(j, r->progress.step);
    if (j->precision == JOBCFG_FP16) {
        /* Dynamic loss scaling: an overflow skips the step (the data is
         * consumed; the parameters, the moments and opt_steps are not
         * touched) and halves the scale. */
        if (!isfinite(norm) || !isfinite(loss)) {
            r->progress.loss_scale = r->progress.loss_scale > 2.0 ? r->progress.loss_scale / 2 : 1.0;
            r->progress.good_steps = 0;
            r->progress.step++;
            double dt = now_s() - t0;
            r->progress.step_s = dt;
            outputs_step(r, loss, lr, norm, tokens / (dt > 0 ? dt : 1e-9), dt, true);
            return TRAIN_DONE;
        }
        if (++r->progress.good_steps >= TRAIN_LOSS_SCALE_GROW_EVERY) {
            r->progress.good_steps = 0;
            if (r->progress.loss_scale * 2 <= TRAIN_LOSS_SCALE_MAX)
                r->progress.loss_scale *= 2;
        }
    }
    double scale = 1.0 / ls;
    if (j->grad_clip > 0 && norm > j->grad_clip)
        scale *= j->grad_clip / norm;
    /* This rank's share of the update (all of it but under
     * shard_optimizer), then the others' shares of the parameters. */
    size_t f = tr->opt_first;
    k->adamw_multi(r->kc, tr->params + f, tr->params16 ? tr->params16 + f : NULL, tr->grads + f, tr->opt,
                   tr->opt + tr->opt_count, tr->opt_segs, tr->opt_nsegs, (float)lr, (float)j->beta1, (float)j->beta2,
                   (float)j->eps, (float)j->weight_decay, (float)scale, (int)(r->progress.opt_steps + 1));
    if (tr->opt_count != tr->count) {
        char err[1024];
        if (k->sync(r->kc) != KERN_OK)
            return run_fail(r, "the device failed in step %llu's optimizer update: %s",
                            (unsigned long long)r->progress.step + 1, k->error(r->kc));
        if (dist_allgather_f32(r->dist, tr->params, tr->count, "gathering the updated parameters", err,
                               sizeof err) != 0)
            run_collective_failed(r, err);
        memory_refresh_params16(r);
    }
    /* Nothing here allocates: any failure is the device's. */
    if (k->sync(r->kc) != KERN_OK)
        return run_fail(r, "the device failed in step %llu's optimizer update: %s",
                        (unsigned long long)r->progress.step + 1, k->error(r->kc));
    r->progress.opt_steps++;
    r->progress.step++;
    double dt = now_s() - t0;
    r->progress.step_s = dt;
    outputs_step(r, loss, lr, norm, tokens / (dt > 0 ? dt : 1e-9), dt, false);
    r->res->final_loss = loss;
    return TRAIN_DONE;
}

/* The optimizer step: tried at the current micro-batch, and after an OOM
 * redone whole at a smaller one, from the same samples (the data position
 * goes back to the step's start) with the gradients zeroed again.  The
 * loss scale is not touched by a redo.  Same returns as try_step, except
 * STEP_OOM: micro-batch 1 not fitting fails the job. */
static train_outcome train_step(run *r, const train_hooks *h)
{
    uint64_t epoch, index;
    data_stream_state(&r->data.stream, &epoch, &index);
    for (;;) {
        double t0 = now_s();
        int o = try_step(r, h);
        if (o != STEP_OOM)
            return (train_outcome)o;
        char err[512];
        if (data_stream_set_state(&r->data.stream, epoch, index, err, sizeof err) != 0)
            return run_fail(r, "%s", err);
        train_outcome s = memory_after_oom(r);
        /* What the OOM cost: the work thrown away and the re-allocation;
         * the redo itself is the step that would have run anyway. */
        r->res->oom_lost_s += now_s() - t0;
        if (s != TRAIN_DONE)
            return TRAIN_FAILED;
    }
}

/* Stop the run: checkpoint the state at (epoch, index), which is the
 * step's start or, when the step was applied, its end. */
static train_outcome stop_at(run *r, uint64_t epoch, uint64_t index)
{
    if (checkpoint_save(r, epoch, index) != TRAIN_DONE)
        return TRAIN_FAILED;
    r->res->outcome = TRAIN_STOPPED;
    r->res->steps_done = r->progress.step;
    return TRAIN_STOPPED;
}

/* Fresh parameters, zero optimizer state; a checkpoint overrides both.
 * Under LoRA the checkpoint holds only the adapters: the base always comes
 * from [model] from (or the seed), and the adapters start as lora_init
 * draws them. */
static train_outcome init_weights(run *r)
{
    const job_config *j = r->j;
    char err[1024];
    size_t P = r->m->num_params;
    bool lora = r->m->lora != NULL;
    /* The model's own buffer on the cpu backend, but for a 16-bit base,
     * which is cast from fp32 staging. */
    bool in_place = r->host_visible && r->mem.params;
    float *init = in_place ? r->mem.params : malloc(P * sizeof(float));
    if (!init)
        return run_fail(r, "out of host memory initialising %zu parameters", P);
    /* A resume checkpoint wins over [model] from: it is where the job got to. */
    int rc = 0;
    if (j->from[0] && (lora || !checkpoint_exists(r))) {
        if ((rc = model_hf_load(r->m, j->from, init, err, sizeof err)) != 0)
            run_fail(r, "cannot import: %s", err);
    } else {
        r->m->ops->init_params(r->m, init, j->seed);
    }
    if (rc == 0 && (rc = memory_base_from_host(r, init, err, sizeof err)) != 0)
        run_fail(r, "%s", err);
    if (!in_place)
        free(init);
    if (rc != 0)
        return TRAIN_FAILED;
    const run_trained *t = &r->mem.trained;
    if (lora) {
        float *a = r->host_visible ? t->params : malloc(t->count * sizeof(float));
        if (!a)
            return run_fail(r, "out of host memory initialising %zu adapter parameters", t->count);
        lora_init(r->m, a, j->seed);
        if (!r->host_visible) {
            r->k->copy_h2d(r->kc, t->params, a, t->count * sizeof(float));
            free(a);
        }
    }
    r->k->zero(r->kc, t->opt, 2 * t->opt_count);
    return TRAIN_DONE;
}

static train_outcome run_job(run *r, const train_hooks *h)
{
    const job_config *j = r->j;
    char err[1024];
    /* The data first: a job whose data is refused leaves no output
     * directory behind. */
    if (load_data(r, h) != TRAIN_DONE)
        return TRAIN_FAILED;
    if (r->writer && outputs_claim_dir(r) != TRAIN_DONE)
        return TRAIN_FAILED;
    checkpoint_paths(r);
    /* The job's budget: the pool refuses it more, as an OOM, before the
     * device runs out for everyone. */
    if (j->mem_limit && pool_job_set_limit(r->p, r->job, j->mem_limit) != 0)
        return run_fail(r, "cannot set the memory limit: the pool's job table is full");
    if (model_create(j, r->data.input_dim, r->data.classes, r->k, r->kc, &r->m, err, sizeof err) != 0)
        return run_fail(r, "%s: %s", j->source, err);
    if (memory_choose_method(r) != TRAIN_DONE)
        return TRAIN_FAILED;
    j = r->j;
    r->res->lora = r->prog.lora = r->m->lora != NULL;
    r->m->poll = h ? h->poll : NULL;
    r->m->poll_user = h ? h->user : NULL;
    if (memory_alloc(r) != TRAIN_DONE)
        return TRAIN_FAILED;

    if (init_weights(r) != TRAIN_DONE)
        return TRAIN_FAILED;
    r->progress.loss_scale = j->precision == JOBCFG_FP16 ? TRAIN_LOSS_SCALE_INIT : 1.0;
    r->prog.steps = j->steps;
    r->prog.loss = NAN;
    r->prog.val_loss = NAN;
    r->prog.val_accuracy = NAN;
    int resumed = checkpoint_load(r);
    if (resumed < 0)
        return TRAIN_FAILED;
    memory_refresh_params16(r);
    r->prog.resumed = resumed == 1;
    /* Where it resumed is the job's progress from now, also should it
     * fail before its first step (a device that no longer fits it). */
    if (resumed == 1 && h && h->on_step)
        h->on_step(h->user, &r->prog);
    if (r->writer && outputs_open(r, resumed == 1) != TRAIN_DONE)
        return TRAIN_FAILED;
    if (memory_choose_micro(r) != TRAIN_DONE)
        return TRAIN_FAILED;

    double start = now_s(), before = r->prog.elapsed_s;
    if (r->progress.step == j->steps) {
        /* Resumed at its last step: nothing to train, but what it reached
         * is the job's progress. */
        r->prog.micro = r->mem.micro;
        r->prog.accum = batch_accum(r->rank_batch, r->mem.micro);
        if (h && h->on_step)
            h->on_step(h->user, &r->prog);
    }
    while (r->progress.step < j->steps) {
        uint64_t epoch, index;
        data_stream_state(&r->data.stream, &epoch, &index);
        train_outcome o = train_step(r, h);
        if (o == TRAIN_STOPPED) /* the step was not applied: the state before it */
            return stop_at(r, epoch, index);
        if (o != TRAIN_DONE)
            return o;
        /* Step boundary: the pool's step-based trimming runs here (its
         * time-based policies also run from the daemon's timer). */
        pool_tick(r->p, r->progress.step);
        bool last = r->progress.step == j->steps;
        /* ...and the batch controller: shrink before an OOM, or grow. */
        if (!last && memory_adapt(r) != TRAIN_DONE)
            return TRAIN_FAILED;
        if (((j->eval_every && r->progress.step % j->eval_every == 0) || last) && evaluate(r)) {
            /* Stopped while evaluating: the step stands, its evaluation
             * is not reported. */
            data_stream_state(&r->data.stream, &epoch, &index);
            return stop_at(r, epoch, index);
        }
        r->prog.elapsed_s = before + (now_s() - start);
        r->prog.trained = true;
        if (h && h->on_step)
            h->on_step(h->user, &r->prog);
        if (r->out.err[0])
            return run_fail(r, "%s", r->out.err);
        if ((j->checkpoint_every && r->progress.step % j->checkpoint_every == 0) || last) {
            data_stream_state(&r->data.stream, &epoch, &index);
            if (checkpoint_save(r, epoch, index) != TRAIN_DONE)
                return TRAIN_FAILED;
        }
    }
    if (checkpoint_export(r, err, sizeof err) != 0)
        return run_fail(r, "%s", err);
    r->res->steps_done = r->progress.step;
    r->res->val_loss = r->prog.val_loss;
    r->res->val_accuracy = r->prog.val_accuracy;
    r->res->outcome = TRAIN_DONE;
    return TRAIN_DONE;
}

train_outcome train_run(const job_config *j, pool *p, const kern_ops *k, uint32_t job_id, const train_hooks *h,
                        train_result *res)
{
    memset(res, 0, sizeof *res);
    run *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(res->message, sizeof res->message, "out of host memory");
        res->outcome = TRAIN_FAILED;
        return TRAIN_FAILED;
    }
    r->j = j;
    r->p = p;
    r->k = k;
    r->job = job_id;
    r->res = res;
    r->hooks = h;
    r->out.lock_fd = -1;
    dev *d = pool_device(p);
    r->host_visible = d->kind == DEV_KIND_CPU;
    /* Rank k of N trains the step's samples from batch·k/N on, the first
     * batch mod N ranks one more: rank order is the one process's order. */
    r->dist = h ? h->dist : NULL;
    uint32_t N = (uint32_t)dist_size(r->dist), rk = (uint32_t)dist_rank(r->dist);
    uint32_t base = j->batch / N, extra = j->batch % N;
    r->rank_batch = base + (extra ? 1 : 0);
    r->rank_samples = base + (rk < extra ? 1 : 0);
    r->rank_first = rk * base + (rk < extra ? rk : extra);
    r->writer = rk == 0;
    train_outcome o;
    char why[1024];
    /* A job from a Hugging Face directory comes with its [model] keys
     * filled from config.json: at submit and `gradd run` (model_check_job)
     * and when a restarted daemon reads its queue again (queue.c). */
    if (!(r->kind = model_kind_need(j, why, sizeof why))) {
        o = run_fail(r, "%s", why);
    } else if (j->batch < N) {
        o = run_fail(r, "%s: [train] batch = %u is smaller than the %u ranks: each needs a sample of every step",
                     j->source, j->batch, N);
    } else if (r->host_visible != (strcmp(k->name, "cpu") == 0)) {
        o = run_fail(r, "kernels '%s' cannot run on device %s", k->name, d->id);
    } else if (r->host_visible && j->precision != JOBCFG_FP32 && !(h && h->cpu_mixed_precision)) {
        o = run_fail(r, "%s: [train] precision: %s needs a CUDA device; use fp32 on %s", j->source,
                     j->precision == JOBCFG_BF16 ? "bf16" : "fp16", d->id);
    } else {
        kern_scratch scratch = memory_scratch(r);
        kern_precision prec = j->precision == JOBCFG_BF16   ? KERN_BF16
                              : j->precision == JOBCFG_FP16 ? KERN_FP16
                                                            : KERN_FP32;
        r->kc = k->ctx_create((int)j->threads, d->index, prec, &scratch);
        char err[1024];
        if (!r->kc)
            o = run_fail(r, "cannot create the %s kernel context on %s", k->name, d->id);
        else if (r->dist && !r->host_visible &&
                 dist_use_cuda(r->dist, d->collectives, d->index, k->stream(r->kc), err, sizeof err) != 0)
            o = run_fail(r, "%s", err);
        else if (setjmp(r->unwind) == 0)
            o = run_job(r, h);
        else
            o = TRAIN_FAILED; /* run_collective_failed */
        /* Left from inside a fit by a failed collective. */
        if (r->mem.fitting) {
            r->mem.fitting = false;
            pool_fit_end(r->p);
        }
    }
    /* The other ranks wait for this one: they fail now, not at their
     * timeout. */
    if (o == TRAIN_FAILED)
        dist_fail(r->dist, res->message);
    dist_release_cuda(r->dist, o == TRAIN_FAILED);
    o = outputs_close(r, o);
    if (r->m)
        memory_free(r);
    model_destroy(r->m);
    if (r->kc)
        k->ctx_destroy(r->kc);
    free_data(r);
    /* Last: the outputs are complete (or the run failed) before another
     * run may take the directory. */
    outputs_release(r);
    res->outcome = o;
    free(r->chosen);
    free(r);
    return o;
}
