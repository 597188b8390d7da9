/* access.c — per-thread filesystem identity (setfsuid, setfsgid and a
 * per-thread setgroups through the raw system calls). */
#include "access.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pthread.h>
#include <pwd.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "argsplit.h"
#include "fileio.h"
#include "jobend.h"
#include "outdir.h"

/* glibc's setgroups changes every thread of the process; the system call
 * itself changes only the caller, which is what a worker needs. */
static int thread_setgroups(int n, const gid_t *groups)
{
    return (int)syscall(SYS_setgroups, (size_t)n, groups);
}

/* The groups of user `name` with primary group gid, as getgrouplist gives
 * them: into a buffer grown to what it asks for, since a fixed one would
 * come back empty (-1) for a user in more groups than it holds, and the job
 * would run without any of them.  0, or -1 with err. */
static int user_groups(const char *name, gid_t gid, gid_t **out, int *n, char *err, size_t err_len)
{
    long max = sysconf(_SC_NGROUPS_MAX);
    if (max <= 0)
        max = NGROUPS_MAX;
    int cap = 64;
    gid_t *g = NULL;
    for (;;) {
        gid_t *bigger = realloc(g, (size_t)cap * sizeof *g);
        if (!bigger) {
            free(g);
            snprintf(err, err_len, "out of memory for the %d groups of %s", cap, name);
            return -1;
        }
        g = bigger;
        int want = cap;
        if (getgrouplist(name, gid, g, &want) >= 0) {
            *out = g;
            *n = want;
            return 0;
        }
        /* -1 with want set to how many there are; the kernel takes at most
         * max for one thread, and fewer would silently drop some. */
        if (want > max) {
            free(g);
            snprintf(err, err_len, "user %s is in %d groups, more than the %ld this system allows a process "
                     "(NGROUPS_MAX)", name, want, max);
            return -1;
        }
        cap = want > cap ? want : cap * 2;
    }
}

/* The calling thread's own supplementary groups, malloc'd (NULL for none). */
static int thread_groups(gid_t **out, int *n)
{
    *out = NULL;
    *n = 0;
    for (;;) {
        int k = getgroups(0, NULL);
        if (k <= 0)
            return k;
        gid_t *g = malloc((size_t)k * sizeof *g);
        if (!g)
            return -1;
        int got = getgroups(k, g);
        if (got >= 0) {
            *out = g;
            *n = got;
            return 0;
        }
        free(g);
        if (errno != EINVAL)
            return -1; /* EINVAL: they changed between the calls; again */
    }
}

int access_groups(uid_t uid, gid_t gid, gid_t **out, int *n, char *err, size_t err_len)
{
    struct passwd pw, *res = NULL;
    char buf[4096];
    if (getpwuid_r(uid, &pw, buf, sizeof buf, &res) == 0 && res)
        return user_groups(pw.pw_name, gid, out, n, err, err_len);
    if (!(*out = malloc(sizeof **out))) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    (*out)[0] = gid;
    *n = 1;
    return 0;
}

int access_become(uid_t uid, gid_t gid, access_saved *saved, char *err, size_t err_len)
{
    memset(saved, 0, sizeof *saved);
    if (uid == geteuid())
        return 0; /* the daemon's own user: nothing to change */
    /* Root, or a service user with CAP_SETUID and CAP_SETGID, may switch;
     * anyone else fails below, with the same explanation. */
    const char *why_fail = "gradd runs as uid %u and cannot act for uid %u; run it as root or give it "
                           "CAP_SETUID and CAP_SETGID";
    gid_t *groups = NULL;
    int n = 0;
    if (access_groups(uid, gid, &groups, &n, err, err_len) != 0)
        return -1;
    if (thread_groups(&saved->groups, &saved->ngroups) != 0) {
        snprintf(err, err_len, "cannot read this thread's groups: %s", strerror(errno));
        free(groups);
        return -1;
    }
    saved->fsgid = (gid_t)setfsgid((gid_t)-1);
    saved->fsuid = (uid_t)setfsuid((uid_t)-1);
    /* Groups and gid first: after setfsuid the thread may no longer be
     * allowed to change them. */
    int rc = thread_setgroups(n, groups);
    free(groups);
    if (rc != 0) {
        snprintf(err, err_len, why_fail, (unsigned)geteuid(), (unsigned)uid);
        free(saved->groups);
        saved->groups = NULL;
        return -1;
    }
    setfsgid(gid);
    setfsuid(uid);
    /* setfsuid reports the previous value, never an error: check it took. */
    if ((uid_t)setfsuid((uid_t)-1) != uid || (gid_t)setfsgid((gid_t)-1) != gid) {
        setfsuid(saved->fsuid);
        setfsgid(saved->fsgid);
        thread_setgroups(saved->ngroups, saved->groups);
        free(saved->groups);
        saved->groups = NULL;
        snprintf(err, err_len, why_fail, (unsigned)geteuid(), (unsigned)uid);
        return -1;
    }
    saved->switched = true;
    return 0;
}

void access_restore(access_saved *saved)
{
    if (!saved->switched)
        return;
    setfsuid(saved->fsuid);
    setfsgid(saved->fsgid);
    thread_setgroups(saved->ngroups, saved->groups);
    free(saved->groups);
    saved->groups = NULL;
    saved->switched = false;
}

/* Open for reading as the current filesystem identity. */
static int check_readable(const job_config *j, const char *key, const char *path, char *err, size_t err_len)
{
    if (!path[0])
        return 0;
    char where[PATH_MAX + 64];
    jobcfg_where(j, "data", key, where, sizeof where);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 && errno == ENOENT && j->inputs_later)
        return 0; /* a job this one runs after makes it: checked at start */
    if (fd < 0) {
        snprintf(err, err_len, "%s: %s: %s", where, path, strerror(errno));
        return -1;
    }
    struct stat st;
    int rc = 0;
    /* A FIFO or a device would block or misbehave when the job reads it:
     * refused now, naming it, rather than failing the job later. */
    bool stated = fstat(fd, &st) == 0;
    if (stated && !S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
        snprintf(err, err_len, "%s: %s: not a regular file (%s)", where, path, fileio_kind(st.st_mode));
        close(fd);
        return -1;
    }
    if (stated && S_ISDIR(st.st_mode)) {
        /* A directory of text files: every file in it must be readable. */
        DIR *d = fdopendir(fd);
        struct dirent *e;
        while (d && rc == 0 && (e = readdir(d))) {
            if (e->d_name[0] == '.')
                continue;
            int f = openat(dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
            if (f < 0 && errno != ELOOP) {
                snprintf(err, err_len, "%s: %s/%s: %s", where, path, e->d_name, strerror(errno));
                rc = -1;
            }
            if (f >= 0)
                close(f);
        }
        if (d)
            closedir(d);
        return rc;
    }
    close(fd);
    return 0;
}

/* Take back the directories that make_writable_dir made: tmp is the
 * path, created the offset of the first one it made (0: none). */
static void unmake_dirs(char *tmp, size_t created)
{
    if (!created)
        return;
    for (;;) {
        if (rmdir(tmp) != 0)
            return;
        char *slash = strrchr(tmp, '/');
        if (!slash || (size_t)(slash - tmp) < created)
            return;
        *slash = '\0';
    }
}

/* Whether the owner can have [output] dir: made (mkdir -p) and written to,
 * then what was made is taken back.  The job makes it when it starts, so
 * a submit refused, by this check or a later one, leaves nothing behind. */
static int make_writable_dir(const job_config *j, char *err, size_t err_len)
{
    const char *path = j->out_dir;
    char where[PATH_MAX + 64], tmp[PATH_MAX];
    jobcfg_where(j, "output", "dir", where, sizeof where);
    snprintf(tmp, sizeof tmp, "%s", path);
    size_t created = 0;
    for (char *s = tmp + 1;; s++) {
        if (*s != '/' && *s)
            continue;
        char c = *s;
        *s = '\0';
        if (mkdir(tmp, 0777) == 0) {
            if (!created)
                created = (size_t)(s - tmp);
        } else if (errno != EEXIST) {
            snprintf(err, err_len, "%s: cannot create %s: %s", where, tmp, strerror(errno));
            char *slash = strrchr(tmp, '/'); /* tmp itself was not made */
            if (slash && slash > tmp) {
                *slash = '\0';
                unmake_dirs(tmp, created);
            }
            return -1;
        }
        *s = c;
        if (!c)
            break;
    }
    /* Prove writability by creating a file, as the owner. */
    char probe[PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/.gradd-probe-%d", path, (int)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    int rc = 0;
    if (fd < 0) {
        snprintf(err, err_len, "%s: cannot write in %s: %s", where, path, strerror(errno));
        rc = -1;
    } else {
        close(fd);
        unlink(probe);
    }
    unmake_dirs(tmp, created);
    return rc;
}

int access_own_fs(char *err, size_t err_len)
{
    if (unshare(CLONE_FS) != 0) {
        snprintf(err, err_len, "cannot give a job thread its own umask (unshare CLONE_FS): %s", strerror(errno));
        return -1;
    }
    return 0;
}

/* ---- program jobs ---------------------------------------------------------------- */

/* An executable regular file, as the current filesystem identity:
 * faccessat with AT_EACCESS asks as the fsuid, where access() would ask
 * as the daemon's real uid. */
static int executable(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return -1;
    if (!S_ISREG(st.st_mode)) {
        errno = S_ISDIR(st.st_mode) ? EISDIR : EACCES;
        return -1;
    }
    return faccessat(AT_FDCWD, path, X_OK, AT_EACCESS);
}

int access_find_executable(const char *where, const char *path_var, const char *workdir, const char *argv0,
                           char *out, size_t out_len, char *err, size_t err_len)
{
    if (!argv0[0]) {
        snprintf(err, err_len, "%s: the program's name is empty", where);
        return -1;
    }
    if (strchr(argv0, '/')) {
        /* Relative to its working directory, as the program would see it. */
        while (argv0[0] == '.' && argv0[1] == '/')
            argv0 += 2;
        if ((size_t)snprintf(out, out_len, "%s%s%s", argv0[0] == '/' ? "" : workdir, argv0[0] == '/' ? "" : "/",
                             argv0) >= out_len) {
            snprintf(err, err_len, "%s: %s: path is too long", where, argv0);
            return -1;
        }
        if (executable(out) == 0)
            return 0;
        snprintf(err, err_len, "%s: cannot execute %s: %s", where, out, strerror(errno));
        return -1;
    }
    char dirs[JOBCFG_COMMAND_MAX];
    snprintf(dirs, sizeof dirs, "%s", path_var);
    int first_errno = ENOENT;
    for (char *save = NULL, *dir = strtok_r(dirs, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
        if ((size_t)snprintf(out, out_len, "%s%s%s/%s", dir[0] == '/' ? "" : workdir, dir[0] == '/' ? "" : "/",
                             dir, argv0) >= out_len)
            continue;
        if (executable(out) == 0)
            return 0;
        /* Like execvp: a file found but not executable says so, rather
         * than "not found" from a later directory. */
        if (errno != ENOENT && errno != ENOTDIR && first_errno == ENOENT)
            first_errno = errno;
    }
    snprintf(err, err_len, "%s: cannot execute %s: %s (PATH=%s)", where, argv0,
             first_errno == ENOENT ? "not found" : strerror(first_errno), path_var);
    return -1;
}

int access_find_command(const job_config *j, const char *argv0, char *out, size_t out_len, char *err,
                        size_t err_len)
{
    char where[PATH_MAX + 64], path_var[JOBCFG_COMMAND_MAX];
    jobcfg_where(j, "program", "command", where, sizeof where);
    access_program_path(j, path_var, sizeof path_var);
    return access_find_executable(where, path_var, j->workdir, argv0, out, out_len, err, err_len);
}

void access_program_path(const job_config *j, char *out, size_t out_len)
{
    snprintf(out, out_len, "%s", ACCESS_DEFAULT_PATH);
    char words[JOBCFG_COMMAND_MAX], why[128];
    int n = argsplit(j->env, words, sizeof words, why, sizeof why);
    const char *w = words;
    for (int i = 0; i < n; i++, w = argsplit_next(w))
        if (!strncmp(w, "PATH=", 5))
            snprintf(out, out_len, "%s", w + 5);
}

/* The working directory exists and the owner may enter it. */
static int check_workdir(const job_config *j, char *err, size_t err_len)
{
    char where[PATH_MAX + 64];
    struct stat st;
    int rc = stat(j->workdir, &st);
    if (rc == 0 && !S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        rc = -1;
    }
    if (rc == 0)
        rc = faccessat(AT_FDCWD, j->workdir, X_OK, AT_EACCESS);
    if (rc == 0)
        return 0;
    snprintf(err, err_len, "%s: cannot enter %s: %s", jobcfg_where(j, "program", "workdir", where, sizeof where),
             j->workdir, strerror(errno));
    return -1;
}

static int check_program(const job_config *j, char *err, size_t err_len)
{
    if (check_workdir(j, err, err_len) != 0)
        return -1;
    char words[JOBCFG_COMMAND_MAX], why[128], path[PATH_MAX];
    if (argsplit(j->command, words, sizeof words, why, sizeof why) < 1) {
        char where[PATH_MAX + 64];
        snprintf(err, err_len, "%s: %s", jobcfg_where(j, "program", "command", where, sizeof where), why);
        return -1;
    }
    if (access_find_command(j, words, path, sizeof path, err, err_len) != 0)
        return -1;
    return j->out_dir[0] ? make_writable_dir(j, err, err_len) : 0;
}

typedef struct {
    uid_t uid;
    gid_t gid;
    mode_t mask;
    const job_config *j;
    char *err;
    size_t err_len;
    int rc;
} check_args;

static void *check_job_thread(void *arg)
{
    check_args *a = arg;
    a->rc = -1;
    if (access_own_fs(a->err, a->err_len) != 0)
        return NULL;
    umask(a->mask);
    access_saved saved;
    if (access_become(a->uid, a->gid, &saved, a->err, a->err_len) != 0)
        return NULL;
    const job_config *j = a->j;
    if (j->type == JOBCFG_PROGRAM) {
        a->rc = check_program(j, a->err, a->err_len);
        if (a->rc == 0)
            a->rc = jobend_check(j, a->err, a->err_len);
        access_restore(&saved);
        return NULL;
    }
    int rc = check_readable(j, "train", j->train, a->err, a->err_len);
    if (rc == 0)
        rc = check_readable(j, "train_labels", j->train_labels, a->err, a->err_len);
    if (rc == 0)
        rc = check_readable(j, "val", j->val, a->err, a->err_len);
    if (rc == 0)
        rc = check_readable(j, "val_labels", j->val_labels, a->err, a->err_len);
    if (rc == 0)
        rc = make_writable_dir(j, a->err, a->err_len);
    if (rc == 0)
        rc = outdir_check_resume(j, a->err, a->err_len);
    if (rc == 0)
        rc = jobend_check(j, a->err, a->err_len);
    access_restore(&saved);
    a->rc = rc;
    return NULL;
}

int access_check_job(uid_t uid, gid_t gid, mode_t mask, const job_config *j, char *err, size_t err_len)
{
    /* The output directory it may create is the owner's, with their
     * umask: on a thread of its own, whose umask is no other's. */
    check_args a = {uid, gid, mask & 0777, j, err, err_len, -1};
    pthread_t t;
    int e = pthread_create(&t, NULL, check_job_thread, &a);
    if (e != 0) {
        snprintf(err, err_len, "cannot start a thread to check the job's files: %s", strerror(e));
        return -1;
    }
    pthread_join(t, NULL);
    return a.rc;
}

bool access_is_admin(uid_t uid, gid_t gid, const char *group)
{
    if (uid == 0)
        return true;
    if (!group || !*group)
        return false;
    struct group gr, *g = NULL;
    char buf[8192];
    if (getgrnam_r(group, &gr, buf, sizeof buf, &g) != 0 || !g)
        return false;
    if (gid == g->gr_gid)
        return true;
    struct passwd pw, *p = NULL;
    char pbuf[4096];
    if (getpwuid_r(uid, &pw, pbuf, sizeof pbuf, &p) != 0 || !p)
        return false;
    for (char **m = g->gr_mem; *m; m++)
        if (strcmp(*m, p->pw_name) == 0)
            return true;
    return p->pw_gid == g->gr_gid;
}
