"""A program job's own adaptive micro-batching (python/gradd) under a real
gradd: a plain python3 script with Debian's torch whose loss function runs
out of memory above 3 rows trains with gradd.AdaptiveBatch, and `gradctl
status ID` (text and --json) and `gradctl list` show the micro-batch x
accumulation, step, loss and the last change ("oom") it reported, while
it runs and after.  Reports from anyone but the job's own program are
refused: another user's, the owner's from outside the job's session, a
finished or unknown job's, and bad fields, each named."""
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import harness

SYSTEM_PY = "/usr/bin/python3"
SOURCE = os.environ.get("GRADD_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
OTHER = "nobody"

# 16 rows a step; a micro-batch of more than 3 rows "runs out of memory"
# as gradd's allocator makes it (argv[1] picks the error's type).  After 5
# steps it says what it did in ready.json, then waits for the test.
TRAIN = r"""
import json, os, sys, time
import torch
import gradd

torch.manual_seed(0)
model = torch.nn.Linear(4, 1).double()
opt = torch.optim.SGD(model.parameters(), lr=0.1)

def loss_fn(mb):
    x, y = mb
    if x.shape[0] > 3:
        if sys.argv[1] == "runtime":
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 MiB (job budget)")
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
    return torch.nn.functional.mse_loss(model(x), y)

step = gradd.AdaptiveBatch(opt, report_every=0)
x = torch.randn(16, 4, dtype=torch.double)
y = torch.randn(16, 1, dtype=torch.double)
losses = [step((x, y), loss_fn) for _ in range(5)]
r = step.reporter
with open("ready.tmp", "w") as f:
    json.dump({"losses": losses, "micro": step.micro, "sent": r.sent, "errors": r.errors,
               "last_error": str(r.last_error), "sid": os.getsid(0)}, f)
os.rename("ready.tmp", "ready.json")
deadline = time.time() + 60
while not os.path.exists("done") and time.time() < deadline:
    time.sleep(0.05)
"""

# Sends one report (job, micro, accum, change from, to, reason) from
# wherever it runs; prints the daemon's answer.
SEND = r"""
import sys
from gradd import _client
try:
    jid, micro, accum, old, new = map(int, sys.argv[2:7])
    _client.send_report(sys.argv[1], _client.encode_report(jid, micro, accum, 0, old, new, sys.argv[7]))
    print("ok")
except _client.ReportError as e:
    print(e.code, e)
"""


def as_user(user):
    pw = pwd.getpwnam(user)
    return ["setpriv", "--reuid=%d" % pw.pw_uid, "--regid=%d" % pw.pw_gid, "--init-groups"]


@unittest.skipUnless(os.path.exists(SYSTEM_PY) and
                     subprocess.run([SYSTEM_PY, "-c", "import torch"], capture_output=True).returncode == 0,
                     "needs /usr/bin/python3 with torch (scripts/deps.sh installs python3-torch)")
class ProgramBatch(harness.DaemonTest):
    def setUp(self):
        super().setUp()
        # Readable by every user whatever the checkout's parents are.
        self.dir = tempfile.mkdtemp(prefix="gradd-pbatch-")
        os.chmod(self.dir, 0o755)
        shutil.copytree(os.path.join(SOURCE, "python", "gradd"), os.path.join(self.dir, "lib", "gradd"))
        for name, text in (("train.py", TRAIN), ("send.py", SEND)):
            with open(os.path.join(self.dir, name), "w") as f:
                f.write(text)
        os.chmod(self.d.dir, 0o755)
        os.chmod(self.d.sock, 0o666)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)
        super().tearDown()

    def submit(self, error_kind):
        path = os.path.join(self.dir, "job.cfg")
        with open(path, "w") as f:
            f.write("[job]\ntype = program\ndevice = cpu\n[program]\ncommand = %s train.py %s\n"
                    "env = PYTHONPATH=%s OMP_NUM_THREADS=1 %s\n"
                    % (SYSTEM_PY, error_kind, os.path.join(self.dir, "lib"), harness.program_env()))
        out = self.d.ctl("submit", path).stdout
        return int(out.split()[1])

    def wait_for(self, pred, what, jid, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            got = pred()
            if got:
                return got
            time.sleep(0.05)
        self.fail("%s: not within %ds\n%s\n%s" % (what, timeout, self.d.ctl("logs", str(jid), check=False).stdout,
                                                  self.d.read_log()))

    def ready(self, jid):
        path = os.path.join(self.dir, "ready.json")

        def read():
            if os.path.exists(path):
                with open(path) as f:
                    return json.load(f)
            if self.d.ctl_json("status", str(jid))["state"] != "running":
                self.fail("job %d ended early:\n%s" % (jid, self.d.ctl("logs", str(jid)).stdout))
            return None
        return self.wait_for(read, "the job's 5 steps", jid)

    def send(self, prefix, jid, micro, accum, old=0, new=0, reason=""):
        r = subprocess.run(list(prefix) + [SYSTEM_PY, os.path.join(self.dir, "send.py"), self.d.sock,
                                           str(jid), str(micro), str(accum), str(old), str(new), reason],
                           capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, PYTHONPATH=os.path.join(self.dir, "lib")))
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout.strip()

    def check_shown(self, jid, run, state):
        info = self.d.ctl_json("status", str(jid))
        self.assertEqual(info["state"], state)
        self.assertEqual((info["micro"], info["accum"], info["step"]), (2, 8, 5))
        # Start at the whole batch of 16, then 16 -> 8 -> 4 -> 2 in step 1.
        self.assertEqual(info["last_change"], {"from": 4, "to": 2, "step": 0, "reason": "oom"})
        self.assertEqual(info["oom_recoveries"], 3)
        self.assertEqual(info["loss"], run["losses"][-1])
        text = self.d.ctl("status", str(jid)).stdout
        self.assertIn("  progress    5 steps\n", text)
        self.assertIn("  batch       2×8 (micro-batch × accumulation)\n", text)
        self.assertIn("  last change 4 → 2 at step 0 (oom)\n", text)
        row = [line.split() for line in self.d.ctl("list").stdout.splitlines()[1:] if line.split()[0] == str(jid)]
        self.assertEqual(row[0][5:8], ["5", "%.3f" % run["losses"][-1], "2×8"], row)
        self.assertEqual(row[0][-2:], ["4->2", "oom@0"], row)

    def test_oom_shrinks_and_status_shows_it(self):
        jid = self.submit("torch")
        run = self.ready(jid)
        self.assertEqual(run["micro"], 2)
        # start, three OOMs, then one report a step; none refused.
        self.assertEqual((run["sent"], run["errors"], run["last_error"]), (9, 0, "None"), run)
        self.check_shown(jid, run, "running")

        # Only the job's own program reports for it.
        if os.geteuid() == 0 and shutil.which("setpriv"):
            self.assertEqual(self.send(as_user(OTHER), jid, 4, 4, 2, 4, "grow"),
                             "PERMISSION_DENIED gradd refused the report: job %d belongs to root; only its own "
                             "program may report for it (PERMISSION_DENIED)" % jid)
        got = self.send((), jid, 4, 4)
        self.assertEqual(got, "PERMISSION_DENIED gradd refused the report: pid %s is not in job %d's session (%d): "
                         "only the job's own program may report for it (PERMISSION_DENIED)"
                         % (got.split()[6], jid, run["sid"]))
        for micro, accum, old, new, reason, msg in (
                (0, 8, 0, 0, "", "report: micro must be 1 to 16777216, not 0"),
                (2, 0, 0, 0, "", "report: accum must be 1 to 16777216, not 0"),
                (1 << 25, 1, 0, 0, "", "report: micro must be 1 to 16777216, not 33554432"),
                (2, 8, 4, 2, "", "report: change_from and change_to need a reason"),
                (2, 8, 4, 3, "oom", "report: change_to (3) must be the micro-batch it changed to, micro (2)"),
                (2, 8, 1, 2, "oom", 'report: an "oom" change shrinks: change_from (1) must be above change_to (2)'),
                (2, 8, 4, 2, "grow", 'report: a "grow" change grows: change_from (4) must be below change_to (2)')):
            self.assertEqual(self.send((), jid, micro, accum, old, new, reason),
                             "BAD_REQUEST gradd refused the report: %s (BAD_REQUEST)" % msg)
        self.assertEqual(self.send((), 999, 2, 8), "NOT_FOUND gradd refused the report: no job 999 (NOT_FOUND)")
        # None of that changed what status shows.
        self.check_shown(jid, run, "running")

        open(os.path.join(self.dir, "done"), "w").close()
        self.wait_for(lambda: self.d.ctl_json("status", str(jid))["state"] == "completed", "completed", jid)
        self.check_shown(jid, run, "completed")
        self.assertEqual(self.send((), jid, 2, 8),
                         "BAD_REQUEST gradd refused the report: job %d is completed, not running: reports are "
                         "taken while its program runs (BAD_REQUEST)" % jid)

    def test_allocator_text(self):
        # gradd's allocator raises a RuntimeError, not torch's OutOfMemoryError.
        jid = self.submit("runtime")
        run = self.ready(jid)
        self.assertEqual((run["micro"], run["sent"], run["errors"]), (2, 9, 0), run)
        self.check_shown(jid, run, "running")
        open(os.path.join(self.dir, "done"), "w").close()
        self.wait_for(lambda: self.d.ctl_json("status", str(jid))["state"] == "completed", "completed", jid)


if __name__ == "__main__":
    harness.main()
