/* fileio.h — small file helpers every writer of ours needs. */
#ifndef GRADD_FILEIO_H
#define GRADD_FILEIO_H

#include <stddef.h>

/* Write all n bytes, retrying short writes and EINTR.  0, or -1 with errno
 * set (EIO when the descriptor accepts nothing). */
int fileio_write_all(int fd, const void *buf, size_t n);

#endif
