/* wire.c — frame reader, envelope packing and blocking frame I/O. */
#include "wire.h"

#include "fileio.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *wire_status_str(wire_status s)
{
    switch (s) {
    case WIRE_OK: return "ok";
    case WIRE_NEED_MORE: return "incomplete frame";
    case WIRE_TOO_BIG: return "frame exceeds the size cap";
    case WIRE_BAD_BODY: return "frame body is not a valid message";
    case WIRE_NOMEM: return "out of memory";
    case WIRE_IO: return "connection failed or closed mid-frame";
    case WIRE_CLOSED: return "connection closed";
    }
    return "unknown wire status";
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* ---- reader ----------------------------------------------------------------- */

void wire_reader_init(wire_reader *r, size_t max_frame)
{
    memset(r, 0, sizeof *r);
    r->max_frame = max_frame ? max_frame : WIRE_MAX_FRAME_DEFAULT;
}

void wire_reader_free(wire_reader *r)
{
    free(r->buf);
    memset(r, 0, sizeof *r);
}

size_t wire_reader_pending(const wire_reader *r)
{
    return r->len - r->start;
}

/* Validate the header at `start` if it is complete.  Checking here, at feed
 * time, means the buffer never grows past one capped frame plus one read. */
static wire_status check_header(wire_reader *r)
{
    if (r->len - r->start < WIRE_HEADER_BYTES)
        return WIRE_OK;
    uint32_t n = be32(r->buf + r->start);
    if (n > r->max_frame)
        return WIRE_TOO_BIG;
    r->announced = n;
    return WIRE_OK;
}

wire_status wire_reader_feed(wire_reader *r, const void *data, size_t n)
{
    if (n == 0)
        return check_header(r);
    /* Drop consumed bytes before growing. */
    if (r->start > 0) {
        memmove(r->buf, r->buf + r->start, r->len - r->start);
        r->len -= r->start;
        r->start = 0;
    }
    if (r->len + n > r->cap) {
        size_t ncap = r->cap ? r->cap : 4096;
        while (ncap < r->len + n)
            ncap *= 2;
        uint8_t *nb = realloc(r->buf, ncap);
        if (!nb)
            return WIRE_NOMEM;
        r->buf = nb;
        r->cap = ncap;
    }
    memcpy(r->buf + r->len, data, n);
    r->len += n;
    return check_header(r);
}

wire_status wire_reader_next(wire_reader *r, const uint8_t **body, size_t *len)
{
    if (r->len - r->start < WIRE_HEADER_BYTES)
        return WIRE_NEED_MORE;
    wire_status st = check_header(r);
    if (st != WIRE_OK)
        return st;
    size_t need = WIRE_HEADER_BYTES + (size_t)r->announced;
    if (r->len - r->start < need)
        return WIRE_NEED_MORE;
    *body = r->buf + r->start + WIRE_HEADER_BYTES;
    *len = r->announced;
    r->start += need;
    return WIRE_OK;
}

/* ---- envelopes -------------------------------------------------------------- */

static uint8_t *frame(size_t body_len, size_t *len)
{
    if (body_len > UINT32_MAX)
        return NULL;
    uint8_t *buf = malloc(WIRE_HEADER_BYTES + body_len + 1);
    if (!buf)
        return NULL;
    put_be32(buf, (uint32_t)body_len);
    *len = WIRE_HEADER_BYTES + body_len;
    return buf;
}

uint8_t *wire_pack_request(const Gradd__Request *req, size_t *len)
{
    uint8_t *buf = frame(gradd__request__get_packed_size(req), len);
    if (buf)
        gradd__request__pack(req, buf + WIRE_HEADER_BYTES);
    return buf;
}

uint8_t *wire_pack_response(const Gradd__Response *resp, size_t *len)
{
    uint8_t *buf = frame(gradd__response__get_packed_size(resp), len);
    if (buf)
        gradd__response__pack(resp, buf + WIRE_HEADER_BYTES);
    return buf;
}

Gradd__Request *wire_unpack_request(const uint8_t *body, size_t len, char *err, size_t err_len)
{
    Gradd__Request *req = gradd__request__unpack(NULL, len, body);
    if (!req)
        snprintf(err, err_len, "request frame of %zu bytes is not a valid gradd.Request", len);
    return req;
}

Gradd__Response *wire_unpack_response(const uint8_t *body, size_t len, char *err, size_t err_len)
{
    Gradd__Response *resp = gradd__response__unpack(NULL, len, body);
    if (!resp)
        snprintf(err, err_len, "response frame of %zu bytes is not a valid gradd.Response", len);
    return resp;
}

bool wire_version_ok(const Gradd__Request *req, char *err, size_t err_len)
{
    if (req->version == WIRE_PROTOCOL_VERSION)
        return true;
    snprintf(err, err_len,
             "protocol version mismatch: the client speaks version %u, this daemon speaks version %u;"
             " use a gradctl from the same gradd release",
             req->version, WIRE_PROTOCOL_VERSION);
    return false;
}

void wire_error_response(Gradd__Response *resp, Gradd__Error *err,
                         Gradd__Error__Code code, const char *message)
{
    gradd__response__init(resp);
    gradd__error__init(err);
    resp->version = WIRE_PROTOCOL_VERSION;
    err->code = code;
    err->message = (char *)message;
    resp->body_case = GRADD__RESPONSE__BODY_ERROR;
    resp->error = err;
}

/* ---- blocking I/O ------------------------------------------------------------- */

wire_status wire_write_all(int fd, const void *buf, size_t len)
{
    return fileio_write_all(fd, buf, len) == 0 ? WIRE_OK : WIRE_IO;
}

/* Read exactly len bytes; WIRE_CLOSED if EOF comes before the first byte. */
static wire_status read_exact(int fd, uint8_t *p, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, p + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return WIRE_IO;
        if (n == 0)
            return got == 0 ? WIRE_CLOSED : WIRE_IO;
        got += (size_t)n;
    }
    return WIRE_OK;
}

wire_status wire_read_frame(int fd, size_t max_frame, uint8_t **body, size_t *len)
{
    uint8_t hdr[WIRE_HEADER_BYTES];
    wire_status st = read_exact(fd, hdr, sizeof hdr);
    if (st != WIRE_OK)
        return st;
    uint32_t n = be32(hdr);
    if (n > (max_frame ? max_frame : WIRE_MAX_FRAME_DEFAULT))
        return WIRE_TOO_BIG;
    uint8_t *b = malloc(n ? n : 1);
    if (!b)
        return WIRE_NOMEM;
    st = read_exact(fd, b, n);
    if (st != WIRE_OK) {
        free(b);
        return st == WIRE_CLOSED ? WIRE_IO : st;
    }
    *body = b;
    *len = n;
    return WIRE_OK;
}
