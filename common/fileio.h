/* fileio.h — small file helpers every writer of ours needs. */
#ifndef GRADD_FILEIO_H
#define GRADD_FILEIO_H

#include <stddef.h>
#include <sys/types.h>

/* Write all n bytes, retrying short writes and EINTR.  0, or -1 with errno
 * set (EIO when the descriptor accepts nothing). */
int fileio_write_all(int fd, const void *buf, size_t n);

/* Hold path (created `mode`, less the umask, if missing) with flock for as
 * long as the returned descriptor is open; a crash releases it.  The file
 * then says who holds it (note, e.g. "pid 12, job 3").  -1 with errno set where it
 * cannot; EWOULDBLOCK where another holds it, with that holder's note (up
 * to its first newline) in holder[0..holder_len). */
int fileio_lock(const char *path, mode_t mode, const char *note, char *holder, size_t holder_len);

/* mkdir -p: the parents 0777 (less the umask), the last one `mode`; what
 * exists already is kept as it is.  0, or -1 with "cannot create ..." in
 * err, naming the last one as `what` (e.g. "output directory"). */
int fileio_mkdirs(const char *path, mode_t mode, const char *what, char *err, size_t err_len);

#endif
