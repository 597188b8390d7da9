/* ctl.h — what every gradctl command shares: global options, the
 * connection to gradd, one request/response exchange, and exit codes. */
#ifndef GRADCTL_CTL_H
#define GRADCTL_CTL_H

#include <getopt.h>
#include <jansson.h>
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
    /* The job file's absolute path that submit sends, which the daemon's
     * messages about it start with; "DIR/(stdin)" for a job read from
     * standard input, which those messages then call "(stdin)", as
     * gradctl's own do.  NULL outside submit. */
    const char *job_path;
    bool job_stdin;
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

/* ---- errors ---------------------------------------------------------------- */

/* Every error gradctl reports goes through here, so that it reads the same
 * whoever found it: "gradctl CMD: MESSAGE" on stderr ("gradctl: MESSAGE"
 * before a command is known), the message made safe for the terminal, and
 * with --json also one object on stdout, {"error": {"code": CODE,
 * "message": MESSAGE, ...}}, so that a script reading stdout always gets a
 * document.  CODE is the daemon's Error code in lower case ("not_found"),
 * or gradctl's own: "usage", "unreachable", "bad_job", "io", "internal".
 * `fields` (NULL, or an object whose reference is taken) adds members
 * beside code and message.  Returns rc, the exit code. */
int ctl_error(const ctl *c, int rc, const char *code, json_t *fields, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* For a "bad_job" error: a message "FILE:LINE: [section] key: why" about
 * `file` as fields {"file", "line", "section", "key"}, those it has. */
json_t *ctl_where_fields(const char *msg, const char *file);

/* Report a usage error for the command being run (ctl_error, code "usage",
 * with the command's usage line) and return CTL_ERR_USAGE. */
int ctl_usage(const ctl *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The usage line of the command being run, "gradctl [-s PATH] [--json]
 * NAME ARGS", into buf. */
const char *ctl_usage_line(const ctl *c, char *buf, size_t len);

/* getopt_long for a command's options, plus --json and -h/--help, which
 * every command takes wherever its options go: parsed with the command's
 * own so that an option's value ("--prompt --json") is never taken for
 * one.  -h prints the command's help and exits 0.  Returns the next of the
 * command's options, -1 after the last, or '?' once an unknown option or a
 * missing value has been reported (return CTL_ERR_USAGE then).  A word
 * like "-1" where no such option exists is reported as a bad job id. */
int ctl_getopt(ctl *c, int argc, char **argv, const char *shortopts, const struct option *longopts);
/* After the options (getopt's optind), exactly one SIZE ("512M", "4G").
 * CTL_OK with *bytes set, or the usage error's code. */
int ctl_size_arg(const ctl *c, int argc, char **argv, uint64_t *bytes);


#endif
