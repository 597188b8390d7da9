/* joblog.h — a job's log in the state dir, bounded to [daemon] max_job_log.
 *
 * The file is the log's head (its first half, cut after a whole line: how
 * the job started, the first steps), then, once it would pass the bound,
 * one marker line saying how many bytes were dropped, then the newest
 * lines.  Readers (gradctl logs) may read it at any moment: the file is
 * only ever appended to, or replaced whole by rename, so they see one
 * consistent version.
 *
 * Why no ring of the newest bytes in memory: every byte written is already
 * on disk, in the file itself, so the tail is copied from there when the
 * file is rewritten.  Memory is one copy buffer; disk is the bound, plus a
 * second copy of at most three quarters of it while a rewrite is under way.
 * A rewrite keeps half the room past the head, so it happens once per
 * quarter of max_job_log appended, however short the lines.
 *
 * The owner's stored bytes may stop a log (joblog_stop): it is cut back to
 * its head (or what it has, if less) and one marker saying why, and
 * nothing more is kept.
 */
#ifndef GRADD_JOBLOG_H
#define GRADD_JOBLOG_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Every marker line starts with this, which is how a log reopened after a
 * restart finds where its head ends. */
#define JOBLOG_MARKER "== [log: "

typedef struct joblog {
    int fd;              /* -1: no log (it could not be opened) */
    char path[PATH_MAX + 32];
    uint64_t max;        /* the file's bound */
    uint64_t size;       /* the file's length */
    uint64_t head;       /* the head's length; valid once has_marker */
    uint64_t marker_len; /* the marker line's length, after the head */
    bool has_marker;
    uint64_t dropped;    /* bytes dropped between head and tail so far */
    bool stop_wanted;    /* joblog_stop was called */
    bool stopped;        /* cut back to head + marker: nothing more is kept */
    bool rewrite_failed; /* writes that do not fit are dropped, not retried */
    char stop_why[192];  /* the limit that stopped it, for the marker */
} joblog;

/* Open path for appending without blocking and without following a
 * symbolic link, and check that it is a regular file (a FIFO or device
 * planted there must not hang or feed the daemon).  A log left by an
 * earlier run of the job is continued, its head and marker found again.
 * 0, or -1 with err naming the path (l->fd is then -1). */
int joblog_open(joblog *l, const char *path, uint64_t max, char *err, size_t err_len);
void joblog_close(joblog *l);

/* What joblog_write answers. */
typedef enum {
    JOBLOG_WRITTEN = 0, /* appended (or dropped: stopped, or no log) */
    JOBLOG_FULL,        /* call joblog_rewrite first, then write again */
    JOBLOG_ERROR,       /* the append failed; errno says why */
} joblog_result;

/* Append len bytes (whole lines).  Never passes the bound: when the bytes
 * do not fit, it answers JOBLOG_FULL and writes nothing.  The caller then
 * calls joblog_rewrite with the daemon's filesystem identity (the rewrite
 * creates a file in the state dir, which a job's owner may not). */
joblog_result joblog_write(joblog *l, const void *buf, size_t len);

/* Replace the file with head + marker + the newest lines, leaving room
 * for `incoming` more bytes where the bound allows; or, once joblog_stop
 * was called, with head + marker alone.  0, or -1 with err (the file is
 * then as it was, and writes that do not fit are dropped). */
int joblog_rewrite(joblog *l, size_t incoming, char *err, size_t err_len);

/* Stop the log growing: it keeps its head, or what it has if it has not
 * got that far; `why` names the limit, for the marker.  The next write
 * answers JOBLOG_FULL (for the rewrite that cuts the file back), and later
 * ones are dropped. */
void joblog_stop(joblog *l, const char *why);

#endif
