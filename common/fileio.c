/* fileio.c — write_all, and a lock file that names its holder. */
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

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
