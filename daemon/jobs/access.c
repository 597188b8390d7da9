/* access.c — per-thread filesystem identity (setfsuid, setfsgid and a
 * per-thread setgroups through the raw system calls). */
#include "access.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fileio.h"

/* glibc's setgroups changes every thread of the process; the system call
 * itself changes only the caller, which is what a worker needs. */
static int thread_setgroups(int n, const gid_t *groups)
{
    return (int)syscall(SYS_setgroups, (size_t)n, groups);
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
    gid_t groups[ACCESS_MAX_GROUPS];
    int n = ACCESS_MAX_GROUPS;
    struct passwd pw, *res = NULL;
    char buf[4096];
    if (getpwuid_r(uid, &pw, buf, sizeof buf, &res) == 0 && res) {
        if (getgrouplist(pw.pw_name, gid, groups, &n) < 0)
            n = 0;
    } else {
        groups[0] = gid;
        n = 1;
    }
    saved->ngroups = getgroups(ACCESS_MAX_GROUPS, saved->groups);
    if (saved->ngroups < 0)
        saved->ngroups = 0;
    saved->fsgid = (gid_t)setfsgid((gid_t)-1);
    saved->fsuid = (uid_t)setfsuid((uid_t)-1);
    /* Groups and gid first: after setfsuid the thread may no longer be
     * allowed to change them. */
    if (thread_setgroups(n, groups) != 0) {
        snprintf(err, err_len, why_fail, (unsigned)geteuid(), (unsigned)uid);
        return -1;
    }
    setfsgid(gid);
    setfsuid(uid);
    /* setfsuid reports the previous value, never an error: check it took. */
    if ((uid_t)setfsuid((uid_t)-1) != uid || (gid_t)setfsgid((gid_t)-1) != gid) {
        setfsuid(saved->fsuid);
        setfsgid(saved->fsgid);
        thread_setgroups(saved->ngroups, saved->groups);
        snprintf(err, err_len, why_fail, (unsigned)geteuid(), (unsigned)uid);
        return -1;
    }
    saved->switched = true;
    return 0;
}

void access_restore(const access_saved *saved)
{
    if (!saved->switched)
        return;
    setfsuid(saved->fsuid);
    setfsgid(saved->fsgid);
    thread_setgroups(saved->ngroups, saved->groups);
}

/* Open for reading as the current filesystem identity. */
static int check_readable(const job_config *j, const char *key, const char *path, char *err, size_t err_len)
{
    if (!path[0])
        return 0;
    char where[PATH_MAX + 64];
    jobcfg_where(j, "data", key, where, sizeof where);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
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

static int make_writable_dir(const job_config *j, char *err, size_t err_len)
{
    const char *path = j->out_dir;
    char where[PATH_MAX + 64], tmp[PATH_MAX];
    jobcfg_where(j, "output", "dir", where, sizeof where);
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *s = tmp + 1;; s++) {
        if (*s != '/' && *s)
            continue;
        char c = *s;
        *s = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) {
            snprintf(err, err_len, "%s: cannot create %s: %s", where, tmp, strerror(errno));
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
    if (fd < 0) {
        snprintf(err, err_len, "%s: cannot write in %s: %s", where, path, strerror(errno));
        return -1;
    }
    close(fd);
    unlink(probe);
    return 0;
}

int access_check_job(uid_t uid, gid_t gid, const job_config *j, char *err, size_t err_len)
{
    access_saved saved;
    if (access_become(uid, gid, &saved, err, err_len) != 0)
        return -1;
    int rc = check_readable(j, "train", j->train, err, err_len);
    if (rc == 0)
        rc = check_readable(j, "train_labels", j->train_labels, err, err_len);
    if (rc == 0)
        rc = check_readable(j, "val", j->val, err, err_len);
    if (rc == 0)
        rc = check_readable(j, "val_labels", j->val_labels, err, err_len);
    if (rc == 0)
        rc = make_writable_dir(j, err, err_len);
    access_restore(&saved);
    return rc;
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
