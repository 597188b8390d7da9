#!/usr/bin/env python3
"""bench/train/make_tokens.py PATH [N] - N random GPT-2 token ids (default 4 Mi) in
llm.c's format: a header of 256 int32 (magic 20240520, version 1, count),
then uint16 tokens.  Seeded, so every run trains on the same file.  The GPU
benchmarks feed it to gradd and need nothing but the standard library."""
import random
import struct
import sys

path = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 4 << 20
rng = random.Random(1337)
with open(path, "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *(rng.randrange(50257) for _ in range(n))))
