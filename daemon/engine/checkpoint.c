/* checkpoint.c — the resume state (resume.safetensors) and the trained
 * model as the Python ecosystem reads it (model.safetensors), or a LoRA
 * job's adapters as PEFT reads them (adapter_model.safetensors with
 * adapter_config.json; the merged model.safetensors when asked for). */
#include "run.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/hf.h"
#include "io/safetensors.h"
#include "models/lora.h"
#include "pool/dev.h"


void checkpoint_paths(run *r)
{
    snprintf(r->ckpt.path_resume, sizeof r->ckpt.path_resume, "%s/resume.safetensors", r->j->out_dir);
    snprintf(r->ckpt.path_model, sizeof r->ckpt.path_model, "%s/model.safetensors", r->j->out_dir);
    snprintf(r->ckpt.path_adapters, sizeof r->ckpt.path_adapters, "%s/adapter_model.safetensors", r->j->out_dir);
    /* Holding the lock, no writer of ours is alive here: temporary files
     * are what a run killed mid-checkpoint left, each as large as one. */
    st_clear_temps(r->ckpt.path_resume);
    st_clear_temps(r->ckpt.path_model);
    st_clear_temps(r->ckpt.path_adapters);
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

static const char *precision_name(int precision)
{
    return precision == JOBCFG_BF16 ? "bf16" : precision == JOBCFG_FP16 ? "fp16" : "fp32";
}

/* The device a micro-batch was found on: its id and its name, so that
 * another card in the same slot counts as another device. */
void checkpoint_device_signature(const run *r, char *buf, size_t len)
{
    const dev *d = pool_device(r->p);
    snprintf(buf, len, "%s %s", d->id, d->name);
}

/* What trains, as the resume state holds it: the model's table as one
 * "params" tensor, or LoRA's adapters by their PEFT names (the frozen base
 * is [model] from's, or the seed's, and is not kept). */
static const model_tensor *state_tensors(const run *r, int *n)
{
    *n = r->m->lora ? r->m->lora->ntensors : 0;
    return r->m->lora ? r->m->lora->tensors : NULL;
}

/* Each tensor of a table (nt of them) from host memory hp, fp32, as the
 * table names and shapes it. */
static void add_table(st_writer *w, const model_tensor *ts, int nt, const float *hp, char *err, size_t err_len)
{
    for (int i = 0; i < nt; i++) {
        uint64_t sh[MODEL_MAX_DIMS];
        for (int d = 0; d < ts[i].ndim; d++)
            sh[d] = ts[i].shape[d];
        st_writer_add(w, ts[i].name, ST_F32, ts[i].ndim, sh, hp + ts[i].offset, ts[i].numel * sizeof(float), err,
                      err_len);
    }
}

/* opt_full: the optimizer state gathered from the ranks that hold it in
 * shares (2·count floats, m then v), else NULL: this rank holds it all. */
static int write_resume(run *r, uint64_t epoch, uint64_t index, const float *opt_full, char *err, size_t err_len)
{
    const run_trained *t = &r->mem.trained;
    size_t P = t->count;
    float *own_p, *own_o = NULL;
    const float *hp = host_view(r, t->params, P, &own_p);
    const float *ho = opt_full ? opt_full : host_view(r, t->opt, 2 * P, &own_o);
    int rc = -1;
    st_writer *w = st_writer_new();
    if (!hp || !ho || !w) {
        snprintf(err, err_len, "%s: out of memory", r->ckpt.path_resume);
        goto out;
    }
    uint64_t shape[1] = {P};
    char sig[256], v[64];
    model_describe(r->m, sig, sizeof sig);
    int nt;
    const model_tensor *ts = state_tensors(r, &nt);
    if (!ts)
        st_writer_add(w, "params", ST_F32, 1, shape, hp, P * sizeof(float), err, err_len);
    add_table(w, ts, nt, hp, err, err_len);
    st_writer_add(w, "adam_m", ST_F32, 1, shape, ho, P * sizeof(float), err, err_len);
    st_writer_add(w, "adam_v", ST_F32, 1, shape, ho + P, P * sizeof(float), err, err_len);
    st_writer_meta(w, "format", TRAIN_RESUME_FORMAT, err, err_len);
    st_writer_meta(w, "model", sig, err, err_len);
    /* The adapters it holds: a resume must find the same ones. */
    if (r->m->lora) {
        char lo[160];
        lora_describe(r->m, lo, sizeof lo);
        st_writer_meta(w, "lora", lo, err, err_len);
    }
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
    /* recompute = auto's choice: resumed without it, the first step would
     * not fit (memory_choose_micro). */
    META("recompute", "%d", r->m->recompute ? 1 : 0);
    if (r->m->recompute)
        st_writer_meta(w, "recompute_why", r->mem.recompute_why, err, err_len);
    /* The results so far, so that a resumed run reports them until it has
     * its own, and one resumed at its last step reports them at all; the
     * time is the training's across runs. */
    META("loss", "%.17g", r->prog.loss);
    META("val_loss", "%.17g", r->prog.val_loss);
    META("val_accuracy", "%.17g", r->prog.val_accuracy);
    META("elapsed_s", "%.17g", r->prog.elapsed_s);
    /* What probing (and tuning) found, so that a resumed job need not
     * search again: see memory_choose_micro. */
    const batch_ctl *c = &r->ctl;
    if (!r->j->micro_batch && c->probing_done) {
        char devsig[96];
        checkpoint_device_signature(r, devsig, sizeof devsig);
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
        run_fail(r, "cannot resume: %s: bad seed or epoch_size metadata", r->ckpt.path_resume);
    else if (seed != r->j->seed)
        run_fail(r,
                 "cannot resume: %s was written with [train] seed %llu but the job has %llu; use another [output] dir",
                 r->ckpt.path_resume, (unsigned long long)seed, (unsigned long long)r->j->seed);
    else if (was != size)
        run_fail(r,
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
            run_fail(r, "cannot resume: %s: tensor %s holds %g at index %zu", r->ckpt.path_resume, name, (double)x[i],
                     i);
            return false;
        }
    return true;
}

/* Whether it exists, asked with the thread's filesystem identity (the
 * job's owner): access(2) asks with the real uid, the daemon's, which may
 * not even search the owner's private directories, so a service-user gradd
 * took a checkpoint it could not see for none and started the job over.
 * Whatever is under the name counts, a dangling or looping link too: it is
 * the checkpoint to read (and to refuse when it cannot be read), not a
 * directory without one, where a fresh run would write over the model. */
bool checkpoint_exists(const run *r)
{
    struct stat st;
    return lstat(r->ckpt.path_resume, &st) == 0;
}

int checkpoint_holds_adapters(const run *r)
{
    if (!checkpoint_exists(r))
        return -1;
    char err[512];
    st_file *f;
    if (st_open(r->ckpt.path_resume, &f, err, sizeof err) != 0)
        return -1;
    int rc = st_meta(f, "lora") != NULL;
    st_close(f);
    return rc;
}

/* The resume state's tensors with their shapes: "params" or the adapters'
 * (ts, nt), and the moments (shape: the count of what trains). */
static bool expect_state(st_file *f, const model_tensor *ts, int nt, const uint64_t *shape, char *err,
                         size_t err_len)
{
    if (!ts && !st_expect(f, "params", ST_F32, 1, shape, err, err_len))
        return false;
    for (int i = 0; i < nt; i++) {
        uint64_t sh[MODEL_MAX_DIMS];
        for (int d = 0; d < ts[i].ndim; d++)
            sh[d] = ts[i].shape[d];
        if (!st_expect(f, ts[i].name, ST_F32, ts[i].ndim, sh, err, err_len))
            return false;
    }
    return st_expect(f, "adam_m", ST_F32, 1, shape, err, err_len) &&
           st_expect(f, "adam_v", ST_F32, 1, shape, err, err_len);
}

/* One part of the state into `into` (n floats): the tensor `name`, or the
 * adapters' tensors (ts) each at its offset. */
static int read_state(st_file *f, const model_tensor *ts, int nt, const char *name, float *into, size_t n,
                      char *err, size_t err_len)
{
    if (!ts)
        return st_read(f, name, into, n * sizeof(float), err, err_len);
    for (int i = 0; i < nt; i++)
        if (st_read(f, ts[i].name, into + ts[i].offset, ts[i].numel * sizeof(float), err, err_len) != 0)
            return -1;
    return 0;
}

/* Load out_dir/resume.safetensors if present.  Returns 1 when resumed, 0
 * when there is none, -1 (with res->message) when it is unusable. */
int checkpoint_load(run *r)
{
    if (!checkpoint_exists(r))
        return 0;
    char err[1024];
    st_file *f;
    if (st_open(r->ckpt.path_resume, &f, err, sizeof err) != 0) {
        run_fail(r, "cannot resume: %s", err);
        return -1;
    }
    int rc = -1;
    const run_trained *t = &r->mem.trained;
    size_t P = t->count;
    char sig[256], lo[160] = "";
    model_describe(r->m, sig, sizeof sig);
    if (r->m->lora)
        lora_describe(r->m, lo, sizeof lo);
    const char *fmt = st_meta(f, "format"), *msig = st_meta(f, "model"), *mlora = st_meta(f, "lora");
    int nt;
    const model_tensor *ts = state_tensors(r, &nt);
    bool ok = true;
    uint64_t step = meta_u64(f, "step", &ok), epoch = meta_u64(f, "data_epoch", &ok),
             index = meta_u64(f, "data_index", &ok), batch = meta_u64(f, "batch", &ok);
    /* Checkpoints from before skipped fp16 steps were left out of AdamW's
     * count lack it; their optimizer took t = step, so that is the count to
     * go on from (exact for fp32 and bf16, which skip nothing). */
    uint64_t opt_steps = st_meta(f, "optimizer_steps") ? meta_u64(f, "optimizer_steps", &ok) : step;
    uint64_t shape[1] = {P};
    if (!fmt || strcmp(fmt, TRAIN_RESUME_FORMAT) != 0) {
        run_fail(r, "cannot resume: %s: metadata format is '%s', expected '%s'", r->ckpt.path_resume,
                 fmt ? fmt : "(none)", TRAIN_RESUME_FORMAT);
    } else if (mlora && !lo[0]) {
        run_fail(r, "cannot resume: %s holds LoRA adapters (%s), not the whole model this job trains ([finetune] "
                 "method = full); use another [output] dir", r->ckpt.path_resume, mlora);
    } else if (!mlora && lo[0]) {
        run_fail(r, "cannot resume: %s holds a whole model's training state, but the job trains LoRA adapters (%s); "
                 "use another [output] dir", r->ckpt.path_resume, lo);
    } else if (mlora && strcmp(mlora, lo) != 0) {
        run_fail(r, "cannot resume: %s holds adapters '%s' but the job asks for '%s' ([finetune] rank, alpha and "
                 "targets); use another [output] dir", r->ckpt.path_resume, mlora, lo);
    } else if (!msig || strcmp(msig, sig) != 0) {
        run_fail(r, "cannot resume: %s was written for '%s' but the job is '%s'; use another [output] dir",
                 r->ckpt.path_resume, msig ? msig : "(none)", sig);
    } else if (!ok) {
        /* The first that is missing or not a whole number, by name. */
        static const char *const keys[] = {"step", "data_epoch", "data_index", "batch", "optimizer_steps"};
        const char *key = keys[0], *v = NULL;
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
            bool one = true;
            key = keys[i];
            v = st_meta(f, key);
            if (i == 4 && !v)
                continue; /* optional: older checkpoints lack it */
            meta_u64(f, key, &one);
            if (!one)
                break;
        }
        run_fail(r, "cannot resume: %s: metadata %s is %s%s%s, not a whole number (the file is damaged)",
                 r->ckpt.path_resume, key, v ? "'" : "", v ? v : "missing", v ? "'" : "");
    } else if (batch != r->j->batch) {
        run_fail(r, "cannot resume: %s was written with [train] batch %llu, but the job has %u (the step would "
                 "change); use another [output] dir, or the same batch",
                 r->ckpt.path_resume, (unsigned long long)batch, r->j->batch);
    } else if (step > r->j->steps) {
        run_fail(r, "cannot resume: %s is at step %llu, past the job's [train] steps %llu", r->ckpt.path_resume,
                 (unsigned long long)step, (unsigned long long)r->j->steps);
    } else if (opt_steps > step) {
        run_fail(r, "cannot resume: %s: metadata optimizer_steps %llu is past its step %llu (the file is damaged)",
                 r->ckpt.path_resume, (unsigned long long)opt_steps, (unsigned long long)step);
    } else if (!same_data_order(r, f)) {
        /* failed */
    } else if (!expect_state(f, ts, nt, shape, err, sizeof err)) {
        run_fail(r, "cannot resume: %s", err);
    } else {
        /* A rank that holds a share of the optimizer state keeps its share
         * of the saved one, whatever the number of ranks that saved it. */
        bool share = t->opt_count != P;
        float *stage = r->host_visible && !share ? NULL : malloc(P * sizeof(float));
        float *dst[3] = {t->params, t->opt, t->opt + t->opt_count};
        const char *names[3] = {ts ? "adapters" : "params", "adam_m", "adam_v"};
        rc = 0;
        for (int i = 0; i < 3 && rc == 0; i++) {
            bool whole = r->host_visible && (i == 0 || !share);
            float *into = whole ? dst[i] : stage;
            if (!into || read_state(f, i == 0 ? ts : NULL, nt, names[i], into, P, err, sizeof err) != 0) {
                run_fail(r, "cannot resume: %s", into ? err : "out of host memory");
                rc = -1;
            } else if (!finite_state(r, names[i], into, P)) {
                rc = -1;
            } else if (i > 0 && share) {
                if (r->host_visible)
                    memcpy(dst[i], stage + t->opt_first, t->opt_count * sizeof(float));
                else
                    r->k->copy_h2d(r->kc, dst[i], stage + t->opt_first, t->opt_count * sizeof(float));
            } else if (!whole) {
                r->k->copy_h2d(r->kc, dst[i], stage, P * sizeof(float));
            }
        }
        free(stage);
        if (rc == 0 && data_stream_set_state(&r->data.stream, epoch, index, err, sizeof err) != 0) {
            run_fail(r, "cannot resume: %s: %s", r->ckpt.path_resume, err);
            rc = -1;
        }
        if (rc == 0) {
            r->progress.step = step;
            r->progress.opt_steps = opt_steps;
            load_loss_scale(r, f);
            load_found(r, f);
            const char *rc_meta = st_meta(f, "recompute");
            r->ckpt.recompute = rc_meta && !strcmp(rc_meta, "1");
            const char *why_meta = st_meta(f, "recompute_why");
            snprintf(r->ckpt.recompute_why, sizeof r->ckpt.recompute_why, "%s", why_meta ? why_meta : "");
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

/* model.safetensors from host memory hp (the model's P floats): named
 * tensors as the Python ecosystem expects them (GPT-2's Conv1D matrices
 * are (in,out), so those are transposed), and config.json beside it. */
static int write_model(run *r, const float *hp, char *err, size_t err_len)
{
    st_writer *w = st_writer_new();
    float **tmp = calloc((size_t)r->m->ntensors, sizeof *tmp);
    int rc = -1;
    if (!w || !tmp) {
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
    model_describe(r->m, sig, sizeof sig);
    st_writer_meta(w, "format", "pt", err, err_len);
    st_writer_meta(w, "gradd_model", sig, err, err_len);
    snprintf(v, sizeof v, "%llu", (unsigned long long)r->progress.step);
    st_writer_meta(w, "step", v, err, err_len);
    rc = st_write_atomic(w, r->ckpt.path_model, err, err_len);
    /* Beside the weights, what transformers needs to load them. */
    if (rc == 0) {
        char path[PATH_MAX + 16];
        snprintf(path, sizeof path, "%s/config.json", r->j->out_dir);
        rc = model_hf_export_config(r->m, path, err, err_len);
    }
out:
    if (tmp)
        for (int i = 0; i < r->m->ntensors; i++)
            free(tmp[i]);
    free(tmp);
    st_writer_free(w);
    return rc;
}

/* adapter_model.safetensors (the adapters' table as it is: PEFT's names,
 * A (rank,in) and B (out,rank) in fp32) and adapter_config.json, each
 * atomically; with [finetune] merged also model.safetensors and
 * config.json of the base with the adapters merged in, made on a host copy
 * of the base (widened from 16 bits where it is held so). */
static int export_lora(run *r, char *err, size_t err_len)
{
    const lora *l = r->m->lora;
    const run_trained *t = &r->mem.trained;
    float *own, *base = NULL;
    const float *ha = host_view(r, t->params, t->count, &own);
    st_writer *w = st_writer_new();
    int rc = -1;
    if (!ha || !w) {
        snprintf(err, err_len, "%s: out of memory", r->ckpt.path_adapters);
        goto out;
    }
    add_table(w, l->tensors, l->ntensors, ha, err, err_len);
    st_writer_meta(w, "format", "pt", err, err_len);
    if (st_write_atomic(w, r->ckpt.path_adapters, err, err_len) != 0)
        goto out;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/adapter_config.json", r->j->out_dir);
    /* PEFT finds the base by this path from wherever it runs: absolute,
     * though `gradd run` was given a relative job file. */
    char from[PATH_MAX];
    json_t *cfg = lora_peft_config(r->m, r->j->from[0] && realpath(r->j->from, from) ? from : r->j->from);
    if (!cfg) {
        snprintf(err, err_len, "%s: out of memory", path);
        goto out;
    }
    rc = hf_write_json(path, cfg, err, err_len);
    json_decref(cfg);
    if (rc != 0 || !r->j->lora_merged)
        goto out;
    rc = -1;
    base = malloc(r->m->num_params * sizeof(float));
    if (!base) {
        snprintf(err, err_len, "%s: out of host memory for the merged model", r->ckpt.path_model);
        goto out;
    }
    if (memory_base_to_host(r, base, err, err_len) != 0)
        goto out;
    lora_merge(r->m, base, ha);
    rc = write_model(r, base, err, err_len);
out:
    free(base);
    st_writer_free(w);
    free(own);
    return rc;
}

int checkpoint_export(run *r, char *err, size_t err_len)
{
    if (!r->writer)
        return 0;
    if (r->m->lora)
        return export_lora(r, err, err_len);
    float *own;
    const float *hp = host_view(r, r->mem.params, r->m->num_params, &own);
    if (!hp) {
        snprintf(err, err_len, "%s: out of memory", r->ckpt.path_model);
        return -1;
    }
    int rc = write_model(r, hp, err, err_len);
    free(own);
    return rc;
}

/* Under shard_optimizer: every rank's share of m and of v into one host
 * buffer on rank 0 (a collective: every rank calls it); NULL elsewhere.
 * -1 (the run failed) when rank 0 has no room for it. */
static int gather_opt(run *r, float **full)
{
    const run_trained *t = &r->mem.trained;
    size_t P = t->count;
    *full = NULL;
    if (t->opt_count == P)
        return 0;
    if (r->writer && !(*full = malloc(2 * P * sizeof(float)))) {
        run_fail(r, "checkpoint failed: out of host memory gathering %zu floats of optimizer state", 2 * P);
        return -1;
    }
    /* The gather runs between hosts: a CUDA device's share comes over. */
    float *own = NULL;
    const float *share = host_view(r, t->opt, 2 * t->opt_count, &own);
    char err[1024];
    int rc = -1;
    if (!share)
        snprintf(err, sizeof err, "out of host memory for this rank's share of the optimizer state");
    else if (dist_gather_f32(r->dist, share, *full, P, "gathering the optimizer state", err, sizeof err) == 0 &&
             dist_gather_f32(r->dist, share + t->opt_count, *full ? *full + P : NULL, P,
                             "gathering the optimizer state", err, sizeof err) == 0)
        rc = 0;
    free(own);
    if (rc != 0) {
        free(*full);
        *full = NULL;
        run_fail(r, "checkpoint failed: %s", err);
        return -1;
    }
    return 0;
}

train_outcome checkpoint_save(run *r, uint64_t epoch, uint64_t index)
{
    float *opt_full;
    if (gather_opt(r, &opt_full) != 0)
        return TRAIN_FAILED;
    /* Written once, by rank 0: every rank holds the same state. */
    if (!r->writer)
        return TRAIN_DONE;
    char err[1024];
    train_outcome o = TRAIN_DONE;
    /* Everything logged up to here (the step's validation too) is on disk
     * before the state that a resume would continue after it; and not over
     * logs that did not make it to disk: a resume from here would never
     * write them. */
    if (!outputs_flush(r))
        o = run_fail(r, "%s", r->out.err);
    else if (write_resume(r, epoch, index, opt_full, err, sizeof err) != 0)
        o = run_fail(r, "checkpoint failed (the previous one is intact): %s", err);
    free(opt_full);
    return o;
}
