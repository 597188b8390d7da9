"""A user's data against the daemon's host memory: a sparse file that is
huge on paper and a gzip'd IDX file whose header declares far more than
the file holds each fail their job, before anything is allocated, with a
message naming the file and [daemon] max_job_data, while the daemon's RSS
stays bounded; a normal job shows the bytes its data holds, exactly, in
`gradctl status`, `list --json` and the metrics."""
import gzip
import os
import shutil
import struct
import tempfile
import threading
import time
import unittest

import harness
from harness import Daemon

LIMIT_MB = 64
KEY = "[daemon] max_job_data = 64.0M"
# What the daemon may grow by while it refuses: nothing near the limit, let
# alone the file (2 GiB, or 1.5 GB inflated).  Before the bound, the sparse
# file took it to 6.9 GB.
GROWTH_BOUND_KB = 32 * 1024
FASHION = "/usr/share/datasets/fashion-mnist"

GPT = """
[job]
name = {name}
[model]
type = gpt
layers = 1
heads = 1
width = 16
context = 32
vocab = 256
[data]
format = text
train = {train}
[train]
steps = 2
batch = 2
micro_batch = 2
threads = 1
[output]
dir = {out}
"""

MLP = """
[job]
name = {name}
[model]
type = mlp
hidden = 8
[data]
format = idx
train = {images}
train_labels = {labels}
{val}
[train]
steps = 1000000
batch = 4
micro_batch = 4
threads = 1
eval_every = 0
[output]
dir = {out}
checkpoint_every = 0
"""


def status_kb(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class RssWatch:
    """The most VmRSS seen, polled every 5 ms until stopped."""

    def __init__(self, pid):
        self.pid = pid
        self.most = status_kb(pid, "VmRSS")
        self.done = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.done.wait(0.005):
            self.most = max(self.most, status_kb(self.pid, "VmRSS"))

    def stop(self):
        self.done.set()
        self.t.join()
        return self.most


class HostileData(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gradd-hostile-data-")
        os.chmod(self.dir, 0o755)
        self.d = Daemon("[daemon]\nmax_jobs_per_device = 1\nmax_job_data = %dM\n" % LIMIT_MB)

    def tearDown(self):
        code = self.d.stop()
        log = self.d.read_log()
        self.d.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.assertEqual(code, 0, "gradd exited %d:\n%s" % (code, log))

    def path(self, name):
        return os.path.join(self.dir, name)

    def submit(self, name, text):
        cfg = self.path(name + ".cfg")
        with open(cfg, "w") as f:
            f.write(text)
        r = self.d.ctl("submit", cfg)
        self.assertRegex(r.stdout, r"^job \d+ queued \(")
        return int(r.stdout.split()[1])

    def wait(self, jid, pred, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            j = self.d.ctl_json("status", str(jid))
            if pred(j):
                return j
            if j["state"] not in ("queued", "running"):
                self.fail("job %d ended %s: %s" % (jid, j["state"], j["reason"]))
            time.sleep(0.02)
        self.fail("job %d: still %s" % (jid, self.d.ctl_json("status", str(jid))))

    def refused(self, jid, path, needs):
        """The job fails naming the file, what it needed and the key, and
        the daemon's RSS stays within GROWTH_BOUND_KB of where it was."""
        pid = self.d.proc.pid
        hwm0 = status_kb(pid, "VmHWM")
        watch = RssWatch(pid)
        deadline = time.time() + 60
        while True:
            j = self.d.ctl_json("status", str(jid))
            if j["state"] not in ("queued", "running") or time.time() > deadline:
                break
            time.sleep(0.02)
        most = watch.stop()
        self.assertEqual(j["state"], "failed", j)
        reason = j["reason"]
        self.assertTrue(reason.startswith(path + ": "), reason)
        self.assertIn(needs, reason)
        self.assertIn("(%s)" % KEY, reason)
        self.assertEqual(j["data_bytes"], 0)
        # VmHWM is the peak over the daemon's life: it rose by no more than
        # the bound, even between two polls.
        self.assertLess(status_kb(pid, "VmHWM") - hwm0, GROWTH_BOUND_KB,
                        "peak RSS grew from %d KiB to %d KiB" % (hwm0, status_kb(pid, "VmHWM")))
        self.assertLess(most - hwm0, GROWTH_BOUND_KB)

    def test_sparse_text_refused(self):
        # 2 GiB on paper, nothing on disk.
        big = self.path("f.txt")
        with open(big, "wb") as f:
            f.truncate(2 << 30)
        jid = self.submit("sparse", GPT.format(name="sparse", train=big, out=self.path("out-sparse")))
        self.refused(jid, big, "(%d bytes)" % (2 << 30))

    def test_gzip_idx_bomb_refused(self):
        # 200000 images of 28×28 zeros: 157 MB inflated from 152 KiB.
        n = 200000
        bomb = self.path("bomb-idx3-ubyte.gz")
        zeros = bytes(784 * 1000)
        with gzip.open(bomb, "wb", compresslevel=9) as g:
            g.write(struct.pack(">IIII", 0x803, n, 28, 28))
            for _ in range(n // 1000):
                g.write(zeros)
        self.assertLess(os.path.getsize(bomb), 200 << 10)
        labels = self.path("labels-idx1-ubyte")
        with open(labels, "wb") as f:
            f.write(struct.pack(">II", 0x801, 10) + bytes(range(10)))
        jid = self.submit("bomb", MLP.format(name="bomb", images=bomb, labels=labels, val="",
                                             out=self.path("out-bomb")))
        self.refused(jid, bomb, "(%d bytes)" % (n * 784))

    @unittest.skipUnless(os.path.isdir(FASHION), FASHION + " is absent (Debian's dataset-fashion-mnist)")
    def test_fashion_data_bytes(self):
        val = ("val = %s/t10k-images-idx3-ubyte.gz\nval_labels = %s/t10k-labels-idx1-ubyte.gz"
               % (FASHION, FASHION))
        jid = self.submit("fashion", MLP.format(name="fashion", images=FASHION + "/train-images-idx3-ubyte.gz",
                                                labels=FASHION + "/train-labels-idx1-ubyte.gz", val=val,
                                                out=self.path("out-fashion")))
        j = self.wait(jid, lambda j: j["state"] == "running" and j["step"] >= 1)
        # Pixels as bytes and labels as int32, for 60000 training and 10000
        # validation images, and the training stream's order (8 bytes an
        # image): nothing else, and no second copy.
        want = 60000 * (784 + 4 + 8) + 10000 * (784 + 4)
        self.assertEqual(j["data_bytes"], want)
        listed = [x for x in self.d.ctl_json("list")["jobs"] if x["id"] == jid]
        self.assertEqual(listed[0]["data_bytes"], want)
        text = self.d.ctl("status", str(jid)).stdout
        self.assertRegex(text, r"\n  host data +53\.1M \(%d bytes\)\n" % want)
        metrics = self.d.ctl("metrics").stdout
        self.assertRegex(metrics, r'gradd_job_data_bytes\{job="%d",[^}]*\} %d\n' % (jid, want))
        self.d.ctl("cancel", str(jid))
        j = self.wait(jid, lambda j: j["state"] == "cancelled")
        self.assertEqual(j["data_bytes"], 0)  # a finished job holds none


if __name__ == "__main__":
    harness.main()
