/* worker.h — the threads that run jobs: max_jobs_per_device per device.
 *
 * A worker waits for a queued job its device accepts, marks it running,
 * takes the owner's filesystem identity (access.h) and runs the job through
 * its runner (runner.h), publishing progress into the job under the queue
 * lock; the event loop only reads it.  Cancel stops a job between two
 * layers of its current micro-batch (that step is not applied) after a
 * final checkpoint; a daemon shutdown does the same and puts the job back
 * in the queue, to resume at the next start.
 *
 * A job over several devices ([job] devices) starts when each of them has
 * a free slot: the worker of its first device takes it and runs rank 0,
 * and recruits a free worker of each other device to run the rank there,
 * the ranks as threads of one dist_group (dist/dist.h).  Rank 0's worker
 * keeps the job's state and log; the job ends when every rank has.
 */
#ifndef GRADD_WORKER_H
#define GRADD_WORKER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/ctx.h"
#include "queue.h"

struct workers;
struct worker_group;

typedef struct worker {
    pthread_t thread;
    struct workers *set;
    gradd_ctx *ctx;
    queue *q;
    int dev;          /* index into ctx->devs */
    bool started;
    char own_fs_err[160]; /* why it has no filesystem context of its own; "" if it has */
    /* Guarded by the queue lock: whether a job is running, and a counter
     * the job thread bumps between micro-batches and between the layers of
     * each (train_hooks.poll), which the watchdog checks. */
    bool busy;
    uint64_t beats;
    uint32_t job;     /* the job it runs while busy, for the watchdog's message */
    bool hang;        /* test hook: block at the next poll until released */
    bool exited;      /* the thread has returned: workers_stop may join it */
    /* Guarded by the queue lock: recruited to run rank `rank` of a job over
     * several devices, whose rank 0 another worker runs; NULL: not. */
    struct worker_group *follow;
    int rank;
} worker;

typedef struct workers {
    worker *w;
    int n;
} workers;

/* Start the worker threads.  0, or -1 with err. */
int workers_start(workers *ws, gradd_ctx *ctx, queue *q, int per_device, char *err, size_t err_len);
/* Test hook (--test-hooks): make the job threads of device `dev` block at
 * their next poll (hang) or let them go on, as a deadlocked kernel would
 * stop them.  Says how many threads the device has and how many are busy. */
void workers_set_hang(workers *ws, int dev, bool hang, uint32_t *nworkers, uint32_t *nbusy);
/* Whether a worker of device `dev` is free (runs nothing, recruited by no
 * job): what a job over several devices waits for.  Queue lock held. */
bool workers_device_free(struct workers *ws, int dev);
/* Ask running jobs to checkpoint and stop (they go back to queued) and
 * wait up to timeout_ms (UINT64_MAX: for ever) for every worker to finish.
 * 0 once all have, with the workers freed.  Else how many threads are
 * still running, each logged with its job; ws stays allocated, as those
 * threads may still touch it, the queue and the pools, so the caller must
 * free none of them (it should save the queue and exit). */
int workers_stop(workers *ws, uint64_t timeout_ms);

#endif
