/* pool.c — the caching allocator's entry points: creation, pool_alloc
 * (best fit and split, the cap and the job's limit, one trim and retry,
 * then one more after the reclaim hook has other holders of the device
 * give back their caches, before an OOM) and pool_free (coalescing), with the pointer map of live
 * blocks and the spare block structs they use.
 *
 * Segments and growth are in pool_segment.c, the free trees in
 * pool_tree.c, the job table in pool_jobs.c; pool_internal.h keeps the
 * free-block bookkeeping all of them share.
 *
 * Invariants (pool_check verifies every one of them):
 *   - the blocks of a segment tile it in address order, every size a
 *     multiple of 512, and no two free blocks are neighbours;
 *   - a free block is in its sub-pool's bin for its size (small pools,
 *     blocks up to 2 MiB) or else its free tree, a live one in the pointer
 *     map, never both;
 *   - a segment is on the idle list exactly when its only block is free;
 *   - with expandable segments, runs lie inside the reserved range, aligned
 *     to the granularity, in address order, never touching (touching runs
 *     are merged when the hole between them is mapped).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* for clock_gettime etc. under -std=c11 */
#endif
#include "pool_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== names ================================================================= */

static const char *const tag_names[POOL_TAG_COUNT] = {
    "params", "grads", "optimizer", "activations", "workspace", "data", "other", "frozen",
};

const char *pool_tag_name(pool_tag t)
{
    return (unsigned)t < POOL_TAG_COUNT ? tag_names[t] : "?";
}

int pool_tag_parse(const char *name, pool_tag *out)
{
    for (int t = 0; name && t < POOL_TAG_COUNT; t++) {
        if (strcmp(name, tag_names[t]) == 0) {
            if (out)
                *out = (pool_tag)t;
            return 0;
        }
    }
    return -1;
}

const char *pool_fmt_size(uint64_t bytes, char *buf, size_t len)
{
    static const char units[] = "BKMGTPE";
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 6) {
        v /= 1024;
        u++;
    }
    if (u == 0) {
        snprintf(buf, len, "%lluB", (unsigned long long)bytes);
        return buf;
    }
    snprintf(buf, len, v < 10 ? "%.2f" : v < 100 ? "%.1f" : "%.0f", v);
    /* "1.50" reads better as "1.5", "2.00" as "2". */
    char *dot = strchr(buf, '.');
    if (dot) {
        char *e = buf + strlen(buf);
        while (e > dot + 1 && e[-1] == '0')
            *--e = 0;
        if (e == dot + 1)
            *dot = 0;
    }
    size_t n = strlen(buf);
    if (n + 1 < len) {
        buf[n] = units[u];
        buf[n + 1] = 0;
    }
    return buf;
}

/* ==== configuration =========================================================== */

void pool_config_default(pool_config *c)
{
    memset(c, 0, sizeof *c);
    c->memory_fraction = 1.0;
    c->max_split_size = SIZE_MAX;
    c->expandable_segments = false;
    c->timeline_capacity = 65536;
}

dev *pool_device(const pool *p) { return p->d; }

/* ==== block structs ============================================================== */

#define SLAB_BLOCKS 256

struct pool_slab {
    pool_slab *next;
    pool_block blocks[SLAB_BLOCKS];
};

/* Taking the structs an operation may need before it changes anything means
 * a host malloc failure can never leave a half-split block behind. */
bool pool_blk_reserve(pool *p, size_t n)
{
    while (p->nspare < n) {
        pool_slab *s = malloc(sizeof *s);
        if (!s)
            return false;
        s->next = p->slabs;
        p->slabs = s;
        for (int i = 0; i < SLAB_BLOCKS; i++)
            pool_blk_put(p, &s->blocks[i]);
    }
    return true;
}

pool_block *pool_blk_new(pool *p)
{
    if (!p->spare && !pool_blk_reserve(p, 1))
        return NULL;
    pool_block *b = p->spare;
    p->spare = b->next;
    p->nspare--;
    memset(b, 0, sizeof *b);
    return b;
}

void pool_blk_put(pool *p, pool_block *b)
{
    b->next = p->spare;
    p->spare = b;
    p->nspare++;
}

/* ==== pointer map ======================================================================== */

/* Open addressing with linear probing and backward-shift deletion (no
 * tombstones), kept at most half full.  Keys are block addresses, never 0. */

static inline size_t map_home(const pool *p, uintptr_t key)
{
    return (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> p->map_shift);
}

static bool map_init(pool *p, unsigned bits)
{
    p->map = calloc((size_t)1 << bits, sizeof *p->map);
    if (!p->map)
        return false;
    p->map_mask = ((size_t)1 << bits) - 1;
    p->map_shift = 64 - bits;
    p->map_count = 0;
    return true;
}

static void map_put(pool *p, uintptr_t key, pool_block *b)
{
    size_t i = map_home(p, key);
    while (p->map[i].key)
        i = (i + 1) & p->map_mask;
    p->map[i].key = key;
    p->map[i].b = b;
    p->map_count++;
}

/* Grow before an operation that inserts, so the insert itself cannot fail. */
static bool map_reserve(pool *p)
{
    if ((p->map_count + 1) * 2 <= p->map_mask + 1)
        return true;
    pool_map_entry *old = p->map;
    size_t old_n = p->map_mask + 1;
    unsigned bits = 64 - p->map_shift + 1;
    if (!map_init(p, bits)) {
        p->map = old;
        return false;
    }
    p->map_mask = ((size_t)1 << bits) - 1;
    for (size_t i = 0; i < old_n; i++)
        if (old[i].key)
            map_put(p, old[i].key, old[i].b);
    free(old);
    return true;
}

static inline size_t map_find_slot(const pool *p, uintptr_t key)
{
    size_t i = map_home(p, key);
    for (;;) {
        uintptr_t k = p->map[i].key;
        if (k == key || k == 0)
            return i;
        i = (i + 1) & p->map_mask;
    }
}

static void map_delete_at(pool *p, size_t i)
{
    size_t j = i;
    for (;;) {
        j = (j + 1) & p->map_mask;
        if (!p->map[j].key)
            break;
        size_t h = map_home(p, p->map[j].key);
        /* The entry at j may move back to i unless its home lies in (i, j]. */
        bool stays = i <= j ? (h > i && h <= j) : (h > i || h <= j);
        if (!stays) {
            p->map[i] = p->map[j];
            i = j;
        }
    }
    p->map[i].key = 0;
    p->map[i].b = NULL;
    p->map_count--;
}

/* ==== creation ===================================================================================== */

/* Make stream slot `slot`'s four sub-pools (the next unused slot). */
static int stream_slot_init(pool *p, int slot)
{
    for (int i = slot * POOL_NSUB; i < (slot + 1) * POOL_NSUB; i++) {
        pool_sub *sp = &p->sub[i];
        sp->small = i % 2 == 0;
        sp->persistent = i % POOL_NSUB >= 2;
        /* Large free blocks come in too many sizes for exact bins; the
         * large pool keeps the tree alone. */
        if (sp->small && !(sp->bins = calloc(1, sizeof *sp->bins)))
            return -1;
        if (p->expandable) {
            /* Twice the cap: the holes trims punch can push a run's end
             * above the cap, and reserving address space costs nothing. */
            size_t va = pool_round_up(p->cap, p->granularity) * 2;
            void *base = NULL;
            if (dev_va_reserve(p->d, va, &base) != DEV_OK)
                return -1;
            sp->va_base = (uintptr_t)base;
            sp->va_size = va;
        }
    }
    /* Counted only once whole, so pool_destroy releases what a failed
     * attempt made (its bins and ranges) through the loop over nsub. */
    p->nsub = (slot + 1) * POOL_NSUB;
    return 0;
}

int pool_create(dev *d, const pool_config *c, pool **out)
{
    if (!out)
        return -1;
    *out = NULL;
    if (!d)
        return -1;
    pool_config cfg;
    if (c)
        cfg = *c;
    else
        pool_config_default(&cfg);
    if (!(cfg.memory_fraction > 0 && cfg.memory_fraction <= 1))
        return -1;
    if (!(cfg.gc_threshold >= 0 && cfg.gc_threshold <= 1))
        return -1;
    if (cfg.max_split_size == 0)
        cfg.max_split_size = SIZE_MAX;

    size_t dev_free = 0, total = 0;
    if (dev_mem_info(d, &dev_free, &total) != DEV_OK || total == 0)
        return -1;

    pool *p = calloc(1, sizeof *p);
    if (!p)
        return -1;
    p->d = d;
    p->cfg = cfg;
    p->device_total = total;
    p->cap = pool_round_down((size_t)((double)total * cfg.memory_fraction), POOL_ROUND);
    if (pthread_mutex_init(&p->lock, NULL) != 0) {
        free(p);
        return -1;
    }
    if (pthread_mutex_init(&p->fit_lock, NULL) != 0) {
        pthread_mutex_destroy(&p->lock);
        free(p);
        return -1;
    }
    if (!map_init(p, 10))
        goto fail;
    if (cfg.timeline_capacity) {
        p->ring = calloc(cfg.timeline_capacity, sizeof *p->ring);
        if (!p->ring)
            goto fail;
        p->ring_cap = cfg.timeline_capacity;
    }

    /* Without virtual-memory support the pool runs with fixed segments;
     * pool_stats.expandable_segments says which is in effect. */
    size_t g = cfg.expandable_segments ? dev_va_granularity(d) : 0;
    if (g) {
        p->granularity = g;
        p->expandable = true;
    }
    if (stream_slot_init(p, 0) != 0)
        goto fail;
    p->t0_ns = pool_now_ns();
    p->last_periodic_ns = p->t0_ns;
    p->idle_since_ns = p->t0_ns;
    pool_tl_clock_init(p);
    *out = p;
    return 0;

fail:
    pool_destroy(p);
    return -1;
}

void pool_destroy(pool *p)
{
    if (!p)
        return;
    for (int i = 0; i < POOL_NSUB_ALL; i++) {
        pool_sub *sp = &p->sub[i];
        pool_segment *s = sp->segs;
        while (s) {
            pool_segment *n = s->next;
            if (p->expandable)
                dev_va_unmap(p->d, (void *)s->addr, s->size);
            else
                dev_free(p->d, (void *)s->addr, s->size);
            free(s);
            s = n;
        }
        if (sp->va_size)
            dev_va_release(p->d, (void *)sp->va_base, sp->va_size);
        free(sp->bins);
    }
    while (p->slabs) {
        pool_slab *n = p->slabs->next;
        free(p->slabs);
        p->slabs = n;
    }
    free(p->map);
    free(p->pending);
    free(p->ring);
    pthread_mutex_destroy(&p->fit_lock);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

/* ==== best fit ======================================================================================== */

/* The first non-empty bin >= c, or -1: two bitmap words at most. */
static inline long bins_first(const pool_bins *bn, size_t c)
{
    size_t w = c / 64;
    uint64_t m = bn->words[w] & (~(uint64_t)0 << (c % 64));
    if (m)
        return (long)(w * 64 + (size_t)__builtin_ctzll(m));
    if (w + 1 >= POOL_BIN_WORDS)
        return -1;
    uint64_t sm = bn->summary & (~(uint64_t)0 << (w + 1));
    if (!sm)
        return -1;
    w = (size_t)__builtin_ctzll(sm);
    return (long)(w * 64 + (size_t)__builtin_ctzll(bn->words[w]));
}

static inline pool_block *avl_leftmost(pool_block *n)
{
    while (n->left)
        n = n->left;
    return n;
}

/* The smallest free block >= size, the lowest address among equals.
 * Binned blocks are all smaller than the tree's, so a non-empty bin at or
 * above size's wins outright, and the tree is searched only without one. */
static pool_block *find_fit(pool *p, pool_sub *sp, size_t size)
{
    pool_block *best = NULL;
    if (sp->bins && size <= POOL_BIN_MAX) {
        long c = bins_first(sp->bins, pool_bin_of(size));
        if (c >= 0)
            best = avl_leftmost(sp->bins->root[c]);
    }
    for (pool_block *n = best ? NULL : sp->root; n;) {
        if (n->size >= size) {
            best = n;
            n = n->left;
        } else {
            n = n->right;
        }
    }
    if (!best || sp->small || p->expandable)
        return best;
    /* Oversize blocks serve only oversize requests, and only with bounded
     * waste; since best is the smallest fit, no later block can do better. */
    size_t m = p->cfg.max_split_size;
    if (size < m && best->size >= m)
        return NULL;
    if (size >= m && best->size - size >= POOL_OVERSIZE_SLACK)
        return NULL;
    return best;
}

/* Remainders of small blocks are kept from 512 B; in the large pool a
 * remainder of 1 MiB or less could only ever serve a small request, which
 * never comes here, so it stays attached.  Expandable segments split always:
 * their tail remainder is what growth extends. */
static bool should_split(const pool *p, const pool_block *b, size_t size)
{
    size_t rest = b->size - size;
    if (b->seg->small || p->expandable)
        return rest >= POOL_ROUND;
    if (b->size >= p->cfg.max_split_size)
        return false;
    return rest > POOL_SMALL_MAX;
}

/* Hand out the front of free block b.  Inside a section; structs reserved. */
static void take_block(pool *p, pool_block *b, size_t size, size_t requested, pool_tag tag,
                       int slot)
{
    pool_segment *seg = b->seg;
    bool small = seg->small;
    pool_free_remove(p, b);
    if (should_split(p, b, size)) {
        pool_block *r = pool_blk_new(p);
        r->addr = b->addr + size;
        r->size = b->size - size;
        r->seg = seg;
        r->prev = b;
        r->next = b->next;
        if (b->next)
            b->next->prev = r;
        else
            seg->tail = r;
        b->next = r;
        seg->nblocks++;
        b->size = size;
        pool_free_insert(p, r);
    }
    b->live = 1;
    b->tag = (uint8_t)tag;
    b->job_slot = (uint8_t)slot;
    b->requested = requested;
    map_put(p, b->addr, b);

    size_t sz = b->size;
    pool_stat_inc(p, POOL_ST_ALLOCATED, small, sz);
    pool_stat_inc(p, POOL_ST_REQUESTED, small, requested);
    pool_stat_inc(p, POOL_ST_ALLOCATIONS, small, 1);
    int64_t tc = POOL_LD(p->live.tag_current[tag]) + (int64_t)sz;
    POOL_ST(p->live.tag_current[tag], tc);
    if (tc > POOL_LD(p->live.tag_peak[tag]))
        POOL_ST(p->live.tag_peak[tag], tc);
    pool_live_job *j = &p->live.jobs[slot];
    int64_t jc = POOL_LD(j->current) + (int64_t)sz;
    POOL_ST(j->current, jc);
    if (jc > POOL_LD(j->peak))
        POOL_ST(j->peak, jc);
    int64_t jt = POOL_LD(j->tag_current[tag]) + (int64_t)sz;
    POOL_ST(j->tag_current[tag], jt);
    if (jt > POOL_LD(j->tag_peak[tag]))
        POOL_ST(j->tag_peak[tag], jt);
}

/* ==== allocation ============================================================================================= */

/* Whether releasing the cache could make room: something must be cached,
 * and the request must fit under the cap next to what is live. */
static bool trim_could_help(pool *p, size_t size)
{
    size_t allocated = (size_t)pool_stat_current(p, POOL_ST_ALLOCATED, POOL_ALL);
    if (size > p->cap || allocated + size > p->cap)
        return false;
    if (p->lru_head)
        return true;
    return p->expandable && pool_reserved_now(p) - allocated >= p->granularity;
}

static void fill_oom(pool *p, pool_oom_report *r, size_t bytes, pool_tag tag, uint32_t job,
                     int slot, bool limit_hit, pool_grow_fail why, const char *detail)
{
    memset(r, 0, sizeof *r);
    r->requested = bytes;
    r->allocated = (size_t)pool_stat_current(p, POOL_ST_ALLOCATED, POOL_ALL);
    r->reserved = pool_reserved_now(p);
    r->cap = p->cap;
    dev_mem_info(p->d, &r->device_free, &r->device_total);
    r->largest_free_block = pool_largest_free(p);
    if (slot >= 0) {
        r->job_allocated = (size_t)POOL_LD(p->live.jobs[slot].current);
        r->job_limit = (size_t)POOL_LD(p->live.jobs[slot].limit);
    }
    r->job = job;
    r->tag = tag;
    r->job_limit_hit = limit_hit;

    char rq[16], al[16], rs[16], cp[16], df[16], dt[16], lf[16], ja[16], jl[16];
    pool_fmt_size(r->requested, rq, sizeof rq);
    pool_fmt_size(r->allocated, al, sizeof al);
    pool_fmt_size(r->reserved, rs, sizeof rs);
    pool_fmt_size(r->cap, cp, sizeof cp);
    pool_fmt_size(r->device_free, df, sizeof df);
    pool_fmt_size(r->device_total, dt, sizeof dt);
    pool_fmt_size(r->largest_free_block, lf, sizeof lf);
    pool_fmt_size(r->job_allocated, ja, sizeof ja);
    pool_fmt_size(r->job_limit, jl, sizeof jl);
    const char *cause = "";
    char buf[200] = "";
    switch (why) {
    case POOL_GROW_CAP: cause = "the pool cap is reached"; break;
    case POOL_GROW_VA: cause = "the reserved address range is exhausted"; break;
    case POOL_GROW_HOST: cause = "the host is out of memory for bookkeeping"; break;
    case POOL_GROW_STREAMS:
        snprintf(buf, sizeof buf, "a new stream, and the pool already serves %d", POOL_MAX_STREAMS);
        cause = buf;
        break;
    case POOL_GROW_DEVICE:
        snprintf(buf, sizeof buf, "the device refused (%s)", detail && *detail ? detail : "out of memory");
        cause = buf;
        break;
    case POOL_GROW_OK: break;
    }
    if (limit_hit) {
        snprintf(r->message, sizeof r->message,
                 "job %u over its memory limit on %s: tried to allocate %s (%s) but the job holds %s "
                 "of its %s limit; pool allocated %s, reserved %s of cap %s; device free %s of %s; "
                 "largest free block %s",
                 job, p->d->id, rq, pool_tag_name(tag), ja, jl, al, rs, cp, df, dt, lf);
    } else if (slot < 0 && why == POOL_GROW_OK) {
        snprintf(r->message, sizeof r->message,
                 "out of memory on %s: tried to allocate %s (%s, job %u) but the pool already "
                 "tracks %d jobs holding memory",
                 p->d->id, rq, pool_tag_name(tag), job, POOL_MAX_JOBS);
    } else {
        snprintf(r->message, sizeof r->message,
                 "out of memory on %s: tried to allocate %s (%s, job %u): %s; pool allocated %s, "
                 "reserved %s of cap %s; device free %s of %s; largest free block %s",
                 p->d->id, rq, pool_tag_name(tag), job, cause, al, rs, cp, df, dt, lf);
    }
}

/* The slot of a stream's sub-pools, made on its first use; -1 when the
 * table is full or the host has no memory for the slot.  Under the mutex. */
static int stream_slot(pool *p, uintptr_t stream)
{
    int n = p->nsub / POOL_NSUB;
    for (int i = 0; i < n; i++)
        if (p->stream_key[i] == stream)
            return i;
    if (n == POOL_MAX_STREAMS || stream_slot_init(p, n) != 0)
        return -1;
    p->stream_key[n] = stream;
    return n;
}

void *pool_alloc(pool *p, size_t bytes, pool_tag tag, uint32_t job, pool_oom_report *oom)
{
    return pool_alloc_stream(p, bytes, tag, job, 0, oom);
}

void pool_set_reclaim(pool *p, pool_reclaim_fn fn, void *user)
{
    p->reclaim = fn;
    p->reclaim_user = user;
}

/* One attempt.  With `first` set and a reclaim hook, a failure for want of
 * device memory is not counted as an OOM: *reclaim says to ask the hook
 * and try again. */
static void *alloc_once(pool *p, size_t bytes, pool_tag tag, uint32_t job, uintptr_t stream,
                        pool_oom_report *oom, bool first, bool *reclaim)
{
    if ((unsigned)tag >= POOL_TAG_COUNT)
        tag = POOL_TAG_OTHER;
    size_t size = bytes > SIZE_MAX - POOL_ROUND ? SIZE_MAX : pool_round_up(bytes ? bytes : 1, POOL_ROUND);
    bool small = size <= POOL_SMALL_MAX;
    bool persistent = pool_tag_persistent(tag);

    pthread_mutex_lock(&p->lock);
    pool_grow_fail why = POOL_GROW_OK;
    char detail[160];
    detail[0] = 0;
    bool limit_hit = false;
    pool_block *b = NULL;
    bool hit = false;
    int base = stream ? stream_slot(p, stream) * POOL_NSUB : 0;
    pool_sub *sp = &p->sub[base < 0 ? 0 : base + pool_sub_index(small, persistent)];
    if (base < 0) {
        why = POOL_GROW_STREAMS;
        goto fail_unslotted;
    }

    /* Two block structs (split remainder, growth) and a map slot up front. */
    if (!pool_blk_reserve(p, 2) || !map_reserve(p)) {
        why = POOL_GROW_HOST;
        goto fail_unslotted;
    }
    int slot = p->last_job_slot;
    if (!(p->job_used[slot] && p->job_id[slot] == job)) {
        pool_stats_begin(p);
        slot = pool_job_slot(p, job, true);
        pool_stats_end(p);
        if (slot < 0)
            goto fail_unslotted;
    }
    pool_live_job *j = &p->live.jobs[slot];
    size_t limit = (size_t)POOL_LD(j->limit);
    if (limit && (size > limit || (size_t)POOL_LD(j->current) > limit - size)) {
        limit_hit = true;
        goto fail;
    }
    /* Past the cap nothing can help, and the segment arithmetic below
     * may assume sizes far from SIZE_MAX. */
    if (size > p->cap) {
        why = POOL_GROW_CAP;
        goto fail;
    }

    b = find_fit(p, sp, size);
    hit = b != NULL;
    if (!b)
        b = pool_seg_grow(p, sp, size, job, &why, detail, sizeof detail);
    if (!b && why != POOL_GROW_HOST && trim_could_help(p, size)) {
        pool_trim_locked(p, POOL_TRIM_OOM, 0);
        pool_stats_begin(p);
        pool_ctr_add(p, POOL_CTR_ALLOC_RETRIES, 1);
        pool_stats_end(p);
        b = find_fit(p, sp, size);
        if (!b)
            b = pool_seg_grow(p, sp, size, job, &why, detail, sizeof detail);
    }
    /* Last resort before OOM: the other lifetime's cached blocks. */
    if (!b && why != POOL_GROW_HOST) {
        b = find_fit(p, &p->sub[base + pool_sub_index(small, !persistent)], size);
        hit = b != NULL;
    }
    /* A trim on the way may have used the structs reserved above. */
    if (b && !pool_blk_reserve(p, 1)) {
        b = NULL;
        why = POOL_GROW_HOST;
    }
    if (!b && first && why == POOL_GROW_DEVICE && p->reclaim) {
        *reclaim = true;
        pthread_mutex_unlock(&p->lock);
        return NULL;
    }
    if (!b)
        goto fail;

    pool_stats_begin(p);
    take_block(p, b, size, bytes, tag, slot);
    if (hit)
        pool_ctr_add(p, POOL_CTR_CACHE_HITS, 1);
    pool_tl_record(p, POOL_EV_ALLOC, job, tag, b->seg->sub, size, b->addr, bytes);
    pool_stats_end(p);
    pthread_mutex_unlock(&p->lock);
    return (void *)b->addr;

fail_unslotted:
    slot = -1;
fail:
    pool_stats_begin(p);
    pool_ctr_add(p, POOL_CTR_OOMS, 1);
    pool_tl_record(p, POOL_EV_OOM, job, tag, (int)(sp - p->sub), bytes, 0, limit_hit);
    pool_stats_end(p);
    if (oom)
        fill_oom(p, oom, bytes, tag, job, slot, limit_hit, why, detail);
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

void *pool_alloc_stream(pool *p, size_t bytes, pool_tag tag, uint32_t job, uintptr_t stream,
                        pool_oom_report *oom)
{
    bool again = false;
    void *ptr = alloc_once(p, bytes, tag, job, stream, oom, true, &again);
    if (ptr || !again)
        return ptr;
    size_t size = bytes > SIZE_MAX - POOL_ROUND ? SIZE_MAX : pool_round_up(bytes ? bytes : 1, POOL_ROUND);
    if (p->reclaim(p->reclaim_user, size, job)) {
        pthread_mutex_lock(&p->lock);
        pool_stats_begin(p);
        pool_ctr_add(p, POOL_CTR_ALLOC_RETRIES, 1);
        pool_stats_end(p);
        pthread_mutex_unlock(&p->lock);
    }
    /* Tried again either way: the last attempt is the one that counts an
     * OOM and fills its report. */
    return alloc_once(p, bytes, tag, job, stream, oom, false, &again);
}

/* ==== free ======================================================================================================= */

void pool_free(pool *p, void *ptr)
{
    if (!ptr)
        return;
    pthread_mutex_lock(&p->lock);
    size_t i = map_find_slot(p, (uintptr_t)ptr);
    pool_block *b = p->map[i].b;
    pool_stats_begin(p);
    if (!b) {
        pool_ctr_add(p, POOL_CTR_INVALID_FREES, 1);
        pool_stats_end(p);
        pthread_mutex_unlock(&p->lock);
        return;
    }
    map_delete_at(p, i);

    pool_segment *seg = b->seg;
    bool small = seg->small;
    size_t sz = b->size;
    int tag = b->tag;
    pool_live_job *j = &p->live.jobs[b->job_slot];
    pool_stat_dec(p, POOL_ST_ALLOCATED, small, sz);
    pool_stat_dec(p, POOL_ST_REQUESTED, small, b->requested);
    pool_stat_dec(p, POOL_ST_ALLOCATIONS, small, 1);
    POOL_ST(p->live.tag_current[tag], POOL_LD(p->live.tag_current[tag]) - (int64_t)sz);
    POOL_ST(j->current, POOL_LD(j->current) - (int64_t)sz);
    POOL_ST(j->tag_current[tag], POOL_LD(j->tag_current[tag]) - (int64_t)sz);
    pool_tl_record(p, POOL_EV_FREE, POOL_LD(j->job), tag, seg->sub, sz, b->addr, 0);
    b->live = 0;

    pool_block *prev = b->prev, *next = b->next;
    if (prev && !prev->live) {
        pool_free_remove(p, prev);
        prev->size += b->size;
        prev->next = next;
        if (next)
            next->prev = prev;
        else
            seg->tail = prev;
        seg->nblocks--;
        pool_blk_put(p, b);
        b = prev;
    }
    if (next && !next->live) {
        pool_free_remove(p, next);
        b->size += next->size;
        b->next = next->next;
        if (next->next)
            next->next->prev = b;
        else
            seg->tail = b;
        seg->nblocks--;
        pool_blk_put(p, next);
    }
    pool_free_insert(p, b);
    pool_stats_end(p);
    pthread_mutex_unlock(&p->lock);
}

size_t pool_block_size(pool *p, const void *ptr)
{
    if (!ptr)
        return 0;
    pthread_mutex_lock(&p->lock);
    pool_block *b = p->map[map_find_slot(p, (uintptr_t)ptr)].b;
    size_t sz = b ? b->size : 0;
    pthread_mutex_unlock(&p->lock);
    return sz;
}
