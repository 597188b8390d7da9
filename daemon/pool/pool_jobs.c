/* pool_jobs.c — the job table: one row of live statistics per job that
 * holds memory or a limit (current, peak, limit, need, and by tag), found
 * by job id, and the calls that set and clear a job's row.  pool_alloc
 * and pool_free charge and credit the rows themselves, on the hot path. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* for clock_gettime etc. under -std=c11 */
#endif
#include "pool_internal.h"

static void job_claim(pool *p, int slot, uint32_t job)
{
    pool_live_job *j = &p->live.jobs[slot];
    p->job_used[slot] = 1;
    p->job_id[slot] = job;
    POOL_ST(j->job, job);
    POOL_ST(j->current, 0);
    POOL_ST(j->peak, 0);
    POOL_ST(j->limit, 0);
    for (int t = 0; t < POOL_TAG_COUNT; t++) {
        POOL_ST(j->tag_current[t], 0);
        POOL_ST(j->tag_peak[t], 0);
    }
    POOL_ST(j->used, 1);
}

void pool_job_release_slot(pool *p, int slot)
{
    pool_live_job *j = &p->live.jobs[slot];
    p->job_used[slot] = 0;
    POOL_ST(j->used, 0);
    POOL_ST(j->job, 0);
    POOL_ST(j->peak, 0);
    POOL_ST(j->limit, 0);
    POOL_ST(j->need, 0);
}

int pool_job_slot(pool *p, uint32_t job, bool create)
{
    int s = p->last_job_slot;
    if (p->job_used[s] && p->job_id[s] == job)
        return s;
    for (int i = 0; i < POOL_MAX_JOBS; i++) {
        if (p->job_used[i] && p->job_id[i] == job) {
            p->last_job_slot = i;
            return i;
        }
    }
    if (!create)
        return -1;
    int free_slot = -1;
    for (int i = 0; i < POOL_MAX_JOBS && free_slot < 0; i++)
        if (!p->job_used[i])
            free_slot = i;
    /* Rows of jobs that ended without pool_job_forget are reused once they
     * hold nothing. */
    for (int i = 0; i < POOL_MAX_JOBS && free_slot < 0; i++) {
        pool_live_job *j = &p->live.jobs[i];
        if (POOL_LD(j->current) == 0 && POOL_LD(j->limit) == 0) {
            pool_job_release_slot(p, i);
            free_slot = i;
        }
    }
    if (free_slot < 0)
        return -1;
    job_claim(p, free_slot, job);
    p->last_job_slot = free_slot;
    return free_slot;
}

int pool_job_set_limit(pool *p, uint32_t job, size_t bytes)
{
    pthread_mutex_lock(&p->lock);
    pool_stats_begin(p);
    int s = pool_job_slot(p, job, true);
    if (s >= 0)
        POOL_ST(p->live.jobs[s].limit, bytes);
    pool_stats_end(p);
    pthread_mutex_unlock(&p->lock);
    return s >= 0 ? 0 : -1;
}

int pool_job_set_need(pool *p, uint32_t job, size_t bytes)
{
    pthread_mutex_lock(&p->lock);
    pool_stats_begin(p);
    int s = pool_job_slot(p, job, true);
    if (s >= 0)
        POOL_ST(p->live.jobs[s].need, bytes);
    pool_stats_end(p);
    pthread_mutex_unlock(&p->lock);
    return s >= 0 ? 0 : -1;
}

void pool_fit_begin(pool *p)
{
    pthread_mutex_lock(&p->fit_lock);
}

void pool_fit_end(pool *p)
{
    pthread_mutex_unlock(&p->fit_lock);
}

void pool_job_reset_peak(pool *p, uint32_t job)
{
    pthread_mutex_lock(&p->lock);
    pool_stats_begin(p);
    int s = pool_job_slot(p, job, false);
    if (s >= 0)
        POOL_ST(p->live.jobs[s].peak, POOL_LD(p->live.jobs[s].current));
    pool_stats_end(p);
    pthread_mutex_unlock(&p->lock);
}

void pool_job_forget(pool *p, uint32_t job)
{
    pthread_mutex_lock(&p->lock);
    pool_stats_begin(p);
    int s = pool_job_slot(p, job, false);
    if (s >= 0 && POOL_LD(p->live.jobs[s].current) == 0)
        pool_job_release_slot(p, s);
    pool_stats_end(p);
    pthread_mutex_unlock(&p->lock);
}
