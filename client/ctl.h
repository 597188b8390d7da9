/* ctl.h — what every gradctl command shares: global options, the
 * connection to gradd, one request/response exchange, and exit codes. */
#ifndef GRADCTL_CTL_H
#define GRADCTL_CTL_H

#include <limits.h>
#include <stdbool.h>

#include "wire.h"

/* Exit codes, documented in gradctl(1). */
enum {
    CTL_OK = 0,
    CTL_ERR_DAEMON = 1,      /* the daemon answered with an error */
    CTL_ERR_USAGE = 2,       /* bad command line or input file */
    CTL_ERR_UNREACHABLE = 3, /* no daemon at the socket */
};

struct ctl_cmd;

typedef struct ctl {
    char socket_path[PATH_MAX];
    bool json;
    int fd; /* -1 until connected */
    const struct ctl_cmd *cmd; /* the command being run: its usage errors name it */
    /* The exchange in progress, for ctl_next and ctl_unexpected: what the
     * messages call it, and the body its replies must have. */
    const char *what;
    int body;
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

/* One exchange: send a request whose body is `msg`, the message of the
 * request's field `body` (GRADD__REQUEST__BODY_CANCEL and a
 * Gradd__CancelRequest, say), and read the reply.  The reply's body must be
 * the response field of the same number, as gradd.proto pairs them; else
 * "unexpected reply to WHAT".  CTL_OK with *out set (free it with
 * ctl_free), or the exit code with *out NULL, the reason said on stderr: a
 * daemon's error reply is printed (and with --json written as JSON too). */
int ctl_call(ctl *c, const char *what, Gradd__Request__BodyCase body, void *msg, Gradd__Response **out);
/* The next reply of a streamed answer (a long list, logs, watch,
 * timeline), checked as ctl_call checks the first. */
int ctl_next(ctl *c, Gradd__Response **out);
/* For a reply that has the right body but lacks what the command needs:
 * "unexpected reply to WHAT", the reply freed, CTL_ERR_DAEMON. */
int ctl_unexpected(ctl *c, Gradd__Response *resp);
void ctl_free(Gradd__Response *resp);

/* Report a usage error for the command being run and return CTL_ERR_USAGE. */
int ctl_usage(const ctl *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* After the options (getopt's optind), exactly one SIZE ("512M", "4G").
 * CTL_OK with *bytes set, or the usage error's code. */
int ctl_size_arg(const ctl *c, int argc, char **argv, uint64_t *bytes);


#endif
