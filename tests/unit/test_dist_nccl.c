/* test_dist_nccl.c — the NCCL path of dist.h (daemon/dist/dist_nccl.c, as
 * the CUDA module carries it) over fake_nccl.c, with ranks as threads:
 * joining with rank 0's id; the all-reduce, the sharded parameters'
 * allgather and started buckets give every rank the sums in rank order;
 * a rank that never comes fails the others' wait at the rank_timeout and
 * aborts their communicator; a rank that gives up fails them at once. */
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

#include <cuda_runtime.h>

#include "dist/dist_internal.h"

extern const dist_nccl_ops gradd_dist_nccl_v1;

#define N 1003

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
    dist *d;
    int mode; /* 0 every collective; 1 joins and never comes again; 2 joins and gives up */
    /* What each collective left, read as soon as it returned. */
    float f[N], g[N], b[N], fs[N], gs[N], bs[N];
    int rc[4];
    double took;
    char err[640];
} rank_io;

static float value(int k, int i)
{
    return (float)(k + 1) * 0.1f + (float)i;
}

static void *rank_main(void *arg)
{
    rank_io *io = arg;
    dist *d = io->d;
    int k = dist_rank(d);
    cudaStream_t work;
    cudaStreamCreateWithFlags(&work, cudaStreamNonBlocking);
    io->rc[0] = dist_use_cuda(d, &gradd_dist_nccl_v1, k, work, io->err, sizeof io->err);
    if (io->rc[0] == 0 && io->mode == 2)
        dist_fail(d, "this rank gave up");
    if (io->rc[0] == 0 && io->mode == 0) {
        for (int i = 0; i < N; i++)
            io->f[i] = io->b[i] = value(k, i);
        double t0 = mono();
        io->rc[1] = dist_allreduce_f32(d, io->f, N, "the sum", io->err, sizeof io->err);
        io->took = mono() - t0;
        memcpy(io->fs, io->f, sizeof io->f);
        /* The allgather: each rank's share holds its rank. */
        size_t first, count;
        dist_shard(N, dist_size(d), k, &first, &count);
        for (size_t i = 0; i < N; i++)
            io->g[i] = i >= first && i < first + count ? (float)k : -1.0f;
        if (io->rc[1] == 0)
            io->rc[2] = dist_allgather_f32(d, io->g, N, "the allgather", io->err, sizeof io->err);
        memcpy(io->gs, io->g, sizeof io->g);
        /* Buckets from the top down, [100, 300) left as it is. */
        if (io->rc[1] == 0 && io->rc[2] == 0) {
            io->rc[3] = dist_allreduce_start(d, io->b + 600, N - 600, "buckets", io->err, sizeof io->err);
            dist_progress(d);
            io->rc[3] |= dist_allreduce_start(d, io->b + 300, 300, "buckets", io->err, sizeof io->err);
            io->rc[3] |= dist_allreduce_start(d, io->b, 100, "buckets", io->err, sizeof io->err);
            io->rc[3] |= dist_allreduce_finish(d, "buckets", io->err, sizeof io->err);
        }
        memcpy(io->bs, io->b, sizeof io->b);
    }
    /* A rank that never comes again stays until the others have given up
     * on it: its leaving is not what they are to notice. */
    if (io->mode == 1) {
        struct timespec ts = {1, 500000000};
        nanosleep(&ts, NULL);
    }
    dist_release_cuda(d, io->mode != 0 || io->rc[1] || io->rc[2] || io->rc[3]);
    cudaStreamDestroy(work);
    return NULL;
}

static rank_io *run_group(int n, double timeout_s, const int *modes)
{
    char err[256];
    dist_group *g = dist_group_new(n, timeout_s, err, sizeof err);
    assert_non_null(g);
    rank_io *io = calloc((size_t)n, sizeof *io);
    pthread_t t[8];
    for (int k = 0; k < n; k++) {
        io[k].d = dist_group_rank(g, k);
        io[k].mode = modes ? modes[k] : 0;
        pthread_create(&t[k], NULL, rank_main, &io[k]);
    }
    for (int k = 0; k < n; k++)
        pthread_join(t[k], NULL);
    dist_group_free(g);
    return io;
}

static void test_collectives(void **state)
{
    (void)state;
    for (int n = 1; n <= 3; n++) {
        rank_io *io = run_group(n, 10, NULL);
        for (int k = 0; k < n; k++) {
            for (int c = 0; c < 4; c++)
                if (io[k].rc[c])
                    fail_msg("%d ranks, rank %d, step %d: %s", n, k, c, io[k].err);
            for (int i = 0; i < N; i++) {
                float want = value(0, i);
                for (int r = 1; r < n; r++)
                    want += value(r, i);
                assert_true(io[k].fs[i] == want);
                assert_true(io[k].bs[i] == (i >= 100 && i < 300 ? value(k, i) : want));
            }
            for (int r = 0; r < n; r++) {
                size_t first, count;
                dist_shard(N, n, r, &first, &count);
                for (size_t i = first; i < first + count; i++)
                    assert_true(io[k].gs[i] == (float)r);
            }
        }
        free(io);
    }
}

/* Rank 2 joins but never comes to the sum: ranks 0 and 1 fail at the
 * timeout, saying which collective and how long. */
static void test_rank_that_never_comes(void **state)
{
    (void)state;
    const int modes[3] = {0, 0, 1};
    rank_io *io = run_group(3, 0.5, modes);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(io[k].rc[0], 0);
        assert_int_equal(io[k].rc[1], -1);
        if (!strstr(io[k].err, "the sum did not complete within 0.5 s"))
            fail_msg("rank %d: %s", k, io[k].err);
        assert_true(io[k].took >= 0.45 && io[k].took < 5);
    }
    free(io);
}

/* Rank 1 gives up after joining: rank 0's sum fails at once, long before
 * its 30 s timeout, with rank 1's reason. */
static void test_rank_that_gives_up(void **state)
{
    (void)state;
    const int modes[2] = {0, 2};
    double t0 = mono();
    rank_io *io = run_group(2, 30, modes);
    /* Failed joining, or (mostly) at the sum. */
    assert_true(io[0].rc[0] == -1 || io[0].rc[1] == -1);
    if (!strstr(io[0].err, "this rank gave up"))
        fail_msg("rank 0: %s", io[0].err);
    assert_true(mono() - t0 < 5);
    free(io);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collectives),
        cmocka_unit_test(test_rank_that_never_comes),
        cmocka_unit_test(test_rank_that_gives_up),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
