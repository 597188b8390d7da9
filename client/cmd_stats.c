/* cmd_stats.c — gradctl stats: the memory pool's statistics, as a summary
 * table a person reads at a glance or as JSON for scripts. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "ctl.h"
#include "jobfmt.h"
#include "table.h"
#include "units.h"

/* ---- JSON ------------------------------------------------------------------ */

static json_t *stat_json(const Gradd__Stat *s)
{
    return json_pack("{s:I, s:I, s:o, s:o}", "current", (json_int_t)(s ? s->current : 0), "peak",
                     (json_int_t)(s ? s->peak : 0), "allocated", jout_uint(s ? s->allocated : 0), "freed",
                     jout_uint(s ? s->freed : 0));
}

static json_t *pool_stat_json(const Gradd__PoolStat *p)
{
    return json_pack("{s:o, s:o, s:o}", "all", stat_json(p ? p->all : NULL), "small", stat_json(p ? p->small : NULL),
                     "large", stat_json(p ? p->large : NULL));
}

static json_t *job_json(const Gradd__JobUsage *u)
{
    json_t *tags = json_object();
    jobfmt_tags_json(tags, u->tags, u->n_tags);
    return json_pack("{s:o, s:o, s:o, s:o, s:o, s:o}", "job", jout_uint(u->job), "allocated", jout_uint(u->allocated),
                     "peak", jout_uint(u->peak), "limit", jout_uint(u->limit), "need", jout_uint(u->need), "tags",
                     tags);
}

static json_t *pool_json(const Gradd__PoolStats *p)
{
    json_t *o = json_pack("{s:o, s:o, s:o, s:o, s:b, s:o}", "device", jout_str(p->device), "cap", jout_uint(p->cap),
                          "device_total", jout_uint(p->device_total), "device_free", jout_uint(p->device_free),
                          "expandable_segments", (int)p->expandable_segments, "max_split_size",
                          jout_uint(p->max_split_size));
    const struct {
        const char *k;
        const Gradd__PoolStat *v;
    } stats[] = {
        {"allocated_bytes", p->allocated_bytes},
        {"reserved_bytes", p->reserved_bytes},
        {"active_bytes", p->active_bytes},
        {"inactive_split_bytes", p->inactive_split_bytes},
        {"requested_bytes", p->requested_bytes},
        {"allocations", p->allocations},
        {"segments", p->segments},
        {"active_blocks", p->active_blocks},
        {"inactive_split_blocks", p->inactive_split_blocks},
    };
    for (size_t k = 0; k < sizeof stats / sizeof stats[0]; k++)
        json_object_set_new(o, stats[k].k, pool_stat_json(stats[k].v));
    const struct {
        const char *k;
        uint64_t v;
    } counters[] = {
        {"device_allocs", p->device_allocs}, {"device_frees", p->device_frees},
        {"cache_hits", p->cache_hits},       {"alloc_retries", p->alloc_retries},
        {"ooms", p->ooms},                   {"trims", p->trims},
        {"trimmed_bytes", p->trimmed_bytes}, {"trim_ns", p->trim_ns},
        {"idle_trims", p->idle_trims},       {"idle_trimmed_bytes", p->idle_trimmed_bytes},
        {"largest_free_block", p->largest_free_block},
        {"timeline_events", p->timeline_events}, {"timeline_dropped", p->timeline_dropped},
        {"job", p->job},                     {"pid", p->pid},
        {"reclaims", p->reclaims},
    };
    for (size_t k = 0; k < sizeof counters / sizeof counters[0]; k++)
        json_object_set_new(o, counters[k].k, jout_uint(counters[k].v));
    json_object_set_new(o, "fragmentation", jout_real(p->fragmentation));
    json_t *tags = json_object(), *jobs = json_array();
    jobfmt_tags_json(tags, p->tags, p->n_tags);
    for (size_t j = 0; j < p->n_jobs; j++)
        json_array_append_new(jobs, job_json(p->jobs[j]));
    json_object_set_new(o, "tags", tags);
    json_object_set_new(o, "jobs", jobs);
    return o;
}

static int print_json(const Gradd__StatsResponse *sr)
{
    json_t *pools = json_array();
    for (size_t i = 0; i < sr->n_pools; i++)
        json_array_append_new(pools, pool_json(sr->pools[i]));
    return jout_print(json_pack("{s:o}", "pools", pools));
}

/* ---- text -------------------------------------------------------------------- */

static const char *sz(uint64_t v, char *buf) { return units_format_size(v, buf, 16); }

static void row(table *t, const char *name, const Gradd__Stat *s, bool bytes)
{
    char a[16], b[16], c[16], d[16];
    table_cell(t, "%s", name);
    if (!s) {
        for (int i = 0; i < 4; i++)
            table_cell(t, "-");
        return;
    }
    if (bytes) {
        table_cell(t, "%s", sz((uint64_t)(s->current > 0 ? s->current : 0), a));
        table_cell(t, "%s", sz((uint64_t)(s->peak > 0 ? s->peak : 0), b));
        table_cell(t, "%s", sz(s->allocated, c));
        table_cell(t, "%s", sz(s->freed, d));
    } else {
        table_cell(t, "%lld", (long long)s->current);
        table_cell(t, "%lld", (long long)s->peak);
        table_cell(t, "%llu", (unsigned long long)s->allocated);
        table_cell(t, "%llu", (unsigned long long)s->freed);
    }
}

static void rows(table *t, const char *name, const Gradd__PoolStat *p, bool bytes)
{
    row(t, name, p ? p->all : NULL, bytes);
    row(t, "  from small pool", p ? p->small : NULL, bytes);
    row(t, "  from large pool", p ? p->large : NULL, bytes);
}

static void print_pool(const Gradd__PoolStats *p)
{
    char a[16], b[16], c[16], d[16], e[16];
    table_puts(stdout, p->device);
    /* A program job's own pool, in its process. */
    if (p->job)
        printf("  program job %u (pid %llu): its own pool; reclaims for it %llu\n", p->job,
               (unsigned long long)p->pid, (unsigned long long)p->reclaims);
    printf("  cap %s of %s  device free %s  expandable segments %s  max split %s\n", sz(p->cap, a), sz(p->device_total, b), sz(p->device_free, c), p->expandable_segments ? "on" : "off",
           p->max_split_size >= (uint64_t)1 << 60 ? "unlimited" : sz(p->max_split_size, d));
    static const char *const head[] = {"", ">CURRENT", ">PEAK", ">TOTAL ALLOC", ">TOTAL FREED"};
    table t;
    table_init(&t, 5, head);
    rows(&t, "Allocated memory", p->allocated_bytes, true);
    rows(&t, "Reserved memory", p->reserved_bytes, true);
    rows(&t, "Active memory", p->active_bytes, true);
    rows(&t, "Inactive split memory", p->inactive_split_bytes, true);
    rows(&t, "Requested memory", p->requested_bytes, true);
    rows(&t, "Allocations", p->allocations, false);
    rows(&t, "Segments", p->segments, false);
    rows(&t, "Active blocks", p->active_blocks, false);
    rows(&t, "Inactive split blocks", p->inactive_split_blocks, false);
    table_print(&t, stdout);
    table_free(&t);

    uint64_t requests = p->allocations && p->allocations->all ? p->allocations->all->allocated : 0;
    printf("\nDevice allocs %llu, frees %llu; cache hits %llu (%.1f%% of %llu requests)\n",
           (unsigned long long)p->device_allocs, (unsigned long long)p->device_frees,
           (unsigned long long)p->cache_hits, requests ? 100.0 * (double)p->cache_hits / (double)requests : 0.0,
           (unsigned long long)requests);
    printf("Alloc retries %llu, OOMs %llu; trims %llu released %s in %.3f ms (idle: %llu, %s)\n",
           (unsigned long long)p->alloc_retries, (unsigned long long)p->ooms, (unsigned long long)p->trims,
           sz(p->trimmed_bytes, a), (double)p->trim_ns / 1e6, (unsigned long long)p->idle_trims,
           sz(p->idle_trimmed_bytes, b));
    printf("Largest free block %s; fragmentation %.1f%%; timeline %llu events (%llu dropped)\n",
           sz(p->largest_free_block, a), p->fragmentation * 100, (unsigned long long)p->timeline_events,
           (unsigned long long)p->timeline_dropped);

    /* Only tags that hold or held memory: seven zero columns say nothing. */
    int shown = 0;
    printf("\nBy tag:");
    for (size_t i = 0; i < p->n_tags; i++) {
        if (!p->tags[i]->allocated && !p->tags[i]->peak)
            continue;
        printf("%s %s %s (peak %s)", shown++ ? "," : "", p->tags[i]->tag, sz(p->tags[i]->allocated, a),
               sz(p->tags[i]->peak, b));
    }
    printf("%s\n", shown ? "" : " nothing allocated yet");
    if (p->n_jobs) {
        static const char *const jhead[] = {"JOB", ">ALLOCATED", ">PEAK", ">NEED", ">LIMIT", "BY TAG"};
        table j;
        table_init(&j, 6, jhead);
        for (size_t i = 0; i < p->n_jobs; i++) {
            const Gradd__JobUsage *u = p->jobs[i];
            char tags[512] = "";
            size_t n = 0;
            for (size_t k = 0; k < u->n_tags && n < sizeof tags - 40; k++)
                n += (size_t)snprintf(tags + n, sizeof tags - n, "%s%s %s", k ? ", " : "", u->tags[k]->tag,
                                      sz(u->tags[k]->allocated, a));
            table_cell(&j, "%u", u->job);
            table_cell(&j, "%s", sz(u->allocated, b));
            table_cell(&j, "%s", sz(u->peak, c));
            table_cell(&j, "%s", u->need ? sz(u->need, e) : "-");
            table_cell(&j, "%s", u->limit ? sz(u->limit, d) : "-");
            table_cell(&j, "%s", tags);
        }
        printf("\n");
        table_print(&j, stdout);
        table_free(&j);
    }
}

static int run(ctl *c, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"device", required_argument, NULL, 'd'},
        {"reset-peaks", no_argument, NULL, 'r'},
        {NULL, 0, NULL, 0},
    };
    Gradd__StatsRequest sr = GRADD__STATS_REQUEST__INIT;
    int ch;
    while ((ch = ctl_getopt(c, argc, argv, "d:", longopts)) != -1) {
        switch (ch) {
        case 'd': sr.device = optarg; break;
        case 'r': sr.reset_peaks = true; break;
        default: return CTL_ERR_USAGE; /* ctl_getopt said why */
        }
    }
    if (optind < argc)
        return ctl_usage(c, "unexpected argument '%s'", argv[optind]);
    Gradd__Response *resp;
    int rc = ctl_call(c, "stats", GRADD__REQUEST__BODY_STATS, &sr, &resp);
    if (rc != CTL_OK)
        return rc;
    if (c->json) {
        rc = print_json(resp->stats);
    } else {
        for (size_t i = 0; i < resp->stats->n_pools; i++) {
            if (i)
                printf("\n");
            print_pool(resp->stats->pools[i]);
        }
    }
    ctl_free(resp);
    return rc;
}

const ctl_cmd cmd_stats = {
    .name = "stats",
    .args = "[-d DEV] [--reset-peaks]",
    .summary = "show memory pool statistics (allocated, reserved, cache, trims, by tag and job)",
    .run = run,
};
