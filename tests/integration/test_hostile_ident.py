"""Who a job's files belong to and who may steer the daemon through its
state directory, on a shared server.

- A job's outputs follow its submitter's umask (077: nobody else may read
  the model or the metrics), also when the job resumes under a restarted
  daemon, while the daemon's own umask stays its own.
- A state directory another user made or may write is refused by name, and
  with neither HOME nor XDG_STATE_HOME gradd does not fall back to a path
  in /tmp that another user could have made first (they did: with a job
  record that trains on the victim's private file); nor, without
  XDG_RUNTIME_DIR, does gradd or gradctl use a socket there.
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
import socket
import stat
import subprocess
import tempfile
import time
import unittest

import harness
import test_service_user
from harness import GRADCTL, GRADD

USER = "nobody"
# The socket of an installed gradd (gradd.socket), common/paths.h.
SYSTEM_SOCKET = "/run/gradd/gradd.sock"

# test_service_user's tiny GPT, for as many steps as a test needs.
JOB = test_service_user.JOB.replace("steps = 1000000", "steps = {steps}")


def as_user(user):
    pw = pwd.getpwnam(user)
    return ["setpriv", "--reuid=%d" % pw.pw_uid, "--regid=%d" % pw.pw_gid, "--init-groups"]


def with_umask(umask):
    """For subprocess's preexec_fn: the umask setpriv, and so the command
    it runs, inherits.  Not a shell between them: setpriv reaches the
    command with root's access still, a shell as the user may not (a
    checkout under /root, 0700)."""
    return lambda: os.umask(umask)


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
        r = subprocess.run(as_user(USER) + [GRADCTL, "-s", self.d.sock] + list(args), capture_output=True,
                           text=True, timeout=60, preexec_fn=with_umask(umask))
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

    def test_raw_submit_umask(self):
        """A client's umask past 0777 is refused; a client that sends none
        gets 022."""
        path = self.job_file("raw", 1)
        with open(path, "rb") as f:
            body = harness.field_bytes(1, path.encode()) + harness.field_bytes(2, f.read())
        for extra, want in ((harness.field_varint(6, 0o1000) + harness.field_varint(7, 1),
                             "submit: umask 01000 is not from 0 to 0777"), (b"", None)):
            with harness.connect(self.d.sock) as s:
                req = harness.field_varint(1, harness.PROTOCOL_VERSION) + harness.field_bytes(20, body + extra)
                s.sendall(harness.frame(req))
                self.assertEqual(harness.error_message(harness.recv_frame(s)), want)
        j = self.job(1)
        self.assertEqual(j["umask"], "0022")

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


@unittest.skipUnless(os.geteuid() == 0 and shutil.which("setpriv"), "needs root and setpriv to act as other users")
class StateDir(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gradd-ident-")
        os.chmod(self.dir, 0o755)
        self.conf = os.path.join(self.dir, "gradd.conf")
        with open(self.conf, "w") as f:
            f.write("[daemon]\n")
        self.sock = os.path.join(self.dir, "gradd.sock")
        self.planted = None

    def tearDown(self):
        if self.planted:
            shutil.rmtree(self.planted, ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def gradd(self, *args, prefix=(), env=None):
        """Run gradd to its exit (it must refuse to start)."""
        try:
            r = subprocess.run(list(prefix) + [GRADD, "-c", self.conf] + list(args), capture_output=True,
                               text=True, timeout=30, env=env)
        except subprocess.TimeoutExpired:
            self.fail("gradd started: %s" % (args,))
        self.assertEqual(r.returncode, 1, r.stderr)
        return r.stderr

    def plant(self, top, owner):
        """A state directory with a job record in it, made by `owner`."""
        pw = pwd.getpwnam(owner)
        jobs = os.path.join(top, "state", "jobs", "1")
        os.makedirs(jobs)
        with open(os.path.join(jobs, "job.cfg"), "w") as f:
            f.write(JOB.format(train="/etc/shadow", out=os.path.join(self.dir, "stolen"), steps=1))
        for root, dirs, files in os.walk(top):
            for p in [root] + [os.path.join(root, n) for n in files]:
                os.chown(p, pw.pw_uid, pw.pw_gid)
        return os.path.join(top, "state")

    def victims_tmp_dir(self):
        """/tmp/gradd-UID of USER, which the test may plant (and removes)."""
        if not can_run(USER):
            self.skipTest("%s cannot run %s" % (USER, GRADD))
        top = "/tmp/gradd-%d" % pwd.getpwnam(USER).pw_uid
        if os.path.lexists(top):
            self.skipTest("%s exists already" % top)
        self.planted = top
        return top

    def test_no_home_does_not_fall_back_to_tmp(self):
        planted = self.plant(self.victims_tmp_dir(), "daemon")
        before = sorted(os.listdir(planted))
        os.chmod(self.dir, 0o777)  # the victim's socket
        err = self.gradd("-s", self.sock, prefix=as_user(USER), env={"PATH": os.environ["PATH"]})
        self.assertIn("no state directory: HOME and XDG_STATE_HOME are unset; set [daemon] state_dir", err)
        self.assertEqual(sorted(os.listdir(planted)), before)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "stolen")))

    def test_no_runtime_dir_makes_no_socket_in_tmp(self):
        top = self.victims_tmp_dir()
        state = os.path.join(self.dir, "state")
        os.mkdir(state, 0o700)
        os.chown(state, pwd.getpwnam(USER).pw_uid, 0)
        err = self.gradd("--state-dir", state, prefix=as_user(USER), env={"PATH": os.environ["PATH"]})
        self.assertIn("no socket path: XDG_RUNTIME_DIR is unset", err)
        self.assertIn("set [daemon] socket or pass -s PATH", err)
        self.assertFalse(os.path.lexists(top))

    def test_client_ignores_a_socket_planted_in_tmp(self):
        if os.path.lexists(SYSTEM_SOCKET):
            self.skipTest("a system gradd serves %s" % SYSTEM_SOCKET)
        top = self.victims_tmp_dir()
        os.mkdir(top, 0o755)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as fake:
            fake.bind(os.path.join(top, "gradd.sock"))
            fake.listen(8)
            fake.setblocking(False)
            os.chmod(os.path.join(top, "gradd.sock"), 0o666)
            daemon = pwd.getpwnam("daemon")
            os.chown(top, daemon.pw_uid, daemon.pw_gid)
            r = subprocess.run(as_user(USER) + [GRADCTL, "status"], capture_output=True, text=True, timeout=30,
                               env={"PATH": os.environ["PATH"]})
            self.assertEqual(r.returncode, 3, r.stderr)
            self.assertIn(SYSTEM_SOCKET, r.stderr)
            with self.assertRaises(BlockingIOError):
                fake.accept()

    def test_state_dir_someone_else_made_in_tmp(self):
        # /tmp as it is: world-writable with the sticky bit.
        shared = os.path.join(self.dir, "tmp")
        os.mkdir(shared)
        os.chmod(shared, 0o1777)
        top = os.path.join(shared, "gradd-0")
        state = self.plant(top, USER)
        err = self.gradd("-s", self.sock, "--state-dir", state)
        self.assertIn("state directory: %s belongs to uid %d, not to uid 0 that gradd runs as, and is in %s, "
                      "which others may write: someone else made it" % (top, pwd.getpwnam(USER).pw_uid, shared),
                      err)

    def test_state_dir_owned_by_another_user(self):
        state = self.plant(os.path.join(self.dir, "theirs"), USER)
        os.chown(os.path.dirname(state), 0, 0)
        err = self.gradd("-s", self.sock, "--state-dir", state)
        self.assertIn("state directory %s belongs to uid %d, not to uid 0 that gradd runs as" %
                      (state, pwd.getpwnam(USER).pw_uid), err)

    def test_state_dir_writable_by_group_or_others(self):
        for mode, who in ((0o770, "its group"), (0o707, "others")):
            state = os.path.join(self.dir, "state-%o" % mode)
            os.mkdir(state)
            os.chmod(state, mode)
            err = self.gradd("-s", self.sock, "--state-dir", state)
            self.assertIn("state directory %s is writable by %s (mode %04o)" % (state, who, mode), err)
            self.assertEqual(os.listdir(state), [])

    def test_parent_writable_by_group(self):
        parent = os.path.join(self.dir, "team")
        os.mkdir(parent)
        os.chmod(parent, 0o775)
        err = self.gradd("-s", self.sock, "--state-dir", os.path.join(parent, "state"))
        self.assertIn("state directory: %s is writable by its group (mode 0775), who could replace %s/state" %
                      (parent, parent), err)

    def test_private_and_group_readable_dirs_are_used(self):
        # As StateDirectory= makes them: 0700, or 0750 (readable, not writable).
        for mode in (0o700, 0o750):
            state = os.path.join(self.dir, "ok-%o" % mode)
            os.mkdir(state)
            os.chmod(state, mode)
            d = harness.Daemon("[daemon]\n", args=("--state-dir", state))
            try:
                d.ctl("list")
                self.assertEqual(stat.S_IMODE(os.stat(os.path.join(state, "jobs")).st_mode), 0o700)
                self.assertEqual(stat.S_IMODE(os.stat(os.path.join(state, "lock")).st_mode), 0o600)
            finally:
                self.assertEqual(d.stop(), 0, d.read_log())
                d.cleanup()


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
