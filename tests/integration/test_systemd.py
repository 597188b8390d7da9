"""gradd under systemd, without a running systemd: the units verify, the
daemon serves a socket passed by systemd-socket-activate, and a test
NOTIFY_SOCKET receives READY, STATUS, WATCHDOG, STOPPING and the stop
timeout extension."""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
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


if __name__ == "__main__":
    harness.main()
