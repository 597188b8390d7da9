/* pool_stats.c — publishing statistics to readers that never take the lock.
 *
 * The allocator updates pool.live in place, inside seqlock sections (see
 * pool_stats_begin/end), with relaxed atomic stores; a reader copies it with
 * relaxed loads and keeps the copy when the sequence number was even and
 * unchanged around it.  Every access is atomic, so TSan sees no race, and
 * the fences make the copy consistent.
 *
 * A seqlock reader can starve: a training thread allocating in a tight loop
 * reopens the section faster than ~1 KiB of figures can be copied.  So after
 * a few failed tries the reader takes a ticket; the allocator, at the end of
 * its next section, copies live into pool.snap (its own seqlock) and
 * publishes the ticket.  The allocator pays one relaxed load per section,
 * plus one copy per starving read; an idle allocator pays nothing, and then
 * the reader's next try on live succeeds anyway.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* for clock_gettime etc. under -std=c11 */
#endif
#include "pool_internal.h"

#include <sched.h>

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* ==== copying ===================================================================== */

static void copy_live(pool_live *d, pool_live *s)
{
    for (int k = 0; k < POOL_ST_COUNT; k++) {
        for (int i = 0; i < 2; i++) {
            POOL_ST(d->st[k].inc[i], POOL_LD(s->st[k].inc[i]));
            POOL_ST(d->st[k].dec[i], POOL_LD(s->st[k].dec[i]));
        }
        for (int i = 0; i < 3; i++)
            POOL_ST(d->st[k].peak[i], POOL_LD(s->st[k].peak[i]));
    }
    for (int c = 0; c < POOL_CTR_COUNT; c++)
        POOL_ST(d->ctr[c], POOL_LD(s->ctr[c]));
    POOL_ST(d->largest_free, POOL_LD(s->largest_free));
    for (int t = 0; t < POOL_TAG_COUNT; t++) {
        POOL_ST(d->tag_current[t], POOL_LD(s->tag_current[t]));
        POOL_ST(d->tag_peak[t], POOL_LD(s->tag_peak[t]));
    }
    for (int j = 0; j < POOL_MAX_JOBS; j++) {
        pool_live_job *dj = &d->jobs[j], *sj = &s->jobs[j];
        POOL_ST(dj->used, POOL_LD(sj->used));
        POOL_ST(dj->job, POOL_LD(sj->job));
        POOL_ST(dj->current, POOL_LD(sj->current));
        POOL_ST(dj->peak, POOL_LD(sj->peak));
        POOL_ST(dj->limit, POOL_LD(sj->limit));
        POOL_ST(dj->need, POOL_LD(sj->need));
        for (int t = 0; t < POOL_TAG_COUNT; t++) {
            POOL_ST(dj->tag_current[t], POOL_LD(sj->tag_current[t]));
            POOL_ST(dj->tag_peak[t], POOL_LD(sj->tag_peak[t]));
        }
    }
    POOL_ST(d->tl_events, POOL_LD(s->tl_events));
    POOL_ST(d->tl_dropped, POOL_LD(s->tl_dropped));
}

/* Called by pool_stats_end with the mutex held and live's section closed. */
void pool_stats_serve(pool *p)
{
    uint64_t ticket = POOL_LD(p->snap_requests);
    POOL_ST(p->snap.seq, POOL_LD(p->snap.seq) + 1);
    atomic_thread_fence(memory_order_release);
    copy_live(&p->snap, &p->live);
    atomic_store_explicit(&p->snap.seq, POOL_LD(p->snap.seq) + 1, memory_order_release);
    p->snap_served = ticket;
    atomic_store_explicit(&p->snap_published, ticket, memory_order_release);
}

/* ==== reading ======================================================================== */

static bool try_read(pool_live *l, pool_stats *o)
{
    uint64_t s1 = atomic_load_explicit(&l->seq, memory_order_acquire);
    if (s1 & 1)
        return false;
    pool_stat *dst[POOL_ST_COUNT] = {
        [POOL_ST_ALLOCATED] = o->allocated_bytes,
        [POOL_ST_RESERVED] = o->reserved_bytes,
        [POOL_ST_INACTIVE_SPLIT] = o->inactive_split_bytes,
        [POOL_ST_REQUESTED] = o->requested_bytes,
        [POOL_ST_ALLOCATIONS] = o->allocations,
        [POOL_ST_SEGMENTS] = o->segments,
        [POOL_ST_INACTIVE_SPLIT_BLOCKS] = o->inactive_split_blocks,
    };
    for (int k = 0; k < POOL_ST_COUNT; k++) {
        pool_stat *v = dst[k];
        for (int i = 0; i < 2; i++) {
            v[i].allocated = POOL_LD(l->st[k].inc[i]);
            v[i].freed = POOL_LD(l->st[k].dec[i]);
            v[i].current = (int64_t)(v[i].allocated - v[i].freed);
            v[i].peak = POOL_LD(l->st[k].peak[i]);
        }
        v[2].allocated = v[0].allocated + v[1].allocated;
        v[2].freed = v[0].freed + v[1].freed;
        v[2].current = v[0].current + v[1].current;
        v[2].peak = POOL_LD(l->st[k].peak[2]);
    }
    o->device_allocs = POOL_LD(l->ctr[POOL_CTR_DEVICE_ALLOCS]);
    o->device_frees = POOL_LD(l->ctr[POOL_CTR_DEVICE_FREES]);
    o->cache_hits = POOL_LD(l->ctr[POOL_CTR_CACHE_HITS]);
    o->alloc_retries = POOL_LD(l->ctr[POOL_CTR_ALLOC_RETRIES]);
    o->ooms = POOL_LD(l->ctr[POOL_CTR_OOMS]);
    o->trims = POOL_LD(l->ctr[POOL_CTR_TRIMS]);
    o->trimmed_bytes = POOL_LD(l->ctr[POOL_CTR_TRIMMED_BYTES]);
    o->trim_ns = POOL_LD(l->ctr[POOL_CTR_TRIM_NS]);
    o->idle_trims = POOL_LD(l->ctr[POOL_CTR_IDLE_TRIMS]);
    o->idle_trimmed_bytes = POOL_LD(l->ctr[POOL_CTR_IDLE_TRIMMED_BYTES]);
    o->invalid_frees = POOL_LD(l->ctr[POOL_CTR_INVALID_FREES]);
    o->largest_free_block = POOL_LD(l->largest_free);
    for (int t = 0; t < POOL_TAG_COUNT; t++) {
        o->tag_current[t] = POOL_LD(l->tag_current[t]);
        o->tag_peak[t] = POOL_LD(l->tag_peak[t]);
    }
    size_t n = 0;
    for (int j = 0; j < POOL_MAX_JOBS; j++) {
        pool_live_job *lj = &l->jobs[j];
        if (!POOL_LD(lj->used))
            continue;
        o->jobs[n].job = POOL_LD(lj->job);
        o->jobs[n].current = POOL_LD(lj->current);
        o->jobs[n].peak = POOL_LD(lj->peak);
        o->jobs[n].limit = (size_t)POOL_LD(lj->limit);
        o->jobs[n].need = (size_t)POOL_LD(lj->need);
        for (int t = 0; t < POOL_TAG_COUNT; t++) {
            o->jobs[n].tag_current[t] = POOL_LD(lj->tag_current[t]);
            o->jobs[n].tag_peak[t] = POOL_LD(lj->tag_peak[t]);
        }
        n++;
    }
    o->njobs = n;
    o->timeline_events = POOL_LD(l->tl_events);
    o->timeline_dropped = POOL_LD(l->tl_dropped);
    atomic_thread_fence(memory_order_acquire);
    return POOL_LD(l->seq) == s1;
}

void pool_stats_read(pool *p, pool_stats *out)
{
    memset(out, 0, sizeof *out);
    uint64_t ticket = 0;
    for (unsigned spin = 0;; spin++) {
        if (try_read(&p->live, out))
            break;
        if (spin == 16)
            ticket = atomic_fetch_add_explicit(&p->snap_requests, 1, memory_order_relaxed) + 1;
        if (ticket &&
            atomic_load_explicit(&p->snap_published, memory_order_acquire) >= ticket &&
            try_read(&p->snap, out))
            break;
        if (spin < 16)
            cpu_relax();
        else
            sched_yield();
    }
    memset(&out->jobs[out->njobs], 0, (POOL_MAX_JOBS - out->njobs) * sizeof out->jobs[0]);

    /* Without stream-ordered frees a freed block is reusable at once, so
     * active equals allocated (POOL.md). */
    memcpy(out->active_bytes, out->allocated_bytes, sizeof out->active_bytes);
    memcpy(out->active_blocks, out->allocations, sizeof out->active_blocks);
    int64_t cached = out->reserved_bytes[POOL_ALL].current - out->allocated_bytes[POOL_ALL].current;
    out->fragmentation = cached > 0 ? 1.0 - (double)out->largest_free_block / (double)cached : 0.0;
    if (out->fragmentation < 0)
        out->fragmentation = 0;
    out->cap = p->cap;
    out->device_total = p->device_total;
    dev_mem_info(p->d, &out->device_free, &out->device_total);
    out->expandable_segments = p->expandable;
    out->max_split_size = p->cfg.max_split_size;
}

void pool_job_peak(pool *p, uint32_t job, uint64_t *peak, uint64_t tag_peak[POOL_TAG_COUNT])
{
    *peak = 0;
    memset(tag_peak, 0, POOL_TAG_COUNT * sizeof *tag_peak);
    pool_stats *ps = malloc(sizeof *ps);
    if (!ps)
        return;
    pool_stats_read(p, ps);
    for (size_t r = 0; r < ps->njobs; r++) {
        if (ps->jobs[r].job != job)
            continue;
        *peak = ps->jobs[r].peak > 0 ? (uint64_t)ps->jobs[r].peak : 0;
        for (int t = 0; t < POOL_TAG_COUNT; t++)
            tag_peak[t] = ps->jobs[r].tag_peak[t] > 0 ? (uint64_t)ps->jobs[r].tag_peak[t] : 0;
    }
    free(ps);
}

void pool_stats_reset_peaks(pool *p)
{
    pthread_mutex_lock(&p->lock);
    pool_stats_begin(p);
    pool_live *l = &p->live;
    for (int k = 0; k < POOL_ST_COUNT; k++) {
        for (int i = 0; i < 2; i++)
            POOL_ST(l->st[k].peak[i], pool_stat_current(p, k, i));
        POOL_ST(l->st[k].peak[2], pool_stat_current(p, k, POOL_ALL));
    }
    for (int t = 0; t < POOL_TAG_COUNT; t++)
        POOL_ST(l->tag_peak[t], POOL_LD(l->tag_current[t]));
    for (int j = 0; j < POOL_MAX_JOBS; j++) {
        POOL_ST(l->jobs[j].peak, POOL_LD(l->jobs[j].current));
        for (int t = 0; t < POOL_TAG_COUNT; t++)
            POOL_ST(l->jobs[j].tag_peak[t], POOL_LD(l->jobs[j].tag_current[t]));
    }
    pool_stats_end(p);
    pthread_mutex_unlock(&p->lock);
}

void pool_get_config(const pool *p, pool_config *out)
{
    /* Set at creation and never changed: no lock needed. */
    *out = p->cfg;
}
