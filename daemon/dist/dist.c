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

const char *dist_name(const dist *d)
{
    return d ? d->name : "rank 0 of 1";
}

int dist_allreduce_f32(dist *d, float *buf, size_t n, const char *what, char *err, size_t err_len)
{
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
    free(d);
    dist_mpi_close();
}
