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
#include <sys/types.h>

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
    /* For a program job (NULL in `gradd run`, which refuses them): its
     * owner; a place for its output, whole lines; whether the daemon is
     * stopping (rather than the job cancelled); and where its process
     * group is, recorded so that a daemon killed meanwhile can end it at
     * its next start (0: it ended); and that what `status` shows of it
     * (its time, its memory) has moved on, so that watchers see it again.
     * All take note_user. */
    uid_t uid;
    gid_t gid;
    void (*output)(void *user, const char *text);
    bool (*daemon_stopping)(void *user);
    void (*started)(void *user, uint32_t pgid);
    void (*changed)(void *user);
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
/* A user's own program ([job] type = program), run as its owner. */
extern const runner runner_program;

/* Signal a program job's process group `pgid` (uid `owner`'s), also from
 * a daemon that runs as a service user without CAP_KILL.  0, or -1. */
int runner_signal_group(uint32_t pgid, int sig, uid_t owner);
/* At start: SIGKILL a program job's group left by a daemon that was
 * killed, if it is still there and is the owner's; else nothing. */
void runner_end_orphans(uint32_t pgid, uid_t owner);

/* env->note with printf arguments; nothing when env->note is NULL. */
void runner_note(const runner_env *env, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
