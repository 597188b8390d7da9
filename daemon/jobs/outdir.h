/* outdir.h — what a job's [output] dir already holds, and who else writes
 * it: checked at submit, so that a job neither "completes" at once over a
 * finished run's outputs nor shares its directory with a live job.
 *
 * [output] resume says what an engine job may find there:
 *   auto:    an unfinished run's checkpoint (resume.safetensors before the
 *            job's last step) is continued; a finished run is refused, as
 *            is a checkpoint that cannot be read;
 *   require: only such a checkpoint: none is refused, as is a finished run;
 *   never:   only a directory without gradd's outputs (resume.safetensors,
 *            model.safetensors, config.json, metrics.jsonl): nothing is
 *            written over, nothing deleted.
 * The policy is for the job's first start: once it runs, its own
 * checkpoints are what a daemon restart resumes from.
 */
#ifndef GRADD_OUTDIR_H
#define GRADD_OUTDIR_H

#include <stddef.h>
#include <sys/types.h>

#include "jobcfg.h"
#include "queue.h"

/* As the current filesystem identity (the owner's: access.h): whether an
 * engine job's [output] resume accepts what j->out_dir holds.  0, or -1
 * with err naming the file, line, key and directory. */
int outdir_check_resume(const job_config *j, char *err, size_t err_len);

/* The directory a new job of uid/gid would write, as the kernel resolves
 * it for that user (realpath; the lexical path where it cannot be
 * resolved), into real.  Then, queue locked, the live (queued or running)
 * job that writes the same directory: 0 when there is none, else -1 with
 * err naming that job.  Jobs loaded at start are compared by their
 * resolved path kept in the state file, or their lexical one. */
int outdir_check_live(queue *q, uid_t uid, gid_t gid, const job_config *j, char *real, size_t real_len, char *err,
                      size_t err_len);

#endif
