/* fileio.c — write_all, opening a file that must be regular without
 * blocking, and a lock file that names its holder. */
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errmsg.h"

int fileio_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        /* Linux writes at most ~2 GiB per call; ask for no more than 1 GiB. */
        size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        ssize_t w = write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (w == 0) {
            errno = EIO;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

const char *fileio_kind(mode_t mode)
{
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISLNK(mode))
        return "a symbolic link";
    return S_ISREG(mode) ? "a regular file" : "of an unknown type";
}

static int not_regular(const char *path, mode_t mode, char *err, size_t err_len)
{
    errmsg_set(err, err_len, "%s: not a regular file (%s)", path, fileio_kind(mode));
    errno = EINVAL;
    return -1;
}

int fileio_open_regular(const char *path, int flags, mode_t mode, char *err, size_t err_len)
{
    /* Look first, so that a device is refused before open(2) could do
     * anything to it (a tape rewinds on open).  The fstat below decides:
     * the name may be swapped in between. */
    struct stat st;
    int looked = flags & O_NOFOLLOW ? lstat(path, &st) : stat(path, &st);
    if (looked == 0 && !S_ISREG(st.st_mode))
        return not_regular(path, st.st_mode, err, err_len);
    /* O_NONBLOCK: opening a FIFO waits for the other end, and some devices
     * wait for a carrier; no regular file ever does. */
    int fd = open(path, flags | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, mode);
    if (fd < 0) {
        int e = errno;
        /* A FIFO swapped in after the look: no reader (ENXIO), or a link
         * under O_NOFOLLOW (ELOOP). */
        if ((e == ENXIO || e == ELOOP) && lstat(path, &st) == 0 && !S_ISREG(st.st_mode))
            return not_regular(path, st.st_mode, err, err_len);
        errmsg_set(err, err_len, "%s: cannot open: %s", path, strerror(e));
        errno = e;
        return -1;
    }
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        errmsg_set(err, err_len, "%s: cannot stat: %s", path, strerror(e));
        errno = e;
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return not_regular(path, st.st_mode, err, err_len);
    }
    /* Reads and writes of a regular file never return EAGAIN, but a FILE*
     * or a caller that checks its flags should see what it asked for. */
    if (!(flags & O_NONBLOCK)) {
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
            int e = errno;
            close(fd);
            errmsg_set(err, err_len, "%s: fcntl: %s", path, strerror(e));
            errno = e;
            return -1;
        }
    }
    return fd;
}

int fileio_lock(const char *path, mode_t mode, const char *note, char *holder, size_t holder_len)
{
    if (holder_len)
        holder[0] = '\0';
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0)
        return -1;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        if (e == EWOULDBLOCK && holder_len > 1) {
            ssize_t n = pread(fd, holder, holder_len - 1, 0);
            holder[n > 0 ? n : 0] = '\0';
            holder[strcspn(holder, "\n")] = '\0';
        }
        close(fd);
        errno = e;
        return -1;
    }
    /* The note is best effort: the lock holds without it. */
    if (ftruncate(fd, 0) == 0 && fileio_write_all(fd, note, strlen(note)) == 0)
        (void)fileio_write_all(fd, "\n", 1);
    return fd;
}

int fileio_mkdirs(const char *path, mode_t mode, const char *what, char *err, size_t err_len)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, 0777) != 0 && errno != EEXIST) {
            snprintf(err, err_len, "cannot create %s: %s", tmp, strerror(errno));
            return -1;
        }
        *p = '/';
    }
    if (mkdir(tmp, mode) != 0 && errno != EEXIST) {
        snprintf(err, err_len, "cannot create %s %s: %s", what, tmp, strerror(errno));
        return -1;
    }
    return 0;
}
