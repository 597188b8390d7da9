/* jobend.h — a job's [job] on_end command: run once when the job has
 * reached a final state (completed, failed or cancelled; not when a
 * daemon stop leaves it to resume), for a notification or the next step
 * of a pipeline.
 *
 * It runs as the job's owner (uid, gid, groups, no capabilities: spawn.h)
 * without a shell, looked up on the clean PATH, in the job's workdir (a
 * program job's [program] workdir, else the job file's directory), with
 * stdin at /dev/null and a clean environment plus GRADD_JOB_ID,
 * GRADD_JOB_STATE, GRADD_JOB_NAME, GRADD_OUTPUT_DIR, GRADD_JOB_REASON and
 * GRADD_SOCKET.  Its output goes to the job's log, at most
 * JOBEND_OUTPUT_MAX bytes of it.  The job's thread runs it after the
 * job's outcome is recorded, so nothing waits for it but that thread's
 * slot, for at most [daemon] on_end_timeout (then its process group is
 * killed); a daemon that stops kills it at once.
 */
#ifndef GRADD_JOBEND_H
#define GRADD_JOBEND_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "jobcfg.h"

#define JOBEND_OUTPUT_MAX (64u << 10) /* of its output, kept in the job's log */
#define JOBEND_REASON_MAX 512         /* GRADD_JOB_REASON's bytes, at most */

/* What running it needs, copied from the job under the queue lock (the
 * job may be removed once the lock is let go). */
typedef struct jobend_job {
    uint32_t id;
    uid_t uid;
    gid_t gid;
    char command[JOBCFG_COMMAND_MAX];
    char where[PATH_MAX + 64]; /* "FILE:LINE: [job] on_end", for errors */
    char workdir[PATH_MAX];
    char out_dir[PATH_MAX];
    char name[64];
    char state[16];
    char reason[JOBEND_REASON_MAX + 1];
} jobend_job;

/* Where it runs: [program] workdir, or the job file's directory. */
void jobend_workdir(const job_config *j, char *out, size_t len);

/* At submit, as the owner (access.h): 0 when j sets no on_end or the
 * owner may execute it, else -1 with err naming the file, line and key. */
int jobend_check(const job_config *j, char *err, size_t err_len);

/* Where its output and notes go, whether the daemon is stopping. */
typedef struct jobend_hooks {
    void (*output)(void *user, const char *lines); /* whole lines */
    bool (*stopping)(void *user); /* polled every 100 ms while it runs */
    void *user;
} jobend_hooks;

/* Run it to its end or its bound; how it ended, for status, in result
 * ("exited with status 0", "killed after 60s ([daemon] on_end_timeout)",
 * "cannot execute ..."). */
void jobend_run(const jobend_job *jj, const char *socket, uint64_t timeout_ms, const jobend_hooks *h, char *result,
                size_t result_len);

#endif
