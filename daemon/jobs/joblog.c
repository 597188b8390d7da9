/* joblog.c — a job's log, bounded: head, one marker, newest lines. */
#include "joblog.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fileio.h"
#include "units.h"

/* The longest marker line joblog_rewrite writes, with room to spare: room
 * for it is kept before the tail is chosen, as its final length depends
 * on the count it holds. */
#define MARKER_MAX 320
/* The copy buffer: all the memory a rewrite takes. */
#define COPY_CHUNK (64u << 10)

static uint64_t head_cap(const joblog *l)
{
    return l->max / 2;
}

/* ---- opening ----------------------------------------------------------------------- */

/* A log continued after a restart: find the marker an earlier rewrite put
 * after the head (the first line that starts with JOBLOG_MARKER within the
 * head's reach) and the count it holds. */
static void find_marker(joblog *l)
{
    uint64_t reach = head_cap(l) + MARKER_MAX;
    if (reach > l->size)
        reach = l->size;
    if (reach == 0)
        return;
    char *buf = malloc(reach + 1);
    if (!buf)
        return;
    ssize_t n = pread(l->fd, buf, reach, 0);
    if (n <= 0) {
        free(buf);
        return;
    }
    buf[n] = '\0';
    size_t plen = strlen(JOBLOG_MARKER);
    for (size_t p = 0; p + plen <= (size_t)n; p++) {
        if ((p > 0 && buf[p - 1] != '\n') || memcmp(buf + p, JOBLOG_MARKER, plen) != 0)
            continue;
        char *nl = memchr(buf + p, '\n', (size_t)n - p);
        if (!nl || p > head_cap(l))
            break;
        l->has_marker = true;
        l->head = p;
        l->marker_len = (uint64_t)(nl + 1 - (buf + p));
        l->dropped = strtoull(buf + p + plen, NULL, 10);
        break;
    }
    free(buf);
}

int joblog_open(joblog *l, const char *path, uint64_t max, char *err, size_t err_len)
{
    memset(l, 0, sizeof *l);
    l->max = max;
    snprintf(l->path, sizeof l->path, "%s", path);
    /* The state dir is the daemon's, but a planted special file must fail
     * the log, not hang the worker. */
    l->fd = fileio_open_regular(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW, 0600, err, err_len);
    if (l->fd < 0)
        return -1;
    struct stat st;
    if (fstat(l->fd, &st) != 0) {
        snprintf(err, err_len, "%s: cannot stat: %s", path, strerror(errno));
        close(l->fd);
        l->fd = -1;
        return -1;
    }
    l->size = (uint64_t)st.st_size;
    /* Reading back needs a descriptor that may read: the append one may not. */
    int rfd = fileio_open_regular(path, O_RDONLY | O_NOFOLLOW, 0, NULL, 0);
    if (rfd >= 0) {
        int wfd = l->fd;
        l->fd = rfd;
        find_marker(l);
        l->fd = wfd;
        close(rfd);
    }
    return 0;
}

void joblog_close(joblog *l)
{
    if (l->fd >= 0)
        close(l->fd);
    l->fd = -1;
}

void joblog_stop(joblog *l, const char *why)
{
    if (l->stop_wanted)
        return;
    l->stop_wanted = true;
    snprintf(l->stop_why, sizeof l->stop_why, "%s", why);
}

/* ---- writing ------------------------------------------------------------------------- */

joblog_result joblog_write(joblog *l, const void *buf, size_t len)
{
    if (l->fd < 0)
        return JOBLOG_WRITTEN;
    if (l->stopped) {
        l->dropped += len;
        return JOBLOG_WRITTEN;
    }
    if (l->size + len > l->max || l->stop_wanted) {
        if (!l->rewrite_failed)
            return JOBLOG_FULL;
        l->dropped += len;
        return JOBLOG_WRITTEN;
    }
    if (fileio_write_all(l->fd, buf, len) != 0) {
        int e = errno;
        struct stat st;
        if (fstat(l->fd, &st) == 0)
            l->size = (uint64_t)st.st_size;
        errno = e;
        return JOBLOG_ERROR;
    }
    l->size += len;
    return JOBLOG_WRITTEN;
}

/* ---- rewriting ------------------------------------------------------------------------ */

/* Where the head ends: after the last newline within its cap, which is
 * all of a log stopped before it got that far (0 if there is none: a log
 * whose first line alone is that long keeps no head). */
static int find_head(int rfd, const joblog *l, uint64_t *head, char *buf)
{
    uint64_t end = head_cap(l) < l->size ? head_cap(l) : l->size;
    while (end > 0) {
        uint64_t start = end > COPY_CHUNK ? end - COPY_CHUNK : 0;
        ssize_t n = pread(rfd, buf, (size_t)(end - start), (off_t)start);
        if (n < 0)
            return -1;
        for (ssize_t i = n; i > 0; i--)
            if (buf[i - 1] == '\n') {
                *head = start + (uint64_t)i;
                return 0;
            }
        end = start;
    }
    *head = 0;
    return 0;
}

/* The first line start at or after `from` (size if none). */
static int next_line(int rfd, const joblog *l, uint64_t from, uint64_t *out, char *buf)
{
    if (from == 0) {
        *out = 0;
        return 0;
    }
    uint64_t pos = from - 1; /* a newline just before `from` makes it a start */
    while (pos < l->size) {
        ssize_t n = pread(rfd, buf, COPY_CHUNK, (off_t)pos);
        if (n < 0)
            return -1;
        if (n == 0)
            break;
        char *nl = memchr(buf, '\n', (size_t)n);
        if (nl) {
            *out = pos + (uint64_t)(nl - buf) + 1;
            return 0;
        }
        pos += (uint64_t)n;
    }
    *out = l->size;
    return 0;
}

static int copy_range(int rfd, int wfd, uint64_t from, uint64_t to, char *buf)
{
    while (from < to) {
        size_t want = to - from < COPY_CHUNK ? (size_t)(to - from) : COPY_CHUNK;
        ssize_t n = pread(rfd, buf, want, (off_t)from);
        if (n <= 0) {
            if (n == 0)
                errno = EIO; /* shorter than it was: nothing else writes it */
            return -1;
        }
        if (fileio_write_all(wfd, buf, (size_t)n) != 0)
            return -1;
        from += (uint64_t)n;
    }
    return 0;
}

int joblog_rewrite(joblog *l, size_t incoming, char *err, size_t err_len)
{
    if (l->fd < 0 || l->stopped)
        return 0;
    char tmp[sizeof l->path + 8];
    char *slash = strrchr(l->path, '/');
    int dlen = slash ? (int)(slash + 1 - l->path) : 0;
    snprintf(tmp, sizeof tmp, "%.*s.log.tmp", dlen, l->path);
    char *buf = malloc(COPY_CHUNK);
    int rfd = fileio_open_regular(l->path, O_RDONLY | O_NOFOLLOW, 0, NULL, 0);
    int wfd = -1;
    const char *what = l->path;
    if (!buf || rfd < 0)
        goto fail;
    uint64_t head = l->head;
    if (!l->has_marker && find_head(rfd, l, &head, buf) != 0)
        goto fail;
    uint64_t body = l->has_marker ? head + l->marker_len : head; /* the old tail's start */
    if (body > l->size)
        body = l->size;
    /* Half the room past the head is kept, the other half left for what
     * comes: a rewrite then happens once per quarter of the bound. */
    uint64_t room = l->max > head + MARKER_MAX ? l->max - head - MARKER_MAX : 0;
    uint64_t keep = room / 2;
    if (incoming > room - keep)
        keep = room > incoming ? room - incoming : 0;
    if (l->stop_wanted)
        keep = 0;
    uint64_t from = l->size > keep ? l->size - keep : 0;
    if (from < body)
        from = body;
    if (next_line(rfd, l, from, &from, buf) != 0)
        goto fail;
    uint64_t dropped = l->dropped + (from - body);
    char marker[MARKER_MAX], limit[16];
    units_format_size(l->max, limit, sizeof limit);
    int mlen;
    if (l->stop_wanted)
        mlen = snprintf(marker, sizeof marker, JOBLOG_MARKER "%" PRIu64 " bytes dropped; nothing after this is kept: %s]\n",
                        dropped, l->stop_why);
    else
        mlen = snprintf(marker, sizeof marker,
                        JOBLOG_MARKER "%" PRIu64 " bytes dropped here to keep it within [daemon] max_job_log = %s]\n",
                        dropped, limit);
    if (mlen < 0 || mlen >= (int)sizeof marker) {
        mlen = (int)sizeof marker - 1;
        marker[mlen - 2] = ']';
        marker[mlen - 1] = '\n';
    }
    what = tmp;
    unlink(tmp);
    wfd = open(tmp, O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (wfd < 0 || copy_range(rfd, wfd, 0, head, buf) != 0 || fileio_write_all(wfd, marker, (size_t)mlen) != 0 ||
        copy_range(rfd, wfd, from, l->size, buf) != 0 || fdatasync(wfd) != 0)
        goto fail;
    what = l->path;
    if (rename(tmp, l->path) != 0)
        goto fail;
    close(rfd);
    close(l->fd);
    free(buf);
    l->fd = wfd;
    l->size = head + (uint64_t)mlen + (l->size - from);
    l->head = head;
    l->marker_len = (uint64_t)mlen;
    l->has_marker = true;
    l->dropped = dropped;
    l->stopped = l->stop_wanted;
    return 0;
fail:
    l->rewrite_failed = true;
    snprintf(err, err_len, "cannot rewrite %s: %s", what, buf ? strerror(errno) : "out of memory");
    if (wfd >= 0) {
        close(wfd);
        unlink(tmp);
    }
    if (rfd >= 0)
        close(rfd);
    free(buf);
    return -1;
}
