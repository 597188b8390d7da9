/* runjob.c — `gradd run`: one job in the foreground, through its runner. */
#include "runjob.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobcfg.h"
#include "base/log.h"
#include "dist/dist.h"
#include "models/model.h"
#include "outdir.h"
#include "runner.h"
#include "units.h"

typedef struct {
    volatile sig_atomic_t *stop;
    bool quiet;
    uint64_t log_every;
    const char *unit;
    char levers[sizeof ((train_progress *)0)->levers]; /* as last printed */
    bool said_resume;
} runjob_view;

/* Set by the signal handler, read between micro-batches and between layers. */
static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static bool should_stop(void *user)
{
    runjob_view *v = user;
    return *v->stop != 0;
}

static void on_step(void *user, const train_progress *p)
{
    runjob_view *v = user;
    if (v->quiet)
        return;
    /* The memory levers when they change (recompute turned on, LoRA
     * chosen by method = auto), whatever the step: the status a daemon's
     * job shows. */
    if (strcmp(p->levers, v->levers) != 0) {
        snprintf(v->levers, sizeof v->levers, "%s", p->levers);
        fprintf(stderr, "levers: %s\n", p->levers[0] ? p->levers : "none");
    }
    if (p->resumed && !v->said_resume) {
        fprintf(stderr, "resuming from its checkpoint at step %llu\n", (unsigned long long)p->step);
        v->said_resume = true;
    }
    if (!p->trained || (p->step % v->log_every != 0 && p->step != p->steps && p->step != 1))
        return;
    char a[16], r[16], val[48] = "";
    if (!isnan(p->val_loss))
        snprintf(val, sizeof val, "  val %.4f", p->val_loss);
    if (!isnan(p->val_accuracy))
        snprintf(val + strlen(val), sizeof val - strlen(val), " acc %.2f%%", p->val_accuracy * 100);
    fprintf(stderr, "step %6llu/%llu  loss %.4f%s  lr %.2e  norm %.3f  %.0f %s/s  micro %u×%u  mem %s/%s%s\n",
            (unsigned long long)p->step, (unsigned long long)p->steps, p->loss, val, p->lr, p->grad_norm,
            p->units_per_s, v->unit, p->micro, p->accum, units_format_size(p->allocated, a, sizeof a),
            units_format_size(p->reserved, r, sizeof r), p->recompute ? "  recompute" : "");
}

/* A runner's note, as a warning on stderr. */
static void note(void *user, const char *fmt, va_list ap)
{
    (void)user;
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    log_warn("%s", msg);
}

/* The job's peak on its device, in all and by tag, as gradctl status shows a
 * queued job's: what `gradd run` alone has to say how much a job needs. */
static void print_peak(pool *p, uint32_t job)
{
    uint64_t peak, tag[POOL_TAG_COUNT];
    pool_job_peak(p, job, &peak, tag);
    if (!peak)
        return;
    char buf[16];
    printf("peak memory %s:", units_format_size(peak, buf, sizeof buf));
    const char *sep = " ";
    for (int t = 0; t < POOL_TAG_COUNT; t++) {
        if (!tag[t])
            continue;
        printf("%s%s %s", sep, pool_tag_name((pool_tag)t), units_format_size(tag[t], buf, sizeof buf));
        sep = ", ";
    }
    printf("\n");
}

/* auto: a CUDA device, else cpu0; cpu/cpuN; cuda:N.  auto's CUDA device
 * is the first, or for one of several ranks (d) the one its place among
 * this machine's ranks picks: one GPU each, as mpirun started them. */
static int pick_device(const gradd_ctx *ctx, const char *want, const dist *d, char *err, size_t err_len)
{
    char id[32];
    if (strcmp(want, "auto") == 0) {
        int ncuda = 0;
        for (int k = 0; k < ctx->ndev; k++)
            ncuda += ctx->devs[k]->kind == DEV_KIND_CUDA;
        snprintf(id, sizeof id, "cuda%d", dist_local_device(d, ncuda));
        int i = ncuda ? ctx_find_device(ctx, id) : -1;
        if (i >= 0)
            return i;
        snprintf(id, sizeof id, "cpu0");
    } else if (strcmp(want, "cpu") == 0) {
        snprintf(id, sizeof id, "cpu0");
    } else if (strncmp(want, "cuda:", 5) == 0) {
        snprintf(id, sizeof id, "cuda%s", want + 5);
    } else {
        snprintf(id, sizeof id, "%s", want);
    }
    int i = ctx_find_device(ctx, id);
    if (i < 0)
        snprintf(err, err_len, "no device %s here%s%s", id, ctx->cuda_note[0] ? "; " : "", ctx->cuda_note);
    return i;
}

/* A rank other than 0's own part, in one line: rank 0 reports the job. */
static void print_rank_part(const dist *d, pool *p, uint32_t job, const train_result *res)
{
    uint64_t peak, tag[POOL_TAG_COUNT];
    pool_job_peak(p, job, &peak, tag);
    char pk[16];
    fprintf(stderr, "gradd: %s: done: %llu steps, micro-batch %u at the end, %llu OOM recoveries, peak memory %s\n",
            dist_name(d), (unsigned long long)res->steps_done, res->micro, (unsigned long long)res->oom_recoveries,
            units_format_size(peak, pk, sizeof pk));
}

/* Rank k (k > 0) of a job over several devices of this machine, as a thread. */
typedef struct {
    const runner *run;
    runner_env env;
    const job_config *j;
    train_result res;
    train_outcome o;
    pthread_t t;
    bool started;
} rank_thread;

static void *rank_main(void *arg)
{
    rank_thread *rt = arg;
    rt->o = rt->run->run(&rt->env, rt->j, &rt->res);
    return NULL;
}

/* [job] devices: each one's index here, in order; -1 with err. */
static int find_devices(const gradd_ctx *ctx, const job_config *j, int *idx, char *err, size_t err_len)
{
    for (int k = 0; k < j->ndevices; k++) {
        if ((idx[k] = ctx_find_device(ctx, j->device_ids[k])) < 0) {
            snprintf(err, err_len, "no device %s here%s", j->device_ids[k],
                     strncmp(j->device_ids[k], "cpu", 3) == 0 ? " (gradd.conf's [cpu] devices says how many cpu "
                                                                "devices to simulate)"
                                                              : "");
            return -1;
        }
    }
    return 0;
}

/* Open the devices and train; the signal handlers are in place.  d: this
 * process is one rank of several (rank 0 reports; any rank's failure ends
 * them all), else NULL. */
static int run_on_devices(gradd_ctx *ctx, const char *path, const job_config *jp, bool quiet, dist *dw)
{
    static job_config j;
    j = *jp;
    char err[1024];
    bool report = dist_rank(dw) == 0;
    quiet = quiet || !report;
    if (ctx_open(ctx, err, sizeof err) != 0) {
        log_error("%s", err);
        return 1;
    }
    int rc = 2;
    static rank_thread ranks[JOBCFG_MAX_DEVICES];
    dist_group *group = NULL;
    int idx[JOBCFG_MAX_DEVICES], nranks = j.ndevices ? j.ndevices : 1;
    if (j.ndevices && dw) {
        fprintf(stderr, "gradd: %s: [job] devices: under mpirun or srun each rank is one process on one device: "
                "give each rank [job] device\n", path);
        goto out;
    }
    if (j.ndevices && find_devices(ctx, &j, idx, err, sizeof err) != 0) {
        fprintf(stderr, "gradd: %s: [job] devices: %s\n", path, err);
        goto out;
    }
    int di = j.ndevices ? idx[0] : pick_device(ctx, j.device, dw, err, sizeof err);
    if (di < 0) {
        fprintf(stderr, "gradd: %s: [job] device: %s\n", path, err);
        goto out;
    }
    dev *d = ctx->devs[di];
    const runner *run = runner_for(&j);
    if (!run) {
        fprintf(stderr, "gradd: %s: no runner takes this job\n", path);
        goto out;
    }
    /* Stopped while the devices were probed: nothing to save yet. */
    if (stop_requested) {
        printf("stopped before training began; nothing was written\n");
        rc = 130;
        goto out;
    }
    runjob_view v = {.stop = &stop_requested, .quiet = quiet, .log_every = j.log_every, .unit = model_unit(&j)};
    /* Tests only (--test-hooks): GRADD_TEST_GROUP=1 runs a job on one
     * device as a world of one rank, every collective on (over NCCL on a
     * CUDA device): what a machine with one GPU can check of the ranks. */
    const char *tg = ctx->test_hooks && !j.ndevices && !dw ? getenv("GRADD_TEST_GROUP") : NULL;
    int ngroup = j.ndevices ? j.ndevices : tg && !strcmp(tg, "1") ? 1 : 0;
    if (ngroup && !(group = dist_group_new(ngroup, (double)j.rank_timeout_ms / 1000.0, err, sizeof err))) {
        fprintf(stderr, "gradd: %s: [job] devices: %s\n", path, err);
        goto out;
    }
    if (group)
        dw = dist_group_rank(group, 0);
    if (report)
        log_info("training %s (%s) on %s%s%s: %llu steps of %u, output %s", j.name, j.model,
                 j.ndevices ? j.devices : d->id, dw && !group ? " of each of the ranks" : "", group ? " (a rank each)" : "",
                 (unsigned long long)j.steps, j.batch, j.out_dir);
    runner_env env = {
        .ctx = ctx,
        .dev = di,
        .job_id = 1,
        .hooks = {.on_step = on_step, .should_stop = should_stop, .poll = should_stop, .user = &v, .dist = dw},
        .note = note,
        /* threads = 0 on a machine several ranks share: their share. */
        .cpu_share = dw && ctx_cores() / dist_local_size(dw) > 0 ? ctx_cores() / dist_local_size(dw) : 0,
        .cpu_slots = dist_local_size(dw),
    };
    /* Ranks 1.. on the other devices, as threads that report nothing but
     * their part at the end; rank 0 here. */
    for (int k = 1; k < nranks; k++) {
        rank_thread *rt = &ranks[k];
        memset(rt, 0, sizeof *rt);
        rt->run = run;
        rt->j = &j;
        rt->env = env;
        rt->env.dev = idx[k];
        rt->env.hooks = (train_hooks){.dist = dist_group_rank(group, k)};
        if (pthread_create(&rt->t, NULL, rank_main, rt) != 0) {
            dist_fail(dist_group_rank(group, k), "cannot start its thread");
            break;
        }
        rt->started = true;
    }
    /* Tests only (--test-hooks): GRADD_TEST_OOM=RANK:STEP makes that
     * rank's step run out of memory once. */
    const char *t = ctx->test_hooks ? getenv("GRADD_TEST_OOM") : NULL;
    unsigned tr = 0;
    unsigned long long ts = 0;
    if (t && sscanf(t, "%u:%llu", &tr, &ts) == 2 && tr == (unsigned)dist_rank(dw))
        env.hooks.test_oom_step = ts;
    static train_result res;
    train_outcome o = run->run(&env, &j, &res);
    for (int k = 1; k < nranks; k++) {
        if (!ranks[k].started) {
            o = TRAIN_FAILED;
            continue;
        }
        pthread_join(ranks[k].t, NULL);
        /* The first rank's own failure says why; the others' only that a
         * rank gave up. */
        if (ranks[k].o == TRAIN_FAILED && o != TRAIN_FAILED) {
            o = TRAIN_FAILED;
            res = ranks[k].res;
        }
    }
    for (int k = 1; k < nranks; k++)
        if (ranks[k].started && ranks[k].o == TRAIN_DONE && o == TRAIN_DONE)
            print_rank_part(dist_group_rank(group, k), ctx->pools[idx[k]], env.job_id, &ranks[k].res);
    fflush(stderr);
    /* The other ranks wait for this one at their next collective: a
     * failure here ends them all now rather than at their timeout. */
    if (dw && !group && o == TRAIN_FAILED) {
        if (strstr(res.message, dist_name(dw)))
            fprintf(stderr, "gradd: job %s failed: %s\n", j.name, res.message);
        else
            fprintf(stderr, "gradd: job %s failed on %s: %s\n", j.name, dist_name(dw), res.message);
        fflush(stderr);
        dist_abort(dw, 1);
    }
    /* Rank 0 reports the job; the others their own part, in one line. */
    if (!report) {
        if (o == TRAIN_DONE)
            print_rank_part(dw, ctx->pools[di], env.job_id, &res);
        rc = o == TRAIN_DONE ? 0 : o == TRAIN_STOPPED ? 130 : 1;
        goto out;
    }
    switch (o) {
    case TRAIN_DONE:
        printf("done: %llu steps, final loss %.4f", (unsigned long long)res.steps_done, res.final_loss);
        if (!isnan(res.val_loss))
            printf(", val loss %.4f", res.val_loss);
        if (!isnan(res.val_accuracy))
            printf(", val accuracy %.2f%%", res.val_accuracy * 100);
        printf("\n");
        print_peak(ctx->pools[di], env.job_id);
        /* A LoRA job's own outputs are its adapters; the model only merged. */
        printf("outputs in %s (%s%s%smetrics.jsonl, tensorboard/, resume.safetensors)\n", j.out_dir,
               res.lora ? "adapter_model.safetensors, adapter_config.json, " : "",
               !res.lora || j.lora_merged ? "model.safetensors, " : "",
               (!res.lora || j.lora_merged) && model_kind_of(&j) && model_kind_of(&j)->hf_config ? "config.json, "
                                                                                                 : "");
        rc = 0;
        break;
    case TRAIN_STOPPED:
        printf("stopped at step %llu; run the same command again to resume from %s/resume.safetensors\n",
               (unsigned long long)res.steps_done, j.out_dir);
        rc = 130;
        break;
    case TRAIN_FAILED:
    default:
        fprintf(stderr, "gradd: job %s failed: %s\n", j.name, res.message);
        rc = 1;
        break;
    }
out:
    fflush(stdout);
    dist_group_free(group);
    ctx_close(ctx);
    return rc;
}

int runjob_main(gradd_ctx *ctx, const char *path, bool quiet)
{
    /* The job file first: a bad one is refused before the devices are
     * probed (CUDA takes a while to say there is none). */
    static job_config j;
    char err[1024];
    /* And what its output directory holds, as a submit checks it: a
     * finished run is refused rather than "done" with nothing trained. */
    if (jobcfg_load(path, &j, err, sizeof err) != 0 ||
        (j.type == JOBCFG_ENGINE && model_check_job(&j, err, sizeof err) != 0) ||
        outdir_check_resume(&j, err, sizeof err) != 0) {
        fprintf(stderr, "gradd: %s\n", err);
        return 2;
    }
    /* The program would run as whoever runs gradd, which the command
     * itself does as well, without gradd in between. */
    if (j.type == JOBCFG_PROGRAM) {
        fprintf(stderr, "gradd: %s: [job] type = program: gradd run trains engine jobs only; submit it to a "
                "daemon (gradctl submit), or run its command yourself\n", path);
        return 2;
    }
    /* From here to the printed result: SIGINT, SIGTERM and SIGHUP (a
     * closed terminal) stop the run with a checkpoint, as ^C does, instead
     * of losing the steps since the last one; one that comes while the
     * devices are probed stops it before it begins.  SIGHUP not when it is
     * ignored: `nohup gradd run` asks to outlive the terminal. */
    stop_requested = 0;
    struct sigaction sa = {0}, old_int, old_term, old_hup;
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGHUP, NULL, &old_hup);
    if (old_hup.sa_handler != SIG_IGN)
        sigaction(SIGHUP, &sa, NULL);
    /* Started by mpirun or srun as one of several ranks: join them. */
    dist *dw = NULL;
    int rc;
    if (dist_world_from_env() > 1 && dist_open(&dw, (double)j.rank_timeout_ms / 1000.0, err, sizeof err) != 0) {
        fprintf(stderr, "gradd: %s: %s\n", path, err);
        rc = 2;
    } else {
        rc = run_on_devices(ctx, path, &j, quiet, dw);
    }
    dist_close(dw);
    /* Only now: a ^C that comes after the last step must not kill the run
     * before it has said that it finished and where its outputs are. */
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGHUP, &old_hup, NULL);
    return rc;
}
