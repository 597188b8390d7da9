/* dist.c — the ranks of one job over MPI (dist.h). */
#include "dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gradd-config.h"

static int env_int(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    char *end;
    long n = strtol(v, &end, 10);
    return *end == '\0' && n > 0 && n < 1 << 24 ? (int)n : 0;
}

int dist_world_from_env(void)
{
    static const char *const names[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "SLURM_NTASKS"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int n = env_int(names[i]);
        if (n)
            return n;
    }
    return 1;
}

void dist_shard(size_t n, int size, int rank, size_t *first, size_t *count)
{
    size_t N = size > 0 ? (size_t)size : 1, k = (size_t)rank, base = n / N, extra = n % N;
    *count = base + (k < extra ? 1 : 0);
    *first = k * base + (k < extra ? k : extra);
}

#if GRADD_HAVE_MPI

#include <mpi.h>

struct dist {
    int rank, size, local_size;
    double timeout_s;
    char name[128];
};

/* MPI's counts are ints: large buffers go in pieces. */
#define DIST_CHUNK (1 << 28)

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void mpi_message(int code, char *buf, size_t len)
{
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(code, s, &n) != MPI_SUCCESS)
        snprintf(s, sizeof s, "MPI error %d", code);
    snprintf(buf, len, "%s", s);
}

/* Wait for a started collective, polling (MPI progresses inside MPI_Test)
 * until the deadline: spin first, as a collective between ranks that are
 * in step ends within microseconds, then sleep a little between polls. */
static int wait_req(dist *d, MPI_Request *req, const char *what, char *err, size_t err_len)
{
    double deadline = mono_s() + d->timeout_s;
    for (long polls = 0;; polls++) {
        int done = 0, rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            char m[MPI_MAX_ERROR_STRING];
            mpi_message(rc, m, sizeof m);
            snprintf(err, err_len, "%s: %s failed: %s", d->name, what, m);
            return -1;
        }
        if (done)
            return 0;
        if (polls > 20000) {
            if (mono_s() > deadline) {
                snprintf(err, err_len,
                         "%s: %s did not complete within %.0f s ([job] rank_timeout): another rank died or hangs",
                         d->name, what, d->timeout_s);
                return -1;
            }
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
    }
}

static int started(dist *d, int rc, const char *what, char *err, size_t err_len)
{
    if (rc == MPI_SUCCESS)
        return 0;
    char m[MPI_MAX_ERROR_STRING];
    mpi_message(rc, m, sizeof m);
    snprintf(err, err_len, "%s: %s failed: %s", d->name, what, m);
    return -1;
}

int dist_open(dist **out, double timeout_s, char *err, size_t err_len)
{
    *out = NULL;
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
    dist *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, err_len, "out of host memory");
        return -1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d->size);
    MPI_Comm local;
    d->local_size = 1;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d->rank, MPI_INFO_NULL, &local) == MPI_SUCCESS) {
        MPI_Comm_size(local, &d->local_size);
        MPI_Comm_free(&local);
    }
    d->timeout_s = timeout_s > 0 ? timeout_s : 300;
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    snprintf(d->name, sizeof d->name, "rank %d of %d on %s", d->rank, d->size, host);
    *out = d;
    return 0;
}

int dist_rank(const dist *d)
{
    return d ? d->rank : 0;
}

int dist_size(const dist *d)
{
    return d ? d->size : 1;
}

int dist_local_size(const dist *d)
{
    return d ? d->local_size : 1;
}

const char *dist_name(const dist *d)
{
    return d ? d->name : "rank 0 of 1";
}

static MPI_Op mpi_op(dist_op op)
{
    return op == DIST_MIN ? MPI_MIN : op == DIST_MAX ? MPI_MAX : MPI_SUM;
}

static int allreduce(dist *d, void *buf, size_t n, size_t elem, MPI_Datatype t, MPI_Op op, const char *what, char *err,
                     size_t err_len)
{
    for (size_t off = 0; off < n; off += DIST_CHUNK) {
        size_t k = n - off < DIST_CHUNK ? n - off : DIST_CHUNK;
        MPI_Request req;
        if (started(d, MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + off * elem, (int)k, t, op, MPI_COMM_WORLD, &req),
                    what, err, err_len) != 0 ||
            wait_req(d, &req, what, err, err_len) != 0)
            return -1;
    }
    return 0;
}

int dist_allreduce_f32(dist *d, float *buf, size_t n, const char *what, char *err, size_t err_len)
{
    return allreduce(d, buf, n, sizeof *buf, MPI_FLOAT, MPI_SUM, what, err, err_len);
}

int dist_allreduce_f64(dist *d, double *buf, size_t n, dist_op op, const char *what, char *err, size_t err_len)
{
    return allreduce(d, buf, n, sizeof *buf, MPI_DOUBLE, mpi_op(op), what, err, err_len);
}

/* Each rank's part from it to all, in pieces MPI's int counts hold: for
 * the few ranks of a job as fast as an allgather, and without its int
 * displacements, which a 3B model's 12 GB overflow. */
int dist_allgather_f32(dist *d, float *buf, size_t n, const char *what, char *err, size_t err_len)
{
    for (int k = 0; k < d->size; k++) {
        size_t first, count;
        dist_shard(n, d->size, k, &first, &count);
        for (size_t off = 0; off < count; off += DIST_CHUNK) {
            size_t c = count - off < DIST_CHUNK ? count - off : DIST_CHUNK;
            MPI_Request req;
            if (started(d, MPI_Ibcast(buf + first + off, (int)c, MPI_FLOAT, k, MPI_COMM_WORLD, &req), what, err,
                        err_len) != 0 ||
                wait_req(d, &req, what, err, err_len) != 0)
                return -1;
        }
    }
    return 0;
}

int dist_gather_f32(dist *d, const float *part, float *full, size_t n, const char *what, char *err, size_t err_len)
{
    for (int k = 0; k < d->size; k++) {
        size_t first, count;
        dist_shard(n, d->size, k, &first, &count);
        if (d->rank != 0 && d->rank != k)
            continue;
        for (size_t off = 0; off < count; off += DIST_CHUNK) {
            size_t c = count - off < DIST_CHUNK ? count - off : DIST_CHUNK;
            if (k == 0) {
                if (d->rank == 0)
                    memcpy(full + first + off, part + off, c * sizeof(float));
                continue;
            }
            MPI_Request req;
            int rc = d->rank == 0 ? MPI_Irecv(full + first + off, (int)c, MPI_FLOAT, k, 0, MPI_COMM_WORLD, &req)
                                  : MPI_Isend(part + off, (int)c, MPI_FLOAT, 0, 0, MPI_COMM_WORLD, &req);
            if (started(d, rc, what, err, err_len) != 0 || wait_req(d, &req, what, err, err_len) != 0)
                return -1;
        }
    }
    return 0;
}

void dist_abort(dist *d, int code)
{
    (void)d;
    MPI_Abort(MPI_COMM_WORLD, code);
}

void dist_close(dist *d)
{
    if (!d)
        return;
    free(d);
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin)
        MPI_Finalize();
}

#else /* built without MPI */

struct dist {
    int unused;
};

int dist_open(dist **out, double timeout_s, char *err, size_t err_len)
{
    (void)timeout_s;
    *out = NULL;
    snprintf(err, err_len, "started as %d ranks, but this gradd was built without MPI (install libopenmpi-dev and "
             "build again)", dist_world_from_env());
    return -1;
}

int dist_rank(const dist *d)
{
    (void)d;
    return 0;
}

int dist_size(const dist *d)
{
    (void)d;
    return 1;
}

int dist_local_size(const dist *d)
{
    (void)d;
    return 1;
}

const char *dist_name(const dist *d)
{
    (void)d;
    return "rank 0 of 1";
}

int dist_allreduce_f32(dist *d, float *buf, size_t n, const char *what, char *err, size_t err_len)
{
    (void)d, (void)buf, (void)n, (void)what, (void)err, (void)err_len;
    return 0;
}

int dist_allreduce_f64(dist *d, double *buf, size_t n, dist_op op, const char *what, char *err, size_t err_len)
{
    (void)d, (void)buf, (void)n, (void)op, (void)what, (void)err, (void)err_len;
    return 0;
}

int dist_allgather_f32(dist *d, float *buf, size_t n, const char *what, char *err, size_t err_len)
{
    (void)d, (void)buf, (void)n, (void)what, (void)err, (void)err_len;
    return 0;
}

int dist_gather_f32(dist *d, const float *part, float *full, size_t n, const char *what, char *err, size_t err_len)
{
    (void)d, (void)what, (void)err, (void)err_len;
    if (full != part)
        memcpy(full, part, n * sizeof(float));
    return 0;
}

void dist_abort(dist *d, int code)
{
    (void)d;
    exit(code);
}

void dist_close(dist *d)
{
    (void)d;
}

#endif
