/* runner_engine.c — a job trained by gradd's own engine (engine/train.h)
 * with the kernels of its device. */
#include "runner.h"

#include <stdio.h>
#include <stdlib.h>

#include "kernels.h"
#include "models/model.h"

static bool engine_takes(const job_config *cfg)
{
    return cfg->type == JOBCFG_ENGINE;
}

static const kern_ops *device_kernels(const gradd_ctx *ctx, const dev *d)
{
    if (d->kind == DEV_KIND_CPU)
        return kern_cpu_ops();
    return dev_cuda_kern_ops(ctx->cfg.cuda_module_dir[0] ? ctx->cfg.cuda_module_dir : NULL);
}

static train_outcome engine_run(const runner_env *env, const job_config *cfg, train_result *res)
{
    gradd_ctx *ctx = env->ctx;
    dev *d = ctx->devs[env->dev];
    const kern_ops *k = device_kernels(ctx, d);
    if (!k) {
        snprintf(res->message, sizeof res->message, "no kernels for %s", d->id);
        res->outcome = TRAIN_FAILED;
        return TRAIN_FAILED;
    }
    /* What a job it ran after was to make is read and checked at the
     * start, as a submit checks it: the model's keys from [model] from. */
    job_config *filled = NULL;
    if (cfg->inputs_missing) {
        if (!(filled = malloc(sizeof *filled))) {
            snprintf(res->message, sizeof res->message, "out of memory");
            res->outcome = TRAIN_FAILED;
            return TRAIN_FAILED;
        }
        *filled = *cfg;
        filled->inputs_later = filled->inputs_missing = false;
        char err[sizeof res->message];
        if (model_check_job(filled, err, sizeof err) != 0) {
            snprintf(res->message, sizeof res->message, "%s", err);
            free(filled);
            res->outcome = TRAIN_FAILED;
            return TRAIN_FAILED;
        }
        cfg = filled;
    }
    job_config *shared = NULL;
    if (d->kind == DEV_KIND_CPU && cfg->threads == 0 && env->cpu_share && (shared = malloc(sizeof *shared))) {
        *shared = *cfg;
        shared->threads = (uint32_t)env->cpu_share;
        cfg = shared;
        runner_note(env, "threads = 0: %d, this job's share of the cores among %d CPU job slots", env->cpu_share,
                    env->cpu_slots);
    }
    /* More OpenMP threads than cores take turns at every barrier: a
     * tenfold slowdown or worse, which the person should hear about. */
    int cores = ctx_cores();
    if (d->kind == DEV_KIND_CPU && cfg->threads > (uint32_t)cores)
        runner_note(env, "[train] threads = %u is more than the %d cores here: the threads will take turns, "
                    "and the job runs far slower than with %d", cfg->threads, cores, cores);
    train_hooks hooks = env->hooks;
    hooks.data_limit = ctx->cfg.max_job_data == UINT64_MAX ? 0 : ctx->cfg.max_job_data;
    hooks.data_limit_key = "[daemon] max_job_data";
    train_outcome o = train_run(cfg, ctx->pools[env->dev], k, env->job_id, &hooks, res);
    free(shared);
    free(filled);
    return o;
}

const runner runner_engine = {"engine", engine_takes, engine_run};
