"""A hostile user on a shared server, part of it: what one user submits
(escape sequences, C1 controls, bidi overrides in an output dir, a job
name out of old state) reaches other users escaped, in tables and in JSON;
trimming the shared pools and resetting their peaks are for root and
[daemon] admin_group; a priority above [daemon] max_user_priority is for
them too; and the service unit is hardened to a stated exposure."""
import json
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
import unittest

import harness
import test_service_user
from harness import GRADCTL, GRADD

HOSTILE = "nobody"  # submits the job with the hostile output dir
OTHER = "news"      # an ordinary user who looks at it
ADMIN = "mail"      # in admin_group (its primary group, mail)

# ESC [2J clears the reader's screen, a raw 0x9b byte is a C1 CSI to
# terminals that take 8-bit controls, U+009B the same as a character, and
# U+202E makes the rest of the line read right to left.
EVIL = b"run-\x1b[2J\x9b31m\xc2\x9b1m\xe2\x80\xaegpj.exe"
EVIL_NAME = "old-\x1b]0;pwned\x07\u009b2J\u202eevil"
BIDI = set(range(0x202A, 0x202F)) | set(range(0x2066, 0x206A)) | {0x200E, 0x200F, 0x061C, 0x2028, 0x2029}

# The service test's small GPT, with a name, a priority and a length.
JOB = ("[job]\nname = {name}\npriority = {priority}\n"
       + test_service_user.JOB.replace("steps = 1000000", "steps = {steps}"))


def as_user(name):
    pw = pwd.getpwnam(name)
    return ["setpriv", "--reuid=%d" % pw.pw_uid, "--regid=%d" % pw.pw_gid, "--init-groups"]


@unittest.skipUnless(os.geteuid() == 0 and shutil.which("setpriv"), "needs root and setpriv to act as other users")
class HostilePolicy(unittest.TestCase):
    conf = "[daemon]\nadmin_group = %s\nmax_user_priority = 10\n" % ADMIN

    def setUp(self):
        self.d = harness.Daemon(self.conf)
        self.open_socket()
        self.dir = tempfile.mkdtemp(prefix="gradd-hostile-")
        os.chmod(self.dir, 0o755)
        self.homes = {}
        for user in (HOSTILE, OTHER, ADMIN):
            pw = pwd.getpwnam(user)
            home = os.path.join(self.dir, user)
            os.mkdir(home, 0o755)
            harness.write_corpus(os.path.join(home, "corpus.txt"))
            for p in (home, os.path.join(home, "corpus.txt")):
                os.chown(p, pw.pw_uid, pw.pw_gid)
            self.homes[user] = home

    def tearDown(self):
        code = self.d.stop()
        log = self.d.read_log()
        self.d.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.assertEqual(code, 0, "gradd exited %d:\n%s" % (code, log))

    def open_socket(self):
        # Other users reach the test daemon as they would /run/gradd.
        os.chmod(self.d.dir, 0o711)
        os.chmod(self.d.sock, 0o666)

    def ctl(self, user, *args, check=True):
        """gradctl as `user` (None: root); stdout and stderr as bytes."""
        cmd = (as_user(user) if user else []) + [GRADCTL, "-s", self.d.sock] + list(args)
        r = subprocess.run(cmd, capture_output=True, timeout=60)
        if check and r.returncode != 0:
            self.fail("%s -> %d\n%s\n%s\nlog:\n%s" % (" ".join(cmd), r.returncode, r.stdout, r.stderr,
                                                      self.d.read_log()))
        return r

    def job_file(self, user, priority=0, steps=2, out=None, name="j"):
        home = self.homes[user].encode()
        n = len(os.listdir(home))
        path = os.path.join(home, b"job-%d.cfg" % n)
        out = out or b"out-%d" % n
        text = JOB.format(name=name, priority=priority, steps=steps, train=os.path.join(self.homes[user], "corpus.txt"),
                          out="@OUT@").encode().replace(b"@OUT@", os.path.join(home, out))
        with open(path, "wb") as f:
            f.write(text)
        pw = pwd.getpwnam(user)
        os.chown(path, pw.pw_uid, pw.pw_gid)
        return path

    def wait_state(self, job, states, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            j = json.loads(self.ctl(None, "--json", "status", str(job)).stdout)
            if j["state"] in states:
                return j
            time.sleep(0.05)
        self.fail("job %d never %s:\n%s" % (job, states, self.d.read_log()))

    # ---- escapes ---------------------------------------------------------------

    def assert_clean(self, raw, what):
        """No byte or character in raw acts on a terminal."""
        for i, b in enumerate(raw):
            self.assertTrue(b >= 0x20 and b != 0x7F or b == 0x0A, "%s: byte 0x%02x at %d: %r" % (what, b, i, raw))
        text = raw.decode("utf-8")  # strict: a stray byte fails here
        for ch in text:
            self.assertFalse(0x80 <= ord(ch) <= 0x9F, "%s: C1 U+%04X: %r" % (what, ord(ch), text))
            self.assertNotIn(ord(ch), BIDI, "%s: bidi U+%04X: %r" % (what, ord(ch), text))
        return text

    def test_other_users_see_escapes_escaped(self):
        path = self.job_file(HOSTILE, steps=1000000, out=EVIL)
        self.ctl(HOSTILE, "submit", path)
        self.wait_state(1, ("running",))
        # A record from an older gradd's state may hold a name that submit
        # refuses: its name is put there by hand.
        self.restart_with_name(1, EVIL_NAME)
        self.wait_state(1, ("running",))

        shown = {}
        for args in (("status",), ("list",), ("status", "1")):
            shown[args] = self.assert_clean(self.ctl(OTHER, *args).stdout, " ".join(args))
        detail = shown[("status", "1")]
        self.assertIn("run-\\x1b[2J\\x9b31m\\u009b1m\\u202egpj.exe", detail)
        self.assertIn("  job file    %s\n" % path.decode(), detail)
        escaped_name = "old-\\x1b]0;pwned\\x07\\u009b2J\\u202eevil"
        for args in (("status",), ("list",), ("status", "1")):
            self.assertIn(escaped_name, shown[args], args)
        # Columns are as wide as what they show, escapes included.
        for args in (("status",), ("list",)):
            lines = shown[args].splitlines()
            head = [l for l in lines if l.lstrip().startswith("ID ")][0]
            row = [l for l in lines if escaped_name in l][0]
            self.assertEqual(head.index("STATE"), row.index("running"), shown[args])
            self.assertEqual(head.index("NAME"), row.index("old-"), shown[args])

        for args in (("status", "1"), ("list",)):
            raw = self.ctl(OTHER, "--json", *args).stdout
            self.assert_clean(raw, "--json " + " ".join(args))
            self.assertIn(b"\\u202E", raw)
            self.assertIn(b"\\u009B", raw)
            self.assertIn(b"\\u001B", raw)
            doc = json.loads(raw)
            j = doc if "id" in doc else doc["jobs"][0]
            self.assertEqual(j["name"], EVIL_NAME)
            # The stray byte cannot be JSON text: it is U+FFFD.
            self.assertTrue(j["out_dir"].endswith("run-\x1b[2J\ufffd31m\u009b1m\u202egpj.exe"), j["out_dir"])
        self.ctl(None, "cancel", "1")
        self.wait_state(1, ("cancelled",))
        # The daemon's own log quotes the paths and names escaped too.
        self.assert_clean(self.d.read_log().encode(), "gradd's log")

    def restart_with_name(self, job, name):
        self.assertEqual(self.d.stop(), 0, self.d.read_log())
        state = os.path.join(self.d.dir, "state")
        path = os.path.join(state, "jobs", str(job), "state")
        with open(path, "rb") as f:
            text = f.read()
        text, n = re.subn(rb"(?m)^name=.*$", b"name=" + name.encode().replace(b"\\", b"\\\\"), text)
        self.assertEqual(n, 1, text)
        with open(path, "wb") as f:
            f.write(text)
        self.d.log = open(self.d.log_path, "a")
        self.d.proc = subprocess.Popen([GRADD, "-c", self.d.conf, "-s", self.d.sock, "--state-dir", state],
                                       stdout=self.d.log, stderr=subprocess.STDOUT)
        self.d.wait_ready()
        self.open_socket()

    def test_names_with_bidi_controls_are_refused(self):
        path = self.job_file(OTHER, name="a\u202eb")
        r = self.ctl(OTHER, "submit", path, check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("%s:2: [job] name: contains a bidi control or line separator" % path.decode(),
                      r.stderr.decode())
        r = self.ctl(OTHER, "submit", self.job_file(OTHER), "--name", "a\u2066b", check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn(b"--name must be", r.stderr)

    # ---- what all users share ------------------------------------------------------

    def test_trim_and_reset_peaks_are_for_admins(self):
        for args in (("trim",), ("trim", "-d", "cpu0"), ("stats", "--reset-peaks")):
            r = self.ctl(OTHER, *args, check=False)
            self.assertNotEqual(r.returncode, 0, args)
            err = r.stderr.decode()
            self.assertIn("for root and group '%s' only ([daemon] admin_group)" % ADMIN, err)
            self.assertEqual(r.stdout, b"", args)
        # Plain statistics stay open to everyone.
        self.assertIn(b"Allocated memory", self.ctl(OTHER, "stats").stdout)
        for user in (ADMIN, None):
            self.assertIn(b"cpu0: released", self.ctl(user, "trim").stdout)
            stats = json.loads(self.ctl(user, "--json", "stats", "--reset-peaks").stdout)
            self.assertEqual(stats["pools"][0]["device"], "cpu0")

    def test_priority_ceiling(self):
        # Above the ceiling, from the file or the command line: refused,
        # naming where it came from and the key.
        path = self.job_file(OTHER, priority=11)
        r = self.ctl(OTHER, "submit", path, check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("%s:3: [job] priority: 11 is above 10, the highest that users outside group '%s' may ask "
                      "for ([daemon] max_user_priority)" % (path.decode(), ADMIN), r.stderr.decode())
        r = self.ctl(OTHER, "submit", self.job_file(OTHER), "--priority", "1000", check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("submit: --priority 1000 is above 10", r.stderr.decode())
        self.assertIn("[daemon] max_user_priority", r.stderr.decode())
        self.assertEqual(json.loads(self.ctl(None, "--json", "list").stdout)["jobs"], [])
        # At the ceiling, and above it for root and admin_group: accepted.
        self.assertIn(b"job 1 queued", self.ctl(OTHER, "submit", self.job_file(OTHER, priority=10)).stdout)
        self.assertIn(b"job 2 queued", self.ctl(ADMIN, "submit", self.job_file(ADMIN, priority=500)).stdout)
        self.assertIn(b"job 3 queued", self.ctl(None, "submit", self.job_file(OTHER), "--priority", "1000").stdout)
        jobs = {j["id"]: j for j in json.loads(self.ctl(None, "--json", "list").stdout)["jobs"]}
        self.assertEqual({i: jobs[i]["priority"] for i in jobs}, {1: 10, 2: 500, 3: 1000})
        for i in (1, 2, 3):
            self.wait_state(i, ("completed",))



class UnitHardening(unittest.TestCase):
    @unittest.skipUnless(shutil.which("systemd-analyze"), "needs systemd-analyze")
    def test_exposure_is_at_most_3(self):
        unit = os.environ.get("GRADD_SERVICE_UNIT", "")
        if not os.path.exists(unit):
            self.skipTest("no built gradd.service (GRADD_SERVICE_UNIT)")
        r = subprocess.run(["systemd-analyze", "security", "--help"], capture_output=True, text=True, timeout=30)
        if "--offline" not in r.stdout:
            self.skipTest("this systemd-analyze has no --offline (systemd 250 or later has)")
        r = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", unit],
                           capture_output=True, text=True, timeout=60)
        m = re.search(r"Overall exposure level for gradd\.service: (\d+\.\d+)", r.stdout)
        self.assertIsNotNone(m, r.stdout + r.stderr)
        self.assertLessEqual(float(m.group(1)), 3.0, r.stdout)


if __name__ == "__main__":
    harness.main()
