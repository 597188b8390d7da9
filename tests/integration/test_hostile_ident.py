"""Who a job's files belong to and what it may read, on a shared server.

- A job's outputs follow its submitter's umask (077: nobody else may read
  the model or the metrics), also when the job resumes under a restarted
  daemon, while the daemon's own umask stays its own.
- A user in more than 256 groups keeps every one of them: a data file
  readable only through the 300th is read.
"""
import ctypes
import grp
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import tempfile
import time
import unittest

import harness
from harness import GRADCTL, GRADD

USER = "nobody"

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
steps = {steps}
batch = 4
micro_batch = 2
threads = 1
eval_every = 0
[output]
dir = {out}
checkpoint_every = 20
log_every = 1000
"""


def as_user(user, umask=None):
    pw = pwd.getpwnam(user)
    cmd = ["setpriv", "--reuid=%d" % pw.pw_uid, "--regid=%d" % pw.pw_gid, "--init-groups"]
    if umask is None:
        return cmd
    return cmd + ["sh", "-c", "umask %03o && exec \"$@\"" % umask, "sh"]


def modes(top):
    """{relative path: permission bits} of top and everything in it."""
    out = {".": stat.S_IMODE(os.lstat(top).st_mode)}
    for root, dirs, files in os.walk(top):
        for name in dirs + files:
            p = os.path.join(root, name)
            out[os.path.relpath(p, top)] = stat.S_IMODE(os.lstat(p).st_mode)
    return out


def can_run(user):
    r = subprocess.run(as_user(user) + [GRADD, "--version"], capture_output=True, text=True, timeout=30)
    return r.returncode == 0


@unittest.skipUnless(os.geteuid() == 0 and shutil.which("setpriv"), "needs root and setpriv to act as other users")
class Umask(unittest.TestCase):
    """The daemon runs as root with umask 022; the user's shell decides."""

    def setUp(self):
        if not can_run(USER):
            self.skipTest("%s cannot run %s" % (USER, GRADD))
        self.old_mask = os.umask(0o022)
        self.d = harness.Daemon("[daemon]\nclient_timeout = 60s\n")
        os.chmod(self.d.dir, 0o755)
        os.chmod(self.d.sock, 0o666)
        pw = pwd.getpwnam(USER)
        self.home = tempfile.mkdtemp(prefix="gradd-ident-")
        os.chmod(self.home, 0o755)
        os.chown(self.home, pw.pw_uid, pw.pw_gid)
        self.train = os.path.join(self.home, "corpus.txt")
        harness.write_corpus(self.train)
        os.chown(self.train, pw.pw_uid, pw.pw_gid)

    def tearDown(self):
        self.d.stop()
        self.d.cleanup()
        shutil.rmtree(self.home, ignore_errors=True)
        os.umask(self.old_mask)

    def job_file(self, name, steps):
        path = os.path.join(self.home, name + ".cfg")
        with open(path, "w") as f:
            f.write(JOB.format(train=self.train, out=os.path.join(self.home, name), steps=steps))
        return path

    def ctl(self, *args, umask=0o022):
        r = subprocess.run(as_user(USER, umask) + [GRADCTL, "-s", self.d.sock] + list(args), capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0, "%s\n%s" % (r.stderr, self.d.read_log()))
        return r.stdout

    def job(self, id):
        return json.loads(self.ctl("--json", "status", str(id)))

    def wait(self, id, pred, what, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            j = self.job(id)
            if pred(j):
                return j
            self.assertNotIn(j["state"], ("failed", "cancelled"), (j, self.d.read_log()))
            time.sleep(0.05)
        self.fail("%s: %r\n%s" % (what, self.job(id), self.d.read_log()))

    def run_job(self, name, mask):
        id = int(re.search(r"job (\d+) queued", self.ctl("submit", self.job_file(name, 40), umask=mask)).group(1))
        j = self.wait(id, lambda j: j["state"] == "completed", "not done")
        return j, os.path.join(self.home, name)

    def test_umask_077_makes_private_outputs(self):
        j, out = self.run_job("private", 0o077)
        self.assertEqual(j["umask"], "0077")
        self.assertRegex(self.ctl("status", str(j["id"])), r"\n  umask +0077\n")
        got = modes(out)
        self.assertIn("model.safetensors", got)
        self.assertIn("metrics.jsonl", got)
        self.assertTrue(any(p.startswith("tensorboard/events.") for p in got), got)
        want = {p: 0o700 if stat.S_ISDIR(os.lstat(os.path.join(out, p)).st_mode) else 0o600 for p in got}
        self.assertEqual(got, want)

    def test_umask_022_makes_readable_outputs(self):
        j, out = self.run_job("shared", 0o022)
        self.assertEqual(j["umask"], "0022")
        got = modes(out)
        self.assertIn("resume.safetensors", got)
        want = {p: 0o755 if stat.S_ISDIR(os.lstat(os.path.join(out, p)).st_mode) else 0o644 for p in got}
        self.assertEqual(got, want)

    def test_umask_survives_a_restart(self):
        self.ctl("submit", self.job_file("resumed", 1000000), umask=0o027)
        out = os.path.join(self.home, "resumed")
        resume = os.path.join(out, "resume.safetensors")
        self.wait(1, lambda j: j["state"] == "running" and os.path.exists(resume), "no checkpoint")
        self.assertEqual(self.d.stop(), 0, self.d.read_log())
        record = os.path.join(self.d.dir, "state", "jobs", "1")
        with open(os.path.join(record, "state")) as f:
            self.assertIn("\numask=0027\n", f.read())
        # The daemon's own files are private whatever its umask (022 here).
        self.assertEqual({p: m for p, m in modes(record).items() if p != "log"},
                         {".": 0o700, "state": 0o600, "job.cfg": 0o600})
        restarted = time.time()
        # The same state directory under a new daemon, itself with umask 022.
        self.d.log = open(self.d.log_path, "a")
        cmd = [GRADD, "-c", self.d.conf, "-s", self.d.sock, "--state-dir", os.path.join(self.d.dir, "state")]
        self.d.proc = subprocess.Popen(cmd, stdout=self.d.log, stderr=subprocess.STDOUT)
        self.d.wait_ready()
        os.chmod(self.d.sock, 0o666)
        j = self.wait(1, lambda j: j["state"] == "running" and j["resumes"] >= 1, "not resumed")
        self.assertEqual(j["umask"], "0027")
        step = j["step"]
        self.wait(1, lambda j: j["step"] >= step + 45, "no progress after the restart")
        self.ctl("cancel", "1")
        deadline = time.time() + 60
        while self.job(1)["state"] != "cancelled" and time.time() < deadline:
            time.sleep(0.05)
        # Written by the second daemon: its checkpoints (each a new file,
        # renamed over the last) and its own TensorBoard event file.
        self.assertGreater(os.stat(resume).st_mtime, restarted)
        self.assertEqual(stat.S_IMODE(os.stat(resume).st_mode), 0o640)
        events = [p for p in os.listdir(os.path.join(out, "tensorboard")) if ".%d." % self.d.proc.pid in p]
        self.assertEqual(len(events), 1, os.listdir(os.path.join(out, "tensorboard")))
        self.assertEqual(stat.S_IMODE(os.stat(os.path.join(out, "tensorboard", events[0])).st_mode), 0o640)
        got = modes(out)
        want = {p: 0o750 if stat.S_ISDIR(os.lstat(os.path.join(out, p)).st_mode) else 0o640 for p in got}
        self.assertEqual(got, want)


GROUPS = 300
PREFIX = "gid300-%d-" % os.getpid()
GROUP_FILE = "/etc/group"


def edit_group_file(change):
    """Rewrite /etc/group as change(lines) makes it, under the lock that
    groupadd and useradd take (lckpwdf).  300 groupadd and groupdel runs
    took 50 s on two busy cores; one rewrite takes milliseconds."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.lckpwdf() != 0:
        raise OSError(ctypes.get_errno(), "lckpwdf")
    try:
        st = os.stat(GROUP_FILE)
        with open(GROUP_FILE) as f:
            lines = f.read().splitlines()
        tmp = GROUP_FILE + "+gradd-test"
        with open(tmp, "w") as f:
            f.write("".join(line + "\n" for line in change(lines)))
            os.fchown(f.fileno(), st.st_uid, st.st_gid)
            os.fchmod(f.fileno(), stat.S_IMODE(st.st_mode))
        os.rename(tmp, GROUP_FILE)
    finally:
        libc.ulckpwdf()


@unittest.skipUnless(os.geteuid() == 0 and shutil.which("setpriv") and shutil.which("useradd"),
                     "needs root, setpriv and useradd")
class ManyGroups(harness.DaemonTest):
    def setUp(self):
        self.user = PREFIX + "u"
        self.groups = []
        r = subprocess.run(["useradd", "-M", "-N", self.user], capture_output=True, text=True)
        if r.returncode != 0:
            self.skipTest("cannot make a user: %s" % r.stderr)
        self.made_user = True
        used = {g.gr_gid for g in grp.getgrall()}
        gids = [g for g in range(40000, 60000) if g not in used][:GROUPS]
        self.groups = [(PREFIX + str(i), gid) for i, gid in enumerate(gids)]
        edit_group_file(lambda lines: lines + ["%s:x:%d:%s" % (n, g, self.user) for n, g in self.groups])
        if not can_run(self.user):
            self.remove_ids()
            self.skipTest("%s cannot run %s" % (self.user, GRADD))
        super().setUp()
        os.chmod(self.d.dir, 0o755)
        os.chmod(self.d.sock, 0o666)
        pw = pwd.getpwnam(self.user)
        self.home = tempfile.mkdtemp(prefix="gradd-ident-")
        os.chmod(self.home, 0o755)
        self.out = os.path.join(self.home, "out")
        os.mkdir(self.out)
        os.chown(self.out, pw.pw_uid, pw.pw_gid)
        # Root's, readable by the last group only.
        self.train = os.path.join(self.home, "corpus.txt")
        harness.write_corpus(self.train)
        os.chown(self.train, 0, self.groups[-1][1])
        os.chmod(self.train, 0o640)

    def remove_ids(self):
        edit_group_file(lambda lines: [line for line in lines if not line.startswith(PREFIX)])
        subprocess.run(["userdel", self.user], capture_output=True)

    def tearDown(self):
        try:
            super().tearDown()
        finally:
            shutil.rmtree(self.home, ignore_errors=True)
            self.remove_ids()

    def test_file_readable_through_the_300th_group(self):
        self.assertEqual(len(os.getgrouplist(self.user, pwd.getpwnam(self.user).pw_gid)), GROUPS + 1)
        cfg = os.path.join(self.home, "job.cfg")
        with open(cfg, "w") as f:
            f.write(JOB.format(train=self.train, out=self.out, steps=10))
        r = subprocess.run(as_user(self.user) + [GRADCTL, "-s", self.d.sock, "submit", cfg], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0, "%s\n%s" % (r.stderr, self.d.read_log()))
        deadline = time.time() + 60
        while time.time() < deadline:
            j = self.d.ctl_json("status", "1")
            if j["state"] not in ("queued", "running"):
                break
            time.sleep(0.05)
        self.assertEqual(j["state"], "completed", j)
        self.assertTrue(os.path.exists(os.path.join(self.out, "model.safetensors")))


if __name__ == "__main__":
    harness.main()
