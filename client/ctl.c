/* ctl.c — the client side of the control protocol. */
#include "ctl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

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

int ctl_recv(ctl *c, Gradd__Response **out)
{
    *out = NULL;
    uint8_t *body = NULL;
    size_t len = 0;
    wire_status ws = wire_read_frame(c->fd, WIRE_MAX_FRAME_DEFAULT * 16, &body, &len);
    if (ws != WIRE_OK) {
        fprintf(stderr, "gradctl: reading the reply from %s: %s\n", c->socket_path,
                ws == WIRE_CLOSED ? "the daemon closed the connection" : wire_status_str(ws));
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
        fprintf(stderr, "gradctl: %s\n", resp->error->message && *resp->error->message ? resp->error->message
                                                                                        : "the daemon reported an error");
        gradd__response__free_unpacked(resp, NULL);
        return CTL_ERR_DAEMON;
    }
    *out = resp;
    return CTL_OK;
}

int ctl_call(ctl *c, Gradd__Request *req, Gradd__Response **out)
{
    *out = NULL;
    if (c->fd < 0) {
        int rc = ctl_connect(c);
        if (rc != CTL_OK)
            return rc;
    }
    req->version = WIRE_PROTOCOL_VERSION;
    size_t len;
    uint8_t *buf = wire_pack_request(req, &len);
    if (!buf) {
        fprintf(stderr, "gradctl: out of memory\n");
        return CTL_ERR_DAEMON;
    }
    wire_status ws = wire_write_all(c->fd, buf, len);
    free(buf);
    if (ws != WIRE_OK) {
        fprintf(stderr, "gradctl: sending the request to %s failed: %s\n", c->socket_path, strerror(errno));
        return CTL_ERR_UNREACHABLE;
    }
    return ctl_recv(c, out);
}

int ctl_usage(const ctl_cmd *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "gradctl %s: ", cmd->name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nusage: gradctl [-s PATH] [--json] %s %s\n", cmd->name, cmd->args);
    return CTL_ERR_USAGE;
}
