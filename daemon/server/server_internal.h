/* server_internal.h — what the server*.c files share and nobody else sees.
 *
 * Layout of server/:
 *   main.c      the command line, the context, the workers, then the loop
 *   server.c    the loop: signals, the tick, workers' job-change wake-ups
 *   conn.c      connections: accepting, framing, answering through rpc,
 *               streams and deferred work
 *   sockfile.c  the socket file: trust, bind, probe, unlink
 *   svc.c       systemd: notify, status and watchdog, the journal
 */
#ifndef GRADD_SERVER_INTERNAL_H
#define GRADD_SERVER_INTERNAL_H

#include "server.h"

/* conn.c */
/* libuv's connection callback for the listener. */
void server_accept(uv_stream_t *listener, int status);
/* A job changed: give every connection's stream its next frame. */
void server_push_streams(server *s);
/* Close every connection (shutdown). */
void server_close_conns(server *s);

/* sockfile.c */
/* Listen on `path`, or on the socket systemd passed: 0, or -1 with the
 * reason in err. */
int server_bind(server *s, const char *path, char *err, size_t err_len);
/* Remove the socket file, only if it is still the one server_bind made. */
void server_unlink(server *s);

#endif
