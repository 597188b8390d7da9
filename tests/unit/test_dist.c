/* test_dist.c — a thread group's collectives (dist.h): every rank ends
 * with the same values, reduced in rank order; shares are contiguous in
 * rank order; a rank that never comes fails the others at the deadline,
 * and a rank that gives up fails them at once. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "dist/dist.h"

#define N 1001

typedef struct {
    dist *d;
    float f[N], b[N];
    double lo[3], hi[3];
    float shard[N];
    float *full;
    int rc[5];
    char err[640];
} rank_io;

static void *rank_main(void *arg)
{
    rank_io *io = arg;
    int k = dist_rank(io->d);
    for (int i = 0; i < N; i++)
        io->f[i] = (float)(k + 1) * 0.1f + (float)i;
    for (int i = 0; i < 3; i++)
        io->lo[i] = io->hi[i] = (double)(k * 7 % 5) + i;
    io->rc[0] = dist_allreduce_f32(io->d, io->f, N, "sum", io->err, sizeof io->err);
    io->rc[1] = dist_allreduce_f64(io->d, io->lo, 3, DIST_MIN, "min", io->err, sizeof io->err);
    io->rc[1] |= dist_allreduce_f64(io->d, io->hi, 3, DIST_MAX, "max", io->err, sizeof io->err);
    /* Each rank's share holds its rank: gathered, the whole array says
     * whose share each element was. */
    size_t first, count;
    dist_shard(N, dist_size(io->d), k, &first, &count);
    for (size_t i = 0; i < N; i++)
        io->shard[i] = i >= first && i < first + count ? (float)k : -1.0f;
    float part[N];
    for (size_t i = 0; i < count; i++)
        part[i] = (float)(1000 * k) + (float)i;
    io->rc[2] = dist_allgather_f32(io->d, io->shard, N, "allgather", io->err, sizeof io->err);
    io->rc[3] = dist_gather_f32(io->d, part, io->full, N, "gather", io->err, sizeof io->err);
    /* Buckets from the top down, one left out: [600, N), [300, 600) and
     * [0, 100) summed, [100, 300) as it was. */
    for (int i = 0; i < N; i++)
        io->b[i] = (float)(k + 1) * 0.1f + (float)i;
    io->rc[4] = dist_allreduce_start(io->d, io->b + 600, N - 600, "buckets", io->err, sizeof io->err);
    dist_progress(io->d);
    io->rc[4] |= dist_allreduce_start(io->d, io->b + 300, 300, "buckets", io->err, sizeof io->err);
    io->rc[4] |= dist_allreduce_start(io->d, io->b, 100, "buckets", io->err, sizeof io->err);
    io->rc[4] |= dist_allreduce_finish(io->d, "buckets", io->err, sizeof io->err);
    return NULL;
}

static void test_collectives(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++) {
        char err[256];
        dist_group *g = dist_group_new(n, 10, err, sizeof err);
        assert_non_null(g);
        rank_io *io = calloc((size_t)n, sizeof *io);
        float *full = malloc(N * sizeof *full);
        pthread_t t[4];
        for (int k = 0; k < n; k++) {
            io[k].d = dist_group_rank(g, k);
            io[k].full = k == 0 ? full : NULL;
            pthread_create(&t[k], NULL, rank_main, &io[k]);
        }
        for (int k = 0; k < n; k++)
            pthread_join(t[k], NULL);
        for (int k = 0; k < n; k++) {
            for (int c = 0; c < 5; c++)
                assert_int_equal(io[k].rc[c], 0);
            for (int i = 0; i < N; i++) {
                /* The sum in rank order, exactly; in buckets too. */
                float want = 0.1f + (float)i;
                for (int r = 1; r < n; r++)
                    want += (float)(r + 1) * 0.1f + (float)i;
                assert_true(io[k].f[i] == want);
                if (i >= 100 && i < 300)
                    assert_true(io[k].b[i] == (float)(k + 1) * 0.1f + (float)i);
                else
                    assert_true(io[k].b[i] == want);
            }
            for (int i = 0; i < 3; i++) {
                double lo = INFINITY, hi = -INFINITY;
                for (int r = 0; r < n; r++) {
                    double v = (double)(r * 7 % 5) + i;
                    lo = v < lo ? v : lo;
                    hi = v > hi ? v : hi;
                }
                assert_true(io[k].lo[i] == lo && io[k].hi[i] == hi);
            }
        }
        /* Shares: contiguous, in rank order, sizes differing by at most one. */
        size_t next = 0;
        for (int r = 0; r < n; r++) {
            size_t first, count;
            dist_shard(N, n, r, &first, &count);
            assert_int_equal(first, next);
            assert_true(count == (size_t)(N / n) || count == (size_t)(N / n + 1));
            next = first + count;
            for (size_t i = first; i < first + count; i++) {
                for (int k = 0; k < n; k++)
                    assert_true(io[k].shard[i] == (float)r);
                assert_true(full[i] == (float)(1000 * r) + (float)(i - first));
            }
        }
        assert_int_equal(next, N);
        free(full);
        free(io);
        dist_group_free(g);
    }
}

/* A rank's device when the job names none: its place among the machine's
 * ranks (a thread group's all on this one) over the devices there. */
static void test_local_device(void **state)
{
    (void)state;
    char err[256];
    dist_group *g = dist_group_new(3, 10, err, sizeof err);
    assert_non_null(g);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(dist_local_device(dist_group_rank(g, k), 2), k % 2);
        assert_int_equal(dist_local_device(dist_group_rank(g, k), 8), k);
        assert_int_equal(dist_local_device(dist_group_rank(g, k), 0), 0);
    }
    assert_int_equal(dist_local_device(NULL, 4), 0);
    dist_group_free(g);
}

/* The world's size, from whichever launcher started this process: Open
 * MPI's mpirun, a PMIx or PMI launcher (MPICH's, srun --mpi=pmix), or
 * srun itself; 1 when none did or a value is not a size. */
static void test_world_from_launchers(void **state)
{
    (void)state;
    static const char *const names[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "SLURM_NTASKS"};
    for (size_t i = 0; i < 4; i++)
        unsetenv(names[i]);
    assert_int_equal(dist_world_from_env(), 1);
    for (size_t i = 0; i < 4; i++) {
        setenv(names[i], "4", 1);
        assert_int_equal(dist_world_from_env(), 4);
        unsetenv(names[i]);
    }
    /* mpirun's own wins over a Slurm allocation's task count around it. */
    setenv("SLURM_NTASKS", "8", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    assert_int_equal(dist_world_from_env(), 2);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    const char *bad[] = {"", "0", "-2", "3x", "99999999999"};
    for (size_t i = 0; i < 5; i++) {
        setenv("SLURM_NTASKS", bad[i], 1);
        assert_int_equal(dist_world_from_env(), 1);
    }
    unsetenv("SLURM_NTASKS");
}

static void *cuda_main(void *arg)
{
    rank_io *io = arg;
    io->rc[0] = dist_use_cuda(io->d, NULL, 0, NULL, io->err, sizeof io->err);
    double one = 1;
    io->rc[1] = dist_allreduce_f64(io->d, &one, 1, DIST_SUM, "after", io->err + 320, sizeof io->err - 320);
    return NULL;
}

/* Ranks on CUDA devices of a module without NCCL: each says so, and none
 * waits for the others at the next collective. */
static void test_cuda_without_nccl(void **state)
{
    (void)state;
    char err[256];
    dist_group *g = dist_group_new(3, 30, err, sizeof err);
    assert_non_null(g);
    rank_io *io = calloc(3, sizeof *io);
    pthread_t t[3];
    for (int k = 0; k < 3; k++) {
        io[k].d = dist_group_rank(g, k);
        pthread_create(&t[k], NULL, cuda_main, &io[k]);
    }
    for (int k = 0; k < 3; k++)
        pthread_join(t[k], NULL);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(io[k].rc[0], -1);
        assert_non_null(strstr(io[k].err, "CUDA module was built without it"));
        assert_int_equal(io[k].rc[1], -1);
    }
    free(io);
    dist_group_free(g);
}

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
    dist *d;
    int rc;
    double took;
    char err[640];
} waiter;

static void *wait_main(void *arg)
{
    waiter *w = arg;
    double x = 1, t0 = mono();
    w->rc = dist_allreduce_f64(w->d, &x, 1, DIST_SUM, "the step's exchange", w->err, sizeof w->err);
    w->took = mono() - t0;
    return NULL;
}

static void count_beat(void *user)
{
    (*(int *)user)++;
}

static void test_deadline_and_giving_up(void **state)
{
    (void)state;
    char err[256];
    /* Rank 2 never comes: ranks 0 and 1 fail at the deadline, naming it. */
    dist_group *g = dist_group_new(3, 0.3, err, sizeof err);
    waiter w[2] = {{.d = dist_group_rank(g, 0)}, {.d = dist_group_rank(g, 1)}};
    pthread_t t[2];
    for (int k = 0; k < 2; k++)
        pthread_create(&t[k], NULL, wait_main, &w[k]);
    for (int k = 0; k < 2; k++)
        pthread_join(t[k], NULL);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(w[k].rc, -1);
        assert_non_null(strstr(w[k].err, "the step's exchange did not complete within 0.3 s"));
        assert_true(w[k].took >= 0.29 && w[k].took < 3);
    }
    /* Failed for good: a later collective fails at once. */
    double x = 0;
    double t0 = mono();
    assert_int_equal(dist_allreduce_f64(dist_group_rank(g, 2), &x, 1, DIST_SUM, "late", err, sizeof err), -1);
    assert_true(mono() - t0 < 0.1);
    dist_group_free(g);

    /* Rank 1 gives up while rank 0 waits: rank 0 fails at once with why. */
    g = dist_group_new(2, 30, err, sizeof err);
    waiter w0 = {.d = dist_group_rank(g, 0)};
    pthread_create(&t[0], NULL, wait_main, &w0);
    struct timespec ts = {0, 50000000};
    nanosleep(&ts, NULL);
    dist_fail(dist_group_rank(g, 1), "cannot write the checkpoint");
    pthread_join(t[0], NULL);
    assert_int_equal(w0.rc, -1);
    assert_non_null(strstr(w0.err, "rank 1 of 2 gave up: cannot write the checkpoint"));
    assert_true(w0.took < 5);
    dist_group_free(g);

    /* Ranks at different collectives: both fail, and no buffer is
     * written past its end (ASan would say). */
    g = dist_group_new(2, 30, err, sizeof err);
    waiter a = {.d = dist_group_rank(g, 0)};
    pthread_create(&t[0], NULL, wait_main, &a);
    double three[3] = {1, 2, 3};
    assert_int_equal(dist_allreduce_f64(dist_group_rank(g, 1), three, 3, DIST_SUM, "another", err, sizeof err), -1);
    pthread_join(t[0], NULL);
    assert_int_equal(a.rc, -1);
    assert_non_null(strstr(err, "the ranks are out of step"));
    assert_non_null(strstr(a.err, "the ranks are out of step"));
    assert_true(three[0] == 1 && three[1] == 2 && three[2] == 3);
    dist_group_free(g);

    /* A rank that waits beats about once a second: alive to a watchdog. */
    g = dist_group_new(2, 2.5, err, sizeof err);
    int beats = 0;
    dist_set_beat(dist_group_rank(g, 0), count_beat, &beats);
    waiter lone = {.d = dist_group_rank(g, 0)};
    wait_main(&lone);
    assert_int_equal(lone.rc, -1);
    assert_true(beats >= 2 && beats <= 3);
    dist_group_free(g);

    assert_null(dist_group_new(DIST_GROUP_MAX + 1, 1, err, sizeof err));
    assert_non_null(strstr(err, "a group has 1 to"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collectives),
        cmocka_unit_test(test_deadline_and_giving_up),
        cmocka_unit_test(test_cuda_without_nccl),
        cmocka_unit_test(test_local_device),
        cmocka_unit_test(test_world_from_launchers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
