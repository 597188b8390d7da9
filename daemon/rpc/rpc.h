/* rpc.h — one handler per request body.  The server (server.c) owns the
 * connections and framing; handlers here only read the request, consult
 * the daemon's state and send one or more responses through `send`. */
#ifndef GRADD_RPC_H
#define GRADD_RPC_H

#include <limits.h>
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

struct job;

/* A JobInfo message and the storage its fields point into. */
typedef struct {
    Gradd__JobInfo msg;
    Gradd__TagUsage tags[POOL_TAG_COUNT];
    Gradd__TagUsage *tag_ptrs[POOL_TAG_COUNT];
    char name[64], user[64], device[16], reason[1024], out_dir[PATH_MAX], job_file[PATH_MAX];
    char change_reason[16];
} rpc_job_store;

/* Fill st from j; the caller holds the queue lock. */
int rpc_job_info(gradd_ctx *ctx, const struct job *j, rpc_job_store *st);

/* Answer a request whose version has already been checked. */
void rpc_dispatch(gradd_ctx *ctx, const rpc_peer *peer, const Gradd__Request *req,
                  rpc_send_fn send, void *conn);

#endif
