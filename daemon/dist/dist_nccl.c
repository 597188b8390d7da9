/* dist_nccl.c — the device collectives of ranks on CUDA devices, over NCCL
 * (dist_internal.h's dist_nccl_ops).  Built into the gradd-cuda module, so
 * that gradd itself links neither CUDA nor NCCL.
 *
 * Every communicator is nonblocking (ncclConfig_t.blocking = 0): no NCCL
 * call waits for the other ranks, and every wait here is a poll with the
 * job's rank_timeout.  A rank that died or hangs would otherwise keep the
 * others inside NCCL forever; here their wait times out, the communicator
 * is aborted (which ends its kernels), and the job fails on every rank.
 *
 * The collectives run on a stream of their own that waits for the
 * kernel context's stream at an event: gradients summed while the backward
 * goes on computing the layers below them.  finish() makes the kernel
 * stream wait for the collectives in turn, and waits for them on the host,
 * where a timeout can be seen. */
#include "dist_internal.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct dist_nccl_comm {
    ncclComm_t comm;
    int device, rank, size;
    cudaStream_t work;  /* the kernel context's */
    cudaStream_t comms; /* the collectives' */
    cudaEvent_t ready, done;
    bool started; /* something queued since the last finish */
    bool aborted;
};

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void pause_briefly(long polls)
{
    if (polls < 2000)
        return;
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
}

static int cuda_failed(cudaError_t e, const char *what, char *err, size_t err_len)
{
    if (e == cudaSuccess)
        return 0;
    snprintf(err, err_len, "%s: %s", what, cudaGetErrorString(e));
    return -1;
}

static int nccl_failed(dist_nccl_comm *c, ncclResult_t r, const char *what, char *err, size_t err_len)
{
    if (r == ncclSuccess || r == ncclInProgress)
        return 0;
    const char *last = c && c->comm ? ncclGetLastError(c->comm) : "";
    snprintf(err, err_len, "NCCL: %s: %s%s%s", what, ncclGetErrorString(r), last && *last ? ": " : "",
             last ? last : "");
    return -1;
}

/* Poll until `done` has happened (an event; NULL: until the
 * communicator's state leaves ncclInProgress, NCCL's rule for a nonblocking
 * communicator before any other call), within the job's rank_timeout and
 * while no other rank gave up, beating meanwhile.  On a failure or a
 * timeout the communicator is aborted at once: its kernels end, and the
 * streams that wait for them drain. */
static int wait_for(dist_nccl_comm *c, cudaEvent_t done, const dist_nccl_wait *w, const char *what, char *err,
                    size_t err_len)
{
    double deadline = mono_s() + (w ? w->timeout_s : 300), beat_at = mono_s() + 1;
    for (long polls = 0;; polls++) {
        if (done) {
            cudaError_t q = cudaEventQuery(done);
            if (q == cudaSuccess)
                return 0;
            if (q != cudaErrorNotReady) {
                cuda_failed(q, what, err, err_len);
                break;
            }
        }
        ncclResult_t st = ncclInProgress, r = ncclCommGetAsyncError(c->comm, &st);
        if (r != ncclSuccess)
            st = r;
        if (!done && st == ncclSuccess)
            return 0;
        if (st != ncclSuccess && st != ncclInProgress) {
            nccl_failed(c, st, what, err, err_len);
            break;
        }
        double now = mono_s();
        if (w && w->given_up && w->given_up(w->user, err, err_len))
            break;
        if (now > deadline) {
            snprintf(err, err_len, "%s: %s did not complete within %g s ([job] rank_timeout): another rank died or "
                     "hangs", w ? w->name : "a rank", what, w ? w->timeout_s : 300.0);
            break;
        }
        if (w && w->beat && now > beat_at) {
            w->beat(w->beat_user);
            beat_at = now + 1;
        }
        pause_briefly(polls);
    }
    ncclCommAbort(c->comm);
    c->comm = NULL;
    c->aborted = true;
    return -1;
}

/* A nonblocking NCCL call that returned ncclInProgress must settle before
 * the next call; the first collective between two ranks connects them,
 * and so waits for the other. */
static int queued(dist_nccl_comm *c, ncclResult_t r, const dist_nccl_wait *w, const char *what, char *err,
                  size_t err_len)
{
    if (nccl_failed(c, r, what, err, err_len) != 0) {
        c->aborted = true;
        return -1;
    }
    return r == ncclInProgress ? wait_for(c, NULL, w, what, err, err_len) : 0;
}

static int nccl_unique_id(unsigned char id[DIST_NCCL_ID_BYTES], char *err, size_t err_len)
{
    _Static_assert(sizeof(ncclUniqueId) == DIST_NCCL_ID_BYTES, "NCCL's unique id changed size");
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) {
        snprintf(err, err_len, "NCCL: ncclGetUniqueId: %s", ncclGetErrorString(r));
        return -1;
    }
    memcpy(id, &u, sizeof u);
    return 0;
}

static void nccl_close(dist_nccl_comm *c, bool abort)
{
    if (!c)
        return;
    cudaSetDevice(c->device);
    /* Finalize flushes what the communicator still holds, asynchronously
     * on a nonblocking communicator, and bounded here: a peer gone
     * meanwhile must not keep this rank from ending. */
    if (c->comm && !abort && !c->aborted) {
        char err[256];
        dist_nccl_wait fw = {.timeout_s = 10, .name = "this rank"};
        if (queued(c, ncclCommFinalize(c->comm), &fw, "finalizing NCCL", err, sizeof err) == 0) {
            ncclCommDestroy(c->comm);
            c->comm = NULL;
        }
    }
    if (c->comm)
        ncclCommAbort(c->comm);
    if (c->ready)
        cudaEventDestroy(c->ready);
    if (c->done)
        cudaEventDestroy(c->done);
    if (c->comms)
        cudaStreamDestroy(c->comms);
    free(c);
}

static dist_nccl_comm *nccl_open(int device, int rank, int size, const unsigned char id[DIST_NCCL_ID_BYTES],
                                 void *stream, const dist_nccl_wait *w, char *err, size_t err_len)
{
    dist_nccl_comm *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, err_len, "out of host memory");
        return NULL;
    }
    c->device = device;
    c->rank = rank;
    c->size = size;
    c->work = (cudaStream_t)stream;
    if (cuda_failed(cudaSetDevice(device), "cudaSetDevice", err, err_len) ||
        cuda_failed(cudaStreamCreateWithFlags(&c->comms, cudaStreamNonBlocking), "cudaStreamCreate", err, err_len) ||
        cuda_failed(cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming), "cudaEventCreate", err, err_len) ||
        cuda_failed(cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming), "cudaEventCreate", err, err_len)) {
        nccl_close(c, false);
        return NULL;
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclResult_t r = ncclCommInitRankConfig(&c->comm, size, u, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        nccl_failed(c, r, "ncclCommInitRankConfig", err, err_len);
        nccl_close(c, true);
        return NULL;
    }
    if (wait_for(c, NULL, w, "joining the ranks over NCCL", err, err_len) != 0) {
        nccl_close(c, true);
        return NULL;
    }
    return c;
}

/* The collectives' stream waits for the work queued so far. */
static int after_work(dist_nccl_comm *c, char *err, size_t err_len)
{
    if (c->aborted) {
        snprintf(err, err_len, "NCCL: the communicator was aborted");
        return -1;
    }
    if (cuda_failed(cudaSetDevice(c->device), "cudaSetDevice", err, err_len) ||
        cuda_failed(cudaEventRecord(c->ready, c->work), "cudaEventRecord", err, err_len) ||
        cuda_failed(cudaStreamWaitEvent(c->comms, c->ready, 0), "cudaStreamWaitEvent", err, err_len))
        return -1;
    c->started = true;
    return 0;
}

static int nccl_allreduce_start(dist_nccl_comm *c, float *buf, size_t n, const dist_nccl_wait *w, char *err,
                                size_t err_len)
{
    if (after_work(c, err, err_len) != 0)
        return -1;
    return queued(c, ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, c->comm, c->comms), w, "ncclAllReduce", err,
                  err_len);
}

static int nccl_bcast_parts_start(dist_nccl_comm *c, float *buf, const size_t *first, const size_t *count,
                                  const dist_nccl_wait *w, char *err, size_t err_len)
{
    if (after_work(c, err, err_len) != 0)
        return -1;
    /* Between the group's start and end the calls only record. */
    ncclResult_t r = ncclGroupStart();
    for (int k = 0; r == ncclSuccess && k < c->size; k++)
        r = ncclBroadcast(buf + first[k], buf + first[k], count[k], ncclFloat32, k, c->comm, c->comms);
    ncclResult_t e = ncclGroupEnd();
    return queued(c, r != ncclSuccess ? r : e, w, "ncclBroadcast", err, err_len);
}

static int nccl_finish(dist_nccl_comm *c, const dist_nccl_wait *w, const char *what, char *err, size_t err_len)
{
    if (!c->started)
        return 0;
    c->started = false;
    if (cuda_failed(cudaSetDevice(c->device), "cudaSetDevice", err, err_len) ||
        cuda_failed(cudaEventRecord(c->done, c->comms), "cudaEventRecord", err, err_len) ||
        cuda_failed(cudaStreamWaitEvent(c->work, c->done, 0), "cudaStreamWaitEvent", err, err_len)) {
        c->aborted = true;
        return -1;
    }
    return wait_for(c, c->done, w, what, err, err_len);
}

__attribute__((visibility("default"))) const dist_nccl_ops gradd_dist_nccl_v1 = {
    .abi = DIST_NCCL_ABI,
    .unique_id = nccl_unique_id,
    .open = nccl_open,
    .allreduce_start = nccl_allreduce_start,
    .bcast_parts_start = nccl_bcast_parts_start,
    .finish = nccl_finish,
    .close = nccl_close,
};
