/* pool_shm.h — the shared-memory page between gradd and a program's
 * allocator library (alloc/), one page per program job.
 *
 * The daemon creates the page (pool_shm_create: a sealed memfd of
 * POOL_SHM_SIZE bytes) and hands the fd to the program, which finds it in
 * GRADD_POOL_FD.  Both map it shared.  The program is untrusted: the
 * daemon never takes a lock in the page, never follows a value in it as a
 * pointer or index, and re-checks the header on every read.  The seals
 * forbid shrinking it, so touching the mapping never raises SIGBUS.
 *
 * Words, each owned by one side (the other only reads it):
 *   header      magic, version, size, figure count: the creator, once.
 *   budget      the daemon: the job's [memory] limit in bytes (0: none),
 *               enforced by the library on every allocation.
 *   shared      the daemon, on a simulated device only: what gradd's
 *               other processes hold of it (the daemon's pool and the
 *               other programs' reserved bytes), which the library's copy
 *               of the device counts as taken (dev_cpu_set_shared).  A
 *               GPU needs no such word: its driver knows.
 *   statistics  the library: the pool's figures (pool_stats) under a
 *               seqlock.  The writer makes seq odd, writes, makes it even;
 *               a reader copies, and keeps the copy only if seq was even
 *               and unchanged.  A reader gives up after a timeout, so a
 *               writer stopped mid-write (killed, or hostile) cannot hang
 *               it.
 *
 * Trim: the daemon sets trim_target and trim_why (a pool_trim_reason)
 * and bumps trim_req; the library's helper thread, within about 2 ms,
 * trims (target bytes, 0: all it caches), publishes, and stores
 * trim_ack = trim_req.  A process stopped (SIGSTOP, a debugger) trims
 * nothing, and trim_ack says so.
 *
 * Reclaim: a library about to fail an allocation for want of device
 * memory (not for its own budget) stores need_bytes, bumps need_seq and
 * writes 1 to the eventfd in GRADD_POOL_EVENTFD when it has one (the
 * daemon may also poll need_seq).  The daemon has the other jobs on the
 * device trim (and, on a simulated device, updates shared), then stores
 * reclaim_ack = need_seq.  The library waits for
 * that for at most GRADD_RECLAIM_MS (default 200 ms), retries once, and
 * only then fails.  need_bytes stays as the last request; it is advice,
 * not a claim.
 */
#ifndef GRADD_POOL_SHM_H
#define GRADD_POOL_SHM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pool.h"

#define POOL_SHM_MAGIC 0x50445247u /* "GRDP" little-endian */
#define POOL_SHM_VERSION 2u
#define POOL_SHM_SIZE 4096u
/* Statistics words: 9 figures × 3 pools × 4 values, 11 counters, 6 device
 * and configuration words, 2 × the tags, 2 timeline counters. */
#define POOL_SHM_NFIG (9 * 3 * 4 + 11 + 6 + 2 * POOL_TAG_COUNT + 2)

typedef struct pool_shm_page {
    uint32_t magic, version, size, nfig;
    /* written by the daemon */
    _Atomic uint64_t budget;
    _Atomic uint64_t trim_req, trim_target, trim_why;
    _Atomic uint64_t reclaim_ack;
    _Atomic uint64_t shared;
    /* written by the library */
    _Atomic uint64_t pid;
    _Atomic uint64_t trim_ack;
    _Atomic uint64_t need_bytes, need_seq;
    _Atomic uint64_t seq;
    _Atomic uint64_t fig[POOL_SHM_NFIG];
} pool_shm_page;

_Static_assert(sizeof(pool_shm_page) <= POOL_SHM_SIZE, "the page layout must fit its page");

/* ---- both sides ----------------------------------------------------------- */

/* A sealed memfd holding a fresh page (header written, everything else 0),
 * close-on-exec.  The fd, or -1 with errno set. */
int pool_shm_create(void);
/* Map the page behind fd, read-write and shared, after checking that it is
 * a memfd of exactly POOL_SHM_SIZE bytes sealed against shrinking and
 * growing, with a header this version reads.  NULL with a reason in err
 * (naming the fd) otherwise. */
pool_shm_page *pool_shm_map(int fd, char *err, size_t err_len);
void pool_shm_unmap(pool_shm_page *pg);

/* ---- the daemon's side ------------------------------------------------------ */

/* A consistent snapshot of the statistics into out (njobs = 0: the page
 * carries no job rows; per-job figures are the daemon's to fill).  The
 * figures are the program's word: only their arithmetic is made sane
 * (current = allocated - freed, peak >= current, largest free block within
 * what is cached, fragmentation recomputed in [0, 1]).  0; or -1 with
 * errno EPROTO when the header changed, ETIMEDOUT when no consistent copy
 * came within timeout_ns. */
int pool_shm_read(const pool_shm_page *pg, pool_stats *out, uint64_t timeout_ns);
void pool_shm_set_budget(pool_shm_page *pg, uint64_t bytes);
void pool_shm_set_shared(pool_shm_page *pg, uint64_t bytes);
/* Ask for a trim of target bytes (0: everything cached) for reason why;
 * returns the request's number, done once pool_shm_trim_done says so. */
uint64_t pool_shm_request_trim(pool_shm_page *pg, uint64_t target, pool_trim_reason why);
bool pool_shm_trim_done(const pool_shm_page *pg, uint64_t req);
/* A reclaim request not yet answered: its number (0: none) and bytes. */
uint64_t pool_shm_reclaim_pending(const pool_shm_page *pg, uint64_t *bytes);
void pool_shm_reclaim_answer(pool_shm_page *pg, uint64_t seq);

/* ---- the library's side ----------------------------------------------------- */

uint64_t pool_shm_shared(const pool_shm_page *pg);
/* Publish a snapshot under the seqlock.  One writer at a time. */
void pool_shm_publish(pool_shm_page *pg, const pool_stats *s);
/* The trim the daemon asks for: its number (0: none pending), target and
 * reason (POOL_TRIM_REQUEST where the word is out of range). */
uint64_t pool_shm_trim_pending(const pool_shm_page *pg, uint64_t *target, pool_trim_reason *why);
void pool_shm_trim_ack(pool_shm_page *pg, uint64_t req);
/* Ask the daemon to reclaim bytes from other jobs; returns the request's
 * number, answered once pool_shm_reclaim_answered says so. */
uint64_t pool_shm_reclaim_ask(pool_shm_page *pg, uint64_t bytes);
bool pool_shm_reclaim_answered(const pool_shm_page *pg, uint64_t seq);

/* The statistics as page words and back (exposed for the tests). */
void pool_shm_pack(const pool_stats *s, uint64_t *fig);
void pool_shm_unpack(const uint64_t *fig, pool_stats *out);

#endif
