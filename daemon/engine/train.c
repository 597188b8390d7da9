/* train.c — the training loop, its memory, checkpoints and outputs. */
#include "train.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "batch.h"
#include "io/data.h"
#include "pool/dev.h"
#include "fileio.h"
#include "models/model.h"
#include "io/safetensors.h"
#include "tboard.h"
#include "units.h"

#define RESUME_FORMAT "gradd-resume-1"

/* train_step's outcome when memory ran out inside the step (internal). */
#define STEP_OOM 3

/* ---- run state ---------------------------------------------------------------------- */

/* The training data and how a sample is laid out in memory. */
typedef struct {
    data_tokens tok_train, tok_val;
    data_images img_train, img_val;
    data_images img_val_view; /* a held-out tail of img_train (not owned) */
    const data_images *val_images;
    bool have_val;
    data_stream stream;
    data_eval eval;
    uint32_t input_dim, classes;
    size_t x_bytes, y_bytes; /* one sample's input and target */
} run_data;

/* Device memory, all from the pool, and what the batch controller is fed. */
typedef struct {
    float *params, *grads, *opt; /* opt = adam m then v, 2P floats */
    uint16_t *params16;          /* the model's needs_params16, else NULL */
    kern_segment *segs;          /* the model's tensors, for adamw_multi (host memory) */
    void *acts, *x, *y;
    size_t act_bytes;
    uint32_t micro;            /* what acts/x/y are sized for (0: nothing held) */
    size_t act_fixed, act_per; /* the model's activation estimate */
    size_t persistent;         /* params + grads + optimizer, as the pool holds them */
    void *x_host, *y_host;     /* staging when device memory is not host memory */
    size_t low_watermark;      /* the pool's: device memory kept free for others */
    bool oom;                  /* an allocation inside the step failed */
    pool_oom_report last_oom;  /* the first such failure's report */
} run_memory;

/* What the run that wrote the checkpoint found with micro_batch = auto
 * (fit 0: nothing), for choosing the first micro-batch. */
typedef struct {
    uint32_t fit, tuned;
    size_t budget;
    double fixed, per_sample;
    char device[96];
} run_found;

typedef struct {
    char path_resume[4096], path_model[4096];
    run_found found;
} run_checkpoints;

/* Where the training stands: what a checkpoint keeps besides the tensors. */
typedef struct {
    uint64_t step;
    /* Updates the optimizer applied: AdamW's t, for its bias correction
     * 1 - beta^t.  It is `step` less fp16's skipped steps, which consume
     * their data and count for the schedule, logging and checkpoint_every,
     * but leave the moments untouched, so counting them would correct
     * moments that hold fewer updates than t says (PyTorch's GradScaler
     * skips optimizer.step() on overflow alike). */
    uint64_t opt_steps;
    double loss_scale;
    uint64_t good_steps; /* fp16: steps since the loss scale last changed */
    double step_s;       /* the last step's forward, backward and optimizer time, for tuning */
} run_progress;

typedef struct {
    int lock_fd; /* out_dir/.lock, flock'd for the run; -1: none */
    FILE *metrics;
    tb_writer *tb;
    char path_metrics[4096];
    char err[1024]; /* the first failed metrics or TensorBoard write; "": none */
} run_outputs;

typedef struct {
    const job_config *j;
    pool *p;
    const kern_ops *k;
    kern_ctx *kc;
    uint32_t job;
    bool host_visible; /* device memory is host memory (the cpu backend) */
    model *m;

    run_data data;
    run_memory mem;
    batch_ctl ctl; /* the batch controller */
    run_progress progress;
    run_checkpoints ckpt;
    run_outputs out;

    train_progress prog; /* the report */
    train_result *res;
    const train_hooks *hooks;
} run;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static train_outcome fail(run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static train_outcome fail(run *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->res->message, sizeof r->res->message, fmt, ap);
    va_end(ap);
    r->res->outcome = TRAIN_FAILED;
    return TRAIN_FAILED;
}

/* Workspace for the kernels comes from the pool too, tagged as such. */
/* A NULL here is an OOM in the middle of a step: the kernels skip their
 * work (the CUDA backend also turns it into a sticky error that the next
 * sync returns), and the step notices r->mem.oom and is redone smaller. */
static void *scratch_acquire(void *user, size_t bytes)
{
    run *r = user;
    pool_oom_report oom;
    void *ptr = pool_alloc(r->p, bytes, POOL_TAG_WORKSPACE, r->job, &oom);
    if (!ptr && !r->mem.oom) {
        r->mem.oom = true;
        r->mem.last_oom = oom;
    }
    return ptr;
}

static void scratch_release(void *user, void *ptr)
{
    run *r = user;
    pool_free(r->p, ptr);
}

static void *alloc_tagged(run *r, size_t bytes, pool_tag tag, const char *what)
{
    pool_oom_report oom;
    void *ptr = pool_alloc(r->p, bytes ? bytes : 1, tag, r->job, &oom);
    if (ptr)
        return ptr;
    /* The state that lives as long as the job does not fit: say how much
     * it is, and what to change, as the micro-batch-1 report does. */
    size_t P = r->m->num_params, lasting = P * 4 * sizeof(float) + (r->m->needs_params16 ? P * sizeof(uint16_t) : 0);
    size_t act1 = 0, per = 0;
    r->m->ops->activation_bytes(r->m, &act1, &per);
    char need[16], act[16], sum[16];
    units_format_size(lasting, need, sizeof need);
    units_format_size(act1 + per, act, sizeof act);
    units_format_size(lasting + act1 + per, sum, sizeof sum);
    fail(r,
         "out of memory for the %s: %s; the parameters, gradients and optimizer state alone take %s, and "
         "micro-batch 1 about %s more: %s at least %s, or train a smaller model",
         what, oom.message, need, act, oom.job_limit_hit ? "raise [memory] limit to" : "the job needs free", sum);
    return NULL;
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

static train_outcome load_data(run *r)
{
    const job_config *j = r->j;
    char err[1024];
    if (j->model == JOBCFG_GPT) {
        data_format fmt = j->format == JOBCFG_DATA_TEXT     ? DATA_FMT_TEXT
                          : j->format == JOBCFG_DATA_TOKENS ? DATA_FMT_LLMC
                          : j->format == JOBCFG_DATA_NPY    ? DATA_FMT_NPY
                                                            : DATA_FMT_AUTO;
        if (data_tokens_load(&r->data.tok_train, j->train, fmt, j->vocab, err, sizeof err) != 0)
            return fail(r, "%s", err);
        if (j->val[0]) {
            if (data_tokens_load(&r->data.tok_val, j->val, fmt, j->vocab, err, sizeof err) != 0)
                return fail(r, "%s", err);
            r->data.have_val = true;
        } else if (j->val_fraction > 0) {
            if (data_tokens_split(&r->data.tok_train, &r->data.tok_val, j->val_fraction, err, sizeof err) != 0)
                return fail(r, "%s", err);
            r->data.have_val = true;
        }
        if (r->data.tok_train.n < (size_t)j->context + 1)
            return fail(r, "%s: %zu tokens is less than one window of context %u + 1", j->train,
                        r->data.tok_train.n, j->context);
        if (data_stream_tokens(&r->data.stream, &r->data.tok_train, j->context, j->seed, err, sizeof err) != 0)
            return fail(r, "%s", err);
        if (r->data.have_val && data_eval_tokens(&r->data.eval, &r->data.tok_val, j->context, err, sizeof err) != 0)
            return fail(r, "%s", err);
        r->data.x_bytes = r->data.y_bytes = (size_t)j->context * sizeof(int32_t);
        return TRAIN_DONE;
    }
    if (data_images_load(&r->data.img_train, j->train, j->train_labels, 0, j->subset, err, sizeof err) != 0)
        return fail(r, "%s", err);
    r->data.input_dim = (uint32_t)r->data.img_train.dim;
    r->data.classes = r->data.img_train.classes;
    if (j->val[0]) {
        if (data_images_load(&r->data.img_val, j->val, j->val_labels, r->data.classes, j->val_subset, err, sizeof err) != 0)
            return fail(r, "%s", err);
        if (r->data.img_val.dim != r->data.img_train.dim)
            return fail(r, "%s: images of %zu pixels, but the training images have %zu", j->val, r->data.img_val.dim,
                        r->data.img_train.dim);
        r->data.val_images = &r->data.img_val;
        r->data.have_val = true;
    } else if (j->val_fraction > 0) {
        /* Hold out the tail: a view into the training arrays, which then
         * stop short of it. */
        size_t nval = (size_t)((double)r->data.img_train.n * j->val_fraction);
        if (nval == 0 || nval >= r->data.img_train.n)
            return fail(r, "%s: val_fraction %.3f of %zu images leaves no validation or no training set", j->train,
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
    if (data_stream_images(&r->data.stream, &r->data.img_train, j->seed, err, sizeof err) != 0)
        return fail(r, "%s", err);
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
}

/* Stage n samples from the stream (or the eval set) into device memory. */
static size_t next_batch(run *r, size_t n, bool eval)
{
    void *x = r->host_visible ? r->mem.x : r->mem.x_host;
    void *y = r->host_visible ? r->mem.y : r->mem.y_host;
    size_t got = n;
    if (r->j->model == JOBCFG_GPT) {
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
    return got;
}

/* ---- memory ---------------------------------------------------------------------------- */

/* What the job holds at its peak: the pool's per-job peak since the last
 * pool_job_reset_peak. */
static size_t job_peak(run *r)
{
    pool_stats *ps = malloc(sizeof *ps);
    size_t peak = 0;
    if (!ps)
        return 0;
    pool_stats_read(r->p, ps);
    for (size_t i = 0; i < ps->njobs; i++)
        if (ps->jobs[i].job == r->job)
            peak = (size_t)ps->jobs[i].peak;
    free(ps);
    return peak;
}

/* The bytes this job may hold at its peak, now: its [memory] limit, and its
 * share of what the pool holds or can still get from the device.  The
 * device's free memory counts less the pool's low watermark, which is kept
 * for other processes; what the other jobs in the pool need (their peaks,
 * or more if they hold more now) is theirs.  reserved + device free does
 * not move when the pool trims or grows, only when another process takes
 * or returns memory, so the budget is steady while nothing else changes. */
static size_t job_budget(run *r, size_t *avail)
{
    pool_stats *ps = malloc(sizeof *ps);
    if (avail)
        *avail = SIZE_MAX;
    if (!ps)
        return r->j->mem_limit ? r->j->mem_limit : SIZE_MAX;
    pool_stats_read(r->p, ps);
    size_t room = (size_t)ps->reserved_bytes[POOL_ALL].current + ps->device_free;
    room = room > r->mem.low_watermark ? room - r->mem.low_watermark : 0;
    if (room > ps->cap)
        room = ps->cap;
    size_t others = 0;
    for (size_t i = 0; i < ps->njobs; i++) {
        if (ps->jobs[i].job == r->job)
            continue;
        /* Its need at the size it runs now where it said (a job's all-time
         * peak keeps its probes and tuning, which would hold the others at
         * what they found while it searched); else its peak. */
        int64_t need = ps->jobs[i].need ? (int64_t)ps->jobs[i].need : ps->jobs[i].peak;
        if (ps->jobs[i].current > need)
            need = ps->jobs[i].current;
        others += need > 0 ? (size_t)need : 0;
    }
    size_t b = room > others ? room - others : 0;
    /* Under the watermark even after pool_tick's pressure trim: the job
     * gives back the shortfall out of what it uses now — the "then shrink"
     * after "trim first".  (The sum above misses it when the pool's slack,
     * reserved memory no block can use, hides the shortfall.) */
    if (r->mem.low_watermark && ps->device_free < r->mem.low_watermark && r->mem.micro) {
        double need = batch_peak(&r->ctl, r->mem.micro), shortfall = (double)(r->mem.low_watermark - ps->device_free);
        size_t give = need > shortfall ? (size_t)(need - shortfall) : 0;
        if (give < b)
            b = give;
    }
    free(ps);
    if (avail)
        *avail = b;
    if (r->j->mem_limit && r->j->mem_limit < b)
        b = r->j->mem_limit;
    return b;
}

static void free_micro(run *r)
{
    pool_free(r->p, r->mem.y);
    pool_free(r->p, r->mem.x);
    pool_free(r->p, r->mem.acts);
    r->mem.y = r->mem.x = r->mem.acts = NULL;
    r->mem.micro = 0;
}

/* Size the per-micro-batch memory (activations, input and target buffers)
 * for n samples.  The old blocks go first so the new ones can reuse their
 * space.  trim >= 0 (a pool_trim_reason) gives cached memory back to the
 * device in between: when shrinking because memory is short, the smaller
 * block would otherwise be carved out of the old one's segment and keep all
 * of it reserved.  0, or -1 with r->mem.last_oom filled and nothing held. */
static int set_micro(run *r, uint32_t n, int trim)
{
    free_micro(r);
    if (trim >= 0)
        pool_trim(r->p, (pool_trim_reason)trim, 0);
    pool_oom_report oom;
    r->mem.act_bytes = r->mem.act_fixed + r->mem.act_per * n;
    r->mem.acts = pool_alloc(r->p, r->mem.act_bytes, POOL_TAG_ACTIVATIONS, r->job, &oom);
    if (r->mem.acts)
        r->mem.x = pool_alloc(r->p, n * r->data.x_bytes, POOL_TAG_DATA, r->job, &oom);
    if (r->mem.x)
        r->mem.y = pool_alloc(r->p, n * r->data.y_bytes, POOL_TAG_DATA, r->job, &oom);
    if (!r->mem.y) {
        free_micro(r);
        r->mem.last_oom = oom;
        return -1;
    }
    r->m->ops->bind_activations(r->m, r->mem.acts, n);
    /* What the other jobs' budgets leave for this one from now on. */
    double need = batch_peak(&r->ctl, n);
    pool_job_set_need(r->p, r->job, need > 0 ? (size_t)need : 0);
    if (!r->host_visible) {
        free(r->mem.x_host);
        free(r->mem.y_host);
        r->mem.x_host = malloc(n * r->data.x_bytes);
        r->mem.y_host = malloc(n * r->data.y_bytes);
    }
    r->mem.micro = n;
    return 0;
}

/* The state that lives as long as the job: parameters, gradients, Adam. */
static train_outcome alloc_memory(run *r)
{
    size_t P = r->m->num_params;
    r->mem.params = alloc_tagged(r, P * sizeof(float), POOL_TAG_PARAMS, "parameters");
    if (!r->mem.params)
        return TRAIN_FAILED;
    r->mem.grads = alloc_tagged(r, P * sizeof(float), POOL_TAG_GRADS, "gradients");
    if (!r->mem.grads)
        return TRAIN_FAILED;
    r->mem.opt = alloc_tagged(r, 2 * P * sizeof(float), POOL_TAG_OPTIMIZER, "optimizer state");
    if (!r->mem.opt)
        return TRAIN_FAILED;
    if (r->m->needs_params16) {
        r->mem.params16 = alloc_tagged(r, P * sizeof(uint16_t), POOL_TAG_PARAMS, "16-bit parameters");
        if (!r->mem.params16)
            return TRAIN_FAILED;
    }
    r->mem.segs = malloc((size_t)r->m->ntensors * sizeof *r->mem.segs);
    if (!r->mem.segs)
        return fail(r, "out of host memory for the optimizer's tensor list");
    for (int i = 0; i < r->m->ntensors; i++)
        r->mem.segs[i] = (kern_segment){r->m->tensors[i].offset, r->m->tensors[i].numel, r->m->tensors[i].decay};
    r->m->params = r->mem.params;
    r->m->params16 = r->mem.params16;
    r->m->grads = r->mem.grads;
    r->mem.persistent = pool_block_size(r->p, r->mem.params) + pool_block_size(r->p, r->mem.grads) +
                    pool_block_size(r->p, r->mem.opt) + pool_block_size(r->p, r->mem.params16);
    r->res->persistent_bytes = r->mem.persistent;

    size_t fixed, per;
    r->m->ops->activation_bytes(r->m, &fixed, &per);
    r->mem.act_fixed = r->res->act_fixed = fixed;
    r->mem.act_per = r->res->act_per_sample = per;
    return TRAIN_DONE;
}

/* params16 = params rounded (model.h), after anything but the optimizer
 * wrote params: initialisation and a checkpoint's load. */
static void refresh_params16(run *r)
{
    if (!r->mem.params16)
        return;
    size_t P = r->m->num_params;
    if (r->j->precision == JOBCFG_FP16)
        r->k->cast_f32_to_f16(r->kc, r->mem.params16, r->mem.params, P);
    else
        r->k->cast_f32_to_bf16(r->kc, r->mem.params16, r->mem.params, P);
}

static void free_memory(run *r)
{
    free_micro(r);
    void *bufs[] = {r->mem.opt, r->mem.grads, r->mem.params, r->mem.params16};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        pool_free(r->p, bufs[i]);
    free(r->mem.x_host);
    free(r->mem.y_host);
    free(r->mem.segs);
    r->mem.segs = NULL;
}

/* Host view of `count` floats of device memory: the memory itself on the
 * cpu backend, else a malloc'd copy (*owned set). */
static float *host_view(run *r, const float *dev_ptr, size_t count, float **owned)
{
    *owned = NULL;
    if (r->host_visible)
        return (float *)dev_ptr;
    *owned = malloc(count * sizeof(float));
    if (*owned)
        r->k->copy_d2h(r->kc, *owned, dev_ptr, count * sizeof(float));
    return *owned;
}

/* ---- checkpoints ----------------------------------------------------------------------- */

static const char *precision_name(int precision)
{
    return precision == JOBCFG_BF16 ? "bf16" : precision == JOBCFG_FP16 ? "fp16" : "fp32";
}

/* A string that changes whenever the parameter layout would. */
static void model_signature(const run *r, char *buf, size_t len)
{
    const job_config *j = r->j;
    if (j->model == JOBCFG_GPT)
        snprintf(buf, len, "gpt layers=%u heads=%u width=%u context=%u vocab=%u", j->layers, j->heads, j->width,
                 j->context, j->vocab);
    else {
        /* From the parsed sizes, not the text: "256, 128" is the same model
         * as "256,128" (which is what older checkpoints recorded). */
        char hidden[JOBCFG_MAX_HIDDEN * 12] = "";
        size_t at = 0;
        for (int i = 0; i < j->nhidden && at < sizeof hidden; i++)
            at += (size_t)snprintf(hidden + at, sizeof hidden - at, "%s%u", i ? "," : "", j->hidden[i]);
        snprintf(buf, len, "mlp inputs=%u hidden=%s classes=%u", r->data.input_dim, hidden, r->data.classes);
    }
}

/* The device a micro-batch was found on: its id and its name, so that
 * another card in the same slot counts as another device. */
static void device_signature(const run *r, char *buf, size_t len)
{
    const dev *d = pool_device(r->p);
    snprintf(buf, len, "%s %s", d->id, d->name);
}

static int write_resume(run *r, uint64_t epoch, uint64_t index, char *err, size_t err_len)
{
    size_t P = r->m->num_params;
    float *own_p, *own_o;
    const float *hp = host_view(r, r->mem.params, P, &own_p);
    const float *ho = host_view(r, r->mem.opt, 2 * P, &own_o);
    int rc = -1;
    st_writer *w = st_writer_new();
    if (!hp || !ho || !w) {
        snprintf(err, err_len, "%s: out of memory", r->ckpt.path_resume);
        goto out;
    }
    uint64_t shape[1] = {P};
    char sig[256], v[64];
    model_signature(r, sig, sizeof sig);
    st_writer_add(w, "params", ST_F32, 1, shape, hp, P * sizeof(float), err, err_len);
    st_writer_add(w, "adam_m", ST_F32, 1, shape, ho, P * sizeof(float), err, err_len);
    st_writer_add(w, "adam_v", ST_F32, 1, shape, ho + P, P * sizeof(float), err, err_len);
    st_writer_meta(w, "format", RESUME_FORMAT, err, err_len);
    st_writer_meta(w, "model", sig, err, err_len);
#define META(key, fmt, val) (snprintf(v, sizeof v, fmt, val), st_writer_meta(w, key, v, err, err_len))
    META("step", "%llu", (unsigned long long)r->progress.step);
    META("data_epoch", "%llu", (unsigned long long)epoch);
    META("data_index", "%llu", (unsigned long long)index);
    META("seed", "%llu", (unsigned long long)r->j->seed);
    /* With the seed, what the data position means: see check_data_meta. */
    META("epoch_size", "%llu", (unsigned long long)data_stream_epoch_size(&r->data.stream));
    META("batch", "%u", r->j->batch);
    META("optimizer_steps", "%llu", (unsigned long long)r->progress.opt_steps);
    /* The precision says whose loss scale this is: see load_loss_scale. */
    st_writer_meta(w, "precision", precision_name(r->j->precision), err, err_len);
    META("loss_scale", "%.17g", r->progress.loss_scale);
    META("loss_scale_good_steps", "%llu", (unsigned long long)r->progress.good_steps);
    META("micro", "%u", r->mem.micro);
    /* The results so far, so that a resumed run reports them until it has
     * its own, and one resumed at its last step reports them at all; the
     * time is the training's across runs. */
    META("loss", "%.17g", r->prog.loss);
    META("val_loss", "%.17g", r->prog.val_loss);
    META("val_accuracy", "%.17g", r->prog.val_accuracy);
    META("elapsed_s", "%.17g", r->prog.elapsed_s);
    /* What probing (and tuning) found, so that a resumed job need not
     * search again: see choose_micro. */
    const batch_ctl *c = &r->ctl;
    if (!r->j->micro_batch && c->probing_done) {
        char devsig[96];
        device_signature(r, devsig, sizeof devsig);
        META("micro_fit", "%u", c->max_fit);
        META("micro_tuned", "%u", c->tune == BATCH_TUNE_DONE ? c->best : 0);
        META("fit_budget", "%zu", c->fit_budget);
        META("fit_peak_fixed", "%.17g", c->fixed);
        META("fit_peak_per_sample", "%.17g", c->per_sample);
        st_writer_meta(w, "fit_device", devsig, err, err_len);
    }
#undef META
    if (r->hooks && r->hooks->on_checkpoint)
        r->hooks->on_checkpoint(r->hooks->user, w, r->progress.step);
    rc = st_write_atomic(w, r->ckpt.path_resume, err, err_len);
out:
    st_writer_free(w);
    free(own_p);
    free(own_o);
    return rc;
}

static uint64_t meta_u64(const st_file *f, const char *key, bool *ok)
{
    const char *s = st_meta(f, key);
    char *end;
    /* strtoull would take "-1" as 2^64-1. */
    if (!s || !isdigit((unsigned char)*s)) {
        *ok = false;
        return 0;
    }
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || errno)
        *ok = false;
    return v;
}

/* A number write_resume stored with %.17g: finite, or nan where there was
 * none yet (no validation).  Missing (older checkpoints) or malformed: nan. */
static double meta_f64(const st_file *f, const char *key)
{
    const char *s = st_meta(f, key);
    char *end;
    double v = s && *s ? strtod(s, &end) : NAN;
    return s && *s && !*end && !isinf(v) ? v : NAN;
}

/* The micro-batch an earlier run found (write_resume), into r->ckpt.found; any
 * key missing or malformed (older checkpoints, fixed micro-batches) leaves
 * nothing found, and the job probes as a new one. */
static void load_found(run *r, const st_file *f)
{
    bool ok = true;
    uint64_t fit = meta_u64(f, "micro_fit", &ok), tuned = meta_u64(f, "micro_tuned", &ok),
             budget = meta_u64(f, "fit_budget", &ok);
    const char *fixed = st_meta(f, "fit_peak_fixed"), *per = st_meta(f, "fit_peak_per_sample"),
               *devsig = st_meta(f, "fit_device");
    memset(&r->ckpt.found, 0, sizeof r->ckpt.found);
    if (!ok || !fixed || !per || !devsig || fit == 0 || fit > UINT32_MAX || tuned > fit)
        return;
    r->ckpt.found.fit = (uint32_t)fit;
    r->ckpt.found.tuned = (uint32_t)tuned;
    r->ckpt.found.budget = (size_t)budget;
    r->ckpt.found.fixed = strtod(fixed, NULL);
    r->ckpt.found.per_sample = strtod(per, NULL);
    snprintf(r->ckpt.found.device, sizeof r->ckpt.found.device, "%s", devsig);
}

/* The loss scale to resume with.  Only an fp16 run's scale means anything
 * to an fp16 job: another precision's checkpoint stores 1 (no scaling), and
 * starting there would leave small gradients to underflow in fp16 while the
 * scale climbs back one doubling per TRAIN_LOSS_SCALE_GROW_EVERY steps, so
 * an fp16 job resumed from it starts at the initial scale, as a new one
 * does.  Checkpoints written before "precision" was recorded: a scale of 1
 * (or none) is taken as not fp16; an fp16 run gets to 1 only after 16
 * overflows in a row, and starting it high again costs at most 16 skipped
 * steps.  Other precisions do not scale. */
static void load_loss_scale(run *r, const st_file *f)
{
    r->progress.loss_scale = 1.0;
    r->progress.good_steps = 0;
    if (r->j->precision != JOBCFG_FP16)
        return;
    const char *prec = st_meta(f, "precision"), *ls = st_meta(f, "loss_scale"),
               *gs = st_meta(f, "loss_scale_good_steps");
    double scale = ls ? strtod(ls, NULL) : 1.0;
    bool was_fp16 = prec ? strcmp(prec, "fp16") == 0 : scale > 1.0;
    /* A scale outside the schedule's range is no scale to train with. */
    if (!was_fp16 || !(scale >= 1.0 && scale <= TRAIN_LOSS_SCALE_MAX)) {
        r->progress.loss_scale = TRAIN_LOSS_SCALE_INIT;
        return;
    }
    r->progress.loss_scale = scale;
    /* Older checkpoints lack it: the doubling clock restarts. */
    r->progress.good_steps = gs ? strtoull(gs, NULL, 10) : 0;
}

/* The data position counts samples of an order that the seed shuffles over
 * an epoch of epoch_size samples: under another seed, or over other data,
 * it would point into another sequence and the run would follow neither.
 * Checkpoints written before epoch_size was recorded lack it. */
static bool same_data_order(run *r, const st_file *f)
{
    bool ok = true;
    uint64_t seed = st_meta(f, "seed") ? meta_u64(f, "seed", &ok) : r->j->seed;
    uint64_t size = data_stream_epoch_size(&r->data.stream);
    uint64_t was = st_meta(f, "epoch_size") ? meta_u64(f, "epoch_size", &ok) : size;
    if (!ok)
        fail(r, "cannot resume: %s: bad seed or epoch_size metadata", r->ckpt.path_resume);
    else if (seed != r->j->seed)
        fail(r, "cannot resume: %s was written with [train] seed %llu but the job has %llu; use another [output] dir",
             r->ckpt.path_resume, (unsigned long long)seed, (unsigned long long)r->j->seed);
    else if (was != size)
        fail(r,
             "cannot resume: %s was written over %llu training samples per epoch, but [data] now gives %llu (the "
             "data changed); use another [output] dir",
             r->ckpt.path_resume, (unsigned long long)was, (unsigned long long)size);
    return ok && seed == r->j->seed && was == size;
}

/* A checkpoint's tensors are not checksummed: a NaN or a negative second
 * moment would otherwise surface steps later as a diverged loss. */
static bool finite_state(run *r, const char *name, const float *x, size_t n)
{
    bool nonneg = strcmp(name, "adam_v") == 0;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]) || (nonneg && x[i] < 0)) {
            fail(r, "cannot resume: %s: tensor %s holds %g at index %zu", r->ckpt.path_resume, name, (double)x[i], i);
            return false;
        }
    return true;
}

/* Whether path exists, asked with the thread's filesystem identity (the
 * job's owner): access(2) asks with the real uid, the daemon's, which may
 * not even search the owner's private directories, so a service-user gradd
 * took a checkpoint it could not see for none and started the job over. */
static bool exists_as_owner(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Load out_dir/resume.safetensors if present.  Returns 1 when resumed, 0
 * when there is none, -1 (with res->message) when it is unusable. */
static int load_resume(run *r)
{
    if (!exists_as_owner(r->ckpt.path_resume))
        return 0;
    char err[1024];
    st_file *f;
    if (st_open(r->ckpt.path_resume, &f, err, sizeof err) != 0) {
        fail(r, "cannot resume: %s", err);
        return -1;
    }
    int rc = -1;
    size_t P = r->m->num_params;
    char sig[256];
    model_signature(r, sig, sizeof sig);
    const char *fmt = st_meta(f, "format"), *msig = st_meta(f, "model");
    bool ok = true;
    uint64_t step = meta_u64(f, "step", &ok), epoch = meta_u64(f, "data_epoch", &ok),
             index = meta_u64(f, "data_index", &ok), batch = meta_u64(f, "batch", &ok);
    /* Checkpoints from before skipped fp16 steps were left out of AdamW's
     * count lack it; their optimizer took t = step, so that is the count to
     * go on from (exact for fp32 and bf16, which skip nothing). */
    uint64_t opt_steps = st_meta(f, "optimizer_steps") ? meta_u64(f, "optimizer_steps", &ok) : step;
    uint64_t shape[1] = {P};
    if (!fmt || strcmp(fmt, RESUME_FORMAT) != 0) {
        fail(r, "cannot resume: %s: metadata format is '%s', expected '%s'", r->ckpt.path_resume, fmt ? fmt : "(none)",
             RESUME_FORMAT);
    } else if (!msig || strcmp(msig, sig) != 0) {
        fail(r, "cannot resume: %s was written for '%s' but the job is '%s'; use another [output] dir",
             r->ckpt.path_resume, msig ? msig : "(none)", sig);
    } else if (!ok || batch != r->j->batch || step > r->j->steps || opt_steps > step) {
        fail(r,
             "cannot resume: %s: bad or mismatching step/data/batch metadata (step %llu of %llu, optimizer_steps "
             "%llu, batch %llu vs %u)",
             r->ckpt.path_resume, (unsigned long long)step, (unsigned long long)r->j->steps,
             (unsigned long long)opt_steps, (unsigned long long)batch, r->j->batch);
    } else if (!same_data_order(r, f)) {
        /* failed */
    } else if (!st_expect(f, "params", ST_F32, 1, shape, err, sizeof err) ||
               !st_expect(f, "adam_m", ST_F32, 1, shape, err, sizeof err) ||
               !st_expect(f, "adam_v", ST_F32, 1, shape, err, sizeof err)) {
        fail(r, "cannot resume: %s", err);
    } else {
        float *stage = r->host_visible ? NULL : malloc(P * sizeof(float));
        float *dst[3] = {r->mem.params, r->mem.opt, r->mem.opt + P};
        const char *names[3] = {"params", "adam_m", "adam_v"};
        rc = 0;
        for (int i = 0; i < 3 && rc == 0; i++) {
            float *into = r->host_visible ? dst[i] : stage;
            if (!into || st_read(f, names[i], into, P * sizeof(float), err, sizeof err) != 0) {
                fail(r, "cannot resume: %s", into ? err : "out of host memory");
                rc = -1;
            } else if (!finite_state(r, names[i], into, P)) {
                rc = -1;
            } else if (!r->host_visible) {
                r->k->copy_h2d(r->kc, dst[i], stage, P * sizeof(float));
            }
        }
        free(stage);
        if (rc == 0 && data_stream_set_state(&r->data.stream, epoch, index, err, sizeof err) != 0) {
            fail(r, "cannot resume: %s: %s", r->ckpt.path_resume, err);
            rc = -1;
        }
        if (rc == 0) {
            r->progress.step = step;
            r->progress.opt_steps = opt_steps;
            load_loss_scale(r, f);
            load_found(r, f);
            r->prog.step = step;
            r->prog.loss = meta_f64(f, "loss");
            r->prog.val_loss = meta_f64(f, "val_loss");
            r->prog.val_accuracy = meta_f64(f, "val_accuracy");
            double el = meta_f64(f, "elapsed_s");
            r->prog.elapsed_s = el >= 0 ? el : 0;
            r->res->final_loss = r->prog.loss;
            rc = 1;
        }
    }
    st_close(f);
    return rc;
}

/* model.safetensors: named tensors as the Python ecosystem expects them
 * (GPT-2's Conv1D matrices are (in,out), so those are transposed). */
static int export_model(run *r, char *err, size_t err_len)
{
    float *own;
    const float *hp = host_view(r, r->mem.params, r->m->num_params, &own);
    st_writer *w = st_writer_new();
    float **tmp = calloc((size_t)r->m->ntensors, sizeof *tmp);
    int rc = -1;
    if (!hp || !w || !tmp) {
        snprintf(err, err_len, "%s: out of memory", r->ckpt.path_model);
        goto out;
    }
    for (int i = 0; i < r->m->ntensors; i++) {
        const model_tensor *t = &r->m->tensors[i];
        uint64_t shape[MODEL_MAX_DIMS];
        const float *src = hp + t->offset;
        for (int d = 0; d < t->ndim; d++)
            shape[d] = t->shape[d];
        if (t->transpose_export && t->ndim == 2) {
            size_t rows = t->shape[0], cols = t->shape[1];
            tmp[i] = malloc(t->numel * sizeof(float));
            if (!tmp[i]) {
                snprintf(err, err_len, "%s: out of memory", r->ckpt.path_model);
                goto out;
            }
            for (size_t a = 0; a < rows; a++)
                for (size_t b = 0; b < cols; b++)
                    tmp[i][b * rows + a] = src[a * cols + b];
            shape[0] = cols;
            shape[1] = rows;
            src = tmp[i];
        }
        st_writer_add(w, t->name, ST_F32, t->ndim, shape, src, t->numel * sizeof(float), err, err_len);
    }
    char sig[256], v[32];
    model_signature(r, sig, sizeof sig);
    st_writer_meta(w, "format", "pt", err, err_len);
    st_writer_meta(w, "gradd_model", sig, err, err_len);
    snprintf(v, sizeof v, "%llu", (unsigned long long)r->progress.step);
    st_writer_meta(w, "step", v, err, err_len);
    rc = st_write_atomic(w, r->ckpt.path_model, err, err_len);
out:
    if (tmp)
        for (int i = 0; i < r->m->ntensors; i++)
            free(tmp[i]);
    free(tmp);
    st_writer_free(w);
    free(own);
    return rc;
}

/* ---- metrics ------------------------------------------------------------------------------ */

/* On resume keep the lines of steps the checkpoint covers and drop the
 * rest: they belong to work that is about to be redone, and so does a last
 * line cut short by a crash or a full disk.  The copy replaces the file
 * only when all of it was written: 0, or -1 with err (the file as it was). */
static int trim_metrics(const char *path, uint64_t upto, char *err, size_t err_len)
{
    FILE *in = fopen(path, "r");
    if (!in)
        return 0; /* none yet: nothing to keep */
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *out = fopen(tmp, "w");
    if (!out) {
        snprintf(err, err_len, "cannot trim %s (for the resumed run): %s: %s", path, tmp, strerror(errno));
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

/* v as a JSON number, or null: JSON has neither inf nor nan, and a skipped
 * fp16 step's gradient norm is infinite (its loss may be too). */
static const char *json_num(char *buf, size_t len, double v)
{
    if (isfinite(v))
        snprintf(buf, len, "%.9g", v);
    else
        snprintf(buf, len, "null");
    return buf;
}

/* skipped: an fp16 step whose gradients overflowed, not applied. */
/* A metrics or TensorBoard write failed (a full disk, say): the run stops
 * at the step's end, before any checkpoint, naming the file, rather than
 * finishing "done" with its logs cut short.  The first failure is kept. */
static void output_failed(run *r, const char *why)
{
    if (!r->out.err[0])
        snprintf(r->out.err, sizeof r->out.err, "%s", why);
}

static void metrics_written(run *r)
{
    if (fflush(r->out.metrics) != 0 || ferror(r->out.metrics)) {
        char why[4200];
        snprintf(why, sizeof why, "cannot write %s: %s", r->out.path_metrics, strerror(errno));
        output_failed(r, why);
    }
}

static void log_step(run *r, double loss, double lr, double norm, double ups, double dt, bool skipped)
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
    /* Here, not only in sync_progress: the last step has no step boundary
     * after it, and its overflow or doubling is still news. */
    pr->loss_scale = r->progress.loss_scale;
    if (r->out.metrics && (r->progress.step % r->j->log_every == 0 || r->progress.step == r->j->steps)) {
        /* fp16 adds the scale after the step (what the next one runs with,
         * as the progress report and the checkpoint have it) and marks a
         * skipped step; other precisions have no scale to show. */
        char fp16[64] = "", l[32], g[32];
        if (r->j->precision == JOBCFG_FP16)
            snprintf(fp16, sizeof fp16, ",\"loss_scale\":%.17g%s", r->progress.loss_scale, skipped ? ",\"skipped\":true" : "");
        fprintf(r->out.metrics,
                "{\"step\":%llu,\"loss\":%s,\"lr\":%.9g,\"grad_norm\":%s,\"%s\":%.6g,\"step_ms\":%.3f,"
                "\"micro\":%u,\"accum\":%u,\"allocated\":%zu,\"reserved\":%zu%s}\n",
                (unsigned long long)r->progress.step, json_num(l, sizeof l, loss), lr, json_num(g, sizeof g, norm),
                r->j->model == JOBCFG_GPT ? "tokens_per_s" : "samples_per_s", ups, dt * 1e3, pr->micro, pr->accum,
                pr->allocated, pr->reserved, fp16);
        metrics_written(r);
    }
    if (r->out.tb) {
        /* fp16 adds the loss scale, as metrics.jsonl does. */
        const char *tags[] = {"train/loss", "train/lr", "train/grad_norm", "train/loss_scale"};
        const float vals[] = {(float)loss, (float)lr, (float)norm, (float)r->progress.loss_scale};
        /* To the kernel at every logged step, as metrics.jsonl: a live
         * tensorboard sees it, and a kill -9 loses nothing logged before
         * the checkpoint a resume starts after. */
        if (tb_scalars(r->out.tb, (int64_t)r->progress.step, wall_s(), r->j->precision == JOBCFG_FP16 ? 4 : 3, tags, vals) != 0 ||
            tb_flush(r->out.tb) != 0)
            output_failed(r, tb_error(r->out.tb));
    }
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
 * short (nothing reported). */
static bool evaluate(run *r)
{
    if (!r->data.have_val)
        return false;
    data_eval_reset(&r->data.eval);
    double loss = 0;
    uint64_t units = 0, correct = 0, samples = 0;
    uint32_t upb = r->m->ops->units_per_sample(r->m);
    /* eval_batches counts effective batches, run in micro-batches: the set
     * is the same whatever the micro-batch (which tuning chooses by speed),
     * so validation losses compare across runs and across size changes. */
    uint64_t want = r->j->eval_batches ? (uint64_t)r->j->eval_batches * r->j->batch : UINT64_MAX;
    while (samples < want) {
        size_t n = next_batch(r, want - samples < r->mem.micro ? (uint32_t)(want - samples) : r->mem.micro, true);
        if (n == 0)
            break;
        model_batch mb = {r->mem.x, r->mem.y, (uint32_t)n};
        uint64_t c = 0;
        r->m->stoppable = true;
        loss += r->m->ops->forward(r->m, &mb, r->j->model == JOBCFG_MLP ? &c : NULL);
        if (cut_short(r->m))
            return true;
        correct += c;
        units += n * upb;
        samples += n;
    }
    if (!units)
        return false;
    r->prog.val_loss = loss / (double)units;
    r->prog.val_accuracy = r->j->model == JOBCFG_MLP ? (double)correct / (double)samples : NAN;
    if (r->out.metrics) {
        if (r->j->model == JOBCFG_MLP)
            fprintf(r->out.metrics, "{\"step\":%llu,\"val_loss\":%.9g,\"val_accuracy\":%.6f,\"val_samples\":%llu}\n",
                    (unsigned long long)r->progress.step, r->prog.val_loss, r->prog.val_accuracy, (unsigned long long)samples);
        else
            fprintf(r->out.metrics, "{\"step\":%llu,\"val_loss\":%.9g,\"val_tokens\":%llu}\n", (unsigned long long)r->progress.step,
                    r->prog.val_loss, (unsigned long long)units);
        metrics_written(r);
    }
    if (r->out.tb) {
        if (tb_scalar(r->out.tb, "val/loss", (int64_t)r->progress.step, (float)r->prog.val_loss, wall_s()) != 0 ||
            (r->j->model == JOBCFG_MLP &&
             tb_scalar(r->out.tb, "val/accuracy", (int64_t)r->progress.step, (float)r->prog.val_accuracy, wall_s()) != 0))
            output_failed(r, tb_error(r->out.tb));
    }
    return false;
}

/* ---- the batch controller at work -------------------------------------------------- */

/* Publish the controller's state in the progress report. */
static void sync_progress(run *r)
{
    const batch_ctl *c = &r->ctl;
    train_progress *pr = &r->prog;
    pr->micro = r->mem.micro ? r->mem.micro : c->micro;
    pr->accum = batch_accum(r->j->batch, pr->micro);
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
static void note_change(run *r)
{
    const batch_change *ch = &r->ctl.last;
    sync_progress(r);
    if (r->out.metrics) {
        fprintf(r->out.metrics,
                "{\"step\":%llu,\"event\":\"batch_change\",\"from\":%u,\"to\":%u,\"reason\":\"%s\",\"accum\":%u,"
                "\"predicted_max\":%u,\"fit_max\":%u,\"oom_recoveries\":%llu}\n",
                (unsigned long long)ch->step, ch->from, ch->to, batch_reason_name(ch->reason),
                batch_accum(r->j->batch, ch->to), r->ctl.predicted_max, r->ctl.max_fit,
                (unsigned long long)r->ctl.oom_recoveries);
        metrics_written(r);
    }
    char note[24];
    snprintf(note, sizeof note, "%u>%u %s", ch->from, ch->to, batch_reason_name(ch->reason));
    pool_timeline_mark(r->p, POOL_EV_BATCH_CHANGE, r->job, r->mem.act_bytes, note);
}

/* Micro-batch 1 does not fit: fail with what a person needs to act. */
static train_outcome fail_no_fit(run *r, const pool_oom_report *oom)
{
    pool_stats *ps = malloc(sizeof *ps);
    char used[512] = "", a[16], b[16], need_s[16], lim[16];
    size_t held = 0;
    if (ps) {
        pool_stats_read(r->p, ps);
        size_t off = 0;
        for (size_t i = 0; i < ps->njobs; i++) {
            if (ps->jobs[i].job != r->job)
                continue;
            held = (size_t)ps->jobs[i].current;
            for (int t = 0; t < POOL_TAG_COUNT && off < sizeof used; t++)
                if (ps->jobs[i].tag_current[t] > 0)
                    off += (size_t)snprintf(used + off, sizeof used - off, "%s%s %s", off ? ", " : "",
                                            pool_tag_name((pool_tag)t),
                                            units_format_size((uint64_t)ps->jobs[i].tag_current[t], a, sizeof a));
        }
        free(ps);
    }
    /* What micro-batch 1 needs: the fitted peak, and at least what was held
     * plus what was asked for when it failed. */
    double model_need = batch_peak(&r->ctl, 1);
    size_t need = held + oom->requested;
    if (model_need > (double)need)
        need = (size_t)model_need;
    units_format_size(need, need_s, sizeof need_s);
    char fix[400];
    if (oom->job_limit_hit || (r->j->mem_limit && need > r->j->mem_limit))
        snprintf(fix, sizeof fix, "raise [memory] limit from %s to at least %s, or train a smaller model",
                 units_format_size(oom->job_limit_hit ? oom->job_limit : r->j->mem_limit, lim, sizeof lim),
                 need_s);
    else
        snprintf(fix, sizeof fix,
                 "free memory on %s (other processes or jobs hold it; the job needs about %s), run it on "
                 "another device ([job] device), or train a smaller model ([model] width, layers or context)",
                 pool_device(r->p)->id, need_s);
    char ck[160];
    if (exists_as_owner(r->ckpt.path_resume))
        snprintf(ck, sizeof ck, "the last checkpoint in %s is kept; resubmit to resume from it", r->j->out_dir);
    else
        snprintf(ck, sizeof ck, "no checkpoint was written yet ([output] checkpoint_every)");
    return fail(r,
                "out of memory at micro-batch 1 in step %llu: requested %s (%s); in use by the job: %s; "
                "device free %s of %s.\nTo fix: %s.\n%s.\nPool: %s",
                (unsigned long long)r->progress.step + 1, units_format_size(oom->requested, a, sizeof a),
                pool_tag_name(oom->tag), used[0] ? used : "nothing", units_format_size(oom->device_free, b, sizeof b),
                units_format_size(oom->device_total, lim, sizeof lim), fix, ck, oom->message);
}

/* After an OOM: shrink until the per-micro-batch memory fits again. */
static train_outcome shrink_after_oom(run *r)
{
    pool_oom_report rep = r->mem.last_oom;
    for (;;) {
        size_t avail, bud = job_budget(r, &avail);
        uint32_t n = batch_on_oom(&r->ctl, r->progress.step, bud, avail, rep.job_allocated + rep.requested);
        if (n == 0)
            return fail_no_fit(r, &rep);
        int rc = set_micro(r, n, POOL_TRIM_OOM);
        note_change(r);
        if (rc == 0)
            return TRAIN_DONE;
        rep = r->mem.last_oom;
    }
}

/* A micro-batch's forward and backward, in one call where the model has
 * one (it may fuse across the two); Σ of its losses.  An allocation that
 * fails on the way sets r->mem.oom (the step is then redone smaller). */
static double forward_backward(run *r, const model_batch *mb, float dloss)
{
    model *m = r->m;
    if (m->ops->forward_backward)
        return m->ops->forward_backward(m, mb, dloss);
    double loss = m->ops->forward(m, mb, NULL);
    if (!r->mem.oom)
        m->ops->backward(m, mb, dloss);
    return loss;
}

/* Wait for the queued device work: 0; 1 when it ran out of memory (r->mem.oom
 * then set, with a report); -1 when the device failed otherwise (the run
 * failed, with the kernels' message).  A faulting kernel or a GEMM without
 * an algorithm is not cured by a smaller micro-batch: treated as an OOM it
 * would shrink down to 1 and end as "does not fit". */
static int device_check(run *r, const char *during)
{
    int e = r->k->sync(r->kc);
    if (e == KERN_ERR_DEVICE) {
        fail(r, "the device failed %s: %s", during, r->k->error(r->kc));
        return -1;
    }
    if (e == KERN_ERR_OOM && !r->mem.oom) {
        /* Memory the pool did not hand out (a library's own). */
        r->mem.oom = true;
        memset(&r->mem.last_oom, 0, sizeof r->mem.last_oom);
        r->mem.last_oom.job = r->job;
        r->mem.last_oom.job_allocated = job_peak(r);
        snprintf(r->mem.last_oom.message, sizeof r->mem.last_oom.message, "the device ran out of memory outside the pool: %s",
                 r->k->error(r->kc));
    }
    return r->mem.oom ? 1 : 0;
}

/* One probe: a forward and backward of n real samples at micro-batch n,
 * measuring the job's pool peak.  Nothing of it survives: the gradients are
 * zeroed and the data position is put back.  0 with *peak, 1 when it ran
 * out of memory (*peak then what the job held plus what it asked for, which
 * the peak at n exceeds), -1 on another failure (message set). */
static int probe(run *r, uint32_t n, size_t *peak)
{
    if (set_micro(r, n, -1) != 0) {
        *peak = r->mem.last_oom.job_allocated + r->mem.last_oom.requested;
        return 1;
    }
    uint64_t epoch, index;
    data_stream_state(&r->data.stream, &epoch, &index);
    pool_job_reset_peak(r->p, r->job);
    r->mem.oom = false;
    next_batch(r, n, false);
    model_batch mb = {r->mem.x, r->mem.y, n};
    forward_backward(r, &mb, 1.0f / (float)(n * r->m->ops->units_per_sample(r->m)));
    if (device_check(r, "while measuring a micro-batch's memory") < 0)
        return -1;
    *peak = job_peak(r);
    r->k->zero(r->kc, r->mem.grads, r->m->num_params);
    char err[512];
    if (data_stream_set_state(&r->data.stream, epoch, index, err, sizeof err) != 0) {
        fail(r, "%s", err);
        return -1;
    }
    bool oom = r->mem.oom;
    r->mem.oom = false;
    if (oom)
        *peak = r->mem.last_oom.job_allocated + r->mem.last_oom.requested;
    return oom ? 1 : 0;
}

/* Does what the checkpoint's run found (r->ckpt.found) still apply?  Only on the
 * same device and under the same budget (within 2%, the controller's
 * tolerance for "nothing changed"): a changed [memory] limit, a device with
 * more or less memory, or other jobs holding more or less of it all change
 * what fits, and a new search costs a few probes. */
static bool found_still_holds(run *r, size_t budget)
{
    char devsig[96];
    device_signature(r, devsig, sizeof devsig);
    double was = (double)r->ckpt.found.budget, now = (double)budget;
    return r->ckpt.found.fit && strcmp(r->ckpt.found.device, devsig) == 0 && now >= 0.98 * was && now <= 1.02 * was;
}

/* Choose the first micro-batch: the configured one; by probing; or, when
 * resuming, the size the checkpoint's run had found, verified by one probe.
 * Then allocate for it (shrinking if even that does not fit). */
static train_outcome choose_micro_fitting(run *r)
{
    const job_config *j = r->j;
    batch_ctl *c = &r->ctl;
    batch_init(c, j->batch, j->micro_batch ? j->micro_batch : j->batch, j->margin, j->grow_after);
    batch_set_tune(c, j->tune && !j->micro_batch);
    /* The prior: the estimate, plus the input buffers, as the pool rounds. */
    batch_prior(c, r->mem.persistent + r->mem.act_fixed + 2 * 512, r->mem.act_per + r->data.x_bytes + r->data.y_bytes);
    batch_min_per_sample(c, r->mem.act_per + r->data.x_bytes + r->data.y_bytes);
    size_t budget = job_budget(r, &c->fit_avail);
    if (j->micro_batch) {
        batch_probe_skip(c, budget);
    } else {
        if (found_still_holds(r, budget))
            batch_resume(c, r->ckpt.found.fit, r->ckpt.found.tuned, r->ckpt.found.fixed, r->ckpt.found.per_sample);
        for (uint32_t n; (n = batch_probe_next(c, budget)) != 0;) {
            size_t peak = 0;
            int rc = probe(r, n, &peak);
            if (rc < 0)
                return TRAIN_FAILED;
            batch_probe_result(c, n, peak, rc == 0, budget);
        }
    }
    c->predicted_max = batch_max_for(c, (double)budget * (1.0 - c->margin));
    /* The fit is made before this run's first step: after the resumed
     * one, not before step 1. */
    if (c->changes)
        c->last.step = r->progress.step;
    /* Said before it is applied: should the size then not fit, the OOM
     * that shrinks it is the next change, not a replacement of this one. */
    r->mem.act_bytes = r->mem.act_fixed + r->mem.act_per * c->micro;
    if (!j->micro_batch)
        note_change(r);
    if (set_micro(r, c->micro, -1) != 0 && shrink_after_oom(r) != TRAIN_DONE)
        return TRAIN_FAILED;
    sync_progress(r);
    return TRAIN_DONE;
}

static train_outcome choose_micro(run *r)
{
    pool_fit_begin(r->p);
    train_outcome o = choose_micro_fitting(r);
    pool_fit_end(r->p);
    return o;
}

/* At a step boundary: shrink before an OOM, grow back, or tune. */
static train_outcome adapt(run *r)
{
    batch_reason why;
    uint32_t from = r->mem.micro;
    size_t avail, bud = job_budget(r, &avail);
    uint32_t n = batch_step_end(&r->ctl, r->progress.step, bud, avail, r->progress.step_s, &why);
    if (n == from) {
        /* The tuner's choice is an event even when it keeps the size. */
        if (why != BATCH_REASON_NONE)
            note_change(r);
        else
            sync_progress(r);
        return TRAIN_DONE;
    }
    if (set_micro(r, n, why == BATCH_REASON_PRESSURE ? POOL_TRIM_PRESSURE : -1) == 0) {
        note_change(r);
        return TRAIN_DONE;
    }
    /* The memory went elsewhere between the decision and the allocation:
     * stay where we were, or shrink as after an OOM. */
    batch_apply_failed(&r->ctl, n, from);
    if (set_micro(r, from, POOL_TRIM_OOM) == 0) {
        sync_progress(r);
        return TRAIN_DONE;
    }
    return shrink_after_oom(r);
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
    return fail(r, "the training loss became %s at step %llu%s; lower [train] lr (now %g), raise [train] warmup "
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
    double units = (double)j->batch * upb;
    /* The scale these gradients carry, whatever the schedule does below. */
    const double ls = r->progress.loss_scale;
    float dloss = (float)(ls / units);

    r->mem.oom = false;
    k->zero(r->kc, r->mem.grads, m->num_params);
    double loss_sum = 0;
    uint32_t accum = 0;
    for (uint32_t done = 0; done < j->batch;) {
        if (h && h->should_stop && h->should_stop(h->user))
            return TRAIN_STOPPED;
        uint32_t n = j->batch - done < r->mem.micro ? j->batch - done : r->mem.micro;
        next_batch(r, n, false);
        model_batch mb = {r->mem.x, r->mem.y, n};
        m->stoppable = true;
        loss_sum += forward_backward(r, &mb, dloss);
        if (cut_short(m))
            return TRAIN_STOPPED;
        if (r->mem.oom)
            return STEP_OOM;
        done += n;
        accum++;
    }
    /* Queued device work may still fail for memory (CUDA's sticky error). */
    char during[64];
    snprintf(during, sizeof during, "in step %llu", (unsigned long long)r->progress.step + 1);
    int dc = device_check(r, during);
    if (dc != 0)
        return dc > 0 ? STEP_OOM : TRAIN_FAILED;
    double loss = loss_sum / units;
    /* The split this attempt ran, for the step's report, skipped or not. */
    r->prog.micro = r->mem.micro;
    r->prog.accum = accum;
    if (!isfinite(loss) && j->precision != JOBCFG_FP16)
        return diverged(r, loss);

    double sumsq = 0;
    k->sumsq(r->kc, &sumsq, r->mem.grads, m->num_params);
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
            log_step(r, loss, lr, norm, units / (dt > 0 ? dt : 1e-9), dt, true);
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
    size_t P = m->num_params;
    k->adamw_multi(r->kc, r->mem.params, r->mem.params16, r->mem.grads, r->mem.opt, r->mem.opt + P, r->mem.segs, m->ntensors, (float)lr,
                   (float)j->beta1, (float)j->beta2, (float)j->eps, (float)j->weight_decay, (float)scale,
                   (int)(r->progress.opt_steps + 1));
    /* Nothing here allocates: any failure is the device's. */
    if (k->sync(r->kc) != KERN_OK)
        return fail(r, "the device failed in step %llu's optimizer update: %s", (unsigned long long)r->progress.step + 1,
                    k->error(r->kc));
    r->progress.opt_steps++;
    r->progress.step++;
    double dt = now_s() - t0;
    r->progress.step_s = dt;
    log_step(r, loss, lr, norm, units / (dt > 0 ? dt : 1e-9), dt, false);
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
            return fail(r, "%s", err);
        train_outcome s = shrink_after_oom(r);
        /* What the OOM cost: the work thrown away and the re-allocation;
         * the redo itself is the step that would have run anyway. */
        r->res->oom_lost_s += now_s() - t0;
        if (s != TRAIN_DONE)
            return TRAIN_FAILED;
    }
}

/* ---- the run -------------------------------------------------------------------------------- */

static int make_dir(const char *path, char *err, size_t err_len)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *s = tmp + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) {
            snprintf(err, err_len, "cannot create %s: %s", tmp, strerror(errno));
            return -1;
        }
        *s = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) {
        snprintf(err, err_len, "cannot create output directory %s: %s", tmp, strerror(errno));
        return -1;
    }
    return 0;
}

/* Hold out_dir/.lock for the run: two runs writing one directory (two
 * devices given the same job file, or `gradd run` beside the daemon)
 * would interleave checkpoints and metrics, and each would resume from
 * the other's state.  flock, so that a crash or kill -9 releases it. */
static train_outcome lock_out_dir(run *r)
{
    char path[4200], note[64], holder[128];
    snprintf(path, sizeof path, "%s/.lock", r->j->out_dir);
    snprintf(note, sizeof note, "pid %ld, job %u", (long)getpid(), r->job);
    r->out.lock_fd = fileio_lock(path, note, holder, sizeof holder);
    if (r->out.lock_fd >= 0)
        return TRAIN_DONE;
    if (errno != EWOULDBLOCK)
        return fail(r, "cannot lock %s: %s", path, strerror(errno));
    return fail(r, "output directory %s is in use by another run (%s); give this job another [output] dir, or "
                   "wait for that one to end",
                r->j->out_dir, holder[0] ? holder : "holder unknown");
}

static train_outcome setup_outputs(run *r, bool resumed)
{
    char err[1024];
    if (resumed && trim_metrics(r->out.path_metrics, r->progress.step, err, sizeof err) != 0)
        return fail(r, "%s", err);
    r->out.metrics = fopen(r->out.path_metrics, resumed ? "a" : "w");
    if (!r->out.metrics)
        return fail(r, "cannot write %s: %s", r->out.path_metrics, strerror(errno));
    char tbdir[4200];
    snprintf(tbdir, sizeof tbdir, "%s/tensorboard", r->j->out_dir);
    if (make_dir(tbdir, err, sizeof err) != 0 || tb_open(tbdir, &r->out.tb, err, sizeof err) != 0)
        return fail(r, "%s", err);
    /* The next step is the first this run logs: earlier files' events from
     * it on are a crashed run's, past the checkpoint resumed from. */
    if (tb_session_start(r->out.tb, (int64_t)r->progress.step + 1, wall_s()) != 0)
        return fail(r, "%s", tb_error(r->out.tb));
    return TRAIN_DONE;
}

static train_outcome checkpoint(run *r, uint64_t epoch, uint64_t index)
{
    char err[1024];
    /* Everything logged up to here (the step's validation too) is on disk
     * before the state that a resume would continue after it. */
    if (r->out.tb && tb_flush(r->out.tb) != 0)
        output_failed(r, tb_error(r->out.tb));
    /* Not over logs that did not make it to disk: a resume from here
     * would never write them. */
    if (r->out.err[0])
        return fail(r, "%s", r->out.err);
    if (write_resume(r, epoch, index, err, sizeof err) != 0)
        return fail(r, "checkpoint failed (the previous one is intact): %s", err);
    return TRAIN_DONE;
}

/* Stop the run: checkpoint the state at (epoch, index), which is the
 * step's start or, when the step was applied, its end. */
static train_outcome stop_at(run *r, uint64_t epoch, uint64_t index)
{
    if (checkpoint(r, epoch, index) != TRAIN_DONE)
        return TRAIN_FAILED;
    r->res->outcome = TRAIN_STOPPED;
    r->res->steps_done = r->progress.step;
    return TRAIN_STOPPED;
}

static train_outcome run_job(run *r, const train_hooks *h)
{
    const job_config *j = r->j;
    char err[1024];
    /* The data first: a job whose data is refused leaves no output
     * directory behind. */
    if (load_data(r) != TRAIN_DONE)
        return TRAIN_FAILED;
    if (make_dir(j->out_dir, err, sizeof err) != 0)
        return fail(r, "%s", err);
    if (lock_out_dir(r) != TRAIN_DONE)
        return TRAIN_FAILED;
    snprintf(r->ckpt.path_resume, sizeof r->ckpt.path_resume, "%s/resume.safetensors", j->out_dir);
    snprintf(r->ckpt.path_model, sizeof r->ckpt.path_model, "%s/model.safetensors", j->out_dir);
    snprintf(r->out.path_metrics, sizeof r->out.path_metrics, "%s/metrics.jsonl", j->out_dir);
    /* Holding the lock, no writer of ours is alive here: temporary files
     * are what a run killed mid-checkpoint left, each as large as one. */
    st_clear_temps(r->ckpt.path_resume);
    st_clear_temps(r->ckpt.path_model);
    /* The job's budget: the pool refuses it more, as an OOM, before the
     * device runs out for everyone. */
    if (j->mem_limit && pool_job_set_limit(r->p, r->job, j->mem_limit) != 0)
        return fail(r, "cannot set the memory limit: the pool's job table is full");
    if (model_create(j, r->data.input_dim, r->data.classes, r->k, r->kc, &r->m, err, sizeof err) != 0)
        return fail(r, "%s: %s", j->source, err);
    r->m->poll = h ? h->poll : NULL;
    r->m->poll_user = h ? h->user : NULL;
    if (alloc_memory(r) != TRAIN_DONE)
        return TRAIN_FAILED;

    /* Fresh parameters, zero optimizer state; a checkpoint overrides both. */
    size_t P = r->m->num_params;
    float *init = r->host_visible ? r->mem.params : malloc(P * sizeof(float));
    if (!init)
        return fail(r, "out of host memory initialising %zu parameters", P);
    r->m->ops->init_params(r->m, init, j->seed);
    if (!r->host_visible) {
        r->k->copy_h2d(r->kc, r->mem.params, init, P * sizeof(float));
        free(init);
    }
    r->k->zero(r->kc, r->mem.opt, 2 * P);
    r->progress.loss_scale = j->precision == JOBCFG_FP16 ? TRAIN_LOSS_SCALE_INIT : 1.0;
    r->prog.steps = j->steps;
    r->prog.loss = NAN;
    r->prog.val_loss = NAN;
    r->prog.val_accuracy = NAN;
    int resumed = load_resume(r);
    if (resumed < 0)
        return TRAIN_FAILED;
    refresh_params16(r);
    r->prog.resumed = resumed == 1;
    /* Where it resumed is the job's progress from now, also should it
     * fail before its first step (a device that no longer fits it). */
    if (resumed == 1 && h && h->on_step)
        h->on_step(h->user, &r->prog);
    if (setup_outputs(r, resumed == 1) != TRAIN_DONE)
        return TRAIN_FAILED;
    pool_config pc;
    pool_get_config(r->p, &pc);
    r->mem.low_watermark = pc.low_watermark;
    if (choose_micro(r) != TRAIN_DONE)
        return TRAIN_FAILED;

    double start = now_s(), before = r->prog.elapsed_s;
    if (r->progress.step == j->steps) {
        /* Resumed at its last step: nothing to train, but what it reached
         * is the job's progress. */
        r->prog.micro = r->mem.micro;
        r->prog.accum = batch_accum(j->batch, r->mem.micro);
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
        if (!last && adapt(r) != TRAIN_DONE)
            return TRAIN_FAILED;
        if (((j->eval_every && r->progress.step % j->eval_every == 0) || last) && evaluate(r)) {
            /* Stopped while evaluating: the step stands, its evaluation
             * is not reported. */
            data_stream_state(&r->data.stream, &epoch, &index);
            return stop_at(r, epoch, index);
        }
        r->prog.elapsed_s = before + (now_s() - start);
        if (h && h->on_step)
            h->on_step(h->user, &r->prog);
        if (r->out.err[0])
            return fail(r, "%s", r->out.err);
        if ((j->checkpoint_every && r->progress.step % j->checkpoint_every == 0) || last) {
            data_stream_state(&r->data.stream, &epoch, &index);
            if (checkpoint(r, epoch, index) != TRAIN_DONE)
                return TRAIN_FAILED;
        }
    }
    if (export_model(r, err, sizeof err) != 0)
        return fail(r, "%s", err);
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
    train_outcome o;
    if (r->host_visible != (strcmp(k->name, "cpu") == 0)) {
        o = fail(r, "kernels '%s' cannot run on device %s", k->name, d->id);
    } else if (r->host_visible && j->precision != JOBCFG_FP32 && !(h && h->cpu_mixed_precision)) {
        o = fail(r, "%s: [train] precision: %s needs a CUDA device; use fp32 on %s", j->source,
                 j->precision == JOBCFG_BF16 ? "bf16" : "fp16", d->id);
    } else {
        kern_scratch scratch = {scratch_acquire, scratch_release, r};
        kern_precision prec = j->precision == JOBCFG_BF16   ? KERN_BF16
                              : j->precision == JOBCFG_FP16 ? KERN_FP16
                                                            : KERN_FP32;
        r->kc = k->ctx_create((int)j->threads, d->index, prec, &scratch);
        o = r->kc ? run_job(r, h) : fail(r, "cannot create the %s kernel context on %s", k->name, d->id);
    }
    if (r->out.metrics && fclose(r->out.metrics) != 0 && o == TRAIN_DONE)
        o = fail(r, "cannot write %s: %s", r->out.path_metrics, strerror(errno));
    if (r->out.tb) {
        char err[600];
        if (tb_close(r->out.tb, err, sizeof err) != 0 && o == TRAIN_DONE)
            o = fail(r, "%s", err);
    }
    if (r->m)
        free_memory(r);
    model_destroy(r->m);
    if (r->kc)
        k->ctx_destroy(r->kc);
    free_data(r);
    /* Last: the outputs are complete (or the run failed) before another
     * run may take the directory. */
    if (r->out.lock_fd >= 0)
        close(r->out.lock_fd);
    res->outcome = o;
    free(r);
    return o;
}
