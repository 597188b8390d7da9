"""Program jobs ([job] type = program): a plain python3 script's whole life
under a real gradd — who it runs as, what it sees, its output in `logs`,
its exit status in `status`, cancel with the grace and then the kill,
the restart policy across a daemon restart, and bad job files refused at
submit naming the file and line."""
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import harness
import test_service_user

PY = shutil.which("python3") or sys.executable
OWNER = "nobody"

# Prints what a program job sees, then exits with argv[1] (default 0).
PROBE = r"""
import os, sys
print("uid", os.getuid(), os.geteuid())
print("gid", os.getgid(), os.getegid())
print("groups", " ".join(str(g) for g in sorted(os.getgroups())))
for line in open("/proc/self/status"):
    if line.startswith(("CapEff", "CapPrm", "CapAmb", "CapInh")):
        print(line.split()[0], line.split()[1])
print("cwd", os.getcwd())
print("stdin", os.readlink("/proc/self/fd/0"))
print("sid", os.getsid(0) == os.getpid())
for k in ("CUDA_VISIBLE_DEVICES", "GRADD_JOB_ID", "GRADD_SOCKET", "GREETING", "EMPTY", "PATH", "HOME", "USER"):
    print("env", k, repr(os.environ.get(k)))
print("args", sys.argv[2:])
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""

# Writes its pid and a child's pid, then waits for SIGTERM: traps it and
# exits, or ignores it (argv[1] = ignore).
STUBBORN = r"""
import os, signal, subprocess, sys, time
child = subprocess.Popen(["sleep", "600"])
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda s, f: (print("got SIGTERM"), sys.exit(0)))
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write("%d %d\n" % (os.getpid(), child.pid))
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def read_pids(path):
    with open(path) as f:
        return list(map(int, f.read().split()))


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class ProgramJobs(harness.DaemonTest):
    def setUp(self):
        super().setUp()
        self.dir = tempfile.mkdtemp(prefix="gradd-prog-")
        os.chmod(self.dir, 0o755)
        for name, text in (("probe.py", PROBE), ("stubborn.py", STUBBORN)):
            with open(os.path.join(self.dir, name), "w") as f:
                f.write(text)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)
        super().tearDown()

    def job(self, body, name="job.cfg"):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(body)
        os.chmod(path, 0o644)
        return path

    def submit(self, path, env=None, prefix=()):
        r = subprocess.run(list(prefix) + [harness.GRADCTL, "-s", self.d.sock, "submit", path],
                           capture_output=True, text=True, timeout=60, env=env)
        self.assertEqual(r.returncode, 0, r.stderr + self.d.read_log())
        return int(r.stdout.split()[1])

    def wait(self, jid, states=("completed", "failed", "cancelled"), timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            info = self.d.ctl_json("status", str(jid))
            if info["state"] in states:
                return info
            time.sleep(0.05)
        self.fail("job %d not %s: %s\n%s" % (jid, states, info, self.d.read_log()))

    def logs(self, jid):
        return self.d.ctl("logs", str(jid)).stdout

    def test_output_exit_status_and_env(self):
        path = self.job("[job]\ntype = program\ndevice = cpu\n[program]\n"
                        "command = %s probe.py 3 'two words' \"a \\\"q\\\" \\$HOME\" back\\ slash\n"
                        "env = GREETING='hello there' EMPTY=\n" % PY)
        jid = self.submit(path)
        info = self.wait(jid)
        self.assertEqual(info["state"], "failed")
        self.assertEqual(info["type"], "program")
        out = self.logs(jid)
        self.assertIn("args ['two words', 'a \"q\" $HOME', 'back slash']\n", out)
        self.assertIn("env CUDA_VISIBLE_DEVICES ''\n", out)
        self.assertIn("env GRADD_JOB_ID '%d'\n" % jid, out)
        self.assertIn("env GRADD_SOCKET %r\n" % self.d.sock, out)
        self.assertIn("env GREETING 'hello there'\n", out)
        self.assertIn("env EMPTY ''\n", out)
        self.assertIn("env PATH '/usr/local/bin:/usr/bin:/bin'\n", out)
        self.assertIn("cwd %s\n" % self.dir, out)
        self.assertIn("stdin /dev/null\n", out)
        self.assertIn("sid True\n", out)
        self.assertTrue(info["reason"].startswith("exited with status 3\nlast lines of output:\n"), info["reason"])
        self.assertIn("  args ['two words', 'a \"q\" $HOME', 'back slash']", info["reason"])
        # Bounded: the last 5 lines only.
        self.assertEqual(info["reason"].count("\n  "), 5, info["reason"])
        text = self.d.ctl("status", str(jid)).stdout
        self.assertIn("exited with status 3", text)
        self.assertIn("program", text)
        self.assertIn("probe.py 3", text)
        # A clean exit completes it; list shows it without steps or loss.
        ok = self.submit(self.job("[job]\ntype = program\n[program]\ncommand = %s probe.py 0\n" % PY, "ok.cfg"))
        self.assertEqual(self.wait(ok)["state"], "completed")
        rows = [line.split() for line in self.d.ctl("list").stdout.splitlines()[1:]]
        self.assertEqual([r[:8] for r in rows],
                         [[str(jid), "root", "job", "failed", "cpu0", "-", "-", "-"],
                          [str(ok), "root", "ok", "completed", "cpu0", "-", "-", "-"]])

    def test_signal_fails_naming_it(self):
        path = self.job("[job]\ntype = program\n[program]\ncommand = /bin/sh -c 'echo dying; kill -SEGV $$'\n")
        info = self.wait(self.submit(path))
        self.assertEqual(info["state"], "failed")
        self.assertTrue(info["reason"].startswith("killed by signal SIGSEGV"), info["reason"])
        self.assertIn("  dying", info["reason"])

    def test_exec_failure_is_the_reason(self):
        # Executable at submit, gone when it starts.
        prog = os.path.join(self.dir, "vanish.sh")
        with open(prog, "w") as f:
            f.write("#!/bin/sh\necho hi\n")
        os.chmod(prog, 0o755)
        hold = self.job("[job]\ntype = program\n[program]\ncommand = %s stubborn.py trap %s/pids0\n"
                        % (PY, self.dir), "hold.cfg")
        first = self.submit(hold)
        jid = self.submit(self.job("[job]\ntype = program\n[program]\ncommand = ./vanish.sh\n", "v.cfg"))
        os.unlink(prog)
        self.d.ctl("cancel", str(first))
        info = self.wait(jid)
        self.assertEqual(info["state"], "failed")
        self.assertIn("vanish.sh: No such file or directory", info["reason"])

    def test_cancel_trapped_then_killed(self):
        for mode, grace in (("trap", "30s"), ("ignore", "1s")):
            pids = os.path.join(self.dir, "pids-" + mode)
            path = self.job("[job]\ntype = program\n[program]\ncommand = %s stubborn.py %s %s\ngrace = %s\n"
                            % (PY, mode, pids, grace), mode + ".cfg")
            jid = self.submit(path)
            deadline = time.time() + 20
            while not os.path.exists(pids) and time.time() < deadline:
                time.sleep(0.02)
            main_pid, child_pid = read_pids(pids)
            self.assertTrue(alive(child_pid))
            t0 = time.monotonic()
            r = self.d.ctl("cancel", str(jid))
            self.assertEqual(r.stdout, "job %d stopping (SIGTERM to the program; SIGKILL once its [program] grace "
                                       "is over)\n" % jid)
            info = self.wait(jid, timeout=20)
            elapsed = time.monotonic() - t0
            self.assertEqual(info["state"], "cancelled")
            if mode == "trap":
                self.assertEqual(info["reason"], "cancelled: exited with status 0 after SIGTERM")
                self.assertLess(elapsed, 5)
                self.assertIn("got SIGTERM\n", self.logs(jid))
            else:
                self.assertEqual(info["reason"], "cancelled: killed with SIGKILL after the 1000ms grace")
                self.assertGreaterEqual(elapsed, 1.0)
                self.assertLess(elapsed, 5)
            # The whole process group is gone, the sleep it spawned too.
            self.assertFalse(alive(main_pid))
            self.assertFalse(alive(child_pid), "the program's child outlived it")

    def test_watch_follows_a_program(self):
        # A program has no steps: watch shows its time and memory, once a
        # second, and how it ended, with the reason's own words.
        path = self.job("[job]\ntype = program\n[program]\ncommand = %s -c 'import sys, time; "
                        "time.sleep(2.5); sys.exit(3)'\n" % PY)
        jid = self.submit(path)
        r = self.d.ctl("watch", str(jid), check=False)
        self.assertEqual(r.returncode, 1, r.stderr)
        lines = r.stdout.splitlines()
        running = [l for l in lines if l.startswith("running ")]
        for l in running:
            self.assertRegex(l, r"^running \d+s mem 0$")
        self.assertGreaterEqual(len(set(running)), 2, r.stdout)  # its time moved on while it ran
        self.assertNotIn("step", r.stdout)
        self.assertRegex(lines[-1], r"^job %d failed after [2-9]s: exited with status 3$" % jid)
        # Nor is there a model of gradd's to sample.
        r = self.d.ctl("sample", str(jid), check=False)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("is a program job: its model is the program's, not one gradd trained", r.stderr)

    def test_bad_job_files_refused(self):
        os.chmod(self.job("x", "noexec.sh"), 0o644)
        cases = [
            ("[job]\ntype = program\n[program]\nworkdir = /tmp\n",
             ": [program] command: is required for [job] type = program"),
            ("[job]\ntype = program\n[program]\ncommand = ./noexec.sh\n",
             ":4: [program] command: cannot execute %s/noexec.sh: Permission denied" % self.dir),
            ("[job]\ntype = program\n[program]\ncommand = no-such-program-here\n",
             ":4: [program] command: cannot execute no-such-program-here: not found "
             "(PATH=/usr/local/bin:/usr/bin:/bin)"),
            ("[job]\ntype = program\n[program]\ncommand = true\ncolour = red\n", ":5: [program] colour: unknown key"),
            ("[job]\ntype = program\n[program]\ncommand = true\n[train]\nsteps = 5\n",
             ":6: [train] steps: is for gradd's own training"),
            ("[job]\ntype = program\n[program]\ncommand = 'true\n",
             ":4: [program] command: unterminated single quote starting at column 1"),
            ("[job]\ntype = program\n[program]\ncommand = true\nenv = GRADD_JOB_ID=3\n",
             ":5: [program] env: GRADD_JOB_ID is set by gradd"),
            ("[job]\ntype = program\n[program]\ncommand = true\nenv = 1X=3\n",
             ":5: [program] env: '1X=3' is not NAME=VALUE"),
            ("[job]\ntype = program\n[program]\ncommand = true\nworkdir = missing\n",
             ":5: [program] workdir: cannot enter %s/missing: No such file or directory" % self.dir),
            ("[program]\ncommand = true\n", ":2: [program] command: is for [job] type = program"),
        ]
        for i, (body, want) in enumerate(cases):
            path = self.job(body, "bad%d.cfg" % i)
            r = self.d.ctl("submit", path, check=False)
            self.assertNotEqual(r.returncode, 0, body)
            self.assertIn(path + want, r.stderr, body)
        self.assertEqual(self.d.ctl_json("list"), {"jobs": []})


@unittest.skipUnless(os.geteuid() == 0 and shutil.which("setpriv"), "needs root and setpriv to act as other users")
class ProgramAsOwner(harness.DaemonTest):
    def test_runs_as_its_owner_without_capabilities(self):
        os.chmod(self.d.dir, 0o755)
        os.chmod(self.d.sock, 0o666)
        work = tempfile.mkdtemp(prefix="gradd-prog-")
        try:
            os.chmod(work, 0o755)
            with open(os.path.join(work, "probe.py"), "w") as f:
                f.write(PROBE)
            path = os.path.join(work, "job.cfg")
            with open(path, "w") as f:
                f.write("[job]\ntype = program\n[program]\ncommand = python3 probe.py\n")
            pw = pwd.getpwnam(OWNER)
            r = subprocess.run(["setpriv", "--reuid=%d" % pw.pw_uid, "--regid=%d" % pw.pw_gid, "--init-groups",
                                harness.GRADCTL, "-s", self.d.sock, "submit", path],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            jid = int(r.stdout.split()[1])
            deadline = time.time() + 30
            while self.d.ctl_json("status", str(jid))["state"] not in ("completed", "failed"):
                self.assertLess(time.time(), deadline)
                time.sleep(0.05)
            info = self.d.ctl_json("status", str(jid))
            out = self.d.ctl("logs", str(jid)).stdout
            self.assertEqual(info["state"], "completed", out)
            groups = sorted(set(os.getgrouplist(OWNER, pw.pw_gid)))
            self.assertIn("uid %d %d\n" % (pw.pw_uid, pw.pw_uid), out)
            self.assertIn("gid %d %d\n" % (pw.pw_gid, pw.pw_gid), out)
            self.assertIn("groups %s\n" % " ".join(map(str, groups)), out)
            for cap in ("CapEff:", "CapPrm:", "CapAmb:", "CapInh:"):
                self.assertIn("%s 0000000000000000\n" % cap, out)
            self.assertIn("env HOME %r\n" % pw.pw_dir, out)
            self.assertIn("env USER %r\n" % OWNER, out)
        finally:
            shutil.rmtree(work, ignore_errors=True)


@unittest.skipUnless(os.geteuid() == 0 and shutil.which("setpriv"), "needs root and setpriv to act as other users")
class ProgramUnderServiceUser(test_service_user.ServiceUser):
    """gradd as gradd.service runs it (a service user with only CAP_SETUID
    and CAP_SETGID, ambient): the program still runs as its owner with no
    capabilities (setresuid alone would leave it those two), and cancel
    reaches its group, which the service user may not signal itself."""

    def setUp(self):
        super().setUp()
        owner = pwd.getpwnam(test_service_user.OWNER)
        self.pids = os.path.join(self.home, "pids")
        with open(os.path.join(self.home, "stubborn.py"), "w") as f:
            f.write(STUBBORN)
        self.cfg = os.path.join(self.home, "prog.cfg")
        with open(self.cfg, "w") as f:
            f.write("[job]\ntype = program\n[program]\ncommand = python3 stubborn.py ignore %s\ngrace = 1s\n"
                    % self.pids)
        for p in (self.cfg, os.path.join(self.home, "stubborn.py")):
            os.chown(p, owner.pw_uid, owner.pw_gid)

    def test_owner_no_capabilities_and_cancel(self):
        self.start()
        self.assertIn("job 1 queued", self.ctl("submit", self.cfg))
        deadline = time.time() + 20
        while not os.path.exists(self.pids):
            self.assertLess(time.time(), deadline, self.read_logs())
            time.sleep(0.02)
        main_pid, child_pid = read_pids(self.pids)
        with open("/proc/%d/status" % main_pid) as f:
            status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        owner = pwd.getpwnam(test_service_user.OWNER)
        self.assertEqual(status["Uid"].split(), [str(owner.pw_uid)] * 4)
        self.assertEqual(status["Gid"].split(), [str(owner.pw_gid)] * 4)
        self.assertEqual(sorted(map(int, status["Groups"].split())),
                         sorted(set(os.getgrouplist(test_service_user.OWNER, owner.pw_gid))))
        for cap in ("CapEff", "CapPrm", "CapAmb", "CapInh"):
            self.assertEqual(status[cap], "0000000000000000", cap)
        self.ctl("cancel", "1")
        deadline = time.time() + 10
        while self.job()["state"] != "cancelled":
            self.assertLess(time.time(), deadline, self.read_logs())
            time.sleep(0.05)
        self.assertEqual(self.job()["reason"], "cancelled: killed with SIGKILL after the 1000ms grace")
        self.assertFalse(alive(main_pid) or alive(child_pid))


# Its own tests run from test_service_user.py.
for _name in dir(test_service_user.ServiceUser):
    if _name.startswith("test_") and _name != "test_owner_no_capabilities_and_cancel":
        setattr(ProgramUnderServiceUser, _name, None)


class ProgramRestart(unittest.TestCase):
    """A daemon stopped (SIGTERM) or killed (SIGKILL) under a running
    program: at its next start the job is failed, or queued again with
    restart = on-failure, and an orphaned program does not outlive it."""

    def test_restart_policy(self):
        work = tempfile.mkdtemp(prefix="gradd-prog-")
        d = None
        try:
            with open(os.path.join(work, "stubborn.py"), "w") as f:
                f.write(STUBBORN)
            jobs = {}
            for policy in ("no", "on-failure"):
                path = os.path.join(work, policy + ".cfg")
                with open(path, "w") as f:
                    f.write("[job]\ntype = program\n[program]\ncommand = %s stubborn.py trap %s/%s.pids\n"
                            "restart = %s\n" % (PY, work, policy, policy))
                jobs[policy] = path
            conf = "[daemon]\nmax_jobs_per_device = 2\nstop_timeout = 10s\n"
            d = harness.Daemon(conf)
            ids = {p: int(d.ctl("submit", path).stdout.split()[1]) for p, path in jobs.items()}
            pids = {}
            for p in ids:
                f = os.path.join(work, p + ".pids")
                deadline = time.time() + 20
                while not os.path.exists(f):
                    self.assertLess(time.time(), deadline, d.read_log())
                    time.sleep(0.02)
                pids[p] = read_pids(f)
                os.unlink(f)
            t0 = time.monotonic()
            self.assertEqual(d.stop(), 0, d.read_log())
            self.assertLess(time.monotonic() - t0, 8)
            for p in pids.values():
                self.assertFalse(alive(p[0]) or alive(p[1]))
            d.log = open(d.log_path, "a")
            d.proc = subprocess.Popen(d.proc.args, stdout=d.log, stderr=subprocess.STDOUT)
            d.wait_ready()
            info = d.ctl_json("status", str(ids["no"]))
            self.assertEqual((info["state"], info["reason"]), ("failed", "daemon restarted"))
            # on-failure: queued again, running again.
            f = os.path.join(work, "on-failure.pids")
            deadline = time.time() + 20
            while not os.path.exists(f):
                self.assertLess(time.time(), deadline, d.read_log())
                time.sleep(0.02)
            info = d.ctl_json("status", str(ids["on-failure"]))
            self.assertEqual((info["state"], info["resumes"]), ("running", 1))
            # kill -9 of the daemon: the orphan is ended at the next start.
            orphan = read_pids(f)
            d.proc.kill()
            d.proc.wait()
            time.sleep(0.3)  # its state save of the pgid is done before the pids file appears
            self.assertTrue(alive(orphan[0]))
            d.proc = subprocess.Popen(d.proc.args, stdout=d.log, stderr=subprocess.STDOUT)
            d.wait_ready()
            deadline = time.time() + 10
            while alive(orphan[0]) or alive(orphan[1]):
                self.assertLess(time.time(), deadline, "the orphaned program outlived the restart")
                time.sleep(0.05)
            info = d.ctl_json("status", str(ids["on-failure"]))
            self.assertEqual(info["resumes"], 2)
            self.assertEqual(d.stop(), 0, d.read_log())
        finally:
            if d:
                d.cleanup()
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    harness.main()
