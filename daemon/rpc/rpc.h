/* rpc.h — one request, one answer: the control protocol's commands.
 *
 * The server owns the process side (the loop, connections, framing, the
 * socket, libuv's thread pool); rpc knows nothing of it.  A request comes
 * in as an rpc_call, the answer goes out through call->send, and a command
 * whose answer outlives the request hands the server one of two things:
 *   a stream    (watch): frames that follow job changes until it ends;
 *   deferred work (sample): a slow part run off the loop, then answered.
 * rpc.c holds the table from request body to command; each command family
 * is a file of its own (jobs.c, pool.c, watch.c, sample.c, metrics.c,
 * test_hooks.c). */
#ifndef GRADD_RPC_H
#define GRADD_RPC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "base/ctx.h"
#include "wire.h"

typedef struct {
    uid_t uid;
    gid_t gid;
    pid_t pid;
} rpc_peer;

/* Queue one response on the connection `conn`; returns 0 or -1 when the
 * connection is gone or over its output limit. */
typedef int (*rpc_send_fn)(void *conn, const Gradd__Response *resp);
/* Bytes queued on the connection `conn` that its client has not taken yet
 * (beyond what the kernel's socket buffer holds). */
typedef size_t (*rpc_queued_fn)(void *conn);

/* One request being answered, as the server sees its connection. */
typedef struct {
    gradd_ctx *ctx;
    const rpc_peer *peer;
    rpc_send_fn send;
    rpc_queued_fn queued;
    void *conn;
    /* Deferred work in flight: whether this connection waits for some, and
     * how much the daemon runs of the most it runs at once.  A command
     * refuses more rather than have it queue behind the others. */
    bool work_pending;
    int work_running, work_slots;
} rpc_call;

/* Frames that follow a request.  The server calls next once when the
 * stream starts, again each time a job changes and each time the client
 * has taken a frame, until next returns false (the stream has ended);
 * then, or when the connection closes first, it calls free.  A stream
 * sends only while call->queued is small and waits for the next call
 * otherwise: a client that stops reading holds up its own stream, never
 * the daemon's memory. */
typedef struct rpc_stream {
    bool (*next)(struct rpc_stream *st, const rpc_call *call);
    void (*free)(struct rpc_stream *st);
} rpc_stream;

typedef enum {
    RPC_WORK_RAN,       /* run returned */
    RPC_WORK_CANCELLED, /* the loop stopped before run began */
    RPC_WORK_UNSTARTED, /* the server could not queue it */
} rpc_work_status;

/* A slow part of an answer.  The server calls run once, in a thread off
 * the loop, then done on the loop with the connection to answer (NULL when
 * the client left); done frees the work.  The server sets cancelled, from
 * the loop while run may be running, once nobody will read the answer (the
 * client left, the daemon stops): run should then end soon, as its thread
 * is one of the few the server has and a stop waits for it. */
typedef struct rpc_work {
    void (*run)(struct rpc_work *w);
    void (*done)(struct rpc_work *w, const rpc_call *call, rpc_work_status status);
    atomic_bool cancelled;
} rpc_work;

/* What a request leaves to the server beyond what was sent: at most one of
 * the two is set. */
typedef struct {
    rpc_stream *stream;
    rpc_work *work;
} rpc_reply;

/* Answer a request whose version has already been checked. */
rpc_reply rpc_dispatch(const rpc_call *call, const Gradd__Request *req);

#endif
