/* acct.c — the accounting file: a finished job's record appended as one
 * line, the file rotated at its bound, and both files opened for reading
 * (acct_parse.c formats and parses the lines). */
#include "acct.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "fileio.h"

void acct_init(acct_log *a, const char *state_dir, uint64_t max_bytes)
{
    memset(a, 0, sizeof *a);
    pthread_mutex_init(&a->lock, NULL);
    snprintf(a->path, sizeof a->path, "%s/%s", state_dir, ACCT_FILE);
    a->max_bytes = max_bytes;
}

void acct_destroy(acct_log *a)
{
    pthread_mutex_destroy(&a->lock);
}

/* ---- writing ------------------------------------------------------------------------- */

void acct_from_job(const job *j, acct_record *r)
{
    memset(r, 0, sizeof *r);
    r->id = j->id;
    r->uid = (uint32_t)j->uid;
    snprintf(r->name, sizeof r->name, "%s", j->name);
    snprintf(r->user, sizeof r->user, "%s", j->user);
    snprintf(r->type, sizeof r->type, "%s", j->cfg.type == JOBCFG_PROGRAM ? "program" : "engine");
    snprintf(r->state, sizeof r->state, "%s", job_state_name(j->state));
    snprintf(r->reason, sizeof r->reason, "%s", j->reason);
    /* A job cancelled in the queue never had a device. */
    bool ran = j->started_at > 0 && j->device[0];
    snprintf(r->device, sizeof r->device, "%s", ran ? j->device : "");
    r->devices = ran ? 1 : 0;
    r->submitted_at = j->submitted_at;
    r->started_at = j->started_at;
    r->finished_at = j->finished_at;
    r->elapsed_s = ran && j->finished_at > j->started_at ? j->finished_at - j->started_at : 0;
    r->device_hours = r->elapsed_s * r->devices / 3600.0;
    r->resumes = j->resumes;
    r->oom_recoveries = j->prog.oom_recoveries;
    r->steps_done = j->prog.step;
    r->steps = j->cfg.steps;
    r->mem_peak = j->mem_peak;
    memcpy(r->tag_peak, j->mem_tag_peak, sizeof r->tag_peak);
}

/* Open the file to append to, renaming it to .1 first when `need` more
 * bytes would take it past max_bytes.  Lock held.  The fd, or -1. */
static int open_for(acct_log *a, size_t need, char *err, size_t err_len)
{
    int fd = fileio_open_regular(a->path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW, 0640, err, err_len);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(err, err_len, "%s: %s", a->path, strerror(errno));
        close(fd);
        return -1;
    }
    if (st.st_size == 0 || (uint64_t)st.st_size + need <= a->max_bytes)
        return fd;
    close(fd);
    char old[PATH_MAX + 8];
    snprintf(old, sizeof old, "%s.1", a->path);
    if (rename(a->path, old) != 0) {
        snprintf(err, err_len, "cannot rename %s to %s: %s", a->path, old, strerror(errno));
        return -1;
    }
    log_info("accounting: %s passed [daemon] max_accounting; the records before are in %s", a->path, old);
    return fileio_open_regular(a->path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_EXCL, 0640, err, err_len);
}

int acct_append(acct_log *a, const job *j)
{
    if (!a || !a->max_bytes)
        return 0;
    acct_record *r = malloc(sizeof *r);
    size_t len = 0;
    char *line = NULL;
    if (r) {
        acct_from_job(j, r);
        line = acct_format(r, &len);
        free(r);
    }
    char err[PATH_MAX + 256];
    int rc = -1;
    pthread_mutex_lock(&a->lock);
    if (!line) {
        snprintf(err, sizeof err, "out of memory");
        errno = ENOMEM;
    } else {
        int fd = open_for(a, len, err, sizeof err);
        if (fd >= 0) {
            /* One write: O_APPEND puts the whole line at the end. */
            rc = fileio_write_all(fd, line, len);
            if (rc != 0)
                snprintf(err, sizeof err, "cannot write %s: %s", a->path, strerror(errno));
            close(fd);
        }
    }
    if (rc != 0 && !a->warned)
        log_job(LOG_WARN, j->id, NULL, "accounting: job %u: %s; its record is lost", j->id, err);
    a->warned = rc != 0;
    pthread_mutex_unlock(&a->lock);
    free(line);
    return rc;
}

/* ---- reading ------------------------------------------------------------------------- */

void acct_open_read(acct_log *a, FILE *f[2], char paths[2][PATH_MAX + 8])
{
    snprintf(paths[0], sizeof paths[0], "%s.1", a->path);
    snprintf(paths[1], sizeof paths[1], "%s", a->path);
    pthread_mutex_lock(&a->lock);
    for (int i = 0; i < 2; i++) {
        char err[PATH_MAX + 64];
        int fd = fileio_open_regular(paths[i], O_RDONLY | O_NOFOLLOW, 0, err, sizeof err);
        f[i] = fd >= 0 ? fdopen(fd, "r") : NULL;
        if (fd >= 0 && !f[i])
            close(fd);
        if (fd < 0 && errno != ENOENT)
            log_warn("accounting: %s", err);
    }
    pthread_mutex_unlock(&a->lock);
}
