/* alloc_internal.h — what the files of libgradd-alloc share: the one
 * process-wide state (a process has one allocator, as PyTorch has one),
 * and the functions between alloc.c, alloc_stats.c and the backends.
 */
#ifndef GRADD_ALLOC_INTERNAL_H
#define GRADD_ALLOC_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "gradd_alloc.h"
#include "pool/dev.h"
#include "pool/pool.h"
#include "pool/pool_shm.h"

#ifndef GRADD_ALLOC_HAVE_CUDA
#define GRADD_ALLOC_HAVE_CUDA 0
#endif

#define ALLOC_MAX_DEVICES 16
/* While the pool is in use, the page lags it by at most about this much,
 * and a trim request waits at most this long for the library to notice
 * it.  After ALLOC_QUIET_TICKS ticks with no allocation, free or request,
 * the helper ticks every ALLOC_IDLE_TICK_NS instead: an idle program's
 * thread wakes 50 times a second rather than 500, and a trim or reclaim
 * still gets its answer well within the daemon's 150 ms wait. */
#define ALLOC_TICK_NS ((uint64_t)2000000)
#define ALLOC_IDLE_TICK_NS ((uint64_t)20000000)
#define ALLOC_QUIET_TICKS 500
#define ALLOC_FORKED_MSG                                                                          \
    "gradd allocator: not usable in a child forked from the process that started it (CUDA cannot " \
    "be used across fork)"

typedef struct {
    pthread_mutex_t lock; /* reading the environment, making pools */
    _Atomic int ready;    /* 0: not yet; 1: the environment is read; -1: it was bad */
    _Atomic int forked;   /* set in a fork child, which then refuses */
    char init_error[256];

    bool cpu, expandable;
    size_t cpu_capacity, cpu_external;
    uint64_t env_budget;
    pool_config pool_cfg; /* the daemon's [pool] policies, from the environment */
    uint32_t job;
    uint64_t reclaim_ns;

    dev *devs[ALLOC_MAX_DEVICES];
    pool *_Atomic pools[ALLOC_MAX_DEVICES];
    uint64_t budget_applied[ALLOC_MAX_DEVICES]; /* the limit each pool has, as given */

    /* The page, its device (the first one used: a program job sees one
     * device) and the helper thread that keeps it. */
    pool_shm_page *pg;
    int page_device;
    int event_fd;
    pthread_t helper;
    bool helper_running;
    _Atomic int helper_stop;
    _Atomic int dirty;         /* something changed since the last publish */
    _Atomic uint64_t shared_applied; /* the page's shared word, as the device has it */
    pthread_mutex_t shared_lock;     /* one applier at a time, so the newest word wins */
    unsigned ticks;
    pthread_mutex_t pub_lock;  /* one publisher at a time; guards pub_stats */
    pool_stats pub_stats;
} alloc_state;

extern alloc_state alloc_g;

void alloc_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Device `device`'s pool; made at its first use when create is set.  NULL
 * with the error set (bad device, fork child, bad environment). */
pool *alloc_pool(int device, bool create);
/* Publish a snapshot to the page now (no page: nothing). */
void alloc_publish(void);

#if GRADD_ALLOC_HAVE_CUDA
/* dev_cuda.c, compiled into the library: the program's own CUDA context. */
extern const dev_cuda_module gradd_cuda_module_v1;
static inline dev_status alloc_cuda_create(int device, dev **out)
{
    return gradd_cuda_module_v1.create(device, out);
}
#else
static inline dev_status alloc_cuda_create(int device, dev **out)
{
    (void)device;
    *out = NULL;
    return DEV_ERR_UNSUPPORTED;
}
#endif

#endif
