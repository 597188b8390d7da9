"""gradctl against a real gradd: a daemon that hangs up mid-request, text
from the daemon that is not safe for a terminal or not UTF-8, and small
things on the command line."""
import json
import os
import shutil
import subprocess
import tempfile
import time

import harness
from harness import GRADCTL, DaemonTest

JOB = """
[job]
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
train = corpus.txt
val_fraction = 0.1
[train]
steps = {steps}
batch = 4
micro_batch = 4
lr = 3e-3
warmup = 1
threads = 1
eval_every = 0
eval_batches = 1
[output]
dir = out
checkpoint_every = 0
log_every = 1
"""


def write_job(dirpath, name="client", steps=2, pad_to=0):
    """A job file in dirpath that trains on dirpath/corpus.txt and writes to
    dirpath/out: both relative, so the job's paths carry dirpath's bytes.
    pad_to: grow the file to that many bytes with comment lines."""
    harness.write_corpus(os.path.join(dirpath, b"corpus.txt" if isinstance(dirpath, bytes) else "corpus.txt"))
    cfg = os.path.join(dirpath, b"job.cfg" if isinstance(dirpath, bytes) else "job.cfg")
    with open(cfg, "w") as f:
        f.write(JOB.format(name=name, steps=steps))
        line = "# " + "padding " * 16 + "\n"
        while f.tell() < pad_to:
            f.write(line)
    return cfg


def ctl_bytes(d, *args):
    """gradctl with bytes arguments and bytes output: the tests below look
    at exactly what would reach a terminal."""
    return subprocess.run([os.fsencode(GRADCTL), b"-s", os.fsencode(d.sock)] + [os.fsencode(a) for a in args],
                          capture_output=True, timeout=60)


class TempDir(DaemonTest):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gradd-client-")
        os.chmod(self.tmp, 0o755)
        super().setUp()

    def tearDown(self):
        # DaemonTest's own, but reading a log that quotes the paths below,
        # which are not all UTF-8.
        code = self.d.stop()
        with open(self.d.log_path, errors="backslashreplace") as f:
            log = f.read()
        self.d.cleanup()
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.assertEqual(code, 0, "gradd exited %d:\n%s" % (code, log))

    def wait_final(self, jid, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            j = self.d.ctl_json("status", str(jid))
            if j["state"] in ("completed", "failed", "cancelled"):
                return j
            time.sleep(0.05)
        raise AssertionError("job %d did not finish" % jid)


# ---- a daemon that hangs up before taking the whole request ------------------

class HangUp(TempDir):
    conf = "[daemon]\nclient_timeout = 60s\nmax_frame = 64K\n"

    def test_oversized_request_shows_the_daemons_reason(self):
        # Far more than the socket buffers hold: gradctl is still writing
        # when the daemon answers "too big" and closes.  It used to die of
        # SIGPIPE (exit 141 from a shell), saying nothing.
        cfg = write_job(self.tmp, pad_to=900 * 1024)
        r = self.d.ctl("submit", cfg, check=False)
        self.assertNotEqual(r.returncode, -13, "killed by SIGPIPE")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("max_frame", r.stderr)
        # The daemon is fine and still answers.
        self.assertEqual(self.d.ctl_json("list")["jobs"], [])


class MaxClients(DaemonTest):
    conf = "[daemon]\nclient_timeout = 60s\nmax_clients = 2\n"

    def test_refused_connection_says_why(self):
        held = []
        try:
            # Two connections the daemon has surely accepted: each has had
            # an answer.
            for _ in range(2):
                s = harness.connect(self.d.sock)
                s.sendall(harness.frame(harness.status_request()))
                self.assertIsNotNone(harness.recv_frame(s))
                held.append(s)
            # Whether gradctl's request is written before the daemon closes
            # the refused connection is a race, lost often enough (SIGPIPE)
            # that a few tries see both sides of it.  The daemon says why
            # before it closes; a client that lost the race to read it
            # still says the connection was closed.
            told = 0
            for _ in range(25):
                r = self.d.ctl("list", check=False)
                self.assertNotEqual(r.returncode, -13, "killed by SIGPIPE")
                if r.returncode == 1:
                    self.assertIn("gradd is serving as many clients as its [daemon] max_clients (2); try again later", r.stderr)
                    told += 1
                else:
                    self.assertEqual(r.returncode, 3, r.stderr)
                    self.assertIn(self.d.sock, r.stderr)
                    self.assertIn("closed the connection", r.stderr)
            self.assertGreater(told, 0)
        finally:
            for s in held:
                s.close()
        # With the two gone, gradctl gets in again.
        deadline = time.time() + 10
        while self.d.ctl("list", check=False).returncode != 0:
            self.assertLess(time.time(), deadline, "the daemon never took a client again")
            time.sleep(0.05)


# ---- text from the daemon ------------------------------------------------------

class UnsafeText(TempDir):
    """A job whose paths hold an ESC sequence, a BEL and a byte that is not
    UTF-8: the daemon refuses such names now, but paths (and old state) can
    still carry them, so gradctl has to be safe on its own.  The job fails
    on its missing corpus, so that its reason and its log quote them too."""

    def setUp(self):
        super().setUp()
        # A job that holds the device, so that the other one's corpus can
        # go after the check at submit and before it starts.
        os.mkdir(os.path.join(self.tmp, "blocker"))
        blocker = write_job(os.path.join(self.tmp, "blocker"), name="blocker", steps=1000000)
        bid = self.d.ctl("submit", blocker).stdout.split()[1]
        self.jobdir = os.path.join(os.fsencode(self.tmp), b"red\x1b[31m\x07\xff-dir")
        os.mkdir(self.jobdir)
        os.chmod(self.jobdir, 0o755)
        cfg = write_job(self.jobdir, name="caf\u00e9", steps=2)
        r = ctl_bytes(self.d, "submit", cfg)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.jid = int(r.stdout.split()[1])
        os.unlink(os.path.join(self.jobdir, b"corpus.txt"))
        self.d.ctl("cancel", bid)
        self.assertEqual(self.wait_final(self.jid)["state"], "failed")

    def assert_terminal_safe(self, out):
        self.assertNotIn(b"\x1b", out)
        self.assertNotIn(b"\x07", out)
        out.decode("utf-8")  # strict: raises on a byte that is not UTF-8

    def test_json_is_utf8_with_replacement(self):
        for args in (("list",), ("status", str(self.jid)), ("watch", str(self.jid))):
            r = ctl_bytes(self.d, "--json", *args)
            self.assertEqual(r.returncode, 1 if args[0] == "watch" else 0, r.stderr)  # watch: the job failed
            self.assertNotIn(b"\x1b", r.stdout)
            doc = json.loads(r.stdout.decode("utf-8"))
            jobs = doc["jobs"] if "jobs" in doc else [doc.get("job", doc)]
            job = [j for j in jobs if j["id"] == self.jid][0]
            # Controls survive as \u escapes; the stray byte is U+FFFD.
            self.assertIn("red\x1b[31m\x07\ufffd-dir", job["job_file"], args)
            self.assertIn("red\x1b[31m\x07\ufffd-dir", job["out_dir"], args)
            self.assertIn("red\x1b[31m\x07\ufffd-dir/corpus.txt", job["reason"], args)
            self.assertEqual(job["name"], "caf\u00e9")
        r = ctl_bytes(self.d, "--json", "logs", str(self.jid))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("red\x1b[31m\x07\ufffd-dir", json.loads(r.stdout.decode("utf-8"))["log"])

    def test_text_escapes_controls_and_bad_bytes(self):
        shown = b"red\\x1b[31m\\x07\\xff-dir"
        r = ctl_bytes(self.d, "status", str(self.jid))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assert_terminal_safe(r.stdout)
        self.assertIn(b"out dir     " + os.fsencode(self.tmp) + b"/" + shown + b"/out\n", r.stdout)
        self.assertIn(b"reason      " + os.fsencode(self.tmp) + b"/" + shown + b"/corpus.txt", r.stdout)
        self.assertIn("job %d  caf\u00e9" % self.jid, r.stdout.decode())
        r = ctl_bytes(self.d, "watch", str(self.jid))
        self.assertEqual(r.returncode, 1, r.stderr)  # the job failed
        self.assert_terminal_safe(r.stdout)
        self.assertIn(shown, r.stdout)
        r = ctl_bytes(self.d, "logs", str(self.jid))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assert_terminal_safe(r.stdout)
        self.assertIn(shown, r.stdout)
        self.assertGreaterEqual(r.stdout.count(b"\n"), 2, r.stdout)  # a log is lines: those stay lines
        for args in (("list",), ("status",)):
            r = ctl_bytes(self.d, *args)
            self.assertEqual(r.returncode, 0, (args, r.stderr))
            self.assert_terminal_safe(r.stdout)
        # A daemon error that quotes the path: on stderr, made safe too.
        out = os.path.join(self.jobdir, b"out")
        shutil.rmtree(out, ignore_errors=True)
        with open(out, "w"):
            pass
        harness.write_corpus(os.path.join(self.jobdir, b"corpus.txt"))
        r = ctl_bytes(self.d, "submit", os.path.join(self.jobdir, b"job.cfg"))
        self.assertNotEqual(r.returncode, 0)
        self.assert_terminal_safe(r.stderr)

    def test_table_aligns_by_characters(self):
        # "café" is 5 bytes and 4 characters: columns after it line up with
        # their headings on the screen, not in bytes.
        out = ctl_bytes(self.d, "list").stdout.decode()
        head = out.splitlines()[0]
        row = [l for l in out.splitlines() if "caf\u00e9" in l][0]
        self.assertEqual(row.index("failed"), head.index("STATE"), out)


# ---- small things ---------------------------------------------------------------

class CommandLine(TempDir):
    def test_negative_id_is_a_bad_id(self):
        for cmd in ("sample", "status", "watch", "logs", "cancel", "rm"):
            r = self.d.ctl(cmd, "-1", check=False)
            self.assertEqual(r.returncode, 2, (cmd, r.stderr))
            self.assertIn("'-1' is not a job id", r.stderr, cmd)
            self.assertNotIn("invalid option", r.stderr, cmd)
        # Option values that look negative are still the options' own.
        r = self.d.ctl("sample", "--seed", "-1", "5", check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--seed", r.stderr)

    def test_piped_watch_prints_the_last_step_once(self):
        cfg = write_job(self.tmp, steps=3)
        jid = int(self.d.ctl("submit", cfg).stdout.split()[1])
        r = self.d.ctl("watch", str(jid))  # not a tty: one line per event
        lines = r.stdout.splitlines()
        self.assertEqual(lines[-1].split(":")[0], "job %d completed" % jid, r.stdout)
        last = [l for l in lines if l.startswith("step 3/3")]
        self.assertEqual(len(last), 1, r.stdout)


if __name__ == "__main__":
    harness.main()
