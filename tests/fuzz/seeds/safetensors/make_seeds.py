#!/usr/bin/env python3
"""Generate the seed corpus for tests/fuzz/fuzz_safetensors.c (stdlib only).

Run from anywhere; writes the seed files next to this script.  The files are
committed; rerun after changing what the seeds should cover.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "U16": 2, "I16": 2,
         "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8}


def build(tensors, metadata=None, pad=True, raw_header=None, extra=b""):
    """tensors: list of (name, dtype, shape); data is a byte pattern."""
    header, data, off = {}, b"", 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        n = SIZES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        data += bytes((off + i) * 37 % 251 for i in range(n))
        off += n
    h = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":"),
                                                            ensure_ascii=False).encode()
    if pad:
        h += b" " * (-(8 + len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + data + extra


SEEDS = {
    "empty-header": build([]),
    "scalar": build([("s", "F32", [])]),
    "all-dtypes": build([(f"t.{d}", d, [2, 3]) for d in SIZES], metadata={"format": "pt"}),
    "gpt2-names": build([("wte.weight", "F32", [16, 4]), ("wpe.weight", "F32", [8, 4]),
                         ("h.0.ln_1.weight", "F32", [4]), ("h.0.attn.c_attn.weight", "BF16", [4, 12]),
                         ("h.0.attn.bias", "BOOL", [1, 1, 8, 8])],
                        metadata={"step": "100", "rng": "0x1234abcd", "data_pos": "4096"}),
    "empty-tensors": build([("e0", "F32", [0]), ("a", "I64", [2]), ("e1", "F16", [3, 0, 2])]),
    "escapes": build([], raw_header=b'{"__metadata__":{"k\\n\\"":"\\u00e9\\ud83d\\ude00\\/\\t"},'
                                    b'"x\\u0041":{"shape":[1],"dtype":"U8","data_offsets":[0,1]}}',
                     extra=b"\x07"),
    "whitespace": build([], raw_header=b' {\n "a" : { "dtype" : "I32" , "shape" : [ 1 ] ,'
                                        b' "data_offsets" : [ 0 , 4 ] } }\t\r\n', extra=b"abcd"),
    "unpadded-reordered": build([], pad=False,
                                raw_header=b'{"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},'
                                           b'"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
                                extra=b"\1\2\3\4\5\6"),
    "eight-dims": build([("d8", "I16", [1, 2, 1, 2, 1, 2, 1, 2])]),
    "bad-overlap": build([], raw_header=b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                                        b'"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}',
                         extra=bytes(12)),
    "bad-mismatch": build([], raw_header=b'{"w":{"dtype":"F32","shape":[3,4],"data_offsets":[0,100]}}',
                          extra=bytes(100)),
    "bad-dup": build([], raw_header=b'{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                    b'"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}',
                     extra=b"xy"),
}

for name, data in SEEDS.items():
    with open(os.path.join(HERE, name + ".safetensors"), "wb") as f:
        f.write(data)
print(f"wrote {len(SEEDS)} seeds to {HERE}")
