/* pool_check.c — the exhaustive invariant check, for tests and debugging.
 *
 * Walks every segment and block, the free bins and trees, the pointer map
 * and the idle list, recomputes every figure the pool keeps incrementally, and
 * compares.  O(n log n) in blocks; meant to run after every operation in
 * randomised tests, never on a production path.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* for clock_gettime etc. under -std=c11 */
#endif
#include "pool_internal.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>

typedef struct {
    char *err;
    size_t err_len;
} check_ctx;

static int fail(check_ctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (c->err && c->err_len)
        vsnprintf(c->err, c->err_len, fmt, ap);
    va_end(ap);
    return -1;
}

/* ==== free bins and trees ================================================================== */

static bool key_less(const pool_block *a, const pool_block *b)
{
    return a->size < b->size || (a->size == b->size && a->addr < b->addr);
}

/* Returns the height, or -1 after filling err.  bin_size: every block's
 * size in a bin's tree; 0 for the tree of bigger blocks. */
static int check_tree(check_ctx *c, const pool *p, const pool_sub *sp, const pool_block *n,
                      size_t bin_size, const pool_block **last, size_t *count)
{
    if (!n)
        return 0;
    int hl = check_tree(c, p, sp, n->left, bin_size, last, count);
    if (hl < 0)
        return -1;
    if (n->live)
        return fail(c, "live block %#" PRIxPTR " is in the free tree", n->addr);
    if (&p->sub[n->seg->sub] != sp)
        return fail(c, "free block %#" PRIxPTR " is in the wrong pool's tree", n->addr);
    if (*last && !key_less(*last, n))
        return fail(c, "free tree out of order at %#" PRIxPTR, n->addr);
    if (bin_size && n->size != bin_size)
        return fail(c, "free block %#" PRIxPTR " of %zu bytes is in the %zu-byte bin", n->addr,
                    n->size, bin_size);
    *last = n;
    (*count)++;
    int hr = check_tree(c, p, sp, n->right, bin_size, last, count);
    if (hr < 0)
        return -1;
    int h = 1 + (hl > hr ? hl : hr);
    if (n->height != h)
        return fail(c, "free tree height wrong at %#" PRIxPTR ": %d, should be %d", n->addr,
                    (int)n->height, h);
    if (hl - hr > 1 || hr - hl > 1)
        return fail(c, "free tree unbalanced at %#" PRIxPTR, n->addr);
    return h;
}

static size_t avl_min_size(const pool_block *n)
{
    while (n->left)
        n = n->left;
    return n->size;
}

static bool tree_holds(const pool_block *root, const pool_block *b)
{
    while (root && root != b)
        root = key_less(b, root) ? root->left : root->right;
    return root == b;
}

/* The bin or tree a free block of this size belongs in. */
static const pool_block *free_root(const pool_sub *sp, size_t size)
{
    if (sp->bins && size <= POOL_BIN_MAX)
        return sp->bins->root[size / POOL_ROUND - 1];
    return sp->root;
}

/* Every bin is a valid tree of blocks of exactly its size, and the bitmaps
 * say which bins are non-empty.  The tree holds only what no bin takes.
 * Adds the blocks seen to *count. */
static int check_bins(check_ctx *c, const pool *p, const pool_sub *sp, const char *name, size_t *count)
{
    const pool_bins *bn = sp->bins;
    if (!bn) {
        if (sp->small)
            return fail(c, "%s pool has no bins", name);
        return 0;
    }
    if (!sp->small)
        return fail(c, "%s pool has bins", name);
    for (size_t w = 0; w < POOL_BIN_WORDS; w++) {
        uint64_t word = 0;
        for (size_t b = 0; b < 64; b++) {
            size_t k = w * 64 + b;
            const pool_block *last = NULL;
            size_t n = 0;
            if (check_tree(c, p, sp, bn->root[k], (k + 1) * POOL_ROUND, &last, &n) < 0)
                return -1;
            if (n)
                word |= (uint64_t)1 << b;
            *count += n;
        }
        if (bn->words[w] != word)
            return fail(c, "%s bin bitmap word %zu is %#" PRIx64 ", the bins say %#" PRIx64, name, w,
                        bn->words[w], word);
        if (((bn->summary >> w) & 1) != (word != 0))
            return fail(c, "%s bin summary bit %zu disagrees with its word", name, w);
    }
    if (bn->summary >> (POOL_BIN_WORDS - 1) >> 1)
        return fail(c, "%s bin summary has bits past the last word", name);
    return 0;
}

/* ==== the check ============================================================================= */

typedef struct {
    uint64_t allocated[2], requested[2], nalloc[2], reserved[2], nsegs[2], split[2], nsplit[2];
    int64_t tag[POOL_TAG_COUNT];
    int64_t job[POOL_MAX_JOBS];
    int64_t job_tag[POOL_MAX_JOBS][POOL_TAG_COUNT];
    size_t live_blocks, idle_segs, largest;
} sums;

static const pool_block *map_lookup(const pool *p, uintptr_t key)
{
    size_t i = (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> p->map_shift);
    for (size_t probes = 0; probes <= p->map_mask; probes++) {
        if (p->map[i].key == key)
            return p->map[i].b;
        if (!p->map[i].key)
            return NULL;
        i = (i + 1) & p->map_mask;
    }
    return NULL;
}

static int check_segment(check_ctx *c, pool *p, const pool_sub *sp, const pool_segment *s, sums *t)
{
    int k = sp->small ? 0 : 1;
    if (s->small != sp->small || &p->sub[s->sub] != sp)
        return fail(c, "segment %#" PRIxPTR " is on the wrong pool's list", s->addr);
    if (s->size == 0 || s->size % POOL_ROUND)
        return fail(c, "segment %#" PRIxPTR " has size %zu", s->addr, s->size);
    if (p->expandable) {
        size_t g = p->granularity;
        if (s->addr % g || s->size % g)
            return fail(c, "run %#" PRIxPTR "+%zu is not aligned to the granularity", s->addr, s->size);
        if (s->addr < sp->va_base || s->addr + s->size > sp->va_base + sp->va_size)
            return fail(c, "run %#" PRIxPTR " lies outside the reserved range", s->addr);
    }
    uintptr_t expect = s->addr;
    const pool_block *prev = NULL;
    size_t nb = 0;
    for (const pool_block *b = s->head; b; prev = b, b = b->next, nb++) {
        if (nb > s->nblocks)
            return fail(c, "segment %#" PRIxPTR " has more blocks than its count %zu", s->addr, s->nblocks);
        if (b->seg != s)
            return fail(c, "block %#" PRIxPTR " points to the wrong segment", b->addr);
        if (b->prev != prev)
            return fail(c, "block %#" PRIxPTR " has a wrong prev link", b->addr);
        if (b->addr != expect)
            return fail(c, "block %#" PRIxPTR " should start at %#" PRIxPTR " (gap or overlap)",
                        b->addr, expect);
        if (b->size == 0 || b->size % POOL_ROUND)
            return fail(c, "block %#" PRIxPTR " has size %zu, not a positive multiple of 512",
                        b->addr, b->size);
        if (!b->live && prev && !prev->live)
            return fail(c, "free blocks %#" PRIxPTR " and %#" PRIxPTR " are not coalesced",
                        prev->addr, b->addr);
        if (b->live) {
            if (b->height)
                return fail(c, "live block %#" PRIxPTR " is marked as in a tree", b->addr);
            if (map_lookup(p, b->addr) != b)
                return fail(c, "live block %#" PRIxPTR " is missing from the pointer map", b->addr);
            if (b->tag >= POOL_TAG_COUNT || b->job_slot >= POOL_MAX_JOBS || !p->job_used[b->job_slot])
                return fail(c, "live block %#" PRIxPTR " has a bad tag or job row", b->addr);
            if (b->requested > b->size)
                return fail(c, "live block %#" PRIxPTR " holds %zu but %zu were requested",
                            b->addr, b->size, b->requested);
            t->allocated[k] += b->size;
            t->requested[k] += b->requested;
            t->nalloc[k]++;
            t->tag[b->tag] += (int64_t)b->size;
            t->job[b->job_slot] += (int64_t)b->size;
            t->job_tag[b->job_slot][b->tag] += (int64_t)b->size;
            t->live_blocks++;
        } else {
            if (!tree_holds(free_root(sp, b->size), b))
                return fail(c, "free block %#" PRIxPTR " is missing from its free bin or tree", b->addr);
            bool whole = s->nblocks == 1;
            if (b->split_counted == whole)
                return fail(c, "free block %#" PRIxPTR " is %scounted as inactive split", b->addr,
                            whole ? "" : "not ");
            if (!whole) {
                t->split[k] += b->size;
                t->nsplit[k]++;
            }
            if (b->size > t->largest)
                t->largest = b->size;
        }
        expect += b->size;
    }
    if (prev != s->tail)
        return fail(c, "segment %#" PRIxPTR " has a wrong tail", s->addr);
    if (nb != s->nblocks)
        return fail(c, "segment %#" PRIxPTR " counts %zu blocks but has %zu", s->addr, s->nblocks, nb);
    if (expect != s->addr + s->size)
        return fail(c, "blocks of segment %#" PRIxPTR " cover %zu of its %zu bytes", s->addr,
                    (size_t)(expect - s->addr), s->size);
    bool idle = nb == 1 && !s->head->live;
    if (idle != (bool)s->idle)
        return fail(c, "segment %#" PRIxPTR " is %son the idle list", s->addr, s->idle ? "" : "not ");
    t->idle_segs += idle;
    t->reserved[k] += s->size;
    t->nsegs[k]++;
    return 0;
}

static int check_stat(check_ctx *c, pool *p, int st, const char *name, const uint64_t want[2])
{
    for (int i = 0; i < 2; i++) {
        int64_t have = pool_stat_current(p, st, i);
        if (have != (int64_t)want[i])
            return fail(c, "%s[%s] is %" PRId64 " but the blocks say %" PRIu64, name,
                        i ? "large" : "small", have, want[i]);
        if (POOL_LD(p->live.st[st].peak[i]) < have)
            return fail(c, "%s[%s] peak is below current", name, i ? "large" : "small");
    }
    if (POOL_LD(p->live.st[st].peak[2]) < pool_stat_current(p, st, POOL_ALL))
        return fail(c, "%s[all] peak is below current", name);
    return 0;
}

static const char *const sub_name[POOL_NSUB] = {"small", "large", "small persistent", "large persistent"};

static int check_locked(check_ctx *c, pool *p)
{
    sums *t = calloc(1, sizeof *t);
    if (!t)
        return fail(c, "out of host memory for the check");
    int rc = -1;

    for (int i = 0; i < p->nsub; i++) {
        pool_sub *sp = &p->sub[i];
        const char *sname = sub_name[i % POOL_NSUB];
        const pool_segment *prev = NULL;
        size_t n = 0;
        for (const pool_segment *s = sp->segs; s; prev = s, s = s->next, n++) {
            if (s->prev != prev) {
                fail(c, "segment list link broken at %#" PRIxPTR, s->addr);
                goto out;
            }
            if (prev && prev->addr + prev->size > s->addr) {
                fail(c, "segments %#" PRIxPTR " and %#" PRIxPTR " overlap or are out of order",
                     prev->addr, s->addr);
                goto out;
            }
            if (prev && p->expandable && prev->addr + prev->size == s->addr) {
                fail(c, "runs %#" PRIxPTR " and %#" PRIxPTR " touch but were not merged", prev->addr,
                     s->addr);
                goto out;
            }
            if (check_segment(c, p, sp, s, t) != 0)
                goto out;
        }
        if (prev != sp->segs_tail || n != sp->nsegs) {
            fail(c, "%s segment list tail or count is wrong", sname);
            goto out;
        }
        const pool_block *last = NULL;
        size_t nfree = 0;
        if (check_tree(c, p, sp, sp->root, 0, &last, &nfree) < 0)
            goto out;
        if (sp->bins && sp->root && avl_min_size(sp->root) <= POOL_BIN_MAX) {
            fail(c, "%s free tree holds a block small enough for a bin", sname);
            goto out;
        }
        if (sp->max != last) {
            fail(c, "%s pool's cached largest free block is stale", sname);
            goto out;
        }
        if (check_bins(c, p, sp, sname, &nfree) < 0)
            goto out;
        if (nfree != sp->nfree) {
            fail(c, "%s free bins and tree hold %zu blocks, counted %zu", sname, nfree, sp->nfree);
            goto out;
        }
    }
    /* Every free block found in a segment is in its bin or tree and the
     * counts match, so the bins and trees hold exactly the free blocks. */
    size_t free_blocks = 0, in_trees = 0;
    for (int i = 0; i < p->nsub; i++) {
        in_trees += p->sub[i].nfree;
        for (const pool_segment *s = p->sub[i].segs; s; s = s->next)
            for (const pool_block *b = s->head; b; b = b->next)
                free_blocks += !b->live;
    }
    if (free_blocks != in_trees) {
        fail(c, "the free bins and trees hold %zu blocks but the segments have %zu free", in_trees,
             free_blocks);
        goto out;
    }
    if (p->map_count != t->live_blocks) {
        fail(c, "the pointer map holds %zu entries but %zu blocks are live", p->map_count, t->live_blocks);
        goto out;
    }
    size_t idle = 0;
    const pool_segment *lp = NULL;
    for (const pool_segment *s = p->lru_head; s; lp = s, s = s->lru_next, idle++) {
        if (!s->idle || s->lru_prev != lp) {
            fail(c, "idle list broken at %#" PRIxPTR, s->addr);
            goto out;
        }
    }
    if (lp != p->lru_tail || idle != t->idle_segs) {
        fail(c, "idle list has %zu segments, %zu are wholly free", idle, t->idle_segs);
        goto out;
    }

    if (check_stat(c, p, POOL_ST_ALLOCATED, "allocated_bytes", t->allocated) ||
        check_stat(c, p, POOL_ST_REQUESTED, "requested_bytes", t->requested) ||
        check_stat(c, p, POOL_ST_ALLOCATIONS, "allocations", t->nalloc) ||
        check_stat(c, p, POOL_ST_RESERVED, "reserved_bytes", t->reserved) ||
        check_stat(c, p, POOL_ST_SEGMENTS, "segments", t->nsegs) ||
        check_stat(c, p, POOL_ST_INACTIVE_SPLIT, "inactive_split_bytes", t->split) ||
        check_stat(c, p, POOL_ST_INACTIVE_SPLIT_BLOCKS, "inactive_split_blocks", t->nsplit))
        goto out;
    int64_t tag_total = 0;
    for (int g = 0; g < POOL_TAG_COUNT; g++) {
        int64_t have = POOL_LD(p->live.tag_current[g]);
        if (have != t->tag[g]) {
            fail(c, "tag %s holds %" PRId64 " but its blocks sum to %" PRId64, pool_tag_name((pool_tag)g),
                 have, t->tag[g]);
            goto out;
        }
        if (POOL_LD(p->live.tag_peak[g]) < have) {
            fail(c, "tag %s peak is below current", pool_tag_name((pool_tag)g));
            goto out;
        }
        tag_total += have;
    }
    if (tag_total != pool_stat_current(p, POOL_ST_ALLOCATED, POOL_ALL)) {
        fail(c, "tags sum to %" PRId64 ", allocated is %" PRId64, tag_total,
             pool_stat_current(p, POOL_ST_ALLOCATED, POOL_ALL));
        goto out;
    }
    int64_t job_total = 0;
    for (int j = 0; j < POOL_MAX_JOBS; j++) {
        pool_live_job *lj = &p->live.jobs[j];
        if (!p->job_used[j] || !POOL_LD(lj->used)) {
            if (p->job_used[j] != POOL_LD(lj->used) || t->job[j]) {
                fail(c, "job row %d is free but holds memory or disagrees with its published flag", j);
                goto out;
            }
            continue;
        }
        if (POOL_LD(lj->job) != p->job_id[j] || POOL_LD(lj->current) != t->job[j] ||
            POOL_LD(lj->peak) < t->job[j]) {
            fail(c, "job %u holds %" PRId64 " but its blocks sum to %" PRId64, p->job_id[j],
                 POOL_LD(lj->current), t->job[j]);
            goto out;
        }
        int64_t by_tag = 0;
        for (int g = 0; g < POOL_TAG_COUNT; g++) {
            if (POOL_LD(lj->tag_current[g]) != t->job_tag[j][g]) {
                fail(c, "job %u tag %s is wrong", p->job_id[j], pool_tag_name((pool_tag)g));
                goto out;
            }
            by_tag += t->job_tag[j][g];
        }
        if (by_tag != t->job[j]) {
            fail(c, "job %u tags do not sum to its total", p->job_id[j]);
            goto out;
        }
        for (int k = 0; k < j; k++) {
            if (p->job_used[k] && p->job_id[k] == p->job_id[j]) {
                fail(c, "job %u has two rows", p->job_id[j]);
                goto out;
            }
        }
        job_total += t->job[j];
    }
    if (job_total != pool_stat_current(p, POOL_ST_ALLOCATED, POOL_ALL)) {
        fail(c, "jobs sum to %" PRId64 ", allocated is %" PRId64, job_total,
             pool_stat_current(p, POOL_ST_ALLOCATED, POOL_ALL));
        goto out;
    }
    if (POOL_LD(p->live.largest_free) != t->largest) {
        fail(c, "published largest free block %" PRIu64 " is not the real %zu",
             (uint64_t)POOL_LD(p->live.largest_free), t->largest);
        goto out;
    }
    /* No section is open here, so the cached figure must be exact. */
    if (p->largest_stale || p->largest != t->largest) {
        fail(c, "cached largest free block %zu%s is not the real %zu", p->largest,
             p->largest_stale ? " (stale)" : "", t->largest);
        goto out;
    }
    if ((size_t)pool_stat_current(p, POOL_ST_RESERVED, POOL_ALL) > p->cap) {
        fail(c, "reserved %" PRId64 " exceeds the cap %zu", pool_stat_current(p, POOL_ST_RESERVED, POOL_ALL),
             p->cap);
        goto out;
    }
    rc = 0;
out:
    free(t);
    return rc;
}

int pool_check(pool *p, char *err, size_t err_len)
{
    check_ctx c = {err, err_len};
    if (err && err_len)
        err[0] = 0;
    pthread_mutex_lock(&p->lock);
    int rc = check_locked(&c, p);
    pthread_mutex_unlock(&p->lock);
    return rc;
}
