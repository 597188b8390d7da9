#!/usr/bin/env python3
"""Write the seed inputs for tests/fuzz/fuzz_data.c into this directory.

Each seed is: byte 0 mode/flags, byte 1 parameter (T = 1 + p % 32), bytes 2-3
the little-endian split of the payload into images/labels (mode 3), then the
payload.  See fuzz_data.c for the modes.  The generated files are committed;
rerun this after changing the harness's input layout.
"""
import gzip
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def seed(name, mode, param, payload, split=0):
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(bytes([mode, param]) + struct.pack("<H", split) + payload)


def llmc(tokens, count=None, magic=20240520, version=1):
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = magic, version, len(tokens) if count is None else count
    return struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(tokens), *tokens)


def npy(descr, shape, data, major=1):
    d = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    pre = 10 if major == 1 else 12
    hl = len(d) + 1
    hl += (64 - (pre + hl) % 64) % 64
    head = b"\x93NUMPY" + bytes([major, 0])
    head += struct.pack("<H" if major == 1 else "<I", hl)
    return head + d.ljust(hl - 1).encode() + b"\n" + data


def idx_images(n, r, c):
    return struct.pack(">IIII", 0x803, n, r, c) + bytes((i * 7) & 255 for i in range(n * r * c))


def idx_labels(n):
    return struct.pack(">II", 0x801, n) + bytes(i % 10 for i in range(n))


text = b"Q: How many engineers does it take?\nA: Just one, with a seed.\n%\n" * 3
toks = [(i * 37) % 50257 for i in range(100)]

seed("llmc", 0, 7, llmc(toks))
seed("llmc_vocab", 0x20, 3, llmc(toks))
seed("llmc_short", 0, 7, llmc(toks, count=120))
seed("npy_u2", 1, 7, npy("<u2", "(100,)", struct.pack("<100H", *toks)))
seed("npy_i4_v2", 1, 4, npy("<i4", "(100,)", struct.pack("<100i", *toks), major=2))
seed("npy_u1", 1, 15, npy("|u1", "(%d,)" % len(text), text))
seed("text", 2, 15, text)
seed("auto_llmc", 2, 3, llmc(toks))

im, lb = idx_images(5, 4, 3), idx_labels(5)
seed("idx", 3, 0, im + lb, split=len(im))
seed("idx_strict", 3 | 0x20, 0, im + lb, split=len(im))
seed("idx_wrapgz", 3 | 0x08 | 0x10, 0, im + lb, split=len(im))
gi, gl = gzip.compress(im, mtime=0), gzip.compress(lb, mtime=0)
seed("idx_rawgz", 3, 0, gi + gl, split=len(gi))
xf = struct.pack("<12f", *[i / 12 for i in range(12)])
yl = struct.pack("<3i", 0, 2, 1)
xi, yi = npy("<f4", "(3, 4)", xf), npy("<i4", "(3,)", yl)
seed("npy_images", 3, 0, xi + yi, split=len(xi))
xu = npy("|u1", "(3, 2, 2)", bytes(range(12)))
seed("npy_u8_idx_labels", 3 | 0x20, 0, xu + idx_labels(3), split=len(xu))
seed("npy_generic", 4, 0, npy("<f4", "(2, 3, 1)", struct.pack("<6f", *range(6))))
