/* queue.c — job records, their files, and scheduling order. */
#include "queue.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "access.h"
#include "acct.h"
#include "fileio.h"
#include "runner.h"
#include "base/log.h"
#include "models/model.h"

/* ---- files ------------------------------------------------------------------------- */

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* Write dir/name atomically: temp file, fsync, rename, fsync dir. */
static int atomic_write(const char *dir, const char *name, const void *data, size_t len, char *err, size_t err_len)
{
    char tmp[PATH_MAX + 64], path[PATH_MAX + 64];
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, err_len, "cannot write %s: %s", tmp, strerror(errno));
        return -1;
    }
    if (fileio_write_all(fd, data, len) != 0) {
        snprintf(err, err_len, "cannot write %s: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        return -1;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        snprintf(err, err_len, "cannot sync %s: %s", tmp, strerror(errno));
        unlink(tmp);
        return -1;
    }
    if (rename(tmp, path) != 0) {
        snprintf(err, err_len, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    if (fsync_dir(dir) != 0) {
        snprintf(err, err_len, "cannot sync directory %s: %s", dir, strerror(errno));
        return -1;
    }
    return 0;
}

int queue_persist(queue *q, job *j, char *err, size_t err_len)
{
    if (q->acct && j->state != JOB_QUEUED && j->state != JOB_RUNNING && j->accounted_at != j->finished_at) {
        /* Marked even when the line could not be written (logged): a
         * retry at every persist would only log the same failure. */
        acct_append(q->acct, j);
        j->accounted_at = j->finished_at;
    }
    size_t len;
    char *buf = queue_format_state(j, &len);
    if (!buf) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/%u", q->dir, j->id);
    int rc = atomic_write(dir, "state", buf, len, err, err_len);
    free(buf);
    if (rc == 0)
        j->state_bytes = len;
    return rc;
}

void queue_log_path(const queue *q, uint32_t id, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%u/log", q->dir, id);
}

/* ---- table --------------------------------------------------------------------------- */

static int table_add(queue *q, job *j)
{
    if (q->n == q->cap) {
        size_t ncap = q->cap ? q->cap * 2 : 64;
        job **nj = realloc(q->jobs, ncap * sizeof *nj);
        if (!nj)
            return -1;
        q->jobs = nj;
        q->cap = ncap;
    }
    /* Keep ascending id order (loading reads directories in any order). */
    size_t i = q->n;
    while (i > 0 && q->jobs[i - 1]->id > j->id) {
        q->jobs[i] = q->jobs[i - 1];
        i--;
    }
    q->jobs[i] = j;
    q->n++;
    return 0;
}

job *queue_find(queue *q, uint32_t id)
{
    size_t lo = 0, hi = q->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (q->jobs[mid]->id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < q->n && q->jobs[lo]->id == id ? q->jobs[lo] : NULL;
}

bool job_on_device(const job *j, const char *id)
{
    if (j->cfg.ndevices > 0) {
        for (int k = 0; k < j->cfg.ndevices; k++)
            if (strcmp(j->cfg.device_ids[k], id) == 0)
                return true;
        return false;
    }
    return strcmp(j->device, id) == 0;
}

void queue_touch(queue *q, job *j)
{
    (void)q;
    j->version++;
}

void queue_notify(queue *q)
{
    /* notify and notify_user are read under the lock, and the callback is
     * made under it: server_stop clears notify under the lock before it
     * closes the loop's async handle, and that must mean no thread is
     * inside the callback, or about to make it with the pointer it read
     * before.  (Read unlocked, a worker's load raced with that store, and
     * could still call uv_async_send on the handle being closed.)  The
     * callback only wakes the loop (uv_async_send), so it is cheap enough
     * to make under the lock, and must not take the lock itself. */
    pthread_mutex_lock(&q->lock);
    if (q->notify)
        q->notify(q->notify_user);
    pthread_mutex_unlock(&q->lock);
}

size_t queue_active_for(queue *q, uid_t uid)
{
    size_t n = 0;
    for (size_t i = 0; i < q->n; i++)
        n += q->jobs[i]->uid == uid && (q->jobs[i]->state == JOB_QUEUED || q->jobs[i]->state == JOB_RUNNING);
    return n;
}

bool queue_device_matches(const char *want, const char *id, bool is_cuda, bool have_cuda)
{
    if (strcmp(want, "auto") == 0)
        return is_cuda == have_cuda; /* the best kind this daemon has */
    if (strcmp(want, "cpu") == 0)
        return !is_cuda;
    if (strncmp(want, "cuda:", 5) == 0)
        return is_cuda && strcmp(id + 4, want + 5) == 0;
    return strcmp(want, id) == 0;
}

/* Whether j would run on device `id`: a job over several devices on each
 * of them. */
static bool uses_device(const job *j, const char *id, bool is_cuda, bool have_cuda)
{
    for (int k = 0; k < j->cfg.ndevices; k++)
        if (strcmp(j->cfg.device_ids[k], id) == 0)
            return true;
    return !j->cfg.ndevices && queue_device_matches(j->cfg.device, id, is_cuda, have_cuda);
}

job *queue_next_for(queue *q, const char *device_id, bool is_cuda, bool have_cuda,
                    bool (*can_start)(void *user, const job *j), void *user)
{
    job *best = NULL;
    for (size_t i = 0; i < q->n; i++) {
        job *j = q->jobs[i];
        if (j->state != JOB_QUEUED || !uses_device(j, device_id, is_cuda, have_cuda) || !queue_deps_ready(q, j))
            continue;
        if (!best || j->priority > best->priority || (j->priority == best->priority && j->seq < best->seq))
            best = j;
    }
    /* A job over several devices that is next on this one keeps its place:
     * the device takes nothing after it, or a busy server would never have
     * all of its devices free at once.  The worker of its first device
     * starts it once can_start says the others are free. */
    if (best && best->cfg.ndevices &&
        (strcmp(best->cfg.device_ids[0], device_id) != 0 || (can_start && !can_start(user, best))))
        return NULL;
    return best;
}

/* ---- submit ---------------------------------------------------------------------------- */

static double now_unix(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int remove_tree(const char *dir);

int queue_submit(queue *q, const job_config *cfg, const void *contents, size_t len, uid_t uid, gid_t gid,
                 mode_t mask, const char *user, uint32_t *id, char *err, size_t err_len)
{
    return queue_submit_after(q, cfg, contents, len, uid, gid, mask, user, NULL, false, id, err, err_len);
}

/* Sort and deduplicate `in` into j->after, and check each job exists and
 * may still complete.  Lock held.  0, or -1 with err. */
static int take_after(queue *q, job *j, const queue_ids *in, char *err, size_t err_len)
{
    queue_ids *s = &j->after;
    for (uint32_t i = 0; i < in->n && i < QUEUE_AFTER_MAX; i++) {
        uint32_t id = in->id[i], at = s->n;
        while (at > 0 && s->id[at - 1] > id)
            at--;
        if (at > 0 && s->id[at - 1] == id)
            continue;
        memmove(&s->id[at + 1], &s->id[at], (s->n - at) * sizeof s->id[0]);
        s->id[at] = id;
        s->n++;
    }
    for (uint32_t i = 0; i < s->n; i++) {
        const job *d = queue_find(q, s->id[i]);
        if (!d) {
            snprintf(err, err_len, "submit: --after %u: no such job (it never existed or was forgotten)", s->id[i]);
            return -1;
        }
        if (d->state == JOB_FAILED || d->state == JOB_CANCELLED) {
            snprintf(err, err_len, "submit: --after %u: that job is %s, so this one could never start", s->id[i],
                     job_state_name(d->state));
            return -1;
        }
    }
    return 0;
}

int queue_submit_after(queue *q, const job_config *cfg, const void *contents, size_t len, uid_t uid, gid_t gid,
                       mode_t mask, const char *user, const queue_ids *after, bool hold, uint32_t *id, char *err,
                       size_t err_len)
{
    job *j = calloc(1, sizeof *j);
    if (!j) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    j->cfg = *cfg;
    snprintf(j->name, sizeof j->name, "%s", cfg->name);
    j->uid = uid;
    j->gid = gid;
    j->umask = mask & 0777;
    snprintf(j->user, sizeof j->user, "%s", user);
    j->state = JOB_QUEUED;
    j->priority = cfg->priority;
    j->time_limit_ms = cfg->time_limit_ms;
    j->submitted_at = now_unix();
    snprintf(j->source, sizeof j->source, "%s", cfg->source);
    j->cfg_bytes = len;
    j->held = hold;

    pthread_mutex_lock(&q->lock);
    if (after && take_after(q, j, after, err, err_len) != 0) {
        pthread_mutex_unlock(&q->lock);
        free(j);
        return -2;
    }
    if (q->next_id >= QUEUE_ID_END) {
        pthread_mutex_unlock(&q->lock);
        free(j);
        snprintf(err, err_len, "every job id (1 to %" PRIu32 ") has been given; no new job can be numbered",
                 UINT32_MAX);
        return -1;
    }
    j->id = (uint32_t)q->next_id;
    j->seq = j->id;
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/%u", q->dir, j->id);
    int rc = -1;
    /* The next id first: a crash after it only skips an id, never reuses
     * one that a user was told about. */
    char idbuf[32];
    int n = snprintf(idbuf, sizeof idbuf, "%" PRIu64 "\n", (uint64_t)j->id + 1);
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", q->dir);
    if (atomic_write(parent, "next_id", idbuf, (size_t)n, err, err_len) == 0) {
        q->next_id = (uint64_t)j->id + 1;
        if (mkdir(dir, 0700) != 0 && errno != EEXIST)
            snprintf(err, err_len, "cannot create %s: %s", dir, strerror(errno));
        else if (atomic_write(dir, "job.cfg", contents, len, err, err_len) == 0 &&
                 queue_persist(q, j, err, err_len) == 0 && table_add(q, j) == 0)
            rc = 0;
        /* Half a job (a job.cfg without its state, say, on a full disk)
         * would be skipped with a warning at every start, and nothing
         * lists it to remove: none at all.  Its id stays used. */
        if (rc != 0)
            remove_tree(dir);
    }
    if (rc != 0) {
        char why[1024];
        snprintf(why, sizeof why, "%s", err);
        snprintf(err, err_len, "the job was not queued: %s", why);
    }
    if (rc == 0) {
        *id = j->id;
        queue_touch(q, j);
        pthread_cond_broadcast(&q->cond);
    }
    pthread_mutex_unlock(&q->lock);
    if (rc != 0) {
        free(j);
        return -1;
    }
    queue_notify(q);
    return 0;
}

/* One try; the flags say whether another is needed.  Lock held. */
static bool persist_try(queue *q, job *j, const char *device)
{
    char err[512];
    if (queue_persist(q, j, err, sizeof err) == 0) {
        if (j->save_failed)
            log_job(LOG_INFO, j->id, device, "job %u: its state is recorded now", j->id);
        j->save_failed = j->unsaved = false;
        return true;
    }
    if (!j->save_failed)
        log_job(LOG_ERR, j->id, device, "job %u: cannot record its state: %s; trying again", j->id, err);
    j->save_failed = j->unsaved = true;
    return false;
}

void queue_persist_or_retry(queue *q, job *j, const char *device)
{
    if (!persist_try(q, j, device))
        q->any_unsaved = true;
}

void queue_save_unsaved(queue *q)
{
    /* Called on every worker notify (each step of each job) and every
     * second: the lock only when there is something to save. */
    queue_room_for_logs(q);
    if (!atomic_load(&q->any_unsaved))
        return;
    pthread_mutex_lock(&q->lock);
    bool left = false;
    for (size_t i = 0; i < q->n; i++)
        if (q->jobs[i]->unsaved && !persist_try(q, q->jobs[i], NULL))
            left = true;
    q->any_unsaved = left;
    pthread_mutex_unlock(&q->lock);
}

/* A job directory and the files in it (it has no subdirectories).  0, or
 * -1 with errno. */
static int remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? 0 : -1;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 &&
            unlinkat(dirfd(d), e->d_name, 0) != 0 && errno != ENOENT)
            rc = -1;
    int e_saved = errno;
    closedir(d);
    if (rc == 0 && rmdir(dir) != 0)
        return -1;
    errno = e_saved;
    return rc;
}

int queue_remove(queue *q, uint32_t id, char *err, size_t err_len)
{
    job *j = queue_find(q, id);
    if (!j) {
        snprintf(err, err_len, "no job %u", id);
        return -1;
    }
    if (j->state == JOB_QUEUED || j->state == JOB_RUNNING) {
        snprintf(err, err_len, "job %u is %s; cancel it first", id, job_state_name(j->state));
        return -1;
    }
    /* Its dependents first: a crash after this leaves them knowing it
     * completed, never waiting for a job that is gone. */
    queue_deps_forget(q, j);
    /* Out of the way in one step, then emptied: a crash in between leaves a
     * tombstone that the next start clears, never half a job. */
    char dir[PATH_MAX + 16], tomb[PATH_MAX + 32];
    snprintf(dir, sizeof dir, "%s/%u", q->dir, id);
    snprintf(tomb, sizeof tomb, "%s/" QUEUE_TOMB "%u", q->dir, id);
    if (rename(dir, tomb) != 0 && errno != ENOENT) {
        snprintf(err, err_len, "cannot remove %s: %s", dir, strerror(errno));
        return -1;
    }
    fsync_dir(q->dir);
    if (remove_tree(tomb) != 0)
        log_warn("queue: cannot finish removing %s: %s; the next start will", tomb, strerror(errno));
    size_t i = 0;
    while (q->jobs[i] != j)
        i++;
    memmove(&q->jobs[i], &q->jobs[i + 1], (q->n - i - 1) * sizeof q->jobs[0]);
    q->n--;
    free(j);
    queue_deps_settle(q);
    return 0;
}

size_t queue_prune(queue *q, double now, double max_age)
{
    size_t gone = 0;
    for (size_t i = 0; i < q->n;) {
        job *j = q->jobs[i];
        bool done = j->state != JOB_QUEUED && j->state != JOB_RUNNING;
        if (!done || j->prune_failed || j->finished_at <= 0 || now - j->finished_at <= max_age) {
            i++;
            continue;
        }
        uint32_t id = j->id;
        double age = now - j->finished_at;
        char name[sizeof j->name], err[512];
        snprintf(name, sizeof name, "%s", j->name);
        if (queue_remove(q, id, err, sizeof err) != 0) {
            /* Said once: the next try is at the next start. */
            j->prune_failed = true;
            log_job(LOG_WARN, id, NULL, "queue: job %u is past [daemon] keep_finished but stays: %s", id, err);
            i++;
            continue;
        }
        log_job(LOG_INFO, id, NULL, "queue: job %u (%s) forgotten %.0f s after it ended ([daemon] keep_finished)", id,
                name, age);
        gone++;
    }
    return gone;
}

/* ---- loading --------------------------------------------------------------------------- */

/* Far more than any state file queue_persist writes (a few KiB at most). */
#define QUEUE_STATE_MAX (1u << 20)
/* A job file is far smaller; this bounds only a damaged one. */
#define QUEUE_JOBCFG_MAX (16u << 20)

/* The whole of path with its length, NUL-terminated for convenience (the
 * parsers take the length, so a NUL inside is seen, not a cut).  NULL with
 * errno set where it cannot be read, EFBIG where it is longer than max. */
static char *read_file(const char *path, size_t max, size_t *len)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return NULL;
    /* Sized by the file, not by max: a start reads every job's files, and
     * max is only the bound on a damaged or hostile one.  The loop still
     * ends at max + 1 bytes if the file grows under us. */
    struct stat st;
    size_t cap = fstat(fileno(f), &st) == 0 && st.st_size >= 0 && (uint64_t)st.st_size < max ? (size_t)st.st_size
                                                                                              : max;
    char *buf = malloc(cap + 1);
    size_t n = buf ? fread(buf, 1, cap + 1, f) : 0;
    while (buf && n == cap + 1 && cap < max) {
        size_t grow = cap < max / 2 ? cap * 2 + 64 : max;
        cap = grow < max ? grow : max;
        char *b = realloc(buf, cap + 1);
        if (!b) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = b;
        n += fread(buf + n, 1, cap + 1 - n, f);
    }
    int e = !buf ? ENOMEM : ferror(f) ? errno : n > max ? EFBIG : 0;
    fclose(f);
    if (e) {
        free(buf);
        errno = e;
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static const char *read_error(int e, size_t max)
{
    static _Thread_local char why[64];
    if (e != EFBIG)
        return strerror(e);
    snprintf(why, sizeof why, "longer than %zu bytes", max);
    return why;
}

/* Read one job directory; NULL (logged) if it is unusable. */
static job *load_job(queue *q, uint32_t id)
{
    char path[PATH_MAX + 64];
    size_t len;
    snprintf(path, sizeof path, "%s/%u/state", q->dir, id);
    char *state = read_file(path, QUEUE_STATE_MAX, &len);
    if (!state) {
        log_job(LOG_WARN, id, NULL, "queue: %s: %s; job %u skipped", path, read_error(errno, QUEUE_STATE_MAX), id);
        return NULL;
    }
    job *j = malloc(sizeof *j);
    char perr[512];
    if (!j) {
        log_job(LOG_WARN, id, NULL, "queue: %s: out of memory; job %u skipped", path, id);
        free(state);
        return NULL;
    }
    int rc = queue_parse_state(state, len, id, j, perr, sizeof perr);
    free(state);
    j->state_bytes = len;
    if (rc != 0) {
        /* perr starts with the line number: PATH:LINE: KEY: what. */
        log_job(LOG_WARN, id, NULL, "queue: %s:%s; job %u skipped", path, perr, id);
        free(j);
        return NULL;
    }
    /* A finished job's results as it last reported them (a job that will
     * run again reports its own once it does). */
    j->have_progress = j->state != JOB_QUEUED && j->state != JOB_RUNNING && j->prog.step > 0;
    snprintf(path, sizeof path, "%s/%u/job.cfg", q->dir, id);
    char *contents = read_file(path, QUEUE_JOBCFG_MAX, &len);
    j->cfg_bytes = contents ? len : 0;
    struct stat st;
    char logp[PATH_MAX + 32];
    queue_log_path(q, id, logp, sizeof logp);
    j->log_bytes = lstat(logp, &st) == 0 ? (uint64_t)st.st_size : 0;
    char err[1024];
    if (!contents) {
        snprintf(err, sizeof err, "cannot read %s: %s", path, read_error(errno, QUEUE_JOBCFG_MAX));
    } else if (j->state != JOB_QUEUED && j->state != JOB_RUNNING) {
        /* A finished job will not read its data again: it may be gone, and
         * the job's settings still describe its results (its model for
         * `gradctl sample`, its output directory). */
        if (jobcfg_load_record(contents, len, j->source, &j->cfg, err, sizeof err) == 0)
            err[0] = '\0';
    } else {
        /* The parser checks that the data files are readable: as the job's
         * owner, who will read them, not as the daemon (a service user that
         * may not read a private home).  One that cannot switch (not root,
         * no CAP_SETUID) checks as itself, as it runs its own jobs. */
        access_saved saved;
        char aerr[256];
        bool switched = access_become(j->uid, j->gid, &saved, aerr, sizeof aerr) == 0;
        /* A job from a Hugging Face directory gets its [model] keys from
         * it again, as at submit: the file alone may not name its model. */
        bool later = j->state == JOB_QUEUED && j->after.n > 0;
        int lrc = later ? jobcfg_load_later(contents, len, j->source, &j->cfg, err, sizeof err)
                        : jobcfg_load_mem(contents, len, j->source, &j->cfg, err, sizeof err);
        if (lrc == 0 && (j->cfg.type != JOBCFG_ENGINE || model_hf_later(&j->cfg) ||
                         model_hf_fill(&j->cfg, err, sizeof err) == 0))
            err[0] = '\0';
        if (switched)
            access_restore(&saved);
    }
    free(contents);
    if (err[0]) {
        /* It stays listed, but without its settings: a half-parsed cfg
         * must not be taken for the job's (its model type, its output
         * directory). */
        memset(&j->cfg, 0, sizeof j->cfg);
        j->cfg_unread = true;
    }
    /* A parse error names the job's source; the copy read is this one
     * (unless the error names it already: it could not be read). */
    char kept[PATH_MAX + 64] = "";
    if (err[0] && !strstr(err, path))
        snprintf(kept, sizeof kept, " (its job file as kept in %s)", path);
    if (err[0] && (j->state == JOB_QUEUED || j->state == JOB_RUNNING)) {
        /* The job can no longer run (a data file vanished, say): say why
         * rather than dropping it. */
        j->state = JOB_FAILED;
        j->finished_at = (double)time(NULL);
        snprintf(j->reason, sizeof j->reason, "at restart: %s", err);
        queue_persist_or_retry(q, j, NULL);
        log_job(LOG_WARN, id, NULL, "queue: job %u (%s) failed at restart: %s%s", id, j->name, err, kept);
    } else if (err[0]) {
        log_job(LOG_WARN, id, NULL, "queue: job %u (%s, %s): %s%s; listed without its settings", id, j->name,
                job_state_name(j->state), err, kept);
    }
    if (j->state == JOB_RUNNING && j->cfg.type == JOBCFG_PROGRAM) {
        /* Its program ended with the daemon, or was orphaned by a crash:
         * started again only if its file asks, as it resumes from
         * checkpoints of its own that gradd knows nothing of. */
        runner_end_orphans(j->pgid, j->uid);
        j->pgid = 0;
        if (j->cfg.restart == JOBCFG_RESTART_ON_FAILURE) {
            j->state = JOB_QUEUED;
            j->resumes++;
            log_job(LOG_INFO, id, NULL, "queue: job %u (%s) was running; queued again ([program] restart = "
                    "on-failure)", id, j->name);
        } else {
            j->state = JOB_FAILED;
            j->finished_at = (double)time(NULL);
            snprintf(j->reason, sizeof j->reason, "daemon restarted");
            log_job(LOG_INFO, id, NULL, "queue: job %u (%s) was running: failed, daemon restarted", id, j->name);
        }
        queue_persist_or_retry(q, j, NULL);
    }
    if (j->state == JOB_RUNNING) {
        /* It was running when the daemon stopped: run it again; the
         * trainer resumes from the job's checkpoint. */
        j->state = JOB_QUEUED;
        queue_persist_or_retry(q, j, NULL);
        log_job(LOG_INFO, id, NULL, "queue: job %u (%s) was running; queued again to resume", id, j->name);
    }
    return j;
}

/* Take STATE_DIR/lock for this process.  The fd, or -1 with err. */
static int lock_state_dir(const char *state_dir, char *err, size_t err_len)
{
    char path[PATH_MAX + 8], note[32], holder[64];
    snprintf(path, sizeof path, "%s/lock", state_dir);
    snprintf(note, sizeof note, "%ld", (long)getpid());
    int fd = fileio_lock(path, 0600, note, holder, sizeof holder);
    if (fd < 0 && errno == EWOULDBLOCK)
        snprintf(err, err_len, "state directory %s is in use by another gradd (pid %s); give this one its own --state-dir",
                 state_dir, holder[0] ? holder : "unknown");
    else if (fd < 0)
        snprintf(err, err_len, "cannot lock %s: %s", path, strerror(errno));
    return fd;
}

int queue_open(queue *q, const char *state_dir, char *err, size_t err_len)
{
    memset(q, 0, sizeof *q);
    q->lock_fd = -1;
    q->max_records_per_user = q->max_bytes_per_user = UINT64_MAX;
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->cond, NULL);
    snprintf(q->dir, sizeof q->dir, "%s/jobs", state_dir);
    if (queue_prepare_dir(q->dir, err, err_len) != 0)
        return -1;
    /* Before anything is read: a second daemon must not requeue the
     * first one's running jobs. */
    q->lock_fd = lock_state_dir(state_dir, err, err_len);
    if (q->lock_fd < 0)
        return -1;
    q->next_id = 1;
    char path[PATH_MAX + 16];
    size_t len;
    snprintf(path, sizeof path, "%s/next_id", q->dir);
    /* A missing or bad next_id costs nothing but a warning: the scan below
     * moves next_id past every job directory, which is all it protects. */
    char *s = read_file(path, 64, &len);
    if (s) {
        char perr[256];
        if (queue_parse_next_id(s, len, &q->next_id, perr, sizeof perr) != 0)
            log_warn("queue: %s:%s; the next id comes from the job directories", path, perr);
        free(s);
    } else if (errno != ENOENT) {
        log_warn("queue: %s: %s; the next id comes from the job directories", path, read_error(errno, 64));
    }
    DIR *d = opendir(q->dir);
    if (!d) {
        snprintf(err, err_len, "cannot read %s: %s", q->dir, strerror(errno));
        close(q->lock_fd);
        q->lock_fd = -1;
        return -1;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        /* A removal that a crash cut short: finish it.  Its id stays used. */
        bool tomb = strncmp(e->d_name, QUEUE_TOMB, strlen(QUEUE_TOMB)) == 0;
        const char *num = tomb ? e->d_name + strlen(QUEUE_TOMB) : e->d_name;
        char *end;
        unsigned long id = strtoul(num, &end, 10);
        if (*end || end == num || id == 0 || id > UINT32_MAX)
            continue;
        /* The directory takes its id even when the job in it is unusable:
         * a new job must not be given the same one. */
        if (id >= q->next_id)
            q->next_id = (uint64_t)id + 1;
        if (tomb) {
            char path[PATH_MAX + 64];
            snprintf(path, sizeof path, "%s/%s", q->dir, e->d_name);
            if (remove_tree(path) != 0)
                log_warn("queue: cannot finish removing %s: %s", path, strerror(errno));
            continue;
        }
        job *j = load_job(q, (uint32_t)id);
        if (j && table_add(q, j) != 0)
            free(j);
    }
    closedir(d);
    /* A dependency that failed at this restart, or whose record is gone. */
    queue_deps_settle(q);
    if (q->n)
        log_info("queue: %zu jobs loaded from %s", q->n, q->dir);
    return 0;
}

void queue_set_acct(queue *q, struct acct_log *a)
{
    pthread_mutex_lock(&q->lock);
    q->acct = a;
    for (size_t i = 0; i < q->n; i++) {
        job *j = q->jobs[i];
        if (j->state != JOB_QUEUED && j->state != JOB_RUNNING && j->accounted_at != j->finished_at)
            queue_persist_or_retry(q, j, NULL);
    }
    pthread_mutex_unlock(&q->lock);
}

void queue_close(queue *q)
{
    /* A last try for what could not be saved (the workers have stopped). */
    queue_save_unsaved(q);
    for (size_t i = 0; i < q->n; i++)
        free(q->jobs[i]);
    free(q->jobs);
    q->jobs = NULL;
    q->n = q->cap = 0;
    pthread_cond_destroy(&q->cond);
    pthread_mutex_destroy(&q->lock);
    if (q->lock_fd >= 0)
        close(q->lock_fd);
    q->lock_fd = -1;
}
