/* metrics.c — the metrics request: Prometheus text exposition (0.0.4) of
 * the daemon, its devices and pools, and its jobs, for a scraper that
 * `gradctl metrics` feeds. */
#include "rpc_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradd-config.h"
#include "jobs/queue.h"
#include "models/model.h"

/* A label value as the text format spells it: backslash, double quote and
 * line feed escaped.  Job names and users are user-controlled.  Cut short
 * at a whole character of the escaped text, never inside an escape. */
static const char *label_value(const char *s, char *out, size_t len)
{
    size_t o = 0;
    for (; *s && o + 3 <= len; s++) {
        if (*s == '"' || *s == '\\' || *s == '\n')
            out[o++] = '\\';
        out[o++] = *s == '\n' ? 'n' : *s;
    }
    out[o] = '\0';
    return out;
}

/* The program jobs' pages, read once per scrape so that their families
 * and the per-job figures agree. */
typedef struct {
    pool_peer_view *views[CTX_MAX_DEVICES];
    size_t nv[CTX_MAX_DEVICES], any;
} peer_read;

static void peers_read(gradd_ctx *ctx, peer_read *pr)
{
    memset(pr, 0, sizeof *pr);
    for (int i = 0; i < ctx->ndev; i++) {
        pr->views[i] = pool_peers_read(ctx->peers[i], &pr->nv[i]);
        pr->any += pr->nv[i];
    }
}

static void peers_free(gradd_ctx *ctx, peer_read *pr)
{
    for (int i = 0; i < ctx->ndev; i++)
        free(pr->views[i]);
}

/* The program jobs' own pools, labelled by device and job. */
static void program_pools(gradd_ctx *ctx, FILE *f, const peer_read *pr)
{
    static const struct {
        const char *name, *type, *help;
    } pm[] = {
        {"gradd_program_pool_allocated_bytes", "gauge", "Bytes in live blocks of a program job's own pool."},
        {"gradd_program_pool_reserved_bytes", "gauge", "Bytes a program job's pool holds from the device."},
        {"gradd_program_pool_largest_free_block_bytes", "gauge", "Largest cached free block of a program's pool."},
        {"gradd_program_pool_alloc_retries_total", "counter", "A program's allocations retried after a trim or reclaim."},
        {"gradd_program_pool_ooms_total", "counter", "A program's allocations that failed."},
        {"gradd_program_pool_trims_total", "counter", "Trims of a program's pool."},
        {"gradd_program_pool_trimmed_bytes_total", "counter", "Bytes a program's pool gave back."},
        {"gradd_program_pool_reclaims_total", "counter", "Reclaims the daemon made for a program."},
    };
    enum { NPM = sizeof pm / sizeof pm[0] };
    for (size_t m = 0; pr->any && m < NPM; m++) {
        fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", pm[m].name, pm[m].help, pm[m].name, pm[m].type);
        for (int i = 0; i < ctx->ndev; i++)
            for (size_t k = 0; k < pr->nv[i]; k++) {
                const pool_peer_view *v = &pr->views[i][k];
                const pool_stats *ps = &v->stats;
                if (!v->live)
                    continue;
                double x[NPM] = {(double)ps->allocated_bytes[POOL_ALL].current,
                                 (double)ps->reserved_bytes[POOL_ALL].current,
                                 (double)ps->largest_free_block, (double)ps->alloc_retries, (double)ps->ooms,
                                 (double)ps->trims, (double)ps->trimmed_bytes, (double)v->reclaims};
                fprintf(f, "%s{device=\"%s\",job=\"%u\"} %.17g\n", pm[m].name, ctx->devs[i]->id, v->job, x[m]);
            }
    }
}

/* ---- jobs ---- */

/* The exposition format spells these out; a skipped fp16 step's loss is
 * not 0. */
static void put_value(FILE *f, double v)
{
    if (isnan(v))
        fputs("NaN", f);
    else if (isinf(v))
        fprintf(f, "%cInf", v > 0 ? '+' : '-');
    else
        fprintf(f, "%.17g", v);
}

static void job_labels(FILE *f, const job *j)
{
    char name[2 * sizeof j->name], user[2 * sizeof j->user];
    fprintf(f, "job=\"%u\",name=\"%s\",user=\"%s\",device=\"%s\"", j->id, label_value(j->name, name, sizeof name),
            label_value(j->user, user, sizeof user), j->device);
}

/* A running job's bytes by tag, now and at their peak.  An engine job's
 * are its row in its device's pool; a program job's are its own pool's
 * (all of it is the job's).  False when the job holds no row yet. */
static bool job_tags(gradd_ctx *ctx, const job *j, const pool_stats *dps, const peer_read *pr,
                     const int64_t **cur, const int64_t **peak)
{
    for (int i = 0; i < ctx->ndev; i++) {
        if (strcmp(ctx->devs[i]->id, j->device) != 0)
            continue;
        for (size_t k = 0; k < dps[i].njobs && k < POOL_MAX_JOBS; k++)
            if (dps[i].jobs[k].job == j->id) {
                *cur = dps[i].jobs[k].tag_current;
                *peak = dps[i].jobs[k].tag_peak;
                return true;
            }
        for (size_t k = 0; k < pr->nv[i]; k++)
            if (pr->views[i][k].live && pr->views[i][k].job == j->id) {
                *cur = pr->views[i][k].stats.tag_current;
                *peak = pr->views[i][k].stats.tag_peak;
                return true;
            }
    }
    return false;
}

/* Queue lock held. */
static void jobs_families(gradd_ctx *ctx, FILE *f, const pool_stats *dps, const peer_read *pr)
{
    queue *q = ctx->q;
    size_t counts[JOB_STATE_COUNT] = {0};
    for (size_t i = 0; i < q->n; i++)
        counts[q->jobs[i]->state]++;
    fprintf(f, "# HELP gradd_jobs Jobs by state.\n# TYPE gradd_jobs gauge\n");
    for (int s = 0; s < JOB_STATE_COUNT; s++)
        fprintf(f, "gradd_jobs{state=\"%s\"} %zu\n", job_state_name((job_state)s), counts[s]);
    /* Throughput is one family per unit: a sum or a rate over a family
     * must not add tokens to samples.  unit: the model's (model_unit), or
     * NULL for every job. */
    static const struct {
        const char *name, *help, *unit;
    } jm[] = {
        {"gradd_job_step", "Optimizer steps done.", NULL},
        {"gradd_job_steps", "Optimizer steps in the job.", NULL},
        {"gradd_job_loss", "Training loss of the last step.", NULL},
        {"gradd_job_tokens_per_second", "Tokens per second over the last step (gpt).", "tok"},
        {"gradd_job_samples_per_second", "Samples per second over the last step (mlp).", "samples"},
        {"gradd_job_micro_batch", "Current micro-batch size.", NULL},
        {"gradd_job_data_bytes", "Host memory the job's training and validation data hold.", NULL},
        {"gradd_job_recompute", "1 while the job recomputes activations (gradctl status says why).", NULL},
        {"gradd_job_lora", "1 when the job trains LoRA adapters on a frozen model (method lora, or auto's choice).",
         NULL},
    };
    for (size_t m = 0; m < sizeof jm / sizeof jm[0]; m++) {
        fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", jm[m].name, jm[m].help, jm[m].name);
        for (size_t i = 0; i < q->n; i++) {
            const job *j = q->jobs[i];
            if (j->state != JOB_RUNNING || !j->have_progress)
                continue;
            if (jm[m].unit && strcmp(model_unit(&j->cfg), jm[m].unit) != 0)
                continue;
            double v[] = {(double)j->prog.step,     (double)j->prog.steps,     j->prog.loss,
                          j->prog.units_per_s,      j->prog.units_per_s,       (double)j->prog.micro,
                          (double)j->prog.data_bytes, j->prog.recompute ? 1.0 : 0.0, j->prog.lora ? 1.0 : 0.0};
            fprintf(f, "%s{", jm[m].name);
            job_labels(f, j);
            fputs("} ", f);
            put_value(f, v[m]);
            fputc('\n', f);
        }
    }
    static const char *const mm[][2] = {
        {"gradd_job_memory_bytes", "Bytes in a running job's live blocks, by tag."},
        {"gradd_job_memory_peak_bytes", "Most bytes a running job held at once since it started here, by tag."},
    };
    for (size_t m = 0; m < 2; m++) {
        fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", mm[m][0], mm[m][1], mm[m][0]);
        for (size_t i = 0; i < q->n; i++) {
            const job *j = q->jobs[i];
            const int64_t *cur, *peak;
            if (j->state != JOB_RUNNING || !job_tags(ctx, j, dps, pr, &cur, &peak))
                continue;
            for (int t = 0; t < POOL_TAG_COUNT; t++) {
                fprintf(f, "%s{", mm[m][0]);
                job_labels(f, j);
                fprintf(f, ",tag=\"%s\"} %lld\n", pool_tag_name((pool_tag)t), (long long)(m ? peak : cur)[t]);
            }
        }
    }
}

void rpc_metrics(const rpc_call *c, const Gradd__Request *req)
{
    (void)req;
    gradd_ctx *ctx = c->ctx;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    /* One reading per device, so that the families agree with each other. */
    pool_stats *ps = calloc(ctx->ndev > 0 ? (size_t)ctx->ndev : 1, sizeof *ps);
    if (!f || !ps) {
        if (f)
            fclose(f);
        free(text);
        free(ps);
        rpc_error(c, GRADD__ERROR__CODE__INTERNAL, "out of memory");
        return;
    }
    char ver[64];
    fprintf(f, "# HELP gradd_build_info The daemon's version, whether it was built with CUDA, and its protocol.\n"
               "# TYPE gradd_build_info gauge\n"
               "gradd_build_info{version=\"%s\",cuda=\"%s\",protocol=\"%u\"} 1\n",
            label_value(GRADD_VERSION, ver, sizeof ver), GRADD_HAVE_CUDA ? "yes" : "no", WIRE_PROTOCOL_VERSION);
    fprintf(f, "# HELP gradd_up Whether gradd is serving.\n# TYPE gradd_up gauge\ngradd_up 1\n");
    fprintf(f, "# HELP gradd_uptime_seconds Seconds since gradd started.\n# TYPE gradd_uptime_seconds gauge\n");
    fprintf(f, "gradd_uptime_seconds %.3f\n", (double)(ctx_now_ns() - ctx->start_ns) / 1e9);
    /* The type is spelled out: "_total" in a name is no guide, since
     * gradd_device_memory_total_bytes is a gauge. */
    static const struct {
        const char *name, *type, *help;
    } dm[] = {
        {"gradd_device_memory_total_bytes", "gauge", "Device memory as the device reports it."},
        {"gradd_device_memory_free_bytes", "gauge", "Free device memory, other processes included."},
        {"gradd_pool_allocated_bytes", "gauge", "Bytes in live blocks of the pool."},
        {"gradd_pool_reserved_bytes", "gauge", "Bytes the pool holds from the device."},
        {"gradd_pool_cap_bytes", "gauge", "The pool's cap (memory_fraction of the device)."},
        {"gradd_pool_largest_free_block_bytes", "gauge", "Largest cached free block."},
        {"gradd_pool_fragmentation_ratio", "gauge", "1 - largest free block / cached bytes."},
        {"gradd_pool_device_allocs_total", "counter", "Device allocations made by the pool."},
        {"gradd_pool_cache_hits_total", "counter", "Allocations served from the cache."},
        {"gradd_pool_alloc_retries_total", "counter", "Allocations retried after releasing the cache."},
        {"gradd_pool_ooms_total", "counter", "Allocations that failed."},
        {"gradd_pool_trims_total", "counter", "Cache trims."},
        {"gradd_pool_trimmed_bytes_total", "counter", "Bytes returned to the device by trims."},
        {"gradd_pool_idle_trims_total", "counter", "Trims of an idle device (idle_trim)."},
        {"gradd_pool_idle_trimmed_bytes_total", "counter", "Bytes returned by idle trims."},
    };
    enum { NDM = sizeof dm / sizeof dm[0] };
    double(*dv)[NDM] = calloc(ctx->ndev > 0 ? (size_t)ctx->ndev : 1, sizeof *dv);
    if (!dv) {
        fclose(f);
        free(text);
        free(ps);
        rpc_error(c, GRADD__ERROR__CODE__INTERNAL, "out of memory");
        return;
    }
    for (int i = 0; i < ctx->ndev; i++) {
        size_t fr = 0, tot = 0;
        dev_mem_info(ctx->devs[i], &fr, &tot);
        pool_stats_read(ctx->pools[i], &ps[i]);
        const pool_stats *s = &ps[i];
        double v[NDM] = {(double)tot, (double)fr, (double)s->allocated_bytes[POOL_ALL].current,
                         (double)s->reserved_bytes[POOL_ALL].current, (double)s->cap,
                         (double)s->largest_free_block, s->fragmentation, (double)s->device_allocs,
                         (double)s->cache_hits, (double)s->alloc_retries, (double)s->ooms, (double)s->trims,
                         (double)s->trimmed_bytes, (double)s->idle_trims, (double)s->idle_trimmed_bytes};
        memcpy(dv[i], v, sizeof v);
    }
    for (size_t m = 0; m < NDM; m++) {
        fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", dm[m].name, dm[m].help, dm[m].name, dm[m].type);
        for (int i = 0; i < ctx->ndev; i++)
            fprintf(f, "%s{device=\"%s\",kind=\"%s\"} %.17g\n", dm[m].name, ctx->devs[i]->id,
                    dev_kind_str(ctx->devs[i]->kind), dv[i][m]);
    }
    free(dv);
    fprintf(f, "# HELP gradd_pool_tag_allocated_bytes Live bytes by tag.\n# TYPE gradd_pool_tag_allocated_bytes gauge\n");
    for (int i = 0; i < ctx->ndev; i++)
        for (int t = 0; t < POOL_TAG_COUNT; t++)
            fprintf(f, "gradd_pool_tag_allocated_bytes{device=\"%s\",tag=\"%s\"} %lld\n", ctx->devs[i]->id,
                    pool_tag_name((pool_tag)t), (long long)ps[i].tag_current[t]);
    peer_read pr;
    peers_read(ctx, &pr);
    program_pools(ctx, f, &pr);
    if (ctx->q) {
        pthread_mutex_lock(&ctx->q->lock);
        jobs_families(ctx, f, ps, &pr);
        pthread_mutex_unlock(&ctx->q->lock);
    }
    peers_free(ctx, &pr);
    fclose(f);
    free(ps);
    Gradd__MetricsResponse mr;
    gradd__metrics_response__init(&mr);
    mr.text = text;
    RPC_SEND(c, METRICS, metrics, &mr);
    free(text);
}
