/* test_wire.c — the frame reader and envelopes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "wire.h"

static uint8_t *status_frame(uint32_t version, size_t *len)
{
    Gradd__StatusRequest sr;
    gradd__status_request__init(&sr);
    Gradd__Request req;
    gradd__request__init(&req);
    req.version = version;
    req.body_case = GRADD__REQUEST__BODY_STATUS;
    req.status = &sr;
    return wire_pack_request(&req, len);
}

static void test_roundtrip_byte_by_byte(void **state)
{
    (void)state;
    size_t len;
    uint8_t *f = status_frame(WIRE_PROTOCOL_VERSION, &len);
    assert_non_null(f);
    /* Header is the big-endian body length. */
    assert_int_equal(len, 4 + ((size_t)f[0] << 24 | (size_t)f[1] << 16 | (size_t)f[2] << 8 | f[3]));
    wire_reader r;
    wire_reader_init(&r, 1024);
    const uint8_t *body;
    size_t blen;
    for (size_t i = 0; i < len; i++) {
        assert_int_equal(wire_reader_next(&r, &body, &blen), WIRE_NEED_MORE);
        assert_int_equal(wire_reader_feed(&r, f + i, 1), WIRE_OK);
    }
    assert_int_equal(wire_reader_next(&r, &body, &blen), WIRE_OK);
    char err[128];
    Gradd__Request *req = wire_unpack_request(body, blen, err, sizeof err);
    assert_non_null(req);
    assert_int_equal(req->version, WIRE_PROTOCOL_VERSION);
    assert_int_equal(req->body_case, GRADD__REQUEST__BODY_STATUS);
    assert_true(wire_version_ok(req, err, sizeof err));
    gradd__request__free_unpacked(req, NULL);
    assert_int_equal(wire_reader_next(&r, &body, &blen), WIRE_NEED_MORE);
    assert_int_equal(wire_reader_pending(&r), 0);
    wire_reader_free(&r);
    free(f);
}

static void test_several_frames_in_one_feed(void **state)
{
    (void)state;
    size_t l1, l2;
    uint8_t *a = status_frame(1, &l1), *b = status_frame(7, &l2);
    uint8_t buf[64];
    memcpy(buf, a, l1);
    memcpy(buf + l1, b, l2);
    wire_reader r;
    wire_reader_init(&r, 0);
    assert_int_equal(wire_reader_feed(&r, buf, l1 + l2 - 1), WIRE_OK);
    const uint8_t *body;
    size_t blen;
    char err[256];
    assert_int_equal(wire_reader_next(&r, &body, &blen), WIRE_OK);
    assert_int_equal(wire_reader_next(&r, &body, &blen), WIRE_NEED_MORE);
    assert_int_equal(wire_reader_pending(&r), l2 - 1);
    assert_int_equal(wire_reader_feed(&r, buf + l1 + l2 - 1, 1), WIRE_OK);
    assert_int_equal(wire_reader_next(&r, &body, &blen), WIRE_OK);
    Gradd__Request *req = wire_unpack_request(body, blen, err, sizeof err);
    assert_non_null(req);
    assert_int_equal(req->version, 7);
    /* The mismatch message names both versions. */
    assert_false(wire_version_ok(req, err, sizeof err));
    assert_non_null(strstr(err, "version 7"));
    assert_non_null(strstr(err, "version 1"));
    gradd__request__free_unpacked(req, NULL);
    wire_reader_free(&r);
    free(a);
    free(b);
}

static void test_oversized_header_rejected_before_body(void **state)
{
    (void)state;
    wire_reader r;
    wire_reader_init(&r, 100);
    const uint8_t hdr[4] = {0, 0, 0, 101};
    assert_int_equal(wire_reader_feed(&r, hdr, 3), WIRE_OK);
    assert_int_equal(wire_reader_feed(&r, hdr + 3, 1), WIRE_TOO_BIG);
    /* Exactly the cap is fine. */
    wire_reader r2;
    wire_reader_init(&r2, 100);
    const uint8_t ok[4] = {0, 0, 0, 100};
    assert_int_equal(wire_reader_feed(&r2, ok, 4), WIRE_OK);
    /* Garbage text reads as a huge length. */
    wire_reader r3;
    wire_reader_init(&r3, WIRE_MAX_FRAME_DEFAULT);
    assert_int_equal(wire_reader_feed(&r3, "GET / HTTP/1.1\r\n", 16), WIRE_TOO_BIG);
    wire_reader_free(&r);
    wire_reader_free(&r2);
    wire_reader_free(&r3);
}

static void test_bad_body(void **state)
{
    (void)state;
    char err[128];
    /* Field 1 as a length-delimited string with a length past the end. */
    const uint8_t junk[] = {0x0a, 0x7f, 0x01};
    assert_null(wire_unpack_request(junk, sizeof junk, err, sizeof err));
    assert_non_null(strstr(err, "not a valid gradd.Request"));
    /* An empty body is a valid Request with version 0 and no body. */
    Gradd__Request *req = wire_unpack_request((const uint8_t *)"", 0, err, sizeof err);
    assert_non_null(req);
    assert_int_equal(req->version, 0);
    assert_false(wire_version_ok(req, err, sizeof err));
    gradd__request__free_unpacked(req, NULL);
}

static void test_error_response(void **state)
{
    (void)state;
    Gradd__Response resp;
    Gradd__Error e;
    wire_error_response(&resp, &e, GRADD__ERROR__CODE__BAD_REQUEST, "nope");
    size_t len;
    uint8_t *f = wire_pack_response(&resp, &len);
    char err[128];
    Gradd__Response *back = wire_unpack_response(f + 4, len - 4, err, sizeof err);
    assert_non_null(back);
    assert_int_equal(back->body_case, GRADD__RESPONSE__BODY_ERROR);
    assert_string_equal(back->error->message, "nope");
    assert_int_equal(back->error->code, GRADD__ERROR__CODE__BAD_REQUEST);
    gradd__response__free_unpacked(back, NULL);
    free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_byte_by_byte),
        cmocka_unit_test(test_several_frames_in_one_feed),
        cmocka_unit_test(test_oversized_header_rejected_before_body),
        cmocka_unit_test(test_bad_body),
        cmocka_unit_test(test_error_response),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
