/* pool_timeline.c — the event ring and its Chrome/Perfetto trace export.
 *
 * Events are recorded under the pool mutex (pool_tl_record in
 * pool_internal.h) into a fixed ring that overwrites its oldest entries.
 * The export copies the ring under the mutex and formats outside it.
 *
 * Stamps are raw TSC ticks where the TSC is invariant (pool.tl_tsc); the
 * copy out of the ring turns them into CLOCK_MONOTONIC ns, so callers only
 * ever see ns.
 *
 * Counter tracks are rebuilt, not stored: every alloc/free and segment event
 * carries its size, and the ring always holds the newest events without
 * gaps, so the figures before the oldest event held are today's figures
 * minus the sum of the held events' changes.
 *
 * A block's alloc and free are paired into one async slice ("b"/"e"), so
 * that a viewer draws its lifetime; the same gap-free property makes the
 * pairing exact (pair_blocks).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* for clock_gettime etc. under -std=c11 */
#endif
#include "pool_internal.h"

#include "tsc.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>

/* ==== the clock ========================================================================= */

#if POOL_HAVE_TSC
/* A (tick, ns) pair read together: the tick is the midpoint of two reads
 * around the clock call.  The tightest of a few tries is kept, so an
 * interrupt or a preempted vCPU in the middle of one does not skew it. */
static void tsc_anchor(uint64_t *tick, uint64_t *ns)
{
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 3; i++) {
        uint64_t a = __rdtsc();
        uint64_t n = pool_now_ns();
        uint64_t b = __rdtsc();
        if (b >= a && b - a < best) {
            best = b - a;
            *tick = a + (b - a) / 2;
            *ns = n;
        }
    }
    if (best == UINT64_MAX) { /* the TSC ran backwards each time: take the last reads */
        *tick = __rdtsc();
        *ns = pool_now_ns();
    }
}
#endif

void pool_tl_clock_init(pool *p)
{
    p->tl_tsc = false;
    p->tl_last = 0;
#if POOL_HAVE_TSC
    if (tsc_invariant()) {
        p->tl_tsc = true;
        tsc_anchor(&p->tl_tick0, &p->tl_ns0);
        p->tl_last = p->tl_tick0;
    }
#endif
}

/* The line runs through now, with the slope averaged since creation: the
 * slope is then as exact as the anchors allow (their few ns of error spread
 * over the pool's lifetime), and the events the ring holds, being the
 * newest, sit close to the point where the line is exact, so a drift of
 * CLOCK_MONOTONIC's rate (NTP slewing it) moves them by little. */
pool_tl_clock pool_tl_clock_now(pool *p)
{
    pool_tl_clock c = {.tsc = p->tl_tsc, .tick_now = 0, .ns_now = 0, .ns_per_tick = 0};
#if POOL_HAVE_TSC
    if (c.tsc) {
        tsc_anchor(&c.tick_now, &c.ns_now);
        if (c.tick_now < p->tl_last)
            c.tick_now = p->tl_last;
        if (c.tick_now > p->tl_tick0 && c.ns_now > p->tl_ns0)
            c.ns_per_tick = (double)(c.ns_now - p->tl_ns0) / (double)(c.tick_now - p->tl_tick0);
    }
#endif
    return c;
}

/* Every stamp is at most c->tick_now: the anchor is read after the stamps
 * it converts, and clamped to the newest. */
uint64_t pool_tl_to_ns(const pool_tl_clock *c, uint64_t stamp)
{
    if (!c->tsc)
        return stamp;
    double back = (double)(c->tick_now - stamp) * c->ns_per_tick;
    return back >= (double)c->ns_now ? 0 : c->ns_now - (uint64_t)back;
}

/* ==== names and marks ================================================================= */

const char *pool_event_kind_name(pool_event_kind k)
{
    static const char *const names[POOL_EV_COUNT] = {
        "alloc", "free", "segment_map", "segment_unmap", "trim", "oom", "batch_change",
    };
    return (unsigned)k < POOL_EV_COUNT ? names[k] : "?";
}

void pool_timeline_mark(pool *p, pool_event_kind kind, uint32_t job, size_t bytes, const char *note)
{
    if ((unsigned)kind >= POOL_EV_COUNT)
        return;
    pthread_mutex_lock(&p->lock);
    if (p->ring_cap) {
        pool_event *e = &p->ring[p->ring_next];
        pool_stats_begin(p);
        pool_tl_record(p, kind, job, POOL_TAG_OTHER, 0, bytes, 0, 0);
        pool_stats_end(p);
        e->external = 1;
        if (note)
            snprintf(e->note, sizeof e->note, "%s", note);
    }
    pthread_mutex_unlock(&p->lock);
}

/* ==== copying the ring ===================================================================== */

/* The newest min(max, held) events, oldest first, stamps in ns.  Mutex held. */
static size_t ring_copy(pool *p, pool_event *out, size_t max)
{
    size_t held = p->ring_total < p->ring_cap ? (size_t)p->ring_total : p->ring_cap;
    size_t n = held < max ? held : max;
    /* ring_next is one past the newest event. */
    size_t start = (p->ring_next + p->ring_cap - n) % (p->ring_cap ? p->ring_cap : 1);
    pool_tl_clock clk = pool_tl_clock_now(p);
    for (size_t i = 0; i < n; i++) {
        out[i] = p->ring[(start + i) % p->ring_cap];
        out[i].ns = pool_tl_to_ns(&clk, out[i].ns);
    }
    return n;
}

size_t pool_timeline_snapshot(pool *p, pool_event *out, size_t max)
{
    pthread_mutex_lock(&p->lock);
    size_t n = p->ring_cap ? ring_copy(p, out, max) : 0;
    pthread_mutex_unlock(&p->lock);
    return n;
}

/* ==== JSON ======================================================================================== */

/* The trace is streamed, not built as one jansson value: a ring holds up
 * to millions of events, and its stamps keep their fixed three decimals,
 * which a jansson real would not print.  Its fixed keys and numbers are
 * printed here; every string that comes from outside (the device id, a
 * mark's note) goes through jansson's encoder, ASCII only.  A note cut at
 * its buffer's end may end in half a UTF-8 character, which jansson will
 * not take: its bytes beyond ASCII are then shown as '?'. */
static int put_string(FILE *f, const char *s)
{
    json_t *j = json_string(s);
    if (!j) {
        char *safe = strdup(s);
        for (char *c = safe; c && *c; c++)
            if ((unsigned char)*c >= 0x80)
                *c = '?';
        j = safe ? json_string(safe) : NULL;
        free(safe);
    }
    int rc = j ? json_dumpf(j, f, JSON_ENCODE_ANY | JSON_ENSURE_ASCII) : -1;
    json_decref(j);
    return rc;
}

static double ts_us(uint64_t ns, uint64_t t0) { return ns >= t0 ? (double)(ns - t0) / 1e3 : 0.0; }

/* Track ids: 0 is the pool itself, job j is j + 1. */
static uint64_t event_tid(const pool_event *e)
{
    switch (e->kind) {
    case POOL_EV_ALLOC:
    case POOL_EV_FREE:
    case POOL_EV_OOM:
    case POOL_EV_BATCH_CHANGE:
        return (uint64_t)e->job + 1;
    default:
        return 0;
    }
}

static void counter_allocated(FILE *f, double ts, const int64_t tags[POOL_TAG_COUNT])
{
    fprintf(f, ",\n{\"name\":\"allocated\",\"ph\":\"C\",\"ts\":%.3f,\"pid\":1,\"args\":{", ts);
    for (int t = 0; t < POOL_TAG_COUNT; t++)
        fprintf(f, "%s\"%s\":%lld", t ? "," : "", pool_tag_name((pool_tag)t), (long long)tags[t]);
    fputs("}}", f);
}

/* Reserved bytes by pool: small/large, and within each the persistent
 * class (params, grads, optimizer) apart from the transient rest. */
static int res_index(const pool_event *e) { return (e->small ? 0 : 1) + (e->persistent ? 2 : 0); }

static void counter_reserved(FILE *f, double ts, const int64_t res[4])
{
    fprintf(f,
            ",\n{\"name\":\"reserved\",\"ph\":\"C\",\"ts\":%.3f,\"pid\":1,"
            "\"args\":{\"small transient\":%lld,\"large transient\":%lld,"
            "\"small persistent\":%lld,\"large persistent\":%lld}}",
            ts, (long long)res[0], (long long)res[1], (long long)res[2], (long long)res[3]);
}

static int instant(FILE *f, const pool_event *e, double ts)
{
    fprintf(f, ",\n{\"name\":\"%s\",\"cat\":\"pool\",\"ph\":\"i\",\"s\":\"t\",\"ts\":%.3f,"
               "\"pid\":1,\"tid\":%llu,\"args\":{\"bytes\":%llu",
            pool_event_kind_name((pool_event_kind)e->kind), ts,
            (unsigned long long)event_tid(e), (unsigned long long)e->bytes);
    switch (e->kind) {
    case POOL_EV_ALLOC:
    case POOL_EV_FREE:
        fprintf(f, ",\"tag\":\"%s\",\"job\":%u,\"pool\":\"%s\",\"addr\":\"0x%llx\"",
                pool_tag_name((pool_tag)e->tag), e->job, e->small ? "small" : "large",
                (unsigned long long)e->addr);
        if (e->kind == POOL_EV_ALLOC && !e->external)
            fprintf(f, ",\"requested\":%llu", (unsigned long long)e->aux);
        break;
    case POOL_EV_SEGMENT_MAP:
    case POOL_EV_SEGMENT_UNMAP:
        fprintf(f, ",\"pool\":\"%s %s\",\"addr\":\"0x%llx\"", e->small ? "small" : "large",
                e->persistent ? "persistent" : "transient", (unsigned long long)e->addr);
        break;
    case POOL_EV_TRIM:
        if (!e->external)
            fprintf(f, ",\"reason\":\"%s\"", pool_trim_reason_name((pool_trim_reason)e->aux));
        break;
    case POOL_EV_OOM:
        fprintf(f, ",\"tag\":\"%s\",\"job\":%u,\"job_limit_hit\":%s",
                pool_tag_name((pool_tag)e->tag), e->job, e->aux ? "true" : "false");
        break;
    default:
        fprintf(f, ",\"job\":%u", e->job);
        break;
    }
    /* A program job's pool events are marks on its job's track. */
    if (e->external && (e->kind == POOL_EV_SEGMENT_MAP || e->kind == POOL_EV_SEGMENT_UNMAP || e->kind == POOL_EV_TRIM))
        fprintf(f, ",\"job\":%u", e->job);
    int rc = 0;
    if (e->external) {
        fputs(",\"note\":", f);
        rc = put_string(f, e->note);
    }
    fputs("}}", f);
    return rc;
}

/* ---- block lifetimes ---------------------------------------------------------------------- */

#define PAIR_NONE UINT32_MAX

/* An export in progress: the ring as it was when it began, and the
 * counter tracks as far as the events written so far. */
struct pool_tl_export {
    pool_event *ev;
    uint32_t *pair; /* per event: its block's free (for an alloc) or alloc (for a free); PAIR_NONE */
    size_t n, next; /* events held; the next to write */
    size_t tail;    /* the next event to look at for a block still alive */
    int64_t tags[POOL_TAG_COUNT], res[POOL_NSUB];
    uint64_t total, t0, end_ns; /* end_ns: when the export began, where live blocks end */
    char device[16];
    int phase; /* 0: the header is next; 1: events; 2: live blocks' ends; 3: done */
};

static bool is_block_event(const pool_event *e)
{
    return !e->external && (e->kind == POOL_EV_ALLOC || e->kind == POOL_EV_FREE);
}

/* Pair each free with its block's alloc.  A live block's address is its
 * own, so the latest alloc at a free's address before it is that block's
 * alloc -- if the ring still holds it.  And it does whenever the ring
 * holds any earlier alloc at the address: the ring keeps the newest
 * events without gaps, and the block's alloc came after that one.  So a
 * free whose address was last allocated by an already paired alloc (or
 * never) lost its alloc to the ring's overwriting.  A hash of addresses
 * to their latest alloc, open addressing, lives only while pairing.
 * 0, or -1 when the host is out of memory. */
static int pair_blocks(pool_tl_export *x)
{
    size_t allocs = 0;
    for (size_t i = 0; i < x->n; i++) {
        x->pair[i] = PAIR_NONE;
        allocs += is_block_event(&x->ev[i]) && x->ev[i].kind == POOL_EV_ALLOC;
    }
    if (!allocs)
        return 0;
    size_t cap = 16;
    while (cap < 2 * allocs)
        cap *= 2;
    struct slot {
        uint64_t addr;
        uint32_t idx1; /* the alloc's index + 1; 0: empty */
    } *map = calloc(cap, sizeof *map);
    if (!map)
        return -1;
    for (size_t i = 0; i < x->n; i++) {
        const pool_event *e = &x->ev[i];
        if (!is_block_event(e))
            continue;
        size_t h = (size_t)((e->addr >> 9) * 0x9E3779B97F4A7C15ull) & (cap - 1);
        while (map[h].idx1 && map[h].addr != e->addr)
            h = (h + 1) & (cap - 1);
        if (e->kind == POOL_EV_ALLOC) {
            map[h].addr = e->addr;
            map[h].idx1 = (uint32_t)i + 1;
        } else if (map[h].idx1 && x->pair[map[h].idx1 - 1] == PAIR_NONE) {
            x->pair[map[h].idx1 - 1] = (uint32_t)i;
            x->pair[i] = map[h].idx1 - 1;
        }
    }
    free(map);
    return 0;
}

/* A block's slice on its job's async track, named for the job: its id is
 * its alloc's sequence number since the pool began, one per lifetime even
 * where an address is used again. */
static void slice_edge(FILE *f, const pool_tl_export *x, size_t alloc, char ph, double ts)
{
    const pool_event *a = &x->ev[alloc];
    fprintf(f, ",\n{\"name\":\"job %u\",\"cat\":\"block\",\"ph\":\"%c\",\"id\":%llu,\"ts\":%.3f,\"pid\":1,"
               "\"tid\":%llu",
            a->job, ph, (unsigned long long)(x->total - x->n + alloc), ts, (unsigned long long)a->job + 1);
}

pool_tl_export *pool_timeline_export_begin(pool *p)
{
    pool_tl_export *x = calloc(1, sizeof *x);
    if (!x)
        return NULL;
    pthread_mutex_lock(&p->lock);
    size_t held = p->ring_total < p->ring_cap ? (size_t)p->ring_total : p->ring_cap;
    x->ev = held ? malloc(held * sizeof *x->ev) : NULL;
    if (held && !x->ev) {
        pthread_mutex_unlock(&p->lock);
        free(x);
        errno = ENOMEM;
        return NULL;
    }
    x->n = held ? ring_copy(p, x->ev, held) : 0;
    for (int t = 0; t < POOL_TAG_COUNT; t++)
        x->tags[t] = POOL_LD(p->live.tag_current[t]);
    for (int i = 0; i < p->nsub; i++)
        for (const pool_segment *sg = p->sub[i].segs; sg; sg = sg->next)
            x->res[i % POOL_NSUB] += (int64_t)sg->size;
    x->total = p->ring_total;
    x->t0 = p->t0_ns;
    x->end_ns = pool_now_ns(); /* after ring_copy's clock reading: no event is later */
    pthread_mutex_unlock(&p->lock);
    snprintf(x->device, sizeof x->device, "%s", p->d->id);
    /* The ring holds at most 2^24 events (gradd.conf caps it), so an
     * index fits a uint32_t. */
    x->pair = x->n ? malloc(x->n * sizeof *x->pair) : NULL;
    if (x->n && (!x->pair || pair_blocks(x) != 0)) {
        pool_timeline_export_free(x);
        errno = ENOMEM;
        return NULL;
    }

    /* Wind the counters back to just before the oldest held event. */
    for (size_t i = 0; i < x->n; i++) {
        const pool_event *e = &x->ev[i];
        if (e->external)
            continue;
        if (e->kind == POOL_EV_ALLOC)
            x->tags[e->tag % POOL_TAG_COUNT] -= (int64_t)e->bytes;
        else if (e->kind == POOL_EV_FREE)
            x->tags[e->tag % POOL_TAG_COUNT] += (int64_t)e->bytes;
        else if (e->kind == POOL_EV_SEGMENT_MAP)
            x->res[res_index(e)] -= (int64_t)e->bytes;
        else if (e->kind == POOL_EV_SEGMENT_UNMAP)
            x->res[res_index(e)] += (int64_t)e->bytes;
    }
    return x;
}

/* The trace's opening: metadata, one named track per job, the counters'
 * starting values. */
static int export_header(pool_tl_export *x, FILE *f)
{
    const pool_event *ev = x->ev;
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"device\":");
    int bad = put_string(f, x->device);
    fprintf(f, ",\"events_recorded\":%llu,\"events_dropped\":%llu},\n\"traceEvents\":[\n",
            (unsigned long long)x->total, (unsigned long long)(x->total - x->n));
    fputs("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":", f);
    char pname[96];
    snprintf(pname, sizeof pname, "gradd pool %s", x->device);
    bad |= put_string(f, pname);
    fputs("}},\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{\"name\":\"pool\"}}", f);

    /* Name each job's track once.  Jobs are few; a short list is enough. */
    uint32_t named[POOL_MAX_JOBS];
    size_t nnamed = 0;
    for (size_t i = 0; i < x->n; i++) {
        uint64_t tid = event_tid(&ev[i]);
        if (!tid)
            continue;
        bool seen = false;
        for (size_t k = 0; k < nnamed && !seen; k++)
            seen = named[k] == ev[i].job;
        if (seen || nnamed == POOL_MAX_JOBS)
            continue;
        named[nnamed++] = ev[i].job;
        fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%llu,"
                   "\"args\":{\"name\":\"job %u\"}}",
                (unsigned long long)tid, ev[i].job);
    }

    double first = x->n ? ts_us(ev[0].ns, x->t0) : 0.0;
    counter_allocated(f, first, x->tags);
    counter_reserved(f, first, x->res);
    return bad;
}

/* A paired or still live block's alloc begins its slice, with what the
 * instant would have said; its free ends it.  A free whose alloc the ring
 * lost stays an instant. */
static int block_edge(pool_tl_export *x, FILE *f, size_t i, double ts)
{
    const pool_event *e = &x->ev[i];
    if (e->kind == POOL_EV_ALLOC) {
        slice_edge(f, x, i, 'b', ts);
        fprintf(f, ",\"args\":{\"bytes\":%llu,\"tag\":\"%s\",\"job\":%u,\"pool\":\"%s\",\"addr\":\"0x%llx\","
                   "\"requested\":%llu}}",
                (unsigned long long)e->bytes, pool_tag_name((pool_tag)e->tag), e->job, e->small ? "small" : "large",
                (unsigned long long)e->addr, (unsigned long long)e->aux);
        return 0;
    }
    if (x->pair[i] == PAIR_NONE)
        return instant(f, e, ts);
    slice_edge(f, x, x->pair[i], 'e', ts);
    fputs("}", f);
    return 0;
}

static int export_event(pool_tl_export *x, FILE *f, size_t i)
{
    const pool_event *e = &x->ev[i];
    double ts = ts_us(e->ns, x->t0);
    int bad = is_block_event(e) ? block_edge(x, f, i, ts) : instant(f, e, ts);
    if (e->external)
        return bad;
    switch (e->kind) {
    case POOL_EV_ALLOC:
    case POOL_EV_FREE:
        x->tags[e->tag % POOL_TAG_COUNT] += e->kind == POOL_EV_ALLOC ? (int64_t)e->bytes : -(int64_t)e->bytes;
        counter_allocated(f, ts, x->tags);
        break;
    case POOL_EV_SEGMENT_MAP:
    case POOL_EV_SEGMENT_UNMAP:
        x->res[res_index(e)] += e->kind == POOL_EV_SEGMENT_MAP ? (int64_t)e->bytes : -(int64_t)e->bytes;
        counter_reserved(f, ts, x->res);
        break;
    default:
        break;
    }
    return bad;
}

int pool_timeline_export_next(pool_tl_export *x, FILE *f, size_t want)
{
    if (!x || !f) {
        errno = EINVAL;
        return -1;
    }
    errno = 0;
    int bad = 0;
    long start = ftell(f);
    if (x->phase == 0) {
        bad |= export_header(x, f);
        x->phase = 1;
    }
    /* An event and its counter take a few hundred bytes: write until the
     * part is about `want` long. */
    while (x->phase == 1 && x->next < x->n && !bad) {
        bad |= export_event(x, f, x->next++);
        if (start >= 0 && (size_t)(ftell(f) - start) >= want)
            break;
    }
    if (x->phase == 1 && x->next == x->n)
        x->phase = 2;
    /* Blocks still alive end when the export began, marked so, after
     * every event: the trace stays in time order. */
    double end = ts_us(x->end_ns, x->t0);
    while (x->phase == 2 && x->tail < x->n && (start < 0 || (size_t)(ftell(f) - start) < want)) {
        size_t i = x->tail++;
        if (is_block_event(&x->ev[i]) && x->ev[i].kind == POOL_EV_ALLOC && x->pair[i] == PAIR_NONE) {
            slice_edge(f, x, i, 'e', end);
            fputs(",\"args\":{\"alive\":true}}", f);
        }
    }
    if (x->phase == 2 && x->tail == x->n) {
        fputs("\n]}\n", f);
        x->phase = 3;
    }
    if (fflush(f) != 0 || ferror(f)) {
        if (!errno)
            errno = EIO;
        return -1;
    }
    if (bad) { /* jansson could not allocate */
        errno = ENOMEM;
        return -1;
    }
    return x->phase != 3;
}

void pool_timeline_export_free(pool_tl_export *x)
{
    if (!x)
        return;
    free(x->ev);
    free(x->pair);
    free(x);
}

int pool_timeline_write_json(pool *p, FILE *f)
{
    if (!f) {
        errno = EINVAL;
        return -1;
    }
    pool_tl_export *x = pool_timeline_export_begin(p);
    if (!x)
        return -1;
    int rc;
    while ((rc = pool_timeline_export_next(x, f, SIZE_MAX)) == 1)
        ;
    pool_timeline_export_free(x);
    return rc < 0 ? -1 : 0;
}
