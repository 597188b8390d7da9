/* metrics.c — the metrics request: Prometheus text exposition (0.0.4) of
 * the daemon, its devices and pools, and its jobs, for a scraper that
 * `gradctl metrics` feeds. */
#include "rpc_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobs/queue.h"

/* The program jobs' own pools, labelled by device and job. */
static void program_pools(gradd_ctx *ctx, FILE *f)
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
    pool_peer_view *views[CTX_MAX_DEVICES] = {0};
    size_t nv[CTX_MAX_DEVICES] = {0}, any = 0;
    for (int i = 0; i < ctx->ndev; i++) {
        size_t want = pool_peers_count(ctx->peers[i]);
        if (want && (views[i] = malloc(want * sizeof *views[i])))
            any += nv[i] = pool_peers_read(ctx->peers[i], views[i], want);
    }
    for (size_t m = 0; any && m < NPM; m++) {
        fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", pm[m].name, pm[m].help, pm[m].name, pm[m].type);
        for (int i = 0; i < ctx->ndev; i++)
            for (size_t k = 0; k < nv[i]; k++) {
                const pool_peer_view *v = &views[i][k];
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
    for (int i = 0; i < ctx->ndev; i++)
        free(views[i]);
}

void rpc_metrics(const rpc_call *c, const Gradd__Request *req)
{
    (void)req;
    gradd_ctx *ctx = c->ctx;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    pool_stats *ps = malloc(sizeof *ps);
    if (!f || !ps) {
        if (f)
            fclose(f);
        free(text);
        free(ps);
        rpc_error(c, GRADD__ERROR__CODE__INTERNAL, "out of memory");
        return;
    }
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
        {"gradd_pool_ooms_total", "counter", "Allocations that failed."},
        {"gradd_pool_trims_total", "counter", "Cache trims."},
        {"gradd_pool_trimmed_bytes_total", "counter", "Bytes returned to the device by trims."},
        {"gradd_pool_idle_trims_total", "counter", "Trims of an idle device (idle_trim)."},
        {"gradd_pool_idle_trimmed_bytes_total", "counter", "Bytes returned by idle trims."},
    };
    enum { NDM = sizeof dm / sizeof dm[0] };
    /* One reading per device, so that the families agree with each other. */
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
        pool_stats_read(ctx->pools[i], ps);
        double v[NDM] = {(double)tot, (double)fr, (double)ps->allocated_bytes[POOL_ALL].current,
                         (double)ps->reserved_bytes[POOL_ALL].current, (double)ps->cap,
                         (double)ps->largest_free_block, ps->fragmentation, (double)ps->device_allocs,
                         (double)ps->cache_hits, (double)ps->ooms, (double)ps->trims, (double)ps->trimmed_bytes,
                         (double)ps->idle_trims, (double)ps->idle_trimmed_bytes};
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
    for (int i = 0; i < ctx->ndev; i++) {
        pool_stats_read(ctx->pools[i], ps);
        for (int t = 0; t < POOL_TAG_COUNT; t++)
            fprintf(f, "gradd_pool_tag_allocated_bytes{device=\"%s\",tag=\"%s\"} %lld\n", ctx->devs[i]->id,
                    pool_tag_name((pool_tag)t), (long long)ps->tag_current[t]);
    }
    program_pools(ctx, f);
    if (ctx->q) {
        pthread_mutex_lock(&ctx->q->lock);
        size_t counts[JOB_STATE_COUNT] = {0};
        for (size_t i = 0; i < ctx->q->n; i++)
            counts[ctx->q->jobs[i]->state]++;
        fprintf(f, "# HELP gradd_jobs Jobs by state.\n# TYPE gradd_jobs gauge\n");
        for (int s = 0; s < JOB_STATE_COUNT; s++)
            fprintf(f, "gradd_jobs{state=\"%s\"} %zu\n", job_state_name((job_state)s), counts[s]);
        static const char *const jm[][2] = {
            {"gradd_job_step", "Optimizer steps done."},
            {"gradd_job_steps", "Optimizer steps in the job."},
            {"gradd_job_loss", "Training loss of the last step."},
            {"gradd_job_units_per_second", "Tokens (gpt) or samples (mlp) per second."},
            {"gradd_job_micro_batch", "Current micro-batch size."},
            {"gradd_job_data_bytes", "Host memory the job's training and validation data hold."},
        };
        for (size_t m = 0; m < sizeof jm / sizeof jm[0]; m++) {
            fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", jm[m][0], jm[m][1], jm[m][0]);
            for (size_t i = 0; i < ctx->q->n; i++) {
                job *j = ctx->q->jobs[i];
                if (j->state != JOB_RUNNING || !j->have_progress)
                    continue;
                double v[] = {(double)j->prog.step, (double)j->prog.steps, j->prog.loss, j->prog.units_per_s,
                              (double)j->prog.micro, (double)j->prog.data_bytes};
                /* Names and users are user-controlled: escape for the format. */
                char name[160];
                size_t o = 0;
                for (const char *c = j->name; *c && o < sizeof name - 3; c++) {
                    if (*c == '"' || *c == '\\')
                        name[o++] = '\\';
                    name[o++] = *c == '\n' ? ' ' : *c;
                }
                name[o] = '\0';
                /* The exposition format spells these out; a skipped fp16
                 * step's loss is not 0. */
                char val[32];
                if (isnan(v[m]))
                    snprintf(val, sizeof val, "NaN");
                else if (isinf(v[m]))
                    snprintf(val, sizeof val, "%cInf", v[m] > 0 ? '+' : '-');
                else
                    snprintf(val, sizeof val, "%.17g", v[m]);
                fprintf(f, "%s{job=\"%u\",name=\"%s\",user=\"%s\",device=\"%s\"} %s\n", jm[m][0], j->id,
                        name, j->user, j->device, val);
            }
        }
        pthread_mutex_unlock(&ctx->q->lock);
    }
    fclose(f);
    free(ps);
    Gradd__MetricsResponse mr;
    gradd__metrics_response__init(&mr);
    mr.text = text;
    RPC_SEND(c, METRICS, metrics, &mr);
    free(text);
}
