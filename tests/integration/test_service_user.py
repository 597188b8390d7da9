"""gradd as gradd.service runs it: an unprivileged service user with only
CAP_SETUID and CAP_SETGID (ambient), NoNewPrivileges, serving another
user's job whose data and outputs only that user may read.  As root every
check passes whatever identity it is made with; here one made with the
daemon's own identity (access(2) and its real uid, or a check on the
event loop before switching) refuses the job, fails it at restart, or
loses its checkpoint."""
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
from harness import GRADCTL, GRADD

SERVICE_USER = "daemon"  # stands in for gradd: any unprivileged system user
OWNER = "nobody"

JOB = """
[model]
type = gpt
layers = 1
heads = 1
width = 16
context = 8
[data]
format = text
train = {train}
[train]
steps = 1000000
batch = 4
micro_batch = 2
threads = 1
eval_every = 0
[output]
dir = {out}
checkpoint_every = 20
log_every = 1000
"""


def setpriv_service():
    return ["setpriv", "--reuid=" + SERVICE_USER, "--regid=" + SERVICE_USER, "--init-groups",
            "--inh-caps=-all,+setuid,+setgid", "--ambient-caps=-all,+setuid,+setgid",
            "--bounding-set=-all,+setuid,+setgid", "--no-new-privs"]


def setpriv_owner():
    return ["setpriv", "--reuid=" + OWNER, "--regid=" + str(pwd.getpwnam(OWNER).pw_gid), "--init-groups"]


@unittest.skipUnless(os.geteuid() == 0 and shutil.which("setpriv"), "needs root and setpriv to act as other users")
class ServiceUser(unittest.TestCase):
    def setUp(self):
        # The service user must be able to run this build's gradd at all.
        r = subprocess.run(setpriv_service() + [GRADD, "--version"], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            self.skipTest("%s cannot run %s: %s" % (SERVICE_USER, GRADD, r.stderr.strip()))
        self.dir = tempfile.mkdtemp(prefix="gradd-svc-")
        os.chmod(self.dir, 0o755)
        svc, owner = pwd.getpwnam(SERVICE_USER), pwd.getpwnam(OWNER)
        # Daemon-owned: state (0700, as StateDirectory=) and socket directory.
        self.state = os.path.join(self.dir, "state")
        self.run_dir = os.path.join(self.dir, "run")
        for d in (self.state, self.run_dir):
            os.mkdir(d, 0o700)
            os.chown(d, svc.pw_uid, svc.pw_gid)
        os.chmod(self.run_dir, 0o755)
        self.sock = os.path.join(self.run_dir, "gradd.sock")
        # The owner's private home: the service user may not even search it.
        self.home = os.path.join(self.dir, "home")
        os.mkdir(self.home, 0o700)
        self.train = os.path.join(self.home, "corpus.txt")
        harness.write_corpus(self.train)
        os.chmod(self.train, 0o600)
        self.out = os.path.join(self.home, "out")
        self.cfg = os.path.join(self.home, "job.cfg")
        with open(self.cfg, "w") as f:
            f.write(JOB.format(train=self.train, out=self.out))
        for p in (self.home, self.train, self.cfg):
            os.chown(p, owner.pw_uid, owner.pw_gid)
        self.proc = None
        self.logs = []

    def tearDown(self):
        self.kill()
        for log in self.logs:
            log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self):
        log = open(os.path.join(self.dir, "gradd-%d.log" % len(self.logs)), "w")
        self.logs.append(log)
        self.proc = subprocess.Popen(setpriv_service() + [GRADD, "-s", self.sock, "--state-dir", self.state],
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        # (After a kill -9 the old socket file is still there.)
        deadline = time.time() + 20
        def listening():
            with open(log.name) as f:
                return "listening on" in f.read()

        while not listening():
            if self.proc.poll() is not None or time.time() > deadline:
                self.fail("gradd did not start:\n" + self.read_logs())
            time.sleep(0.02)
        # The socket's group is the service user's; let the owner in.
        os.chmod(self.sock, 0o666)

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def read_logs(self):
        text = ""
        for log in self.logs:
            log.flush()
            with open(log.name) as f:
                text += f.read()
        return text

    def ctl(self, *args):
        r = subprocess.run(setpriv_owner() + [GRADCTL, "-s", self.sock] + list(args), capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0, "%s\n%s" % (r.stderr, self.read_logs()))
        return r.stdout

    def job(self):
        return json.loads(self.ctl("--json", "status", "1"))

    def wait(self, pred, what, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            j = self.job()
            if pred(j):
                return j
            self.assertNotIn(j["state"], ("failed", "cancelled", "completed"), (j, self.read_logs()))
            time.sleep(0.05)
        self.fail("%s: %r\n%s" % (what, self.job(), self.read_logs()))

    def test_private_job_is_accepted_survives_restart_and_resumes(self):
        self.start()
        self.assertIn("job 1 queued", self.ctl("submit", self.cfg))
        j = self.wait(lambda j: j["state"] == "running" and j["step"] >= 200, "no progress")
        before = j["step"]
        self.assertTrue(os.path.exists(os.path.join(self.out, "resume.safetensors")))
        self.assertEqual(os.stat(self.out).st_uid, pwd.getpwnam(OWNER).pw_uid)
        # A crash (or the watchdog's restart): the job is still runnable
        # (its data is checked as its owner) and resumes from its
        # checkpoint instead of starting again.
        self.kill()
        self.start()
        j = self.wait(lambda j: j["state"] == "running" and j.get("resumes", 0) >= 1, "not resumed")
        self.assertGreaterEqual(j["step"], before - 20, j)
        log = self.ctl("logs", "1")
        self.assertEqual(log.count("step 1/"), 1, log)  # once, before the restart
        self.ctl("cancel", "1")
        self.proc.send_signal(signal.SIGTERM)
        self.assertEqual(self.proc.wait(timeout=60), 0, self.read_logs())


if __name__ == "__main__":
    harness.main()
