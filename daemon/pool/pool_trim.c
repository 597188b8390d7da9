/* pool_trim.c — giving cached memory back to the device, and the policies
 * that decide when (pool_tick).
 *
 * A trim releases, in this order:
 *   1. wholly free segments, least recently used first (the idle list is in
 *      last-use order, so this is a walk from its head);
 *   2. with expandable segments, the whole granularity chunks inside free
 *      blocks, highest addresses first, so live memory stays packed low.
 * Fixed segments cannot be given back in part, so step 2 is expandable only.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* for clock_gettime etc. under -std=c11 */
#endif
#include "pool_internal.h"

/* ==== names ====================================================================== */

const char *pool_trim_reason_name(pool_trim_reason r)
{
    static const char *const names[] = {"request", "periodic", "gc", "pressure", "oom", "idle", "reclaim"};
    _Static_assert(sizeof names / sizeof names[0] == POOL_TRIM_REASONS, "a name for every reason");
    return (unsigned)r < sizeof names / sizeof names[0] ? names[r] : "?";
}

/* ==== the trim ===================================================================== */

static bool target_met(size_t target, size_t released) { return target && released >= target; }

static void trim_chunks(pool *p, size_t target, size_t *released, size_t *pieces)
{
    for (int i = p->nsub - 1; i >= 0 && !target_met(target, *released); i--) {
        pool_segment *run = p->sub[i].segs_tail;
        while (run && !target_met(target, *released)) {
            /* Unmapping may split or free this run; what lies below b
             * stays where it is, so walk downward from captured links. */
            pool_segment *below = run->prev;
            pool_block *b = run->tail;
            while (b && !target_met(target, *released)) {
                pool_block *prev = b->prev;
                if (!b->live) {
                    size_t n = pool_seg_unmap_chunks(p, b, 0);
                    if (n) {
                        *released += n;
                        (*pieces)++;
                    }
                }
                b = prev;
            }
            run = below;
        }
    }
}

pool_trim_result pool_trim_locked(pool *p, pool_trim_reason why, size_t target_bytes)
{
    uint64_t t0 = pool_now_ns();
    size_t released = 0, pieces = 0;
    /* One section for the whole trim, so no reader sees memory gone but
     * the trim uncounted; the device calls wait for its end. */
    pool_stats_begin(p);
    while (p->lru_head && !target_met(target_bytes, released)) {
        pool_segment *s = p->lru_head;
        size_t sz = s->size;
        pool_seg_release(p, s);
        if (p->lru_head == s)
            break; /* not released (host out of memory); nothing else will be */
        released += sz;
        pieces++;
    }
    if (p->expandable)
        trim_chunks(p, target_bytes, &released, &pieces);

    pool_ctr_add(p, POOL_CTR_TRIMS, 1);
    pool_ctr_add(p, POOL_CTR_TRIMMED_BYTES, released);
    if (why == POOL_TRIM_IDLE) {
        pool_ctr_add(p, POOL_CTR_IDLE_TRIMS, 1);
        pool_ctr_add(p, POOL_CTR_IDLE_TRIMMED_BYTES, released);
    }
    pool_tl_record(p, POOL_EV_TRIM, 0, POOL_TAG_OTHER, false, released, 0, (uint64_t)why);
    pool_stats_end(p);
    /* The time includes the device calls, which the section's end made. */
    uint64_t ns = pool_now_ns() - t0;
    pool_stats_begin(p);
    pool_ctr_add(p, POOL_CTR_TRIM_NS, ns);
    pool_stats_end(p);

    pool_trim_result r = {
        .bytes = released,
        .segments = pieces,
        .ns = ns,
        .reserved_after = (size_t)pool_stat_current(p, POOL_ST_RESERVED, POOL_ALL),
    };
    return r;
}

pool_trim_result pool_trim(pool *p, pool_trim_reason why, size_t target_bytes)
{
    pthread_mutex_lock(&p->lock);
    pool_trim_result r = pool_trim_locked(p, why, target_bytes);
    pthread_mutex_unlock(&p->lock);
    return r;
}

/* ==== whether jobs run ========================================================================= */

void pool_use_begin(pool *p)
{
    pthread_mutex_lock(&p->lock);
    p->users++;
    pthread_mutex_unlock(&p->lock);
}

void pool_use_end(pool *p)
{
    uint64_t now = pool_now_ns();
    pthread_mutex_lock(&p->lock);
    if (p->users && --p->users == 0) {
        p->idle_since_ns = now;
        p->idle_trimmed = false;
    }
    pthread_mutex_unlock(&p->lock);
}

/* ==== policies ======================================================================== */

/* Policy trims run only when something could go back, so an idle pool does
 * not fill the timeline with empty trims.  (Requests and OOM trims always
 * run and always count.) */
static bool releasable(pool *p)
{
    if (p->lru_head)
        return true;
    if (!p->expandable)
        return false;
    int64_t cached = pool_stat_current(p, POOL_ST_RESERVED, POOL_ALL) -
                     pool_stat_current(p, POOL_ST_ALLOCATED, POOL_ALL);
    return cached >= (int64_t)p->granularity;
}

void pool_gc_locked(pool *p, size_t limit, size_t extra)
{
    size_t reserved = (size_t)pool_stat_current(p, POOL_ST_RESERVED, POOL_ALL);
    if (reserved + extra <= limit || !releasable(p))
        return;
    pool_trim_locked(p, POOL_TRIM_GC, reserved + extra - limit);
}

void pool_tick(pool *p, uint64_t step)
{
    const pool_config *c = &p->cfg;
    /* Ask the device before taking the mutex: on CUDA this is a driver
     * call, and allocating threads should not wait behind it. */
    size_t dev_free = 0, dev_total = 0;
    bool pressure = c->low_watermark && dev_mem_info(p->d, &dev_free, &dev_total) == DEV_OK &&
                    dev_free < c->low_watermark;
    uint64_t now = c->trim_every_ms || c->idle_trim_ms ? pool_now_ns() : 0;

    pthread_mutex_lock(&p->lock);
    /* No job has run here for idle_trim: the device is better off with
     * the whole cache than the pool is, since nothing here will reuse it
     * soon.  Once per idle spell, so an allocation made without a job (a
     * test hook) and unreleasable slack do not bring a trim every tick.
     * `now` was read before the lock, so it may predate idle_since. */
    if (c->idle_trim_ms && !p->users && !p->idle_trimmed && now >= p->idle_since_ns &&
        now - p->idle_since_ns >= c->idle_trim_ms * 1000000u && releasable(p)) {
        pool_trim_locked(p, POOL_TRIM_IDLE, 0);
        p->idle_trimmed = true;
    }
    bool periodic = false;
    if (c->trim_every_steps && step && ++p->steps_since_trim >= c->trim_every_steps)
        periodic = true;
    if (c->trim_every_ms && now - p->last_periodic_ns >= c->trim_every_ms * 1000000u)
        periodic = true;
    size_t given = 0;
    if (periodic) {
        p->steps_since_trim = 0;
        p->last_periodic_ns = now ? now : pool_now_ns();
        if (releasable(p))
            given = pool_trim_locked(p, POOL_TRIM_PERIODIC, 0).bytes;
    }
    /* Someone else on the device grew: give back what restores the
     * watermark, counting what the periodic trim just returned. */
    if (pressure && dev_free + given < c->low_watermark && releasable(p))
        pool_trim_locked(p, POOL_TRIM_PRESSURE, c->low_watermark - dev_free - given);
    if (c->gc_threshold > 0)
        pool_gc_locked(p, (size_t)(c->gc_threshold * (double)p->cap), 0);
    pthread_mutex_unlock(&p->lock);
}
