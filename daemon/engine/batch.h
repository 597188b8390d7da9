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
 * engine measures in the pool.  It decides; the engine (memory.c) does the
 * memory work and reports back.  Keeping the decisions here, free of the
 * pool and the kernels, lets tests and benchmarks drive them directly.
 *
 *   probing   batch_probe_next / batch_probe_result: at most BATCH_MAX_PROBES
 *             micro-batches — two small sizes to fit the line, then the
 *             predicted maximum to verify it.
 *   OOM       batch_on_oom: a smaller micro-batch for the redone step, or 0
 *             when micro-batch 1 did not fit either.
 *   tuning    (batch_set_tune; micro_batch = auto) after the fit, the largest
 *             size that fits is not always the fastest: on a CPU a smaller
 *             micro-batch keeps its activations in cache.  The first steps
 *             run at a few candidates at or below the fit (batch_tune_candidates)
 *             and the controller keeps the one with the most samples per
 *             second.  These are real training steps — any split of the
 *             effective batch gives the same update up to reassociation — so
 *             the search costs only the difference in speed.  The engine
 *             times the steps and passes the time to batch_step_end; the
 *             controller never reads a clock, so tests can give it any cost.
 *   resume    batch_resume: a job resumed from a checkpoint under the same
 *             device and budget starts from what its earlier run found —
 *             the size that fit and the tuned size — verified with one probe
 *             instead of searching and tuning again.
 *   steps     batch_step_end: at every step boundary, given the budget now,
 *             shrink before an OOM (the budget fell under the current need)
 *             or grow back after grow_after steps of stable headroom, never
 *             beyond the largest micro-batch found to fit, nor beyond the
 *             tuned size — unless the budget has grown well past the one
 *             the fit was found under (BATCH_REFIT_GROWTH): a job that
 *             started while another job or process held the memory then
 *             grows to what the budget now allows, as a new fit, and tunes
 *             again among the sizes that opens up.
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

/* Tuning: candidates at most; steps not timed after each change; steps
 * timed per candidate, of which the fastest counts; the fraction of the
 * best rate under which a candidate is clearly slower; and how many clearly
 * slower candidates in a row end the search — throughput falls steadily on
 * either side of its peak, so the smaller sizes after it are slower still,
 * but one noisy measurement must not end the search before the peak.
 *
 * The fastest of 3 rather than skipping a warm-up step: the first step
 * after a change pays for allocation, page faults and cold caches, and
 * other work on the machine only ever makes a step slower, so the minimum
 * drops both; on a shared CPU a step's time varies by a third from one
 * step to the next (preemption), which one timed step could not see
 * through.  Each candidate thus costs 3 steps at its own speed. */
#define BATCH_TUNE_MAX 8
#define BATCH_TUNE_WARM 0
#define BATCH_TUNE_STEPS 3
#define BATCH_TUNE_SLOWER 0.95
#define BATCH_TUNE_PATIENCE 2

/* How far the budget must grow past the one the fit was found under before
 * growth may go beyond that fit (and the size tuned below it): far enough
 * that the ordinary wobble of what other jobs hold does not re-tune. */
#define BATCH_REFIT_GROWTH 1.10

typedef enum {
    BATCH_REASON_NONE = 0,
    BATCH_REASON_FIT,      /* chosen by probing at the start */
    BATCH_REASON_OOM,      /* shrunk to redo a step that ran out of memory */
    BATCH_REASON_PRESSURE, /* shrunk before an OOM: the budget fell (another process or job) */
    BATCH_REASON_GROW,     /* grew back after stable headroom */
    BATCH_REASON_TUNING,   /* a candidate size to time, after the fit */
    BATCH_REASON_TUNED,    /* the fastest candidate: recorded even when it is the size running */
    BATCH_REASON_RECOMPUTE, /* activation recomputation on: micro-batch 1 did not fit without it, or a
                             * larger size runs faster with it (memory.c) */
    BATCH_REASON_LORA,      /* the first fit of a job that [finetune] method = auto put on LoRA adapters:
                             * micro-batch 1 of the whole model did not fit */
    BATCH_REASON_COUNT
} batch_reason;

/* "fit", "oom", "pressure", "grow", "tuning", "tuned", "recompute", "lora"; "" for none */
const char *batch_reason_name(batch_reason r);

typedef enum {
    BATCH_TUNE_OFF = 0, /* not asked for, or over before it began (pressure, an OOM) */
    BATCH_TUNE_WAIT,    /* asked for: starts at the first step boundary after the fit */
    BATCH_TUNE_RUN,     /* timing the candidates */
    BATCH_TUNE_DONE,    /* c->best holds the choice */
} batch_tune_state;

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
    double min_per_sample;             /* batch_min_per_sample; 0: none */
    batch_point pts[BATCH_MAX_PROBES]; /* measured, n ascending */
    int npts;
    batch_point bound;                 /* the largest peak known to be exceeded (an OOM); n 0: none */

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

    /* tuning for throughput */
    batch_tune_state tune;
    uint32_t cand[BATCH_TUNE_MAX]; /* descending: the fitted size first */
    double rate[BATCH_TUNE_MAX];   /* samples/s measured at each; 0: not measured */
    int ncand, ci;                 /* candidates; the one running */
    uint32_t tune_skip, tune_seen; /* steps still to skip at cand[ci]; steps measured there */
    uint32_t tune_slower;          /* clearly slower candidates in a row */
    double tune_fastest;           /* the fastest measured step at cand[ci], seconds */
    uint32_t best;                 /* the tuned size (0: none); growth returns to it, not beyond */
    bool tune_on;                  /* tuning was asked for (batch_set_tune): a refit tunes again */

    /* resuming (batch_resume) */
    uint32_t resume_n;   /* the size to verify with the next probe (0: none, or done) */
    uint32_t resume_fit; /* the earlier run's largest size found to fit */
    bool resume_tuned;   /* resume_n is the earlier run's tuned size */
} batch_ctl;

/* ceiling: the largest micro-batch allowed (batch for auto, N for a fixed
 * micro_batch, which then starts at N and only shrinks under memory
 * pressure).  micro starts at the ceiling; probing, if used, replaces it. */
void batch_init(batch_ctl *c, uint32_t batch, uint32_t ceiling, double margin, uint64_t grow_after);
/* Tune for throughput after the fit (off after batch_init).  For
 * micro_batch = auto only: a fixed size is the person's choice. */
void batch_set_tune(batch_ctl *c, bool on);
/* The sizes tuning tries, into out[cap], descending: `max` itself, then
 * ceil(batch / a) for a = ceil(batch / max) doubling — the batch split
 * evenly into as many micro-batches as max needs, then twice as many, and
 * so on down to 1, so no candidate but max leaves a ragged last
 * micro-batch when the batch is a power of two (or a multiple of the
 * split).  Returns how many. */
int batch_tune_candidates(uint32_t batch, uint32_t max, uint32_t *out, int cap);
/* The engine's estimate of peak(n), used until measurements replace it. */
void batch_prior(batch_ctl *c, size_t fixed, size_t per_sample);
/* What each sample itself requests, which peak(n) grows by at least.  The
 * pool rounds blocks (a large block keeps a leftover of up to 1 MiB), so
 * two measured peaks can lie on a shallower line than the truth; a slope
 * under this one is rounding, not the model, and would predict sizes that
 * do not fit. */
void batch_min_per_sample(batch_ctl *c, size_t per_sample);
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
 * memory, and peak is what the job held plus what it asked for when it
 * did, a bound the true peak exceeds; 0 when unknown). */
uint32_t batch_probe_next(batch_ctl *c, size_t budget);
void batch_probe_result(batch_ctl *c, uint32_t n, size_t peak, bool ok, size_t budget);
/* Before the result of a probe that ran out of memory: no size above n can
 * be handed its memory now, whatever the line says (the pool has no block
 * that large: its free bytes lie in pieces), so the search stays at or
 * below n.  UINT32_MAX: no such limit known. */
void batch_probe_largest(batch_ctl *c, uint32_t n);
/* Resuming a job whose earlier run probed (and maybe tuned) on the same
 * device under the same budget: what that run found replaces the search —
 * `fit` the largest size found to fit, `tuned` the size tuning chose (0:
 * none or not finished; ignored when tuning is off), and its fitted line
 * peak(n) = fixed + per_sample × n.  The next batch_probe_next returns the
 * one size the job will run (tuned, else fit) to verify; if that probe fits,
 * probing is over at it (max_fit = fit), and tuning too when it was the
 * tuned size (the change is recorded as BATCH_REASON_TUNED, else FIT); if
 * not, the measurement joins the line and probing searches as for a new
 * job.  Call after batch_init, batch_set_tune and batch_prior. */
void batch_resume(batch_ctl *c, uint32_t fit, uint32_t tuned, double fixed, double per_sample);
/* After a fit made because recompute was turned on (the engine's lever):
 * the change to c->micro is reported as one from `from`, in place of the
 * fit's own, for the reason `why` — RECOMPUTE when micro-batch 1 did not
 * fit without it (from: the size that did not), TUNING for the larger size
 * it lets fit, which the engine then times (from: the tuned size). */
void batch_refit_as(batch_ctl *c, uint32_t from, uint64_t step, batch_reason why);
/* The engine's decision after timing recompute: a change from `from` to
 * `to`, RECOMPUTE when it keeps it (the size stays), TUNED when it goes
 * back to the tuned size without it. */
void batch_lever(batch_ctl *c, uint32_t from, uint32_t to, uint64_t step, batch_reason why);
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
 * again.  `bound` is what the job held plus what it asked for when it ran
 * out (0: unknown): the peak at this size is above it, which lifts the
 * model's line there. */
uint32_t batch_on_oom(batch_ctl *c, uint64_t step, size_t budget, size_t avail, size_t bound);

/* At a step boundary, with the budget as it is now: the micro-batch the next
 * step should run (c->micro unchanged when nothing changes), with *why the
 * reason (BATCH_REASON_NONE for no change; BATCH_REASON_TUNED may keep the
 * size).  `step_s` is how long the step just finished took at c->micro
 * (its forward, backward and optimizer work, in seconds; <= 0: not timed,
 * which ends tuning with what was measured so far).  The engine applies the
 * size, and calls batch_apply_failed if it could not. */
uint32_t batch_step_end(batch_ctl *c, uint64_t step, size_t budget, size_t avail, double step_s,
                        batch_reason *why);
/* The engine could not allocate for the size batch_step_end chose: stay at
 * `back`, and treat the size tried as not fitting from now on. */
void batch_apply_failed(batch_ctl *c, uint32_t tried, uint32_t back);

#endif
