/* dist_threads.c — ranks as threads of one process (dist.h's dist_group):
 * a job over several devices of this server, one thread per device.
 *
 * A collective is two or three rounds of a barrier: every rank posts its
 * buffer and arrives; then each sums (or copies) its own slice across all
 * the ranks' buffers, so the work is spread over the threads and every
 * rank ends with the same values, summed in rank order; a last barrier
 * keeps any rank from going on (and writing its buffer) before all slices
 * are done.  A barrier has the group's deadline, and a rank that gives up
 * (dist_fail) or times out fails every rank's wait at once. */
#include "dist_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct dist_group {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int n;
    int arrived;
    uint64_t round;
    bool failed;
    char why[600];
    void *bufs[DIST_GROUP_MAX];
    /* What each rank posted: the ranks of a job call the same collectives
     * in the same order, with the same sizes; one that does not would
     * write past another's buffer. */
    const char *whats[DIST_GROUP_MAX];
    size_t ns[DIST_GROUP_MAX];
    dist ranks[DIST_GROUP_MAX];
};

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

dist_group *dist_group_new(int n, double timeout_s, char *err, size_t err_len)
{
    if (n < 1 || n > DIST_GROUP_MAX) {
        snprintf(err, err_len, "%d ranks: a group has 1 to %d", n, DIST_GROUP_MAX);
        return NULL;
    }
    dist_group *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, err_len, "out of host memory");
        return NULL;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->cond, &ca);
    pthread_condattr_destroy(&ca);
    g->n = n;
    for (int k = 0; k < n; k++) {
        dist *d = &g->ranks[k];
        d->rank = k;
        d->size = d->local_size = n;
        d->local_rank = k;
        d->timeout_s = timeout_s > 0 ? timeout_s : 300;
        d->group = g;
        snprintf(d->name, sizeof d->name, "rank %d of %d", k, n);
    }
    return g;
}

dist *dist_group_rank(dist_group *g, int k)
{
    return k >= 0 && k < g->n ? &g->ranks[k] : NULL;
}

void dist_group_free(dist_group *g)
{
    if (!g)
        return;
    for (int k = 0; k < g->n; k++) {
        free(g->ranks[k].pending_buf);
        free(g->ranks[k].pending_n);
        free(g->ranks[k].pending_req);
    }
    pthread_cond_destroy(&g->cond);
    pthread_mutex_destroy(&g->lock);
    free(g);
}

/* Everyone here, or -1 with err: the group failed, or the deadline passed
 * (which fails it for the others too).  Lock held. */
static int barrier_locked(dist *d, const char *what, char *err, size_t err_len)
{
    dist_group *g = d->group;
    if (!g->failed) {
        uint64_t round = g->round;
        if (++g->arrived == g->n) {
            g->arrived = 0;
            g->round++;
            pthread_cond_broadcast(&g->cond);
            return 0;
        }
        double deadline = mono_s() + d->timeout_s;
        while (g->round == round && !g->failed) {
            /* Woken at least once a second, for the beat. */
            double now = mono_s(), until = now + 1 < deadline ? now + 1 : deadline;
            struct timespec dl = {(time_t)until, (long)((until - (double)(time_t)until) * 1e9)};
            int rc = pthread_cond_timedwait(&g->cond, &g->lock, &dl);
            if (g->round != round || g->failed)
                break;
            if (rc == ETIMEDOUT && mono_s() >= deadline) {
                g->failed = true;
                dist_timed_out(d, what, g->why, sizeof g->why);
                pthread_cond_broadcast(&g->cond);
            } else if (d->beat) {
                pthread_mutex_unlock(&g->lock);
                d->beat(d->beat_user);
                pthread_mutex_lock(&g->lock);
            }
        }
        if (g->round != round)
            return 0;
    }
    snprintf(err, err_len, "%s", g->why);
    return -1;
}

static int barrier(dist *d, const char *what, char *err, size_t err_len)
{
    pthread_mutex_lock(&d->group->lock);
    int rc = barrier_locked(d, what, err, err_len);
    pthread_mutex_unlock(&d->group->lock);
    return rc;
}

/* Post buf (n elements, for `what`) as this rank's and wait for all the
 * others' posts; -1 as well when they are not at the same collective. */
static int post(dist *d, void *buf, size_t n, const char *what, char *err, size_t err_len)
{
    dist_group *g = d->group;
    pthread_mutex_lock(&g->lock);
    g->bufs[d->rank] = buf;
    g->whats[d->rank] = what;
    g->ns[d->rank] = n;
    int rc = barrier_locked(d, what, err, err_len);
    for (int k = 0; rc == 0 && k < g->n; k++) {
        if (g->ns[k] == n && strcmp(g->whats[k], what) == 0)
            continue;
        /* Every rank sees the same posts and fails alike. */
        snprintf(err, err_len, "the ranks are out of step: rank %d at %s (%zu values), rank %d at %s (%zu)", d->rank,
                 what, n, k, g->whats[k], g->ns[k]);
        rc = -1;
    }
    pthread_mutex_unlock(&g->lock);
    return rc;
}

/* Elements [first, first + count) of every rank's buffer: reduced in rank
 * order, then written back to each. */
static void reduce_f32(dist_group *g, size_t first, size_t count, dist_op op)
{
    for (size_t i = first; i < first + count; i++) {
        float a = ((float *)g->bufs[0])[i];
        for (int k = 1; k < g->n; k++) {
            float v = ((float *)g->bufs[k])[i];
            a = op == DIST_SUM ? a + v : op == DIST_MIN ? (v < a ? v : a) : (v > a ? v : a);
        }
        for (int k = 0; k < g->n; k++)
            ((float *)g->bufs[k])[i] = a;
    }
}

static void reduce_f64(dist_group *g, size_t first, size_t count, dist_op op)
{
    for (size_t i = first; i < first + count; i++) {
        double a = ((double *)g->bufs[0])[i];
        for (int k = 1; k < g->n; k++) {
            double v = ((double *)g->bufs[k])[i];
            a = op == DIST_SUM ? a + v : op == DIST_MIN ? (v < a ? v : a) : (v > a ? v : a);
        }
        for (int k = 0; k < g->n; k++)
            ((double *)g->bufs[k])[i] = a;
    }
}

int dist_thr_allreduce(dist *d, void *buf, size_t n, bool f64, dist_op op, const char *what, char *err,
                       size_t err_len)
{
    dist_group *g = d->group;
    if (post(d, buf, n, what, err, err_len) != 0)
        return -1;
    size_t first, count;
    dist_shard(n, g->n, d->rank, &first, &count);
    if (f64)
        reduce_f64(g, first, count, op);
    else
        reduce_f32(g, first, count, op);
    return barrier(d, what, err, err_len);
}

int dist_thr_allgather_f32(dist *d, float *buf, size_t n, const char *what, char *err, size_t err_len)
{
    dist_group *g = d->group;
    if (post(d, buf, n, what, err, err_len) != 0)
        return -1;
    size_t first, count;
    dist_shard(n, g->n, d->rank, &first, &count);
    for (int k = 0; k < g->n; k++)
        if (k != d->rank)
            memcpy((float *)g->bufs[k] + first, buf + first, count * sizeof(float));
    return barrier(d, what, err, err_len);
}

int dist_thr_gather_f32(dist *d, const float *part, float *full, size_t n, const char *what, char *err,
                        size_t err_len)
{
    dist_group *g = d->group;
    if (post(d, d->rank == 0 ? full : NULL, n, what, err, err_len) != 0)
        return -1;
    size_t first, count;
    dist_shard(n, g->n, d->rank, &first, &count);
    memcpy((float *)g->bufs[0] + first, part, count * sizeof(float));
    return barrier(d, what, err, err_len);
}

int dist_thr_bcast(dist *d, void *buf, size_t bytes, const char *what, char *err, size_t err_len)
{
    dist_group *g = d->group;
    if (post(d, buf, bytes, what, err, err_len) != 0)
        return -1;
    if (d->rank != 0)
        memcpy(buf, g->bufs[0], bytes);
    return barrier(d, what, err, err_len);
}

int dist_thr_given_up(dist *d, char *why, size_t why_len)
{
    dist_group *g = d->group;
    pthread_mutex_lock(&g->lock);
    int failed = g->failed;
    if (failed)
        snprintf(why, why_len, "%s", g->why);
    pthread_mutex_unlock(&g->lock);
    return failed;
}

void dist_thr_fail(dist *d, const char *why)
{
    dist_group *g = d->group;
    pthread_mutex_lock(&g->lock);
    if (!g->failed) {
        g->failed = true;
        snprintf(g->why, sizeof g->why, "%s gave up: %s", d->name, why);
        pthread_cond_broadcast(&g->cond);
    }
    pthread_mutex_unlock(&g->lock);
}
