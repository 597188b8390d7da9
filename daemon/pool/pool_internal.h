/* pool_internal.h — the pool's structures, shared by the pool*.c files only.
 *
 * Layout of the pool:
 *   pool.c          creation, allocation and free, best fit and split,
 *                   coalescing, the pointer map and the block structs
 *   pool_tree.c     the AVL trees of free blocks
 *   pool_segment.c  segment lists, growth and giving segments back (the only
 *                   file that maps device memory in)
 *   pool_jobs.c     the job table
 *   pool_trim.c     giving memory back: trims and the pool_tick policies
 *   pool_stats.c    publishing and reading statistics
 *   pool_timeline.c the event ring and its Perfetto export
 *   pool_check.c    the exhaustive invariant check
 */
#ifndef GRADD_POOL_INTERNAL_H
#define GRADD_POOL_INTERNAL_H

#include "pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define POOL_HAVE_TSC 1
#else
#define POOL_HAVE_TSC 0
#endif

/* ---- sizes ---------------------------------------------------------------- */

#define POOL_ROUND ((size_t)512)             /* every block size is a multiple */
#define POOL_SMALL_MAX ((size_t)1 << 20)     /* requests up to this go to the small pool */
#define POOL_SMALL_SEGMENT ((size_t)2 << 20) /* what small segments are carved from */
#define POOL_MID_MAX ((size_t)10 << 20)      /* large requests below this share ... */
#define POOL_MID_SEGMENT ((size_t)20 << 20)  /* ... a segment of this size */
#define POOL_LARGE_ROUND ((size_t)2 << 20)   /* bigger segments are rounded to this */
/* A request >= max_split_size takes an oversize block only when the block is
 * less than this much bigger: the waste of never splitting stays bounded. */
#define POOL_OVERSIZE_SLACK ((size_t)20 << 20)

/* Free blocks up to this size sit in exact-size bins (one per multiple of
 * 512 B); bigger ones in a tree.  2 MiB covers every free block of a fixed
 * small segment, so the small pool's hit path never touches a tree. */
#define POOL_BIN_MAX POOL_SMALL_SEGMENT
#define POOL_NBINS (POOL_BIN_MAX / POOL_ROUND)
#define POOL_BIN_WORDS (POOL_NBINS / 64)
_Static_assert(POOL_BIN_WORDS <= 64, "one summary word must cover the bin bitmap");

/* ---- blocks and segments ---------------------------------------------------- */

typedef struct pool_block pool_block;
typedef struct pool_segment pool_segment;

/* A block is a run of bytes inside one segment, either live (in the pointer
 * map) or free (in its sub-pool's free bins or tree).  Blocks tile their
 * segment in address order; two free blocks are never neighbours. */
struct pool_block {
    uintptr_t addr;
    size_t size;
    size_t requested; /* live: the caller's figure before rounding */
    pool_block *prev, *next; /* address neighbours within the segment */
    pool_segment *seg;
    pool_block *left, *right; /* free bin's or free tree's AVL links, keyed by (size, addr) */
    int32_t height;           /* AVL height; 0 while in no bin or tree */
    uint8_t live;
    uint8_t tag;
    uint8_t job_slot;
    uint8_t split_counted; /* counted in inactive_split_* while free */
};

/* A segment is one piece of device memory: a raw allocation, or with
 * expandable segments one maximal mapped run of the reserved range. */
struct pool_segment {
    uintptr_t addr;
    size_t size;
    pool_block *head, *tail;
    size_t nblocks;
    pool_segment *prev, *next;         /* the sub-pool's list; address order when expandable */
    pool_segment *lru_prev, *lru_next; /* the idle list while wholly free */
    uint8_t small;
    uint8_t sub; /* index into pool.sub */
    uint8_t idle;
};

/* Exact-size bins: bin c holds the free blocks of (c + 1) × 512 bytes as an
 * AVL tree keyed by address, so its leftmost block is the lowest address —
 * the same best fit and tie-break the single (size, addr) tree gave, found
 * in O(1) through the bitmaps instead of a descent of the whole tree.  Bit c
 * of words[] is set exactly when bin c is non-empty, bit w of summary
 * exactly when words[w] is non-zero. */
typedef struct {
    uint64_t summary;
    uint64_t words[POOL_BIN_WORDS];
    pool_block *root[POOL_NBINS];
} pool_bins;

/* One of the four pools of blocks: small or large requests, each split by
 * the expected lifetime its tag implies (see pool_tag_persistent).  Blocks and
 * segments never move between them. */
typedef struct {
    pool_bins *bins;       /* small sub-pools only: free blocks <= POOL_BIN_MAX */
    pool_block *root;      /* the other free blocks, keyed by (size, addr) */
    pool_block *max;       /* the largest block in root, kept for stats */
    size_t nfree;          /* free blocks in bins and root */
    pool_segment *segs, *segs_tail;
    size_t nsegs;
    uintptr_t va_base;     /* expandable: the reserved range */
    size_t va_size;
    uint8_t small;
    uint8_t persistent;
} pool_sub;

#define POOL_NSUB 4
/* Free blocks are keyed by stream: each stream a caller names gets its own
 * four sub-pools (sub[slot * POOL_NSUB + class]), because a block freed on
 * one stream may still be read by work queued there, and only work on the
 * same stream is ordered after it.  Slot 0 is stream 0, made at creation;
 * the others are made on a stream's first allocation. */
#define POOL_MAX_STREAMS 16
#define POOL_NSUB_ALL (POOL_NSUB * POOL_MAX_STREAMS)

static inline int pool_sub_index(bool small, bool persistent) { return (small ? 0 : 1) + (persistent ? 2 : 0); }

typedef struct {
    uintptr_t key;
    pool_block *b;
} pool_map_entry;

typedef struct pool_slab pool_slab;

typedef struct {
    uintptr_t addr;
    size_t len;
    bool va; /* expandable: unmap, not free */
} pool_dev_pending;

/* ---- published statistics --------------------------------------------------- */

/* Every figure the control plane reads lives here, as atomics written only
 * under the pool mutex inside a seqlock section (pool_stats_begin/end).
 * current is inc - dec; only peaks are stored for "all" because the other
 * "all" figures are sums. */
typedef struct {
    _Atomic uint64_t inc[2], dec[2];
    _Atomic int64_t peak[3];
} pool_live_stat;

enum {
    POOL_ST_ALLOCATED,
    POOL_ST_RESERVED,
    POOL_ST_INACTIVE_SPLIT,
    POOL_ST_REQUESTED,
    POOL_ST_ALLOCATIONS,
    POOL_ST_SEGMENTS,
    POOL_ST_INACTIVE_SPLIT_BLOCKS,
    POOL_ST_COUNT
};

enum {
    POOL_CTR_DEVICE_ALLOCS,
    POOL_CTR_DEVICE_FREES,
    POOL_CTR_CACHE_HITS,
    POOL_CTR_ALLOC_RETRIES,
    POOL_CTR_OOMS,
    POOL_CTR_TRIMS,
    POOL_CTR_TRIMMED_BYTES,
    POOL_CTR_TRIM_NS,
    POOL_CTR_INVALID_FREES,
    POOL_CTR_IDLE_TRIMS,
    POOL_CTR_IDLE_TRIMMED_BYTES,
    POOL_CTR_COUNT
};

typedef struct {
    _Atomic uint32_t job;
    _Atomic uint32_t used;
    _Atomic int64_t current, peak;
    _Atomic uint64_t limit;
    _Atomic uint64_t need;
    _Atomic int64_t tag_current[POOL_TAG_COUNT], tag_peak[POOL_TAG_COUNT];
} pool_live_job;

typedef struct {
    _Atomic uint64_t seq; /* odd while a section is open */
    pool_live_stat st[POOL_ST_COUNT];
    _Atomic uint64_t ctr[POOL_CTR_COUNT];
    _Atomic uint64_t largest_free;
    _Atomic int64_t tag_current[POOL_TAG_COUNT], tag_peak[POOL_TAG_COUNT];
    pool_live_job jobs[POOL_MAX_JOBS];
    _Atomic uint64_t tl_events, tl_dropped;
} pool_live;

/* ---- the pool ------------------------------------------------------------------ */

struct pool {
    dev *d;
    pool_config cfg;
    size_t cap, device_total;
    size_t granularity; /* expandable segments' mapping unit; 0 without them */
    bool expandable;
    pthread_mutex_t lock;
    pthread_mutex_t fit_lock; /* pool_fit_begin/end; never taken with lock held */
    /* Asked, without lock, before an allocation fails for want of device
     * memory (pool_set_reclaim). */
    pool_reclaim_fn reclaim;
    void *reclaim_user;

    pool_sub sub[POOL_NSUB_ALL]; /* by stream slot × POOL_NSUB + pool_sub_index */
    uintptr_t stream_key[POOL_MAX_STREAMS];
    int nsub; /* sub-pools in use: POOL_NSUB × the streams seen */
    /* The largest free block's size, kept as blocks come and go so that
     * closing a section need not look at every sub-pool: exact unless
     * largest_stale, which a removal of a block of exactly that size sets
     * and the end of the section clears by recomputing. */
    size_t largest;
    bool largest_stale;
    /* Wholly free segments, least recently used first: a segment joins the
     * tail when its last block is freed, so list order is last-use order. */
    pool_segment *lru_head, *lru_tail;

    pool_map_entry *map; /* live blocks by address: open addressing */
    size_t map_mask, map_count;
    unsigned map_shift;

    pool_block *spare; /* recycled block structs */
    size_t nspare;
    pool_slab *slabs;

    uint32_t job_id[POOL_MAX_JOBS];
    uint8_t job_used[POOL_MAX_JOBS];
    int last_job_slot;

    /* trim policy state */
    uint64_t steps_since_trim;
    uint64_t last_periodic_ns;
    unsigned users;         /* open pool_use_begin calls */
    uint64_t idle_since_ns; /* when users last fell to 0 (or creation) */
    bool idle_trimmed;      /* this idle spell's trim has run */

    /* timeline */
    pool_event *ring;
    size_t ring_cap, ring_next;
    uint64_t ring_total;
    uint64_t t0_ns;
    /* Events are stamped in raw TSC ticks where the TSC is invariant (about
     * a third of clock_gettime's cost, and the hit path records an event per
     * call); the export turns them into CLOCK_MONOTONIC ns (pool_timeline.c).
     * Without an invariant TSC, stamps are CLOCK_MONOTONIC ns already. */
    bool tl_tsc;
    uint64_t tl_last;            /* the newest stamp: stamps never go backwards */
    uint64_t tl_tick0, tl_ns0;   /* the creation anchor (tl_tsc only) */

    /* statistics: live is current; snap is a frozen copy made on a reader's
     * request when the writer keeps live too busy to read (pool_stats.c). */
    int stats_depth;
    /* Device releases asked for inside a section, made when the outermost
     * one ends (pool_dev_release), so a trim's figures change together
     * without a reader waiting on cudaFree. */
    pool_dev_pending *pending;
    size_t npending, cap_pending;
    uint64_t snap_served;
    _Atomic uint64_t snap_requests;
    _Atomic uint64_t snap_published;
    pool_live live;
    pool_live snap;
};

/* ---- helpers shared by the pool files ---------------------------------------- */

#define POOL_LD(x) atomic_load_explicit(&(x), memory_order_relaxed)
#define POOL_ST(x, v) atomic_store_explicit(&(x), (v), memory_order_relaxed)

static inline uint64_t pool_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A timeline stamp: see pool.tl_tsc.  Under the mutex. */
static inline uint64_t pool_tl_stamp(pool *p)
{
    uint64_t t;
#if POOL_HAVE_TSC
    if (p->tl_tsc)
        t = __rdtsc();
    else
#endif
        t = pool_now_ns();
    /* Two cores' TSCs may differ by a few ticks, and the next lock holder
     * may run on the other; the ring promises non-decreasing stamps. */
    if (t < p->tl_last)
        t = p->tl_last;
    p->tl_last = t;
    return t;
}

static inline size_t pool_round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }
static inline size_t pool_round_down(size_t v, size_t to) { return v / to * to; }
static inline pool_sub *pool_sub_of(pool *p, const pool_segment *s) { return &p->sub[s->sub]; }

/* Parameters, gradients and optimizer state live for the whole job;
 * activations, workspace and data for a step at most.  Keeping the two
 * apart stops state allocated lazily during the first step (as PyTorch
 * does with gradients and AdamW moments) from landing in the holes freed
 * activations leave, where it would pin them for good. */
static inline bool pool_tag_persistent(int tag)
{
    return tag == POOL_TAG_PARAMS || tag == POOL_TAG_GRADS || tag == POOL_TAG_OPTIMIZER;
}

/* The size of a sub-pool's largest free block: every block in the tree is
 * bigger than every binned one, so the tree's maximum wins when there is
 * one, and otherwise the highest non-empty bin. */
static inline size_t pool_sub_largest(const pool_sub *sp)
{
    if (sp->max)
        return sp->max->size;
    const pool_bins *bn = sp->bins;
    if (!bn || !bn->summary)
        return 0;
    unsigned w = 63u - (unsigned)__builtin_clzll(bn->summary);
    unsigned c = w * 64u + 63u - (unsigned)__builtin_clzll(bn->words[w]);
    return ((size_t)c + 1) * POOL_ROUND;
}

static inline size_t pool_largest_free(const pool *p)
{
    size_t m = 0;
    for (int i = 0; i < p->nsub; i++) {
        size_t s = pool_sub_largest(&p->sub[i]);
        if (s > m)
            m = s;
    }
    return m;
}

/* Statistics updates: only under the mutex, only inside a section. */
static inline void pool_stat_inc(pool *p, int s, bool small, uint64_t d)
{
    pool_live_stat *x = &p->live.st[s];
    int i = small ? 0 : 1;
    uint64_t inc = POOL_LD(x->inc[i]) + d;
    POOL_ST(x->inc[i], inc);
    int64_t cur = (int64_t)(inc - POOL_LD(x->dec[i]));
    if (cur > POOL_LD(x->peak[i]))
        POOL_ST(x->peak[i], cur);
    int64_t all = cur + (int64_t)(POOL_LD(x->inc[1 - i]) - POOL_LD(x->dec[1 - i]));
    if (all > POOL_LD(x->peak[2]))
        POOL_ST(x->peak[2], all);
}

static inline void pool_stat_dec(pool *p, int s, bool small, uint64_t d)
{
    pool_live_stat *x = &p->live.st[s];
    int i = small ? 0 : 1;
    POOL_ST(x->dec[i], POOL_LD(x->dec[i]) + d);
}

static inline int64_t pool_stat_current(pool *p, int s, int which)
{
    pool_live_stat *x = &p->live.st[s];
    if (which == POOL_ALL)
        return pool_stat_current(p, s, 0) + pool_stat_current(p, s, 1);
    return (int64_t)(POOL_LD(x->inc[which]) - POOL_LD(x->dec[which]));
}

static inline size_t pool_reserved_now(pool *p)
{
    return (size_t)pool_stat_current(p, POOL_ST_RESERVED, POOL_ALL);
}

static inline void pool_ctr_add(pool *p, int c, uint64_t d)
{
    POOL_ST(p->live.ctr[c], POOL_LD(p->live.ctr[c]) + d);
}

void pool_stats_serve(pool *p);
void pool_dev_flush(pool *p);

/* A seqlock write section.  Sections nest (the outer one counts) and are
 * kept away from device calls so a slow cudaMalloc never blocks a reader. */
static inline void pool_stats_begin(pool *p)
{
    if (p->stats_depth++ == 0) {
        POOL_ST(p->live.seq, POOL_LD(p->live.seq) + 1);
        atomic_thread_fence(memory_order_release);
    }
}

static inline void pool_stats_end(pool *p)
{
    if (--p->stats_depth == 0) {
        if (p->largest_stale) {
            p->largest = pool_largest_free(p);
            p->largest_stale = false;
        }
        POOL_ST(p->live.largest_free, p->largest);
        atomic_store_explicit(&p->live.seq, POOL_LD(p->live.seq) + 1, memory_order_release);
        if (POOL_LD(p->snap_requests) != p->snap_served)
            pool_stats_serve(p);
        if (p->npending)
            pool_dev_flush(p);
    }
}

/* Timeline: under the mutex, inside a section (it moves two counters). */
static inline void pool_tl_record(pool *p, pool_event_kind kind, uint32_t job, int tag, int sub,
                                  uint64_t bytes, uint64_t addr, uint64_t aux)
{
    if (!p->ring_cap)
        return;
    pool_event *e = &p->ring[p->ring_next];
    if (++p->ring_next == p->ring_cap)
        p->ring_next = 0;
    e->ns = pool_tl_stamp(p); /* raw; pool_timeline.c converts */
    e->bytes = bytes;
    e->addr = addr;
    e->aux = aux;
    e->job = job;
    e->kind = (uint8_t)kind;
    e->tag = (uint8_t)tag;
    e->small = sub % 2 == 0;
    e->persistent = sub % POOL_NSUB >= 2;
    e->external = 0;
    e->note[0] = 0;
    p->ring_total++;
    POOL_ST(p->live.tl_events, p->ring_total);
    if (p->ring_total > p->ring_cap)
        POOL_ST(p->live.tl_dropped, p->ring_total - p->ring_cap);
}

/* ---- internal functions --------------------------------------------------------- */

/* pool.c: block structs. */
pool_block *pool_blk_new(pool *p); /* NULL only when the host is out of memory */
void pool_blk_put(pool *p, pool_block *b);
bool pool_blk_reserve(pool *p, size_t n);

/* pool_segment.c */
void pool_seg_link(pool *p, pool_segment *s); /* into its sub-pool's list */
void pool_seg_unlink(pool *p, pool_segment *s);
/* Release a wholly free segment to the device (unmap it when expandable). */
void pool_seg_release(pool *p, pool_segment *s);
/* Give [addr, addr+len) back to the device (unmap it when va): at once
 * outside a section, else when the outermost section ends. */
void pool_dev_release(pool *p, uintptr_t addr, size_t len, bool va);
/* Expandable: unmap the whole granularity chunks inside free block b,
 * splitting its run around the hole.  Returns the bytes unmapped: 0 when b
 * spans no whole chunk or the host is out of memory for the split. */
size_t pool_seg_unmap_chunks(pool *p, pool_block *b, uint32_t job);
/* Why growth failed, for the OOM report. */
typedef enum {
    POOL_GROW_OK,
    POOL_GROW_CAP,
    POOL_GROW_DEVICE,
    POOL_GROW_HOST,
    POOL_GROW_VA,
    POOL_GROW_STREAMS, /* a new stream and no slot left for it */
} pool_grow_fail;
/* A free block of at least size bytes in sp from new device memory: a new
 * fixed segment, or a newly mapped run of the reserved range.  With the
 * mutex held and no section open.  NULL with *why set (and on a device
 * failure, the device's message in detail) when there is none. */
pool_block *pool_seg_grow(pool *p, pool_sub *sp, size_t size, uint32_t job, pool_grow_fail *why,
                          char *detail, size_t detail_len);

/* pool_jobs.c: the job's row, made when create is set; -1 when the table
 * is full of jobs that hold memory or limits.  Called inside a section. */
int pool_job_slot(pool *p, uint32_t job, bool create);
void pool_job_release_slot(pool *p, int slot);

/* pool_trim.c: with the mutex held and no section open. */
pool_trim_result pool_trim_locked(pool *p, pool_trim_reason why, size_t target_bytes);
/* Release LRU idle segments until reserved + extra <= limit. */
void pool_gc_locked(pool *p, size_t limit, size_t extra);

/* pool_timeline.c: the timeline clock.  init picks it at creation and
 * takes the creation anchor; clock_now (mutex held) fixes the stamp →
 * CLOCK_MONOTONIC line as of now, and to_ns applies it. */
typedef struct {
    bool tsc;
    uint64_t tick_now, ns_now; /* an anchor read at export time */
    double ns_per_tick;
} pool_tl_clock;
void pool_tl_clock_init(pool *p);
pool_tl_clock pool_tl_clock_now(pool *p);
uint64_t pool_tl_to_ns(const pool_tl_clock *c, uint64_t stamp);

/* pool.c: human sizes ("1.5G") for messages. */
const char *pool_fmt_size(uint64_t bytes, char *buf, size_t len);

/* ---- free blocks: trees, bins and the idle list --------------------------------- */

/* pool_tree.c: AVL trees keyed by (size, addr). */
static inline bool pool_blk_less(const pool_block *a, const pool_block *b)
{
    return a->size < b->size || (a->size == b->size && a->addr < b->addr);
}

void pool_avl_insert(pool_block **root, pool_block *n);
/* n must still carry the key it was inserted with. */
void pool_avl_remove(pool_block **root, pool_block *n);

static inline pool_block *pool_avl_rightmost(pool_block *n)
{
    while (n && n->right)
        n = n->right;
    return n;
}

/* The idle list: wholly free segments, least recently used first. */
static inline void pool_idle_push(pool *p, pool_segment *s)
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

static inline void pool_idle_unlink(pool *p, pool_segment *s)
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

static inline size_t pool_bin_of(size_t size) { return size / POOL_ROUND - 1; }

/* Bins are nearly always empty or hold one block (on the training trace,
 * over 99% of insertions find the bin empty), so those cases skip the tree
 * code altogether. */
static inline void pool_bin_insert(pool_bins *bn, pool_block *b)
{
    size_t c = pool_bin_of(b->size);
    if (!bn->root[c]) {
        b->left = b->right = NULL;
        b->height = 1;
        bn->root[c] = b;
        bn->words[c / 64] |= (uint64_t)1 << (c % 64);
        bn->summary |= (uint64_t)1 << (c / 64);
        return;
    }
    pool_avl_insert(&bn->root[c], b);
}

static inline void pool_bin_remove(pool_bins *bn, pool_block *b)
{
    size_t c = pool_bin_of(b->size);
    if (bn->root[c] != b || b->left || b->right) {
        pool_avl_remove(&bn->root[c], b);
        return;
    }
    bn->root[c] = NULL;
    bn->words[c / 64] &= ~((uint64_t)1 << (c % 64));
    if (!bn->words[c / 64])
        bn->summary &= ~((uint64_t)1 << (c / 64));
}

/* Every change to a free block's size or neighbours goes remove → change →
 * insert, so the split statistics and the idle list follow the bins. */
static inline void pool_free_insert(pool *p, pool_block *b)
{
    pool_segment *seg = b->seg;
    pool_sub *sp = pool_sub_of(p, seg);
    if (sp->bins && b->size <= POOL_BIN_MAX) {
        pool_bin_insert(sp->bins, b);
    } else {
        pool_avl_insert(&sp->root, b);
        if (!sp->max || pool_blk_less(sp->max, b))
            sp->max = b;
    }
    sp->nfree++;
    if (b->size > p->largest)
        p->largest = b->size;
    if (!b->prev && !b->next) {
        pool_idle_push(p, seg);
    } else {
        b->split_counted = 1;
        pool_stat_inc(p, POOL_ST_INACTIVE_SPLIT, seg->small, b->size);
        pool_stat_inc(p, POOL_ST_INACTIVE_SPLIT_BLOCKS, seg->small, 1);
    }
}

static inline void pool_free_remove(pool *p, pool_block *b)
{
    pool_segment *seg = b->seg;
    pool_sub *sp = pool_sub_of(p, seg);
    if (sp->bins && b->size <= POOL_BIN_MAX) {
        pool_bin_remove(sp->bins, b);
    } else {
        pool_avl_remove(&sp->root, b);
        if (sp->max == b)
            sp->max = pool_avl_rightmost(sp->root);
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
        pool_idle_unlink(p, seg);
}

#endif
