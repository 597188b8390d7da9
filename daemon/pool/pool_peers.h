/* pool_peers.h — the program jobs' pools on one device, as the daemon sees
 * them through their shared pages (pool_shm.h), and what the daemon does
 * with them: read their statistics, trim them, and reclaim their caches
 * for another job on the device before that job's allocation fails.
 *
 * A program's pool lives in the program's process (libgradd-alloc); the
 * daemon holds the page's fd and an eventfd the program writes when it
 * asks for a reclaim.  One thread per device with programs answers those
 * requests, so neither the event loop nor a job thread waits on a
 * program, and every 100 ms it
 *   - trims a program that made no allocation or free for [pool]
 *     idle_trim (reason idle), once per idle spell;
 *   - on a simulated device, tells each process what the others hold
 *     (the pages' shared word and dev_cpu_set_shared), so that several
 *     processes' copies of one device add up to one device;
 *   - marks what changed in each program's pool on the device's timeline
 *     under the program's job: segments mapped and unmapped, trims, OOMs.
 *
 * Pages are the programs' to write: nothing here trusts a figure beyond
 * showing it, and a program that never answers costs a bounded wait.
 */
#ifndef GRADD_POOL_PEERS_H
#define GRADD_POOL_PEERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dev.h"
#include "pool.h"

#define POOL_PEERS_MAX 64
/* How long the daemon waits for the programs' trim answers in a reclaim:
 * less than a program's own wait for the daemon's answer (200 ms). */
#define POOL_PEERS_RECLAIM_NS ((uint64_t)150000000)

typedef struct pool_peers pool_peers;

/* One program's pool as its page shows it. */
typedef struct {
    uint32_t job;
    uint64_t pid;      /* the page's word: the process that mapped it (0: none yet) */
    bool live;         /* the page read consistently */
    uint64_t reclaims; /* reclaims the daemon answered for it */
    pool_stats stats;  /* njobs = 0 */
} pool_peer_view;

/* For the device d and the daemon's own pool on it.  idle_trim_ms: [pool]
 * idle_trim (0: off).  NULL when out of memory. */
pool_peers *pool_peers_create(dev *d, pool *own, uint64_t idle_trim_ms);
/* Stops the thread; every page still added is dropped. */
void pool_peers_destroy(pool_peers *pp);

/* Watch a program job's page.  page_fd and event_fd (-1: none) are dup'd;
 * the caller keeps its own.  budget: the job's [memory] limit (0: none),
 * written to the page.  0, or -1 with err (the page is not one, too many
 * programs, no thread). */
int pool_peers_add(pool_peers *pp, uint32_t job, int page_fd, int event_fd, uint64_t budget, char *err,
                   size_t err_len);
/* Stop watching; its memory stops counting on a simulated device. */
void pool_peers_remove(pool_peers *pp, uint32_t job);

/* The programs' pools, in the order they were added, as a malloc'd array
 * of *n views (the caller frees it); NULL with *n = 0 when there are none
 * or no memory for them. */
pool_peer_view *pool_peers_read(pool_peers *pp, size_t *n);
/* One job's view; false when the job has no page here. */
bool pool_peers_read_job(pool_peers *pp, uint32_t job, pool_peer_view *out);
/* Have every program give back its whole cache (gradctl trim), waiting at
 * most timeout_ns for their answers.  Returns the bytes their reserved
 * figures dropped by; *answered counts those that answered. */
size_t pool_peers_trim(pool_peers *pp, uint64_t timeout_ns, size_t *answered);
/* The reserved bytes of every program's pool on the device, and in
 * *allocated (may be NULL) their allocated bytes. */
size_t pool_peers_reserved(pool_peers *pp, size_t *allocated);
/* How many programs are watched now. */
size_t pool_peers_count(pool_peers *pp);

/* The hook for the daemon's own pool (pool_set_reclaim): the programs on
 * the device give back their caches, for an engine job's allocation. */
bool pool_peers_reclaim_hook(void *pp, size_t bytes, uint32_t job);

#endif
