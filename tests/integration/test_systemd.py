"""gradd under systemd, without a running systemd: the units verify, the
daemon serves a socket passed by systemd-socket-activate, a test
NOTIFY_SOCKET receives READY, STATUS, WATCHDOG, STOPPING and the stop
timeout extension, and logging picks the journal only when stderr is it."""
import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

import harness
from harness import GRADCTL, GRADD

ROOT = os.environ["GRADD_SOURCE_ROOT"]
BUILD_UNIT = os.environ.get("GRADD_SERVICE_UNIT", "")


class Systemd(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gradd-sd-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    @unittest.skipUnless(shutil.which("systemd-analyze"), "needs systemd-analyze")
    def test_units_verify(self):
        # The built unit, with ExecStart pointing at this build's gradd (the
        # installed path does not exist here).
        with open(BUILD_UNIT) as f:
            unit = f.read()
        exec_line = [l for l in unit.splitlines() if l.startswith("ExecStart=")][0]
        unit = unit.replace(exec_line, "ExecStart=%s -c %s/etc/gradd.conf" % (GRADD, ROOT))
        with open(os.path.join(self.dir, "gradd.service"), "w") as f:
            f.write(unit)
        shutil.copy(os.path.join(ROOT, "systemd", "gradd.socket"), self.dir)
        r = subprocess.run(["systemd-analyze", "verify", "--man=no",
                            os.path.join(self.dir, "gradd.service"), os.path.join(self.dir, "gradd.socket")],
                           capture_output=True, text=True, timeout=60)
        # Complaints about this machine (no gradd user, no running systemd
        # manager) are not about the units; anything naming them is.
        problems = [l for l in (r.stdout + r.stderr).splitlines()
                    if "gradd." in l and "user" not in l.lower() and "group" not in l.lower()]
        self.assertEqual(problems, [], r.stdout + r.stderr)

    def test_state_directory(self):
        # gradd.service passes no --state-dir: StateDirectory= (systemd's
        # $STATE_DIRECTORY, its first entry) is the default, and
        # [daemon] state_dir in gradd.conf still wins over it.
        def state_dir(conf, env):
            cpath = os.path.join(self.dir, "g.conf")
            with open(cpath, "w") as f:
                f.write(conf)
            r = subprocess.run([GRADD, "-c", cpath, "-s", os.path.join(self.dir, "s.sock"), "--check-config"],
                               env=dict(os.environ, **env), capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 0, r.stderr)
            return [l.split(" ", 1)[1] for l in r.stdout.splitlines() if l.startswith("state_dir ")][0]

        self.assertEqual(state_dir("", {"STATE_DIRECTORY": "/var/lib/gradd:/var/lib/other"}), "/var/lib/gradd")
        self.assertEqual(state_dir("[daemon]\nstate_dir = /data/gradd\n", {"STATE_DIRECTORY": "/var/lib/gradd"}),
                         "/data/gradd")
        with open(BUILD_UNIT) as f:
            self.assertNotIn("--state-dir", [l for l in f.read().splitlines() if l.startswith("ExecStart=")][0])

    @unittest.skipUnless(shutil.which("systemd-socket-activate"), "needs systemd-socket-activate")
    def test_socket_activation(self):
        sock = os.path.join(self.dir, "activated.sock")
        log = open(os.path.join(self.dir, "log"), "w")
        p = subprocess.Popen(["systemd-socket-activate", "-l", sock, GRADD, "--state-dir",
                              os.path.join(self.dir, "state")], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 20
            while not os.path.exists(sock) and time.time() < deadline:
                time.sleep(0.02)
            # The first connection starts gradd on the passed socket.
            r = subprocess.run([GRADCTL, "-s", sock, "--json", "status"], capture_output=True, text=True,
                               timeout=60)
            if r.returncode != 0:
                with open(os.path.join(self.dir, "log")) as f:
                    self.fail(r.stderr + f.read())
            self.assertIn('"devices"', r.stdout)
            p.send_signal(signal.SIGTERM)
            self.assertEqual(p.wait(timeout=30), 0)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
        with open(os.path.join(self.dir, "log")) as f:
            text = f.read()
        self.assertIn("listening on %s" % sock, text)

    def test_notify_protocol(self):
        path = os.path.join(self.dir, "notify")
        rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        rx.bind(path)
        rx.settimeout(20)
        env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC="400000")
        sock = os.path.join(self.dir, "g.sock")
        p = subprocess.Popen([GRADD, "-s", sock, "--state-dir", os.path.join(self.dir, "state")], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        got = []
        try:
            def until(pred, what):
                deadline = time.time() + 20
                while time.time() < deadline:
                    msg = rx.recv(4096).decode()
                    got.append(msg)
                    if pred(msg):
                        return msg
                raise AssertionError("no %s; got %r" % (what, got))

            ready = until(lambda m: "READY=1" in m, "READY=1")
            self.assertIn("STATUS=serving on %s" % sock, ready)
            # READY comes only once the socket listens.
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(sock)
            s.close()
            until(lambda m: m.startswith("STATUS=") and "running" in m, "a STATUS summary")
            # Pings at least every half interval while nothing is stuck.
            t0 = time.time()
            until(lambda m: m == "WATCHDOG=1", "WATCHDOG=1")
            until(lambda m: m == "WATCHDOG=1", "a second WATCHDOG=1")
            self.assertLess(time.time() - t0, 2.0)
            p.send_signal(signal.SIGTERM)
            until(lambda m: "STOPPING=1" in m, "STOPPING=1")
            until(lambda m: "EXTEND_TIMEOUT_USEC=" in m, "EXTEND_TIMEOUT_USEC")
            self.assertEqual(p.wait(timeout=30), 0)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            rx.close()

    def watched(self, text, model, batch, interval, hooks=False):
        """A notify socket and a gradd reporting to it with the watchdog at
        `interval` seconds, running (once submitted) a long job: a GPT with
        the [model] lines `model`, fixed micro-batch `batch`, one thread,
        on `text` repeated.  Returns (proc, rx, ctl, job path, log path, out
        dir); everything is stopped and closed at the test's end."""
        path = os.path.join(self.dir, "notify")
        rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        rx.bind(path)
        rx.settimeout(0.2)
        self.addCleanup(rx.close)
        corpus = os.path.join(self.dir, "corpus.txt")
        with open(corpus, "w") as f:
            f.write(text * (50000 // len(text) + 1))
        out = os.path.join(self.dir, "out")
        job = os.path.join(self.dir, "long.cfg")
        with open(job, "w") as f:
            f.write("[model]\ntype = gpt\n%s\n[data]\nformat = text\ntrain = %s\n[train]\nsteps = 1000000\n"
                    "batch = %d\nmicro_batch = %d\nthreads = 1\neval_every = 0\n[output]\ndir = %s\n"
                    "checkpoint_every = 0\n" % (model, corpus, batch, batch, out))
        env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC=str(int(interval * 1e6)))
        sock = os.path.join(self.dir, "g.sock")
        log_path = os.path.join(self.dir, "log")
        log = open(log_path, "w")
        self.addCleanup(log.close)
        p = subprocess.Popen([GRADD, "-s", sock, "--state-dir", os.path.join(self.dir, "state")] +
                             (["--test-hooks"] if hooks else []), env=env, stdout=log, stderr=subprocess.STDOUT)

        def stop():
            if p.poll() is None:
                p.kill()
                p.wait()

        self.addCleanup(stop)

        def ctl(*args):
            r = subprocess.run([GRADCTL, "-s", sock] + list(args), capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            return r.stdout

        deadline = time.time() + 20
        while not os.path.exists(sock) and time.time() < deadline:
            time.sleep(0.02)
        return p, rx, ctl, job, log_path, out

    def test_hung_job_thread_stops_watchdog(self):
        # A job runs and beats; then its thread hangs (test hook): WATCHDOG=1
        # stops within the interval while STATUS= lines go on, and the log
        # names the job and device.  Released, SIGTERM gets it out cleanly
        # (a thread still hung is test_hostile_files' case).
        p, rx, ctl, job, log_path, _ = self.watched("a hung thread must not look alive to systemd.\n",
                                                    "layers = 1\nheads = 1\nwidth = 16\ncontext = 8", 2, 0.4,
                                                    hooks=True)

        def collect(seconds):
            out, end = [], time.time() + seconds
            while time.time() < end:
                try:
                    out.append(rx.recv(4096).decode())
                except socket.timeout:
                    pass
            return out

        ctl("submit", job)
        deadline = time.time() + 30
        while '"state":"running"' not in ctl("--json", "status", "1").replace(" ", ""):
            self.assertLess(time.time(), deadline, "the job never ran")
            time.sleep(0.05)
        # Busy and beating: pings keep coming.
        before = collect(1.2)
        self.assertGreaterEqual(before.count("WATCHDOG=1"), 2, before)
        self.assertIn("1 busy", ctl("test-hang", "cpu0"))
        # The thread stops at its next poll; within one interval
        # (0.4 s) the pings stop.  Then a long quiet window.
        collect(1.0)
        after = collect(1.5)
        self.assertNotIn("WATCHDOG=1", after)
        self.assertTrue([m for m in after if m.startswith("STATUS=1 running")], after)
        # The daemon itself still answers.
        self.assertIn('"state":"running"', ctl("--json", "status", "1").replace(" ", ""))
        # Released, it beats again and the pings resume.
        ctl("test-hang", "--release", "cpu0")
        self.assertIn("WATCHDOG=1", collect(1.5))
        ctl("test-hang", "cpu0")
        collect(1.0)
        ctl("test-hang", "--release", "cpu0")
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=60), 0)
        with open(log_path) as f:
            text = f.read()
        self.assertIn("job 1 on cpu0 has made no progress for 400ms; watchdog pings stopped", text)

    def test_long_micro_batch_beats_and_cancels(self):
        # One micro-batch takes several watchdog intervals (a 96-layer GPT,
        # 24 sequences of 128 bytes, one thread): the job thread polls
        # between layers, so the pings go on through it, and a cancel ends
        # the job in the middle of a step instead of at its end.
        # Many thin layers rather than a few thick ones: a step is as long,
        # but the polls come about 190 times a step (97 layers each way),
        # so the longest gap between two stays a small part of an interval
        # even where one thread runs a step for 20 s on a loaded machine;
        # under the sanitizers' unoptimised build every op is slower: a
        # longer interval and a smaller batch keep the same proportions.
        sanitized = harness.SANITIZED
        interval, batch = (2.0, 8) if sanitized else (1.0, 24)
        p, rx, ctl, job, log_path, out = self.watched(
            "a long step is not a hung thread, and a cancel need not wait for it.\n",
            "layers = 96\nheads = 4\nwidth = 128\ncontext = 128", batch, interval)

        def steps():
            try:
                with open(os.path.join(out, "metrics.jsonl")) as f:
                    return [json.loads(line) for line in f if '"loss"' in line]
            except FileNotFoundError:
                return []

        # Read the notifications all along, as systemd does: a full
        # datagram queue would block the daemon's loop in sd_notify.
        pings, reading = [], [True]

        def read():
            while reading[0]:
                try:
                    if rx.recv(4096) == b"WATCHDOG=1":
                        pings.append(time.time())
                except socket.timeout:
                    pass

        reader = threading.Thread(target=read)
        reader.start()
        try:
            ctl("submit", job)
            deadline = time.time() + 120
            while not steps():
                self.assertLess(time.time(), deadline, "no step in 120 s")
                time.sleep(0.05)
            # (The first step is slower: it faults in its fresh memory.)
            start = time.time()
            while len(steps()) < 2:
                time.sleep(0.05)
            step_s = steps()[1]["step_ms"] / 1000
            self.assertGreater(step_s, 2.5 * interval, "a step must outlast several watchdog intervals")
            # Through whole steps: pings at least every other interval.
            time.sleep(2 * step_s)
            seen = [t for t in pings if t >= start]
            gaps = [b - a for a, b in zip(seen, seen[1:])]
            self.assertGreaterEqual(len(seen), 3, seen)
            self.assertLess(max(gaps), 3 * interval, gaps)
            # A cancel half-way through a step: cancelled well before the
            # step could have ended, and the step is not applied.
            n = len(steps())
            while len(steps()) == n:
                time.sleep(0.01)
            time.sleep(step_s / 4)
            t0 = time.time()
            ctl("cancel", "1")
            while '"state":"cancelled"' not in ctl("--json", "status", "1").replace(" ", ""):
                self.assertLess(time.time() - t0, 60)
                time.sleep(0.02)
            took = time.time() - t0
            self.assertLess(took, step_s / 2, "cancel took %.2f s, a step %.2f s" % (took, step_s))
            self.assertEqual(len(steps()), n + 1)
            p.send_signal(signal.SIGTERM)
            self.assertEqual(p.wait(timeout=60), 0)
        finally:
            reading[0] = False
            reader.join()
        # No stall reported since the first step was done.
        with open(log_path) as f:
            for line in f:
                if "made no progress" in line:
                    stamp = line.split()[0]
                    when = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ")
                    when = when.replace(tzinfo=datetime.timezone.utc).timestamp()
                    self.assertLess(when, start, line)


# A plain stderr line: "2024-05-01T12:00:00.123Z gradd info: ...".
PLAIN = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z gradd (error|warning|info|debug): ")


class Logging(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gradd-log-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def run_gradd(self, conf, env):
        """Start gradd with `conf` and `env`, stop it once it listens, and
        return what it wrote to stderr."""
        cpath = os.path.join(self.dir, "gradd.conf")
        with open(cpath, "w") as f:
            f.write(conf)
        sock = os.path.join(self.dir, "g.sock")
        err_path = os.path.join(self.dir, "stderr")
        with open(err_path, "w") as err:
            p = subprocess.Popen([GRADD, "-c", cpath, "-s", sock, "--state-dir", os.path.join(self.dir, "state")],
                                 env=dict(os.environ, **env), stdout=subprocess.DEVNULL, stderr=err)
            try:
                deadline = time.time() + 20
                while not os.path.exists(sock) and time.time() < deadline and p.poll() is None:
                    time.sleep(0.02)
                p.send_signal(signal.SIGTERM)
                self.assertEqual(p.wait(timeout=30), 0)
            finally:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        with open(err_path) as f:
            return f.read()

    def test_inherited_journal_stream_keeps_stderr_plain(self):
        # JOURNAL_STREAM names a stream that is not our stderr (a parent's,
        # inherited): auto must not switch to the journal.
        st = os.stat(self.dir)
        text = self.run_gradd("", {"JOURNAL_STREAM": "%d:%d" % (st.st_dev, st.st_ino)})
        lines = text.splitlines()
        self.assertTrue(any("listening on" in l for l in lines), text)
        for l in lines:
            self.assertRegex(l, PLAIN)

    @unittest.skipIf(os.path.exists("/run/systemd/journal/socket"), "a journald is listening here")
    def test_journal_target_without_journald_falls_back(self):
        # log_target = journal with no journald to take the entries: every
        # line still reaches stderr, plain.
        text = self.run_gradd("[daemon]\nlog_target = journal\n", {})
        self.assertIn("listening on", text)
        self.assertIn("stopped", text)
        for l in text.splitlines():
            self.assertRegex(l, PLAIN)

    def test_bad_log_target(self):
        cpath = os.path.join(self.dir, "gradd.conf")
        with open(cpath, "w") as f:
            f.write("[daemon]\nlog_target = syslog\n")
        r = subprocess.run([GRADD, "-c", cpath, "--check-config"], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("gradd.conf:2: [daemon] log_target: 'syslog' is not one of auto|journal|stderr", r.stderr)


if __name__ == "__main__":
    harness.main()
