"""A user who fills the daemon's disk and memory: a job that logs every
step, submit plus cancel in a loop, and large job files submitted again and
again.  Each stays within its [daemon] limit: the log keeps its head and
newest lines under max_job_log, a user's records and bytes in the state dir
stay under max_records_per_user and max_bytes_per_user (their oldest
finished jobs forgotten first), a refusal names the key, and the daemon's
memory does not grow with the loop."""
import os
import shutil
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402
from harness import Daemon  # noqa: E402

JOB = """[job]
name = {name}
[model]
type = gpt
layers = 1
heads = 2
width = 16
context = 8
vocab = 256
[data]
format = text
train = {train}
val_fraction = 0.1
[train]
steps = {steps}
batch = 4
threads = 1
eval_every = 0
[output]
dir = {out}
log_every = 1
"""

MAX_LOG = 64 << 10
MARKER = "== [log: "
# A running job's log is counted as it grows, and room is made for it
# right after: the bytes may pass max_bytes_per_user by a line or two.
LINE_SLACK = 1024
# The daemon's RSS may grow this much over a loop that, unbounded, kept
# about 27 KB per record (82 MB for 3000).
RSS_SLACK_KB = 8 << 10
SANITIZED = harness.SANITIZED


def last_line(path):
    with open(path) as f:
        lines = f.read().splitlines()
    return lines[-1] if lines else ""


class HostileDisk(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gradd-disk-")
        os.chmod(self.dir, 0o755)
        self.train = os.path.join(self.dir, "corpus.txt")
        harness.write_corpus(self.train)
        self.state = os.path.join(self.dir, "state")
        self.d = None

    def tearDown(self):
        if self.d:
            self.d.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, conf, max_log="64K"):
        self.d = Daemon("[daemon]\nmax_jobs_per_device = 1\nmax_job_log = %s\n%s" % (max_log, conf),
                        args=("--state-dir", self.state))

    def job(self, name, steps=1000000, pad=0, n=None):
        """The job file NAME.cfg; with n, in an output directory of its own
        (queued jobs may not share one)."""
        cfg = os.path.join(self.dir, name + ".cfg")
        out = os.path.join(self.dir, "out-" + name + ("" if n is None else "-%d" % n))
        with open(cfg, "w") as f:
            f.write(JOB.format(name=name, train=self.train, steps=steps, out=out))
            # Comment lines (the parser takes lines up to 198 characters)
            # pad the file by `pad` bytes.
            for _ in range(pad // 100):
                f.write("#" + "x" * 98 + "\n")
        return cfg

    def submit(self, cfg):
        r = self.d.ctl("submit", cfg)
        self.assertRegex(r.stdout, r"^job \d+ queued \(")
        return int(r.stdout.split()[1])

    def info(self, jid):
        return self.d.ctl_json("status", str(jid))

    def wait(self, what, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if what():
                return
            time.sleep(0.02)
        raise AssertionError("timed out; daemon log:\n" + self.d.read_log())

    def log_path(self, jid):
        return os.path.join(self.state, "jobs", str(jid), "log")

    @staticmethod
    def read(path):
        try:
            with open(path) as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def ids(self):
        return [j["id"] for j in self.d.ctl_json("list")["jobs"]]

    def state_bytes(self):
        """Bytes of the job files, state files and logs in the state dir
        (every job here is this user's)."""
        total = 0
        jobs = os.path.join(self.state, "jobs")
        for d in os.listdir(jobs):
            if d.isdigit():
                for name in ("job.cfg", "state", "log"):
                    try:
                        total += os.path.getsize(os.path.join(jobs, d, name))
                    except FileNotFoundError:
                        pass
        return total

    def test_job_log_keeps_head_and_tail_within_max_job_log(self):
        self.start("")
        jid = self.submit(self.job("chatty"))
        path = self.log_path(jid)
        largest = 0
        # Until the log has been rewritten a few times (the count in its
        # marker passes twice the bound), its size checked all along.
        deadline = time.time() + 120
        dropped = 0
        while dropped < 2 * MAX_LOG:
            self.assertLess(time.time(), deadline, self.d.read_log())
            try:
                largest = max(largest, os.path.getsize(path))
                with open(path) as f:
                    text = f.read()
            except FileNotFoundError:
                continue
            if MARKER in text:
                dropped = int(text.split(MARKER, 1)[1].split()[0])
            time.sleep(0.01)
        self.d.ctl("cancel", str(jid))
        self.wait(lambda: self.info(jid)["state"] == "cancelled")
        self.assertLessEqual(largest, MAX_LOG)
        # The job's end is published once its log has its last line.
        self.assertTrue(last_line(path).startswith("== job %d cancelled" % jid), last_line(path))
        with open(path) as f:
            text = f.read()
        self.assertLessEqual(len(text.encode()), MAX_LOG)
        lines = text.splitlines()
        # The head: how the job started and its first steps, in order.
        self.assertTrue(lines[0].startswith("== job %d (chatty) starting on cpu0" % jid), lines[0])
        self.assertTrue(lines[1].startswith("step 1/1000000 loss "), lines[1])
        # One marker, after the head (its first half at most).
        markers = [i for i, l in enumerate(lines) if l.startswith(MARKER)]
        self.assertEqual(len(markers), 1)
        m = markers[0]
        self.assertLessEqual(len("\n".join(lines[:m]).encode()) + 1, MAX_LOG // 2)
        self.assertRegex(lines[m], r"^== \[log: \d+ bytes dropped here to keep it within "
                                   r"\[daemon\] max_job_log = 64(\.0)?K\]$")
        head_steps = [int(l.split()[1].split("/")[0]) for l in lines[1:m] if l.startswith("step ")]
        self.assertEqual(head_steps, list(range(1, len(head_steps) + 1)))
        # The tail: consecutive steps, the newest, then the job's end.
        tail_steps = [int(l.split()[1].split("/")[0]) for l in lines[m + 1:] if l.startswith("step ")]
        self.assertGreater(tail_steps[0], head_steps[-1] + 1)
        self.assertEqual(tail_steps, list(range(tail_steps[0], tail_steps[0] + len(tail_steps))))
        self.assertTrue(lines[-1].startswith("== job %d cancelled: cancelled at step" % jid), lines[-1])
        # gradctl logs shows the same file: head, marker and tail.
        self.assertEqual(self.d.ctl("logs", str(jid)).stdout, text)

    def test_submit_cancel_loop_stays_at_max_records_per_user(self):
        self.start("max_records_per_user = 20\n")
        busy = self.submit(self.job("busy"))
        self.wait(lambda: self.info(busy)["state"] == "running")
        cfg = self.job("spam")
        rss0 = self.d.rss_kb()
        rss = rss0
        cancelled = []
        for _ in range(60):
            jid = self.submit(cfg)
            self.d.ctl("cancel", str(jid))
            cancelled.append(jid)
            self.assertLessEqual(len(self.ids()), 20)
            rss = max(rss, self.d.rss_kb())
        if not SANITIZED:
            self.assertLess(rss, rss0 + RSS_SLACK_KB, "RSS %d KB, from %d KB" % (rss, rss0))
        # The oldest finished went first: the running job and the newest 19.
        self.assertEqual(self.ids(), [busy] + cancelled[-19:])
        self.assertFalse(os.path.exists(os.path.join(self.state, "jobs", str(cancelled[0]))))
        self.assertIn("queue: job %d (spam) of uid %d forgotten to make room ([daemon] max_records_per_user = 20)"
                      % (cancelled[0], os.getuid()), self.d.read_log())
        # Queued jobs take the place of the finished ones, until none is
        # left to forget: then the submit is refused, naming the key.
        queued = [self.submit(self.job("spam", n=i)) for i in range(19)]
        self.assertEqual(self.ids(), [busy] + queued)
        r = self.d.ctl("submit", self.job("spam", n=19), check=False)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("uid %d has 20 job records and none has finished that could be forgotten to make room for "
                      "another ([daemon] max_records_per_user = 20)" % os.getuid(), r.stderr)
        self.assertEqual(self.ids(), [busy] + queued)

    def test_large_job_files_stay_under_max_bytes_per_user(self):
        limit = 1 << 20
        self.start("max_bytes_per_user = 1M\nmax_job_file = 256K\n")
        busy = self.submit(self.job("busy"))
        self.wait(lambda: self.info(busy)["state"] == "running")
        big = self.job("big", pad=240000)
        self.assertGreater(os.path.getsize(big), 240000)
        rss0 = self.d.rss_kb()
        rss = rss0
        for _ in range(20):
            jid = self.submit(big)
            self.d.ctl("cancel", str(jid))
            self.assertLessEqual(self.state_bytes(), limit + LINE_SLACK)
            rss = max(rss, self.d.rss_kb())
        if not SANITIZED:
            self.assertLess(rss, rss0 + RSS_SLACK_KB, "RSS %d KB, from %d KB" % (rss, rss0))
        self.assertIn("forgotten to make room ([daemon] max_bytes_per_user = 1", self.d.read_log())
        # Queued ones until nothing finished is left to forget: refused.
        queued = []
        while True:
            r = self.d.ctl("submit", self.job("big", pad=240000, n=len(queued)), check=False)
            if r.returncode != 0:
                break
            queued.append(int(r.stdout.split()[1]))
            self.assertLessEqual(self.state_bytes(), limit + LINE_SLACK)
            self.assertLess(len(queued), 10)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertRegex(r.stderr, r"uid %d's jobs hold \S+ in the state dir and this one adds \S+, more than "
                                   r"\[daemon\] max_bytes_per_user = 1(\.0+)?M allows, and none has finished"
                         % os.getuid())
        self.assertEqual(self.ids(), [busy] + queued)

    def test_running_log_stops_when_nothing_is_left_to_forget(self):
        # A log bound far above the bytes: only max_bytes_per_user stops it.
        self.start("max_bytes_per_user = 1M\nmax_job_file = 256K\n", max_log="4M")
        busy = self.submit(self.job("busy"))
        big = self.job("big", pad=240000)
        # As many as fit (the log grows meanwhile): the rest of the bytes
        # are then less than one more job file, which the log soon passes.
        queued = []
        while True:
            r = self.d.ctl("submit", self.job("big", pad=240000, n=len(queued)), check=False)
            if r.returncode != 0:
                break
            queued.append(int(r.stdout.split()[1]))
            self.assertLess(len(queued), 10)
        self.assertIn("max_bytes_per_user", r.stderr)
        path = self.log_path(busy)
        self.wait(lambda: "nothing after this is kept" in self.read(path), timeout=120)
        size = os.path.getsize(path)
        self.assertLessEqual(self.state_bytes(), (1 << 20) + LINE_SLACK)
        step = self.info(busy)["step"]
        self.wait(lambda: self.info(busy)["step"] > step + 50)
        self.assertEqual(os.path.getsize(path), size)
        text = self.read(path)
        self.assertTrue(text.startswith("== job %d (busy) starting" % busy))
        self.assertTrue(text.endswith("nothing after this is kept: uid %d's jobs hold more than [daemon] "
                                      "max_bytes_per_user = 1.00M in the state dir]\n" % os.getuid()), text[-300:])
        self.assertIn("the logs of its running jobs stop at their heads", self.d.read_log())
        self.assertEqual(self.ids(), [busy] + queued)


if __name__ == "__main__":
    unittest.main()
