"""Start a real gradd on a temporary socket and drive it with the real gradctl.

Every integration test imports this.  The daemon gets its own temporary
directory (socket, state dir, config) and is stopped with SIGTERM at the end,
so tests can run in parallel and leave nothing behind.
"""
import json
from array import array
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import unittest

GRADD = os.environ.get("GRADD_BIN", "gradd")
GRADCTL = os.environ.get("GRADCTL_BIN", "gradctl")
PROTOCOL_VERSION = 1
# Under ASan its quarantine keeps freed memory on purpose: bounds on the
# daemon's RSS are for a plain build, the behaviour is checked in both.
SANITIZED = os.environ.get("GRADD_SANITIZE", "none") not in ("", "none")


def program_env():
    """[program] env words that a Python program job needs to run under
    this build: a sanitized libgradd-alloc, which gradd's shim loads at
    `import torch`, goes into an uninstrumented python only behind its
    runtime (tests/python does the same).  "" for a plain build."""
    if not SANITIZED:
        return ""
    thread = os.environ.get("GRADD_SANITIZE") == "thread"
    lib = subprocess.run(["cc", "-print-file-name=%s" % ("libtsan.so" if thread else "libasan.so")],
                         capture_output=True, text=True).stdout.strip()
    if not thread:
        return "LD_PRELOAD=%s ASAN_OPTIONS=detect_leaks=0" % lib
    # One env word: the sanitizers also take ':' between options.
    opts = ":".join(os.environ.get("TSAN_OPTIONS", "").split())
    return "LD_PRELOAD=%s" % lib + (" TSAN_OPTIONS=%s" % opts if opts else "")


class Daemon:
    def __init__(self, conf="", args=(), test_hooks=False, env=None):
        self.dir = tempfile.mkdtemp(prefix="gradd-it-")
        self.sock = os.path.join(self.dir, "gradd.sock")
        self.conf = os.path.join(self.dir, "gradd.conf")
        with open(self.conf, "w") as f:
            f.write(conf)
        self.log_path = os.path.join(self.dir, "gradd.log")
        self.log = open(self.log_path, "w")
        cmd = [GRADD, "-c", self.conf, "-s", self.sock, "--state-dir", os.path.join(self.dir, "state")]
        if test_hooks:
            cmd.append("--test-hooks")
        cmd += list(args)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.wait_ready()

    def wait_ready(self, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("gradd exited with %d:\n%s" % (self.proc.returncode, self.read_log()))
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                try:
                    s.connect(self.sock)
                    return
                except OSError:
                    pass
            time.sleep(0.02)
        raise AssertionError("gradd did not listen on %s:\n%s" % (self.sock, self.read_log()))

    def read_log(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def ctl(self, *args, check=True, env=None):
        """Run gradctl against this daemon; returns CompletedProcess."""
        cmd = [GRADCTL, "-s", self.sock] + list(args)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
        if check and r.returncode != 0:
            raise AssertionError("%s -> %d\nstdout: %s\nstderr: %s\nlog:\n%s"
                                 % (" ".join(cmd), r.returncode, r.stdout, r.stderr, self.read_log()))
        return r

    def ctl_json(self, *args):
        return json.loads(self.ctl("--json", *args).stdout)

    def rss_kb(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("gradd ignored %s:\n%s" % (sig, self.read_log()))
        self.log.close()
        return self.proc.returncode

    def cleanup(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if not self.log.closed:
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def f32_tensors(path):
    """{name: (shape, little-endian float32 bytes)} of a safetensors file
    of F32 tensors (u64 header length, JSON header, data), read directly
    so that a test needs no safetensors package."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", (name, t["dtype"])
        a, b = t["data_offsets"]
        out[name] = (t["shape"], raw[base + a:base + b])
    return out


def max_weight_diff(a_path, b_path):
    """The largest absolute difference between two F32 safetensors files of
    the same tensors: how far apart two runs' weights ended."""
    a, b = f32_tensors(a_path), f32_tensors(b_path)
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    worst = 0.0
    for name in a:
        x, y = array("f"), array("f")
        x.frombytes(a[name][1])
        y.frombytes(b[name][1])
        worst = max(worst, max((abs(p - q) for p, q in zip(x, y)), default=0.0))
    return worst


def read_json(path):
    """The JSON document in the file at path (closed again at once)."""
    with open(path) as f:
        return json.load(f)


def read_jsonl(path):
    """Each line of the JSON Lines file at path, parsed."""
    with open(path) as f:
        return [json.loads(line) for line in f]


def write_corpus(path):
    """The text the job tests train on: 300 short lines, 13 of them distinct,
    enough windows for a small GPT's batches and a held-out tenth."""
    with open(path, "w") as f:
        for i in range(300):
            f.write("the quick brown fox %d jumps over the lazy dog.\n" % (i % 13))


def scratch_corpus(test, prefix):
    """A directory for one test's job files and outputs, readable by the
    users jobs run as and removed after the test (after DaemonTest's
    tearDown), holding write_corpus's text.  Returns (dir, corpus path)."""
    d = tempfile.mkdtemp(prefix=prefix)
    test.addCleanup(shutil.rmtree, d, ignore_errors=True)
    os.chmod(d, 0o755)
    corpus = os.path.join(d, "corpus.txt")
    write_corpus(corpus)
    return d, corpus


def write_job(path, sections):
    """Write a job file from {"section": {"key": value}}, in that order."""
    with open(path, "w") as f:
        for name, keys in sections.items():
            f.write("[%s]\n" % name)
            f.writelines("%s = %s\n" % kv for kv in keys.items())
    os.chmod(path, 0o644)


def wait_job(d, jid, states, timeout=60):
    """Poll `gradctl status ID` until the job is in one of states; its JSON."""
    deadline = time.time() + timeout
    while True:
        j = d.ctl_json("status", str(jid))
        if j["state"] in states or time.time() > deadline:
            break
        time.sleep(0.02)
    if j["state"] not in states:
        raise AssertionError("job %d not %s within %ds: %s" % (jid, "/".join(states), timeout, j))
    return j


# ---- hand-made protobuf, for speaking to the daemon without gradctl --------

def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(num, value):
    return varint(num << 3) + varint(value)


def field_bytes(num, data):
    return varint(num << 3 | 2) + varint(len(data)) + data


def status_request(version=PROTOCOL_VERSION):
    """gradd.Request{version, status: {}}"""
    return field_varint(1, version) + field_bytes(10, b"")


def frame(body):
    return struct.pack(">I", len(body)) + body


def connect(path, timeout=10):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    return s


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def recv_frame(s):
    """One response body, or None if the daemon closed the connection."""
    hdr = recv_exact(s, 4)
    if hdr is None:
        return None
    (n,) = struct.unpack(">I", hdr)
    return recv_exact(s, n)


def parse_fields(body):
    """Top-level protobuf fields as {num: [value, ...]} (varints and bytes)."""
    out, i = {}, 0
    while i < len(body):
        key, i = _read_varint(body, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _read_varint(body, i)
        elif wt == 2:
            n, i = _read_varint(body, i)
            v, i = body[i:i + n], i + n
        elif wt == 1:
            v, i = body[i:i + 8], i + 8
        elif wt == 5:
            v, i = body[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wt)
        out.setdefault(num, []).append(v)
    return out


def _read_varint(b, i):
    shift = v = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return v, i


def error_message(body):
    """The message of an Error response, or None if body is not one."""
    f = parse_fields(body)
    if 9 not in f:
        return None
    return parse_fields(f[9][0]).get(2, [b""])[0].decode()


class DaemonTest(unittest.TestCase):
    conf = "[daemon]\nclient_timeout = 60s\n"
    test_hooks = False

    def setUp(self):
        self.d = Daemon(self.conf, test_hooks=self.test_hooks)

    def tearDown(self):
        # A clean SIGTERM exit is part of every test: under the sanitizers
        # this is also where LeakSanitizer reports.
        code = self.d.stop()
        log = self.d.read_log()
        self.d.cleanup()
        self.assertEqual(code, 0, "gradd exited %d:\n%s" % (code, log))


def main():
    unittest.main(verbosity=2)
