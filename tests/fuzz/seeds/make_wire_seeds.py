#!/usr/bin/env python3
"""Write the seed corpus for fuzz_wire into seeds/wire/.

Protobuf is encoded by hand (no protobuf package needed) following
proto/gradd.proto.  Each seed has fuzz_wire.c's input layout:

    byte 0     flags: bit 0 -> max_frame 4096 (else the 1 MiB default),
               bits 1-3 -> K, the number of chunk lengths that follow
    K bytes    chunk lengths for the incremental feeds
    rest       the byte stream (4-byte big-endian length + message, repeated)

Run it from anywhere: python3 tests/fuzz/seeds/make_wire_seeds.py
"""
import os
import struct
import sys

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wire")


# The encoder gradd's own Python package speaks to the daemon with.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "python"))
from gradd._client import _varint as varint  # noqa: E402


def key(field, wtype):
    return varint(field << 3 | wtype)


def f_varint(field, n):
    return key(field, 0) + varint(n)


def f_bytes(field, b):
    if isinstance(b, str):
        b = b.encode()
    return key(field, 2) + varint(len(b)) + b


def f_double(field, x):
    return key(field, 1) + struct.pack("<d", x)


def frame(body, announce=None):
    n = len(body) if announce is None else announce
    return struct.pack(">I", n) + body


def seed(stream, small_cap=False, chunks=()):
    assert len(chunks) <= 7 and all(0 <= c <= 255 for c in chunks)
    flags = (1 if small_cap else 0) | len(chunks) << 1
    return bytes([flags]) + bytes(chunks) + stream


# ---- requests (gradd.Request) ------------------------------------------------
def request(version=1, body=b""):
    return f_varint(1, version) + body


status_req = request(1, f_bytes(10, b""))
stats_req = request(1, f_bytes(11, f_bytes(1, "cpu0") + f_varint(2, 1)))
trim_req = request(1, f_bytes(12, f_bytes(1, "cpu0")))
timeline_req = request(1, f_bytes(13, f_bytes(1, "cuda1")))
pressure_req = request(1, f_bytes(14, f_bytes(1, "cpu0") + f_varint(2, 512 << 20)))
old_version_req = request(2, f_bytes(10, b""))
submit_req = request(1, f_bytes(20, f_bytes(1, "/home/u/job.cfg") +
                                  f_bytes(2, "[model]\ntype = gpt\n") + f_varint(4, 1) + f_varint(5, 3)))
sample_req = request(1, f_bytes(27, f_varint(1, 1) + f_bytes(2, "Q: ") + f_varint(3, 50) +
                                  f_varint(4, 1) + f_double(5, 0.8) + f_varint(6, 1) + f_varint(7, 42)))
hang_req = request(1, f_bytes(16, f_bytes(1, "cpu0") + f_varint(2, 1)))
report_req = request(1, f_bytes(29, f_varint(1, 3) + f_varint(2, 8) + f_varint(3, 4) + f_varint(4, 120) +
                                  f_varint(5, 16) + f_varint(6, 8) + f_bytes(7, "oom") + f_varint(8, 1) +
                                  f_double(9, 2.5)))

# ---- responses (gradd.Response) ----------------------------------------------
error_resp = f_varint(1, 1) + f_bytes(9, f_varint(1, 1) + f_bytes(2, "protocol version mismatch"))
device = (f_bytes(1, "cpu0") + f_bytes(2, "cpu (sim)") + f_bytes(3, "cpu") +
          f_varint(4, 4 << 30) + f_varint(5, 3 << 30) + f_varint(6, 1 << 30) +
          f_varint(7, 900 << 20) + f_double(8, 0.03))
status_resp = f_varint(1, 1) + f_bytes(10, f_bytes(1, "0.1.0") + f_varint(2, 1) +
                                       f_varint(3, 4242) + f_double(4, 12.5) +
                                       f_bytes(5, device) + f_varint(7, 1000))
stat = f_varint(1, 100) + f_varint(2, 200) + f_varint(3, 300) + f_varint(4, 200)
pool_stat = f_bytes(1, stat) + f_bytes(2, stat) + f_bytes(3, stat)
job = f_varint(1, 7) + f_varint(2, 1 << 20) + f_bytes(5, f_bytes(1, "params") + f_varint(2, 4096))
pool_stats = (f_bytes(1, "cpu0") + f_varint(2, 4 << 30) + f_varint(5, 1) +
              f_bytes(10, pool_stat) + f_bytes(16, pool_stat) + f_varint(24, 2) +
              f_double(29, 0.25) + f_bytes(30, f_bytes(1, "grads") + f_varint(3, 9)) +
              f_bytes(31, job) + f_varint(33, 5))
stats_resp = f_varint(1, 1) + f_bytes(11, f_bytes(1, pool_stats))
timeline_resp = f_varint(1, 1) + f_bytes(13, f_bytes(1, "cpu0") + f_bytes(2, b'{"traceEvents":[') +
                                         f_varint(3, 1) + f_varint(4, 3))

SEEDS = {
    "status_v1": seed(frame(status_req)),
    "status_v1_split_header": seed(frame(status_req), small_cap=True, chunks=(1, 2, 1, 0, 3)),
    "stats_cpu0": seed(frame(stats_req)),
    "status_then_stats": seed(frame(status_req) + frame(stats_req), chunks=(2, 7, 5)),
    "trim_timeline_pressure": seed(frame(trim_req) + frame(timeline_req) + frame(pressure_req),
                                   small_cap=True, chunks=(3, 3, 9, 1)),
    "version_2": seed(frame(old_version_req)),
    "empty_frame": seed(frame(b"") + frame(status_req)),
    # A header over the small cap (4096), then bytes that never matter.
    "over_small_cap": seed(frame(b"\x08\x01" * 8, announce=5000), small_cap=True, chunks=(2,)),
    # A header over the default 1 MiB cap.
    "over_default_cap": seed(struct.pack(">I", (1 << 20) + 1) + status_req),
    # A good frame, then an oversized one.
    "good_then_over_cap": seed(frame(status_req) + struct.pack(">I", 0xFFFFFFFF), small_cap=True),
    # The header promises 10 bytes, only 4 arrive.
    "truncated_body": seed(frame(status_req, announce=10)),
    "truncated_header": seed(b"\x00\x00", chunks=(1,)),
    "error_response": seed(frame(error_resp)),
    # Unknown fields, one with an over-long key that decodes to field 0
    # (protobuf-c accepts it; see has_unknown_tag0 in fuzz_wire.c).
    "unknown_fields": seed(frame(status_req + f_varint(99, 5) + f_bytes(100, "x") + b"\x80\x00\x00")),
    "status_response": seed(frame(status_resp), chunks=(4, 17, 30)),
    "stats_response": seed(frame(stats_resp), small_cap=True),
    "timeline_response": seed(frame(timeline_resp)),
    "submit_sample_hang": seed(frame(submit_req) + frame(sample_req) + frame(hang_req), chunks=(5, 40, 11)),
    "sample_response": seed(frame(f_varint(1, 1) + f_bytes(27, f_bytes(1, "abc") + f_bytes(2, b"\x61\x62\x63") +
                                                              f_bytes(3, "/r/model.safetensors") + f_varint(4, 600) +
                                                              f_varint(5, 256) + f_varint(6, 42) +
                                                              f_double(7, 2.0)))),
    "report_then_ack": seed(frame(report_req) + frame(f_varint(1, 1) + f_bytes(29, b"")), chunks=(6, 30)),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(SEEDS)} seeds to {OUT}")


if __name__ == "__main__":
    main()
