/* pool.h — the caching device memory pool.
 *
 * One pool per device.  Training jobs get every byte of device memory from
 * here; the pool is the only caller of the device's raw allocation functions.
 * Requests are rounded to 512 B and served by best fit from cached free
 * blocks, split and coalesced, out of segments obtained from the device:
 * 2 MiB segments for requests up to 1 MiB (the small pool), larger ones for
 * the rest (the large pool), or — with expandable segments — from reserved
 * address ranges mapped and unmapped in device-granularity chunks.  Tags
 * params/grads/optimizer (persistent) and the rest (transient) use separate
 * segments, which keeps long-lived state out of freed activations' holes.
 * Cached memory goes back to the device on trims: on request, periodically,
 * past a GC threshold, under external pressure, on OOM and once no job has
 * run for a while.
 *
 * Threads: every function may be called from any thread.  Allocation, free
 * and trim serialise on one pool mutex; pool_stats_read never takes it.
 * POOL.md defines the statistics and fragmentation.
 */
#ifndef GRADD_POOL_H
#define GRADD_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dev.h"

typedef struct pool pool;

/* ---- tags --------------------------------------------------------------- */

typedef enum {
    POOL_TAG_PARAMS,
    POOL_TAG_GRADS,
    POOL_TAG_OPTIMIZER,
    POOL_TAG_ACTIVATIONS,
    POOL_TAG_WORKSPACE,
    POOL_TAG_DATA,
    POOL_TAG_OTHER,
    /* Weights that are read and never trained: a LoRA job's base model. */
    POOL_TAG_FROZEN,
    POOL_TAG_COUNT
} pool_tag;

const char *pool_tag_name(pool_tag t); /* "params", "grads", ...; "?" if out of range */
int pool_tag_parse(const char *name, pool_tag *out); /* 0, or -1 for an unknown name */

/* ---- creation ----------------------------------------------------------- */

#define POOL_MAX_JOBS 64

typedef struct pool_config {
    double memory_fraction;   /* cap = fraction × device total; default 1.0 */
    size_t max_split_size;    /* large-pool blocks >= this are never split (fixed segments
                                 only); default SIZE_MAX; 0 means the same */
    bool expandable_segments; /* default false; ignored where the device has no VA support */
    double gc_threshold;      /* 0 = off; trim LRU segments when reserved > gc_threshold × cap */
    size_t low_watermark;     /* 0 = off; trim when device free < this */
    uint64_t trim_every_steps; /* 0 = off; periodic trim in pool_tick */
    uint64_t trim_every_ms;   /* 0 = off; periodic trim in pool_tick */
    uint64_t idle_trim_ms;    /* 0 = off (the default); trim everything in pool_tick once no
                                 pool_use_begin has been open this long */
    size_t timeline_capacity; /* ring buffer events; default 65536; 0 = timeline off */
} pool_config;

void pool_config_default(pool_config *c);
/* 0 ok; -1 on a bad config (fraction outside (0,1], negative threshold) or
 * when the device or host has no memory for the pool's bookkeeping. */
int pool_create(dev *d, const pool_config *c, pool **out);
void pool_destroy(pool *p); /* returns every segment to the device */
dev *pool_device(const pool *p);

/* ---- allocation --------------------------------------------------------- */

typedef struct pool_oom_report {
    size_t requested, allocated, reserved, cap, device_free, device_total, largest_free_block,
        job_allocated, job_limit;
    uint32_t job;
    pool_tag tag;
    bool job_limit_hit;
    char message[512]; /* one line, human units */
} pool_oom_report;

/* NULL only on OOM (oom, when given, says why).  A 0-byte request gets a
 * 512-byte block, so NULL never means "nothing asked for". */
void *pool_alloc(pool *p, size_t bytes, pool_tag tag, uint32_t job, pool_oom_report *oom);
/* The same on a stream, an opaque handle (cudaStream_t for PyTorch; 0 is
 * what pool_alloc uses).  Cached blocks are reused only by allocations on
 * the stream that freed them: work queued on that stream may still use a
 * freed block, and only that stream's later work is ordered after it.  A
 * pool serves 16 streams; a 17th fails as OOM, naming the reason. */
void *pool_alloc_stream(pool *p, size_t bytes, pool_tag tag, uint32_t job, uintptr_t stream,
                        pool_oom_report *oom);
/* Other holders of the device: called, without the pool's lock, when an
 * allocation of `bytes` for `job` would fail because the device itself is
 * short (not the cap, not the job's limit) after the pool's own trim.  It
 * asks whoever else holds memory on the device to give back what they
 * cache, waits a bounded time, and returns true when something may have
 * been freed; the pool then retries once (counted in alloc_retries).  It
 * may call pool_trim on this pool.  Set it before the pool is shared
 * between threads; NULL removes it. */
typedef bool (*pool_reclaim_fn)(void *user, size_t bytes, uint32_t job);
void pool_set_reclaim(pool *p, pool_reclaim_fn fn, void *user);
/* NULL is ignored; a pointer the pool did not hand out (or a double free) is
 * ignored and counted in pool_stats.invalid_frees. */
void pool_free(pool *p, void *ptr);
size_t pool_block_size(pool *p, const void *ptr); /* rounded size of a live block; 0 if none */
/* 0, or -1 when the job table is full.  bytes = 0 removes the limit. */
int pool_job_set_limit(pool *p, uint32_t job, size_t bytes);
/* What the job will hold at its peak as it runs now (the batch controller's
 * model at its current micro-batch).  Other jobs' budgets count this rather
 * than the job's all-time peak, which its probing and tuning inflate for
 * good.  0 clears it.  0, or -1 when the job table is full. */
int pool_job_set_need(pool *p, uint32_t job, size_t bytes);
/* Drop the job's row from the table (its peak included).  A job that still
 * holds memory keeps its row. */
void pool_job_forget(pool *p, uint32_t job);

/* ---- trimming ----------------------------------------------------------- */

typedef enum {
    POOL_TRIM_REQUEST,
    POOL_TRIM_PERIODIC,
    POOL_TRIM_GC,
    POOL_TRIM_PRESSURE,
    POOL_TRIM_OOM,
    POOL_TRIM_IDLE,
    POOL_TRIM_RECLAIM, /* another job on the device needed the memory */
    POOL_TRIM_REASONS
} pool_trim_reason;

const char *pool_trim_reason_name(pool_trim_reason r); /* "request", "periodic", ... */

typedef struct {
    size_t bytes;    /* given back to the device */
    size_t segments; /* segments released whole, plus chunk ranges unmapped */
    uint64_t ns;
    size_t reserved_after;
} pool_trim_result;

/* Release cached free memory, least recently used segments first, then (with
 * expandable segments) whole free chunks inside free blocks, until at least
 * target_bytes went back (0 = everything cached). */
pool_trim_result pool_trim(pool *p, pool_trim_reason why, size_t target_bytes);
/* Called by training workers at step boundaries (step = the job's step
 * counter, anything non-zero) and by the daemon's timer (step = 0): runs the
 * periodic, gc_threshold and low-watermark policies.  Steps are counted per
 * pool: with two jobs, "every N steps" means every N step boundaries of
 * either. */
void pool_tick(pool *p, uint64_t step);
/* A job starts or stops running on the pool's device.  While any job runs
 * the pool is busy; once the last one stops and idle_trim_ms passes with
 * none, the next pool_tick gives the whole cache back (reason idle), once
 * per idle spell.  A pool nobody ever calls these for counts as idle from
 * its creation.  Each begin needs one end; the pool counts them. */
void pool_use_begin(pool *p);
void pool_use_end(pool *p);

/* ---- statistics ----------------------------------------------------------- */

/* current = allocated - freed; allocated and freed are running totals of
 * increases and decreases. */
typedef struct {
    int64_t current, peak;
    uint64_t allocated, freed;
} pool_stat;

enum { POOL_SMALL = 0, POOL_LARGE = 1, POOL_ALL = 2 };

typedef struct pool_stats {
    pool_stat allocated_bytes[3], reserved_bytes[3], active_bytes[3], inactive_split_bytes[3],
        requested_bytes[3], allocations[3], segments[3], active_blocks[3],
        inactive_split_blocks[3];
    uint64_t device_allocs, device_frees, cache_hits, alloc_retries, ooms, trims, trimmed_bytes,
        trim_ns;
    uint64_t idle_trims, idle_trimmed_bytes; /* the part of trims/trimmed_bytes with reason idle */
    uint64_t invalid_frees;
    size_t largest_free_block;
    double fragmentation; /* 1 - largest_free_block / (reserved - allocated); 0 when nothing is cached */
    size_t cap, device_total, device_free;
    bool expandable_segments; /* as in effect, not as asked for */
    size_t max_split_size;
    int64_t tag_current[POOL_TAG_COUNT], tag_peak[POOL_TAG_COUNT];
    size_t njobs;
    struct {
        uint32_t job;
        int64_t current, peak;
        size_t limit;
        size_t need; /* pool_job_set_need; 0: not given */
        int64_t tag_current[POOL_TAG_COUNT], tag_peak[POOL_TAG_COUNT];
    } jobs[POOL_MAX_JOBS];
    uint64_t timeline_events, timeline_dropped; /* recorded since creation; overwritten */
} pool_stats;

/* A consistent snapshot, from any thread, without the pool mutex. */
void pool_stats_read(pool *p, pool_stats *out);
/* What job `job` held at its peak, in all and by tag (0 where it has no
 * row: it allocated nothing, or out of memory for the snapshot). */
void pool_job_peak(pool *p, uint32_t job, uint64_t *peak, uint64_t tag_peak[POOL_TAG_COUNT]);
void pool_stats_reset_peaks(pool *p);
/* Reset one job's peak to its current bytes, leaving every other peak
 * alone: the batch controller measures the peak of one probe step this way
 * without disturbing what `gradctl stats` shows for other jobs.  A job the
 * pool has no row for is ignored. */
void pool_job_reset_peak(pool *p, uint32_t job);

/* Jobs of one pool find their micro-batch one at a time, between these two:
 * a job's budget counts what the others need at the size they run, and one
 * still probing has only said its need at a small probe, so two jobs
 * fitting at once would each count the other small and together take more
 * than the device has.  The second waits while the first probes (a few
 * forward and backward passes). */
void pool_fit_begin(pool *p);
void pool_fit_end(pool *p);
/* The configuration the pool runs with (the engine reads low_watermark). */
void pool_get_config(const pool *p, pool_config *out);

/* ---- timeline ------------------------------------------------------------- */

typedef enum {
    POOL_EV_ALLOC,
    POOL_EV_FREE,
    POOL_EV_SEGMENT_MAP,
    POOL_EV_SEGMENT_UNMAP,
    POOL_EV_TRIM,
    POOL_EV_OOM,
    POOL_EV_BATCH_CHANGE,
    POOL_EV_COUNT
} pool_event_kind;

const char *pool_event_kind_name(pool_event_kind k); /* "alloc", "segment_map", ... */

/* One timeline event.  bytes: the block size (alloc/free), the mapped or
 * unmapped bytes (segment events), the bytes trimmed, the bytes requested
 * (oom), or the caller's figure (marks). */
typedef struct pool_event {
    uint64_t ns; /* CLOCK_MONOTONIC */
    uint64_t bytes;
    uint64_t addr;     /* block or segment address; 0 for trim, oom, marks */
    uint64_t aux;      /* alloc: bytes requested; trim: reason; oom: 1 if the job limit hit */
    uint32_t job;
    uint8_t kind;      /* pool_event_kind */
    uint8_t tag;       /* pool_tag (alloc, free, oom) */
    uint8_t small;      /* 1: small pool (alloc, free, segment events) */
    uint8_t persistent; /* 1: the params/grads/optimizer class (POOL.md) */
    uint8_t external;   /* 1: recorded by pool_timeline_mark */
    char note[23];      /* marks only; NUL-terminated */
} pool_event;

/* Record an event from outside the pool (the batch controller records
 * BATCH_CHANGE).  Marks never move the counter tracks. */
void pool_timeline_mark(pool *p, pool_event_kind kind, uint32_t job, size_t bytes, const char *note);
/* Copy up to max of the newest events, oldest first; returns how many. */
size_t pool_timeline_snapshot(pool *p, pool_event *out, size_t max);
/* Chrome/Perfetto trace JSON ("traceEvents"): each block's life as an
 * async slice on its job's track ("b" at its alloc, "e" at its free, both
 * named "job N", cat "block", id the alloc's sequence number since the
 * pool began; a block still alive ends at the export's start with
 * "alive": true), an instant event for each other event and for a free
 * whose alloc the ring no longer holds, and counter tracks ("ph":"C") for
 * allocated bytes per tag and reserved bytes per pool.  0, or -1 with
 * errno set. */
int pool_timeline_write_json(pool *p, FILE *f);
/* The same trace in parts, so that a caller can send it as its reader
 * takes it: begin copies the ring (NULL with errno set); each next appends
 * about `want` bytes to f (at least one event) and says 1 while more
 * follow, 0 after the last part, -1 with errno on failure. */
typedef struct pool_tl_export pool_tl_export;
pool_tl_export *pool_timeline_export_begin(pool *p);
int pool_timeline_export_next(pool_tl_export *x, FILE *f, size_t want);
void pool_timeline_export_free(pool_tl_export *x);

/* ---- checking --------------------------------------------------------------- */

/* Exhaustive invariant check (debug/test): no overlapping blocks; neighbours
 * fully coalesced; allocated == sum of live blocks; reserved == sum of
 * segments; per-tag and per-job sums equal the totals; free lists and the
 * pointer map consistent.  0, or -1 with a description in err. */
int pool_check(pool *p, char *err, size_t err_len);

#endif
