/* pool_segment.c — segments: the sub-pools' segment lists, growth (a new
 * fixed segment, or a newly mapped run of an expandable segment's reserved
 * range) and giving a segment back.
 *
 * The only file that brings device memory into the pool (dev_alloc,
 * dev_va_map); pool_trim.c gives it back through pool_seg_release and
 * pool_seg_unmap_chunks below.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* for clock_gettime etc. under -std=c11 */
#endif
#include "pool_internal.h"

#include <stdio.h>
#include <stdlib.h>

/* ==== segment lists ========================================================================= */

/* Both kinds of segment list are kept in address order: the check walks
 * them once for overlaps, and expandable growth walks the holes between. */
void pool_seg_link(pool *p, pool_segment *s)
{
    pool_sub *sp = pool_sub_of(p, s);
    pool_segment *after = sp->segs_tail;
    while (after && after->addr > s->addr)
        after = after->prev;
    s->prev = after;
    s->next = after ? after->next : sp->segs;
    if (s->next)
        s->next->prev = s;
    else
        sp->segs_tail = s;
    if (after)
        after->next = s;
    else
        sp->segs = s;
    sp->nsegs++;
}

void pool_seg_unlink(pool *p, pool_segment *s)
{
    pool_sub *sp = pool_sub_of(p, s);
    if (s->prev)
        s->prev->next = s->next;
    else
        sp->segs = s->next;
    if (s->next)
        s->next->prev = s->prev;
    else
        sp->segs_tail = s->prev;
    s->prev = s->next = NULL;
    sp->nsegs--;
}

/* ==== growth: fixed segments ============================================================================ */

/* The gc_threshold policy, applied where it matters most: just before the
 * pool would take more memory from the device. */
static void gc_before_growth(pool *p, size_t extra)
{
    if (p->cfg.gc_threshold > 0)
        pool_gc_locked(p, (size_t)(p->cfg.gc_threshold * (double)p->cap), extra);
}

static pool_block *grow_fixed(pool *p, pool_sub *sp, size_t size, uint32_t job,
                              pool_grow_fail *why, char *detail, size_t detail_len)
{
    bool small = sp->small;
    size_t least = small ? POOL_SMALL_SEGMENT : pool_round_up(size, POOL_LARGE_ROUND);
    size_t want = least;
    /* Mid-sized requests share 20 MiB segments, so a run of them costs one
     * device call instead of one each; an oversize segment for a request
     * that may not take an oversize block would be all waste. */
    if (!small && size < POOL_MID_MAX && POOL_MID_SEGMENT < p->cfg.max_split_size)
        want = POOL_MID_SEGMENT;

    pool_segment *seg = calloc(1, sizeof *seg);
    if (!seg) {
        *why = POOL_GROW_HOST;
        return NULL;
    }
    gc_before_growth(p, want);
    if (!pool_blk_reserve(p, 2)) { /* the GC's trim may have used them */
        free(seg);
        *why = POOL_GROW_HOST;
        return NULL;
    }
    void *ptr = NULL;
    size_t got = 0;
    for (int attempt = 0; attempt < 2 && !got; attempt++) {
        size_t s = attempt == 0 ? want : least;
        if (attempt == 1 && s == want)
            break;
        if (pool_reserved_now(p) + s > p->cap) {
            *why = POOL_GROW_CAP;
            continue;
        }
        dev_status st = dev_alloc(p->d, s, &ptr);
        if (st == DEV_OK) {
            got = s;
        } else {
            *why = POOL_GROW_DEVICE;
            snprintf(detail, detail_len, "%s", dev_last_error(p->d));
        }
    }
    if (!got) {
        free(seg);
        return NULL;
    }

    pool_block *b = pool_blk_new(p);
    seg->addr = (uintptr_t)ptr;
    seg->size = got;
    seg->small = small;
    seg->sub = (uint8_t)(sp - p->sub);
    seg->head = seg->tail = b;
    seg->nblocks = 1;
    b->addr = seg->addr;
    b->size = got;
    b->seg = seg;

    pool_stats_begin(p);
    pool_seg_link(p, seg);
    pool_stat_inc(p, POOL_ST_RESERVED, small, got);
    pool_stat_inc(p, POOL_ST_SEGMENTS, small, 1);
    pool_ctr_add(p, POOL_CTR_DEVICE_ALLOCS, 1);
    pool_tl_record(p, POOL_EV_SEGMENT_MAP, job, POOL_TAG_OTHER, seg->sub, got, seg->addr, 0);
    pool_free_insert(p, b);
    pool_stats_end(p);
    return b;
}

/* ==== growth: expandable segments ========================================================================= */

/* A place to map: `len` bytes at `at`, in the hole between runs `before`
 * and `after` (either may be NULL). */
typedef struct {
    uintptr_t at;
    size_t len;
    pool_segment *before, *after;
} grow_site;

/* The hole that needs the fewest new bytes wins: mapping next to a free
 * tail (or head) block reuses it, which is what keeps reserved close to
 * allocated.  Ties go to the lowest address. */
static bool find_site(pool *p, pool_sub *sp, size_t size, grow_site *best)
{
    size_t g = p->granularity;
    best->len = SIZE_MAX;
    pool_segment *prev = NULL;
    for (pool_segment *s = sp->segs;; s = s->next) {
        uintptr_t gs = prev ? prev->addr + prev->size : sp->va_base;
        uintptr_t ge = s ? s->addr : sp->va_base + sp->va_size;
        size_t gap = ge - gs;
        if (gap > 0) {
            size_t tail_free = prev && !prev->tail->live ? prev->tail->size : 0;
            size_t head_free = s && !s->head->live ? s->head->size : 0;
            /* A miss means every free block is smaller than size. */
            size_t a = size > tail_free ? pool_round_up(size - tail_free, g) : g;
            size_t b = size > head_free ? pool_round_up(size - head_free, g) : g;
            if (a <= gap && a < best->len)
                *best = (grow_site){gs, a, prev, s};
            if (b <= gap && b < best->len)
                *best = (grow_site){ge - b, b, prev, s};
            if (tail_free + gap + head_free >= size && gap < best->len)
                *best = (grow_site){gs, gap, prev, s};
        }
        if (!s)
            break;
        prev = s;
    }
    return best->len != SIZE_MAX;
}

/* Move run `from`'s blocks into run `to`. */
static void adopt_blocks(pool_segment *to, pool_segment *from)
{
    for (pool_block *b = from->head; b; b = b->next)
        b->seg = to;
    to->nblocks += from->nblocks;
}

static pool_block *grow_expandable(pool *p, pool_sub *sp, size_t size, uint32_t job,
                                   pool_grow_fail *why, char *detail, size_t detail_len)
{
    bool small = sp->small;
    grow_site site;
    if (!find_site(p, sp, size, &site)) {
        *why = POOL_GROW_VA;
        return NULL;
    }
    gc_before_growth(p, site.len);
    if (!pool_blk_reserve(p, 2)) { /* the GC's trim may have used them */
        *why = POOL_GROW_HOST;
        return NULL;
    }
    /* The GC may have unmapped the neighbours the site leaned on. */
    if (!find_site(p, sp, size, &site)) {
        *why = POOL_GROW_VA;
        return NULL;
    }
    if (pool_reserved_now(p) + site.len > p->cap) {
        *why = POOL_GROW_CAP;
        return NULL;
    }
    pool_segment *fresh = calloc(1, sizeof *fresh);
    if (!fresh) {
        *why = POOL_GROW_HOST;
        return NULL;
    }
    if (dev_va_map(p->d, (void *)site.at, site.len) != DEV_OK) {
        *why = POOL_GROW_DEVICE;
        snprintf(detail, detail_len, "%s", dev_last_error(p->d));
        free(fresh);
        return NULL;
    }

    pool_segment *before = site.before && site.before->addr + site.before->size == site.at
                               ? site.before : NULL;
    pool_segment *after = site.after && site.at + site.len == site.after->addr ? site.after : NULL;
    pool_block *nb = pool_blk_new(p);
    nb->addr = site.at;
    nb->size = site.len;

    pool_stats_begin(p);
    pool_stat_inc(p, POOL_ST_RESERVED, small, site.len);
    pool_ctr_add(p, POOL_CTR_DEVICE_ALLOCS, 1);
    pool_tl_record(p, POOL_EV_SEGMENT_MAP, job, POOL_TAG_OTHER, (int)(sp - p->sub), site.len,
                   site.at, 0);

    /* Take the free neighbours out while their runs are still as they were
     * (the idle list is keyed by run). */
    pool_block *left = before && !before->tail->live ? before->tail : NULL;
    pool_block *right = after && !after->head->live ? after->head : NULL;
    if (left)
        pool_free_remove(p, left);
    if (right)
        pool_free_remove(p, right);

    pool_segment *run;
    if (before && after) {
        /* The hole is filled: one run from here on.  Relabel the smaller. */
        pool_segment *keep = before->nblocks >= after->nblocks ? before : after;
        pool_segment *drop = keep == before ? after : before;
        adopt_blocks(keep, drop);
        before->tail->next = nb;
        nb->prev = before->tail;
        nb->next = after->head;
        after->head->prev = nb;
        keep->head = before->head;
        keep->tail = after->tail;
        keep->size = before->size + site.len + after->size;
        keep->addr = before->addr;
        pool_seg_unlink(p, drop);
        free(drop);
        pool_stat_dec(p, POOL_ST_SEGMENTS, small, 1);
        run = keep;
        free(fresh);
    } else if (before) {
        before->tail->next = nb;
        nb->prev = before->tail;
        before->tail = nb;
        before->size += site.len;
        run = before;
        free(fresh);
    } else if (after) {
        nb->next = after->head;
        after->head->prev = nb;
        after->head = nb;
        after->addr = site.at;
        after->size += site.len;
        run = after;
        free(fresh);
    } else {
        fresh->addr = site.at;
        fresh->size = site.len;
        fresh->small = small;
        fresh->sub = (uint8_t)(sp - p->sub);
        fresh->head = fresh->tail = nb;
        pool_seg_link(p, fresh);
        pool_stat_inc(p, POOL_ST_SEGMENTS, small, 1);
        run = fresh;
    }
    nb->seg = run;
    run->nblocks++;

    /* Coalesce with the free neighbours taken out above. */
    if (left) {
        left->size += nb->size;
        left->next = nb->next;
        if (nb->next)
            nb->next->prev = left;
        else
            run->tail = left;
        run->nblocks--;
        pool_blk_put(p, nb);
        nb = left;
    }
    if (right) {
        nb->size += right->size;
        nb->next = right->next;
        if (right->next)
            right->next->prev = nb;
        else
            run->tail = nb;
        run->nblocks--;
        pool_blk_put(p, right);
    }
    pool_free_insert(p, nb);
    pool_stats_end(p);
    return nb;
}

pool_block *pool_seg_grow(pool *p, pool_sub *sp, size_t size, uint32_t job, pool_grow_fail *why,
                          char *detail, size_t detail_len)
{
    if (p->expandable)
        return grow_expandable(p, sp, size, job, why, detail, detail_len);
    return grow_fixed(p, sp, size, job, why, detail, detail_len);
}

/* ==== giving segments back ================================================================ */

/* The run splits around the hole; see pool_internal.h. */
size_t pool_seg_unmap_chunks(pool *p, pool_block *b, uint32_t job)
{
    size_t g = p->granularity;
    pool_segment *run = b->seg;
    uintptr_t a0 = pool_round_up(b->addr, g);
    uintptr_t a1 = pool_round_down(b->addr + b->size, g);
    if (a1 <= a0)
        return 0;
    size_t len = a1 - a0;
    size_t left = a0 - b->addr, right = b->addr + b->size - a1;
    bool has_left = left > 0 || b->prev;
    bool has_right = right > 0 || b->next;
    bool small = run->small;
    int sub = run->sub;
    uintptr_t run_end = run->addr + run->size;

    pool_segment *split = NULL;
    pool_block *rb = NULL;
    if (has_left && has_right && !(split = calloc(1, sizeof *split)))
        return 0;
    if (right > 0 && !(rb = pool_blk_new(p))) {
        free(split);
        return 0;
    }

    pool_stats_begin(p);
    pool_free_remove(p, b);
    pool_block *rhead = NULL, *rtail = NULL;
    if (has_right) {
        if (rb) {
            rb->addr = a1;
            rb->size = right;
            rb->next = b->next;
            if (b->next)
                b->next->prev = rb;
            rhead = rb;
        } else {
            rhead = b->next;
            rhead->prev = NULL;
        }
        rtail = b->next ? run->tail : rb;
    }
    bool keep_b = left > 0;
    if (has_left) {
        if (keep_b) {
            b->size = left;
            b->next = NULL;
            run->tail = b;
        } else {
            b->prev->next = NULL;
            run->tail = b->prev;
        }
    }

    if (has_left && has_right) {
        split->addr = a1;
        split->size = run_end - a1;
        split->small = small;
        split->sub = run->sub;
        split->head = rhead;
        split->tail = rtail;
        size_t moved = 0;
        for (pool_block *x = rhead; x; x = x->next) {
            x->seg = split;
            moved++;
        }
        split->nblocks = moved;
        run->nblocks -= moved - (rb ? 1 : 0) + (keep_b ? 0 : 1);
        run->size = a0 - run->addr;
        pool_seg_link(p, split);
        pool_stat_inc(p, POOL_ST_SEGMENTS, small, 1);
    } else if (has_right) {
        /* Nothing left of the hole: the run now starts after it. */
        run->addr = a1;
        run->size = run_end - a1;
        run->head = rhead;
        run->tail = rtail;
        if (rb)
            rb->seg = run;
        run->nblocks = run->nblocks - 1 + (rb ? 1 : 0);
    } else if (has_left) {
        run->size = a0 - run->addr;
        if (!keep_b)
            run->nblocks--;
    } else {
        pool_seg_unlink(p, run);
        pool_stat_dec(p, POOL_ST_SEGMENTS, small, 1);
    }

    pool_stat_dec(p, POOL_ST_RESERVED, small, len);
    pool_ctr_add(p, POOL_CTR_DEVICE_FREES, 1);
    pool_tl_record(p, POOL_EV_SEGMENT_UNMAP, job, POOL_TAG_OTHER, sub, len, a0, 0);
    if (keep_b)
        pool_free_insert(p, b);
    if (rb)
        pool_free_insert(p, rb);
    pool_stats_end(p);

    pool_dev_release(p, a0, len, true);
    if (!keep_b)
        pool_blk_put(p, b);
    if (!has_left && !has_right)
        free(run);
    return len;
}

void pool_seg_release(pool *p, pool_segment *s)
{
    if (p->expandable) {
        /* Runs start and end on granularity boundaries, so the whole run
         * is one chunk range and the run disappears. */
        pool_seg_unmap_chunks(p, s->head, 0);
        return;
    }
    pool_block *b = s->head;
    bool small = s->small;
    pool_stats_begin(p);
    pool_free_remove(p, b);
    pool_seg_unlink(p, s);
    pool_stat_dec(p, POOL_ST_RESERVED, small, s->size);
    pool_stat_dec(p, POOL_ST_SEGMENTS, small, 1);
    pool_ctr_add(p, POOL_CTR_DEVICE_FREES, 1);
    pool_tl_record(p, POOL_EV_SEGMENT_UNMAP, 0, POOL_TAG_OTHER, s->sub, s->size, s->addr, 0);
    pool_stats_end(p);
    pool_dev_release(p, s->addr, s->size, false);
    pool_blk_put(p, b);
    free(s);
}

static void dev_release_now(pool *p, uintptr_t addr, size_t len, bool va)
{
    if (va)
        dev_va_unmap(p->d, (void *)addr, len);
    else
        dev_free(p->d, (void *)addr, len);
}

void pool_dev_release(pool *p, uintptr_t addr, size_t len, bool va)
{
    if (p->stats_depth == 0) {
        dev_release_now(p, addr, len, va);
        return;
    }
    if (p->npending == p->cap_pending) {
        size_t cap = p->cap_pending ? 2 * p->cap_pending : 16;
        pool_dev_pending *n = realloc(p->pending, cap * sizeof *n);
        if (!n) {
            /* Host out of memory: a reader waits on this one call. */
            dev_release_now(p, addr, len, va);
            return;
        }
        p->pending = n;
        p->cap_pending = cap;
    }
    p->pending[p->npending++] = (pool_dev_pending){.addr = addr, .len = len, .va = va};
}

void pool_dev_flush(pool *p)
{
    for (size_t i = 0; i < p->npending; i++)
        dev_release_now(p, p->pending[i].addr, p->pending[i].len, p->pending[i].va);
    p->npending = 0;
}

