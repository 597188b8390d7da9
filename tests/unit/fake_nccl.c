/* fake_nccl.c — a stand-in for NCCL and for the CUDA runtime calls that
 * daemon/dist/dist_nccl.c makes, on host memory, so that the NCCL path's
 * own logic (nonblocking joins and enqueues that must settle, collectives
 * on a stream of their own ordered by events, waits with deadlines, the
 * abort of a communicator whose peer is gone) runs in the unit tests on a
 * machine without a GPU.  The ranks are threads of the test and "device
 * memory" is host memory.
 *
 * A world is the ranks that joined with one unique id.  A collective is
 * the rank's next one in sequence; it completes when every rank has
 * enqueued it (the sum in rank order, or the root's values copied), and
 * a stream's later work, or an event recorded on it, waits for it.  A
 * communicator's first collective returns ncclInProgress (as a real one
 * connecting its peers may), which the caller must settle. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FK_RANKS 16
#define FK_DEPS 512

typedef struct fk_op {
    uint64_t seq;
    int kind; /* 1 all-reduce (sum), 2 broadcast */
    size_t count;
    int root, arrived;
    bool done;
    float *bufs[FK_RANKS];
    struct fk_op *next;
} fk_op;

typedef struct fk_world {
    unsigned char id[NCCL_UNIQUE_ID_BYTES];
    int n, joined, left;
    fk_op *ops;
    struct fk_world *next;
} fk_world;

struct ncclComm {
    fk_world *w;
    int rank;
    uint64_t seq;
    ncclResult_t err;
    bool connected;
};

/* What a stream's later work waits for, and an event's snapshot of it. */
struct CUstream_st {
    fk_op *deps[FK_DEPS];
    int n;
};
struct CUevent_st {
    fk_op *deps[FK_DEPS];
    int n;
};

static pthread_mutex_t fk_lock = PTHREAD_MUTEX_INITIALIZER;
static fk_world *fk_worlds;
static uint64_t fk_ids;

static bool op_done(const fk_op *o)
{
    return __atomic_load_n(&o->done, __ATOMIC_ACQUIRE);
}

/* deps += more, the completed ones dropped (lock held). */
static void add_deps(fk_op **deps, int *n, fk_op *const *more, int m)
{
    int k = 0;
    for (int i = 0; i < *n; i++)
        if (!op_done(deps[i]))
            deps[k++] = deps[i];
    for (int i = 0; i < m && k < FK_DEPS; i++)
        if (!op_done(more[i]))
            deps[k++] = more[i];
    *n = k;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    pthread_mutex_lock(&fk_lock);
    uint64_t v = ++fk_ids;
    pthread_mutex_unlock(&fk_lock);
    memset(id, 0, sizeof *id);
    memcpy(id->internal, "fake-nccl", 9);
    memcpy(id->internal + 16, &v, sizeof v);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config)
{
    if (nranks < 1 || nranks > FK_RANKS || rank < 0 || rank >= nranks || memcmp(id.internal, "fake-nccl", 9))
        return ncclInvalidArgument;
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c)
        return ncclSystemError;
    pthread_mutex_lock(&fk_lock);
    fk_world *w = fk_worlds;
    while (w && memcmp(w->id, id.internal, sizeof w->id))
        w = w->next;
    if (!w && (w = calloc(1, sizeof *w))) {
        memcpy(w->id, id.internal, sizeof w->id);
        w->n = nranks;
        w->next = fk_worlds;
        fk_worlds = w;
    }
    if (w)
        w->joined++;
    pthread_mutex_unlock(&fk_lock);
    if (!w) {
        free(c);
        return ncclSystemError;
    }
    c->w = w;
    c->rank = rank;
    *comm = c;
    return config && config->blocking == 0 ? ncclInProgress : ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state)
{
    pthread_mutex_lock(&fk_lock);
    *state = comm->err ? comm->err : comm->w->joined < comm->w->n ? ncclInProgress : ncclSuccess;
    pthread_mutex_unlock(&fk_lock);
    return ncclSuccess;
}

/* The rank's next collective, matched with the others' by sequence. */
static ncclResult_t enqueue(ncclComm_t comm, int kind, float *buf, size_t count, int root, cudaStream_t stream)
{
    pthread_mutex_lock(&fk_lock);
    fk_world *w = comm->w;
    uint64_t seq = comm->seq++;
    fk_op *o = w->ops;
    while (o && o->seq != seq)
        o = o->next;
    if (!o && (o = calloc(1, sizeof *o))) {
        o->seq = seq;
        o->kind = kind;
        o->count = count;
        o->root = root;
        o->next = w->ops;
        w->ops = o;
    }
    if (!o || o->kind != kind || o->count != count || o->root != root) {
        comm->err = o ? ncclInvalidUsage : ncclSystemError;
        pthread_mutex_unlock(&fk_lock);
        return comm->err;
    }
    o->bufs[comm->rank] = buf;
    if (++o->arrived == w->n) {
        for (size_t i = 0; i < count; i++) {
            float v = o->bufs[o->root][i];
            if (kind == 1)
                for (int k = 1; k < w->n; k++)
                    v += o->bufs[k][i];
            for (int k = 0; k < w->n; k++)
                o->bufs[k][i] = v;
        }
        __atomic_store_n(&o->done, true, __ATOMIC_RELEASE);
    }
    add_deps(stream->deps, &stream->n, &o, 1);
    bool first = !comm->connected;
    comm->connected = true;
    pthread_mutex_unlock(&fk_lock);
    return first ? ncclInProgress : ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream)
{
    if (sendbuff != recvbuff || datatype != ncclFloat32 || op != ncclSum)
        return ncclInvalidArgument; /* what dist_nccl.c asks for, only */
    return enqueue(comm, 1, recvbuff, count, 0, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream)
{
    if (sendbuff != recvbuff || datatype != ncclFloat32)
        return ncclInvalidArgument;
    return enqueue(comm, 2, recvbuff, count, root, stream);
}

ncclResult_t ncclGroupStart(void)
{
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    return ncclSuccess;
}

/* The rank leaves; the world goes with its last rank. */
static void leave(ncclComm_t comm)
{
    pthread_mutex_lock(&fk_lock);
    fk_world *w = comm->w;
    if (++w->left == w->joined) {
        for (fk_world **p = &fk_worlds; *p; p = &(*p)->next)
            if (*p == w) {
                *p = w->next;
                break;
            }
        while (w->ops) {
            fk_op *o = w->ops;
            w->ops = o->next;
            free(o);
        }
        free(w);
    }
    pthread_mutex_unlock(&fk_lock);
    free(comm);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    (void)comm;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    leave(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    leave(comm);
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result)
{
    return result == ncclInvalidUsage ? "invalid usage (fake)" : result == ncclInProgress ? "in progress" : "error (fake)";
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return "";
}

cudaError_t cudaSetDevice(int device)
{
    (void)device;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    (void)flags;
    *s = calloc(1, sizeof **s);
    return *s ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    free(s);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    (void)flags;
    *e = calloc(1, sizeof **e);
    return *e ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    free(e);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    pthread_mutex_lock(&fk_lock);
    e->n = 0;
    add_deps(e->deps, &e->n, s->deps, s->n);
    pthread_mutex_unlock(&fk_lock);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    (void)flags;
    pthread_mutex_lock(&fk_lock);
    add_deps(s->deps, &s->n, e->deps, e->n);
    pthread_mutex_unlock(&fk_lock);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    pthread_mutex_lock(&fk_lock);
    bool done = true;
    for (int i = 0; i < e->n && done; i++)
        done = op_done(e->deps[i]);
    pthread_mutex_unlock(&fk_lock);
    return done ? cudaSuccess : cudaErrorNotReady;
}

const char *cudaGetErrorString(cudaError_t error)
{
    return error == cudaErrorNotReady ? "not ready" : "error (fake)";
}
