/* outdir.c — [output] resume and one live job per output directory. */
#include "outdir.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "access.h"
#include "io/safetensors.h"

/* ---- what the directory holds ------------------------------------------------- */

/* gradd's outputs, the ones `never` refuses to write over. */
static const char *const outputs[] = {"resume.safetensors", "model.safetensors",         "config.json",
                                      "metrics.jsonl",      "adapter_model.safetensors", "adapter_config.json"};
#define NOUTPUTS (sizeof outputs / sizeof outputs[0])

static bool exists(const char *dir, const char *name)
{
    char path[PATH_MAX + 32];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return lstat(path, &st) == 0;
}

/* The step resume.safetensors records: 1 with *step, 0 when there is none,
 * -1 with err when it cannot be read. */
static int checkpoint_step(const char *dir, uint64_t *step, char *err, size_t err_len)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/resume.safetensors", dir);
    struct stat st;
    if (lstat(path, &st) != 0 && errno == ENOENT)
        return 0;
    st_file *f;
    if (st_open(path, &f, err, err_len) != 0)
        return -1;
    const char *s = st_meta(f, "step");
    char *end = NULL;
    errno = 0;
    unsigned long long v = s && *s >= '0' && *s <= '9' ? strtoull(s, &end, 10) : 0;
    bool ok = s && end && !*end && !errno;
    st_close(f);
    if (!ok) {
        snprintf(err, err_len, "%s: no step in its metadata", path);
        return -1;
    }
    *step = v;
    return 1;
}

int outdir_check_resume(const job_config *j, char *err, size_t err_len)
{
    if (j->type != JOBCFG_ENGINE)
        return 0;
    /* At the line of resume, or else of dir: the key the submitter can
     * change that the file has. */
    char where[PATH_MAX + 96], why[PATH_MAX + 128];
    if (jobcfg_line(j, "output", "resume") || !jobcfg_line(j, "output", "dir")) {
        jobcfg_where(j, "output", "resume", where, sizeof where);
    } else {
        size_t n = strlen(jobcfg_where(j, "output", "dir", where, sizeof where));
        snprintf(where + n, sizeof where - n, ", with [output] resume");
    }
    const char *policy = j->resume == JOBCFG_RESUME_NEVER ? "never" : j->resume == JOBCFG_RESUME_REQUIRE ? "require" : "auto";
    uint64_t step = 0;
    int have = checkpoint_step(j->out_dir, &step, why, sizeof why);
    if (j->resume == JOBCFG_RESUME_NEVER) {
        char found[256] = "";
        size_t n = 0;
        for (size_t i = 0; i < NOUTPUTS; i++)
            if (exists(j->out_dir, outputs[i]))
                n += (size_t)snprintf(found + n, sizeof found - n, "%s%s", n ? ", " : "", outputs[i]);
        if (!n)
            return 0;
        snprintf(err, err_len, "%s = never: %s holds another run's outputs (%s), which gradd neither continues nor "
                 "writes over; remove them, or choose another [output] dir", where, j->out_dir, found);
        return -1;
    }
    /* A checkpoint that cannot be read (damaged, a dangling link, not a
     * regular file) would fail the job when it starts: refused at submit,
     * and the engine refuses one damaged while the job waits. */
    if (have < 0) {
        snprintf(err, err_len, "%s = %s: cannot read the checkpoint in %s: %s", where, policy, j->out_dir, why);
        return -1;
    }
    if (have && step >= j->steps) {
        snprintf(err, err_len, "%s = %s: %s holds a %s (step %llu of [train] steps %llu in "
                 "resume.safetensors), so the job would do nothing; choose another [output] dir, remove its "
                 "outputs to start over, or raise [train] steps to train it further", where, policy, j->out_dir,
                 step == j->steps ? "finished run" : "run trained past this job's end", (unsigned long long)step,
                 (unsigned long long)j->steps);
        return -1;
    }
    if (!have && j->resume == JOBCFG_RESUME_REQUIRE) {
        snprintf(err, err_len, "%s = require: %s holds no checkpoint (resume.safetensors) to continue", where,
                 j->out_dir);
        return -1;
    }
    /* A finished model (or a LoRA job's adapters) without its resume
     * state: starting afresh would write over it. */
    const char *done = exists(j->out_dir, "model.safetensors")           ? "model.safetensors"
                       : exists(j->out_dir, "adapter_model.safetensors") ? "adapter_model.safetensors"
                                                                          : NULL;
    if (!have && done) {
        snprintf(err, err_len, "%s = %s: %s holds a trained %s but no checkpoint to continue; choose another "
                 "[output] dir, or remove its outputs to start over", where, policy, j->out_dir, done);
        return -1;
    }
    return 0;
}

/* ---- one live job per directory ----------------------------------------------------- */

int outdir_check_live(queue *q, uid_t uid, gid_t gid, const job_config *j, char *real, size_t real_len, char *err,
                      size_t err_len)
{
    snprintf(real, real_len, "%s", j->out_dir);
    if (!j->out_dir[0])
        return 0;
    /* Resolved as the owner: the path may pass through directories only
     * they may search. */
    access_saved saved;
    char resolved[PATH_MAX];
    if (access_become(uid, gid, &saved, err, err_len) != 0)
        return -1;
    if (realpath(j->out_dir, resolved))
        snprintf(real, real_len, "%s", resolved);
    access_restore(&saved);
    pthread_mutex_lock(&q->lock);
    uint32_t other = 0;
    for (size_t i = 0; i < q->n && !other; i++) {
        const job *o = q->jobs[i];
        if ((o->state != JOB_QUEUED && o->state != JOB_RUNNING) || o->cfg_unread || !o->cfg.out_dir[0])
            continue;
        if (!strcmp(o->out_real[0] ? o->out_real : o->cfg.out_dir, real) || !strcmp(o->cfg.out_dir, j->out_dir))
            other = o->id;
    }
    char state[16] = "";
    if (other)
        snprintf(state, sizeof state, "%s", job_state_name(queue_find(q, other)->state));
    pthread_mutex_unlock(&q->lock);
    if (!other)
        return 0;
    char where[PATH_MAX + 64];
    snprintf(err, err_len, "%s: %s is the output directory of job %u, which is %s; two jobs writing one directory "
             "would mix their checkpoints: wait for it to end, or choose another [output] dir",
             jobcfg_where(j, "output", "dir", where, sizeof where), real, other, state);
    return -1;
}
