/* ctl.c — the client side of the control protocol. */
#include "ctl.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "jout.h"
#include "table.h"
#include "units.h"

int ctl_connect(ctl *c)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(c->socket_path) >= sizeof sa.sun_path)
        return ctl_error(c, CTL_ERR_USAGE, "usage", NULL, "socket path %s is too long", c->socket_path);
    memcpy(sa.sun_path, c->socket_path, strlen(c->socket_path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        char hint[512];
        struct stat st;
        bool there = stat(c->socket_path, &st) == 0;
        if (there && !S_ISSOCK(st.st_mode))
            /* A directory, a file: gradd would not make its socket there. */
            snprintf(hint, sizeof hint,
                     "%s is a %s, not a socket: -s and GRADD_SOCKET name the socket itself\n"
                     "  (gradd -s PATH makes it; `gradctl status` without -s finds the default).",
                     c->socket_path,
                     S_ISDIR(st.st_mode) ? "directory" : S_ISREG(st.st_mode) ? "file" : "special file");
        else if (e == EACCES)
            /* The socket is there; this user is not in its group. */
            snprintf(hint, sizeof hint,
                     "Its socket is for the members of gradd's socket group ([daemon] socket_group,\n"
                     "  'gradd' by default): an admin adds you with `usermod -aG gradd USER`,\n"
                     "  and the membership counts from your next login.");
        else
            snprintf(hint, sizeof hint,
                     "Start it with `gradd -s %s` (or `systemctl start gradd`),\n"
                     "  or point gradctl at a running daemon with -s PATH or GRADD_SOCKET.",
                     c->socket_path);
        return ctl_error(c, CTL_ERR_UNREACHABLE, "unreachable",
                         json_pack("{s:o}", "socket", jout_str(c->socket_path)),
                         "cannot reach gradd at %s: %s\n  %s", c->socket_path, strerror(e), hint);
    }
    c->fd = fd;
    return CTL_OK;
}

void ctl_close(ctl *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
}

/* A daemon's error reply, reported as gradctl's own are.  The exit code it
 * means. */
static int daemon_error(ctl *c, const Gradd__Error *e)
{
    const char *m = e->message && *e->message ? e->message : "the daemon reported an error";
    /* The code's name from the protocol's own enum, in lower case. */
    const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(&gradd__error__code__descriptor, (int)e->code);
    char code[32] = "unknown";
    if (ev)
        for (size_t i = 0; i + 1 < sizeof code; i++)
            if (!(code[i] = (char)tolower((unsigned char)ev->name[i])))
                break;
    /* A job file refused by the daemon is a bad input file, as one refused
     * here is. */
    int rc = e->code == GRADD__ERROR__CODE__BAD_JOB ? CTL_ERR_USAGE : CTL_ERR_DAEMON;
    /* Some say which request they answer ("sample: ..."), which the
     * prefix says already. */
    size_t cn = c->cmd ? strlen(c->cmd->name) : 0;
    if (cn && strncmp(m, c->cmd->name, cn) == 0 && strncmp(m + cn, ": ", 2) == 0)
        m += cn + 2;
    size_t n = c->job_path ? strlen(c->job_path) : 0;
    if (!n || strncmp(m, c->job_path, n) != 0)
        return ctl_error(c, rc, code, NULL, "%s", m);
    const char *file = c->job_stdin ? "(stdin)" : c->job_path;
    char *shown = NULL;
    if (asprintf(&shown, "%s%s", file, m + n) < 0)
        return ctl_error(c, rc, code, NULL, "%s", m);
    json_t *fields = e->code == GRADD__ERROR__CODE__BAD_JOB ? ctl_where_fields(shown, file) : NULL;
    ctl_error(c, rc, code, fields, "%s", shown);
    free(shown);
    return rc;
}

/* Read one reply frame; an error reply becomes its exit code. */
static int recv_reply(ctl *c, Gradd__Response **out)
{
    *out = NULL;
    uint8_t *body = NULL;
    size_t len = 0;
    errno = 0;
    wire_status ws = wire_read_frame(c->fd, WIRE_MAX_FRAME_DEFAULT * 16, &body, &len);
    if (ws != WIRE_OK) {
        /* A reset is what a daemon that refuses the connection (max_clients)
         * or stops mid-request looks like from here: say so plainly. */
        const char *why = ws == WIRE_CLOSED || (ws == WIRE_IO && errno == ECONNRESET)
                              ? "the daemon closed the connection"
                          : ws == WIRE_IO && errno ? strerror(errno)
                                                   : wire_status_str(ws);
        return ctl_error(c, CTL_ERR_UNREACHABLE, "unreachable", NULL,
                         "reading the reply from %s: %s (its log may say why)", c->socket_path, why);
    }
    char err[256];
    Gradd__Response *resp = wire_unpack_response(body, len, err, sizeof err);
    free(body);
    if (!resp)
        return ctl_error(c, CTL_ERR_DAEMON, "bad_reply", NULL, "%s", err);
    if (resp->body_case == GRADD__RESPONSE__BODY_ERROR) {
        int rc = daemon_error(c, resp->error);
        gradd__response__free_unpacked(resp, NULL);
        return rc;
    }
    *out = resp;
    return CTL_OK;
}

int ctl_unexpected(ctl *c, Gradd__Response *resp)
{
    ctl_free(resp);
    return ctl_error(c, CTL_ERR_DAEMON, "bad_reply", NULL, "unexpected reply to %s", c->what);
}

void ctl_free(Gradd__Response *resp)
{
    if (resp)
        gradd__response__free_unpacked(resp, NULL);
}

int ctl_next(ctl *c, Gradd__Response **out)
{
    int rc = recv_reply(c, out);
    if (rc != CTL_OK)
        return rc;
    /* protobuf-c sets the body's message whenever body_case names it. */
    if ((int)(*out)->body_case != c->body) {
        rc = ctl_unexpected(c, *out);
        *out = NULL;
    }
    return rc;
}

/* Write all of buf to the socket.  send with MSG_NOSIGNAL rather than
 * write: a daemon that closes the connection first (a request over its
 * max_frame, a client over its max_clients) would otherwise kill gradctl
 * with SIGPIPE, silently.  SIGPIPE stays on for stdout, so that
 * `gradctl watch ID | head` still ends when head does.  0, or an errno. */
static int send_all(int fd, const uint8_t *buf, size_t len)
{
    while (len) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return errno;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* The request with `msg` as its body.  Every body is a pointer in one
 * union, so the field's descriptor says where it goes and what type of
 * message it must be: another type would be packed under this field's
 * number and misread by the daemon. */
static void build_request(Gradd__Request *req, Gradd__Request__BodyCase body, void *msg)
{
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field(&gradd__request__descriptor, (unsigned)body);
    assert(f && f->type == PROTOBUF_C_TYPE_MESSAGE && f->descriptor == ((const ProtobufCMessage *)msg)->descriptor);
    gradd__request__init(req);
    req->version = WIRE_PROTOCOL_VERSION;
    req->body_case = body;
    memcpy((char *)req + f->offset, &msg, sizeof msg);
}

int ctl_call(ctl *c, const char *what, Gradd__Request__BodyCase body, void *msg, Gradd__Response **out)
{
    *out = NULL;
    c->what = what;
    c->body = (int)body;
    if (c->fd < 0) {
        int rc = ctl_connect(c);
        if (rc != CTL_OK)
            return rc;
    }
    Gradd__Request req;
    build_request(&req, body, msg);
    size_t len;
    uint8_t *buf = wire_pack_request(&req, &len);
    if (!buf)
        return ctl_error(c, CTL_ERR_DAEMON, "internal", NULL, "out of memory");
    int e = send_all(c->fd, buf, len);
    free(buf);
    if (e == EPIPE || e == ECONNRESET) {
        /* The daemon hung up before taking the whole request.  It says why
         * first where it can (a frame over its max_frame): that reply is
         * already here, and reading it cannot block on a closed peer. */
        int rc = recv_reply(c, out);
        if (rc == CTL_OK) {
            ctl_free(*out);
            *out = NULL;
            return ctl_error(c, CTL_ERR_UNREACHABLE, "unreachable", NULL,
                             "gradd at %s closed the connection before the whole request was sent", c->socket_path);
        }
        return rc;
    }
    if (e)
        return ctl_error(c, CTL_ERR_UNREACHABLE, "unreachable", NULL, "sending the request to %s failed: %s",
                         c->socket_path, strerror(e));
    return ctl_next(c, out);
}

/* ---- errors ---------------------------------------------------------------- */

static int verror(const ctl *c, int rc, const char *code, json_t *fields, const char *fmt, va_list ap)
{
    char *m = NULL;
    if (vasprintf(&m, fmt, ap) < 0)
        m = NULL;
    const char *msg = m ? m : "out of memory";
    if (c && c->cmd)
        fprintf(stderr, "gradctl %s: ", c->cmd->name);
    else
        fputs("gradctl: ", stderr);
    /* Messages quote job files' paths and names: made safe to print. */
    table_put_text(stderr, msg, strlen(msg), TABLE_TEXT_LINES);
    fputc('\n', stderr);
    if (c && c->json) {
        json_t *err = json_pack("{s:o, s:o}", "code", jout_str(code), "message", jout_str(msg));
        if (fields)
            json_object_update_new(err, fields);
        jout_print(json_pack("{s:o}", "error", err));
    } else if (fields) {
        json_decref(fields);
    }
    free(m);
    return rc;
}

int ctl_error(const ctl *c, int rc, const char *code, json_t *fields, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verror(c, rc, code, fields, fmt, ap);
    va_end(ap);
    return rc;
}

json_t *ctl_where_fields(const char *msg, const char *file)
{
    json_t *f = json_pack("{s:o}", "file", jout_str(file));
    size_t n = strlen(file);
    const char *p = msg + n;
    if (strncmp(msg, file, n) != 0 || *p != ':')
        return f;
    char *end;
    unsigned long line = strtoul(p + 1, &end, 10);
    if (end != p + 1 && *end == ':') {
        json_object_set_new(f, "line", jout_uint(line));
        p = end;
    }
    char section[64], key[64];
    if (sscanf(p, ": [%63[^]]] %63[^: ]:", section, key) == 2) {
        json_object_set_new(f, "section", jout_str(section));
        json_object_set_new(f, "key", jout_str(key));
    }
    return f;
}

const char *ctl_usage_line(const ctl *c, char *buf, size_t len)
{
    if (c && c->cmd)
        snprintf(buf, len, "gradctl [-s PATH] [--json] %s%s%s", c->cmd->name, *c->cmd->args ? " " : "",
                 c->cmd->args);
    else
        snprintf(buf, len, "gradctl [-s PATH] [--json] COMMAND [ARGS]");
    return buf;
}

int ctl_usage(const ctl *c, const char *fmt, ...)
{
    char line[512];
    ctl_usage_line(c, line, sizeof line);
    va_list ap;
    va_start(ap, fmt);
    verror(c, CTL_ERR_USAGE, "usage", json_pack("{s:o}", "usage", jout_str(line)), fmt, ap);
    va_end(ap);
    fprintf(stderr, "usage: %s\n", line);
    return CTL_ERR_USAGE;
}

/* ---- options ------------------------------------------------------------------ */

enum { OPT_JSON = 0x100, OPT_HELP = 'h' };

int ctl_getopt(ctl *c, int argc, char **argv, const char *shortopts, const struct option *longopts)
{
    struct option all[32];
    size_t n = 0;
    for (; longopts && longopts[n].name && n + 3 < sizeof all / sizeof *all; n++)
        all[n] = longopts[n];
    all[n++] = (struct option){"json", no_argument, NULL, OPT_JSON};
    all[n++] = (struct option){"help", no_argument, NULL, OPT_HELP};
    all[n] = (struct option){NULL, 0, NULL, 0};
    char opts[64];
    /* ':' first: a missing value is ':', told apart from an unknown '?';
     * getopt's own messages would name the binary's path. */
    snprintf(opts, sizeof opts, ":%sh", shortopts);
    opterr = 0;
    for (;;) {
        int prev = optind;
        int ch = getopt_long(argc, argv, opts, all, NULL);
        if (ch == OPT_JSON) {
            c->json = true;
            continue;
        }
        if (ch == OPT_HELP) {
            char line[512];
            printf("usage: %s\n  %s\n", ctl_usage_line(c, line, sizeof line), c->cmd->summary);
            fflush(stdout);
            exit(CTL_OK);
        }
        if (ch == ':')
            return ctl_usage(c, "%s needs a value", argv[optind - 1]), '?';
        if (ch == '?' && optopt >= '0' && optopt <= '9') {
            /* "-1" where a job id goes: a bad id, not an option. */
            int i = prev;
            while (i + 1 < argc && !(argv[i][0] == '-' && argv[i][1] >= '0' && argv[i][1] <= '9'))
                i++;
            return ctl_usage(c, "'%s' is not a job id (a number, as `gradctl list` shows)", argv[i]), '?';
        }
        if (ch == '?' && optopt)
            return ctl_usage(c, "unknown option '-%c'", optopt), '?';
        if (ch == '?')
            return ctl_usage(c, "unknown option '%s'", argv[optind - 1]), '?';
        return ch;
    }
}

int ctl_size_arg(const ctl *c, int argc, char **argv, uint64_t *bytes)
{
    if (optind != argc - 1)
        return ctl_usage(c, "expected one SIZE");
    char err[160];
    if (units_parse_size(argv[optind], bytes, err, sizeof err) != 0)
        return ctl_usage(c, "%s", err);
    return CTL_OK;
}
