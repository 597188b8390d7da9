/* dist.c — the ranks of one job (dist.h): who this rank is, and each
 * collective handed to the backend of its world. */
#include "dist_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

void dist_timed_out(const dist *d, const char *what, char *err, size_t err_len)
{
    snprintf(err, err_len, "%s: %s did not complete within %g s ([job] rank_timeout): another rank died or hangs",
             d->name, what, d->timeout_s);
}

int dist_open(dist **out, double timeout_s, char *err, size_t err_len)
{
    *out = NULL;
    dist *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, err_len, "out of host memory");
        return -1;
    }
    d->timeout_s = timeout_s > 0 ? timeout_s : 300;
    if (dist_mpi_open(d, err, err_len) != 0) {
        free(d);
        return -1;
    }
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

int dist_local_device(const dist *d, int n)
{
    return d && n > 0 ? d->local_rank % n : 0;
}

const char *dist_name(const dist *d)
{
    return d ? d->name : "rank 0 of 1";
}

static int given_up(void *user, char *why, size_t why_len)
{
    return dist_thr_given_up(user, why, why_len);
}

static dist_nccl_wait nccl_wait(dist *d)
{
    return (dist_nccl_wait){d->timeout_s, d->name, d->group ? given_up : NULL, d, d->beat, d->beat_user};
}

/* A failed NCCL collective: the rank's thread-group peers are told now. */
static int nccl_result(dist *d, int rc, char *err)
{
    if (rc != 0 && d->group)
        dist_thr_fail(d, err);
    return rc;
}

int dist_use_cuda(dist *d, const void *collectives, int device, void *stream, char *err, size_t err_len)
{
    const dist_nccl_ops *o = collectives;
    unsigned char id[DIST_NCCL_ID_BYTES] = {0};
    if (!o || o->abi != DIST_NCCL_ABI) {
        snprintf(err, err_len, "%s: ranks on CUDA devices share gradients over NCCL, and this gradd's CUDA module %s",
                 d->name, o ? "has another NCCL interface (a module of another gradd?)" : "was built without it");
        /* The others are told, or they would wait at the id's broadcast. */
        dist_fail(d, err);
        return -1;
    }
    int rc = d->rank == 0 ? o->unique_id(id, err, err_len) : 0;
    /* Rank 0's failure travels as an id of zeros, so that no rank waits. */
    if (d->rank == 0 && rc != 0)
        memset(id, 0, sizeof id);
    if ((d->group ? dist_thr_bcast(d, id, sizeof id, "sharing NCCL's id", err, err_len)
                  : dist_mpi_bcast(d, id, sizeof id, "sharing NCCL's id", err, err_len)) != 0)
        return -1;
    unsigned char none[DIST_NCCL_ID_BYTES] = {0};
    if (memcmp(id, none, sizeof id) == 0) {
        if (d->rank != 0)
            snprintf(err, err_len, "%s: rank 0 could not make NCCL's id", d->name);
        return nccl_result(d, -1, err);
    }
    dist_nccl_wait w = nccl_wait(d);
    dist_nccl_comm *c = o->open(device, d->rank, d->size, id, stream, &w, err, err_len);
    if (!c)
        return nccl_result(d, -1, err);
    d->nccl = o;
    d->comm = c;
    return 0;
}

void dist_release_cuda(dist *d, bool failed)
{
    if (!d || !d->comm)
        return;
    d->nccl->close(d->comm, failed);
    d->comm = NULL;
    d->nccl = NULL;
}

int dist_pending_grow(dist *d, size_t req_bytes, char *err, size_t err_len)
{
    if (d->npending < d->pending_cap)
        return 0;
    int cap = d->pending_cap ? 2 * d->pending_cap : 64;
    float **b = realloc(d->pending_buf, (size_t)cap * sizeof *b);
    if (b)
        d->pending_buf = b;
    size_t *n = realloc(d->pending_n, (size_t)cap * sizeof *n);
    if (n)
        d->pending_n = n;
    void *r = req_bytes ? realloc(d->pending_req, (size_t)cap * req_bytes) : d->pending_req;
    if (r)
        d->pending_req = r;
    if (!b || !n || (req_bytes && !r)) {
        snprintf(err, err_len, "%s: out of host memory", d->name);
        return -1;
    }
    d->pending_cap = cap;
    return 0;
}

int dist_allreduce_start(dist *d, float *buf, size_t n, const char *what, char *err, size_t err_len)
{
    if (d->comm) {
        dist_nccl_wait w = nccl_wait(d);
        return nccl_result(d, d->nccl->allreduce_start(d->comm, buf, n, &w, err, err_len), err);
    }
    if (!d->group)
        return dist_mpi_allreduce_start(d, buf, n, what, err, err_len);
    if (dist_pending_grow(d, 0, err, err_len) != 0)
        return -1;
    d->pending_buf[d->npending] = buf;
    d->pending_n[d->npending++] = n;
    return 0;
}

void dist_progress(dist *d)
{
    if (d && !d->comm && !d->group && d->npending)
        dist_mpi_progress(d);
}

int dist_allreduce_finish(dist *d, const char *what, char *err, size_t err_len)
{
    if (d->comm) {
        dist_nccl_wait w = nccl_wait(d);
        return nccl_result(d, d->nccl->finish(d->comm, &w, what, err, err_len), err);
    }
    if (!d->group)
        return dist_mpi_finish(d, what, err, err_len);
    /* Threads sum every element in rank order, in one piece or in many:
     * the buffers that adjoin go as one. */
    int rc = 0;
    for (int i = 0; i < d->npending && rc == 0;) {
        float *lo = d->pending_buf[i];
        size_t n = d->pending_n[i];
        int k = i + 1;
        for (; k < d->npending; k++) {
            if (d->pending_buf[k] + d->pending_n[k] == lo) {
                lo = d->pending_buf[k];
                n += d->pending_n[k];
            } else if (lo + n == d->pending_buf[k]) {
                n += d->pending_n[k];
            } else {
                break;
            }
        }
        rc = dist_thr_allreduce(d, lo, n, false, DIST_SUM, what, err, err_len);
        i = k;
    }
    d->npending = 0;
    return rc;
}

int dist_allreduce_f32(dist *d, float *buf, size_t n, const char *what, char *err, size_t err_len)
{
    if (d->comm)
        return dist_allreduce_start(d, buf, n, what, err, err_len) == 0 ? dist_allreduce_finish(d, what, err, err_len)
                                                                       : -1;
    return d->group ? dist_thr_allreduce(d, buf, n, false, DIST_SUM, what, err, err_len)
                    : dist_mpi_allreduce(d, buf, n, false, DIST_SUM, what, err, err_len);
}

int dist_allreduce_f64(dist *d, double *buf, size_t n, dist_op op, const char *what, char *err, size_t err_len)
{
    return d->group ? dist_thr_allreduce(d, buf, n, true, op, what, err, err_len)
                    : dist_mpi_allreduce(d, buf, n, true, op, what, err, err_len);
}

int dist_allgather_f32(dist *d, float *buf, size_t n, const char *what, char *err, size_t err_len)
{
    if (d->comm) {
        size_t *first = malloc(2 * (size_t)d->size * sizeof *first);
        if (!first) {
            snprintf(err, err_len, "%s: out of host memory", d->name);
            return nccl_result(d, -1, err);
        }
        size_t *count = first + d->size;
        for (int k = 0; k < d->size; k++)
            dist_shard(n, d->size, k, &first[k], &count[k]);
        dist_nccl_wait w = nccl_wait(d);
        int rc = d->nccl->bcast_parts_start(d->comm, buf, first, count, &w, err, err_len);
        free(first);
        if (nccl_result(d, rc, err) != 0)
            return -1;
        return dist_allreduce_finish(d, what, err, err_len);
    }
    return d->group ? dist_thr_allgather_f32(d, buf, n, what, err, err_len)
                    : dist_mpi_allgather_f32(d, buf, n, what, err, err_len);
}

int dist_gather_f32(dist *d, const float *part, float *full, size_t n, const char *what, char *err, size_t err_len)
{
    return d->group ? dist_thr_gather_f32(d, part, full, n, what, err, err_len)
                    : dist_mpi_gather_f32(d, part, full, n, what, err, err_len);
}

void dist_set_beat(dist *d, void (*beat)(void *user), void *user)
{
    d->beat = beat;
    d->beat_user = user;
}

void dist_fail(dist *d, const char *why)
{
    if (d && d->group)
        dist_thr_fail(d, why);
}

void dist_abort(dist *d, int code)
{
    if (d && d->group)
        exit(code);
    dist_mpi_abort(code);
}

void dist_close(dist *d)
{
    if (!d || d->group)
        return;
    dist_release_cuda(d, false);
    free(d->pending_buf);
    free(d->pending_n);
    free(d->pending_req);
    free(d);
    dist_mpi_close();
}
