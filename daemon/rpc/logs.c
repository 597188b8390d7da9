/* logs.c — the logs request's stream: a job's log from the state dir, or
 * its last lines, and with follow what the job writes to it until it ends.
 *
 * A follower costs one open file and this struct: it reads from the file
 * each time the server pushes the stream (on every job change, each time
 * the client takes a frame, and once a second), never holding more than
 * one chunk, and sends only while less than a window is queued.  It ends
 * when the job is completed, failed or cancelled (or removed), or when the
 * client goes away (the server frees the stream).
 *
 * The log is bounded (jobs/joblog.h): once over its bound it is replaced
 * whole by a copy that keeps its head, a marker line counting the bytes
 * dropped, and its newest bytes.  A follower notices the new file and
 * carries on from the same place in the log, found through the marker's
 * count; where that place was dropped, it goes on from the marker line,
 * which tells the reader. */
#include "rpc_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fileio.h"
#include "jobs/joblog.h"
#include "jobs/queue.h"

/* The bytes read at once: a scan's buffer, and at most one chunk. */
#define LOGS_SCAN ((size_t)64 << 10)
/* After the job is seen to have ended, how long a follower waits for the
 * worker's last line ("== job N completed") before ending without it. */
#define LOGS_END_GRACE_S 1.0

/* Where a log file's marker is, if it has one: bytes before head are the
 * log's first bytes; the marker line (mlen bytes) stands for `dropped`
 * bytes; what follows is the log from head + dropped on. */
typedef struct {
    bool has;
    uint64_t head, mlen, dropped;
} logs_layout;

typedef struct {
    rpc_stream base; /* first: the server holds &base */
    uint32_t id;
    char path[PATH_MAX + 32];
    int fd;          /* -1: no log yet */
    ino_t ino;       /* fd's file: a different one at path is a rewrite */
    logs_layout lay; /* fd's file's marker (following only) */
    uint64_t off;    /* the next byte of fd's file to send */
    uint64_t end;    /* not following: where to stop (the size when asked) */
    bool follow;
    double ended_at; /* following: when the job was first seen ended; 0 before */
    bool said_end;   /* the worker's last line about the job has been sent */
    char line[40];   /* the start of the line being sent, to spot that one */
    size_t line_len;
    uint64_t max_log; /* [daemon] max_job_log: how far a marker can be */
} logs_stream;

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- the file ------------------------------------------------------------------- */

/* Open the log without blocking and only if it is a regular file: it is in
 * the daemon's state dir, but a file that is not one must never hold up the
 * loop.  0 (fd -1 when there is no log yet), or -1 with err. */
static int logs_open(const char *path, int *fd, uint64_t *size, ino_t *ino, char *err, size_t err_len)
{
    *size = 0;
    *fd = -1;
    struct stat st;
    if (lstat(path, &st) != 0 && errno == ENOENT)
        return 0;
    *fd = fileio_open_regular(path, O_RDONLY | O_NOFOLLOW, 0, err, err_len);
    if (*fd < 0)
        return errno == ENOENT ? 0 : -1;
    if (fstat(*fd, &st) != 0) {
        snprintf(err, err_len, "%s: cannot stat: %s", path, strerror(errno));
        close(*fd);
        *fd = -1;
        return -1;
    }
    *size = (uint64_t)st.st_size;
    *ino = st.st_ino;
    return 0;
}

/* The marker a rewrite put after the head: the first line that starts
 * with JOBLOG_MARKER within the head's reach (half the bound), read
 * through buf (LOGS_SCAN bytes). */
static void read_layout(int fd, uint64_t size, uint64_t max_log, char *buf, logs_layout *out)
{
    memset(out, 0, sizeof *out);
    size_t plen = strlen(JOBLOG_MARKER);
    uint64_t reach = max_log / 2 + 1;
    reach = reach < size ? reach : size;
    /* Each read after the first starts one byte early: buf[0] is the byte
     * before its first candidate, a newline where a line starts. */
    for (uint64_t from = 0;;) {
        ssize_t n = pread(fd, buf, LOGS_SCAN, (off_t)from);
        if (n <= 0)
            return;
        size_t i = from == 0 ? 0 : 1;
        for (; i < (size_t)n; i++) {
            uint64_t pos = from + i;
            if (pos >= reach)
                return;
            if (pos != 0 && buf[i - 1] != '\n')
                continue;
            if (i + plen > (size_t)n)
                break; /* cut by this read: the next one starts here */
            if (memcmp(buf + i, JOBLOG_MARKER, plen) != 0)
                continue;
            char line[400];
            ssize_t k = pread(fd, line, sizeof line - 1, (off_t)pos);
            if (k <= 0)
                return;
            line[k] = '\0';
            char *nl = strchr(line, '\n');
            if (!nl)
                return;
            out->has = true;
            out->head = pos;
            out->mlen = (uint64_t)(nl + 1 - line);
            out->dropped = strtoull(line + plen, NULL, 10);
            return;
        }
        if ((size_t)n < LOGS_SCAN)
            return; /* the end of the file */
        from += i - 1;
    }
}

/* Where the last `lines` lines of fd's first `size` bytes start: back from
 * the end through buf, counting line ends (the log's own last one is the
 * end of its last line, not the start of another). */
static uint64_t tail_start(int fd, uint64_t size, uint32_t lines, char *buf)
{
    uint64_t pos = size;
    uint32_t seen = 0;
    bool first = true;
    while (pos > 0) {
        size_t n = pos < LOGS_SCAN ? (size_t)pos : LOGS_SCAN;
        if (pread(fd, buf, n, (off_t)(pos - n)) != (ssize_t)n)
            return 0;
        for (size_t i = n; i-- > 0;) {
            if (buf[i] != '\n')
                continue;
            if (first && pos - n + i == size - 1) {
                first = false;
                continue;
            }
            if (++seen == lines)
                return pos - n + i + 1;
        }
        first = false;
        pos -= n;
    }
    return 0;
}

/* The log was rewritten (a new file at the path): open that and carry on
 * from the same byte of the log, or from the marker where that byte was
 * dropped.  Stays on the old file if the new one cannot be opened. */
static void follow_rewrite(logs_stream *ls, char *buf)
{
    struct stat st;
    if (lstat(ls->path, &st) != 0 || (ls->fd >= 0 && st.st_ino == ls->ino))
        return;
    int fd;
    uint64_t size;
    ino_t ino = 0;
    char err[64];
    if (logs_open(ls->path, &fd, &size, &ino, err, sizeof err) != 0 || fd < 0)
        return;
    logs_layout lay;
    read_layout(fd, size, ls->max_log, buf, &lay);
    /* The log byte reached so far, in the old file's terms... */
    const logs_layout *o = &ls->lay;
    uint64_t at = ls->off;
    if (o->has && at > o->head)
        at = at < o->head + o->mlen ? o->head : at - o->mlen + o->dropped;
    /* ... and in the new one's. */
    uint64_t off = at;
    if (lay.has && at > lay.head)
        off = at >= lay.head + lay.dropped ? at - lay.dropped + lay.mlen : lay.head;
    if (ls->fd >= 0)
        close(ls->fd);
    ls->fd = fd;
    ls->ino = ino;
    ls->lay = lay;
    ls->off = off < size ? off : size;
}

/* Whether the line starting with s (n bytes of it) is the worker's last
 * about the job: "== job N completed", "failed..." or "cancelled...". */
static bool end_line(const logs_stream *ls, const char *s, size_t n)
{
    static const char *const states[] = {"completed", "failed", "cancelled"};
    for (size_t k = 0; k < sizeof states / sizeof *states; k++) {
        char want[sizeof ls->line];
        int wl = snprintf(want, sizeof want, "== job %u %s", ls->id, states[k]);
        if (n >= (size_t)wl && memcmp(s, want, (size_t)wl) == 0)
            return true;
    }
    return false;
}

/* Note the lines sent, for the one the worker writes last about the job:
 * once that is out, the log is done. */
static void note_sent(logs_stream *ls, const char *buf, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (buf[i] == '\n') {
            if (end_line(ls, ls->line, ls->line_len))
                ls->said_end = true;
            ls->line_len = 0;
        } else if (ls->line_len < sizeof ls->line) {
            ls->line[ls->line_len++] = buf[i];
        }
    }
}

/* Following, at the end of what is written: whether the job has ended and
 * its last line is out (or has had its grace to come). */
static bool follow_done(logs_stream *ls, const rpc_call *c)
{
    gradd_ctx *ctx = c->ctx;
    if (!ctx->q)
        return true;
    pthread_mutex_lock(&ctx->q->lock);
    job *j = queue_find(ctx->q, ls->id);
    bool ended = !j || (j->state != JOB_QUEUED && j->state != JOB_RUNNING);
    pthread_mutex_unlock(&ctx->q->lock);
    if (!j || !ended)
        return !j;
    double now = mono_s();
    if (ls->ended_at == 0)
        ls->ended_at = now;
    return ls->said_end || now - ls->ended_at >= LOGS_END_GRACE_S;
}

/* ---- the stream ----------------------------------------------------------------- */

static bool send_chunk(const rpc_call *c, const char *buf, size_t n, bool last)
{
    Gradd__LogsResponse lr;
    gradd__logs_response__init(&lr);
    lr.chunk.data = (uint8_t *)buf;
    lr.chunk.len = n;
    lr.last = last;
    return RPC_SEND(c, LOGS, logs, &lr) == 0;
}

static bool logs_next(rpc_stream *s, const rpc_call *c)
{
    logs_stream *ls = (logs_stream *)s;
    if (c->queued(c->conn) >= RPC_STREAM_WINDOW)
        return true;
    char *buf = malloc(LOGS_SCAN);
    if (!buf) {
        rpc_error(c, GRADD__ERROR__CODE__INTERNAL, "out of memory");
        return false;
    }
    if (ls->follow)
        follow_rewrite(ls, buf);
    bool more = true;
    while (more && c->queued(c->conn) < RPC_STREAM_WINDOW) {
        size_t want = LOGS_SCAN;
        if (!ls->follow && ls->end - ls->off < want)
            want = (size_t)(ls->end - ls->off);
        ssize_t n = want && ls->fd >= 0 ? pread(ls->fd, buf, want, (off_t)ls->off) : 0;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            char msg[160];
            snprintf(msg, sizeof msg, "job %u: reading its log: %s", ls->id, strerror(errno));
            rpc_error(c, GRADD__ERROR__CODE__INTERNAL, msg);
            more = false;
            break;
        }
        ls->off += (uint64_t)n;
        bool last;
        if (ls->follow) {
            if (n == 0 && !follow_done(ls, c))
                break; /* wait for the next push */
            note_sent(ls, buf, (size_t)n);
            last = n == 0;
        } else {
            /* Short: the log was cut while being read (it keeps its head
             * and tail); what was read is all there is. */
            last = (size_t)n < want || ls->off == ls->end;
        }
        more = send_chunk(c, buf, (size_t)n, last) && !last;
    }
    free(buf);
    return more;
}

static void logs_free(rpc_stream *s)
{
    logs_stream *ls = (logs_stream *)s;
    if (ls->fd >= 0)
        close(ls->fd);
    free(ls);
}

rpc_stream *rpc_logs_stream(const rpc_call *c, uint32_t id, const char *path, bool follow, uint32_t tail)
{
    gradd_ctx *ctx = c->ctx;
    logs_stream *ls = calloc(1, sizeof *ls);
    char *buf = malloc(LOGS_SCAN);
    if (!ls || !buf) {
        free(ls);
        free(buf);
        rpc_error(c, GRADD__ERROR__CODE__INTERNAL, "out of memory");
        return NULL;
    }
    char err[PATH_MAX + 128];
    uint64_t size;
    if (logs_open(path, &ls->fd, &size, &ls->ino, err, sizeof err) != 0) {
        free(ls);
        free(buf);
        char msg[sizeof err + 64];
        snprintf(msg, sizeof msg, "job %u: cannot read its log %s", id, err);
        rpc_error(c, GRADD__ERROR__CODE__INTERNAL, msg);
        return NULL;
    }
    ls->base.next = logs_next;
    ls->base.free = logs_free;
    ls->id = id;
    snprintf(ls->path, sizeof ls->path, "%s", path);
    ls->follow = follow;
    ls->end = size;
    ls->max_log = ctx->cfg.max_job_log;
    if (ls->fd >= 0 && tail)
        ls->off = tail_start(ls->fd, size, tail, buf);
    if (ls->fd >= 0 && follow)
        read_layout(ls->fd, size, ls->max_log, buf, &ls->lay);
    free(buf);
    return &ls->base;
}
