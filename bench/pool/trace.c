/* trace.c — the shared half of the pool trace benchmarks (see trace.h). */
#include "trace.h"

#include "tsc.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

const char *bench_prog = "bench_pool";

/* ==== timing ========================================================================= */

bool use_tsc;
double ticks_per_ns = 1.0;
uint64_t tick_overhead;

/* The TSC times calls only where it is a clock (invariant, tsc.h) and
 * tsc_end's rdtscp exists (CPUID 0x80000001 EDX bit 27), on x86-64 alone,
 * where tsc_begin and tsc_end read it. */
static bool tsc_usable(void)
{
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (!tsc_invariant() || !__get_cpuid(0x80000001u, &a, &b, &c, &d))
        return false;
    return (d >> 27) & 1u;
#else
    return false;
#endif
}

int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

void timer_calibrate(void)
{
    if (use_tsc) {
        /* 100 ms of busy waiting against CLOCK_MONOTONIC. */
        uint64_t n0 = clock_ns(), t0 = tsc_begin();
        while (clock_ns() - n0 < 100000000u)
            ;
        uint64_t t1 = tsc_end(), n1 = clock_ns();
        ticks_per_ns = (double)(t1 - t0) / (double)(n1 - n0);
    }
    enum { N = 200001 };
    static uint64_t v[N];
    for (int i = 0; i < N; i++) {
        uint64_t a = tick_begin();
        uint64_t b = tick_end();
        v[i] = b - a;
    }
    qsort(v, N, sizeof v[0], cmp_u64);
    tick_overhead = v[N / 2];
}

double ticks_to_ns(uint64_t ticks) { return (double)ticks / ticks_per_ns; }

void timer_setup(const char *timer)
{
    use_tsc = timer ? !strcmp(timer, "tsc") : tsc_usable();
    if (use_tsc && !tsc_usable())
        fprintf(stderr, "%s: warning: the TSC is not invariant here; use --timer clock\n",
                bench_prog);
    timer_calibrate();
}

void timer_describe(void)
{
    fprintf(stderr, "timer: %s, %.3f ticks/ns, %.1f ns overhead subtracted per call\n",
            use_tsc ? "rdtsc" : "clock_gettime", ticks_per_ns, ticks_to_ns(tick_overhead));
}

/* ==== the trace ======================================================================== */

static void *xgrow(void *p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return p;
    size_t nc = *cap ? *cap : 4096;
    while (nc < need)
        nc *= 2;
    char *np = realloc(p, nc * elem);
    if (!np) {
        fprintf(stderr, "%s: out of memory reading the trace\n", bench_prog);
        exit(1);
    }
    memset(np + *cap * elem, 0, (nc - *cap) * elem);
    *cap = nc;
    return np;
}

void trace_free(trace *t)
{
    free(t->ops);
    free(t->steps);
    free(t->alloc_step);
    memset(t, 0, sizeof *t);
}

int trace_load(const char *path, trace *t)
{
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "%s: cannot open trace %s: %s\n", bench_prog, path, strerror(errno));
        return -1;
    }
    size_t ops_cap = 0, steps_cap = 0, ids_cap = 0;
    uint64_t *id_size = NULL;
    uint8_t *id_state = NULL; /* 0 unseen, 1 live, 2 freed; sized like alloc_step */
    size_t size_cap = 0, state_cap = 0;
    uint64_t live = 0;
    int32_t cur_step = -1, phase_first_step = 0;
    char *line = NULL;
    size_t len = 0;
    unsigned long lineno = 0;
    int rc = -1;

    while (getline(&line, &len, f) > 0) {
        lineno++;
        const char *s = line;
        if (*s == '\n')
            continue;
        if (*s == '#') {
            int a, b;
            if (sscanf(s, "# phase %d micro=%d", &a, &b) == 2) {
                if (a != t->nphases || a >= 64) {
                    fprintf(stderr, "%s:%lu: phase %d out of order\n", path, lineno, a);
                    goto out;
                }
                t->phase_micro[t->nphases++] = b;
                phase_first_step = (int32_t)t->nsteps;
            } else if (sscanf(s, "# step %d", &a) == 1) {
                if (a != (int)t->nsteps || t->nphases == 0) {
                    fprintf(stderr, "%s:%lu: step %d out of order or before a phase\n", path,
                            lineno, a);
                    goto out;
                }
                t->steps = xgrow(t->steps, &steps_cap, t->nsteps + 1, sizeof *t->steps);
                t->steps[t->nsteps++] = (trace_step){
                    .phase = t->nphases - 1, .in_phase = a - phase_first_step};
                cur_step = a;
                t->ops = xgrow(t->ops, &ops_cap, t->nops + 1, sizeof *t->ops);
                t->ops[t->nops++] = (trace_op){.kind = OP_STEP, .id = (uint32_t)a};
            }
            continue;
        }
        char op = 0;
        unsigned long long id = 0, size = 0;
        char tagname[32] = "";
        int n = sscanf(s, "%c %llu %llu %31s", &op, &id, &size, tagname);
        if (op == 'a' && n == 4) {
            pool_tag tag;
            if (pool_tag_parse(tagname, &tag) != 0 || id >= (1ull << 31) || size == 0) {
                fprintf(stderr, "%s:%lu: bad alloc line: %s", path, lineno, s);
                goto out;
            }
            id_size = xgrow(id_size, &size_cap, id + 1, sizeof *id_size);
            id_state = xgrow(id_state, &state_cap, id + 1, sizeof *id_state);
            t->alloc_step = xgrow(t->alloc_step, &ids_cap, id + 1, sizeof *t->alloc_step);
            if (id_state[id]) {
                fprintf(stderr, "%s:%lu: id %llu allocated twice\n", path, lineno, id);
                goto out;
            }
            id_state[id] = 1;
            id_size[id] = size;
            t->alloc_step[id] = cur_step;
            if (id + 1 > t->nids)
                t->nids = (uint32_t)(id + 1);
            if (cur_step < 0)
                t->setup_allocs++;
            else
                t->steps[cur_step].allocs++;
            t->ops = xgrow(t->ops, &ops_cap, t->nops + 1, sizeof *t->ops);
            t->ops[t->nops++] = (trace_op){
                .kind = OP_ALLOC, .id = (uint32_t)id, .size = size, .tag = (uint8_t)tag};
            t->nallocs++;
            live += size;
            if (live > t->peak_live)
                t->peak_live = live;
        } else if (op == 'f' && n >= 2) {
            if (id >= state_cap || id_state[id] != 1) {
                fprintf(stderr, "%s:%lu: free of id %llu, which is not live\n", path, lineno, id);
                goto out;
            }
            id_state[id] = 2;
            live -= id_size[id];
            t->ops = xgrow(t->ops, &ops_cap, t->nops + 1, sizeof *t->ops);
            t->ops[t->nops++] =
                (trace_op){.kind = OP_FREE, .id = (uint32_t)id, .size = id_size[id]};
            t->nfrees++;
        } else {
            fprintf(stderr, "%s:%lu: cannot parse: %s", path, lineno, s);
            goto out;
        }
    }
    if (ferror(f)) {
        fprintf(stderr, "%s: reading %s: %s\n", bench_prog, path, strerror(errno));
        goto out;
    }
    if (t->nallocs == 0 || t->nsteps == 0) {
        fprintf(stderr, "%s: %s has no allocations or no steps\n", bench_prog, path);
        goto out;
    }
    rc = 0;
out:
    if (rc != 0)
        trace_free(t);
    free(line);
    fclose(f);
    free(id_size);
    free(id_state);
    return rc;
}


void trace_describe(const char *path, const trace *t)
{
    fprintf(stderr, "trace %s: %zu ops (%zu allocs, %zu frees), %u steps in %d phases (micro",
            path, t->nops, t->nallocs, t->nfrees, t->nsteps, t->nphases);
    for (int k = 0; k < t->nphases; k++)
        fprintf(stderr, "%c%d", k ? ',' : ' ', t->phase_micro[k]);
    fprintf(stderr, "), peak live %.2f GiB\n", (double)t->peak_live / (1 << 30));
}

/* ==== counting device calls ============================================================== */

/* The device's function table copied and the two calls that obtain memory
 * counted: what "device allocation" means for every peer that uses a dev. */
uint64_t dev_calls;
uint64_t dev_va_bytes;
static const dev_ops *real_ops;
static dev_ops counting_ops;

static dev_status counting_alloc(dev *d, size_t bytes, void **ptr)
{
    dev_calls++;
    return real_ops->alloc(d, bytes, ptr);
}

static dev_status counting_va_map(dev *d, void *addr, size_t bytes)
{
    dev_calls++;
    dev_va_bytes += bytes;
    return real_ops->va_map(d, addr, bytes);
}

void counting_wrap(dev *d)
{
    real_ops = d->ops;
    counting_ops = *d->ops;
    counting_ops.alloc = counting_alloc;
    if (counting_ops.va_map)
        counting_ops.va_map = counting_va_map;
    d->ops = &counting_ops;
}

/* ==== the replay ================================================================================ */

int replay_buf_init(replay_buf *rb, const trace *t)
{
    *rb = (replay_buf){
        .ptr = calloc(t->nids, sizeof(void *)),
        .at = calloc(t->nids, sizeof(uint32_t)),
        .ft = calloc(t->nids, sizeof(uint32_t)),
        .miss = calloc(t->nids, 1),
        .step_dev = calloc(t->nsteps + 1, sizeof(uint64_t)),
        .pairs = calloc(4 * t->nallocs + 1, sizeof(uint64_t)),
    };
    if (!rb->ptr || !rb->at || !rb->ft || !rb->miss || !rb->step_dev || !rb->pairs) {
        fprintf(stderr, "%s: out of memory\n", bench_prog);
        replay_buf_free(rb);
        return -1;
    }
    return 0;
}

void replay_buf_free(replay_buf *rb)
{
    free(rb->ptr);
    free(rb->at);
    free(rb->ft);
    free(rb->miss);
    free(rb->step_dev);
    free(rb->pairs);
    memset(rb, 0, sizeof *rb);
}

/* The pool's small-pool limit: the split of the summary's medians. */
#define SMALL_REQUEST ((uint64_t)1 << 20)

static double median_ticks(uint64_t *v, size_t n)
{
    if (!n)
        return 0;
    qsort(v, n, sizeof *v, cmp_u64);
    return ticks_to_ns(v[(n - 1) / 2]);
}

/* Pair figures and device counts from the buffers of one replay.  Pairs are
 * the ids freed during the trace, in free order. */
void summarise(const trace *t, replay_buf *rb, int warm_steps, run_result *r)
{
    size_t n = 0, nh = 0, ns = 0, nl = 0, nmiss = 0;
    uint64_t sum = 0;
    uint64_t *hits = rb->pairs + t->nallocs, *smalls = hits + t->nallocs,
             *larges = smalls + t->nallocs;
    for (size_t i = 0; i < t->nops; i++) {
        const trace_op *o = &t->ops[i];
        if (o->kind != OP_FREE)
            continue;
        int32_t s = t->alloc_step[o->id];
        if (s < warm_steps)
            continue;
        uint64_t a = rb->at[o->id] > tick_overhead ? rb->at[o->id] - tick_overhead : 0;
        uint64_t f = rb->ft[o->id] > tick_overhead ? rb->ft[o->id] - tick_overhead : 0;
        rb->pairs[n++] = a + f;
        sum += a + f;
        if (rb->miss[o->id])
            nmiss++;
        else
            hits[nh++] = a + f;
        if (o->size <= SMALL_REQUEST)
            smalls[ns++] = a + f;
        else
            larges[nl++] = a + f;
    }
    r->npairs = n;
    r->nmiss_pairs = nmiss;
    r->median_ns = median_ticks(rb->pairs, n);
    if (n) {
        size_t k = (size_t)ceil(0.99 * (double)n);
        r->p99_ns = ticks_to_ns(rb->pairs[(k ? k : 1) - 1]);
        r->mean_ns = ticks_to_ns(sum) / (double)n;
    }
    r->hit_median_ns = median_ticks(hits, nh);
    r->small_median_ns = median_ticks(smalls, ns);
    r->large_median_ns = median_ticks(larges, nl);
    r->nsmall = ns;
    r->nlarge = nl;

    r->dev_allocs = rb->step_dev[t->nsteps];
    for (uint32_t s = 0; s < t->nsteps; s++)
        r->phase_dev_allocs[t->steps[s].phase] += rb->step_dev[s + 1] - rb->step_dev[s];
    r->phase_dev_allocs[0] += rb->step_dev[0]; /* the setup */
    r->dev_allocs_steady = 0;
    r->requests_steady = 0;
    for (uint32_t s = 0; s < t->nsteps; s++) {
        if (t->steps[s].in_phase < warm_steps)
            continue;
        r->dev_allocs_steady += rb->step_dev[s + 1] - rb->step_dev[s];
        r->requests_steady += t->steps[s].allocs;
    }
}

void run_reset(const trace *t, replay_buf *rb, run_result *r)
{
    memset(r, 0, sizeof *r);
    dev_calls = 0;
    dev_va_bytes = 0;
    memset(rb->step_dev, 0, (t->nsteps + 1) * sizeof *rb->step_dev);
}

int run_finish(const trace *t, replay_buf *rb, int warm_steps, int rc, run_result *r)
{
    if (rc != 0)
        return -1;
    summarise(t, rb, warm_steps, r);
    r->ok = true;
    return 0;
}

/* ==== gradd's pool ================================================================================ */

typedef struct {
    pool *p;
    const trace *t;
    run_result *r;
    pool_stats *st;
    long trim_at_step;
} pool_ctx;

static void *pool_a(void *c, size_t size, int tag)
{
    return pool_alloc(((pool_ctx *)c)->p, size, (pool_tag)tag, 1, NULL);
}
static void pool_f(void *c, void *ptr, size_t size)
{
    (void)size;
    pool_free(((pool_ctx *)c)->p, ptr);
}

/* A phase ends: note its peaks and start the next phase's from here. */
static void pool_phase_close(pool_ctx *c, int phase)
{
    pool_stats_read(c->p, c->st);
    c->r->phase_peak_allocated[phase] = c->st->allocated_bytes[POOL_ALL].peak;
    c->r->phase_peak_reserved[phase] = c->st->reserved_bytes[POOL_ALL].peak;
    c->r->phase_end_reserved[phase] = c->st->reserved_bytes[POOL_ALL].current;
    pool_stats_reset_peaks(c->p);
}

/* Between steps, untimed: what a training worker does (pool_tick), plus
 * the per-phase figures. */
static void pool_s(void *cv, uint32_t step)
{
    pool_ctx *c = cv;
    const trace_step *ts = &c->t->steps[step];
    if (ts->in_phase == 0 && step > 0)
        pool_phase_close(c, ts->phase - 1);
    pool_tick(c->p, (uint64_t)step + 1);
    if ((long)step == c->trim_at_step)
        pool_trim(c->p, POOL_TRIM_REQUEST, 0);
}

int pool_run(dev *d, bool expandable, const trace *t, replay_buf *rb, const bench_opts *o,
             const char *name, run_result *r)
{
    run_reset(t, rb, r);
    r->is_pool = true;

    pool_config cfg;
    pool_config_default(&cfg);
    cfg.expandable_segments = expandable;
    if (!o->timeline)
        cfg.timeline_capacity = 0;
    cfg.trim_every_steps = o->trim_every_steps;
    cfg.gc_threshold = o->gc_threshold;
    pool_ctx c = {.t = t, .r = r, .trim_at_step = o->trim_at_step};
    if (pool_create(d, &cfg, &c.p) != 0) {
        fprintf(stderr, "%s: %s: pool_create failed\n", bench_prog, name);
        return -1;
    }
    c.st = calloc(1, sizeof *c.st);
    if (!c.st) {
        pool_destroy(c.p);
        return -1;
    }
    pool_stats *st = c.st;

    uint64_t w0 = clock_ns();
    int rc = replay(t, rb, &c, pool_a, pool_f, NULL, pool_s);
    r->wall_ms = (double)(clock_ns() - w0) / 1e6;
    r->va_bytes = dev_va_bytes;
    if (rc == 0)
        pool_phase_close(&c, t->nphases - 1);

    char err[512] = "";
    r->check_ok = pool_check(c.p, err, sizeof err) == 0;
    if (!r->check_ok)
        fprintf(stderr, "%s: %s: pool_check failed with blocks live: %s\n", bench_prog, name, err);
    pool_stats_read(c.p, st);
    r->stat_device_allocs = st->device_allocs;
    for (int ph = 0; ph < t->nphases; ph++) {
        if (r->phase_peak_reserved[ph] > r->peak_reserved)
            r->peak_reserved = r->phase_peak_reserved[ph];
        if (r->phase_peak_allocated[ph] > r->peak_allocated)
            r->peak_allocated = r->phase_peak_allocated[ph];
    }
    if (expandable && !st->expandable_segments) {
        fprintf(stderr, "%s: %s: expandable segments are not in effect\n", bench_prog, name);
        rc = -1;
    }
    free_leftovers(t, rb, &c, pool_f);
    if (pool_check(c.p, err, sizeof err) != 0) {
        fprintf(stderr, "%s: %s: pool_check failed after freeing all: %s\n", bench_prog, name,
                err);
        r->check_ok = false;
    }
    pool_stats_read(c.p, st);
    if (st->allocated_bytes[POOL_ALL].current != 0 || st->invalid_frees != 0) {
        fprintf(stderr, "%s: %s: %" PRId64 " bytes still allocated, %" PRIu64
                " invalid frees after freeing all\n",
                bench_prog, name, st->allocated_bytes[POOL_ALL].current, st->invalid_frees);
        r->check_ok = false;
    }
    free(st);
    r->hot_ns = hot_pairs(rb->pairs, 4 * t->nallocs, &c, pool_a, pool_f);
    pool_destroy(c.p);
    if (rc != 0)
        return -1;
    summarise(t, rb, o->warm_steps, r);
    r->ok = r->check_ok;
    return r->ok ? 0 : -1;
}

void pool_report(const char *name, const trace *t, const run_result *med, const run_result *first)
{
    fprintf(stderr,
            "%s: peak reserved %.3f GiB / peak allocated %.3f GiB = %.4f; "
            "pool_stats.device_allocs %" PRIu64 "%s; pool_check %s\n",
            name, (double)med->peak_reserved / (1 << 30), (double)med->peak_allocated / (1 << 30),
            med->peak_allocated ? (double)med->peak_reserved / (double)med->peak_allocated : 0.0,
            med->stat_device_allocs,
            med->stat_device_allocs == med->dev_allocs ? " (matches the device's count)"
                                                       : " (DIFFERS from the device's count)",
            med->check_ok ? "ok" : "FAILED");
    fprintf(stderr, "%s by phase:  micro  peak alloc  peak reserved  res/alloc  end reserved"
            "  dev allocs\n", name);
    for (int ph = 0; ph < t->nphases; ph++)
        fprintf(stderr, "%*d  %5d  %8.3f GiB  %9.3f GiB  %9.4f  %8.3f GiB  %10" PRIu64 "\n",
                (int)strlen(name) + 10, ph, t->phase_micro[ph],
                (double)first->phase_peak_allocated[ph] / (1 << 30),
                (double)first->phase_peak_reserved[ph] / (1 << 30),
                first->phase_peak_allocated[ph]
                    ? (double)first->phase_peak_reserved[ph] / (double)first->phase_peak_allocated[ph]
                    : 0.0,
                (double)first->phase_end_reserved[ph] / (1 << 30), first->phase_dev_allocs[ph]);
}

run_result median_result(const run_result *runs, int repeat, int stride)
{
    run_result res = runs[0];
    double *v = calloc((size_t)repeat, sizeof *v);
    if (!v)
        return res; /* the first run's figures: still figures */
#define MED(field)                                   \
    do {                                             \
        for (int r = 0; r < repeat; r++)             \
            v[r] = runs[r * stride].field;           \
        res.field = median_of(v, repeat);            \
    } while (0)
    MED(median_ns);
    MED(p99_ns);
    MED(mean_ns);
    MED(hit_median_ns);
    MED(wall_ms);
    MED(small_median_ns);
    MED(large_median_ns);
    MED(hot_ns);
#undef MED
    free(v);
    return res;
}

/* ==== the command line ========================================================================== */

bool bench_arg(int argc, char **argv, int *i, bench_args *a, bench_opts *o)
{
    const char *arg = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!strcmp(arg, "--no-timeline")) {
        o->timeline = false;
        return true;
    }
    if (arg[0] != '-' && !a->path) {
        a->path = arg;
        return true;
    }
    if (!v)
        return false;
    if (!strcmp(arg, "--repeat"))
        a->repeat = atoi(v);
    else if (!strcmp(arg, "--warm-steps"))
        o->warm_steps = atoi(v);
    else if (!strcmp(arg, "--timer"))
        a->timer = v;
    else if (!strcmp(arg, "--only"))
        a->only = v;
    else
        return false;
    (*i)++;
    return true;
}

int only_select(const char *only, const char *const *names, int n, bool *want)
{
    for (int k = 0; k < n; k++)
        want[k] = !only;
    for (const char *s = only; s && *s;) {
        size_t l = strcspn(s, ",");
        int k = 0;
        while (k < n && !(strlen(names[k]) == l && !strncmp(s, names[k], l)))
            k++;
        if (k == n) {
            fprintf(stderr, "--only: no allocator '%.*s'; there are:", (int)l, s);
            for (k = 0; k < n; k++)
                fprintf(stderr, " %s", names[k]);
            fputc('\n', stderr);
            return -1;
        }
        want[k] = true;
        s += l + (s[l] == ',');
    }
    if (only && !*only) {
        fprintf(stderr, "--only: an empty list\n");
        return -1;
    }
    return 0;
}

/* ==== output ==================================================================================== */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void json_num(double v)
{
    if (!isfinite(v))
        fputs("null", stdout);
    else if (v == floor(v) && fabs(v) < 1e15)
        printf("%.0f", v);
    else
        printf("%.6g", v);
}

void emit(const char *bench, const char *metric, double value, const char *unit,
          const char *peer, double peer_value)
{
    printf("{\"bench\":\"%s\",\"metric\":\"%s\",\"value\":", bench, metric);
    json_num(value);
    printf(",\"unit\":\"%s\",\"peer\":\"%s\",\"peer_value\":", unit, peer);
    json_num(peer_value);
    printf(",\"ratio\":");
    json_num(peer_value != 0 ? value / peer_value : NAN);
    printf("}\n");
}

double round_to(double v, double q) { return round(v / q) * q; }

double per_1000(const trace *t, const run_result *r)
{
    return 1000.0 * (double)r->dev_allocs / (double)t->nallocs;
}

double per_1000_steady(const run_result *r)
{
    return r->requests_steady ? 1000.0 * (double)r->dev_allocs_steady / (double)r->requests_steady
                              : NAN;
}

void emit_pair_ns(const char *bench, const run_result *pool, const int *peers, size_t npeers,
                  int cache, const char *const *names, const run_result *res, const bool *want)
{
    for (size_t i = 0; i < npeers; i++)
        if (want[peers[i]])
            emit(bench, "pair_ns_median", round_to(pool->median_ns, 0.1), "ns", names[peers[i]],
                 round_to(res[peers[i]].median_ns, 0.1));
    for (size_t i = 0; i < npeers; i++)
        if (want[peers[i]])
            emit(bench, "pair_ns_p99", round_to(pool->p99_ns, 0.1), "ns", names[peers[i]],
                 round_to(res[peers[i]].p99_ns, 0.1));
    if (!want[cache])
        return;
    /* The split the summary shows and the hit path alone, against the
     * caching peer only: a peer that goes to the device every time has no
     * hit path (and jemalloc makes no system call for the small requests,
     * so there the split isolates the bookkeeping cost). */
    const run_result *c = &res[cache];
    emit(bench, "pair_ns_median_small", round_to(pool->small_median_ns, 0.1), "ns", names[cache],
         round_to(c->small_median_ns, 0.1));
    emit(bench, "pair_ns_median_large", round_to(pool->large_median_ns, 0.1), "ns", names[cache],
         round_to(c->large_median_ns, 0.1));
    emit(bench, "pair_ns_hot_512B", round_to(pool->hot_ns, 0.1), "ns", names[cache],
         round_to(c->hot_ns, 0.1));
}
