/* queue.h — the persistent job queue.
 *
 * Every job lives in STATE_DIR/jobs/ID/: job.cfg (the submitted contents,
 * never re-read from the user's file), state (key=value lines), and log.
 * Every state change is written atomically — temp file, fsync, rename,
 * fsync of the directory — before it is acknowledged, so a kill -9 at any
 * moment leaves each job either before or after the change.  At start,
 * jobs that were running go back to queued and resume from their
 * checkpoint.
 *
 * One mutex guards the table; workers wait on `cond` for work; `notify` is
 * called after every change (from any thread) so the event loop can push
 * updates to watchers.
 */
#ifndef GRADD_QUEUE_H
#define GRADD_QUEUE_H

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "jobcfg.h"
#include "engine/train.h"

typedef enum { JOB_QUEUED, JOB_RUNNING, JOB_COMPLETED, JOB_FAILED, JOB_CANCELLED, JOB_STATE_COUNT } job_state;

const char *job_state_name(job_state s);
int job_state_parse(const char *name, job_state *out);

/* The most jobs one job may wait for (gradctl submit --after): a bound on
 * its state file and on what each scheduling pass looks at. */
#define QUEUE_AFTER_MAX 16

/* Job ids, ascending, each below the id of the job that holds them. */
typedef struct {
    uint32_t n;
    uint32_t id[QUEUE_AFTER_MAX];
} queue_ids;

typedef struct job {
    uint32_t id;
    char name[64];
    uid_t uid;
    gid_t gid;
    char user[64];
    job_state state;
    int64_t priority;
    double submitted_at, started_at, finished_at; /* unix seconds; 0: not yet */
    char device[16];       /* where it runs or last ran */
    char reason[1024];     /* why it failed or was cancelled */
    char source[PATH_MAX]; /* the job file it was submitted from */
    uint32_t resumes;      /* times it started from a checkpoint */
    mode_t umask;          /* the submitter's: the job's outputs are created with it */
    uint32_t pgid;         /* a program job's process group while it runs; 0: none */
    /* Its time limit, fixed at submit from [job] time_limit and gradd.conf's
     * default (0: none), and the wall time its earlier runs took, counted
     * against it (a run cut short by a crash is not counted). */
    uint64_t time_limit_ms;
    double ran_s;
    /* Its [output] dir as realpath resolved it for the owner at submit
     * ("": not known), which no other live job may share (outdir.h). */
    char out_real[PATH_MAX];
    /* One more than the step its first run continued from, found in its
     * output directory (0: it started afresh); a daemon restart's resume
     * counts in resumes instead. */
    uint64_t continued_at;
    char on_end_result[256]; /* how its [job] on_end command ended ("": not run) */
    uint64_t seq;          /* submit order, for ties in priority */
    /* Its peak in its device's pool (a program's: in its own), in all and
     * by tag, kept once it ends: the pool forgets the job then. */
    uint64_t mem_peak, mem_tag_peak[POOL_TAG_COUNT];
    /* The finished_at whose accounting line is written (acct.h); a job
     * that ends again (run again after a crash) is accounted again. */
    double accounted_at;
    queue_ids after;       /* it starts once each of these has completed */
    /* The part of `after` that completed and was forgotten since (rm,
     * keep_finished): the dependent remembers the outcome, so what is kept
     * for removed jobs is bounded by the jobs that wait for them. */
    queue_ids after_done;
    bool held;             /* queued, but kept from starting (gradctl hold) */
    job_config cfg;
    /* A finished job whose job.cfg could not be read back at start: cfg is
     * all zero, so nothing may be taken from it (the model type, its
     * output directory). */
    bool cfg_unread;

    /* Live state, guarded by the queue lock. */
    bool unsaved; /* changed by its worker, which runs as the owner and so
                     cannot write the state dir: queue_save_unsaved does;
                     set q->any_unsaved with it */
    bool cancel_requested;
    bool requeue_requested; /* gradctl requeue of a running job: stop it, then queue it again */
    bool prune_failed; /* queue_prune could not remove it: not tried again */
    bool save_failed;  /* its last persist failed (logged once): retried while unsaved */
    bool have_progress;
    /* What it holds in the state dir, for max_bytes_per_user: its job.cfg,
     * its state file (as last written) and its log (as its worker writes
     * it). */
    uint64_t cfg_bytes, state_bytes, log_bytes;
    bool bytes_over; /* its log took its owner past max_bytes_per_user: the loop makes room */
    bool log_stop;   /* no room could be made: its log stops at its head */
    train_progress prog;
    uint64_t version; /* bumped on every change a watcher should see */
} job;

/* Whether j runs (or last ran) on device id: [job] device, or one of
 * [job] devices for a job over several. */
bool job_on_device(const job *j, const char *id);

typedef struct queue {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    char dir[PATH_MAX]; /* STATE_DIR/jobs */
    job **jobs;         /* ascending id */
    size_t n, cap;
    uint64_t next_id;   /* QUEUE_ID_END once every id has been given */
    bool stopping;
    _Atomic bool any_unsaved; /* some job is marked unsaved; read without the lock */
    _Atomic bool any_bytes_over; /* some job is marked bytes_over; likewise */
    uint64_t max_records_per_user, max_bytes_per_user; /* queue_set_limits; unlimited at open */
    int lock_fd;      /* STATE_DIR/lock, flock'd while open */
    struct acct_log *acct; /* where job ends are accounted (acct.h); NULL: nowhere */
    void (*notify)(void *user); /* both guarded by lock; called under it */
    void *notify_user;
} queue;

/* Load the queue from state_dir (creating it), which it holds (flock on
 * STATE_DIR/lock) until queue_close: a second daemon on the same state
 * would run the same jobs.  Jobs found running are queued again.  0, or -1
 * with the reason in err. */
int queue_open(queue *q, const char *state_dir, char *err, size_t err_len);
void queue_close(queue *q);
/* Create the state directory `dir` (0700, and each missing directory on
 * the way), and refuse it unless it is owned by the daemon's user and
 * writable by nobody else, and no one but that user and root could
 * replace it or a directory on the way (queue_dir.c).  0, or -1 with err
 * naming the directory and what is wrong.  queue_open calls it. */
int queue_prepare_dir(const char *dir, char *err, size_t err_len);

/* Add a validated job of uid/gid, whose outputs get umask `mask`; writes it
 * to disk before returning.  The caller does not hold the lock.  0 with *id
 * set, or -1 with err. */
int queue_submit(queue *q, const job_config *cfg, const void *contents, size_t len, uid_t uid, gid_t gid,
                 mode_t mask, const char *user, uint32_t *id, char *err, size_t err_len);
/* queue_submit of a job that waits for the jobs in `after` (sorted and
 * deduplicated here; NULL: none) and, with `hold`, for a release.  The
 * jobs are checked under the same lock that adds the new one: -2 with err
 * naming the first that does not exist or has failed or been cancelled. */
int queue_submit_after(queue *q, const job_config *cfg, const void *contents, size_t len, uid_t uid, gid_t gid,
                       mode_t mask, const char *user, const queue_ids *after, bool hold, uint32_t *id, char *err,
                       size_t err_len);

/* The rest need the lock held. */
job *queue_find(queue *q, uint32_t id);
/* Write j's state file atomically; -1 with err on failure.  A job that
 * has just ended gets its accounting line first (acct_append). */
int queue_persist(queue *q, job *j, char *err, size_t err_len);
/* queue_persist, and when it fails (a full disk) mark j unsaved, so that
 * queue_save_unsaved tries again until it is on disk: a job's end must not
 * stay recorded as running, to be run again at the next start.  Logged
 * once per failure, with `device` (may be NULL). */
void queue_persist_or_retry(queue *q, job *j, const char *device);
/* The queued job to run next on a device: highest priority, then earliest.
 * A job over several devices is started by its first device's worker once
 * can_start (may be NULL) says each of the others has a free slot; until
 * then, next on any of its devices, it holds them: NULL.  Lock held. */
job *queue_next_for(queue *q, const char *device_id, bool is_cuda, bool have_cuda,
                    bool (*can_start)(void *user, const job *j), void *user);
/* Mark a change for watchers (bumps version; call notify after unlocking). */
void queue_touch(queue *q, job *j);
/* Jobs of one user that are queued or running. */
size_t queue_active_for(queue *q, uid_t uid);
/* Path of the job's log file. */
void queue_log_path(const queue *q, uint32_t id, char *buf, size_t len);

/* ---- the state file (queue_state.c) ---- */

/* The text of j's state file: key=value lines, backslash and newline
 * escaped in strings.  malloc'd, with its length in *len; NULL if out of
 * memory. */
char *queue_format_state(const job *j, size_t *len);

/* Parse a state file's text, buf[0..len) (NULs included), as
 * queue_format_state writes it, for the job in directory want_id.  Every
 * field must be there exactly once, be well formed and in range, and fit
 * its field; id must be want_id.  0 with *out holding the file's fields
 * and zero elsewhere (cfg and the live state); or -1 with *out untouched
 * and err saying "LINE: KEY: what is wrong" (without the path, which the
 * caller puts in front). */
int queue_parse_state(const char *buf, size_t len, uint32_t want_id, job *out, char *err, size_t err_len);

/* One past the last job id: ids are uint32_t (directory names, protocol
 * fields), and a queue that has given UINT32_MAX refuses new jobs rather
 * than wrap to ids that name old ones. */
#define QUEUE_ID_END ((uint64_t)UINT32_MAX + 1)

/* Parse the next_id file: a job id (1 to QUEUE_ID_END, the last meaning
 * "all given") and a newline.  0 with *out set, or -1 with err as for
 * queue_parse_state. */
int queue_parse_next_id(const char *buf, size_t len, uint64_t *out, char *err, size_t err_len);

/* Forget finished job `id`: its directory (job file, state, log) is
 * deleted and it leaves the table (the pointer is freed); its id is never
 * given again, and its output directory, the owner's, is untouched.  Lock
 * held.  0, or -1 with err (no such job, not finished, or the directory
 * could not be moved). */
int queue_remove(queue *q, uint32_t id, char *err, size_t err_len);
/* queue_remove every job that finished more than max_age seconds before
 * `now` (unix seconds); each is logged.  Lock held.  How many went. */
size_t queue_prune(queue *q, double now, double max_age);
/* What a job directory is renamed to while queue_remove empties it. */
#define QUEUE_TOMB ".removed-"

/* Persist every job marked unsaved, and make room for users whose running
 * jobs' logs passed max_bytes_per_user (queue_room_for_logs) (takes the
 * lock; on the daemon's own identity, from the event loop when a worker
 * notifies).  Failures are logged. */
void queue_save_unsaved(queue *q);

/* ---- per-user limits (queue_quota.c) ---- */

/* [daemon] max_records_per_user and max_bytes_per_user.  Takes the lock. */
void queue_set_limits(queue *q, uint64_t max_records, uint64_t max_bytes);
/* The bytes j holds in the state dir. */
uint64_t queue_job_bytes(const job *j);
/* Before a submit of add_bytes (its job file and state) by uid: while
 * another record or the bytes would pass a limit, forget uid's oldest
 * finished jobs (each logged).  0 when it fits; -1 with err naming the
 * limit and its key when nothing finished is left to forget.  Takes the
 * lock; on the daemon's identity. */
#define QUEUE_STATE_RESERVE 4096 /* what a submit counts for the state file it will write */
int queue_make_room(queue *q, uid_t uid, uint64_t add_bytes, char *err, size_t err_len);
/* j's log is log_bytes long now (its worker, lock held).  When its
 * owner's bytes pass max_bytes_per_user, j is marked for the loop's
 * queue_room_for_logs (a worker runs as the owner, who may not remove
 * files in the state dir).  The bytes left below the limit (0: past it). */
uint64_t queue_log_grew(queue *q, job *j, uint64_t log_bytes);
/* For each marked job: forget its owner's oldest finished jobs until the
 * bytes fit; if they still do not, set log_stop on the owner's running
 * jobs.  Takes the lock. */
void queue_room_for_logs(queue *q);

/* Account job ends in `a` from now on, starting with those that loading
 * the queue made (jobs failed at restart).  Takes the lock. */
void queue_set_acct(queue *q, struct acct_log *a);
/* ---- dependencies and holds (queue_deps.c); the lock held ---- */

/* Can j start as far as its dependencies and hold go: not held, and each
 * job in j->after completed (or completed and was forgotten since)? */
bool queue_deps_ready(queue *q, const job *j);
/* Can one of j's dependencies no longer complete (failed, cancelled, or
 * gone without a record)?  why says which: "dependency 3 failed". */
bool queue_deps_broken(queue *q, const job *j, char *why, size_t len);
/* Why queued job j does not start, for people: "held", "waiting for 3, 5",
 * "held; waiting for 3"; "" when nothing keeps it. */
void queue_deps_waiting(queue *q, const job *j, char *buf, size_t len);
/* Cancel every queued job one of whose dependencies failed, was cancelled
 * or is lost, in id order, so that a chain goes in one pass (a job waits
 * only for earlier ones); each is persisted and logged.  Then wake the
 * workers: a completed job may have let others start.  How many went. */
size_t queue_deps_settle(queue *q);
/* Before finished job `gone` is forgotten: the jobs that wait for it
 * record that it completed (or, had it not, are cancelled). */
void queue_deps_forget(queue *q, const job *gone);

/* Call the notify callback.  The caller does not hold the lock: the
 * callback is made with it held (so that clearing notify under the lock
 * stops every caller), and must not take it. */
void queue_notify(queue *q);

/* Does `want` ("auto", "cpu", "cpuN", "cuda:N") accept device `id`? */
bool queue_device_matches(const char *want, const char *id, bool is_cuda, bool have_cuda);

#endif
