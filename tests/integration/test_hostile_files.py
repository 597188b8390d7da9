"""A hostile user with special files and slow requests, against a real gradd
run as root, with ordinary users reaching its socket: a FIFO as the
resume file, the model or the data fails that job (or that request) with
a message naming the file, and never stops a worker or the sample slots;
a sample longer than [daemon] sample_timeout is stopped, naming the key; a
client that leaves frees its slot; and SIGTERM with a job thread stuck
ends within [daemon] stop_timeout, the job resuming at the next start."""
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import harness
from harness import GRADCTL

OWNER = "nobody"   # the hostile user
OTHER = "daemon"   # someone else on the same server

GPT = """[job]
name = {name}
[model]
type = gpt
layers = {layers}
heads = 2
width = {width}
context = {context}
vocab = 256
[data]
format = text
train = {train}
val_fraction = 0
[train]
steps = {steps}
batch = 2
micro_batch = 2
threads = 1
eval_every = 0
[output]
dir = {out}
checkpoint_every = {ckpt}
log_every = 1000
"""


def as_user(name):
    pw = pwd.getpwnam(name)
    return ["setpriv", "--reuid=%d" % pw.pw_uid, "--regid=%d" % pw.pw_gid, "--clear-groups"]


@unittest.skipUnless(os.geteuid() == 0 and shutil.which("setpriv"), "needs root and setpriv to act as other users")
class Hostile(unittest.TestCase):
    conf = "[daemon]\nmax_jobs_per_device = 1\n"
    test_hooks = False

    def setUp(self):
        self.base = tempfile.mkdtemp(prefix="gradd-hostile-")
        self.addCleanup(shutil.rmtree, self.base, ignore_errors=True)
        os.chmod(self.base, 0o755)
        # Each user's private home, with a corpus in it.
        self.homes = {}
        for user in (OWNER, OTHER):
            pw = pwd.getpwnam(user)
            home = os.path.join(self.base, user)
            os.mkdir(home, 0o700)
            harness.write_corpus(os.path.join(home, "corpus.txt"))
            for p in (home, os.path.join(home, "corpus.txt")):
                os.chown(p, pw.pw_uid, pw.pw_gid)
            self.homes[user] = home
        self.d = self.start()
        self.addCleanup(self.d.cleanup)

    def start(self, args=()):
        d = harness.Daemon(self.conf, args=args, test_hooks=self.test_hooks)
        # Other users reach the socket (as through socket_group).
        os.chmod(d.dir, 0o755)
        os.chmod(d.sock, 0o666)
        if not self.can_run(d):
            d.cleanup()
            self.skipTest("%s cannot run %s" % (OWNER, GRADCTL))
        return d

    def can_run(self, d):
        r = subprocess.run(as_user(OWNER) + [GRADCTL, "-s", d.sock, "status"], capture_output=True, timeout=60)
        return r.returncode == 0

    def tearDown(self):
        if self.d.proc.poll() is None:
            code = self.d.stop()
            self.assertEqual(code, 0, "gradd exited %d:\n%s" % (code, self.d.read_log()))

    def ctl(self, user, *args, check=True, timeout=60):
        r = subprocess.run(as_user(user) + [GRADCTL, "-s", self.d.sock] + list(args), capture_output=True,
                           text=True, timeout=timeout)
        if check and r.returncode != 0:
            self.fail("gradctl %s as %s -> %d\n%s\nlog:\n%s" % (" ".join(args), user, r.returncode, r.stderr,
                                                               self.d.read_log()))
        return r

    def user_file(self, user, path, fifo=False, text=None):
        """Make path (a FIFO, a file or a directory) owned by user."""
        pw = pwd.getpwnam(user)
        if fifo:
            os.mkfifo(path, 0o600)
        elif text is not None:
            with open(path, "w") as f:
                f.write(text)
        else:
            os.mkdir(path, 0o700)
        os.chown(path, pw.pw_uid, pw.pw_gid)
        return path

    def submit(self, user, name, steps=4, out=None, train=None, layers=1, width=16, context=16, ckpt=0,
               check=True, hold=False):
        home = self.homes[user]
        cfg = self.user_file(user, os.path.join(home, name + ".cfg"), text=GPT.format(
            name=name, steps=steps, out=out or os.path.join(home, name), train=train or
            os.path.join(home, "corpus.txt"), layers=layers, width=width, context=context, ckpt=ckpt))
        r = self.ctl(user, "--json", "submit", cfg, *(["--hold"] if hold else []), check=check)
        return json.loads(r.stdout)["id"] if r.returncode == 0 else r

    def job(self, jid):
        return json.loads(self.ctl(OWNER, "--json", "status", str(jid)).stdout)

    def wait(self, jid, pred, what, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            j = self.job(jid)
            if pred(j):
                return j
            time.sleep(0.05)
        self.fail("job %d: %s: %r\n%s" % (jid, what, self.job(jid), self.d.read_log()))

    def finished(self, jid, timeout=60):
        return self.wait(jid, lambda j: j["state"] not in ("queued", "running"), "did not finish", timeout)


class SpecialFiles(Hostile):
    def test_fifo_as_resume_file_fails_the_job_and_the_queue_goes_on(self):
        out = self.user_file(OWNER, os.path.join(self.homes[OWNER], "trap"))
        fifo = self.user_file(OWNER, os.path.join(out, "resume.safetensors"), fifo=True)
        # At submit: refused, naming the file.
        r = self.submit(OWNER, "trap", out=out, check=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("[output] resume = auto: cannot read the checkpoint in %s: %s: not a regular file (a FIFO)"
                      % (out, fifo), r.stderr)
        # Swapped in while the job waits: it fails when it runs, at once.
        os.unlink(fifo)
        busy = self.submit(OTHER, "busy", steps=1000000)
        self.wait(busy, lambda j: j["state"] == "running", "never ran")
        bad = self.submit(OWNER, "trap", out=out)
        self.user_file(OWNER, fifo, fifo=True)
        self.ctl(OTHER, "cancel", str(busy))
        t0 = time.time()
        j = self.finished(bad)
        self.assertEqual(j["state"], "failed", j)
        self.assertEqual(j["reason"], "cannot resume: %s: not a regular file (a FIFO)" % fifo)
        self.assertLess(time.time() - t0, 30)
        # The one worker is free: another user's job runs to its end, and
        # a long one is cancelled at once.
        ok = self.submit(OTHER, "after", steps=4)
        self.assertEqual(self.finished(ok)["state"], "completed", self.job(ok))
        long = self.submit(OTHER, "long", steps=1000000)
        self.wait(long, lambda j: j["state"] == "running" and j["step"] >= 1, "never ran")
        self.ctl(OTHER, "cancel", str(long))
        self.assertEqual(self.finished(long, timeout=30)["state"], "cancelled")

    def test_a_dangling_checkpoint_link_is_no_fresh_start(self):
        # An earlier run's model, its checkpoint a link to nowhere: a fresh
        # start would write over the model.
        out = self.user_file(OWNER, os.path.join(self.homes[OWNER], "linked"))
        link = os.path.join(out, "resume.safetensors")
        os.symlink("/nonexistent/resume.safetensors", link)
        r = self.submit(OWNER, "linked", out=out, check=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("[output] resume = auto: cannot read the checkpoint in %s: " % out, r.stderr)
        # Made so while the job waits: it fails, and the model stays.
        os.unlink(link)
        jid = self.submit(OWNER, "linked", out=out, hold=True)
        model = self.user_file(OWNER, os.path.join(out, "model.safetensors"), text="the earlier run's model")
        os.symlink("/nonexistent/resume.safetensors", link)
        self.ctl(OWNER, "release", str(jid))
        j = self.finished(jid)
        self.assertEqual(j["state"], "failed", j)
        self.assertTrue(j["reason"].startswith("cannot resume: %s" % link), j["reason"])
        with open(model) as f:
            self.assertEqual(f.read(), "the earlier run's model")

    def test_fifo_as_model_refuses_sample_and_frees_the_slots(self):
        # A failed job (its output has no model) whose directory then gets
        # a FIFO where model.safetensors goes.
        out = self.user_file(OWNER, os.path.join(self.homes[OWNER], "trap"))
        bad = self.submit(OWNER, "trap", out=out, hold=True)
        self.user_file(OWNER, os.path.join(out, "resume.safetensors"), fifo=True)
        self.ctl(OWNER, "release", str(bad))
        self.assertEqual(self.finished(bad)["state"], "failed")
        fifo = self.user_file(OWNER, os.path.join(out, "model.safetensors"), fifo=True)
        # More requests at once than there are slots: each is refused at
        # once, naming the file, and none keeps a slot.
        procs = [subprocess.Popen(as_user(OWNER) + [GRADCTL, "-s", self.d.sock, "sample", str(bad)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
        for p in procs:
            _, err = p.communicate(timeout=30)
            self.assertNotEqual(p.returncode, 0)
            if "samples are being generated" not in err:
                self.assertIn("job %d: %s: not a regular file (a FIFO)" % (bad, fifo), err)
        # Another user trains and samples: both slots are free.
        ok = self.submit(OTHER, "good", steps=2)
        self.assertEqual(self.finished(ok)["state"], "completed", self.job(ok))
        r = self.ctl(OTHER, "--json", "sample", str(ok), "--tokens", "8", timeout=30)
        self.assertEqual(len(json.loads(r.stdout)["token_ids"]), 8)

    def test_fifo_as_data_is_refused_or_fails_the_job(self):
        home = self.homes[OWNER]
        fifo = self.user_file(OWNER, os.path.join(home, "fifo.txt"), fifo=True)
        # At submit: refused, naming the key and the file.
        r = self.submit(OWNER, "direct", train=fifo, check=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("[data] train: %s: not a regular file (a FIFO)" % fifo, r.stderr)
        # The job file itself a FIFO: gradctl refuses it at once, rather
        # than wait for a writer.
        jf = self.user_file(OWNER, os.path.join(home, "fifo.cfg"), fifo=True)
        r = self.ctl(OWNER, "submit", jf, check=False, timeout=20)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("%s: not a regular file" % jf, r.stderr)
        # Swapped in while the job waits in the queue: the job fails,
        # naming it, when it runs.
        data = self.user_file(OWNER, os.path.join(home, "swap.txt"), text="the quick brown fox\n" * 200)
        busy = self.submit(OTHER, "busy", steps=1000000)
        self.wait(busy, lambda j: j["state"] == "running", "never ran")
        swapped = self.submit(OWNER, "swapped", train=data)
        os.unlink(data)
        self.user_file(OWNER, data, fifo=True)
        self.ctl(OTHER, "cancel", str(busy))
        j = self.finished(swapped)
        self.assertEqual(j["state"], "failed", j)
        self.assertIn("%s: not a regular file (a FIFO)" % data, j["reason"])


class SampleLimits(Hostile):
    # A model large enough that 4096 tokens take far longer than a second,
    # even alone on a fast core; small enough to train one step at once.
    BIG = dict(layers=2, width=128, context=128, steps=1)

    def long_sample(self, jid):
        return subprocess.Popen(as_user(OWNER) + [GRADCTL, "-s", self.d.sock, "sample", str(jid), "--tokens",
                                                  "4096"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)


class SampleTimeout(SampleLimits):
    conf = "[daemon]\nmax_jobs_per_device = 1\nsample_timeout = 1s\n"

    def test_a_long_sample_is_stopped_naming_the_key(self):
        jid = self.submit(OWNER, "big", **self.BIG)
        self.assertEqual(self.finished(jid)["state"], "completed", self.job(jid))
        t0 = time.time()
        r = self.ctl(OWNER, "sample", str(jid), "--tokens", "4096", check=False)
        took = time.time() - t0
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("of 4096 tokens: it ran longer than the daemon allows ([daemon] sample_timeout = 1s)",
                      r.stderr)
        self.assertGreaterEqual(took, 1.0)
        self.assertLess(took, 15)
        # The slot is free again: a short one goes through.
        r = self.ctl(OWNER, "--json", "sample", str(jid), "--tokens", "4")
        self.assertEqual(len(json.loads(r.stdout)["token_ids"]), 4)


class SampleCancel(SampleLimits):
    conf = "[daemon]\nmax_jobs_per_device = 1\nsample_timeout = 10m\n"

    def test_a_client_that_leaves_frees_its_slot(self):
        jid = self.submit(OWNER, "big", **self.BIG)
        self.assertEqual(self.finished(jid)["state"], "completed", self.job(jid))
        # Both slots taken by long generations; then their clients go
        # (Ctrl-C).
        procs = [self.long_sample(jid) for _ in range(2)]
        deadline = time.time() + 60
        while True:
            # A probe that got a slot first turns a long one away: again.
            for i, p in enumerate(procs):
                if p.poll() is not None:
                    self.assertIn("samples are being generated", p.communicate()[1])
                    procs[i] = self.long_sample(jid)
            time.sleep(0.2)
            r = self.ctl(OWNER, "sample", str(jid), "--tokens", "4", check=False)
            if "2 samples are being generated" in r.stderr:
                break
            self.assertLess(time.time(), deadline, "the slots never filled: %s" % r.stderr)
        for p in procs:
            p.send_signal(signal.SIGINT)
            p.communicate(timeout=30)
        # Both generations stop within a token: a third gets a slot long
        # before sample_timeout (10 minutes) would have freed one.
        t0 = time.time()
        while True:
            r = self.ctl(OWNER, "--json", "sample", str(jid), "--tokens", "4", check=False)
            if r.returncode == 0:
                break
            self.assertIn("samples are being generated", r.stderr)
            self.assertLess(time.time() - t0, 10, "the slots were not freed\n" + self.d.read_log())
            time.sleep(0.05)
        self.assertEqual(len(json.loads(r.stdout)["token_ids"]), 4)
        deadline = time.time() + 10
        while self.d.read_log().count("cancelled: the client left") < 2:
            self.assertLess(time.time(), deadline, self.d.read_log())
            time.sleep(0.05)


class StuckThread(Hostile):
    conf = "[daemon]\nmax_jobs_per_device = 1\nstop_timeout = 1s\n"
    test_hooks = True

    def test_sigterm_ends_within_stop_timeout_and_the_job_resumes(self):
        jid = self.submit(OWNER, "stuck", steps=1000000, ckpt=5)
        out = os.path.join(self.homes[OWNER], "stuck")
        self.wait(jid, lambda j: j["state"] == "running" and j["step"] >= 12, "no progress")
        self.assertTrue(os.path.exists(os.path.join(out, "resume.safetensors")))
        self.assertIn("1 busy", self.ctl(OWNER, "test-hang", "cpu0").stdout)
        time.sleep(0.3)  # at its next poll it hangs, and stays hung
        t0 = time.time()
        self.d.proc.send_signal(signal.SIGTERM)
        code = self.d.proc.wait(timeout=30)
        took = time.time() - t0
        log = self.d.read_log()
        self.assertEqual(code, 3, log)
        self.assertGreaterEqual(took, 1.0, log)
        self.assertLess(took, 1.0 + 4, log)  # stop_timeout, and a margin for a loaded machine
        self.assertIn("job %d on cpu0 did not stop within 1000ms ([daemon] stop_timeout): its thread is stuck"
                      % jid, log)
        self.assertIn("exiting with status 3: 1 job thread did not stop within [daemon] stop_timeout", log)
        self.assertFalse(os.path.exists(self.d.sock))
        # The next start finds it as after kill -9: queued again, and it
        # resumes from its checkpoint.
        first = self.d
        self.d = self.start(args=("--state-dir", os.path.join(first.dir, "state")))
        self.addCleanup(self.d.cleanup)
        j = self.wait(jid, lambda j: j["state"] == "running" and j.get("resumes", 0) >= 1 and j["step"] >= 5,
                      "did not resume")
        self.assertEqual(j["resumes"], 1, j)
        self.ctl(OWNER, "cancel", str(jid))
        self.assertEqual(self.finished(jid, timeout=30)["state"], "cancelled")


if __name__ == "__main__":
    harness.main()
