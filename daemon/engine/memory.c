/* memory.c — a run's device memory, and the batch controller at work:
 * budgets, probes, and changes of micro-batch (before a step, after an OOM
 * inside one, at step boundaries). */
#include "run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/lora.h"
#include "pool/dev.h"
#include "units.h"

/* ---- memory ---------------------------------------------------------------------------- */

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
        r->mem.last_oom_host = false;
    }
    return ptr;
}

static void scratch_release(void *user, void *ptr)
{
    run *r = user;
    pool_free(r->p, ptr);
}

kern_scratch memory_scratch(run *r)
{
    return (kern_scratch){scratch_acquire, scratch_release, r};
}

/* The bytes of the state that lives as long as the job, as memory_alloc
 * asks for it: full fine-tuning's parameters, gradients and AdamW's two
 * moments (and a 16-bit copy); LoRA's frozen base and the adapters with
 * theirs. */
static size_t lasting_bytes(const run *r)
{
    const model *m = r->m;
    size_t P = m->num_params;
    if (!m->lora)
        return P * 4 * sizeof(float) + (m->needs_params16 ? P * sizeof(uint16_t) : 0);
    size_t base = r->j->precision == JOBCFG_FP32 ? P * sizeof(float)
                                                  : P * sizeof(uint16_t) + m->lora->n32 * sizeof(float);
    return base + m->lora->num_params * 4 * sizeof(float);
}

/* The lever a job that trains every weight of a kind with LoRA did not
 * allow, for the end of an out-of-memory's advice ("" for the others):
 * ", or train LoRA adapters ...", so the advice before it leaves out its
 * own "or " when this is set. */
static const char *lora_hint(const run *r)
{
    return !r->m->lora && r->m->kind->lora_targets
               ? ", or train LoRA adapters on the frozen model ([finetune] method = lora or auto)"
               : "";
}

static void *alloc_tagged(run *r, size_t bytes, pool_tag tag, const char *what)
{
    pool_oom_report oom;
    void *ptr = pool_alloc(r->p, bytes ? bytes : 1, tag, r->job, &oom);
    if (ptr)
        return ptr;
    /* The state that lives as long as the job does not fit: say how much
     * it is, and what to change, as the micro-batch-1 report does. */
    size_t lasting = lasting_bytes(r);
    size_t act1 = 0, per = 0;
    r->m->ops->activation_bytes(r->m, &act1, &per);
    char need[16], act[16], sum[16];
    units_format_size(lasting, need, sizeof need);
    units_format_size(act1 + per, act, sizeof act);
    units_format_size(lasting + act1 + per, sum, sizeof sum);
    const char *lora = lora_hint(r);
    run_fail(r,
             "out of memory for the %s: %s; %s alone take %s, and micro-batch 1 about %s more: %s at least %s, %s"
             "train a smaller model%s",
             what, oom.message,
             r->m->lora ? "the frozen base model and the adapters with their gradients and optimizer state"
                        : "the parameters, gradients and optimizer state",
             need, act, oom.job_limit_hit ? "raise [memory] limit to" : "the job needs free", sum, lora[0] ? "" : "or ",
             lora);
    return NULL;
}

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
    /* Ranks split every step alike: the smallest budget is each one's. */
    if (r->dist) {
        double v = (double)b;
        run_agree(r, &v, 1, DIST_MIN, "agreeing on the memory budget");
        b = (size_t)v;
    }
    if (avail)
        *avail = b;
    if (r->j->mem_limit && r->j->mem_limit < b)
        b = r->j->mem_limit;
    return b;
}

/* After an OOM for the activation block: the largest n whose block the
 * pool could have handed out — a free block it holds, or a new segment
 * from what the device and the cap still allow.  The budget counts every
 * byte the pool reserves, but its free bytes may lie in pieces between
 * other jobs' blocks, and one block cannot span them.  UINT32_MAX when the
 * OOM says nothing of this (another allocation, or the job's own limit). */
static uint32_t largest_block_fits(const run *r, const pool_oom_report *rep)
{
    if (rep->tag != POOL_TAG_ACTIVATIONS || rep->job_limit_hit || !r->mem.act_per)
        return UINT32_MAX;
    size_t grow = rep->cap > rep->reserved ? rep->cap - rep->reserved : 0;
    if (grow > rep->device_free)
        grow = rep->device_free;
    size_t big = rep->largest_free_block > grow ? rep->largest_free_block : grow;
    if (big < r->mem.act_fixed)
        return 0;
    size_t n = (big - r->mem.act_fixed) / r->mem.act_per;
    return n < UINT32_MAX ? (uint32_t)n : UINT32_MAX;
}

/* The controller's view of an OOM, alike on every rank: any rank's OOM is
 * every rank's, with the largest bound and the smallest block limit among
 * the ranks that ran out. */
bool memory_oom_agree(run *r, bool local)
{
    const pool_oom_report *rep = &r->mem.last_oom;
    double v[3] = {local ? 1.0 : 0.0, local ? (double)(rep->job_allocated + rep->requested) : 0.0,
                   -(double)(local ? largest_block_fits(r, rep) : UINT32_MAX)};
    if (r->dist)
        run_agree(r, v, 3, DIST_MAX, "agreeing on an out-of-memory");
    if (v[0] == 0)
        return false;
    r->mem.oom_bound = (size_t)v[1];
    r->mem.oom_largest = (uint32_t)-v[2];
    if (!local) {
        memset(&r->mem.last_oom, 0, sizeof r->mem.last_oom);
        r->mem.last_oom.job = r->job;
        r->mem.last_oom.job_allocated = r->mem.oom_bound;
        snprintf(r->mem.last_oom.message, sizeof r->mem.last_oom.message,
                 "another rank of this job ran out of memory (%s)", dist_name(r->dist));
    }
    return true;
}

static void free_micro(run *r)
{
    pool_free(r->p, r->mem.aux);
    r->mem.aux = NULL;
    pool_free(r->p, r->mem.y);
    pool_free(r->p, r->mem.x);
    pool_free(r->p, r->mem.acts);
    r->mem.y = r->mem.x = r->mem.acts = NULL;
    r->mem.micro = 0;
}

/* The host memory of a micro-batch of n: the model's beside its
 * activations (bind_activations), and where device memory is not the
 * host's, the batch's staging.  0, or -1 when some of it cannot be had. */
static int host_micro(run *r, uint32_t n)
{
    int rc = r->m->ops->bind_activations(r->m, r->mem.acts, n);
    if (r->hooks && r->hooks->test_host_short_from && n >= r->hooks->test_host_short_from)
        rc = -1;
    if (!r->host_visible) {
        free(r->mem.x_host);
        free(r->mem.y_host);
        free(r->mem.aux_host);
        r->mem.x_host = malloc(n * r->data.x_bytes);
        r->mem.y_host = malloc(n * r->data.y_bytes);
        r->mem.aux_host = r->data.aux_bytes ? malloc(n * r->data.aux_bytes) : NULL;
        if (!r->mem.x_host || !r->mem.y_host || (r->data.aux_bytes && !r->mem.aux_host))
            rc = -1;
    }
    return rc;
}

/* The host's malloc failed for micro-batch n: an out-of-memory the way the
 * pool's are, so that the controller shrinks (the host's share scales with
 * n too) and, at 1, the job fails saying what ran out. */
static void host_oom(run *r, uint32_t n)
{
    memset(&r->mem.last_oom, 0, sizeof r->mem.last_oom);
    r->mem.last_oom_host = true;
    r->mem.last_oom.job = r->job;
    r->mem.last_oom.job_allocated = job_peak(r);
    snprintf(r->mem.last_oom.message, sizeof r->mem.last_oom.message,
             "the host ran out of memory for a micro-batch of %u (its staging and the losses' buffer)", n);
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
    /* Packed samples' positions and starts (data.h's data_rows). */
    if (r->mem.y && r->data.aux_bytes) {
        r->mem.aux = pool_alloc(r->p, n * r->data.aux_bytes, POOL_TAG_DATA, r->job, &oom);
        if (!r->mem.aux) {
            pool_free(r->p, r->mem.y);
            r->mem.y = NULL;
        }
    }
    bool host_short = false;
    if (!r->mem.y) {
        r->mem.last_oom = oom;
        r->mem.last_oom_host = false;
    } else if ((host_short = host_micro(r, n) != 0))
        host_oom(r, n);
    if (memory_oom_agree(r, !r->mem.y || host_short)) {
        free_micro(r);
        return -1;
    }
    /* What the other jobs' budgets leave for this one from now on. */
    double need = batch_peak(&r->ctl, n);
    pool_job_set_need(r->p, r->job, need > 0 ? (size_t)need : 0);
    r->mem.micro = n;
    return 0;
}

/* The levers' text: recompute's (may be NULL or "") and LoRA's. */
static void set_levers(run *r, const char *recompute)
{
    bool rc = recompute && recompute[0];
    snprintf(r->prog.levers, sizeof r->prog.levers, "%s%s%s", rc ? recompute : "",
             rc && r->mem.lora_lever[0] ? ", " : "", r->mem.lora_lever);
}

/* The tensors of a table as adamw_multi's segments (host memory). */
static kern_segment *segments(const model_tensor *t, int n)
{
    kern_segment *segs = malloc((size_t)(n ? n : 1) * sizeof *segs);
    for (int i = 0; segs && i < n; i++)
        segs[i] = (kern_segment){t[i].offset, t[i].numel, t[i].decay};
    return segs;
}

/* Whether this rank holds the optimizer state of only its share of the
 * trained elements ([memory] shard_optimizer among several ranks). */
static bool opt_sharded(const run *r)
{
    return r->dist && r->j->shard_optimizer;
}

/* The trained elements whose optimizer state this rank holds. */
static void opt_share(const run *r, size_t count, size_t *first, size_t *n)
{
    if (opt_sharded(r)) {
        dist_shard(count, dist_size(r->dist), dist_rank(r->dist), first, n);
    } else {
        *first = 0;
        *n = count;
    }
}

/* The tensors' segments cut to this rank's share, offsets counted from
 * its start: what adamw_multi updates on params + opt_first. */
static bool cut_segments(run_trained *t)
{
    if (t->opt_first == 0 && t->opt_count == t->count) {
        t->opt_segs = t->segs;
        t->opt_nsegs = t->nsegs;
        return true;
    }
    t->opt_segs = malloc((size_t)(t->nsegs ? t->nsegs : 1) * sizeof *t->opt_segs);
    if (!t->opt_segs)
        return false;
    size_t lo = t->opt_first, hi = t->opt_first + t->opt_count;
    t->opt_nsegs = 0;
    for (int i = 0; i < t->nsegs; i++) {
        size_t a = t->segs[i].offset, b = a + t->segs[i].n;
        a = a > lo ? a : lo;
        b = b < hi ? b : hi;
        if (a < b)
            t->opt_segs[t->opt_nsegs++] = (kern_segment){a - lo, b - a, t->segs[i].decay};
    }
    return true;
}

/* LoRA's buffers: the frozen base once, in the precision its GEMMs read,
 * then the adapters, their gradients and AdamW's moments. */
static train_outcome alloc_lora(run *r)
{
    model *m = r->m;
    lora *l = m->lora;
    size_t P = m->num_params, A = l->num_params;
    bool b16 = r->j->precision != JOBCFG_FP32;
    if (!b16) {
        r->mem.params = alloc_tagged(r, P * sizeof(float), POOL_TAG_FROZEN, "frozen base model");
        if (!r->mem.params)
            return TRAIN_FAILED;
    } else {
        r->mem.params16 = alloc_tagged(r, P * sizeof(uint16_t), POOL_TAG_FROZEN, "frozen 16-bit base model");
        if (!r->mem.params16)
            return TRAIN_FAILED;
        r->mem.base32 = alloc_tagged(r, l->n32 * sizeof(float), POOL_TAG_FROZEN, "base model's fp32 tensors");
        if (!r->mem.base32)
            return TRAIN_FAILED;
    }
    r->mem.adapters = alloc_tagged(r, A * sizeof(float), POOL_TAG_PARAMS, "LoRA adapters");
    if (!r->mem.adapters)
        return TRAIN_FAILED;
    r->mem.adapter_grads = alloc_tagged(r, A * sizeof(float), POOL_TAG_GRADS, "adapters' gradients");
    if (!r->mem.adapter_grads)
        return TRAIN_FAILED;
    size_t first, n;
    opt_share(r, A, &first, &n);
    r->mem.opt = alloc_tagged(r, 2 * n * sizeof(float), POOL_TAG_OPTIMIZER, "optimizer state");
    if (!r->mem.opt)
        return TRAIN_FAILED;
    r->mem.trained = (run_trained){r->mem.adapters, r->mem.adapter_grads, r->mem.opt, NULL,
                                   segments(l->tensors, l->ntensors), l->ntensors, A, first, n, NULL, 0};
    l->params = r->mem.adapters;
    l->grads = r->mem.adapter_grads;
    l->base32 = r->mem.base32;
    char d[96];
    lora_describe(m, d, sizeof d);
    const char *prec = r->j->precision == JOBCFG_BF16 ? "bf16" : r->j->precision == JOBCFG_FP16 ? "fp16" : "fp32";
    /* lora_describe's "lora r=8 ..." as "lora (r=8 ...; base frozen in bf16)". */
    const char *rest = strncmp(d, "lora ", 5) == 0 ? d + 5 : d;
    char drop[32] = "";
    if (l->dropout > 0)
        snprintf(drop, sizeof drop, " dropout=%g", l->dropout);
    snprintf(r->mem.lora_lever, sizeof r->mem.lora_lever, "lora (%s%s; base frozen in %s%s%s)", rest, drop, prec,
             r->mem.method_why[0] ? "; " : "", r->mem.method_why);
    return TRAIN_DONE;
}

/* ---- [finetune] method = auto ---------------------------------------------------------- */

static bool fit_lock(run *r);
static void fit_unlock(run *r, bool took);

/* What full fine-tuning of r->m holds at micro-batch 1: parameters,
 * gradients, this rank's optimizer state, the 16-bit copy where the model
 * keeps one, and one sample's activations and inputs, recompute on unless
 * the job turned it off (the cheaper lever comes first). */
static size_t full_need(run *r)
{
    model *m = r->m;
    size_t P = m->num_params, first, n, fixed, per;
    opt_share(r, P, &first, &n);
    size_t need = 2 * P * sizeof(float) + 2 * n * sizeof(float) + (m->needs_params16 ? P * sizeof(uint16_t) : 0);
    m->recompute = r->j->recompute != JOBCFG_RECOMPUTE_OFF && m->kind->recomputes;
    m->ops->activation_bytes(m, &fixed, &per);
    m->recompute = false;
    return need + fixed + per + r->data.x_bytes + r->data.y_bytes + r->data.aux_bytes;
}

/* r->m built again from the job with LoRA's adapters. */
static train_outcome rebuild_with_lora(run *r)
{
    char err[1024];
    r->chosen = malloc(sizeof *r->chosen);
    if (!r->chosen)
        return run_fail(r, "out of host memory");
    *r->chosen = *r->j;
    r->chosen->ft_method = JOBCFG_FT_LORA;
    r->j = r->chosen;
    model_destroy(r->m);
    r->m = NULL;
    if (model_create(r->j, r->data.input_dim, r->data.classes, r->k, r->kc, &r->m, err, sizeof err) != 0)
        return run_fail(r, "%s: %s", r->j->source, err);
    return TRAIN_DONE;
}

train_outcome memory_choose_method(run *r)
{
    if (r->j->ft_method != JOBCFG_FT_AUTO || !r->m->kind->lora_targets)
        return TRAIN_DONE;
    /* A resumed job goes on with what its checkpoint holds. */
    int held = checkpoint_holds_adapters(r);
    bool took = fit_lock(r);
    size_t need = full_need(r), budget = job_budget(r, NULL); /* every rank: a collective */
    fit_unlock(r, took);
    /* Within the headroom the controller keeps ([memory] margin): an
     * estimate that only just fits would leave the whole model failing
     * at micro-batch 1 where adapters would have run.  Ranks train one
     * model: adapters if any of them must. */
    double room = (double)budget * (1.0 - r->j->margin);
    double lora = held == 1 || (held != 0 && (double)need > room);
    if (r->dist)
        run_agree(r, &lora, 1, DIST_MAX, "agreeing on [finetune] method = auto's choice");
    if (lora == 0)
        return TRAIN_DONE;
    char a[16], b[16];
    if (held == 1)
        snprintf(r->mem.method_why, sizeof r->mem.method_why, "method = auto: the checkpoint holds adapters");
    else
        snprintf(r->mem.method_why, sizeof r->mem.method_why,
                 "method = auto: full fine-tuning needs %s at micro-batch 1, the job has %s",
                 units_format_size(need, a, sizeof a), units_format_size(budget, b, sizeof b));
    return rebuild_with_lora(r);
}

/* The state that lives as long as the job: parameters, gradients, Adam;
 * under LoRA the frozen base and the adapters' (alloc_lora). */
train_outcome memory_alloc(run *r)
{
    size_t P = r->m->num_params;
    if (r->m->lora) {
        if (alloc_lora(r) != TRAIN_DONE)
            return TRAIN_FAILED;
    } else {
        r->mem.params = alloc_tagged(r, P * sizeof(float), POOL_TAG_PARAMS, "parameters");
        if (!r->mem.params)
            return TRAIN_FAILED;
        r->mem.grads = alloc_tagged(r, P * sizeof(float), POOL_TAG_GRADS, "gradients");
        if (!r->mem.grads)
            return TRAIN_FAILED;
        size_t first, n;
        opt_share(r, P, &first, &n);
        r->mem.opt = alloc_tagged(r, 2 * n * sizeof(float), POOL_TAG_OPTIMIZER, "optimizer state");
        if (!r->mem.opt)
            return TRAIN_FAILED;
        if (r->m->needs_params16) {
            r->mem.params16 = alloc_tagged(r, P * sizeof(uint16_t), POOL_TAG_PARAMS, "16-bit parameters");
            if (!r->mem.params16)
                return TRAIN_FAILED;
        }
        r->mem.trained = (run_trained){r->mem.params, r->mem.grads, r->mem.opt, r->mem.params16,
                                       segments(r->m->tensors, r->m->ntensors), r->m->ntensors, P, first, n, NULL, 0};
    }
    if (!r->mem.trained.segs || !cut_segments(&r->mem.trained))
        return run_fail(r, "out of host memory for the optimizer's tensor list");
    r->m->params = r->mem.params;
    r->m->params16 = r->mem.params16;
    r->m->grads = r->mem.grads;
    r->m->recompute = r->j->recompute == JOBCFG_RECOMPUTE_ON && r->m->kind->recomputes;
    if (r->m->recompute) {
        snprintf(r->mem.recompute_why, sizeof r->mem.recompute_why, "on in the job file");
        char rc[96];
        snprintf(rc, sizeof rc, "recompute (%s)", r->mem.recompute_why);
        set_levers(r, rc);
    } else {
        set_levers(r, NULL);
    }
    r->mem.persistent = 0;
    void *held[] = {r->mem.params, r->mem.grads, r->mem.opt, r->mem.params16, r->mem.base32, r->mem.adapters,
                    r->mem.adapter_grads};
    for (size_t i = 0; i < sizeof held / sizeof held[0]; i++)
        r->mem.persistent += pool_block_size(r->p, held[i]);
    r->res->persistent_bytes = r->mem.persistent;

    size_t fixed, per;
    r->m->ops->activation_bytes(r->m, &fixed, &per);
    r->mem.act_fixed = r->res->act_fixed = fixed;
    r->mem.act_per = r->res->act_per_sample = per;
    return TRAIN_DONE;
}

/* fp32 to the job's 16-bit type (fp16, else bf16), and back. */
static void to16(run *r, uint16_t *dst, const float *src, size_t n)
{
    if (r->j->precision == JOBCFG_FP16)
        r->k->cast_f32_to_f16(r->kc, dst, src, n);
    else
        r->k->cast_f32_to_bf16(r->kc, dst, src, n);
}

static void from16(run *r, float *dst, const uint16_t *src, size_t n)
{
    if (r->j->precision == JOBCFG_FP16)
        r->k->cast_f16_to_f32(r->kc, dst, src, n);
    else
        r->k->cast_bf16_to_f32(r->kc, dst, src, n);
}

/* params16 = params rounded (model.h), after anything but the optimizer
 * wrote params: initialisation and a checkpoint's load.  A frozen 16-bit
 * base is not one of these: it has no fp32 copy, and is cast once when it
 * is loaded (memory_base_from_host). */
void memory_refresh_params16(run *r)
{
    const run_trained *t = &r->mem.trained;
    if (!t->params16)
        return;
    to16(r, t->params16, t->params, t->count);
}

/* A 16-bit base moves between host fp32 and params16 this many floats at a
 * time through device scratch: a large model's whole table in fp32 would
 * need twice its 16-bit size of device memory on top. */
#define BASE_CHUNK ((size_t)16 << 20) /* 64 MiB of fp32 */

/* Device scratch for up to `n` floats of a chunk (the host memory itself
 * on the cpu backend: *scratch NULL then).  0, or -1 with err. */
static int chunk_scratch(run *r, size_t n, float **scratch, char *err, size_t err_len)
{
    *scratch = NULL;
    if (r->host_visible)
        return 0;
    pool_oom_report oom;
    *scratch = pool_alloc(r->p, (n < BASE_CHUNK ? n : BASE_CHUNK) * sizeof(float), POOL_TAG_WORKSPACE, r->job,
                          &oom);
    if (*scratch)
        return 0;
    snprintf(err, err_len, "out of memory for converting the base model to 16 bits: %s", oom.message);
    return -1;
}

static int device_ok(run *r, const char *what, char *err, size_t err_len)
{
    if (r->k->sync(r->kc) == KERN_OK)
        return 0;
    snprintf(err, err_len, "the device failed %s: %s", what, r->k->error(r->kc));
    return -1;
}

int memory_base_from_host(run *r, const float *host, char *err, size_t err_len)
{
    size_t P = r->m->num_params;
    if (r->mem.params) {
        if (!r->host_visible || host != r->mem.params)
            r->k->copy_h2d(r->kc, r->mem.params, host, P * sizeof(float));
        return device_ok(r, "loading the parameters", err, err_len);
    }
    float *scratch;
    if (chunk_scratch(r, P, &scratch, err, err_len) != 0)
        return -1;
    int rc = 0;
    for (size_t at = 0; at < P && rc == 0; at += BASE_CHUNK) {
        size_t n = P - at < BASE_CHUNK ? P - at : BASE_CHUNK;
        const float *src = host + at;
        if (scratch) {
            r->k->copy_h2d(r->kc, scratch, src, n * sizeof(float));
            src = scratch;
        }
        to16(r, r->mem.params16 + at, src, n);
        /* The scratch is reused: the cast must have read it. */
        if (scratch)
            rc = device_ok(r, "casting the base model to 16 bits", err, err_len);
    }
    pool_free(r->p, scratch);
    if (rc != 0)
        return -1;
    const lora *l = r->m->lora;
    for (int i = 0; l && i < l->nkeep; i++)
        r->k->copy_h2d(r->kc, r->mem.base32 + l->keep_at[i], host + l->keep_off[i], l->keep_n[i] * sizeof(float));
    return device_ok(r, "loading the base model", err, err_len);
}

int memory_base_to_host(run *r, float *host, char *err, size_t err_len)
{
    size_t P = r->m->num_params;
    if (r->mem.params) {
        r->k->copy_d2h(r->kc, host, r->mem.params, P * sizeof(float));
        return device_ok(r, "reading the parameters", err, err_len);
    }
    float *scratch;
    if (chunk_scratch(r, P, &scratch, err, err_len) != 0)
        return -1;
    for (size_t at = 0; at < P; at += BASE_CHUNK) {
        size_t n = P - at < BASE_CHUNK ? P - at : BASE_CHUNK;
        float *dst = scratch ? scratch : host + at;
        from16(r, dst, r->mem.params16 + at, n);
        if (scratch)
            r->k->copy_d2h(r->kc, host + at, scratch, n * sizeof(float));
    }
    pool_free(r->p, scratch);
    /* The tensors the kernels read in fp32 are exact there, not rounded. */
    const lora *l = r->m->lora;
    for (int i = 0; l && i < l->nkeep; i++)
        r->k->copy_d2h(r->kc, host + l->keep_off[i], r->mem.base32 + l->keep_at[i], l->keep_n[i] * sizeof(float));
    return device_ok(r, "reading the base model", err, err_len);
}

void memory_free(run *r)
{
    free_micro(r);
    void *bufs[] = {r->mem.opt, r->mem.grads, r->mem.params, r->mem.params16, r->mem.base32, r->mem.adapters,
                    r->mem.adapter_grads};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        pool_free(r->p, bufs[i]);
    free(r->mem.x_host);
    free(r->mem.y_host);
    free(r->mem.aux_host);
    if (r->mem.trained.opt_segs != r->mem.trained.segs)
        free(r->mem.trained.opt_segs);
    free(r->mem.trained.segs);
    r->mem.trained.segs = r->mem.trained.opt_segs = NULL;
}

/* ---- the batch controller at work ------------------------------------------------------ */

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
    char fix[512];
    const char *lora = lora_hint(r);
    if (oom->job_limit_hit || (r->j->mem_limit && need > r->j->mem_limit))
        snprintf(fix, sizeof fix, "raise [memory] limit from %s to at least %s, %strain a smaller model%s",
                 units_format_size(oom->job_limit_hit ? oom->job_limit : r->j->mem_limit, lim, sizeof lim),
                 need_s, lora[0] ? "" : "or ", lora);
    else
        snprintf(fix, sizeof fix,
                 "free memory on %s (other processes or jobs hold it; the job needs about %s), run it on "
                 "another device ([job] device), %strain a smaller model ([model] width, layers or context)%s",
                 pool_device(r->p)->id, need_s, lora[0] ? "" : "or ", lora);
    char ck[160];
    if (checkpoint_exists(r))
        snprintf(ck, sizeof ck, "the last checkpoint in %s is kept; resubmit to resume from it", r->j->out_dir);
    else
        snprintf(ck, sizeof ck, "no checkpoint was written yet ([output] checkpoint_every)");
    if (r->mem.last_oom_host)
        return run_fail(r,
                        "out of memory at micro-batch 1 in step %llu: %s; in use by the job on %s: %s.\n"
                        "To fix: free host memory (other processes hold it), or train a smaller model ([model] "
                        "width, layers or context).\n%s.",
                        (unsigned long long)r->progress.step + 1, oom->message, pool_device(r->p)->id,
                        used[0] ? used : "nothing", ck);
    return run_fail(r,
                    "out of memory at micro-batch 1 in step %llu: requested %s (%s); in use by the job: %s; "
                    "device free %s of %s.\nTo fix: %s.\n%s.\nPool: %s",
                    (unsigned long long)r->progress.step + 1, units_format_size(oom->requested, a, sizeof a),
                    pool_tag_name(oom->tag), used[0] ? used : "nothing",
                    units_format_size(oom->device_free, b, sizeof b),
                    units_format_size(oom->device_total, lim, sizeof lim), fix, ck, oom->message);
}

/* ---- activation recomputation ----------------------------------------------------- */

/* The model's activation layout with recompute on or off, and the estimate
 * the controller starts from with it.  No micro-batch may be bound. */
static void set_recompute(run *r, bool on)
{
    size_t fixed, per;
    r->m->recompute = on;
    r->m->ops->activation_bytes(r->m, &fixed, &per);
    r->mem.act_fixed = r->res->act_fixed = fixed;
    r->mem.act_per = r->res->act_per_sample = per;
    r->prog.recompute = on;
}

/* Recompute on or off, and why, as gradctl status shows it ("levers") and
 * the checkpoint keeps it; `also` follows the reason inside the brackets. */
static void set_recompute_why(run *r, bool on, const char *why, const char *also)
{
    set_recompute(r, on);
    snprintf(r->mem.recompute_why, sizeof r->mem.recompute_why, "%s", on ? why : "");
    char rc[128];
    snprintf(rc, sizeof rc, "recompute (%s%s)", why, also);
    set_levers(r, on ? rc : NULL);
}

/* recompute = auto's lever: micro-batch 1 does not fit without it. */
static bool recompute_may_turn_on(const run *r)
{
    return r->j->recompute == JOBCFG_RECOMPUTE_AUTO && r->m->kind->recomputes && !r->m->recompute;
}

static train_outcome choose_micro(run *r, batch_reason why);

/* Micro-batch 1 did not fit: find the micro-batch again with recompute on
 * (probing, unless micro_batch is fixed), reported as a change for the
 * reason recompute.  Should that not fit either, the job fails as it would
 * have. */
static train_outcome turn_recompute_on(run *r)
{
    free_micro(r);
    set_recompute_why(r, true, "micro-batch 1 did not fit", "");
    return choose_micro(r, BATCH_REASON_RECOMPUTE);
}

/* After an OOM: shrink until the per-micro-batch memory fits again. */
static train_outcome after_oom(run *r)
{
    pool_oom_report rep = r->mem.last_oom;
    for (;;) {
        size_t avail, bud = job_budget(r, &avail);
        uint32_t n = batch_on_oom(&r->ctl, r->progress.step, bud, avail, r->mem.oom_bound);
        if (n == 0 && recompute_may_turn_on(r))
            return turn_recompute_on(r);
        if (n == 0)
            return fail_no_fit(r, &rep);
        int rc = set_micro(r, n, POOL_TRIM_OOM);
        outputs_batch_change(r);
        if (rc == 0)
            return TRAIN_DONE;
        rep = r->mem.last_oom;
    }
}

/* Wait for the queued device work: 0; 1 when it ran out of memory
 * (r->mem.oom then set, with a report); -1 when the device failed otherwise
 * (the run failed, with the kernels' message).  A faulting kernel or a GEMM without
 * an algorithm is not cured by a smaller micro-batch: treated as an OOM it
 * would shrink down to 1 and end as "does not fit". */
int memory_device_check(run *r, const char *during)
{
    int e = r->k->sync(r->kc);
    if (e == KERN_ERR_DEVICE) {
        run_fail(r, "the device failed %s: %s", during, r->k->error(r->kc));
        return -1;
    }
    if (e == KERN_ERR_OOM && !r->mem.oom) {
        /* Memory the pool did not hand out (a library's own). */
        r->mem.oom = true;
        r->mem.last_oom_host = false;
        memset(&r->mem.last_oom, 0, sizeof r->mem.last_oom);
        r->mem.last_oom.job = r->job;
        r->mem.last_oom.job_allocated = job_peak(r);
        snprintf(r->mem.last_oom.message, sizeof r->mem.last_oom.message,
                 "the device ran out of memory outside the pool: %s", r->k->error(r->kc));
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
        *peak = r->mem.oom_bound;
        return 1;
    }
    uint64_t epoch, index;
    data_stream_state(&r->data.stream, &epoch, &index);
    pool_job_reset_peak(r->p, r->job);
    r->mem.oom = false;
    model_batch mb;
    run_next_batch(r, n, false, &mb, NULL);
    run_forward_backward(r, &mb, 1.0f / (float)(n * r->m->ops->units_per_sample(r->m)));
    if (memory_device_check(r, "while measuring a micro-batch's memory") < 0)
        return -1;
    *peak = job_peak(r);
    r->k->zero(r->kc, r->mem.trained.grads, r->mem.trained.count);
    char err[512];
    if (data_stream_set_state(&r->data.stream, epoch, index, err, sizeof err) != 0) {
        run_fail(r, "%s", err);
        return -1;
    }
    bool oom = memory_oom_agree(r, r->mem.oom);
    r->mem.oom = false;
    if (oom) {
        *peak = r->mem.oom_bound;
        return 1;
    }
    /* The largest peak among the ranks: the size must fit on each. */
    if (r->dist) {
        double v = (double)*peak;
        run_agree(r, &v, 1, DIST_MAX, "agreeing on a micro-batch's peak");
        *peak = (size_t)v;
    }
    return 0;
}

/* Does what the checkpoint's run found (r->ckpt.found) still apply?  Only on the
 * same device and under the same budget (within 2%, the controller's
 * tolerance for "nothing changed"): a changed [memory] limit, a device with
 * more or less memory, or other jobs holding more or less of it all change
 * what fits, and a new search costs a few probes. */
static bool found_still_holds(run *r, size_t budget)
{
    char devsig[96];
    checkpoint_device_signature(r, devsig, sizeof devsig);
    double was = (double)r->ckpt.found.budget, now = (double)budget;
    double holds = r->ckpt.found.fit && strcmp(r->ckpt.found.device, devsig) == 0 && now >= 0.98 * was &&
                   now <= 1.02 * was;
    /* Rank 0's device wrote it: every rank resumes the search as one, or
     * none does (their probes are collectives). */
    run_agree(r, &holds, 1, DIST_MIN, "agreeing on the checkpoint's micro-batch");
    return holds > 0;
}

/* Choose the first micro-batch: the configured one; by probing; or, when
 * resuming, the size the checkpoint's run had found, verified by one probe.
 * Then allocate for it (shrinking if even that does not fit).  why: FIT, or
 * RECOMPUTE when recompute was just turned on for it, or TUNING for the
 * size recompute lets fit, which is to be timed (probed afresh, not tuned:
 * the timing is recompute's trial). */
static train_outcome choose_micro_fitting(run *r, batch_reason why)
{
    const job_config *j = r->j;
    batch_ctl *c = &r->ctl;
    uint32_t from = c->micro;
    /* A refit for recompute goes on counting the run's changes and OOMs. */
    uint64_t changes = c->changes, ooms = c->oom_recoveries;
    batch_init(c, r->rank_batch, j->micro_batch ? j->micro_batch : r->rank_batch, j->margin, j->grow_after);
    batch_set_tune(c, j->tune && !j->micro_batch && why != BATCH_REASON_TUNING);
    /* The prior: the estimate, plus the input buffers, as the pool rounds. */
    size_t data_per = r->data.x_bytes + r->data.y_bytes + r->data.aux_bytes, bufs = r->data.aux_bytes ? 3 : 2;
    batch_prior(c, r->mem.persistent + r->mem.act_fixed + bufs * 512, r->mem.act_per + data_per);
    batch_min_per_sample(c, r->mem.act_per + data_per);
    size_t budget = job_budget(r, &c->fit_avail);
    if (j->micro_batch) {
        batch_probe_skip(c, budget);
    } else {
        if (why != BATCH_REASON_TUNING && found_still_holds(r, budget))
            batch_resume(c, r->ckpt.found.fit, r->ckpt.found.tuned, r->ckpt.found.fixed, r->ckpt.found.per_sample);
        for (uint32_t n; (n = batch_probe_next(c, budget)) != 0;) {
            size_t peak = 0;
            int rc = probe(r, n, &peak);
            if (rc < 0)
                return TRAIN_FAILED;
            if (rc == 1)
                batch_probe_largest(c, r->mem.oom_largest);
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
    if (why == BATCH_REASON_RECOMPUTE || why == BATCH_REASON_TUNING) {
        batch_refit_as(c, from, r->progress.step, why);
        c->changes = changes + 1;
        c->oom_recoveries = ooms;
    }
    /* The first fit of a job that auto put on LoRA says so, probed or not. */
    if (why == BATCH_REASON_LORA)
        batch_refit_as(c, from, r->progress.step, why);
    if (!j->micro_batch || why == BATCH_REASON_RECOMPUTE || why == BATCH_REASON_LORA)
        outputs_batch_change(r);
    if (set_micro(r, c->micro, -1) != 0 && after_oom(r) != TRAIN_DONE)
        return TRAIN_FAILED;
    outputs_sync(r);
    return TRAIN_DONE;
}

/* The pool's fit lock: a job decides a size from what the others need and
 * allocates for it as one step, so two jobs cannot both count the same free
 * bytes.  Taken once: a fit may start another (recompute), and a change of
 * size may lead to a fit.  true when this call took it. */
static bool fit_lock(run *r)
{
    if (r->mem.fitting)
        return false;
    pool_fit_begin(r->p);
    r->mem.fitting = true;
    return true;
}

static void fit_unlock(run *r, bool took)
{
    if (!took)
        return;
    r->mem.fitting = false;
    pool_fit_end(r->p);
}

static train_outcome choose_micro(run *r, batch_reason why)
{
    bool took = fit_lock(r);
    train_outcome o = choose_micro_fitting(r, why);
    fit_unlock(r, took);
    return o;
}

train_outcome memory_choose_micro(run *r)
{
    pool_config pc;
    pool_get_config(r->p, &pc);
    r->mem.low_watermark = pc.low_watermark;
    /* What auto chose in the run that wrote the checkpoint: its fit was
     * found with it, and without it the first step would not fit. */
    if (r->ckpt.recompute && recompute_may_turn_on(r))
        set_recompute_why(r, true, r->ckpt.recompute_why[0] ? r->ckpt.recompute_why : "in the checkpoint",
                          "; kept on resume");
    r->prog.recompute = r->m->recompute;
    return choose_micro(r, r->mem.method_why[0] ? BATCH_REASON_LORA : BATCH_REASON_FIT);
}

/* ---- recompute = auto's second lever ---------------------------------------------- */

/* The step just finished took this long (a test's hook may say otherwise:
 * train.h's step_seconds). */
static double step_seconds(run *r)
{
    double s = r->progress.step_s;
    if (r->hooks && r->hooks->step_seconds)
        s = r->hooks->step_seconds(r->hooks->user, r->mem.micro, r->m->recompute, s);
    /* A step of several ranks takes as long as the slowest one. */
    run_agree(r, &s, 1, DIST_MAX, "agreeing on the step time");
    return s;
}

/* The samples/s tuning measured at the size it chose; 0: not measured. */
static double tuned_rate(const batch_ctl *c)
{
    for (int i = 0; i < c->ncand; i++)
        if (c->cand[i] == c->best)
            return c->rate[i];
    return 0;
}

/* The largest size the line tuning's fit measured, less what recompute
 * saves, predicts for recompute: whether a probe is worth it at all. */
static uint32_t predict_with_recompute(run *r)
{
    size_t fixed_on, per_on;
    r->m->recompute = true;
    r->m->ops->activation_bytes(r->m, &fixed_on, &per_on);
    r->m->recompute = false;
    batch_ctl guess = r->ctl;
    guess.fixed -= (double)r->mem.act_fixed - (double)fixed_on;
    guess.per_sample -= (double)r->mem.act_per - (double)per_on;
    if (guess.per_sample <= 0)
        return guess.ceiling;
    return batch_max_for(&guess, (double)job_budget(r, NULL) * (1.0 - guess.margin));
}

/* Tuning chose the fastest size without recompute.  A larger size may fit
 * with it and run at more samples/s (larger GEMMs, fewer micro-batches),
 * which can pay for the forward it does twice: fit that size with
 * recompute on and time it (trial_step), if it is larger than any size
 * that fits without. */
static train_outcome trial_begin(run *r)
{
    run_recompute_trial *t = &r->mem.trial;
    batch_ctl *c = &r->ctl;
    if (t->state != RUN_TRIAL_NONE || !recompute_may_turn_on(r))
        return TRAIN_DONE;
    t->state = RUN_TRIAL_DONE;
    double rate = tuned_rate(c);
    if (rate <= 0 || c->max_fit >= c->batch || predict_with_recompute(r) <= c->max_fit)
        return TRAIN_DONE;
    t->off = *c;
    t->rate_off = rate;
    free_micro(r);
    set_recompute_why(r, true, "timing it", "");
    train_outcome o = choose_micro(r, BATCH_REASON_TUNING);
    if (o != TRAIN_DONE)
        return o;
    t->on = c->micro;
    t->seen = 0;
    t->fastest = 0;
    t->state = RUN_TRIAL_TIMING;
    char rc[96];
    snprintf(rc, sizeof rc, "recompute (timing micro-batch %u against %u without)", t->on, t->off.micro);
    set_levers(r, rc);
    return TRAIN_DONE;
}

/* Recompute is not faster (or its trial was cut short): back to the tuned
 * size without it, and the controller as tuning left it. */
static train_outcome trial_back(run *r)
{
    run_recompute_trial *t = &r->mem.trial;
    uint32_t from = r->mem.micro;
    t->state = RUN_TRIAL_DONE;
    free_micro(r);
    set_recompute_why(r, false, "", "");
    r->ctl = t->off;
    batch_lever(&r->ctl, from, t->off.micro, r->progress.step, BATCH_REASON_TUNED);
    outputs_batch_change(r);
    if (set_micro(r, r->ctl.micro, POOL_TRIM_OOM) != 0)
        return after_oom(r);
    return TRAIN_DONE;
}

/* A step boundary while timing recompute, as tuning times a size: the
 * fastest of BATCH_TUNE_STEPS steps.  Memory pressure or an OOM in the
 * meantime ends the trial without recompute. */
static train_outcome trial_step(run *r)
{
    run_recompute_trial *t = &r->mem.trial;
    batch_ctl *c = &r->ctl;
    batch_reason why;
    size_t avail, bud = job_budget(r, &avail);
    double s = step_seconds(r);
    if (r->mem.micro != t->on || batch_step_end(c, r->progress.step, bud, avail, s, &why) != t->on)
        return trial_back(r);
    if (s > 0) {
        if (!t->seen || s < t->fastest)
            t->fastest = s;
        t->seen++;
        if (t->seen < BATCH_TUNE_STEPS) {
            outputs_sync(r);
            return TRAIN_DONE;
        }
    }
    double rate = t->seen ? (double)c->batch / t->fastest : 0;
    if (rate <= t->rate_off)
        return trial_back(r);
    t->state = RUN_TRIAL_DONE;
    char why_s[64];
    snprintf(why_s, sizeof why_s, "faster at micro-batch %u", t->on);
    snprintf(r->mem.recompute_why, sizeof r->mem.recompute_why, "%s", why_s);
    char rc[96];
    snprintf(rc, sizeof rc, "recompute (%s)", why_s);
    set_levers(r, rc);
    c->best = t->on;
    batch_lever(c, t->off.micro, t->on, r->progress.step, BATCH_REASON_RECOMPUTE);
    outputs_batch_change(r);
    return TRAIN_DONE;
}

/* At a step boundary: shrink before an OOM, grow back, or tune. */
static train_outcome adapt(run *r)
{
    if (r->mem.trial.state == RUN_TRIAL_TIMING)
        return trial_step(r);
    batch_reason why;
    uint32_t from = r->mem.micro;
    size_t avail, bud = job_budget(r, &avail);
    uint32_t n = batch_step_end(&r->ctl, r->progress.step, bud, avail, step_seconds(r), &why);
    if (n == from) {
        /* The tuner's choice is an event even when it keeps the size. */
        if (why != BATCH_REASON_NONE)
            outputs_batch_change(r);
        else
            outputs_sync(r);
        return why == BATCH_REASON_TUNED ? trial_begin(r) : TRAIN_DONE;
    }
    if (set_micro(r, n, why == BATCH_REASON_PRESSURE ? POOL_TRIM_PRESSURE : -1) == 0) {
        outputs_batch_change(r);
        return why == BATCH_REASON_TUNED ? trial_begin(r) : TRAIN_DONE;
    }
    /* The memory went elsewhere between the decision and the allocation:
     * stay where we were, or shrink as after an OOM. */
    batch_apply_failed(&r->ctl, n, from);
    if (set_micro(r, from, POOL_TRIM_OOM) == 0) {
        outputs_sync(r);
        return TRAIN_DONE;
    }
    return after_oom(r);
}

train_outcome memory_adapt(run *r)
{
    bool took = fit_lock(r);
    train_outcome o = adapt(r);
    fit_unlock(r, took);
    return o;
}

train_outcome memory_after_oom(run *r)
{
    bool took = fit_lock(r);
    train_outcome o = after_oom(r);
    fit_unlock(r, took);
    return o;
}
