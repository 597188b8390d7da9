/* conn.c — one client's connection: admitting it (max_clients, per user),
 * reading its frames, handing each request to rpc, writing the answers,
 * and keeping what an answer leaves behind (a stream, deferred work) until
 * it ends or the client leaves. */
#include "server_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/log.h"
#include "jobs/access.h"
#include "rpc/rpc.h"
#include "wire.h"

/* A client that stops reading gets cut off here rather than making the
 * daemon buffer its responses without bound: what is queued when it asks
 * again, or when a stream pushes a frame.  Long answers stream (rpc_stream)
 * and keep far below it; one answer may still go beyond it (a full
 * timeline ring is some 22 MB of JSON): the client asked for it.  Small,
 * since every connection of every user may hold this much. */
#define CONN_MAX_QUEUED ((size_t)1 << 20)
#define CONN_READ_BUF 16384
/* Deferred work run at once (samples, each holding a thread of libuv's
 * pool and a CPU core for a few seconds).  More is refused, not queued. */
#define WORK_SLOTS 2
/* Slots of max_clients kept for root and admin_group (an eighth, at most
 * this many): however the others are held, an administrator can get in to
 * see why and cancel. */
#define CONN_ADMIN_RESERVE 16

typedef struct work_op work_op;

struct server_conn {
    uv_pipe_t pipe; /* first: handle->data is unused, casts are safe */
    uv_timer_t idle;
    server *srv;
    wire_reader rd;
    rpc_peer peer;
    uint64_t id;
    int open_handles;
    bool closing;
    bool close_after_write;
    bool answering; /* inside rpc_dispatch: the chunks of one answer */
    bool admitted;  /* counted in nclients and per_uid */
    size_t writes_pending;
    rpc_stream *stream; /* pushed to on every job change until it ends */
    work_op *work;      /* deferred work being done for this connection */
    server_conn *prev, *next;
    char rbuf[CONN_READ_BUF];
};

/* Deferred work in libuv's thread pool, and whom to answer when done. */
struct work_op {
    uv_work_t req;
    server *srv;
    server_conn *conn; /* NULL once the client left (conn_handle_closed) */
    rpc_work *w;
};

typedef struct {
    uv_write_t req;
    server_conn *conn;
    size_t len;
    uint8_t *data;
} write_op;

/* ---- connections per uid ------------------------------------------------------ */

static server_uid_count *uid_find(server *s, uid_t uid)
{
    for (size_t i = 0; i < s->nper_uid; i++)
        if (s->per_uid[i].uid == uid)
            return &s->per_uid[i];
    return NULL;
}

static size_t uid_held(server *s, uid_t uid)
{
    const server_uid_count *u = uid_find(s, uid);
    return u ? u->n : 0;
}

static int uid_hold(server *s, uid_t uid)
{
    server_uid_count *u = uid_find(s, uid);
    if (!u) {
        if (s->nper_uid == s->per_uid_cap) {
            size_t ncap = s->per_uid_cap ? s->per_uid_cap * 2 : 16;
            server_uid_count *n = realloc(s->per_uid, ncap * sizeof *n);
            if (!n)
                return -1;
            s->per_uid = n;
            s->per_uid_cap = ncap;
        }
        u = &s->per_uid[s->nper_uid++];
        *u = (server_uid_count){.uid = uid, .n = 0};
    }
    u->n++;
    return 0;
}

static void uid_release(server *s, uid_t uid)
{
    server_uid_count *u = uid_find(s, uid);
    if (u && --u->n == 0)
        *u = s->per_uid[--s->nper_uid];
}

/* ---- connection lifetime ----------------------------------------------------- */

static void conn_handle_closed(uv_handle_t *h)
{
    server_conn *c = h->data;
    if (--c->open_handles > 0)
        return;
    server *s = c->srv;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->nconns--;
    if (c->admitted) {
        s->nclients--;
        uid_release(s, c->peer.uid);
    }
    /* Work still running for it finds no connection to answer, and is
     * told to stop early: its answer has no reader. */
    if (c->work) {
        c->work->conn = NULL;
        atomic_store(&c->work->w->cancelled, true);
    }
    if (c->stream)
        c->stream->free(c->stream);
    wire_reader_free(&c->rd);
    free(c);
}

static void conn_close(server_conn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    uv_read_stop((uv_stream_t *)&c->pipe);
    uv_timer_stop(&c->idle);
    uv_close((uv_handle_t *)&c->pipe, conn_handle_closed);
    uv_close((uv_handle_t *)&c->idle, conn_handle_closed);
}

static void stream_push(server_conn *c);

static void on_write(uv_write_t *req, int status)
{
    write_op *op = (write_op *)req;
    server_conn *c = op->conn;
    c->writes_pending--;
    free(op->data);
    free(op);
    if (status < 0) {
        if (status != UV_ECANCELED)
            log_debug("conn %llu: write failed: %s", (unsigned long long)c->id, uv_strerror(status));
        conn_close(c);
        return;
    }
    if (c->close_after_write && c->writes_pending == 0)
        conn_close(c);
    else
        stream_push(c); /* the client took a frame: room for the next */
}

/* Close a connection whose client is not reading what it was sent. */
static bool conn_over_limit(server_conn *c)
{
    if (uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe) <= CONN_MAX_QUEUED)
        return false;
    log_warn("conn %llu (uid %u): client is not reading its responses; closing", (unsigned long long)c->id,
             (unsigned)c->peer.uid);
    conn_close(c);
    return true;
}

static size_t conn_queued(void *conn)
{
    server_conn *c = conn;
    return uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe);
}

static int conn_send(void *conn, const Gradd__Response *resp)
{
    server_conn *c = conn;
    if (c->closing)
        return -1;
    if (!c->answering && conn_over_limit(c))
        return -1;
    size_t len;
    uint8_t *buf = wire_pack_response(resp, &len);
    write_op *op = malloc(sizeof *op);
    if (!buf || !op) {
        free(buf);
        free(op);
        conn_close(c);
        return -1;
    }
    op->conn = c;
    op->len = len;
    op->data = buf;
    uv_buf_t b = uv_buf_init((char *)buf, (unsigned)len);
    /* uv_write copies the uv_buf_t array but not the bytes, so data lives
     * in the op until on_write. */
    int rc = uv_write(&op->req, (uv_stream_t *)&c->pipe, &b, 1, on_write);
    if (rc < 0) {
        free(buf);
        free(op);
        conn_close(c);
        return -1;
    }
    c->writes_pending++;
    return 0;
}

/* Send an error, then close once it is written: the stream is no longer in
 * step with frame boundaries, or the peer is not speaking our protocol. */
static void conn_fail(server_conn *c, Gradd__Error__Code code, const char *msg)
{
    Gradd__Response resp;
    Gradd__Error err;
    log_info("conn %llu (uid %u, pid %d): %s; closing", (unsigned long long)c->id, (unsigned)c->peer.uid,
             (int)c->peer.pid, msg);
    wire_error_response(&resp, &err, code, msg);
    uv_read_stop((uv_stream_t *)&c->pipe);
    c->close_after_write = true;
    if (conn_send(c, &resp) != 0 || c->writes_pending == 0)
        conn_close(c);
}

/* ---- answering ---------------------------------------------------------------- */

/* The connection as rpc sees it while it answers. */
static rpc_call conn_call(server_conn *c)
{
    return (rpc_call){
        .ctx = c->srv->ctx,
        .peer = &c->peer,
        .send = conn_send,
        .queued = conn_queued,
        .conn = c,
        .work_pending = c->work != NULL,
        .work_running = c->srv->works,
        .work_slots = WORK_SLOTS,
    };
}

/* Give the connection's stream its next frame; once the stream has ended
 * the connection is back to request/response. */
static void stream_push(server_conn *c)
{
    if (!c->stream || c->closing)
        return;
    rpc_call call = conn_call(c);
    if (c->stream->next(c->stream, &call))
        return;
    c->stream->free(c->stream);
    c->stream = NULL;
    if (!c->closing)
        uv_timer_again(&c->idle); /* the idle timeout applies again */
}

static void stream_start(server_conn *c, rpc_stream *st)
{
    if (c->stream)
        c->stream->free(c->stream);
    c->stream = st;
    /* A stream may be silent for as long as the job runs. */
    uv_timer_stop(&c->idle);
    stream_push(c);
}

static void work_run(uv_work_t *req)
{
    work_op *op = req->data;
    op->w->run(op->w);
}

static void work_done(uv_work_t *req, int status)
{
    work_op *op = req->data;
    server_conn *c = op->conn;
    op->srv->works--;
    if (c)
        c->work = NULL;
    rpc_call call;
    if (c)
        call = conn_call(c);
    op->w->done(op->w, c ? &call : NULL, status == 0 ? RPC_WORK_RAN : RPC_WORK_CANCELLED);
    if (c && !c->closing && !c->stream)
        uv_timer_again(&c->idle);
    free(op);
}

static void work_start(server_conn *c, rpc_work *w)
{
    server *s = c->srv;
    work_op *op = malloc(sizeof *op);
    if (op) {
        op->srv = s;
        op->conn = c;
        op->w = w;
        op->req.data = op;
    }
    if (!op || uv_queue_work(&s->loop, &op->req, work_run, work_done) != 0) {
        free(op);
        rpc_call call = conn_call(c);
        w->done(w, &call, RPC_WORK_UNSTARTED);
        return;
    }
    c->work = op;
    s->works++;
    /* The work may outlast client_timeout: the answer resets the timer. */
    uv_timer_stop(&c->idle);
}

static void handle_frame(server_conn *c, const uint8_t *body, size_t len)
{
    char err[256];
    Gradd__Request *req = wire_unpack_request(body, len, err, sizeof err);
    if (!req) {
        conn_fail(c, GRADD__ERROR__CODE__BAD_REQUEST, err);
        return;
    }
    if (!wire_version_ok(req, err, sizeof err)) {
        /* A well-framed request from another release: answer and stay open,
         * the stream is still in step. */
        Gradd__Response resp;
        Gradd__Error e;
        wire_error_response(&resp, &e, GRADD__ERROR__CODE__VERSION_MISMATCH, err);
        conn_send(c, &resp);
    } else if (!conn_over_limit(c)) {
        rpc_call call = conn_call(c);
        c->answering = true;
        rpc_reply r = rpc_dispatch(&call, req);
        c->answering = false;
        if (r.stream)
            stream_start(c, r.stream);
        else if (r.work)
            work_start(c, r.work);
    }
    gradd__request__free_unpacked(req, NULL);
}

/* ---- reading ----------------------------------------------------------------- */

static void on_idle(uv_timer_t *t)
{
    server_conn *c = t->data;
    log_info("conn %llu (uid %u): no complete request for %llums; closing", (unsigned long long)c->id,
             (unsigned)c->peer.uid, (unsigned long long)c->srv->ctx->cfg.client_timeout_ms);
    conn_close(c);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    server_conn *c = h->data;
    buf->base = c->rbuf;
    buf->len = sizeof c->rbuf;
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    server_conn *c = st->data;
    (void)buf;
    if (n == 0)
        return;
    if (n < 0) {
        if (n != UV_EOF)
            log_debug("conn %llu: read: %s", (unsigned long long)c->id, uv_strerror((int)n));
        else if (wire_reader_pending(&c->rd) > 0)
            log_info("conn %llu (uid %u): closed mid-frame with %zu bytes unread", (unsigned long long)c->id,
                     (unsigned)c->peer.uid, wire_reader_pending(&c->rd));
        conn_close(c);
        return;
    }
    char msg[160];
    wire_status ws = wire_reader_feed(&c->rd, c->rbuf, (size_t)n);
    while (ws == WIRE_OK && !c->closing && !c->close_after_write) {
        const uint8_t *body;
        size_t len;
        ws = wire_reader_next(&c->rd, &body, &len);
        if (ws == WIRE_OK) {
            if (!c->stream)
                uv_timer_again(&c->idle);
            handle_frame(c, body, len);
        }
        if (ws == WIRE_NEED_MORE)
            return;
    }
    if (ws == WIRE_TOO_BIG) {
        snprintf(msg, sizeof msg, "frame length exceeds the cap of %zu bytes (daemon max_frame)",
                 c->rd.max_frame);
        conn_fail(c, GRADD__ERROR__CODE__BAD_REQUEST, msg);
    } else if (ws == WIRE_NOMEM) {
        conn_fail(c, GRADD__ERROR__CODE__INTERNAL, "out of memory reading the request");
    }
}

/* ---- accepting --------------------------------------------------------------- */

/* Whether c may stay: max_clients for all, and for everyone but root and
 * admin_group also max_clients_per_user and the slots kept for them.
 * Watches count like any connection: they are what a user holds longest. */
static bool conn_admit(server_conn *c, char *why, size_t len)
{
    server *s = c->srv;
    const gradd_config *cfg = &s->ctx->cfg;
    uid_t uid = c->peer.uid;
    uint64_t reserve = cfg->max_clients / 8 < CONN_ADMIN_RESERVE ? cfg->max_clients / 8 : CONN_ADMIN_RESERVE;
    size_t held = uid_held(s, uid);
    bool full = s->nclients >= cfg->max_clients;
    bool over_user = held >= cfg->max_clients_per_user;
    bool in_reserve = s->nclients >= cfg->max_clients - reserve;
    /* Asked only at a limit: it may read the group and user databases. */
    if (!full && (over_user || in_reserve) && access_is_admin(uid, c->peer.gid, cfg->admin_group))
        over_user = in_reserve = false;
    if (full || in_reserve) {
        char kept[160] = "";
        if (!full)
            snprintf(kept, sizeof kept, ", but for the last %llu kept for root and group '%s'",
                     (unsigned long long)reserve, cfg->admin_group);
        snprintf(why, len, "gradd is serving as many clients as its [daemon] max_clients (%llu)%s; try again later",
                 (unsigned long long)cfg->max_clients, kept);
        return false;
    }
    if (over_user) {
        snprintf(why, len,
                 "uid %u already holds %zu connections to gradd ([daemon] max_clients_per_user = %llu); close "
                 "some (watches count) and try again",
                 (unsigned)uid, held, (unsigned long long)cfg->max_clients_per_user);
        return false;
    }
    if (uid_hold(s, uid) != 0) {
        snprintf(why, len, "gradd is out of memory; try again later");
        return false;
    }
    s->nclients++;
    c->admitted = true;
    return true;
}

/* Say why in one non-blocking write that nobody waits for, then close: a
 * flood of connections costs no queue, and a client that reads learns it
 * is the daemon's limit, not a crash. */
static void conn_refuse(server_conn *c, const char *why)
{
    server *s = c->srv;
    if (s->refused++ % 100 == 0)
        log_warn("refusing connection %llu from uid %u (%zu clients): %s", (unsigned long long)c->id,
                 (unsigned)c->peer.uid, s->nclients, why);
    uv_os_fd_t fd;
    Gradd__Response resp;
    Gradd__Error err;
    wire_error_response(&resp, &err, GRADD__ERROR__CODE__UNAVAILABLE, why);
    size_t len;
    uint8_t *buf = wire_pack_response(&resp, &len);
    if (buf && uv_fileno((uv_handle_t *)&c->pipe, &fd) == 0 &&
        send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
        log_debug("conn %llu: refusal not sent: %s", (unsigned long long)c->id, strerror(errno));
    free(buf);
    conn_close(c);
}

void server_accept(uv_stream_t *l, int status)
{
    server *s = l->data;
    if (status < 0) {
        log_warn("accept: %s", uv_strerror(status));
        return;
    }
    server_conn *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->srv = s;
    c->id = ++s->accepted;
    uv_pipe_init(&s->loop, &c->pipe, 0);
    uv_timer_init(&s->loop, &c->idle);
    c->pipe.data = c;
    c->idle.data = c;
    c->open_handles = 2;
    wire_reader_init(&c->rd, s->ctx->cfg.max_frame);
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;

    if (uv_accept(l, (uv_stream_t *)&c->pipe) != 0) {
        conn_close(c);
        return;
    }
    uv_os_fd_t fd;
    struct ucred cred;
    socklen_t cl = sizeof cred;
    if (uv_fileno((uv_handle_t *)&c->pipe, &fd) != 0 ||
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) {
        log_warn("conn %llu: cannot read peer credentials; closing", (unsigned long long)c->id);
        conn_close(c);
        return;
    }
    c->peer.uid = cred.uid;
    c->peer.gid = cred.gid;
    c->peer.pid = cred.pid;
    log_debug("conn %llu: uid %u gid %u pid %d", (unsigned long long)c->id, (unsigned)cred.uid,
              (unsigned)cred.gid, (int)cred.pid);
    char why[256];
    if (!conn_admit(c, why, sizeof why)) {
        conn_refuse(c, why);
        return;
    }
    uint64_t t = s->ctx->cfg.client_timeout_ms;
    uv_timer_start(&c->idle, on_idle, t, t);
    uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
}

/* ---- all connections ------------------------------------------------------------ */

void server_push_streams(server *s)
{
    for (server_conn *c = s->conns; c; c = c->next)
        stream_push(c);
}

void server_close_conns(server *s)
{
    for (server_conn *c = s->conns; c; c = c->next)
        conn_close(c);
}
