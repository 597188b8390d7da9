/* sockfile.c — the socket file: whether a path may be trusted and
 * replaced, binding it so that no client ever finds it half made, and
 * removing it at shutdown only if it is still ours.  Under socket
 * activation systemd owns the file and this only serves its fd. */
#include "server_internal.h"

#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/log.h"
#include "svc.h"

int server_probe_path(const char *path, char *err, size_t err_len)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return 0;
        snprintf(err, err_len, "cannot inspect %s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISSOCK(st.st_mode)) {
        snprintf(err, err_len, "%s exists and is not a socket; refusing to replace it", path);
        return -1;
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, err_len, "socket: %s", strerror(errno));
        return -1;
    }
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    int e = errno;
    close(fd);
    if (rc == 0) {
        snprintf(err, err_len, "another gradd is already serving on %s (stop it, or use -s PATH)", path);
        return -1;
    }
    if (e == ECONNREFUSED) {
        /* Nobody listens: a crashed daemon's leftover.  Replace it. */
        if (unlink(path) != 0 && errno != ENOENT) {
            snprintf(err, err_len, "cannot remove stale socket %s: %s", path, strerror(errno));
            return -1;
        }
        log_info("removed stale socket %s", path);
        return 0;
    }
    snprintf(err, err_len, "cannot tell whether %s is in use: %s", path, strerror(e));
    return -1;
}

/* Create the socket's directory if needed, and refuse one that someone else
 * could swap the socket in. */
static int prepare_dir(const char *path, char *err, size_t err_len)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return 0;
    *slash = '\0';
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno != ENOENT || mkdir(dir, geteuid() == 0 ? 0755 : 0700) != 0) {
            snprintf(err, err_len, "cannot create socket directory %s: %s", dir, strerror(errno));
            return -1;
        }
        return 0;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, err_len, "socket directory %s is not a directory", dir);
        return -1;
    }
    if ((st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX)) {
        snprintf(err, err_len, "socket directory %s is world-writable without the sticky bit", dir);
        return -1;
    }
    if (st.st_uid != geteuid() && st.st_uid != 0) {
        snprintf(err, err_len, "socket directory %s belongs to uid %u, not to this user", dir,
                 (unsigned)st.st_uid);
        return -1;
    }
    return 0;
}

/* Accept connections on the listening socket fd: 0, or a libuv error with
 * the handle closed. */
static int serve_fd(server *s, int fd)
{
    uv_pipe_init(&s->loop, &s->listener, 0);
    s->listener.data = s;
    int rc = uv_pipe_open(&s->listener, fd);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&s->listener, 1024, server_accept);
    if (rc != 0)
        uv_close((uv_handle_t *)&s->listener, NULL);
    return rc;
}

int server_bind(server *s, const char *path, char *err, size_t err_len)
{
    int fd = svc_listen_fd();
    if (fd >= 0) {
        /* systemd made and owns the socket (gradd.socket): serve it, and
         * leave it in place at shutdown. */
        int rc = serve_fd(s, fd);
        if (rc != 0) {
            snprintf(err, err_len, "cannot serve the socket systemd passed (fd %d): %s", fd, uv_strerror(rc));
            return -1;
        }
        size_t len = sizeof s->path;
        if (uv_pipe_getsockname(&s->listener, s->path, &len) != 0)
            snprintf(s->path, sizeof s->path, "(fd %d from systemd)", fd);
        s->activated = true;
        return 0;
    }
    /* The socket is made under a temporary name and linked into place only
     * once it listens and has its group: a client (or a script waiting for
     * the file) never finds it refusing connections or in the wrong group.
     * link(), unlike rename(), fails where the path exists, so two daemons
     * starting at once cannot replace each other's socket.  The fd is ours,
     * not bound through libuv, whose close would unlink the path even when
     * it is no longer our socket. */
    if (!path[0]) {
        snprintf(err, err_len, "no socket path: XDG_RUNTIME_DIR is unset (gradd makes none in a shared directory "
                 "such as /tmp, where another user could make it first); set [daemon] socket or pass -s PATH");
        return -1;
    }
    if (strlen(path) > CONFIG_SOCKET_PATH_MAX) {
        snprintf(err, err_len, "socket path %s is too long (at most %d bytes)", path, CONFIG_SOCKET_PATH_MAX);
        return -1;
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    char suffix[32];
    snprintf(suffix, sizeof suffix, ".%ld.new", (long)getpid());
    if (prepare_dir(path, err, err_len) != 0 || server_probe_path(path, err, err_len) != 0)
        return -1;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s%s", path, suffix);
    const char *tmp = sa.sun_path;
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, err_len, "socket: %s", strerror(errno));
        return -1;
    }
    unlink(tmp); /* a leftover of a crashed daemon that had our pid */
    /* Created 0660 from the start: no window where others could connect. */
    mode_t old = umask(0117);
    int brc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
    int e = errno;
    umask(old);
    if (brc != 0 || listen(fd, 1024) != 0) {
        e = brc != 0 ? e : errno;
        snprintf(err, err_len, "cannot listen on %s: %s", tmp, strerror(e));
        if (brc == 0)
            unlink(tmp);
        close(fd);
        return -1;
    }
    /* Hand the socket to the group of gradd's users when we may. */
    struct group *g = s->ctx->cfg.socket_group[0] ? getgrnam(s->ctx->cfg.socket_group) : NULL;
    if (s->ctx->cfg.socket_group[0] && !g)
        log_warn("[daemon] socket_group: there is no group '%s' here; the socket stays in this process's group, "
                 "so only its members and root can use gradd", s->ctx->cfg.socket_group);
    if (g && chown(tmp, (uid_t)-1, g->gr_gid) != 0)
        log_debug("socket %s stays in its current group: %s", path, strerror(errno));
    int lrc = link(tmp, path);
    e = errno;
    if (lrc != 0 && (e == EPERM || e == EOPNOTSUPP || e == ENOSYS)) {
        /* A filesystem without hard links: rename, which replaces what is
         * there, after the probe above found nothing live at path. */
        lrc = rename(tmp, path);
        e = errno;
    }
    unlink(tmp);
    if (lrc != 0) {
        if (e == EEXIST)
            snprintf(err, err_len, "%s appeared while gradd was starting (another gradd?); not replaced", path);
        else
            snprintf(err, err_len, "cannot create %s: %s", path, strerror(e));
        close(fd);
        return -1;
    }
    struct stat st;
    if (stat(path, &st) == 0) {
        s->sock_dev = st.st_dev;
        s->sock_ino = st.st_ino;
    }
    int rc = serve_fd(s, fd);
    if (rc != 0) {
        snprintf(err, err_len, "cannot listen on %s: %s", path, uv_strerror(rc));
        unlink(path);
        return -1;
    }
    snprintf(s->path, sizeof s->path, "%s", path);
    return 0;
}

void server_unlink(server *s)
{
    struct stat st;
    if (!s->activated && s->path[0] && stat(s->path, &st) == 0 && st.st_dev == s->sock_dev && st.st_ino == s->sock_ino)
        unlink(s->path);
}
