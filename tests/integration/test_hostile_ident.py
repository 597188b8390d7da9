"""Who a job's files belong to and what it may read, on a shared server.

- A user in more than 256 groups keeps every one of them: a data file
  readable only through the 300th is read.
"""
import ctypes
import grp
import os
import pwd
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


def can_run(user):
    r = subprocess.run(as_user(user) + [GRADD, "--version"], capture_output=True, text=True, timeout=30)
    return r.returncode == 0


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
