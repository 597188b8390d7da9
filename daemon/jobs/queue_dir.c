/* queue_dir.c — the state directory: created private, and refused unless
 * only the daemon's user (and root) could have put or changed what is in it.
 *
 * Why: every job record there names a uid whose identity the daemon takes
 * to run it.  A directory someone else made or may write (a path in /tmp
 * that another user created first, a group-writable one) lets them plant a
 * record and have the daemon train, as its owner, on the owner's private
 * files.  The same holds for every directory on the way to it: whoever may
 * write one of them may rename the next one away and put their own there.
 */
#include "queue.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* May whoever owns or may write `dir` (a directory on the way to the state
 * directory) replace `next`, the entry in it that the path goes on with
 * (owned by next_uid: a symbolic link's own owner, not its target's)?
 * Root and the daemon's user are trusted; a world-writable directory is
 * fine with the sticky bit (as /tmp), where only the entry's owner may
 * rename it, so long as `next` is then ours.  0, or -1 with err. */
static int check_parent(const char *dir, const struct stat *st, const char *next, uid_t next_uid, char *err,
                        size_t err_len)
{
    uid_t me = geteuid();
    if (st->st_uid != me && st->st_uid != 0) {
        snprintf(err, err_len, "state directory: %s belongs to uid %u, who could replace %s in it; "
                 "choose a state directory on a path that only uid %u and root may change",
                 dir, (unsigned)st->st_uid, next, (unsigned)me);
        return -1;
    }
    if ((st->st_mode & (S_IWGRP | S_IWOTH)) && !(st->st_mode & S_ISVTX)) {
        snprintf(err, err_len, "state directory: %s is writable by %s (mode %04o), who could replace %s in it; "
                 "choose a state directory on a path that only uid %u and root may change",
                 dir, st->st_mode & S_IWOTH ? "others" : "its group", (unsigned)(st->st_mode & 07777), next,
                 (unsigned)me);
        return -1;
    }
    if ((st->st_mode & (S_IWGRP | S_IWOTH)) && next_uid != me && next_uid != 0) {
        snprintf(err, err_len, "state directory: %s belongs to uid %u, not to uid %u that gradd runs as, and "
                 "is in %s, which others may write: someone else made it",
                 next, (unsigned)next_uid, (unsigned)me, dir);
        return -1;
    }
    return 0;
}

/* Create `path` (mode 0700) unless it is there; stat it, and say who owns
 * the entry itself (a link's owner may point it elsewhere). */
static int make_and_stat(const char *path, struct stat *st, uid_t *entry_uid, char *err, size_t err_len)
{
    if (mkdir(path, 0700) != 0 && errno != EEXIST) {
        snprintf(err, err_len, "state directory: cannot create %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat lst;
    if (lstat(path, &lst) != 0 || stat(path, st) != 0) {
        snprintf(err, err_len, "state directory: cannot inspect %s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st->st_mode)) {
        snprintf(err, err_len, "state directory: %s is not a directory", path);
        return -1;
    }
    *entry_uid = lst.st_uid;
    return 0;
}

int queue_prepare_dir(const char *dir, char *err, size_t err_len)
{
    char path[PATH_MAX];
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    if (n == 0 || n >= sizeof path) {
        snprintf(err, err_len, "state directory: '%s' is %s", dir, n ? "too long" : "empty");
        return -1;
    }
    memcpy(path, dir, n);
    path[n] = '\0';
    /* From the root (or the current directory, for a relative path) down:
     * each directory on the way, made if missing, and the next one in it. */
    struct stat up, st;
    memset(&st, 0, sizeof st);
    char *s = path[0] == '/' ? path + 1 : path;
    bool have_up = false;
    if (path[0] == '/') {
        if (stat("/", &up) != 0) {
            snprintf(err, err_len, "state directory: cannot inspect /: %s", strerror(errno));
            return -1;
        }
        have_up = true;
        st = up; /* the state directory "/" */
    }
    char parent[PATH_MAX] = "/";
    for (;;) {
        char *slash = strchr(s, '/');
        if (slash)
            *slash = '\0';
        if (*s) { /* "a//b": no component between */
            uid_t entry_uid;
            if (make_and_stat(path, &st, &entry_uid, err, err_len) != 0)
                return -1;
            if (have_up && check_parent(parent, &up, path, entry_uid, err, err_len) != 0)
                return -1;
            snprintf(parent, sizeof parent, "%s", path);
            up = st;
            have_up = true;
        }
        if (!slash)
            break;
        *slash = '/';
        s = slash + 1;
    }
    uid_t me = geteuid();
    if (st.st_uid != me) {
        snprintf(err, err_len, "state directory %s belongs to uid %u, not to uid %u that gradd runs as; "
                 "refusing to run the jobs recorded in it (set [daemon] state_dir or --state-dir to a directory "
                 "of this user's)", path, (unsigned)st.st_uid, (unsigned)me);
        return -1;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(err, err_len, "state directory %s is writable by %s (mode %04o); refusing to run the jobs "
                 "recorded in it (chmod go-w %s)", path, st.st_mode & S_IWOTH ? "others" : "its group",
                 (unsigned)(st.st_mode & 07777), path);
        return -1;
    }
    return 0;
}
