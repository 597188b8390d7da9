/* pool.c — the caching allocator: blocks, segments, best fit, split, coalesce.
 *
 * The only file that brings device memory into the pool (dev_alloc,
 * dev_va_map); pool_trim.c gives it back through pool_seg_release and
 * pool_seg_unmap_chunks below.
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
    "params", "grads", "optimizer", "activations", "workspace", "data", "other",
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

/* ==== free trees and bins ========================================================== */

/* AVL trees keyed by (size, addr): one per sub-pool for the blocks no bin
 * takes, and one per size bin.  Best fit is the leftmost block not smaller
 * than the request, and among equal sizes the lowest address wins, which
 * keeps live memory packed toward segment starts. */

static inline bool blk_less(const pool_block *a, const pool_block *b)
{
    return a->size < b->size || (a->size == b->size && a->addr < b->addr);
}

static inline int32_t avl_h(const pool_block *b) { return b ? b->height : 0; }

static inline void avl_fix(pool_block *b)
{
    int32_t l = avl_h(b->left), r = avl_h(b->right);
    b->height = 1 + (l > r ? l : r);
}

static pool_block *avl_rot_right(pool_block *y)
{
    pool_block *x = y->left;
    y->left = x->right;
    x->right = y;
    avl_fix(y);
    avl_fix(x);
    return x;
}

static pool_block *avl_rot_left(pool_block *x)
{
    pool_block *y = x->right;
    x->right = y->left;
    y->left = x;
    avl_fix(x);
    avl_fix(y);
    return y;
}

static pool_block *avl_balance(pool_block *n)
{
    avl_fix(n);
    int32_t bf = avl_h(n->left) - avl_h(n->right);
    if (bf > 1) {
        if (avl_h(n->left->left) < avl_h(n->left->right))
            n->left = avl_rot_left(n->left);
        return avl_rot_right(n);
    }
    if (bf < -1) {
        if (avl_h(n->right->right) < avl_h(n->right->left))
            n->right = avl_rot_right(n->right);
        return avl_rot_left(n);
    }
    return n;
}

/* Insert and remove walk down recording the links they passed, then
 * rebalance upward only until a subtree keeps its height: above that point
 * nothing changed.  Most updates stop within a level or two, which is what
 * makes the tree updates cheap. */
#define AVL_MAX_DEPTH 96 /* AVL height <= 1.44 log2(n + 2): enough for any n */

static void avl_rebalance_up(pool_block **path[], int d)
{
    while (d > 0) {
        pool_block **link = path[--d];
        int32_t old = (*link)->height;
        *link = avl_balance(*link);
        if ((*link)->height == old)
            break;
    }
}

static void avl_insert(pool_block **root, pool_block *n)
{
    pool_block **path[AVL_MAX_DEPTH];
    int d = 0;
    pool_block **link = root;
    while (*link) {
        path[d++] = link;
        link = blk_less(n, *link) ? &(*link)->left : &(*link)->right;
    }
    n->left = n->right = NULL;
    n->height = 1;
    *link = n;
    avl_rebalance_up(path, d);
}

/* n must still carry the key it was inserted with. */
static void avl_remove(pool_block **root, pool_block *n)
{
    pool_block **path[AVL_MAX_DEPTH];
    int d = 0;
    pool_block **link = root;
    while (*link != n) {
        path[d++] = link;
        link = blk_less(n, *link) ? &(*link)->left : &(*link)->right;
    }
    if (!n->left || !n->right) {
        *link = n->left ? n->left : n->right;
    } else {
        /* Put n's successor (the leftmost of its right subtree) in its place. */
        int at = d;
        path[d++] = link;
        pool_block **ml = &n->right;
        while ((*ml)->left) {
            path[d++] = ml;
            ml = &(*ml)->left;
        }
        pool_block *m = *ml;
        *ml = m->right;
        m->left = n->left;
        m->right = n->right;
        m->height = n->height;
        *link = m;
        /* The link recorded as n->right now lives in m. */
        if (d > at + 1)
            path[at + 1] = &m->right;
    }
    avl_rebalance_up(path, d);
}

static pool_block *avl_rightmost(pool_block *n)
{
    while (n && n->right)
        n = n->right;
    return n;
}

/* ==== idle list ======================================================================= */

static void idle_push(pool *p, pool_segment *s)
{
    s->idle = 1;
    s->lru_next = NULL;
    s->lru_prev = p->lru_tail;
    if (p->lru_tail)
        p->lru_tail->lru_next = s;
    else
        p->lru_head = s;
    p->lru_tail = s;
}

static void idle_unlink(pool *p, pool_segment *s)
{
    if (s->lru_prev)
        s->lru_prev->lru_next = s->lru_next;
    else
        p->lru_head = s->lru_next;
    if (s->lru_next)
        s->lru_next->lru_prev = s->lru_prev;
    else
        p->lru_tail = s->lru_prev;
    s->lru_prev = s->lru_next = NULL;
    s->idle = 0;
}

/* ==== free block bookkeeping ============================================================ */

/* ---- bins ---- */

static inline size_t bin_of(size_t size) { return size / POOL_ROUND - 1; }

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

/* ---- insert and remove ---- */

/* Bins are nearly always empty or hold one block (on the training trace,
 * over 99% of insertions find the bin empty), so those cases skip the tree
 * code altogether. */
static inline void bin_insert(pool_bins *bn, pool_block *b)
{
    size_t c = bin_of(b->size);
    if (!bn->root[c]) {
        b->left = b->right = NULL;
        b->height = 1;
        bn->root[c] = b;
        bn->words[c / 64] |= (uint64_t)1 << (c % 64);
        bn->summary |= (uint64_t)1 << (c / 64);
        return;
    }
    avl_insert(&bn->root[c], b);
}

static inline void bin_remove(pool_bins *bn, pool_block *b)
{
    size_t c = bin_of(b->size);
    if (bn->root[c] != b || b->left || b->right) {
        avl_remove(&bn->root[c], b);
        return;
    }
    bn->root[c] = NULL;
    bn->words[c / 64] &= ~((uint64_t)1 << (c % 64));
    if (!bn->words[c / 64])
        bn->summary &= ~((uint64_t)1 << (c / 64));
}

/* Every change to a free block's size or neighbours goes remove → change →
 * insert, so the split statistics and the idle list follow the bins. */
static inline void free_insert(pool *p, pool_block *b)
{
    pool_segment *seg = b->seg;
    pool_sub *sp = pool_sub_of(p, seg);
    if (sp->bins && b->size <= POOL_BIN_MAX) {
        bin_insert(sp->bins, b);
    } else {
        avl_insert(&sp->root, b);
        if (!sp->max || blk_less(sp->max, b))
            sp->max = b;
    }
    sp->nfree++;
    if (b->size > p->largest)
        p->largest = b->size;
    if (!b->prev && !b->next) {
        idle_push(p, seg);
    } else {
        b->split_counted = 1;
        pool_stat_inc(p, POOL_ST_INACTIVE_SPLIT, seg->small, b->size);
        pool_stat_inc(p, POOL_ST_INACTIVE_SPLIT_BLOCKS, seg->small, 1);
    }
}

static inline void free_remove(pool *p, pool_block *b)
{
    pool_segment *seg = b->seg;
    pool_sub *sp = pool_sub_of(p, seg);
    if (sp->bins && b->size <= POOL_BIN_MAX) {
        bin_remove(sp->bins, b);
    } else {
        avl_remove(&sp->root, b);
        if (sp->max == b)
            sp->max = avl_rightmost(sp->root);
    }
    b->left = b->right = NULL;
    b->height = 0;
    sp->nfree--;
    if (b->size == p->largest)
        p->largest_stale = true;
    if (b->split_counted) {
        b->split_counted = 0;
        pool_stat_dec(p, POOL_ST_INACTIVE_SPLIT, seg->small, b->size);
        pool_stat_dec(p, POOL_ST_INACTIVE_SPLIT_BLOCKS, seg->small, 1);
    }
    if (seg->idle)
        idle_unlink(p, seg);
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

/* ==== jobs ======================================================================================= */

static void job_claim(pool *p, int slot, uint32_t job)
{
    pool_live_job *j = &p->live.jobs[slot];
    p->job_used[slot] = 1;
    p->job_id[slot] = job;
    POOL_ST(j->job, job);
    POOL_ST(j->current, 0);
    POOL_ST(j->peak, 0);
    POOL_ST(j->limit, 0);
    for (int t = 0; t < POOL_TAG_COUNT; t++) {
        POOL_ST(j->tag_current[t], 0);
        POOL_ST(j->tag_peak[t], 0);
    }
    POOL_ST(j->used, 1);
}

void pool_job_release_slot(pool *p, int slot)
{
    pool_live_job *j = &p->live.jobs[slot];
    p->job_used[slot] = 0;
    POOL_ST(j->used, 0);
    POOL_ST(j->job, 0);
    POOL_ST(j->peak, 0);
    POOL_ST(j->limit, 0);
    POOL_ST(j->need, 0);
}

/* The job's row, made when create is set; -1 when the table is full of
 * jobs that hold memory or limits.  Called inside a section. */
static int job_slot(pool *p, uint32_t job, bool create)
{
    int s = p->last_job_slot;
    if (p->job_used[s] && p->job_id[s] == job)
        return s;
    for (int i = 0; i < POOL_MAX_JOBS; i++) {
        if (p->job_used[i] && p->job_id[i] == job) {
            p->last_job_slot = i;
            return i;
        }
    }
    if (!create)
        return -1;
    int free_slot = -1;
    for (int i = 0; i < POOL_MAX_JOBS && free_slot < 0; i++)
        if (!p->job_used[i])
            free_slot = i;
    /* Rows of jobs that ended without pool_job_forget are reused once they
     * hold nothing. */
    for (int i = 0; i < POOL_MAX_JOBS && free_slot < 0; i++) {
        pool_live_job *j = &p->live.jobs[i];
        if (POOL_LD(j->current) == 0 && POOL_LD(j->limit) == 0) {
            pool_job_release_slot(p, i);
            free_slot = i;
        }
    }
    if (free_slot < 0)
        return -1;
    job_claim(p, free_slot, job);
    p->last_job_slot = free_slot;
    return free_slot;
}

int pool_job_set_limit(pool *p, uint32_t job, size_t bytes)
{
    pthread_mutex_lock(&p->lock);
    pool_stats_begin(p);
    int s = job_slot(p, job, true);
    if (s >= 0)
        POOL_ST(p->live.jobs[s].limit, bytes);
    pool_stats_end(p);
    pthread_mutex_unlock(&p->lock);
    return s >= 0 ? 0 : -1;
}

int pool_job_set_need(pool *p, uint32_t job, size_t bytes)
{
    pthread_mutex_lock(&p->lock);
    pool_stats_begin(p);
    int s = job_slot(p, job, true);
    if (s >= 0)
        POOL_ST(p->live.jobs[s].need, bytes);
    pool_stats_end(p);
    pthread_mutex_unlock(&p->lock);
    return s >= 0 ? 0 : -1;
}

void pool_fit_begin(pool *p)
{
    pthread_mutex_lock(&p->fit_lock);
}

void pool_fit_end(pool *p)
{
    pthread_mutex_unlock(&p->fit_lock);
}

void pool_job_reset_peak(pool *p, uint32_t job)
{
    pthread_mutex_lock(&p->lock);
    pool_stats_begin(p);
    int s = job_slot(p, job, false);
    if (s >= 0)
        POOL_ST(p->live.jobs[s].peak, POOL_LD(p->live.jobs[s].current));
    pool_stats_end(p);
    pthread_mutex_unlock(&p->lock);
}

void pool_job_forget(pool *p, uint32_t job)
{
    pthread_mutex_lock(&p->lock);
    pool_stats_begin(p);
    int s = job_slot(p, job, false);
    if (s >= 0 && POOL_LD(p->live.jobs[s].current) == 0)
        pool_job_release_slot(p, s);
    pool_stats_end(p);
    pthread_mutex_unlock(&p->lock);
}

/* ==== creation ===================================================================================== */

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
    for (int i = 0; i < POOL_NSUB; i++) {
        p->sub[i].small = i % 2 == 0;
        p->sub[i].persistent = i >= 2;
        /* Large free blocks come in too many sizes for exact bins; the
         * large pool keeps the tree alone. */
        if (p->sub[i].small && !(p->sub[i].bins = calloc(1, sizeof *p->sub[i].bins)))
            goto fail;
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
        /* Twice the cap: the holes trims punch can push a run's end above
         * the cap, and reserving address space costs nothing. */
        size_t va = pool_round_up(p->cap, g) * 2;
        for (int i = 0; i < POOL_NSUB; i++) {
            void *base = NULL;
            if (dev_va_reserve(d, va, &base) != DEV_OK)
                goto fail;
            p->sub[i].va_base = (uintptr_t)base;
            p->sub[i].va_size = va;
        }
        p->granularity = g;
        p->expandable = true;
    }
    p->t0_ns = pool_now_ns();
    p->last_periodic_ns = p->t0_ns;
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
    for (int i = 0; i < POOL_NSUB; i++) {
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
    free(p->ring);
    pthread_mutex_destroy(&p->fit_lock);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

/* ==== best fit ======================================================================================== */

/* The smallest free block >= size, the lowest address among equals.
 * Binned blocks are all smaller than the tree's, so a non-empty bin at or
 * above size's wins outright, and the tree is searched only without one. */
static pool_block *find_fit(pool *p, pool_sub *sp, size_t size)
{
    pool_block *best = NULL;
    if (sp->bins && size <= POOL_BIN_MAX) {
        long c = bins_first(sp->bins, bin_of(size));
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
    free_remove(p, b);
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
        free_insert(p, r);
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

/* ==== growth: fixed segments ============================================================================ */

enum grow_fail { GROW_OK, GROW_CAP, GROW_DEVICE, GROW_HOST, GROW_VA };

static size_t reserved_now(pool *p) { return (size_t)pool_stat_current(p, POOL_ST_RESERVED, POOL_ALL); }

/* The gc_threshold policy, applied where it matters most: just before the
 * pool would take more memory from the device. */
static void gc_before_growth(pool *p, size_t extra)
{
    if (p->cfg.gc_threshold > 0)
        pool_gc_locked(p, (size_t)(p->cfg.gc_threshold * (double)p->cap), extra);
}

static pool_block *grow_fixed(pool *p, pool_sub *sp, size_t size, uint32_t job,
                              enum grow_fail *why, char *detail, size_t detail_len)
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
        *why = GROW_HOST;
        return NULL;
    }
    gc_before_growth(p, want);
    if (!pool_blk_reserve(p, 2)) { /* the GC's trim may have used them */
        free(seg);
        *why = GROW_HOST;
        return NULL;
    }
    void *ptr = NULL;
    size_t got = 0;
    for (int attempt = 0; attempt < 2 && !got; attempt++) {
        size_t s = attempt == 0 ? want : least;
        if (attempt == 1 && s == want)
            break;
        if (reserved_now(p) + s > p->cap) {
            *why = GROW_CAP;
            continue;
        }
        dev_status st = dev_alloc(p->d, s, &ptr);
        if (st == DEV_OK) {
            got = s;
        } else {
            *why = GROW_DEVICE;
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
    free_insert(p, b);
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
                                   enum grow_fail *why, char *detail, size_t detail_len)
{
    bool small = sp->small;
    grow_site site;
    if (!find_site(p, sp, size, &site)) {
        *why = GROW_VA;
        return NULL;
    }
    gc_before_growth(p, site.len);
    if (!pool_blk_reserve(p, 2)) { /* the GC's trim may have used them */
        *why = GROW_HOST;
        return NULL;
    }
    /* The GC may have unmapped the neighbours the site leaned on. */
    if (!find_site(p, sp, size, &site)) {
        *why = GROW_VA;
        return NULL;
    }
    if (reserved_now(p) + site.len > p->cap) {
        *why = GROW_CAP;
        return NULL;
    }
    pool_segment *fresh = calloc(1, sizeof *fresh);
    if (!fresh) {
        *why = GROW_HOST;
        return NULL;
    }
    if (dev_va_map(p->d, (void *)site.at, site.len) != DEV_OK) {
        *why = GROW_DEVICE;
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
        free_remove(p, left);
    if (right)
        free_remove(p, right);

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
    free_insert(p, nb);
    pool_stats_end(p);
    return nb;
}

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
    free_remove(p, b);
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
        free_insert(p, b);
    if (rb)
        free_insert(p, rb);
    pool_stats_end(p);

    dev_va_unmap(p->d, (void *)a0, len);
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
    free_remove(p, b);
    pool_seg_unlink(p, s);
    pool_stat_dec(p, POOL_ST_RESERVED, small, s->size);
    pool_stat_dec(p, POOL_ST_SEGMENTS, small, 1);
    pool_ctr_add(p, POOL_CTR_DEVICE_FREES, 1);
    pool_tl_record(p, POOL_EV_SEGMENT_UNMAP, 0, POOL_TAG_OTHER, s->sub, s->size, s->addr, 0);
    pool_stats_end(p);
    dev_free(p->d, (void *)s->addr, s->size);
    pool_blk_put(p, b);
    free(s);
}

/* ==== allocation ============================================================================================= */

static pool_block *grow(pool *p, pool_sub *sp, size_t size, uint32_t job, enum grow_fail *why,
                        char *detail, size_t detail_len)
{
    if (p->expandable)
        return grow_expandable(p, sp, size, job, why, detail, detail_len);
    return grow_fixed(p, sp, size, job, why, detail, detail_len);
}

/* Whether releasing the cache could make room: something must be cached,
 * and the request must fit under the cap next to what is live. */
static bool trim_could_help(pool *p, size_t size)
{
    size_t allocated = (size_t)pool_stat_current(p, POOL_ST_ALLOCATED, POOL_ALL);
    if (size > p->cap || allocated + size > p->cap)
        return false;
    if (p->lru_head)
        return true;
    return p->expandable && reserved_now(p) - allocated >= p->granularity;
}

static void fill_oom(pool *p, pool_oom_report *r, size_t bytes, pool_tag tag, uint32_t job,
                     int slot, bool limit_hit, enum grow_fail why, const char *detail)
{
    memset(r, 0, sizeof *r);
    r->requested = bytes;
    r->allocated = (size_t)pool_stat_current(p, POOL_ST_ALLOCATED, POOL_ALL);
    r->reserved = reserved_now(p);
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
    case GROW_CAP: cause = "the pool cap is reached"; break;
    case GROW_VA: cause = "the reserved address range is exhausted"; break;
    case GROW_HOST: cause = "the host is out of memory for bookkeeping"; break;
    case GROW_DEVICE:
        snprintf(buf, sizeof buf, "the device refused (%s)", detail && *detail ? detail : "out of memory");
        cause = buf;
        break;
    case GROW_OK: break;
    }
    if (limit_hit) {
        snprintf(r->message, sizeof r->message,
                 "job %u over its memory limit on %s: tried to allocate %s (%s) but the job holds %s "
                 "of its %s limit; pool allocated %s, reserved %s of cap %s; device free %s of %s; "
                 "largest free block %s",
                 job, p->d->id, rq, pool_tag_name(tag), ja, jl, al, rs, cp, df, dt, lf);
    } else if (slot < 0 && why == GROW_OK) {
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

void *pool_alloc(pool *p, size_t bytes, pool_tag tag, uint32_t job, pool_oom_report *oom)
{
    if ((unsigned)tag >= POOL_TAG_COUNT)
        tag = POOL_TAG_OTHER;
    size_t size = bytes > SIZE_MAX - POOL_ROUND ? SIZE_MAX : pool_round_up(bytes ? bytes : 1, POOL_ROUND);
    bool small = size <= POOL_SMALL_MAX;
    bool persistent = pool_tag_persistent(tag);
    pool_sub *sp = &p->sub[pool_sub_index(small, persistent)];

    pthread_mutex_lock(&p->lock);
    enum grow_fail why = GROW_OK;
    char detail[160];
    detail[0] = 0;
    bool limit_hit = false;
    pool_block *b = NULL;
    bool hit = false;

    /* Two block structs (split remainder, growth) and a map slot up front. */
    if (!pool_blk_reserve(p, 2) || !map_reserve(p)) {
        why = GROW_HOST;
        goto fail_unslotted;
    }
    int slot = p->last_job_slot;
    if (!(p->job_used[slot] && p->job_id[slot] == job)) {
        pool_stats_begin(p);
        slot = job_slot(p, job, true);
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
        why = GROW_CAP;
        goto fail;
    }

    b = find_fit(p, sp, size);
    hit = b != NULL;
    if (!b)
        b = grow(p, sp, size, job, &why, detail, sizeof detail);
    if (!b && why != GROW_HOST && trim_could_help(p, size)) {
        pool_trim_locked(p, POOL_TRIM_OOM, 0);
        pool_stats_begin(p);
        pool_ctr_add(p, POOL_CTR_ALLOC_RETRIES, 1);
        pool_stats_end(p);
        b = find_fit(p, sp, size);
        if (!b)
            b = grow(p, sp, size, job, &why, detail, sizeof detail);
    }
    /* Last resort before OOM: the other lifetime's cached blocks. */
    if (!b && why != GROW_HOST) {
        b = find_fit(p, &p->sub[pool_sub_index(small, !persistent)], size);
        hit = b != NULL;
    }
    /* A trim on the way may have used the structs reserved above. */
    if (b && !pool_blk_reserve(p, 1)) {
        b = NULL;
        why = GROW_HOST;
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
        free_remove(p, prev);
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
        free_remove(p, next);
        b->size += next->size;
        b->next = next->next;
        if (next->next)
            next->next->prev = b;
        else
            seg->tail = b;
        seg->nblocks--;
        pool_blk_put(p, next);
    }
    free_insert(p, b);
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
