#!/usr/bin/env python3
"""bench/llama/make_tokens.py PATH N V - N random token ids below V as a 1-d
little-endian int32 NumPy array (.npy, format 1.0): gradd's npy tokens, for
vocabularies past 16 bits.  Seeded, so every run trains on the same file;
the standard library only (the GPU machine's Python may lack NumPy)."""
import random
import struct
import sys

path, n, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(1337)
header = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }" % n
pad = 64 - (10 + len(header) + 1) % 64  # the data starts on a 64-byte boundary
header += " " * pad + "\n"
with open(path, "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1"))
    chunk = 1 << 16
    for i in range(0, n, chunk):
        m = min(chunk, n - i)
        f.write(struct.pack(f"<{m}i", *(rng.randrange(vocab) for _ in range(m))))
