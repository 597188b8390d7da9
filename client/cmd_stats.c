/* cmd_stats.c — gradctl stats: the memory pool's statistics, as a summary
 * table a person reads at a glance or as JSON for scripts. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "ctl.h"
#include "table.h"
#include "units.h"

static int run(ctl *c, int argc, char **argv);

const ctl_cmd cmd_stats = {
    .name = "stats",
    .args = "[-d DEV] [--reset-peaks]",
    .summary = "show memory pool statistics (allocated, reserved, cache, trims, by tag and job)",
    .run = run,
};

/* ---- JSON ------------------------------------------------------------------ */

static void json_stat(json_writer *w, const char *key, const Gradd__Stat *s)
{
    json_key(w, key);
    json_begin_object(w);
    json_key(w, "current");
    json_int(w, s ? s->current : 0);
    json_key(w, "peak");
    json_int(w, s ? s->peak : 0);
    json_key(w, "allocated");
    json_uint(w, s ? s->allocated : 0);
    json_key(w, "freed");
    json_uint(w, s ? s->freed : 0);
    json_end_object(w);
}

static void json_pool_stat(json_writer *w, const char *key, const Gradd__PoolStat *p)
{
    json_key(w, key);
    json_begin_object(w);
    json_stat(w, "all", p ? p->all : NULL);
    json_stat(w, "small", p ? p->small : NULL);
    json_stat(w, "large", p ? p->large : NULL);
    json_end_object(w);
}

static void json_tags(json_writer *w, Gradd__TagUsage **tags, size_t n)
{
    json_begin_object(w);
    for (size_t i = 0; i < n; i++) {
        json_key(w, tags[i]->tag);
        json_begin_object(w);
        json_key(w, "current");
        json_uint(w, tags[i]->allocated);
        json_key(w, "peak");
        json_uint(w, tags[i]->peak);
        json_end_object(w);
    }
    json_end_object(w);
}

static void print_json(const Gradd__StatsResponse *sr)
{
    json_writer w;
    json_init(&w, stdout);
    json_begin_object(&w);
    json_key(&w, "pools");
    json_begin_array(&w);
    for (size_t i = 0; i < sr->n_pools; i++) {
        const Gradd__PoolStats *p = sr->pools[i];
        json_begin_object(&w);
        json_key(&w, "device");
        json_string(&w, p->device);
        json_key(&w, "cap");
        json_uint(&w, p->cap);
        json_key(&w, "device_total");
        json_uint(&w, p->device_total);
        json_key(&w, "device_free");
        json_uint(&w, p->device_free);
        json_key(&w, "expandable_segments");
        json_bool(&w, p->expandable_segments);
        json_key(&w, "max_split_size");
        json_uint(&w, p->max_split_size);
        json_pool_stat(&w, "allocated_bytes", p->allocated_bytes);
        json_pool_stat(&w, "reserved_bytes", p->reserved_bytes);
        json_pool_stat(&w, "active_bytes", p->active_bytes);
        json_pool_stat(&w, "inactive_split_bytes", p->inactive_split_bytes);
        json_pool_stat(&w, "requested_bytes", p->requested_bytes);
        json_pool_stat(&w, "allocations", p->allocations);
        json_pool_stat(&w, "segments", p->segments);
        json_pool_stat(&w, "active_blocks", p->active_blocks);
        json_pool_stat(&w, "inactive_split_blocks", p->inactive_split_blocks);
        const struct {
            const char *k;
            uint64_t v;
        } counters[] = {
            {"device_allocs", p->device_allocs}, {"device_frees", p->device_frees},
            {"cache_hits", p->cache_hits},       {"alloc_retries", p->alloc_retries},
            {"ooms", p->ooms},                   {"trims", p->trims},
            {"trimmed_bytes", p->trimmed_bytes}, {"trim_ns", p->trim_ns},
            {"largest_free_block", p->largest_free_block},
            {"timeline_events", p->timeline_events}, {"timeline_dropped", p->timeline_dropped},
        };
        for (size_t k = 0; k < sizeof counters / sizeof counters[0]; k++) {
            json_key(&w, counters[k].k);
            json_uint(&w, counters[k].v);
        }
        json_key(&w, "fragmentation");
        json_double(&w, p->fragmentation);
        json_key(&w, "tags");
        json_tags(&w, p->tags, p->n_tags);
        json_key(&w, "jobs");
        json_begin_array(&w);
        for (size_t j = 0; j < p->n_jobs; j++) {
            const Gradd__JobUsage *u = p->jobs[j];
            json_begin_object(&w);
            json_key(&w, "job");
            json_uint(&w, u->job);
            json_key(&w, "allocated");
            json_uint(&w, u->allocated);
            json_key(&w, "peak");
            json_uint(&w, u->peak);
            json_key(&w, "limit");
            json_uint(&w, u->limit);
            json_key(&w, "need");
            json_uint(&w, u->need);
            json_key(&w, "tags");
            json_tags(&w, u->tags, u->n_tags);
            json_end_object(&w);
        }
        json_end_array(&w);
        json_end_object(&w);
    }
    json_end_array(&w);
    json_end_object(&w);
    json_end(&w);
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
    printf("%s  cap %s of %s  device free %s  expandable segments %s  max split %s\n", p->device,
           sz(p->cap, a), sz(p->device_total, b), sz(p->device_free, c), p->expandable_segments ? "on" : "off",
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
    printf("Alloc retries %llu, OOMs %llu; trims %llu released %s in %.3f ms\n",
           (unsigned long long)p->alloc_retries, (unsigned long long)p->ooms, (unsigned long long)p->trims,
           sz(p->trimmed_bytes, a), (double)p->trim_ns / 1e6);
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
    while ((ch = getopt_long(argc, argv, "d:", longopts, NULL)) != -1) {
        switch (ch) {
        case 'd': sr.device = optarg; break;
        case 'r': sr.reset_peaks = true; break;
        default: return ctl_usage(&cmd_stats, "bad option");
        }
    }
    if (optind < argc)
        return ctl_usage(&cmd_stats, "unexpected argument '%s'", argv[optind]);
    Gradd__Response *resp;
    int rc = ctl_call(c, "stats", GRADD__REQUEST__BODY_STATS, &sr, &resp);
    if (rc != CTL_OK)
        return rc;
    if (c->json) {
        print_json(resp->stats);
    } else {
        for (size_t i = 0; i < resp->stats->n_pools; i++) {
            if (i)
                printf("\n");
            print_pool(resp->stats->pools[i]);
        }
    }
    ctl_free(resp);
    return CTL_OK;
}
