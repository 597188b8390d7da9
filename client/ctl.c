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
#include <sys/un.h>
#include <unistd.h>

#include "jout.h"
#include "table.h"
#include "units.h"

int ctl_connect(ctl *c)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(c->socket_path) >= sizeof sa.sun_path) {
        fprintf(stderr, "gradctl: socket path %s is too long\n", c->socket_path);
        return CTL_ERR_USAGE;
    }
    memcpy(sa.sun_path, c->socket_path, strlen(c->socket_path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        if (e == EACCES)
            /* The socket is there; this user is not in its group. */
            fprintf(stderr,
                    "gradctl: cannot reach gradd at %s: %s\n"
                    "  Its socket is for the members of gradd's socket group ([daemon] socket_group,\n"
                    "  'gradd' by default): an admin adds you with `usermod -aG gradd USER`,\n"
                    "  and the membership counts from your next login.\n",
                    c->socket_path, strerror(e));
        else
            fprintf(stderr,
                    "gradctl: cannot reach gradd at %s: %s\n"
                    "  Start it with `gradd -s %s` (or `systemctl start gradd`),\n"
                    "  or point gradctl at a running daemon with -s PATH or GRADD_SOCKET.\n",
                    c->socket_path, strerror(e), c->socket_path);
        return CTL_ERR_UNREACHABLE;
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

/* A daemon's error reply: said on stderr, and with --json as a JSON
 * object on stdout too, so that a script reading stdout sees why.  The exit
 * code it means. */
static int daemon_error(ctl *c, const Gradd__Error *e)
{
    /* The message can quote a job file's paths: made safe to print. */
    const char *m = e->message && *e->message ? e->message : "the daemon reported an error";
    fputs("gradctl: ", stderr);
    table_put_text(stderr, m, strlen(m), TABLE_TEXT_LINES);
    fputc('\n', stderr);
    if (c->json) {
        /* The code's name from the protocol's own enum, in lower case. */
        const ProtobufCEnumValue *ev =
            protobuf_c_enum_descriptor_get_value(&gradd__error__code__descriptor, (int)e->code);
        char code[32] = "unknown";
        if (ev)
            for (size_t i = 0; i + 1 < sizeof code; i++)
                if (!(code[i] = (char)tolower((unsigned char)ev->name[i])))
                    break;
        jout_print(json_pack("{s:{s:o, s:o}}", "error", "code", jout_str(code), "message", jout_str(m)));
    }
    /* A job file refused by the daemon is a bad input file, as one refused
     * here is. */
    return e->code == GRADD__ERROR__CODE__BAD_JOB ? CTL_ERR_USAGE : CTL_ERR_DAEMON;
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
        fprintf(stderr, "gradctl: reading the reply from %s: %s (its log may say why)\n", c->socket_path, why);
        return CTL_ERR_UNREACHABLE;
    }
    char err[256];
    Gradd__Response *resp = wire_unpack_response(body, len, err, sizeof err);
    free(body);
    if (!resp) {
        fprintf(stderr, "gradctl: %s\n", err);
        return CTL_ERR_DAEMON;
    }
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
    fprintf(stderr, "gradctl: unexpected reply to %s\n", c->what);
    ctl_free(resp);
    return CTL_ERR_DAEMON;
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
    if (!buf) {
        fprintf(stderr, "gradctl: out of memory\n");
        return CTL_ERR_DAEMON;
    }
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
            fprintf(stderr, "gradctl: gradd at %s closed the connection before the whole request was sent\n",
                    c->socket_path);
            return CTL_ERR_UNREACHABLE;
        }
        return rc;
    }
    if (e) {
        fprintf(stderr, "gradctl: sending the request to %s failed: %s\n", c->socket_path, strerror(e));
        return CTL_ERR_UNREACHABLE;
    }
    return ctl_next(c, out);
}

int ctl_usage(const ctl *c, const char *fmt, ...)
{
    const ctl_cmd *cmd = c->cmd;
    va_list ap;
    fprintf(stderr, "gradctl %s: ", cmd->name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nusage: gradctl [-s PATH] [--json] %s %s\n", cmd->name, cmd->args);
    return CTL_ERR_USAGE;
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
