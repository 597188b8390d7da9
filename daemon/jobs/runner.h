/* runner.h — how a job of one kind runs on a device.
 *
 * The queue and the workers know jobs, not training: a worker picks the
 * runner that takes a job (runner_for) and calls it with what the daemon
 * gives every job — its device and pool, hooks for progress and stopping,
 * and a place for notes a person reads in the job's log.  `gradd run` does
 * the same in the foreground.  A new kind of job (a user's own program, a
 * job over several devices) is a new runner beside runner_engine.c and a
 * line in runner.c's table; the queue and the workers stay as they are.
 */
#ifndef GRADD_RUNNER_H
#define GRADD_RUNNER_H

#include <stdarg.h>
#include <stdint.h>

#include "base/ctx.h"
#include "engine/train.h"
#include "jobcfg.h"

typedef struct runner_env {
    gradd_ctx *ctx;
    int dev;            /* index into ctx->devs (and ctx->pools) */
    uint32_t job_id;    /* the pool's accounting id for the job's memory */
    /* The CPU threads this job gets when its file says threads = 0 and the
     * daemon runs several CPU jobs at once; 0: all cores (`gradd run`). */
    int cpu_share;
    int cpu_slots;      /* the CPU job slots that share the cores */
    train_hooks hooks;
    /* A note for the person who runs the job (the daemon's job log, or
     * stderr for `gradd run`); may be NULL. */
    void (*note)(void *user, const char *fmt, va_list ap);
    void *note_user;
} runner_env;

typedef struct runner {
    const char *name;
    /* Whether this runner runs the job. */
    bool (*takes)(const job_config *cfg);
    /* Run it to its end, a stop or a failure; res->message says why it
     * failed.  Runs with the owner's filesystem identity (access.h). */
    train_outcome (*run)(const runner_env *env, const job_config *cfg, train_result *res);
} runner;

/* The runner for this job; NULL when none takes it. */
const runner *runner_for(const job_config *cfg);

/* The engine's runner: gradd's own training loop (engine/train.h). */
extern const runner runner_engine;

/* env->note with printf arguments; nothing when env->note is NULL. */
void runner_note(const runner_env *env, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
