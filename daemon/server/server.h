/* server.h — the control plane: a libuv loop on the Unix socket.
 *
 * It accepts connections, reads frames through the shared wire reader,
 * checks versions, and hands each request to rpc_dispatch.  The loop never
 * blocks on training: workers publish state that handlers only read.
 */
#ifndef GRADD_SERVER_H
#define GRADD_SERVER_H

#include <limits.h>
#include <stdbool.h>
#include <sys/types.h>
#include <uv.h>

#include "base/ctx.h"
#include "svc.h"

typedef struct server_conn server_conn;

/* How many admitted connections one uid holds. */
typedef struct {
    uid_t uid;
    size_t n;
} server_uid_count;

typedef struct server {
    uv_loop_t loop;
    uv_pipe_t listener;
    uv_signal_t sig_term, sig_int, sig_hup;
    uv_timer_t tick;
    uv_async_t notify; /* workers: a job changed; push to streams */
    gradd_ctx *ctx;
    char path[PATH_MAX];
    dev_t sock_dev;
    ino_t sock_ino;
    server_conn *conns; /* all open connections, for shutdown */
    size_t nconns;
    uint64_t accepted, refused;
    /* Connections admitted under max_clients and max_clients_per_user, and
     * how many each uid holds: only uids holding some, so a short array. */
    size_t nclients;
    server_uid_count *per_uid;
    size_t nper_uid, per_uid_cap;
    bool stopping;
    bool activated;        /* the socket came from systemd (gradd.socket) */
    svc_watchdog_state wd; /* beats, one per worker, allocated by main */
    int works;             /* deferred work (rpc_work) in libuv's thread pool */
} server;

/* Bind the socket at `path` (replacing a stale one, refusing a live one) and
 * set up signals and timers.  Returns 0, or -1 with the reason in err. */
int server_init(server *s, gradd_ctx *ctx, const char *path, char *err, size_t err_len);
/* Serve until SIGTERM/SIGINT or server_stop; returns 0 on a clean stop. */
int server_run(server *s);
/* Stop accepting, close every connection, and let server_run return. */
void server_stop(server *s);
/* Release the loop; unlinks the socket if it is still the one we made. */
void server_free(server *s);

/* What is at `path`: 0 nothing (or a stale socket, now removed), -1 with the
 * reason in err when a live daemon answers there or it is not a socket. */
int server_probe_path(const char *path, char *err, size_t err_len);

#endif
