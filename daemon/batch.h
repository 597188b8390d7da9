/* batch.h — the batch controller: which micro-batch a job runs, and when
 * that changes.
 *
 * The effective batch (samples per optimizer step) never changes; only its
 * split into micro-batches × accumulation does.  The controller models the
 * job's peak memory during one micro-batch as
 *
 *     peak(n) = fixed + per_sample × n       (bytes, the job's pool peak)
 *
 * starting from the model's estimate (the prior) and refitted from peaks the
 * engine measures in the pool.  It decides; the engine (train.c) does the
 * memory work and reports back.  Keeping the decisions here, free of the
 * pool and the kernels, lets tests and benchmarks drive them directly.
 *
 *   probing   batch_probe_next / batch_probe_result: at most BATCH_MAX_PROBES
 *             micro-batches — two small sizes to fit the line, then the
 *             predicted maximum to verify it.
 *   OOM       batch_on_oom: a smaller micro-batch for the redone step, or 0
 *             when micro-batch 1 did not fit either.
 *   steps     batch_step_end: at every step boundary, given the budget now,
 *             shrink before an OOM (the budget fell under the current need)
 *             or grow back after grow_after steps of stable headroom, never
 *             beyond the largest micro-batch found to fit.
 *
 * Budgets are the bytes the job may hold at its peak (its limit, or its
 * share of what the device can give the pool); the controller keeps
 * `margin` of them free when it chooses a size, and shrinks only when the
 * need exceeds the whole budget, so a small wobble does not flip the size
 * back and forth.
 */
#ifndef GRADD_BATCH_H
#define GRADD_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BATCH_MAX_PROBES 3

typedef enum {
    BATCH_REASON_NONE = 0,
    BATCH_REASON_FIT,      /* chosen by probing at the start */
    BATCH_REASON_OOM,      /* shrunk to redo a step that ran out of memory */
    BATCH_REASON_PRESSURE, /* shrunk before an OOM: the budget fell (another process or job) */
    BATCH_REASON_GROW,     /* grew back after stable headroom */
    BATCH_REASON_COUNT
} batch_reason;

const char *batch_reason_name(batch_reason r); /* "fit", "oom", "pressure", "grow"; "" for none */

typedef struct {
    uint32_t from, to;
    uint64_t step; /* the step boundary it happened at (0: before the first step) */
    batch_reason reason;
} batch_change;

typedef struct {
    uint32_t n;
    double peak;
} batch_point;

typedef struct batch_ctl {
    /* settings */
    uint32_t batch;      /* effective batch */
    uint32_t ceiling;    /* never above: batch, or micro_batch = N */
    double margin;       /* fraction of the budget kept free when choosing */
    uint64_t grow_after; /* steps of stable headroom before growing (0: never grow) */

    /* the model of peak(n) */
    double fixed, per_sample;
    batch_point pts[BATCH_MAX_PROBES]; /* measured, n ascending */
    int npts;

    /* probing */
    bool probing_done, verifying;
    uint32_t probes;
    uint32_t upper; /* largest size not known to fail */

    /* state */
    uint32_t micro;         /* current */
    uint32_t max_fit;       /* largest found to fit: growth stops there */
    uint32_t predicted_max; /* largest the model says fits the budget last seen */
    size_t fit_budget;      /* the budget max_fit was found under */
    size_t fit_avail;       /* and the memory available then (see batch_on_oom); the engine sets it */
    size_t blocked_avail;   /* after an OOM under pressure: no growth until more than this is available */
    bool blocked;
    uint64_t oom_recoveries;
    uint64_t stable_steps;
    uint64_t changes;
    batch_change last, before_last; /* before_last: to undo a change that could not be applied */
} batch_ctl;

/* ceiling: the largest micro-batch allowed (batch for auto, N for a fixed
 * micro_batch, which then starts at N and only shrinks under memory
 * pressure).  micro starts at the ceiling; probing, if used, replaces it. */
void batch_init(batch_ctl *c, uint32_t batch, uint32_t ceiling, double margin, uint64_t grow_after);
/* The engine's estimate of peak(n), used until measurements replace it. */
void batch_prior(batch_ctl *c, size_t fixed, size_t per_sample);
/* Micro-batches per step: ceil(batch / micro); the last one may be smaller. */
uint32_t batch_accum(uint32_t batch, uint32_t micro);
/* The model's peak for a micro-batch of n. */
double batch_peak(const batch_ctl *c, uint32_t n);
/* The largest n <= ceiling whose modelled peak fits `bytes` (no margin
 * applied); 0 when not even 1 does. */
uint32_t batch_max_for(const batch_ctl *c, double bytes);

/* The next size to probe, or 0 when probing is over (c->micro is then the
 * choice).  A probe runs one forward and backward of n samples and reports
 * the job's pool peak with batch_probe_result (ok false: it ran out of
 * memory, peak ignored). */
uint32_t batch_probe_next(batch_ctl *c, size_t budget);
void batch_probe_result(batch_ctl *c, uint32_t n, size_t peak, bool ok, size_t budget);
/* Skip probing (fixed micro-batch): micro = max_fit = ceiling. */
void batch_probe_skip(batch_ctl *c, size_t budget);

/* The step at `step` ran out of memory at the current micro-batch.  Returns
 * the smaller size to redo it with (also c->micro), or 0 when the micro-batch
 * is already 1.  `avail` is what the job could get regardless of its limit
 * (the device's and the pool's memory, less other jobs' needs): when neither
 * it nor the budget fell since the size was found, the size itself was
 * wrong, and growth stays below it from now on; when it fell, memory is
 * under pressure, and growth waits until more than `avail` is available —
 * the free memory the budget counts may be memory the job cannot use (slack
 * inside partly used segments), so the same reading is not a reason to try
 * again. */
uint32_t batch_on_oom(batch_ctl *c, uint64_t step, size_t budget, size_t avail);

/* At a step boundary, with the budget as it is now: the micro-batch the next
 * step should run (c->micro unchanged when nothing changes), with *why the
 * reason (BATCH_REASON_NONE for no change).  The engine applies it, and
 * calls batch_apply_failed if it could not. */
uint32_t batch_step_end(batch_ctl *c, uint64_t step, size_t budget, size_t avail, batch_reason *why);
/* The engine could not allocate for the size batch_step_end chose: stay at
 * `back`, and treat the size tried as not fitting from now on. */
void batch_apply_failed(batch_ctl *c, uint32_t tried, uint32_t back);

#endif
