"""gradd and gradctl end to end: status, exit codes, socket lifecycle, config errors."""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import harness
from harness import GRADCTL, GRADD, Daemon, DaemonTest


class Status(DaemonTest):
    def test_text(self):
        r = self.d.ctl("status")
        out = r.stdout
        self.assertRegex(out, r"^gradd \d+\.\d+\.\d+  protocol 1  pid %d  up \d+s" % self.d.proc.pid)
        self.assertIn("DEVICE", out)
        line = [l for l in out.splitlines() if l.startswith("cpu0")]
        self.assertEqual(len(line), 1, out)
        self.assertIn("cpu (sim)", line[0])
        self.assertIn("0/4.00G", line[0])
        self.assertIn("JOBS", out)
        self.assertEqual(line[0].split()[-1], "0")
        self.assertIn("no CUDA devices", out)

    def test_json(self):
        st = self.d.ctl_json("status")
        self.assertEqual(st["protocol_version"], 1)
        self.assertEqual(st["pid"], self.d.proc.pid)
        self.assertEqual(st["peer_uid"], os.getuid())
        self.assertGreaterEqual(st["uptime_s"], 0)
        cpu = [d for d in st["devices"] if d["id"] == "cpu0"]
        self.assertEqual(len(cpu), 1)
        self.assertEqual(cpu[0]["kind"], "cpu")
        self.assertEqual(cpu[0]["mem_total"], 4 << 30)
        self.assertEqual(cpu[0]["mem_free"], 4 << 30)
        # No GPU on CI: the CUDA probe says why instead of failing.
        if not [d for d in st["devices"] if d["kind"] == "cuda"]:
            self.assertIn("no CUDA devices", st["cuda_note"])
        # --json after the command name works too.
        self.assertEqual(json.loads(self.d.ctl("status", "--json").stdout)["pid"], self.d.proc.pid)

    def test_gradd_socket_env(self):
        env = dict(os.environ, GRADD_SOCKET=self.d.sock)
        r = subprocess.run([GRADCTL, "--json", "status"], capture_output=True, text=True, env=env, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["pid"], self.d.proc.pid)

    def test_usage_errors_exit_2(self):
        for args in (["frobnicate"], ["status", "extra"], ["stats", "--bogus"], []):
            r = self.d.ctl(*args, check=False)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn("usage", r.stderr + r.stdout)

    def test_daemon_error_exit_1(self):
        r = self.d.ctl("stats", "-d", "cuda9", check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no device 'cuda9'", r.stderr)
        self.assertIn("cpu0", r.stderr)
        # With --json the reply is JSON on stdout too.
        r = self.d.ctl("--json", "stats", "-d", "cuda9", check=False)
        self.assertEqual(r.returncode, 1)
        err = json.loads(r.stdout)["error"]
        self.assertEqual(err["code"], "not_found")
        self.assertIn("no device 'cuda9'", err["message"])

    def test_devices_from_config(self):
        d = Daemon("[cpu]\ncapacity = 512M\ndevices = 2\n")
        try:
            st = d.ctl_json("status")
            ids = [x["id"] for x in st["devices"] if x["kind"] == "cpu"]
            self.assertEqual(ids, ["cpu0", "cpu1"])
            self.assertEqual(st["devices"][0]["mem_total"], 512 << 20)
        finally:
            d.cleanup()


class Unreachable(unittest.TestCase):
    def test_exit_3_names_socket(self):
        path = "/tmp/gradd-no-such-daemon-%d.sock" % os.getpid()
        r = subprocess.run([GRADCTL, "-s", path, "status"], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 3)
        self.assertIn(path, r.stderr)
        self.assertIn("gradd -s", r.stderr)

    def test_gradd_socket_env_unreachable(self):
        path = "/tmp/gradd-env-nothing-%d.sock" % os.getpid()
        env = dict(os.environ, GRADD_SOCKET=path)
        r = subprocess.run([GRADCTL, "status"], capture_output=True, text=True, env=env, timeout=30)
        self.assertEqual(r.returncode, 3)
        self.assertIn(path, r.stderr)


class Lifecycle(unittest.TestCase):
    def test_sigterm_and_sigint_unlink_socket(self):
        # SIGHUP too (the terminal closed): a clean stop, not the default death.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            d = Daemon()
            try:
                # An idle client must not hold the shutdown up.
                idle = harness.connect(d.sock)
                self.assertTrue(os.path.exists(d.sock))
                self.assertEqual(d.stop(sig), 0, d.read_log())
                self.assertFalse(os.path.exists(d.sock))
                self.assertIn("shutting down", d.read_log())
                idle.close()
            finally:
                d.cleanup()

    def test_openmp_spins_politely_unless_told(self):
        # gradd runs itself again with a short OpenMP spin, in the same
        # process, unless the user chose a wait policy.
        def environ(pid):
            with open("/proc/%d/environ" % pid, "rb") as f:
                return [e.decode() for e in f.read().split(b"\0") if e]
        base = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
        for extra, want in (({}, ["GOMP_SPINCOUNT=1000"]),
                            ({"OMP_WAIT_POLICY": "active"}, []),
                            ({"GOMP_SPINCOUNT": "300000"}, ["GOMP_SPINCOUNT=300000"])):
            d = Daemon(env=dict(base, **extra))
            try:
                self.assertEqual(d.ctl_json("status")["pid"], d.proc.pid)
                self.assertEqual([e for e in environ(d.proc.pid) if e.startswith("GOMP_SPINCOUNT=")], want)
                # Still named gradd (ps -C gradd, pidof), not "exe".
                with open("/proc/%d/comm" % d.proc.pid) as f:
                    self.assertEqual(f.read().strip(), os.path.basename(harness.GRADD))
                self.assertEqual(d.stop(), 0, d.read_log())
            finally:
                d.cleanup()

    def test_openblas_runs_the_cpus_own_kernels(self):
        # OpenBLAS before 0.3.25 takes a CPU model it does not know for a
        # Prescott and runs its generic kernels.  gradd then runs itself
        # again on the kernels of the CPU's instruction set, unless the
        # user chose (OPENBLAS_CORETYPE), and --version and the log say
        # which kernels run.  The expectation comes from OpenBLAS itself,
        # asked in a process of its own, and from /proc/cpuinfo.
        def environ(pid):
            with open("/proc/%d/environ" % pid, "rb") as f:
                return [e.decode() for e in f.read().split(b"\0") if e]
        base = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
        verdict = subprocess.run(
            [sys.executable, "-c", "import ctypes; l = ctypes.CDLL('libopenblas.so.0'); "
             "l.openblas_get_corename.restype = ctypes.c_char_p; print(l.openblas_get_corename().decode())"],
            env=base, capture_output=True, text=True, check=True).stdout.strip()
        with open("/proc/cpuinfo") as f:
            flags = set(next(l for l in f if l.startswith("flags")).split(":", 1)[1].split())
        want = None
        if verdict.lower() == "prescott":
            if {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"} <= flags:
                want = "SkylakeX"
            elif {"avx2", "fma"} <= flags:
                want = "Haswell"
        # The user's choice stands, even that of the generic kernels.
        for extra, core, env_want in (({}, want or verdict, ["OPENBLAS_CORETYPE=" + want] if want else []),
                                      ({"OPENBLAS_CORETYPE": "Prescott"}, "Prescott", ["OPENBLAS_CORETYPE=Prescott"])):
            env = dict(base, **extra)
            line = "cpu GEMMs: OpenBLAS's %s kernels%s" % (core, " (OPENBLAS_CORETYPE)" if env_want else "")
            ver = subprocess.run([GRADD, "--version"], env=env, capture_output=True, text=True, check=True)
            self.assertEqual(ver.stdout.splitlines()[1], line)
            d = Daemon(env=env)
            try:
                self.assertEqual(d.ctl_json("status")["pid"], d.proc.pid)
                self.assertEqual([e for e in environ(d.proc.pid) if e.startswith("OPENBLAS_CORETYPE=")], env_want)
                self.assertIn(line, d.read_log())
                self.assertEqual(d.stop(), 0, d.read_log())
            finally:
                d.cleanup()

    def test_nohup_daemon_ignores_sighup(self):
        # Started under nohup, gradd keeps serving when the terminal goes.
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "g.sock")
            p = subprocess.Popen([GRADD, "-s", path, "--state-dir", tmp + "/state"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL,
                                 preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
            try:
                deadline = time.time() + 20
                while not os.path.exists(path):
                    self.assertLess(time.time(), deadline, "no socket")
                    time.sleep(0.02)
                p.send_signal(signal.SIGHUP)
                time.sleep(0.3)
                self.assertIsNone(p.poll())
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                    c.connect(path)
            finally:
                p.terminate()
                self.assertEqual(p.wait(timeout=30), 0)

    def test_stale_socket_replaced(self):
        d = Daemon()
        try:
            # kill -9 leaves the socket file behind, with nobody listening.
            d.proc.kill()
            d.proc.wait()
            self.assertTrue(os.path.exists(d.sock))
            log = os.path.join(d.dir, "second.log")
            with open(log, "w") as lf:
                p = subprocess.Popen([GRADD, "-c", d.conf, "-s", d.sock, "--state-dir", d.dir + "/state"],
                                     stdout=lf, stderr=subprocess.STDOUT)
            try:
                d.proc = p
                d.wait_ready()
                self.assertEqual(d.ctl_json("status")["pid"], p.pid)
                with open(log) as f:
                    self.assertIn("removed stale socket", f.read())
            finally:
                p.terminate()
                p.wait(timeout=30)
        finally:
            d.cleanup()

    def test_socket_appears_ready(self):
        # Scripts wait for the file: once it exists it must accept, with no
        # window between bind and listen (the hung-job test saw one).
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "g.sock")
            for _ in range(5):
                p = subprocess.Popen([GRADD, "-s", path, "--state-dir", tmp + "/state"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                try:
                    deadline = time.time() + 20
                    while not os.path.exists(path):
                        self.assertLess(time.time(), deadline, "no socket")
                        self.assertIsNone(p.poll())
                    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                        c.connect(path)  # ConnectionRefusedError would fail the test
                    # No temporary name is left beside it once the daemon
                    # serves: the name goes between link() and the event
                    # loop, so a round trip (not the file's mere appearance)
                    # is the point after which it must be gone.
                    r = subprocess.run([GRADCTL, "-s", path, "status"], capture_output=True, text=True, timeout=30)
                    self.assertEqual(r.returncode, 0, r.stderr)
                    self.assertEqual(sorted(os.listdir(tmp)), ["g.sock", "state"])
                finally:
                    p.terminate()
                    self.assertEqual(p.wait(timeout=30), 0)
                self.assertFalse(os.path.exists(path))

    def test_stop_leaves_a_socket_not_its_own(self):
        # Someone replaced the path while gradd ran (an admin, a second
        # daemon after removing ours): stopping must not unlink theirs.
        d = Daemon()
        other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            os.unlink(d.sock)
            other.bind(d.sock)
            other.listen(1)
            self.assertEqual(d.stop(), 0, d.read_log())
            self.assertTrue(os.path.exists(d.sock))
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                c.connect(d.sock)
        finally:
            other.close()
            d.cleanup()

    def test_live_daemon_refused(self):
        d = Daemon()
        try:
            r = subprocess.run([GRADD, "-c", d.conf, "-s", d.sock, "--state-dir", d.dir + "/state2"],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 1)
            self.assertIn("another gradd is already serving on " + d.sock, r.stderr)
            # The first daemon is untouched and its socket still there.
            self.assertEqual(d.ctl_json("status")["pid"], d.proc.pid)
        finally:
            d.cleanup()

    def test_shared_state_dir_refused(self):
        # Another socket, the same state: the second would requeue and run
        # the first one's jobs.
        d = Daemon()
        try:
            r = subprocess.run([GRADD, "-c", d.conf, "-s", d.sock + "2", "--state-dir", d.dir + "/state"],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 1)
            self.assertIn("state directory %s/state is in use by another gradd (pid %d)" % (d.dir, d.proc.pid),
                          r.stderr)
            self.assertFalse(os.path.exists(d.sock + "2"))
            self.assertEqual(d.ctl_json("status")["pid"], d.proc.pid)
        finally:
            d.cleanup()

    def test_not_a_socket_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "regular-file")
            with open(path, "w") as f:
                f.write("precious")
            r = subprocess.run([GRADD, "-s", path, "--state-dir", tmp + "/state"],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 1)
            self.assertIn("is not a socket", r.stderr)
            with open(path) as f:
                self.assertEqual(f.read(), "precious")

    def test_bad_config_names_file_line_key(self):
        with tempfile.TemporaryDirectory() as tmp:
            conf = os.path.join(tmp, "bad.conf")
            with open(conf, "w") as f:
                f.write("[daemon]\nmax_frame = 1M\n\n[cpu]\ncapacity = four gigs\n")
            sock = os.path.join(tmp, "s.sock")
            r = subprocess.run([GRADD, "-c", conf, "-s", sock], capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 2)
            self.assertIn("%s:5: [cpu] capacity: 'four gigs' is not a size" % conf, r.stderr)
            self.assertFalse(os.path.exists(sock))

    def test_check_config(self):
        root = os.environ["GRADD_SOURCE_ROOT"]
        r = subprocess.run([GRADD, "-c", os.path.join(root, "etc/gradd.conf"), "--check-config"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("ok", r.stdout)


if __name__ == "__main__":
    harness.main()
