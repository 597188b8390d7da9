"""Everyone on a device, in view: the processes in `gradctl status` and the
live `gradctl top`.

A real gradd runs a small GPT on the simulated cpu0; on it the daemon is the
one process, named by the job it runs.  top's frame is read plain (piped,
--once, and two frames at a short interval) and on a pseudo-terminal, where
q must end it at once with the terminal given back.
"""
import fcntl
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import tempfile
import termios
import time
import unittest

import harness
import test_service_user
from harness import GRADCTL, GRADD

# The service test's small GPT, named.
JOB = "[job]\nname = {name}\n" + test_service_user.JOB

# What the name becomes in a terminal: ESC and the bidi override escaped.
EVIL_NAME = "top-\x1b[2J\u202eevil"
EVIL_SHOWN = "top-\\x1b[2J\\u202eevil"


def size_text(n):
    """units_format_size: how gradctl writes a byte count."""
    if n < 1024:
        return str(n)
    v, u = float(n), -1
    while v >= 1024 and u < 4:
        v /= 1024
        u += 1
    unit = "KMGTP"[u]
    if v < 10:
        return "%.2f%s" % (v, unit)
    if v < 100:
        return "%.1f%s" % (v, unit)
    return "%.0f%s" % (v, unit)


class Top(harness.DaemonTest):
    def setUp(self):
        super().setUp()
        self.dir = tempfile.mkdtemp(prefix="gradd-top-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        os.chmod(self.dir, 0o755)
        self.train = os.path.join(self.dir, "corpus.txt")
        harness.write_corpus(self.train)
        self.state = os.path.join(self.d.dir, "state")

    def submit(self, name="toptest"):
        cfg = os.path.join(self.dir, name + ".cfg")
        with open(cfg, "w") as f:
            f.write(JOB.format(name=name, train=self.train, out=os.path.join(self.dir, "out-" + name)))
        r = self.d.ctl("submit", cfg)
        return int(r.stdout.split()[1])

    def wait_running(self, jid, step=1, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            j = self.d.ctl_json("status", str(jid))
            if j["state"] == "running" and j["step"] >= step:
                return j
            time.sleep(0.05)
        self.fail("job %d never ran:\n%s" % (jid, self.d.read_log()))

    def top_once(self):
        r = self.d.ctl("top", "--once")
        self.assertEqual(r.stderr, "")
        self.assertNotIn("\x1b", r.stdout)
        return r.stdout

    # ---- status ----------------------------------------------------------------

    def test_status_names_the_daemon_by_its_jobs(self):
        jid = self.submit()
        self.wait_running(jid)
        st = self.d.ctl_json("status")
        dev = st["devices"][0]
        self.assertEqual(dev["process_note"], "")
        self.assertEqual(len(dev["processes"]), 1, dev)
        p = dev["processes"][0]
        self.assertEqual((p["pid"], p["uid"], p["user"], p["command"], p["jobs"]),
                         (self.d.proc.pid, 0, "root", "gradd", [jid]))
        self.assertEqual(p["used_bytes"], dev["pool_reserved"])
        text = self.d.ctl("status").stdout
        row = [l for l in text.splitlines() if "gradd (job %d)" % jid in l]
        self.assertEqual(len(row), 1, text)
        self.assertEqual(row[0].split()[:3], ["cpu0", str(self.d.proc.pid), "root"], text)
        self.assertTrue(row[0].endswith(size_text(p["used_bytes"])), text)
        # No CUDA device here: no NVML note either (it is the CUDA
        # devices' to say), only why there are none.
        self.assertNotIn("NVML", text)

    # ---- top, plain ----------------------------------------------------------------

    def test_once_frame_matches_stats(self):
        jid = self.submit()
        self.wait_running(jid, step=2)
        self.d.ctl("trim")  # a trim to count, so the figure is not just 0
        before = self.d.ctl_json("status", str(jid))
        stats = self.d.ctl_json("stats")["pools"][0]
        frame = self.top_once()
        after = self.d.ctl_json("status", str(jid))
        stats2 = self.d.ctl_json("stats")["pools"][0]
        lines = frame.splitlines()
        self.assertRegex(lines[0], r"^gradd \S+  pid %d  up \S+  \d\d:\d\d:\d\d  every 1s$" % self.d.proc.pid)

        i = lines.index([l for l in lines if l.startswith("cpu0  cpu (sim)  used ")][0])
        self.assertRegex(lines[i + 1], r"^  \[A+\+*o*\.+\]$")
        self.assertEqual(len(lines[i + 1]), 2 + 2 + 50)
        job_mem = [j for j in stats["jobs"] if j["job"] == jid][0]["allocated"]
        self.assertIn("  A job %d toptest %s " % (jid, size_text(job_mem)), lines[i + 2])
        self.assertTrue(lines[i + 2].endswith("o others 0  . free %s" % size_text(stats["device_free"])), lines[i + 2])
        # Counts are exact; the trim came before both reads.
        self.assertGreaterEqual(stats["trims"], 1)
        self.assertEqual(stats["trims"], stats2["trims"])
        self.assertEqual(lines[i + 3],
                         "  pool: reserved %s  allocated %s  frag %.0f%%  largest free %s  OOMs %d  trims %d"
                         "  trimmed %s" % (size_text(stats["reserved_bytes"]["all"]["current"]),
                                           size_text(stats["allocated_bytes"]["all"]["current"]),
                                           stats["fragmentation"] * 100, size_text(stats["largest_free_block"]),
                                           stats["ooms"], stats["trims"], size_text(stats["trimmed_bytes"])))
        self.assertEqual(lines[i + 4].split(None, 4),
                         ["pid", str(self.d.proc.pid), "root", "gradd", "(job %d)  %s" % (
                             jid, size_text(stats["reserved_bytes"]["all"]["current"]))])

        head = [l for l in lines if l.lstrip().startswith("ID ")][0]
        self.assertEqual(head.split(), ["ID", "USER", "NAME", "STATE", "DEVICE", "STEP", "LOSS", "SPEED",
                                        "MICRO×ACC", "MEM"])
        row = [l for l in lines if re.match(r"^\s*%d  " % jid, l)]
        self.assertEqual(len(row), 1, frame)
        cells = row[0].split()
        self.assertEqual(cells[1:5], ["root", "toptest", "running", "cpu0"])
        step, steps = map(int, cells[5].split("/"))
        self.assertEqual(steps, 1000000)
        self.assertTrue(before["step"] <= step <= after["step"], (before["step"], step, after["step"]))
        self.assertEqual(cells[-2], "2×2")
        self.assertEqual(cells[-1], size_text(job_mem))

    def test_piped_frames_at_an_interval(self):
        jid = self.submit()
        self.wait_running(jid)
        p = subprocess.Popen([GRADCTL, "-s", self.d.sock, "top", "-n", "0.2"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        out = b""
        deadline = time.time() + 10
        while out.count(b"\ngradd ") < 2 and time.time() < deadline:
            r, _, _ = select.select([p.stdout], [], [], 0.5)
            if r:
                out += os.read(p.stdout.fileno(), 65536)
        t0 = time.time()
        p.terminate()
        p.communicate(timeout=5)
        self.assertLess(time.time() - t0, 2)
        self.assertNotIn(b"\x1b", out)
        frames = out.decode().split("\n\ngradd ")
        self.assertGreaterEqual(len(frames), 3, out)
        steps = []
        for fr in frames[:2]:
            self.assertIn("every 0.2s", fr)
            self.assertIn("  A job %d toptest " % jid, fr)
            steps.append(int(re.search(r"(?m)^\s*%d  root  toptest  running  cpu0\s+(\d+)/" % jid, fr).group(1)))
        self.assertLessEqual(steps[0], steps[1])

    def test_names_shown_escaped(self):
        jid = self.submit()
        self.wait_running(jid)
        # Submit refuses such a name; an old record may hold one.
        self.assertEqual(self.d.stop(), 0, self.d.read_log())
        path = os.path.join(self.state, "jobs", str(jid), "state")
        with open(path, "rb") as f:
            text = f.read()
        text, n = re.subn(rb"(?m)^name=.*$", b"name=" + EVIL_NAME.encode(), text)
        self.assertEqual(n, 1)
        with open(path, "wb") as f:
            f.write(text)
        self.d.log = open(self.d.log_path, "a")
        self.d.proc = subprocess.Popen([GRADD, "-c", self.d.conf, "-s", self.d.sock, "--state-dir", self.state],
                                       stdout=self.d.log, stderr=subprocess.STDOUT)
        self.d.wait_ready()
        self.wait_running(jid)
        frame = self.top_once()
        self.assertIn("  A job %d %s " % (jid, EVIL_SHOWN), frame)
        self.assertRegex(frame, r"(?m)^\s*%d  root  %s  running  cpu0 " % (jid, re.escape(EVIL_SHOWN)))
        self.assertNotIn("\u202e", frame)

    def test_bad_options(self):
        for args, msg in ((("-n", "0"),), "-n takes seconds from 0.1 to 3600, not '0'"), \
                         ((("-n", "1x"),), "-n takes seconds from 0.1 to 3600, not '1x'"), \
                         ((("extra",),), "top: unexpected argument 'extra'"):
            r = self.d.ctl("top", *args[0], check=False)
            self.assertEqual(r.returncode, 2, r)
            self.assertIn(msg, r.stderr)
            self.assertEqual(r.stdout, "")

    # ---- top, on a terminal -------------------------------------------------------

    def run_on_pty(self, stop):
        """gradctl top on a pty with a short interval: read a frame, then
        stop(proc, master).  Its output, exit status and seconds to exit."""
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, b"\x18\x00\x64\x00\x00\x00\x00\x00")  # 24 rows, 100 cols
        saved = termios.tcgetattr(slave)
        p = subprocess.Popen([GRADCTL, "-s", self.d.sock, "top", "-n", "0.2"], stdin=slave, stdout=slave,
                             stderr=slave, start_new_session=True, close_fds=True)
        out = b""
        deadline = time.time() + 10
        while out.count(b"\x1b[J") < 2 and time.time() < deadline:
            r, _, _ = select.select([master], [], [], 0.5)
            if r:
                out += os.read(master, 65536)
        self.assertGreaterEqual(out.count(b"\x1b[J"), 2, out)
        # Keys are read unbuffered and unechoed while it runs.
        lflag = termios.tcgetattr(slave)[3]
        self.assertEqual(lflag & (termios.ICANON | termios.ECHO), 0)
        t0 = time.time()
        stop(p, master)
        try:
            code = p.wait(timeout=2)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            self.fail("gradctl top did not stop within 2 s")
        took = time.time() - t0
        while True:
            r, _, _ = select.select([master], [], [], 0.2)
            if not r:
                break
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            out += data
        self.assertEqual(termios.tcgetattr(slave), saved)
        os.close(master)
        os.close(slave)
        return out, code, took

    def test_q_quits_and_restores_the_terminal(self):
        jid = self.submit()
        self.wait_running(jid)
        out, code, took = self.run_on_pty(lambda p, master: os.write(master, b"q"))
        self.assertEqual(code, 0)
        self.assertLess(took, 2)
        self.assertTrue(out.startswith(b"\x1b[?1049h\x1b[?25l"), out[:40])
        self.assertTrue(out.endswith(b"\x1b[?1049l\x1b[?25h"), out[-40:])
        self.assertIn(b"  A job %d toptest " % jid, out)
        # Lines are cut to the terminal's 100 columns.
        for line in out.split(b"\n"):
            shown = re.sub(rb"\x1b\[[?0-9;]*[A-Za-z]", b"", line).rstrip(b"\r")
            self.assertLessEqual(len(shown.decode()), 100, line)

    def test_resize_redraws_at_the_new_size(self):
        def resize_then_quit(p, master):
            fcntl.ioctl(master, termios.TIOCSWINSZ, b"\x0c\x00\x3c\x00\x00\x00\x00\x00")  # 12 rows, 60 cols
            p.send_signal(signal.SIGWINCH)
            time.sleep(0.5)
            os.write(master, b"q")
        out, code, _ = self.run_on_pty(resize_then_quit)
        self.assertEqual(code, 0)
        last = out.split(b"\x1b[H")[-1].split(b"\x1b[J")[0]
        lines = last.split(b"\n")
        self.assertLessEqual(len(lines), 12, last)
        self.assertIn(b"  [", last)
        for line in lines:
            shown = re.sub(rb"\x1b\[[?0-9;]*[A-Za-z]", b"", line).rstrip(b"\r")
            self.assertLessEqual(len(shown.decode()), 60, line)
        bar = [l for l in lines if l.startswith(b"  [")][0]
        self.assertEqual(len(re.sub(rb"\x1b\[[?0-9;]*[A-Za-z]", b"", bar).rstrip(b"\r")), 2 + 2 + 56)

    def test_sigterm_restores_the_terminal(self):
        out, code, _ = self.run_on_pty(lambda p, master: p.send_signal(signal.SIGTERM))
        self.assertEqual(code, 0)
        self.assertTrue(out.endswith(b"\x1b[?1049l\x1b[?25h"), out[-40:])


if __name__ == "__main__":
    harness.main()
