/* batch.c — the batch controller's decisions (see batch.h). */
#include "batch.h"

#include <math.h>
#include <string.h>

const char *batch_reason_name(batch_reason r)
{
    static const char *const names[BATCH_REASON_COUNT] = {"",       "fit",    "oom",   "pressure", "grow",
                                                          "tuning", "tuned", "recompute", "lora"};
    return (unsigned)r < BATCH_REASON_COUNT ? names[r] : "";
}

void batch_init(batch_ctl *c, uint32_t batch, uint32_t ceiling, double margin, uint64_t grow_after)
{
    memset(c, 0, sizeof *c);
    c->batch = batch ? batch : 1;
    c->ceiling = ceiling && ceiling <= c->batch ? ceiling : c->batch;
    c->margin = margin >= 0 && margin < 1 ? margin : 0;
    c->grow_after = grow_after;
    c->upper = c->ceiling;
    c->micro = c->max_fit = c->predicted_max = c->ceiling;
}

void batch_set_tune(batch_ctl *c, bool on)
{
    c->tune = on ? BATCH_TUNE_WAIT : BATCH_TUNE_OFF;
    c->tune_on = on;
}

int batch_tune_candidates(uint32_t batch, uint32_t max, uint32_t *out, int cap)
{
    if (max == 0 || cap < 1)
        return 0;
    int n = 0;
    out[n++] = max;
    /* Once a reaches the batch the split is 1 and the loop ends; 64 bits
     * so the doubling cannot wrap before that. */
    for (uint64_t a = batch_accum(batch, max); n < cap && out[n - 1] > 1; a *= 2) {
        uint32_t m = (uint32_t)((batch + a - 1) / a); /* ceil(batch / a) */
        if (m < out[n - 1])
            out[n++] = m;
    }
    return n;
}

void batch_prior(batch_ctl *c, size_t fixed, size_t per_sample)
{
    c->fixed = (double)fixed;
    c->per_sample = per_sample ? (double)per_sample : 1.0;
}

void batch_min_per_sample(batch_ctl *c, size_t per_sample)
{
    c->min_per_sample = (double)per_sample;
    if (c->per_sample < c->min_per_sample)
        c->per_sample = c->min_per_sample;
}

uint32_t batch_accum(uint32_t batch, uint32_t micro)
{
    return micro ? (batch + micro - 1) / micro : 0;
}

double batch_peak(const batch_ctl *c, uint32_t n)
{
    return c->fixed + c->per_sample * (double)n;
}

uint32_t batch_max_for(const batch_ctl *c, double bytes)
{
    if (bytes < batch_peak(c, 1))
        return 0;
    double n = floor((bytes - c->fixed) / c->per_sample);
    return n >= (double)c->ceiling ? c->ceiling : (uint32_t)n;
}

static double usable(const batch_ctl *c, size_t budget)
{
    return (double)budget * (1.0 - c->margin);
}

static void record(batch_ctl *c, uint32_t to, uint64_t step, batch_reason why)
{
    c->before_last = c->last;
    c->last = (batch_change){c->micro, to, step, why};
    c->micro = to;
    c->changes++;
    c->stable_steps = 0;
}

/* Refit from the measurements: through the two largest sizes measured (the
 * nearest to where the answer lies), or, with one point, the prior's slope
 * through it.  A slope that is not positive (rounding on tiny models) keeps
 * the prior's: memory does not shrink as the batch grows. */
static void refit(batch_ctl *c)
{
    if (c->npts >= 2) {
        const batch_point *a = &c->pts[c->npts - 2], *b = &c->pts[c->npts - 1];
        double slope = (b->peak - a->peak) / (double)(b->n - a->n);
        if (slope > 0)
            c->per_sample = slope > c->min_per_sample ? slope : c->min_per_sample;
    }
    /* The line lies on or above every measured peak, and above the bound
     * an OOM gave: rounding leaves a peak up to a block's leftover above
     * the truth's line at one size and not at another, and a line under
     * any measurement predicts sizes that do not fit. */
    double f = c->npts ? -INFINITY : c->fixed;
    for (int i = 0; i < c->npts; i++) {
        double at = c->pts[i].peak - c->per_sample * (double)c->pts[i].n;
        if (at > f)
            f = at;
    }
    if (c->bound.n) {
        double at = c->bound.peak - c->per_sample * (double)c->bound.n;
        if (at > f)
            f = at;
    }
    c->fixed = f;
}

/* An OOM at n with `peak` held and asked for: peak(n) is above it. */
static void add_bound(batch_ctl *c, uint32_t n, double peak)
{
    if (peak <= 0)
        return;
    double at = peak - c->per_sample * (double)n;
    if (!c->bound.n || at > c->bound.peak - c->per_sample * (double)c->bound.n)
        c->bound = (batch_point){n, peak};
    refit(c);
}

static void add_point(batch_ctl *c, uint32_t n, double peak)
{
    int i = 0;
    while (i < c->npts && c->pts[i].n < n)
        i++;
    if (i < c->npts && c->pts[i].n == n) {
        c->pts[i].peak = peak;
    } else if (c->npts < BATCH_MAX_PROBES) {
        memmove(&c->pts[i + 1], &c->pts[i], (size_t)(c->npts - i) * sizeof c->pts[0]);
        c->pts[i] = (batch_point){n, peak};
        c->npts++;
    }
    refit(c);
}

static void finish(batch_ctl *c, uint32_t n, size_t budget)
{
    if (n < 1)
        n = 1;
    c->probing_done = true;
    c->verifying = false;
    c->max_fit = c->predicted_max = n;
    c->fit_budget = budget;
    if (n != c->micro || c->changes == 0)
        record(c, n, 0, BATCH_REASON_FIT);
}

/* The earlier run's size was verified: the job goes on as that run did —
 * growth back up to the fit it found, and, when this is the tuned size,
 * tuning done. */
static void resume_finish(batch_ctl *c, uint32_t n, size_t budget)
{
    c->probing_done = true;
    c->verifying = false;
    c->max_fit = c->resume_fit > n ? c->resume_fit : n;
    c->predicted_max = n;
    c->fit_budget = budget;
    if (c->resume_tuned) {
        c->best = n;
        c->tune = BATCH_TUNE_DONE;
    }
    record(c, n, 0, c->resume_tuned ? BATCH_REASON_TUNED : BATCH_REASON_FIT);
}

static uint32_t clamp_u(uint32_t v, uint32_t lo, uint32_t hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

uint32_t batch_probe_next(batch_ctl *c, size_t budget)
{
    if (c->probing_done)
        return 0;
    if (c->resume_n) {
        c->verifying = true;
        return c->resume_n;
    }
    uint32_t hi = c->upper ? c->upper : 1;
    uint32_t pred = clamp_u(batch_max_for(c, usable(c, budget)), 1, hi);
    if (c->probes >= BATCH_MAX_PROBES) {
        finish(c, pred, budget);
        return 0;
    }
    /* Two small sizes first — cheap, and far enough apart for the slope —
     * unless there is no room for two below the prediction. */
    if (c->npts < 2 && hi >= 2 && pred >= 4 && c->probes < BATCH_MAX_PROBES - 1) {
        uint32_t n2 = clamp_u(pred / 4, 2, hi);
        uint32_t n1 = n2 / 2 ? n2 / 2 : 1;
        uint32_t n = c->npts == 0 ? n1 : c->pts[0].n == n1 ? n2 : n1;
        if (c->npts == 0 || c->pts[0].n != n) {
            c->verifying = false;
            return n;
        }
    }
    /* Verify the prediction; a size already measured to fit needs no probe. */
    for (int i = 0; i < c->npts; i++)
        if (c->pts[i].n == pred && c->pts[i].peak <= usable(c, budget)) {
            finish(c, pred, budget);
            return 0;
        }
    c->verifying = true;
    return pred;
}

void batch_probe_result(batch_ctl *c, uint32_t n, size_t peak, bool ok, size_t budget)
{
    if (c->probing_done)
        return;
    c->probes++;
    if (ok)
        add_point(c, n, (double)peak);
    else
        add_bound(c, n, (double)peak);
    bool fits = ok && (double)peak <= usable(c, budget);
    if (!fits && n <= c->upper)
        c->upper = n > 1 ? n - 1 : 0;
    if (c->resume_n) {
        /* One try: the earlier run's size fits, or the search starts with
         * this measurement (and the size below it as the upper bound). */
        bool verified = fits && n == c->resume_n;
        c->resume_n = 0;
        if (verified) {
            resume_finish(c, n, budget);
            return;
        }
        c->verifying = false;
    }
    if (c->verifying && fits) {
        finish(c, n, budget);
        return;
    }
    if (!fits && n == 1) {
        /* Nothing smaller to try: run at 1, and let the first step's OOM
         * report say what would help. */
        finish(c, 1, budget);
        return;
    }
    if (c->probes >= BATCH_MAX_PROBES) {
        /* Out of probes: the refitted line, which now runs through a point
         * at or near the answer, decides, below any size known to fail. */
        uint32_t hi = c->upper ? c->upper : 1;
        finish(c, clamp_u(batch_max_for(c, usable(c, budget)), 1, hi), budget);
    }
}

void batch_probe_largest(batch_ctl *c, uint32_t n)
{
    if (!c->probing_done && n < c->upper)
        c->upper = n;
}

void batch_resume(batch_ctl *c, uint32_t fit, uint32_t tuned, double fixed, double per_sample)
{
    if (fit == 0 || c->probing_done)
        return;
    if (fit > c->ceiling)
        fit = c->ceiling;
    if (c->tune == BATCH_TUNE_OFF || tuned > fit)
        tuned = 0;
    /* The earlier run's line, refitted from its measurements, is a better
     * start than the model's estimate should the size no longer fit. */
    if (per_sample > 0) {
        c->fixed = fixed;
        c->per_sample = per_sample > c->min_per_sample ? per_sample : c->min_per_sample;
    }
    c->resume_fit = fit;
    c->resume_tuned = tuned != 0;
    c->resume_n = tuned ? tuned : fit;
}

void batch_refit_as(batch_ctl *c, uint32_t from, uint64_t step, batch_reason why)
{
    if (c->changes == 0)
        c->changes = 1;
    c->last = (batch_change){from, c->micro, step, why};
    c->stable_steps = 0;
}

void batch_lever(batch_ctl *c, uint32_t from, uint32_t to, uint64_t step, batch_reason why)
{
    c->micro = from;
    record(c, to, step, why);
}

void batch_probe_skip(batch_ctl *c, size_t budget)
{
    c->probing_done = true;
    c->max_fit = c->predicted_max = c->micro = c->ceiling;
    c->fit_budget = budget;
}

/* ---- tuning ---- */

/* The fastest measured candidate no larger than `limit`; 0 if none. */
static uint32_t tune_fastest_below(const batch_ctl *c, uint32_t limit)
{
    uint32_t best = 0;
    double rate = 0;
    for (int i = 0; i < c->ncand; i++)
        if (c->rate[i] > rate && c->cand[i] <= limit) {
            rate = c->rate[i];
            best = c->cand[i];
        }
    return best;
}

/* Tuning cut short (memory pressure, an OOM, a size that could not be
 * applied): keep the fastest size measured that still fits, if any, as the
 * target growth returns to; else growth goes back to the fitted size. */
static void tune_abort(batch_ctl *c)
{
    if (c->tune == BATCH_TUNE_RUN || c->tune == BATCH_TUNE_WAIT) {
        c->best = tune_fastest_below(c, c->max_fit);
        c->tune = c->best ? BATCH_TUNE_DONE : BATCH_TUNE_OFF;
    } else if (c->best > c->max_fit) {
        c->best = c->max_fit;
    }
}

static void tune_begin_candidate(batch_ctl *c, int i)
{
    c->ci = i;
    c->tune_skip = BATCH_TUNE_WARM;
    c->tune_seen = 0;
    c->tune_fastest = INFINITY;
}

/* One step boundary while tuning: the size the next step runs; *why is set
 * when the size changes or the choice is made. */
static uint32_t tune_step(batch_ctl *c, uint64_t step, uint32_t pred, double step_s, batch_reason *why)
{
    if (c->tune == BATCH_TUNE_WAIT) {
        c->ncand = batch_tune_candidates(c->batch, c->micro < c->max_fit ? c->micro : c->max_fit, c->cand,
                                         BATCH_TUNE_MAX);
        memset(c->rate, 0, sizeof c->rate);
        if (c->ncand < 2 || c->cand[0] != c->micro) {
            /* Nothing to choose between (micro-batch 1), or the size moved
             * before tuning began: leave it to the memory rules. */
            c->tune = BATCH_TUNE_OFF;
            return c->micro;
        }
        c->tune = BATCH_TUNE_RUN;
        c->tune_slower = 0;
        /* The step just reported was the first at the fitted size. */
        tune_begin_candidate(c, 0);
    }
    bool untimed = false;
    if (c->tune_skip > 0) {
        c->tune_skip--;
    } else if (step_s > 0) {
        if (step_s < c->tune_fastest)
            c->tune_fastest = step_s;
        c->tune_seen++;
    } else {
        untimed = true;
    }
    if (!untimed && c->tune_seen < BATCH_TUNE_STEPS)
        return c->micro;
    if (c->tune_seen > 0)
        c->rate[c->ci] = (double)c->batch / c->tune_fastest;
    double top = 0;
    for (int i = 0; i < c->ncand; i++)
        if (c->rate[i] > top)
            top = c->rate[i];
    c->tune_slower = c->rate[c->ci] < BATCH_TUNE_SLOWER * top ? c->tune_slower + 1 : 0;
    if (!untimed && c->tune_slower < BATCH_TUNE_PATIENCE && c->ci + 1 < c->ncand) {
        tune_begin_candidate(c, c->ci + 1);
        *why = BATCH_REASON_TUNING;
        record(c, c->cand[c->ci], step, BATCH_REASON_TUNING);
        return c->micro;
    }
    /* The choice: the fastest measured, among the sizes the budget allows
     * now (the running one always qualifies: it ran). */
    uint32_t allow = pred > c->micro ? pred : c->micro;
    uint32_t best = tune_fastest_below(c, allow < c->max_fit ? allow : c->max_fit);
    c->best = best ? best : c->micro;
    c->tune = BATCH_TUNE_DONE;
    *why = BATCH_REASON_TUNED;
    /* Recorded even when it keeps the running size: status and metrics
     * show that the search is over and what it chose. */
    record(c, c->best, step, BATCH_REASON_TUNED);
    return c->micro;
}

uint32_t batch_on_oom(batch_ctl *c, uint64_t step, size_t budget, size_t avail, size_t bound)
{
    c->oom_recoveries++;
    if (c->micro <= 1)
        return 0;
    add_bound(c, c->micro, (double)bound);
    uint32_t pred = batch_max_for(c, usable(c, budget));
    /* The model said the current size fits, so the model is wrong for it
     * now: halve, the classic response, rather than trust it. */
    uint32_t next = pred >= c->micro || pred == 0 ? c->micro / 2 : pred;
    if (next < 1)
        next = 1;
    /* Nothing took memory away since the size was found: the size itself
     * does not fit, so do not grow back to it.  Otherwise wait for memory
     * to come back before growing. */
    bool pressure = (double)budget < 0.98 * (double)c->fit_budget || (double)avail < 0.98 * (double)c->fit_avail;
    if (!pressure && c->max_fit >= c->micro)
        c->max_fit = c->micro - 1 > next ? c->micro - 1 : next;
    if (pressure) {
        c->blocked = true;
        c->blocked_avail = avail;
    }
    /* A step that ran out of memory says nothing about speed, and the sizes
     * still to try may not fit now. */
    tune_abort(c);
    record(c, next, step, BATCH_REASON_OOM);
    return next;
}

uint32_t batch_step_end(batch_ctl *c, uint64_t step, size_t budget, size_t avail, double step_s,
                        batch_reason *why)
{
    *why = BATCH_REASON_NONE;
    uint32_t pred = batch_max_for(c, usable(c, budget));
    c->predicted_max = pred;
    /* Shrink before an OOM: the need no longer fits the whole budget. */
    if (batch_peak(c, c->micro) > (double)budget && c->micro > 1) {
        uint32_t next = pred ? pred : 1;
        if (next < c->micro) {
            /* Steps squeezed by another process time nothing useful. */
            tune_abort(c);
            /* And no growth until more memory comes back than there is
             * now: growing on the same reading would take the pool back
             * under the pressure that shrank it (its segments round up
             * past what the line counts), and flip back and forth. */
            c->blocked = true;
            c->blocked_avail = avail;
            *why = BATCH_REASON_PRESSURE;
            record(c, next, step, BATCH_REASON_PRESSURE);
            return next;
        }
    }
    if (c->tune == BATCH_TUNE_WAIT || c->tune == BATCH_TUNE_RUN)
        return tune_step(c, step, pred, step_s, why);
    /* Grow back after grow_after steps in a row with room for more (and,
     * after an OOM under pressure, with memory come back), up to the tuned
     * size: beyond it is slower. */
    if (c->blocked && (double)avail > 1.02 * (double)c->blocked_avail)
        c->blocked = false;
    uint32_t cap = c->best && c->best < c->max_fit ? c->best : c->max_fit;
    uint32_t target = pred < cap ? pred : cap;
    /* The fit (and the tuning below it) was made under a smaller budget:
     * another job's probing or a process that has since let go.  Not after
     * an OOM that lowered max_fit under the same budget: that budget has not
     * grown, so the size stays known not to fit. */
    bool refit = pred > c->max_fit && (double)budget > BATCH_REFIT_GROWTH * (double)c->fit_budget;
    if (refit)
        target = pred;
    if (c->blocked)
        target = c->micro;
    if (c->grow_after && target > c->micro) {
        if (++c->stable_steps >= c->grow_after) {
            if (target > c->max_fit) {
                c->max_fit = target;
                c->fit_budget = budget;
                c->fit_avail = avail;
                if (c->tune_on) {
                    /* Tune again from the new size down (tune_step starts
                     * at the next boundary: this step is the first there). */
                    c->best = 0;
                    c->tune = BATCH_TUNE_WAIT;
                }
            }
            *why = BATCH_REASON_GROW;
            record(c, target, step, BATCH_REASON_GROW);
            return target;
        }
    } else {
        c->stable_steps = 0;
    }
    return c->micro;
}

void batch_apply_failed(batch_ctl *c, uint32_t tried, uint32_t back)
{
    c->micro = back;
    c->last = c->before_last;
    if (c->changes)
        c->changes--;
    if (tried > back && c->max_fit >= tried)
        c->max_fit = tried - 1 > back ? tried - 1 : back;
    /* Memory went elsewhere: as under pressure, tuning is over. */
    tune_abort(c);
    c->stable_steps = 0;
}
