/* fileio.c — write_all. */
#include "fileio.h"

#include <errno.h>
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
