/* dist_mpi.c — ranks as processes, over MPI (dist.h). */
#include "dist_internal.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gradd-config.h"

#if GRADD_HAVE_MPI

#include <mpi.h>

/* MPI's counts are ints: large buffers go in pieces. */
#define DIST_CHUNK (1 << 28)

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int mpi_failed(dist *d, int rc, const char *what, char *err, size_t err_len)
{
    if (rc == MPI_SUCCESS)
        return 0;
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(rc, s, &n) != MPI_SUCCESS)
        snprintf(s, sizeof s, "MPI error %d", rc);
    snprintf(err, err_len, "%s: %s failed: %s", d->name, what, s);
    return -1;
}

/* Wait for a started collective, polling (MPI progresses inside MPI_Test)
 * until the deadline: spin first, as a collective between ranks that are
 * in step ends within microseconds, then sleep a little between polls. */
static int wait_req(dist *d, MPI_Request *req, const char *what, char *err, size_t err_len)
{
    double deadline = mono_s() + d->timeout_s;
    for (long polls = 0;; polls++) {
        int done = 0;
        if (mpi_failed(d, MPI_Test(req, &done, MPI_STATUS_IGNORE), what, err, err_len) != 0)
            return -1;
        if (done)
            return 0;
        if (polls > 20000) {
            if (mono_s() > deadline) {
                dist_timed_out(d, what, err, err_len);
                return -1;
            }
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
    }
}

/* Started, then waited for: 0, or -1 with err. */
static int run_req(dist *d, int rc, MPI_Request *req, const char *what, char *err, size_t err_len)
{
    if (mpi_failed(d, rc, what, err, err_len) != 0)
        return -1;
    return wait_req(d, req, what, err, err_len);
}

int dist_mpi_open(dist *d, char *err, size_t err_len)
{
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
            snprintf(err, err_len, "MPI did not start (MPI_Init_thread)");
            return -1;
        }
    }
    /* Errors come back as codes, to be reported with the collective's name,
     * instead of aborting the process inside MPI. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d->size);
    MPI_Comm local;
    d->local_size = 1;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d->rank, MPI_INFO_NULL, &local) == MPI_SUCCESS) {
        MPI_Comm_size(local, &d->local_size);
        MPI_Comm_rank(local, &d->local_rank);
        MPI_Comm_free(&local);
    }
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    snprintf(d->name, sizeof d->name, "rank %d of %d on %s", d->rank, d->size, host);
    return 0;
}

static MPI_Op mpi_op(dist_op op)
{
    return op == DIST_MIN ? MPI_MIN : op == DIST_MAX ? MPI_MAX : MPI_SUM;
}

int dist_mpi_allreduce(dist *d, void *buf, size_t n, bool f64, dist_op op, const char *what, char *err,
                       size_t err_len)
{
    size_t elem = f64 ? sizeof(double) : sizeof(float);
    for (size_t off = 0; off < n; off += DIST_CHUNK) {
        size_t k = n - off < DIST_CHUNK ? n - off : DIST_CHUNK;
        MPI_Request req;
        if (run_req(d,
                    MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + off * elem, (int)k, f64 ? MPI_DOUBLE : MPI_FLOAT,
                                   mpi_op(op), MPI_COMM_WORLD, &req),
                    &req, what, err, err_len) != 0)
            return -1;
    }
    return 0;
}

int dist_mpi_bcast(dist *d, void *buf, size_t bytes, const char *what, char *err, size_t err_len)
{
    MPI_Request req;
    return run_req(d, MPI_Ibcast(buf, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD, &req), &req, what, err, err_len);
}

int dist_mpi_allreduce_start(dist *d, float *buf, size_t n, const char *what, char *err, size_t err_len)
{
    for (size_t off = 0; off < n; off += DIST_CHUNK) {
        size_t k = n - off < DIST_CHUNK ? n - off : DIST_CHUNK;
        if (dist_pending_grow(d, sizeof(MPI_Request), err, err_len) != 0)
            return -1;
        MPI_Request *req = (MPI_Request *)d->pending_req + d->npending;
        if (mpi_failed(d, MPI_Iallreduce(MPI_IN_PLACE, buf + off, (int)k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, req),
                       what, err, err_len) != 0)
            return -1;
        d->pending_buf[d->npending] = buf + off;
        d->pending_n[d->npending++] = k;
    }
    return 0;
}

void dist_mpi_progress(dist *d)
{
    int done = 0;
    MPI_Testall(d->npending, d->pending_req, &done, MPI_STATUSES_IGNORE);
}

int dist_mpi_finish(dist *d, const char *what, char *err, size_t err_len)
{
    int rc = 0;
    for (int i = 0; i < d->npending && rc == 0; i++)
        rc = wait_req(d, (MPI_Request *)d->pending_req + i, what, err, err_len);
    d->npending = 0;
    return rc;
}

/* Each rank's part from it to all, in pieces MPI's int counts hold: for
 * the few ranks of a job as fast as an allgather, and without its int
 * displacements, which a 3B model's 12 GB overflow. */
int dist_mpi_allgather_f32(dist *d, float *buf, size_t n, const char *what, char *err, size_t err_len)
{
    for (int k = 0; k < d->size; k++) {
        size_t first, count;
        dist_shard(n, d->size, k, &first, &count);
        for (size_t off = 0; off < count; off += DIST_CHUNK) {
            size_t c = count - off < DIST_CHUNK ? count - off : DIST_CHUNK;
            MPI_Request req;
            if (run_req(d, MPI_Ibcast(buf + first + off, (int)c, MPI_FLOAT, k, MPI_COMM_WORLD, &req), &req, what,
                        err, err_len) != 0)
                return -1;
        }
    }
    return 0;
}

int dist_mpi_gather_f32(dist *d, const float *part, float *full, size_t n, const char *what, char *err,
                        size_t err_len)
{
    for (int k = 0; k < d->size; k++) {
        size_t first, count;
        dist_shard(n, d->size, k, &first, &count);
        if (d->rank != 0 && d->rank != k)
            continue;
        for (size_t off = 0; off < count; off += DIST_CHUNK) {
            size_t c = count - off < DIST_CHUNK ? count - off : DIST_CHUNK;
            if (k == 0) {
                memcpy(full + first + off, part + off, c * sizeof(float));
                continue;
            }
            MPI_Request req;
            int rc = d->rank == 0 ? MPI_Irecv(full + first + off, (int)c, MPI_FLOAT, k, 0, MPI_COMM_WORLD, &req)
                                  : MPI_Isend(part + off, (int)c, MPI_FLOAT, 0, 0, MPI_COMM_WORLD, &req);
            if (run_req(d, rc, &req, what, err, err_len) != 0)
                return -1;
        }
    }
    return 0;
}

void dist_mpi_abort(int code)
{
    MPI_Abort(MPI_COMM_WORLD, code);
}

void dist_mpi_close(void)
{
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin)
        MPI_Finalize();
}

#else /* built without MPI */

int dist_mpi_open(dist *d, char *err, size_t err_len)
{
    (void)d;
    snprintf(err, err_len, "started as %d ranks, but this gradd was built without MPI (install libopenmpi-dev and "
             "build again)", dist_world_from_env());
    return -1;
}

/* Never reached: no dist of the MPI world exists without MPI. */
int dist_mpi_allreduce(dist *d, void *buf, size_t n, bool f64, dist_op op, const char *what, char *err,
                       size_t err_len)
{
    (void)d, (void)buf, (void)n, (void)f64, (void)op, (void)what;
    snprintf(err, err_len, "built without MPI");
    return -1;
}

int dist_mpi_allgather_f32(dist *d, float *buf, size_t n, const char *what, char *err, size_t err_len)
{
    (void)d, (void)buf, (void)n, (void)what;
    snprintf(err, err_len, "built without MPI");
    return -1;
}

int dist_mpi_gather_f32(dist *d, const float *part, float *full, size_t n, const char *what, char *err,
                        size_t err_len)
{
    (void)d, (void)part, (void)full, (void)n, (void)what;
    snprintf(err, err_len, "built without MPI");
    return -1;
}

int dist_mpi_bcast(dist *d, void *buf, size_t bytes, const char *what, char *err, size_t err_len)
{
    (void)d, (void)buf, (void)bytes, (void)what;
    snprintf(err, err_len, "built without MPI");
    return -1;
}

int dist_mpi_allreduce_start(dist *d, float *buf, size_t n, const char *what, char *err, size_t err_len)
{
    (void)d, (void)buf, (void)n, (void)what;
    snprintf(err, err_len, "built without MPI");
    return -1;
}

void dist_mpi_progress(dist *d)
{
    (void)d;
}

int dist_mpi_finish(dist *d, const char *what, char *err, size_t err_len)
{
    (void)d, (void)what, (void)err, (void)err_len;
    return 0;
}

void dist_mpi_abort(int code)
{
    _exit(code);
}

void dist_mpi_close(void)
{
}

#endif
