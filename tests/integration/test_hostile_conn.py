"""A hostile user's connections: answers nobody reads and one user holding
every connection.

Each test does what such a user did on a shared server: asks for a big log
on many connections and never reads, watches a busy job on many connections
and never reads, or opens connections until the daemon says no.  The daemon
must keep its memory bounded (VmRSS from /proc), still deliver what a
reading client asked for, and let other users in."""
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import harness
from harness import GRADCTL, Daemon
import test_jobs

# test_jobs' job (log_every = 1: a change, and a log line, every step) with
# the smallest model: a change every millisecond or so for each watcher.
JOB = test_jobs.JOB
for key, small in (("layers", "1"), ("width", "16"), ("context", "8"), ("batch", "4"), ("micro_batch", "2")):
    JOB = re.sub(r"(?m)^%s = .*$" % key, "%s = %s" % (key, small), JOB, count=1)

KiB, MiB = 1024, 1024 * 1024
SANITIZED = harness.SANITIZED
RSS_NOTE = "RSS bounds are checked without sanitizers only"

# Needs root, to act as other users.
AS_OTHERS = unittest.skipUnless(os.geteuid() == 0 and shutil.which("setpriv"),
                                "needs root and setpriv to act as other users")


def setpriv(user):
    pw = pwd.getpwnam(user)
    return ["setpriv", "--reuid=%d" % pw.pw_uid, "--regid=%d" % pw.pw_gid, "--clear-groups"]


def request(field, body):
    return harness.frame(harness.field_varint(1, harness.PROTOCOL_VERSION) + harness.field_bytes(field, body))


def logs_request(jid):
    return request(25, harness.field_varint(1, jid))


def watch_request(jid):
    return request(24, harness.field_varint(1, jid))


def watch_event(body):
    """(state, final) of a WatchEvent response body."""
    ev = harness.parse_fields(harness.parse_fields(body)[24][0])
    job = harness.parse_fields(ev[1][0])
    return job.get(5, [b""])[0].decode(), bool(ev.get(2, [0])[0])


def small_rcvbuf(s):
    # What the client's kernel takes for it is not the daemon's memory,
    # but a small buffer makes "not reading" bite at once.
    s.setsockopt(harness.socket.SOL_SOCKET, harness.socket.SO_RCVBUF, 4096)
    return s


def rss_peak(d, seconds):
    """The highest VmRSS (KiB) seen over `seconds`."""
    peak, end = 0, time.time() + seconds
    while time.time() < end:
        peak = max(peak, d.rss_kb())
        time.sleep(0.05)
    return peak


class HostileConn(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gradd-hconn-")
        os.chmod(self.dir, 0o755)
        self.train = os.path.join(self.dir, "corpus.txt")
        harness.write_corpus(self.train)
        os.chmod(self.train, 0o644)
        self.d = None
        self.socks = []

    def tearDown(self):
        for s in self.socks:
            s.close()
        if self.d:
            code = self.d.stop()
            log = self.d.read_log()
            self.d.cleanup()
            self.assertEqual(code, 0, "gradd exited %d:\n%s" % (code, log))
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, conf):
        self.d = Daemon(conf)
        # Other users reach the socket as they would a service's.
        os.chmod(self.d.dir, 0o755)
        os.chmod(self.d.sock, 0o666)

    def submit(self, name, steps):
        cfg = os.path.join(self.dir, name + ".cfg")
        with open(cfg, "w") as f:
            f.write(JOB.format(name=name, train=self.train, steps=steps, ckpt=0,
                               out=os.path.join(self.dir, "out-" + name)))
        os.chmod(cfg, 0o644)
        r = self.d.ctl("submit", cfg)
        return int(r.stdout.split()[1])

    def wait(self, jid, pred, what, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            j = self.d.ctl_json("status", str(jid))
            if pred(j):
                return j
            time.sleep(0.05)
        raise AssertionError("job %d: %s never happened:\n%s" % (jid, what, self.d.read_log()))

    def connect(self):
        s = small_rcvbuf(harness.connect(self.d.sock))
        self.socks.append(s)
        return s

    # ---- logs: 20 clients ask for a 32 MiB log and never read ----------------

    def test_logs_not_read_stay_bounded(self):
        self.start("[daemon]\nmax_jobs_per_device = 1\n")
        jid = self.submit("biglog", steps=2)
        self.wait(jid, lambda j: j["state"] == "completed", "completion")
        # The job's own log, grown to 32 MiB of plain lines (as log_every = 1
        # makes one in the hours of a long job).
        path = os.path.join(self.d.dir, "state", "jobs", str(jid), "log")
        line = b"step 123456/999999 loss 1.2345 lr 3.00e-03 norm 0.123 41234 tok/s micro 2x2 mem 1.2M/4.0G\n"
        with open(path, "wb") as f:
            f.write(line * ((32 * MiB) // len(line)))
        size = os.path.getsize(path)
        time.sleep(0.3)
        base = self.d.rss_kb()
        n = 20
        for _ in range(n):
            self.connect().sendall(logs_request(jid))
        peak = rss_peak(self.d, 2.0)
        grown = peak - base
        print("logs: %d clients x %d MiB log not read: RSS %d -> %d KiB (+%d KiB)"
              % (n, size // MiB, base, peak, grown), file=sys.stderr)
        if not SANITIZED:
            # The whole answers would be 640 MiB; each connection may hold
            # two 256 KiB chunks in the daemon, 10 MiB for all 20.
            self.assertLess(grown, 48 * 1024, "RSS grew by %d KiB" % grown)
        # The daemon still serves, and a client that reads gets every byte.
        self.assertEqual(self.d.ctl("status").returncode, 0)
        r = subprocess.run([GRADCTL, "-s", self.d.sock, "logs", str(jid)], capture_output=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(path, "rb") as f:
            self.assertEqual(r.stdout, f.read())
        # A client that starts reading late still gets the whole log.
        s = self.socks[0]
        got, last = 0, False
        s.settimeout(60)
        while not last:
            lr = harness.parse_fields(harness.parse_fields(harness.recv_frame(s))[25][0])
            got += len(lr.get(1, [b""])[0])
            last = bool(lr.get(2, [0])[0])
        self.assertEqual(got, size)

    # ---- watch: 100 clients watch a busy job and never read ---------------

    def test_watchers_not_reading_are_coalesced(self):
        self.start("[daemon]\nmax_jobs_per_device = 1\nmax_clients_per_user = 200\n")
        jid = self.submit("busy", steps=10000000)
        self.wait(jid, lambda j: j["state"] == "running" and j["step"] >= 20, "step 20")
        time.sleep(0.3)
        base = self.d.rss_kb()
        m = 100
        for _ in range(m):
            self.connect().sendall(watch_request(jid))
        step0 = self.d.ctl_json("status", str(jid))["step"]
        peak = rss_peak(self.d, 3.0)
        steps = self.d.ctl_json("status", str(jid))["step"] - step0
        grown = peak - base
        print("watch: %d watchers not reading over %d steps: RSS %d -> %d KiB (+%d KiB)"
              % (m, steps, base, peak, grown), file=sys.stderr)
        self.assertGreater(steps, 100, "the job made too few changes to test anything")
        if not SANITIZED:
            # Each watcher holds at most one event (~1 KiB) beyond what its
            # socket took; a queue per watcher grows by MiBs a second.
            self.assertLess(grown, 16 * 1024, "RSS grew by %d KiB" % grown)
        # A reading watcher still sees the end, and so do the ones that
        # did not read: their last event is the final one.
        w = subprocess.Popen([GRADCTL, "-s", self.d.sock, "watch", str(jid)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        time.sleep(0.3)
        self.d.ctl("cancel", str(jid))
        out, err = w.communicate(timeout=60)
        self.assertEqual(w.returncode, 1, err)  # the job did not complete
        self.assertIn("cancelled", out.splitlines()[-1])
        for s in self.socks[:5]:
            s.settimeout(30)
            state, final = None, False
            while not final:
                state, final = watch_event(harness.recv_frame(s))
            self.assertEqual(state, "cancelled")

    # ---- one user holds every connection it may --------------------------------

    def harness_for_others(self):
        """A directory other users can import harness from: the checkout
        may be where they cannot read (under /root, 0700)."""
        shutil.copy(harness.__file__, self.dir)
        os.chmod(os.path.join(self.dir, "harness.py"), 0o644)
        return self.dir

    def hold_as(self, user, n, jid):
        """As `user`: n watch connections on job jid, then one more.  Returns
        the process (holding them until its stdin closes) and what the last
        connection got: "accepted" or the daemon's error message."""
        script = (
            "import sys; sys.path.insert(0, %r)\n"
            "import harness\n"
            "socks = []\n"
            "for _ in range(%d):\n"
            "    s = harness.connect(%r, timeout=20)\n"
            "    s.sendall(%r)\n"
            "    b = harness.recv_frame(s)\n"
            "    assert b is not None and harness.error_message(b) is None, b\n"
            "    socks.append(s)\n"
            "s = harness.connect(%r, timeout=20)\n"
            "try:\n"
            "    s.sendall(harness.frame(harness.status_request()))\n"
            "except BrokenPipeError:\n"
            "    pass  # refused: the answer says why\n"
            "b = harness.recv_frame(s)\n"
            "print(harness.error_message(b) if b and harness.error_message(b) else 'accepted', flush=True)\n"
            "sys.stdin.read()\n"
        ) % (self.harness_for_others(), n, self.d.sock, watch_request(jid), self.d.sock)
        p = subprocess.Popen(setpriv(user) + [sys.executable, "-c", script], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(p.kill)
        line = p.stdout.readline().strip()
        if not line:
            p.kill()
            raise AssertionError("%s's connections: %s\n%s" % (user, p.stderr.read(), self.d.read_log()))
        return p, line

    def ctl_as(self, user, *args):
        return subprocess.run(setpriv(user) + [GRADCTL, "-s", self.d.sock] + list(args), capture_output=True,
                              text=True, timeout=30)

    @AS_OTHERS
    def test_one_user_cannot_lock_out_the_others(self):
        self.start("[daemon]\nmax_clients = 32\nmax_clients_per_user = 4\n")
        jid = self.submit("watched", steps=10000000)
        # nobody's four watches are all it may hold; the fifth is refused
        # naming the key.
        p, got = self.hold_as("nobody", 4, jid)
        self.assertIn("[daemon] max_clients_per_user = 4", got)
        self.assertIn("uid %d" % pwd.getpwnam("nobody").pw_uid, got)
        # Another user, and root, still get in meanwhile.
        r = self.ctl_as("daemon", "status")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.d.ctl("status").returncode, 0)
        # root is bounded by max_clients only.
        for _ in range(6):
            s = self.connect()
            s.sendall(harness.frame(harness.status_request()))
            self.assertIsNone(harness.error_message(harness.recv_frame(s)))
        # Once nobody lets go, it gets in again.
        p.stdin.close()
        p.wait(timeout=30)
        deadline = time.time() + 10
        while True:
            r = self.ctl_as("nobody", "status")
            if r.returncode == 0 or time.time() > deadline:
                break
            time.sleep(0.05)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("max_clients_per_user", self.d.read_log())
        self.d.ctl("cancel", str(jid))

    @AS_OTHERS
    def test_last_slots_are_kept_for_admins(self):
        # A per-user limit as large as max_clients: one user fills what
        # others may use; the last slot of 8 is kept for root and admin_group.
        self.start("[daemon]\nmax_clients = 8\nmax_clients_per_user = 8\n")
        jid = self.submit("watched", steps=10000000)
        p, got = self.hold_as("nobody", 7, jid)
        self.assertIn("[daemon] max_clients (8)", got)
        r = self.ctl_as("daemon", "status")
        self.assertEqual(r.returncode, 1)
        self.assertIn("[daemon] max_clients (8)", r.stderr)
        r = self.d.ctl("status")
        self.assertEqual(r.returncode, 0, r.stderr)
        p.stdin.close()
        p.wait(timeout=30)
        self.d.ctl("cancel", str(jid))


if __name__ == "__main__":
    harness.main()
