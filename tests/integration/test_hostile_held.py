"""What a hostile socket user tried that gradd already withstood, kept as
tests: a job's files swapped for symlinks between submit and run.

The submit checks a job's data and output dir as its submitter; the job
thread opens them again, as the submitter too (setfsuid), when it starts.
So a user who queues a job on their own readable file and then points that
file, or the output dir, at someone else's gets a failed job naming the
path, and the other user's files are neither read nor written."""
import os
import shutil
import subprocess
import tempfile
import time
import unittest

import harness
from harness import GRADCTL, Daemon

NOBODY = 65534

JOB = """
[job]
name = {name}
[model]
type = gpt
layers = 1
heads = 1
width = 16
context = 8
vocab = 256
[data]
format = text
train = {train}
[train]
steps = {steps}
batch = 4
micro_batch = 2
threads = 1
eval_every = 0
[output]
dir = {out}
checkpoint_every = 0
log_every = 1000
"""


@unittest.skipUnless(os.geteuid() == 0 and shutil.which("setpriv"), "needs root and setpriv to act as another user")
class SwapAfterSubmit(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gradd-held-")
        os.chmod(self.dir, 0o755)
        # root's private things, which nobody's job must not reach.
        self.secret = os.path.join(self.dir, "secret.txt")
        harness.write_corpus(self.secret)
        os.chmod(self.secret, 0o600)
        self.root_out = os.path.join(self.dir, "root-out")
        os.mkdir(self.root_out, 0o755)
        # nobody's own corner.
        self.home = os.path.join(self.dir, "nobody")
        os.mkdir(self.home, 0o755)
        os.chown(self.home, NOBODY, NOBODY)
        self.d = Daemon("[daemon]\nmax_jobs_per_device = 1\n")
        os.chmod(self.d.dir, 0o755)
        os.chmod(self.d.sock, 0o666)
        # A long root job holds the only slot, so nobody's job waits queued.
        root_train = os.path.join(self.dir, "root.txt")
        harness.write_corpus(root_train)
        cfg = self.write(os.path.join(self.dir, "blocker.cfg"), "blocker", root_train, 1000000,
                         os.path.join(self.dir, "blocker-out"))
        self.blocker = self.submit([], cfg)
        self.wait_state(self.blocker, ("running",))

    def tearDown(self):
        self.d.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)

    def write(self, path, name, train, steps, out, owner=None):
        with open(path, "w") as f:
            f.write(JOB.format(name=name, train=train, steps=steps, out=out))
        os.chmod(path, 0o644)
        if owner is not None:
            os.chown(path, owner, owner)
        return path

    def as_nobody(self):
        return ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups"]

    def submit(self, prefix, cfg):
        r = subprocess.run(prefix + [GRADCTL, "-s", self.d.sock, "submit", cfg], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return int(r.stdout.split()[1])

    def wait_state(self, jid, states, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            j = self.d.ctl_json("status", str(jid))
            if j["state"] in states:
                return j
            time.sleep(0.05)
        raise AssertionError("job %d stuck in %s" % (jid, j["state"]))

    def queue_nobodys_job(self):
        train = os.path.join(self.home, "train.txt")
        harness.write_corpus(train)
        os.chown(train, NOBODY, NOBODY)
        out = os.path.join(self.home, "out")
        cfg = self.write(os.path.join(self.home, "job.cfg"), "swapper", train, 4, out, owner=NOBODY)
        jid = self.submit(self.as_nobody(), cfg)
        self.assertEqual(self.d.ctl_json("status", str(jid))["state"], "queued")
        return jid, train, out

    def release(self):
        self.d.ctl("cancel", str(self.blocker))

    def test_data_swapped_for_a_symlink_to_a_private_file(self):
        jid, train, _ = self.queue_nobodys_job()
        os.unlink(train)
        os.symlink(self.secret, train)
        self.release()
        j = self.wait_state(jid, ("failed", "completed", "cancelled"))
        self.assertEqual(j["state"], "failed", j)
        self.assertIn("train.txt", j["reason"])
        self.assertIn("ermission denied", j["reason"])
        self.assertEqual(j["step"], 0)

    def test_output_dir_swapped_for_a_symlink_to_another_users_dir(self):
        jid, _, out = self.queue_nobodys_job()
        # The submit made no output dir (the job makes it when it starts);
        # nobody puts a link to another user's directory there.
        self.assertFalse(os.path.lexists(out))
        os.symlink(self.root_out, out)
        self.release()
        j = self.wait_state(jid, ("failed", "completed", "cancelled"))
        self.assertEqual(j["state"], "failed", j)
        self.assertIn("out", j["reason"])
        self.assertIn("ermission denied", j["reason"])
        self.assertEqual(os.listdir(self.root_out), [])


if __name__ == "__main__":
    unittest.main()
