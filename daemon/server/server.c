/* server.c — listening, accepting, framing and connection lifetimes. */
#include "server.h"

#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "jobs/access.h"
#include "base/log.h"
#include "jobs/queue.h"
#include "rpc/rpc.h"
#include "engine/sample.h"
#include "svc.h"
#include "units.h"
#include "jobs/worker.h"
#include "models/model.h"
#include "wire.h"

/* A client that stops reading gets cut off here rather than making the
 * daemon buffer its responses without bound: what is queued when it asks
 * again, or when a watch event is pushed.  One answer may go beyond it (a
 * full timeline ring is some 22 MB of JSON): the client asked for it. */
#define CONN_MAX_QUEUED ((size_t)16 << 20)
#define CONN_READ_BUF 16384
/* Samples generated at once; each holds a thread of libuv's pool and a CPU
 * core for a few seconds.  More are refused, not queued. */
#define MAX_SAMPLES 2

typedef struct sample_op sample_op;

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
    size_t writes_pending;
    bool watching;         /* streaming WatchEvents of watch_id */
    uint32_t watch_id;
    uint64_t watch_version; /* the job version last sent */
    sample_op *sample;      /* a sample being generated for this connection */
    server_conn *prev, *next;
    char rbuf[CONN_READ_BUF];
};

/* One sample in libuv's thread pool: the request's inputs, filled in by
 * start_sample on the loop, and the outputs, filled in by sample_work. */
struct sample_op {
    server_conn *conn; /* NULL once the client left (conn_handle_closed) */
    uv_work_t work;
    server *srv;
    /* in */
    uint32_t job;
    uid_t uid;
    gid_t gid;
    char out_dir[PATH_MAX];
    uint8_t *prompt;
    sample_opts opts;
    /* out */
    Gradd__Error__Code code; /* 0: ok */
    char err[1536];
    char path[PATH_MAX + 32];
    sample_output out;
    uint32_t vocab;
    uint64_t step;
    double elapsed_s;
};

typedef struct {
    uv_write_t req;
    server_conn *conn;
    size_t len;
    uint8_t *data;
} write_op;

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
    /* A sample still running for it finds no connection to answer. */
    if (c->sample)
        c->sample->conn = NULL;
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

/* ---- watch streams ---------------------------------------------------------- */

/* Send the watched job if it changed since the last event; the stream ends
 * (final) once the job is completed, failed or cancelled. */
static void push_watch(server_conn *c)
{
    gradd_ctx *ctx = c->srv->ctx;
    if (!c->watching || c->closing || !ctx->q)
        return;
    rpc_job_store *st = malloc(sizeof *st);
    if (!st)
        return;
    pthread_mutex_lock(&ctx->q->lock);
    job *j = queue_find(ctx->q, c->watch_id);
    bool changed = j && j->version != c->watch_version;
    bool final = !j || (j->state != JOB_QUEUED && j->state != JOB_RUNNING);
    if (changed) {
        rpc_job_info(ctx, j, st);
        c->watch_version = j->version;
    }
    pthread_mutex_unlock(&ctx->q->lock);
    if (changed) {
        Gradd__WatchEvent ev;
        gradd__watch_event__init(&ev);
        ev.job = &st->msg;
        ev.final = final;
        Gradd__Response resp;
        gradd__response__init(&resp);
        resp.version = WIRE_PROTOCOL_VERSION;
        resp.body_case = GRADD__RESPONSE__BODY_WATCH;
        resp.watch = &ev;
        conn_send(c, &resp);
    }
    free(st);
    if (final && !c->closing) {
        /* Back to request/response: the idle timeout applies again. */
        c->watching = false;
        uv_timer_again(&c->idle);
    }
}

static void start_watch(server_conn *c, uint32_t id)
{
    gradd_ctx *ctx = c->srv->ctx;
    bool found = false;
    if (ctx->q) {
        pthread_mutex_lock(&ctx->q->lock);
        found = queue_find(ctx->q, id) != NULL;
        pthread_mutex_unlock(&ctx->q->lock);
    }
    if (!found) {
        char msg[64];
        Gradd__Response resp;
        Gradd__Error e;
        snprintf(msg, sizeof msg, "no job %u", id);
        wire_error_response(&resp, &e, GRADD__ERROR__CODE__NOT_FOUND, msg);
        conn_send(c, &resp);
        return;
    }
    c->watching = true;
    c->watch_id = id;
    c->watch_version = UINT64_MAX;
    /* A watcher may be silent for as long as the job runs. */
    uv_timer_stop(&c->idle);
    push_watch(c);
}

static void on_notify(uv_async_t *a)
{
    server *s = a->data;
    if (s->ctx->q)
        queue_save_unsaved(s->ctx->q);
    for (server_conn *c = s->conns; c; c = c->next)
        push_watch(c);
}

/* Called by workers from their threads. */
static void notify_loop(void *user)
{
    server *s = user;
    uv_async_send(&s->notify);
}

/* ---- sampling, off the loop ------------------------------------------------- */


static void sample_work(uv_work_t *w)
{
    sample_op *op = w->data;
    uint64_t t0 = ctx_now_ns();
    access_saved saved;
    char err[1024];
    /* The file is read as the user who asked (who is usually the owner):
     * the daemon reads nothing for a user that the user could not. */
    if (access_become(op->uid, op->gid, &saved, err, sizeof err) != 0) {
        op->code = GRADD__ERROR__CODE__PERMISSION_DENIED;
        snprintf(op->err, sizeof op->err, "%s", err);
        return;
    }
    sample_model *m = NULL;
    if (sample_pick_file(op->out_dir, op->path, sizeof op->path, err, sizeof err) != 0) {
        op->code = strstr(err, "ermission denied") ? GRADD__ERROR__CODE__PERMISSION_DENIED
                                                   : GRADD__ERROR__CODE__NOT_FOUND;
        snprintf(op->err, sizeof op->err, "job %u: %s", op->job, err);
    } else if (sample_load(op->path, op->opts.threads, &m, err, sizeof err) != 0) {
        op->code = GRADD__ERROR__CODE__BAD_REQUEST;
        snprintf(op->err, sizeof op->err, "job %u: %s", op->job, err);
    }
    access_restore(&saved);
    if (!m)
        return;
    op->vocab = sample_vocab(m);
    op->step = sample_step(m);
    if (sample_generate(m, &op->opts, &op->out, err, sizeof err) != 0) {
        op->code = GRADD__ERROR__CODE__BAD_REQUEST;
        snprintf(op->err, sizeof op->err, "sample: %s", err);
    }
    sample_free(m);
    op->elapsed_s = (double)(ctx_now_ns() - t0) / 1e9;
}

static void sample_done(uv_work_t *w, int status)
{
    sample_op *op = w->data;
    server_conn *c = op->conn;
    op->srv->samples--;
    if (c) {
        c->sample = NULL;
        Gradd__Response resp;
        Gradd__Error e;
        if (status != 0 || op->code) {
            wire_error_response(&resp, &e, op->code ? op->code : GRADD__ERROR__CODE__INTERNAL,
                                op->code ? op->err : "sampling was cancelled");
            conn_send(c, &resp);
        } else {
            Gradd__SampleResponse sr;
            gradd__sample_response__init(&sr);
            sr.text.data = op->out.text;
            sr.text.len = op->out.text ? op->out.n : 0;
            sr.n_token_ids = op->out.n;
            sr.token_ids = op->out.ids;
            sr.model_path = op->path;
            sr.step = op->step;
            sr.vocab = op->vocab;
            sr.seed = op->opts.seed;
            sr.elapsed_s = op->elapsed_s;
            gradd__response__init(&resp);
            resp.version = WIRE_PROTOCOL_VERSION;
            resp.body_case = GRADD__RESPONSE__BODY_SAMPLE;
            resp.sample = &sr;
            conn_send(c, &resp);
        }
        if (!c->closing && !c->watching)
            uv_timer_again(&c->idle);
    }
    log_job(LOG_INFO, op->job, NULL, "job %u: sampled %zu tokens for uid %u in %.2fs%s%s%s", op->job, op->out.n,
            (unsigned)op->uid, op->elapsed_s, op->code ? ": " : "", op->code ? op->err : "",
            c ? "" : " (the client left)");
    sample_output_free(&op->out);
    free(op->prompt);
    free(op);
}

static void start_sample(server_conn *c, const Gradd__SampleRequest *rq)
{
    server *s = c->srv;
    gradd_ctx *ctx = s->ctx;
    char msg[PATH_MAX + 256];
    Gradd__Response resp;
    Gradd__Error e;
    Gradd__Error__Code code = GRADD__ERROR__CODE__BAD_REQUEST;
    msg[0] = '\0';
    double temp = rq->has_temperature ? rq->temperature : SAMPLE_DEFAULT_TEMPERATURE;
    if (rq->tokens > SAMPLE_MAX_TOKENS)
        snprintf(msg, sizeof msg, "sample: tokens: %u is more than %d", rq->tokens, SAMPLE_MAX_TOKENS);
    else if (!(temp >= 0) || temp > 100)
        snprintf(msg, sizeof msg, "sample: temperature: %g is not between 0 and 100", temp);
    else if (c->sample)
        snprintf(msg, sizeof msg, "sample: this connection is already waiting for one"), code = GRADD__ERROR__CODE__UNAVAILABLE;
    else if (s->samples >= MAX_SAMPLES)
        snprintf(msg, sizeof msg, "sample: %d samples are being generated; try again shortly", MAX_SAMPLES),
            code = GRADD__ERROR__CODE__UNAVAILABLE;
    else if (!ctx->q)
        snprintf(msg, sizeof msg, "this gradd has no job queue"), code = GRADD__ERROR__CODE__UNAVAILABLE;
    sample_op *op = msg[0] ? NULL : calloc(1, sizeof *op);
    if (!msg[0] && (!op || !(op->prompt = malloc(rq->prompt.len ? rq->prompt.len : 1)))) {
        snprintf(msg, sizeof msg, "out of memory");
        code = GRADD__ERROR__CODE__INTERNAL;
    }
    if (!msg[0]) {
        pthread_mutex_lock(&ctx->q->lock);
        job *j = queue_find(ctx->q, rq->id);
        if (!j) {
            snprintf(msg, sizeof msg, "no job %u", rq->id);
            code = GRADD__ERROR__CODE__NOT_FOUND;
        } else if (j->cfg_unread) {
            snprintf(msg, sizeof msg,
                     "job %u (%s): its job file could not be read when gradd started (the log says why), so "
                     "its model is unknown",
                     j->id, j->name);
        } else if (!model_generates(&j->cfg)) {
            snprintf(msg, sizeof msg, "job %u (%s) trains an mlp classifier; only gpt jobs generate text", j->id,
                     j->name);
        } else {
            snprintf(op->out_dir, sizeof op->out_dir, "%s", j->cfg.out_dir);
        }
        pthread_mutex_unlock(&ctx->q->lock);
    }
    if (msg[0]) {
        if (op)
            free(op->prompt);
        free(op);
        wire_error_response(&resp, &e, code, msg);
        conn_send(c, &resp);
        return;
    }
    op->conn = c;
    op->srv = s;
    op->job = rq->id;
    op->uid = c->peer.uid;
    op->gid = c->peer.gid;
    if (rq->prompt.len)
        memcpy(op->prompt, rq->prompt.data, rq->prompt.len);
    op->opts.prompt = op->prompt;
    op->opts.prompt_len = rq->prompt.len;
    op->opts.tokens = rq->tokens ? rq->tokens : SAMPLE_DEFAULT_TOKENS;
    op->opts.temperature = temp;
    op->opts.seed = rq->seed;
    /* Without a seed, a fresh one, reported back so the text can be had again. */
    if (!rq->has_seed && getrandom(&op->opts.seed, sizeof op->opts.seed, GRND_NONBLOCK) != sizeof op->opts.seed)
        op->opts.seed = ctx_now_ns() ^ ((uint64_t)c->peer.pid << 32);
    /* One core: training jobs keep the rest. */
    op->opts.threads = 1;
    op->work.data = op;
    if (uv_queue_work(&s->loop, &op->work, sample_work, sample_done) != 0) {
        free(op->prompt);
        free(op);
        wire_error_response(&resp, &e, GRADD__ERROR__CODE__INTERNAL, "cannot start sampling");
        conn_send(c, &resp);
        return;
    }
    c->sample = op;
    s->samples++;
    /* Generation may outlast client_timeout: the answer resets the timer. */
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
    } else if (req->body_case == GRADD__REQUEST__BODY_WATCH) {
        start_watch(c, req->watch->id);
    } else if (req->body_case == GRADD__REQUEST__BODY_SAMPLE) {
        start_sample(c, req->sample);
    } else if (!conn_over_limit(c)) {
        c->answering = true;
        rpc_dispatch(c->srv->ctx, &c->peer, req, conn_send, c);
        c->answering = false;
    }
    gradd__request__free_unpacked(req, NULL);
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
            if (!c->watching)
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

static void on_connection(uv_stream_t *l, int status)
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
    if (s->nconns > s->ctx->cfg.max_clients) {
        if (s->refused++ % 100 == 0)
            log_warn("refusing connection: %zu clients already (daemon max_clients)", s->nconns - 1);
        /* Say why, in one non-blocking write that nobody waits for: a
         * flood of connections costs no queue, and a client that reads
         * learns it is the daemon's limit, not a crash. */
        uv_os_fd_t fd;
        Gradd__Response resp;
        Gradd__Error err;
        char msg[128];
        snprintf(msg, sizeof msg, "gradd is serving as many clients as its [daemon] max_clients (%llu); try again later",
                 (unsigned long long)s->ctx->cfg.max_clients);
        wire_error_response(&resp, &err, GRADD__ERROR__CODE__UNAVAILABLE, msg);
        size_t len;
        uint8_t *buf = wire_pack_response(&resp, &len);
        if (buf && uv_fileno((uv_handle_t *)&c->pipe, &fd) == 0 &&
            send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
            log_debug("conn %llu: refusal not sent: %s", (unsigned long long)c->id, strerror(errno));
        free(buf);
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
    uint64_t t = s->ctx->cfg.client_timeout_ms;
    uv_timer_start(&c->idle, on_idle, t, t);
    uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
}

/* ---- the socket file ------------------------------------------------------- */

int server_probe_path(const char *path, char *err, size_t err_len)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return 0;
        snprintf(err, err_len, "cannot inspect %s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISSOCK(st.st_mode)) {
        snprintf(err, err_len, "%s exists and is not a socket; refusing to replace it", path);
        return -1;
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, err_len, "socket: %s", strerror(errno));
        return -1;
    }
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    int e = errno;
    close(fd);
    if (rc == 0) {
        snprintf(err, err_len, "another gradd is already serving on %s (stop it, or use -s PATH)", path);
        return -1;
    }
    if (e == ECONNREFUSED) {
        /* Nobody listens: a crashed daemon's leftover.  Replace it. */
        if (unlink(path) != 0 && errno != ENOENT) {
            snprintf(err, err_len, "cannot remove stale socket %s: %s", path, strerror(errno));
            return -1;
        }
        log_info("removed stale socket %s", path);
        return 0;
    }
    snprintf(err, err_len, "cannot tell whether %s is in use: %s", path, strerror(e));
    return -1;
}

/* Create the socket's directory if needed, and refuse one that someone else
 * could swap the socket in. */
static int prepare_dir(const char *path, char *err, size_t err_len)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return 0;
    *slash = '\0';
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno != ENOENT || mkdir(dir, geteuid() == 0 ? 0755 : 0700) != 0) {
            snprintf(err, err_len, "cannot create socket directory %s: %s", dir, strerror(errno));
            return -1;
        }
        return 0;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, err_len, "socket directory %s is not a directory", dir);
        return -1;
    }
    if ((st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX)) {
        snprintf(err, err_len, "socket directory %s is world-writable without the sticky bit", dir);
        return -1;
    }
    if (st.st_uid != geteuid() && st.st_uid != 0) {
        snprintf(err, err_len, "socket directory %s belongs to uid %u, not to this user", dir,
                 (unsigned)st.st_uid);
        return -1;
    }
    return 0;
}

/* Accept connections on the listening socket fd: 0, or a libuv error with
 * the handle closed. */
static int serve_fd(server *s, int fd)
{
    uv_pipe_init(&s->loop, &s->listener, 0);
    s->listener.data = s;
    int rc = uv_pipe_open(&s->listener, fd);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&s->listener, 1024, on_connection);
    if (rc != 0)
        uv_close((uv_handle_t *)&s->listener, NULL);
    return rc;
}

static int bind_socket(server *s, const char *path, char *err, size_t err_len)
{
    int fd = svc_listen_fd();
    if (fd >= 0) {
        /* systemd made and owns the socket (gradd.socket): serve it, and
         * leave it in place at shutdown. */
        int rc = serve_fd(s, fd);
        if (rc != 0) {
            snprintf(err, err_len, "cannot serve the socket systemd passed (fd %d): %s", fd, uv_strerror(rc));
            return -1;
        }
        size_t len = sizeof s->path;
        if (uv_pipe_getsockname(&s->listener, s->path, &len) != 0)
            snprintf(s->path, sizeof s->path, "(fd %d from systemd)", fd);
        s->activated = true;
        return 0;
    }
    /* The socket is made under a temporary name and linked into place only
     * once it listens and has its group: a client (or a script waiting for
     * the file) never finds it refusing connections or in the wrong group.
     * link(), unlike rename(), fails where the path exists, so two daemons
     * starting at once cannot replace each other's socket.  The fd is ours,
     * not bound through libuv, whose close would unlink the path even when
     * it is no longer our socket. */
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    char suffix[32];
    snprintf(suffix, sizeof suffix, ".%ld.new", (long)getpid());
    if (strlen(path) + strlen(suffix) >= sizeof sa.sun_path) {
        snprintf(err, err_len, "socket path %s is too long (at most %zu bytes)", path,
                 sizeof sa.sun_path - 1 - strlen(suffix));
        return -1;
    }
    if (prepare_dir(path, err, err_len) != 0 || server_probe_path(path, err, err_len) != 0)
        return -1;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s%s", path, suffix);
    const char *tmp = sa.sun_path;
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, err_len, "socket: %s", strerror(errno));
        return -1;
    }
    unlink(tmp); /* a leftover of a crashed daemon that had our pid */
    /* Created 0660 from the start: no window where others could connect. */
    mode_t old = umask(0117);
    int brc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
    int e = errno;
    umask(old);
    if (brc != 0 || listen(fd, 1024) != 0) {
        e = brc != 0 ? e : errno;
        snprintf(err, err_len, "cannot listen on %s: %s", tmp, strerror(e));
        if (brc == 0)
            unlink(tmp);
        close(fd);
        return -1;
    }
    /* Hand the socket to the group of gradd's users when we may. */
    struct group *g = s->ctx->cfg.socket_group[0] ? getgrnam(s->ctx->cfg.socket_group) : NULL;
    if (g && chown(tmp, (uid_t)-1, g->gr_gid) != 0)
        log_debug("socket %s stays in its current group: %s", path, strerror(errno));
    int lrc = link(tmp, path);
    e = errno;
    if (lrc != 0 && (e == EPERM || e == EOPNOTSUPP || e == ENOSYS)) {
        /* A filesystem without hard links: rename, which replaces what is
         * there, after the probe above found nothing live at path. */
        lrc = rename(tmp, path);
        e = errno;
    }
    unlink(tmp);
    if (lrc != 0) {
        if (e == EEXIST)
            snprintf(err, err_len, "%s appeared while gradd was starting (another gradd?); not replaced", path);
        else
            snprintf(err, err_len, "cannot create %s: %s", path, strerror(e));
        close(fd);
        return -1;
    }
    struct stat st;
    if (stat(path, &st) == 0) {
        s->sock_dev = st.st_dev;
        s->sock_ino = st.st_ino;
    }
    int rc = serve_fd(s, fd);
    if (rc != 0) {
        snprintf(err, err_len, "cannot listen on %s: %s", path, uv_strerror(rc));
        unlink(path);
        return -1;
    }
    snprintf(s->path, sizeof s->path, "%s", path);
    return 0;
}

/* ---- signals, timers, run ------------------------------------------------ */

static void on_signal(uv_signal_t *h, int signum)
{
    server *s = h->data;
    svc_stopping();
    log_info("%s: shutting down", strsignal(signum));
    server_stop(s);
}

/* STATUS= for systemctl status, and the watchdog: ping only while every
 * busy worker has made progress within the watchdog interval, so a hung
 * job thread stops the pings and systemd restarts the daemon. */
static void svc_status_update(server *s)
{
    gradd_ctx *ctx = s->ctx;
    size_t running = 0, queued = 0;
    bool progressing = true;
    uint32_t stuck_job = 0;
    const char *stuck_dev = NULL;
    uint64_t now = ctx_now_ns();
    pthread_mutex_lock(&ctx->q->lock);
    for (size_t i = 0; i < ctx->q->n; i++) {
        running += ctx->q->jobs[i]->state == JOB_RUNNING;
        queued += ctx->q->jobs[i]->state == JOB_QUEUED;
    }
    if (s->wd_usec && ctx->ws) {
        for (int i = 0; i < ctx->ws->n; i++) {
            worker *w = &ctx->ws->w[i];
            if (!w->busy || w->beats != s->wd_beats[i]) {
                s->wd_beats[i] = w->beats;
                s->wd_since_ns[i] = now;
            } else if (now - s->wd_since_ns[i] > s->wd_usec * 1000) {
                progressing = false;
                stuck_job = w->job;
                stuck_dev = ctx->devs[w->dev]->id;
            }
        }
    }
    pthread_mutex_unlock(&ctx->q->lock);
    size_t alloc = 0;
    pool_stats *ps = malloc(sizeof *ps);
    for (int i = 0; ps && i < ctx->ndev; i++) {
        pool_stats_read(ctx->pools[i], ps);
        alloc += (size_t)ps->allocated_bytes[POOL_ALL].current;
    }
    free(ps);
    char line[160], a[16];
    snprintf(line, sizeof line, "%zu running, %zu queued; %s of device memory in use", running, queued,
             units_format_size(alloc, a, sizeof a));
    svc_status(line);
    if (!s->wd_usec)
        return;
    if (progressing) {
        svc_watchdog();
        s->wd_hung = false;
    } else if (!s->wd_hung) {
        s->wd_hung = true;
        log_job(LOG_ERR, stuck_job, stuck_dev,
                "job %u on %s has made no progress for %llums; watchdog pings stopped", stuck_job, stuck_dev,
                (unsigned long long)(s->wd_usec / 1000));
    }
}

static void on_tick(uv_timer_t *t)
{
    server *s = t->data;
    /* Time-based pool policies (periodic trim, low watermark, gc threshold)
     * also run on idle devices, where no worker calls pool_tick. */
    for (int i = 0; i < s->ctx->ndev; i++)
        pool_tick(s->ctx->pools[i], 0);
    if (s->ctx->q && s->ctx->cfg.keep_finished_ms) {
        pthread_mutex_lock(&s->ctx->q->lock);
        size_t gone = queue_prune(s->ctx->q, (double)time(NULL), (double)s->ctx->cfg.keep_finished_ms / 1e3);
        pthread_mutex_unlock(&s->ctx->q->lock);
        if (gone)
            queue_notify(s->ctx->q);
    }
    if (s->ctx->q) {
        /* What a full state dir kept from disk, again once a second. */
        queue_save_unsaved(s->ctx->q);
        svc_status_update(s);
    }
}

int server_init(server *s, gradd_ctx *ctx, const char *path, char *err, size_t err_len)
{
    memset(s, 0, sizeof *s);
    s->ctx = ctx;
    int rc = uv_loop_init(&s->loop);
    if (rc != 0) {
        snprintf(err, err_len, "uv_loop_init: %s", uv_strerror(rc));
        return -1;
    }
    /* Signals first: once the socket accepts, a client may already be
     * telling us to stop, and SIGTERM must then mean a clean shutdown. */
    uv_signal_init(&s->loop, &s->sig_term);
    uv_signal_init(&s->loop, &s->sig_int);
    uv_signal_init(&s->loop, &s->sig_hup);
    s->sig_term.data = s->sig_int.data = s->sig_hup.data = s;
    uv_signal_start(&s->sig_term, on_signal, SIGTERM);
    uv_signal_start(&s->sig_int, on_signal, SIGINT);
    /* The terminal gradd ran in went away: stop as cleanly as on SIGTERM
     * (running jobs checkpoint), rather than die on the default action.
     * Not when it is ignored: `nohup gradd` asks to outlive the terminal. */
    struct sigaction hup;
    if (sigaction(SIGHUP, NULL, &hup) == 0 && hup.sa_handler != SIG_IGN)
        uv_signal_start(&s->sig_hup, on_signal, SIGHUP);
    uv_timer_init(&s->loop, &s->tick);
    s->tick.data = s;
    uv_async_init(&s->loop, &s->notify, on_notify);
    s->notify.data = s;
    if (bind_socket(s, path, err, err_len) != 0) {
        uv_close((uv_handle_t *)&s->sig_term, NULL);
        uv_close((uv_handle_t *)&s->sig_int, NULL);
        uv_close((uv_handle_t *)&s->sig_hup, NULL);
        uv_close((uv_handle_t *)&s->tick, NULL);
        uv_close((uv_handle_t *)&s->notify, NULL);
        uv_run(&s->loop, UV_RUN_DEFAULT);
        uv_loop_close(&s->loop);
        return -1;
    }
    s->wd_usec = svc_watchdog_usec();
    uint64_t every = 1000;
    if (s->wd_usec && s->wd_usec / 2000 < every)
        every = s->wd_usec / 2000 ? s->wd_usec / 2000 : 1;
    uv_timer_start(&s->tick, on_tick, every, every);
    if (ctx->q) {
        pthread_mutex_lock(&ctx->q->lock);
        ctx->q->notify = notify_loop;
        ctx->q->notify_user = s;
        pthread_mutex_unlock(&ctx->q->lock);
    }
    return 0;
}

int server_run(server *s)
{
    log_info("listening on %s (protocol %u, pid %d)", s->path, WIRE_PROTOCOL_VERSION, (int)getpid());
    uv_run(&s->loop, UV_RUN_DEFAULT);
    return 0;
}

static void unlink_ours(server *s)
{
    struct stat st;
    if (!s->activated && s->path[0] && stat(s->path, &st) == 0 && st.st_dev == s->sock_dev && st.st_ino == s->sock_ino)
        unlink(s->path);
}

void server_stop(server *s)
{
    if (s->stopping)
        return;
    s->stopping = true;
    /* Unlink first so that a new daemon can bind as soon as we stop
     * accepting, and never removes a socket that is not ours. */
    unlink_ours(s);
    uv_close((uv_handle_t *)&s->listener, NULL);
    uv_close((uv_handle_t *)&s->sig_term, NULL);
    uv_close((uv_handle_t *)&s->sig_int, NULL);
    uv_close((uv_handle_t *)&s->sig_hup, NULL);
    uv_close((uv_handle_t *)&s->tick, NULL);
    /* Workers may still report while they checkpoint: stop them from
     * touching the loop before its handle goes away. */
    if (s->ctx->q) {
        pthread_mutex_lock(&s->ctx->q->lock);
        s->ctx->q->notify = NULL;
        pthread_mutex_unlock(&s->ctx->q->lock);
    }
    uv_close((uv_handle_t *)&s->notify, NULL);
    for (server_conn *c = s->conns; c; c = c->next)
        conn_close(c);
}

void server_free(server *s)
{
    if (!s->stopping)
        server_stop(s);
    uv_run(&s->loop, UV_RUN_DEFAULT); /* let the close callbacks run */
    if (uv_loop_close(&s->loop) != 0)
        log_warn("event loop closed with handles still open");
    free(s->wd_beats);
    free(s->wd_since_ns);
}
