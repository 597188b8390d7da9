"""gradd's output files read by the Python ecosystem's own readers.

write_outputs (tests/integration/write_outputs.c) writes a safetensors file
with known values and a TensorBoard event file with a loss curve through
daemon/io/safetensors.c and daemon/engine/tboard.c; this test loads them with
safetensors.numpy / safe_open and TensorBoard's EventAccumulator and checks
every value exactly.  In the other direction, files written by
safetensors.numpy.save_file are read by gradd's reader (write_outputs read).

Needs numpy, safetensors and tensorboard (scripts/pyenv.sh); without them,
or without WRITE_OUTPUTS (the helper's path), it exits 77: skipped.
"""
import glob
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import unittest

SKIP = 77
HELPER = os.environ.get("WRITE_OUTPUTS")
if not HELPER or not os.access(HELPER, os.X_OK):
    print("SKIP: WRITE_OUTPUTS does not name the write_outputs helper", file=sys.stderr)
    sys.exit(SKIP)
try:
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
except ImportError as e:  # pragma: no cover - depends on the python used
    print(f"SKIP: {sys.executable} lacks a test package ({e}); "
          "configure with -Dpython_venv=build/pyenv/bin/python (scripts/pyenv.sh)",
          file=sys.stderr)
    sys.exit(SKIP)


def expected_model():
    """The values write_outputs.c writes into model.safetensors."""
    f32 = (np.arange(12, dtype=np.float32) * np.float32(0.5) - np.float32(1)).reshape(3, 4)
    wte = np.array([np.float32(i % 7) / np.float32(8) - np.float32(i // 7) for i in range(32)],
                   dtype=np.float32).reshape(8, 4)
    return {
        "f32": f32,
        "f64": np.arange(5, dtype=np.float64) / 3.0,
        "f16": np.array([0x3C00, 0xC000, 0x3555, 0x7BFF], dtype=np.uint16)
                 .view(np.float16).reshape(2, 2),
        "i32": np.array([-2**31, -1, 0, 2**31 - 1], dtype=np.int32),
        "i64": np.array([-9007199254740993, 4611686018427387904], dtype=np.int64),
        "u8": np.array([0, 128, 255], dtype=np.uint8),
        "i8": np.array([-128, -1, 127], dtype=np.int8),
        "u16": np.array([1, 65535], dtype=np.uint16),
        "bool": np.array([[True, False], [False, True]]),
        "scalar": np.array(-2.5, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "wte.weight": wte,
        "h.0.attn.c_attn.weight": f32,
    }


EXPECTED_META = {"format": "pt", "step": "100",
                 "note": "quote \" backslash \\ newline \n ünïcødé 😀"}


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def same_bits(a, b):
    """Exact equality: dtype, shape and every byte (NaN-safe, -0 aware)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


class Outputs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="gradd-outputs-")
        cls.dir = cls.tmp.name
        r = subprocess.run([HELPER, "write", cls.dir], capture_output=True, text=True,
                           timeout=60)
        if r.returncode != 0:
            raise AssertionError(f"write_outputs failed: {r.stderr}")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    # ---- safetensors written by gradd --------------------------------------

    def test_model_values_exact(self):
        got = load_file(os.path.join(self.dir, "model.safetensors"))
        want = expected_model()
        self.assertEqual(set(got), set(want))
        for name, w in want.items():
            with self.subTest(tensor=name):
                self.assertTrue(same_bits(got[name], w),
                                f"{name}: got {got[name]!r}, want {w!r}")

    def test_model_metadata_and_header(self):
        path = os.path.join(self.dir, "model.safetensors")
        with safe_open(path, framework="numpy") as f:
            self.assertEqual(f.metadata(), EXPECTED_META)
            self.assertEqual(set(f.keys()), set(expected_model()))
            self.assertEqual(f.get_slice("scalar").get_shape(), [])
            self.assertEqual(f.get_slice("empty").get_shape(), [0, 3])
            self.assertEqual(f.get_slice("f16").get_dtype(), "F16")
        # The layout itself: 8-byte LE length, header padded to 8, tensors
        # contiguous in header order and aligned to their element size.
        raw = read_bytes(path)
        (n,) = struct.unpack("<Q", raw[:8])
        self.assertEqual((8 + n) % 8, 0)
        header = json.loads(raw[8:8 + n])
        pos = 0
        sizes = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "U16": 2,
                 "U8": 1, "I8": 1, "BOOL": 1}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            b, e = info["data_offsets"]
            self.assertEqual(b, pos, name)
            self.assertEqual(b % sizes[info["dtype"]], 0, name)
            pos = e
        self.assertEqual(8 + n + pos, len(raw))

    def test_bf16_file(self):
        path = os.path.join(self.dir, "bf16.safetensors")
        with safe_open(path, framework="numpy") as f:
            self.assertEqual(list(f.keys()), ["bf"])
            sl = f.get_slice("bf")
            self.assertEqual(sl.get_dtype(), "BF16")
            self.assertEqual(sl.get_shape(), [2, 3])
        raw = read_bytes(path)
        (n,) = struct.unpack("<Q", raw[:8])
        info = json.loads(raw[8:8 + n])["bf"]
        b, e = info["data_offsets"]
        bits = np.frombuffer(raw[8 + n + b:8 + n + e], dtype="<u2").astype(np.uint32) << 16
        values = bits.view(np.float32).reshape(2, 3)
        want = (np.arange(6, dtype=np.float32) / np.float32(4) - np.float32(2)).reshape(2, 3)
        self.assertTrue(np.array_equal(values, want), values)

    # ---- safetensors written by the Python library, read by gradd ----------

    def c_read(self, path):
        r = subprocess.run([HELPER, "read", path], capture_output=True, text=True, timeout=60)
        return r.returncode, [json.loads(l) for l in r.stdout.splitlines()], r.stderr

    def test_python_written_file_read_by_gradd(self):
        arrays = {
            "transformer.h.0.ln_1.weight": np.linspace(-1, 1, 7, dtype=np.float32),
            "a_f64": np.array([[np.pi, -0.0], [np.inf, 1e-300]], dtype=np.float64),
            "f16": np.array([1.5, -65504, 2 ** -24], dtype=np.float16),
            "ids": np.arange(-5, 5, dtype=np.int64).reshape(2, 5),
            "i32": np.array([7], dtype=np.int32),
            "u8": np.arange(9, dtype=np.uint8).reshape(3, 3),
            "flags": np.array([True, False, True]),
            "scalar": np.array(42, dtype=np.int16),
            "empty": np.zeros((2, 0), dtype=np.float32),
        }
        meta = {"step": "12", "rng": "0123456789abcdef", "ünï": "cødé"}
        path = os.path.join(self.dir, "from_python.safetensors")
        save_file(arrays, path, metadata=meta)
        rc, lines, err = self.c_read(path)
        self.assertEqual(rc, 0, err)
        got_meta = lines.pop()["metadata"]
        self.assertEqual(got_meta, meta)
        dt = {"float32": "F32", "float64": "F64", "float16": "F16", "int64": "I64",
              "int32": "I32", "uint8": "U8", "bool": "BOOL", "int16": "I16"}
        self.assertEqual({l["name"] for l in lines}, set(arrays))
        for l in lines:
            a = arrays[l["name"]]
            with self.subTest(tensor=l["name"]):
                self.assertEqual(l["dtype"], dt[str(a.dtype)])
                self.assertEqual(l["shape"], list(a.shape))
                self.assertEqual(l["hex"], a.astype(a.dtype.newbyteorder("<")).tobytes().hex())

    def test_gradd_refuses_damaged_python_file(self):
        path = os.path.join(self.dir, "damaged.safetensors")
        save_file({"w": np.ones((3, 4), dtype=np.float32)}, path)
        raw = bytearray(read_bytes(path))
        (n,) = struct.unpack("<Q", raw[:8])
        header = raw[8:8 + n].decode()
        cases = {
            "extra byte": (raw + b"\0", "the file has 49 data bytes after the header but its "
                                        "tensors cover 48"),
            "wrong offsets": (raw[:8] + header.replace("[0,48]", "[0,44]").encode() + raw[8 + n:],
                              "tensor 'w': data_offsets [0,44] do not match shape [3,4] of F32 "
                              "(48 bytes)"),
            "bad dtype": (raw[:8] + header.replace("F32", "X32").encode() + raw[8 + n:],
                          "tensor 'w': field 'dtype'"),
            "truncated": (raw[:-1], "lie beyond the end of the data"),
        }
        for what, (data, frag) in cases.items():
            with self.subTest(case=what):
                with open(path, "wb") as f:
                    f.write(data)
                rc, _, err = self.c_read(path)
                self.assertEqual(rc, 1)
                self.assertTrue(err.startswith(path + ": "), err)
                self.assertIn(frag, err)

    # ---- TensorBoard -------------------------------------------------------

    def event_files(self):
        files = glob.glob(os.path.join(self.dir, "tb", "*"))
        self.assertEqual(len(files), 1, files)
        return files[0]

    def test_event_file_name(self):
        name = os.path.basename(self.event_files())
        host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "localhost"
        m = re.fullmatch(r"events\.out\.tfevents\.(\d+)\.(.+)\.(\d+)\.gradd", name)
        self.assertIsNotNone(m, name)
        self.assertEqual(m.group(2), host)

    def test_event_accumulator_scalars(self):
        acc = event_accumulator.EventAccumulator(os.path.join(self.dir, "tb"))
        acc.Reload()
        self.assertEqual(acc.file_version, 2.0)
        self.assertEqual(sorted(acc.Tags()["scalars"]), ["train/loss", "train/lr"])
        loss = acc.Scalars("train/loss")
        self.assertEqual([e.step for e in loss], list(range(50)))
        want = [0.0 if s == 49 else float(np.float32((1000 - 7 * s) / 256)) for s in range(50)]
        self.assertEqual([e.value for e in loss], want)
        self.assertEqual([e.wall_time for e in loss], [1700000000.0 + s for s in range(50)])
        lr = acc.Scalars("train/lr")
        self.assertEqual([e.value for e in lr], [s / 1024 for s in range(50)])

    def test_records_framing_independently(self):
        """TFRecord framing and masked CRC32C checked byte by byte with
        TensorBoard's own (pure Python) crc, every record parsed by the
        official Event message."""
        raw = read_bytes(self.event_files())
        pos, events = 0, []
        while pos < len(raw):
            self.assertGreaterEqual(len(raw) - pos, 16)
            (n,) = struct.unpack_from("<Q", raw, pos)
            (lcrc,) = struct.unpack_from("<I", raw, pos + 8)
            self.assertEqual(lcrc, masked_crc32c(raw[pos:pos + 8]))
            data = raw[pos + 12:pos + 12 + n]
            (dcrc,) = struct.unpack_from("<I", raw, pos + 12 + n)
            self.assertEqual(dcrc, masked_crc32c(data))
            ev = event_pb2.Event()
            ev.ParseFromString(data)
            events.append(ev)
            pos += 16 + n
        self.assertEqual(pos, len(raw))
        self.assertEqual(len(events), 1 + 100)
        self.assertEqual(events[0].file_version, "brain.Event:2")
        last_loss = events[-2]
        self.assertEqual(last_loss.step, 49)
        self.assertTrue(last_loss.summary.value[0].HasField("simple_value"))
        self.assertEqual(last_loss.summary.value[0].simple_value, 0.0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
