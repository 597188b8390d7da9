/* ctl.h — what every gradctl command shares: global options, the
 * connection to gradd, one request/response exchange, and exit codes. */
#ifndef GRADCTL_CTL_H
#define GRADCTL_CTL_H

#include <limits.h>
#include <stdbool.h>

#include "json.h"
#include "wire.h"

/* Exit codes, documented in gradctl(1). */
enum {
    CTL_OK = 0,
    CTL_ERR_DAEMON = 1,      /* the daemon answered with an error */
    CTL_ERR_USAGE = 2,       /* bad command line or input file */
    CTL_ERR_UNREACHABLE = 3, /* no daemon at the socket */
};

typedef struct ctl {
    char socket_path[PATH_MAX];
    bool json;
    int fd; /* -1 until connected */
} ctl;

typedef struct ctl_cmd {
    const char *name;
    const char *args;    /* usage after the name, e.g. "[-d DEV]" */
    const char *summary; /* one line for `gradctl help` */
    int (*run)(ctl *c, int argc, char **argv); /* argv[0] is the command name */
    bool hidden;         /* test-only commands stay out of the help */
} ctl_cmd;

/* The table of commands (commands.c); each entry lives in its own cmd_*.c. */
extern const ctl_cmd *const ctl_commands[];

/* Connect to the daemon; on failure print which socket was tried and how to
 * start gradd, and return CTL_ERR_UNREACHABLE. */
int ctl_connect(ctl *c);
void ctl_close(ctl *c);

/* Send `req` (its version is set here) and read one response.  Error
 * responses are printed and turned into CTL_ERR_DAEMON, with *out NULL.
 * Free a returned response with gradd__response__free_unpacked. */
int ctl_call(ctl *c, Gradd__Request *req, Gradd__Response **out);
/* Read one more response (streamed replies). */
int ctl_recv(ctl *c, Gradd__Response **out);

/* Report a usage error for `cmd` and return CTL_ERR_USAGE. */
int ctl_usage(const ctl_cmd *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));


#endif
