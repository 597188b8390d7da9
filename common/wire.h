/* wire.h — framing and envelopes of the control protocol, shared by gradd
 * and gradctl.
 *
 * A frame is a 4-byte big-endian length followed by one protobuf message
 * (gradd.Request or gradd.Response, see proto/gradd.proto).  The reader
 * below is incremental so the daemon can feed it whatever a non-blocking
 * read returned; it rejects an oversized frame as soon as its header is
 * seen, so a hostile length never makes anyone allocate.
 */
#ifndef GRADD_WIRE_H
#define GRADD_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gradd.pb-c.h"

#define WIRE_PROTOCOL_VERSION 1u
#define WIRE_HEADER_BYTES 4u
#define WIRE_MAX_FRAME_DEFAULT ((size_t)1 << 20)

typedef enum {
    WIRE_OK = 0,
    WIRE_NEED_MORE, /* no complete frame buffered yet */
    WIRE_TOO_BIG,   /* a header announced more than max_frame bytes */
    WIRE_BAD_BODY,  /* the body is not a valid message */
    WIRE_NOMEM,
    WIRE_IO,        /* read/write failed or the peer closed mid-frame */
    WIRE_CLOSED,    /* the peer closed cleanly between frames */
} wire_status;

const char *wire_status_str(wire_status s);

/* ---- incremental frame reader --------------------------------------------- */

typedef struct {
    uint8_t *buf;
    size_t start; /* first unconsumed byte */
    size_t len;   /* bytes buffered, from buf[0] */
    size_t cap;
    size_t max_frame;
    uint32_t announced; /* length of the frame at `start`, once its header is in */
} wire_reader;

void wire_reader_init(wire_reader *r, size_t max_frame);
void wire_reader_free(wire_reader *r);
/* Append received bytes.  Returns WIRE_TOO_BIG as soon as any buffered
 * header exceeds the cap; the reader is then unusable. */
wire_status wire_reader_feed(wire_reader *r, const void *data, size_t n);
/* Pop the next complete frame body.  The pointer stays valid until the next
 * feed or next call.  WIRE_NEED_MORE when none is complete. */
wire_status wire_reader_next(wire_reader *r, const uint8_t **body, size_t *len);
/* Bytes of a partial frame still buffered (for "closed mid-frame"). */
size_t wire_reader_pending(const wire_reader *r);

/* ---- envelopes ------------------------------------------------------------ */

/* Serialise into a malloc'd buffer that starts with the 4-byte header. */
uint8_t *wire_pack_request(const Gradd__Request *req, size_t *len);
uint8_t *wire_pack_response(const Gradd__Response *resp, size_t *len);

/* Decode a frame body.  NULL on failure, with a reason in err. */
Gradd__Request *wire_unpack_request(const uint8_t *body, size_t len, char *err, size_t err_len);
Gradd__Response *wire_unpack_response(const uint8_t *body, size_t len, char *err, size_t err_len);

/* Check the request's version; on mismatch write a message naming both. */
bool wire_version_ok(const Gradd__Request *req, char *err, size_t err_len);

/* Fill an Error response (resp and err are the caller's storage). */
void wire_error_response(Gradd__Response *resp, Gradd__Error *err,
                         Gradd__Error__Code code, const char *message);

/* ---- blocking helpers (gradctl, tests) ------------------------------------ */

wire_status wire_write_all(int fd, const void *buf, size_t len);
/* Read one whole frame body into a malloc'd buffer. */
wire_status wire_read_frame(int fd, size_t max_frame, uint8_t **body, size_t *len);

#endif
