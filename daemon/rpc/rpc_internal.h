/* rpc_internal.h — what the rpc*.c files share and nobody else sees: the
 * helpers every command uses, and the commands that rpc.c's table names.
 *
 * Layout of rpc/:
 *   rpc.c         the table from request body to command; errors, job info
 *   jobs.c        submit, list, job, cancel, remove, logs (who may read it)
 *   logs.c        logs: the stream of a job's log, its tail, following it
 *   pool.c        status, stats, trim, timeline: devices and their pools
 *   metrics.c     Prometheus text exposition
 *   watch.c       watch: a stream of one job's changes
 *   sample.c      sample: text from a job's model, generated off the loop
 *   test_hooks.c  test_pressure, test_alloc, test_hang (only with --test-hooks)
 *   procs.c       the processes on each device, for status
 *   report.c      report: a program job's micro-batch, from its own program
 *   history.c     history: finished jobs' accounting records, read off the loop
 *   hold.c        hold, release, requeue
 */
#ifndef GRADD_RPC_INTERNAL_H
#define GRADD_RPC_INTERNAL_H

#include "rpc.h"

#include <limits.h>

#include "jobs/queue.h"
#include "pool/pool.h"

struct job;

/* Bytes per chunk of an answer that comes in pieces (timeline, logs):
 * every frame stays far below any cap, whatever the whole is. */
#define RPC_CHUNK ((size_t)256 << 10)
/* A streamed answer (logs, list) sends its next frame only while less
 * than this is queued for the client: what a client that stops reading
 * costs the daemon is about two frames, however long the answer. */
#define RPC_STREAM_WINDOW RPC_CHUNK

/* Send msg as the answer's body: CASE names the body case (STATUS, STATS,
 * ...) and FIELD the Response's field for it (status, stats, ...).  The
 * envelope every answer shares, with this daemon's protocol version; it
 * evaluates to what call->send returns. */
#define RPC_SEND(c, CASE, FIELD, msg)                                                  \
    ((c)->send((c)->conn, &(Gradd__Response){                                          \
        .base = PROTOBUF_C_MESSAGE_INIT(&gradd__response__descriptor),                 \
        .version = WIRE_PROTOCOL_VERSION,                                              \
        .body_case = GRADD__RESPONSE__BODY_##CASE,                                     \
        .FIELD = (msg),                                                                \
    }))
/* Answer with an Error. */
void rpc_error(const rpc_call *c, Gradd__Error__Code code, const char *msg);

/* Whether the peer may act on what all users share: root, the daemon's own
 * user (who could stop it anyway) or [daemon] admin_group. */
bool rpc_peer_admin(const rpc_call *c);
/* rpc_peer_admin; for anyone else false, answered that `what` (e.g.
 * "trimming the pools") is for root and admin_group only. */
bool rpc_need_admin(const rpc_call *c, const char *what);

/* A JobInfo message and the storage its fields point into. */
typedef struct {
    Gradd__JobInfo msg;
    Gradd__TagUsage tags[POOL_TAG_COUNT];
    Gradd__TagUsage *tag_ptrs[POOL_TAG_COUNT];
    Gradd__DevicePart parts[JOBCFG_MAX_DEVICES];
    Gradd__DevicePart *part_ptrs[JOBCFG_MAX_DEVICES];
    char name[64], user[64], device[JOBCFG_MAX_DEVICES * 8], reason[1024], out_dir[PATH_MAX], job_file[PATH_MAX];
    char change_reason[16];
    char levers[320];
    char command[1024]; /* cut, as reason is, to keep a list frame small */
    uint32_t depends_on[QUEUE_AFTER_MAX];
    char waiting[256];  /* "held; waiting for " and QUEUE_AFTER_MAX ids */
    char on_end[1024], on_end_result[256]; /* likewise */
} rpc_job_store;

/* Fill st from j; the caller holds the queue lock. */
void rpc_job_info(gradd_ctx *ctx, const struct job *j, rpc_job_store *st);
/* rpc_job_info into a malloc'd store, for an answer about j, then the
 * queue lock (which the caller holds) released.  NULL, answered, when out
 * of memory. */
rpc_job_store *rpc_job_answer(const rpc_call *c, const struct job *j);

/* ---- the processes on a device (procs.c) --------------------------------- */

typedef struct rpc_procs rpc_procs;
/* A running job and the process it computes in. */
typedef struct {
    uint32_t job;
    pid_t pid;
} rpc_job_pid;
/* For one process, pid: its jobs are jobs[first .. first+n). */
typedef struct {
    pid_t pid;
    size_t first, n;
} rpc_proc_jobs;

/* Sort jobs by pid then id, and set each of out[0..nprocs)'s slice of its
 * jobs (out[k].pid given). */
void rpc_procs_match(rpc_job_pid *jobs, size_t njobs, rpc_proc_jobs *out, size_t nprocs);
/* Fill g's processes and process_note for device i of ctx, whose pool
 * holds pool_reserved; what they point into is returned (NULL: out of
 * memory, g untouched), to free with rpc_procs_free after the answer. */
rpc_procs *rpc_procs_fill(gradd_ctx *ctx, int i, uint64_t pool_reserved, Gradd__Device *g);
void rpc_procs_free(rpc_procs *p);
/* The name of uid (getpwuid_r), or its number. */
void rpc_user_name(uid_t uid, char *buf, size_t len);

/* ---- the commands, by file ---------------------------------------------- */

/* jobs.c */
void rpc_submit(const rpc_call *c, const Gradd__Request *req);
rpc_stream *rpc_list(const rpc_call *c, const Gradd__Request *req);
void rpc_job(const rpc_call *c, const Gradd__Request *req);
void rpc_cancel(const rpc_call *c, const Gradd__Request *req);
void rpc_remove(const rpc_call *c, const Gradd__Request *req);
rpc_stream *rpc_logs(const rpc_call *c, const Gradd__Request *req);
/* Job `id` with the queue locked, for what only its owner, root or the
 * admin group may do (`what`, e.g. "cancel it"); NULL, unlocked and
 * answered, for anyone else or no such job. */
struct job *rpc_owned_job(const rpc_call *c, uint32_t id, const char *what);
/* hold.c */
void rpc_hold(const rpc_call *c, const Gradd__Request *req);
void rpc_release(const rpc_call *c, const Gradd__Request *req);
void rpc_requeue(const rpc_call *c, const Gradd__Request *req);
/* logs.c: job id's log at path, its last `tail` lines (0: all), and with
 * follow what is written to it until the job ends; NULL once answered
 * with an error. */
rpc_stream *rpc_logs_stream(const rpc_call *c, uint32_t id, const char *path, bool follow, uint32_t tail);
/* pool.c */
void rpc_status(const rpc_call *c, const Gradd__Request *req);
void rpc_stats(const rpc_call *c, const Gradd__Request *req);
void rpc_trim(const rpc_call *c, const Gradd__Request *req);
rpc_stream *rpc_timeline(const rpc_call *c, const Gradd__Request *req);
/* metrics.c */
void rpc_metrics(const rpc_call *c, const Gradd__Request *req);
/* watch.c */
rpc_stream *rpc_watch(const rpc_call *c, const Gradd__Request *req);
/* sample.c */
rpc_work *rpc_sample(const rpc_call *c, const Gradd__Request *req);
/* history.c */
rpc_work *rpc_history(const rpc_call *c, const Gradd__Request *req);
/* test_hooks.c */
void rpc_test_pressure(const rpc_call *c, const Gradd__Request *req);
void rpc_test_alloc(const rpc_call *c, const Gradd__Request *req);
void rpc_test_hang(const rpc_call *c, const Gradd__Request *req);
/* report.c */
void rpc_report(const rpc_call *c, const Gradd__Request *req);

#endif
