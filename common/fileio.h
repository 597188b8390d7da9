/* fileio.h — small file helpers every writer of ours needs. */
#ifndef GRADD_FILEIO_H
#define GRADD_FILEIO_H

#include <stddef.h>
#include <sys/types.h>

/* Write all n bytes, retrying short writes and EINTR.  0, or -1 with errno
 * set (EIO when the descriptor accepts nothing). */
int fileio_write_all(int fd, const void *buf, size_t n);

/* Open path with open(2)'s flags and mode (O_CLOEXEC and O_NOCTTY
 * added) in a way that cannot block, and only if it is a regular file:
 * a FIFO or a device there (a user's "data" or a name in their output
 * directory) would stop the thread that opens it, or worse.  The open
 * itself is O_NONBLOCK, cleared afterwards unless flags ask for it; with
 * O_NOFOLLOW a symbolic link counts as not regular.  The descriptor, or
 * -1 with errno set (EINVAL: not a regular file) and err saying
 * "PATH: not a regular file (a FIFO)" or "PATH: cannot open: REASON". */
int fileio_open_regular(const char *path, int flags, mode_t mode, char *err, size_t err_len);
/* What kind of file a mode is, for a message: "a FIFO", "a directory"... */
const char *fileio_kind(mode_t mode);

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
