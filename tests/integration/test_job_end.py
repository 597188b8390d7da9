"""How a job ends and what it finds, through a real gradd and the real
gradctl: [output] resume refusing a finished run's directory (and never,
require), one live job per output directory, a continued job saying so;
[job] time_limit stopping an engine job with a checkpoint (and a program
job with SIGTERM), with gradd.conf's default and maximum; [job] on_end
run once as the owner at the job's end, its environment, its output in
the log, and one that hangs killed at its bound."""
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import harness

PY = shutil.which("python3") or sys.executable

GPT = """[job]
name = {name}
{job}
[model]
type = gpt
layers = 1
heads = 2
width = 16
context = 8
vocab = 256
[data]
format = text
train = {train}
val_fraction = 0.1
[train]
steps = {steps}
batch = 4
micro_batch = 4
threads = 1
eval_batches = 1
[output]
dir = {out}
{output}
"""

# Traps SIGTERM, says so and exits 0; else sleeps for good.
TRAPS = r"""
import signal, sys, time
signal.signal(signal.SIGTERM, lambda s, f: (print("got SIGTERM", flush=True), sys.exit(0)))
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


class JobEnd(harness.DaemonTest):
    conf = "[daemon]\nclient_timeout = 60s\ndefault_time_limit = 10m\nmax_time_limit = 1h\n"

    def setUp(self):
        super().setUp()
        self.dir, self.train = harness.scratch_corpus(self, "gradd-end-")
        with open(os.path.join(self.dir, "traps.py"), "w") as f:
            f.write(TRAPS)

    def gpt(self, name, steps=6, job="", output="", out=None):
        path = os.path.join(self.dir, name + ".cfg")
        with open(path, "w") as f:
            f.write(GPT.format(name=name, job=job, train=self.train, steps=steps,
                               out=out or os.path.join(self.dir, "out-" + name), output=output))
        os.chmod(path, 0o644)
        return path

    def program(self, name, command, job="", program=""):
        path = os.path.join(self.dir, name + ".cfg")
        with open(path, "w") as f:
            f.write("[job]\ntype = program\n%s\n[program]\ncommand = %s\n%s\n" % (job, command, program))
        os.chmod(path, 0o644)
        return path

    def submit(self, path, check=True):
        r = self.d.ctl("submit", path, check=False)
        if check:
            self.assertEqual(r.returncode, 0, r.stderr + self.d.read_log())
            return int(r.stdout.split()[1])
        return r

    def wait(self, jid, states=("completed", "failed", "cancelled"), timeout=60):
        return harness.wait_job(self.d, jid, states, timeout)

    def wait_until(self, jid, pred, timeout=30):
        deadline = time.time() + timeout
        while True:
            j = self.d.ctl_json("status", str(jid))
            if pred(j):
                return j
            if time.time() > deadline:
                self.fail("job %d: %s\n%s" % (jid, j, self.d.read_log()))
            time.sleep(0.02)

    # ---- reusing an output directory ------------------------------------------

    def test_a_finished_run_is_refused_and_never_and_require(self):
        out = os.path.join(self.dir, "out-done")
        cfg = self.gpt("done", out=out)
        jid = self.submit(cfg)
        self.assertEqual(self.wait(jid)["state"], "completed")
        r = self.submit(cfg, check=False)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        with open(cfg) as f:
            dir_line = f.read().split("\n").index("dir = %s" % out) + 1
        self.assertIn("%s:%d: [output] dir, with [output] resume = auto: %s holds a finished run (step 6 of [train] "
                      "steps 6 in resume.safetensors), so the job would do nothing; choose another [output] dir, "
                      "remove its outputs to start over, or raise [train] steps to train it further\n"
                      % (cfg, dir_line, out), r.stderr)
        # never writes over nothing: refused while gradd's outputs are there.
        never = self.gpt("done", output="resume = never", out=out)
        r = self.submit(never, check=False)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("%s:23: [output] resume = never: %s holds another run's outputs (resume.safetensors, "
                      "model.safetensors, config.json, metrics.jsonl), which gradd neither continues nor writes over; "
                      "remove "
                      "them, or choose another [output] dir\n" % (never, out), r.stderr)
        self.assertTrue(os.path.exists(os.path.join(out, "model.safetensors")))
        # require: there must be a checkpoint to continue.
        fresh = os.path.join(self.dir, "out-fresh")
        req = self.gpt("req", output="resume = require", out=fresh)
        r = self.submit(req, check=False)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("%s:23: [output] resume = require: %s holds no checkpoint (resume.safetensors) to continue\n"
                      % (req, fresh), r.stderr)
        # More steps than the finished run: it goes on from there.
        more = self.submit(self.gpt("done", steps=8, out=out))
        j = self.wait(more)
        self.assertEqual((j["state"], j["step"], j["continued"], j["resumed_from_step"]), ("completed", 8, True, 6))
        # And never in a fresh directory simply starts.
        j = self.wait(self.submit(self.gpt("new", output="resume = never")))
        self.assertEqual((j["state"], j["continued"]), ("completed", False))

    def test_a_second_live_job_on_one_directory_is_refused(self):
        out = os.path.join(self.dir, "out-live")
        first = self.submit(self.gpt("live", steps=1000000, out=out))
        self.wait(first, ("running",))
        # Another spelling of the same directory: through a symbolic link.
        link = os.path.join(self.dir, "link")
        os.symlink(out, link)
        other = self.gpt("other", out=link)
        r = self.submit(other, check=False)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("%s:22: [output] dir: %s is the output directory of job %d, which is running; two jobs "
                      "writing one directory would mix their checkpoints: wait for it to end, or choose another "
                      "[output] dir\n" % (other, out, first), r.stderr)
        # A step or two in: cancelled during its first step (slow under
        # the sanitizers), it would end at step 0, and no job could have
        # fewer steps than that for the refusal below.
        self.wait_until(first, lambda j: j["step"] >= 2, timeout=120)
        self.d.ctl("cancel", str(first))
        j = self.wait(first)
        self.assertEqual(j["state"], "cancelled")
        # Once it has ended the directory is free, and its checkpoint is
        # continued; one past this job's steps is refused.
        r = self.submit(self.gpt("other", steps=j["step"] - 1, out=link), check=False)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("holds a run trained past this job's end (step %d of [train] steps %d in resume.safetensors)"
                      % (j["step"], j["step"] - 1), r.stderr)
        second = self.wait(self.submit(self.gpt("other", steps=1000000, job="time_limit = 1s", out=link)))
        self.assertEqual((second["state"], second["continued"], second["resumed_from_step"]),
                         ("failed", True, j["step"]), second)

    # ---- time limits --------------------------------------------------------

    def test_time_limit_stops_an_engine_job_with_a_checkpoint_and_a_resubmit_continues(self):
        out = os.path.join(self.dir, "out-long")
        first = self.submit(self.gpt("long", steps=1000000, job="time_limit = 2s", out=out))
        j = self.wait(first, ("running",))
        self.assertEqual(j["time_limit_s"], 2.0)
        self.assertGreater(j["time_left_s"], 0)
        self.assertLessEqual(j["time_left_s"], 2.0)
        text = self.d.ctl("status", str(first)).stdout
        self.assertRegex(text, r"time limit +2s \([012]s left\)\n")
        t0 = time.time()
        j = self.wait(first, timeout=30)
        self.assertLess(time.time() - t0, 10)
        self.assertEqual(j["state"], "failed")
        step = j["step"]
        self.assertGreater(step, 0)
        self.assertEqual(j["reason"],
                         "time limit (2s) reached at step %d; checkpoint written in %s: submitting the job again "
                         "continues from it" % (step, out))
        self.assertTrue(os.path.exists(os.path.join(out, "resume.safetensors")))
        text = self.d.ctl("status", str(first)).stdout
        self.assertRegex(text, r"time limit +2s\n")
        # The same job with a longer limit goes on from there, and says so.
        second = self.submit(self.gpt("long", steps=1000000, job="time_limit = 3s", output="resume = require",
                                      out=out))
        j = self.wait_until(second, lambda j: j["step"] >= step)
        self.assertEqual((j["continued"], j["resumed_from_step"], j["resumes"]), (True, step, 0))
        text = self.d.ctl("status", str(second)).stdout
        self.assertIn("continued   from step %d of the run found in its out dir\n" % step, text)
        j = self.wait(second, timeout=30)
        self.assertEqual(j["state"], "failed")
        self.assertIn("time limit (3s) reached at step", j["reason"])
        self.assertGreater(j["step"], step)
        log = self.d.ctl("logs", str(second)).stdout
        self.assertIn("== continuing the unfinished run in %s from its checkpoint at step %d ([output] resume)\n"
                      % (out, step), log)
        self.assertNotIn("micro 0×0", log)  # where it resumed is no step of this run

    def test_time_limit_sends_a_program_sigterm(self):
        jid = self.submit(self.program("prog", "%s traps.py" % PY, job="time_limit = 1s", program="grace = 5s"))
        t0 = time.time()
        j = self.wait(jid, timeout=30)
        self.assertLess(time.time() - t0, 6)
        self.assertEqual(j["state"], "failed")
        self.assertEqual(j["reason"], "time limit (1s) reached: exited with status 0 after SIGTERM")
        self.assertIn("got SIGTERM\n", self.d.ctl("logs", str(jid)).stdout)

    def test_default_and_maximum_time_limit(self):
        over = self.gpt("over", job="time_limit = 2h")
        r = self.submit(over, check=False)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("%s:3: [job] time_limit: 2h00m is above 1h00m, the longest this daemon allows "
                      "([daemon] max_time_limit)" % over, r.stderr)
        # None set: gradd.conf's default, fixed at submit.
        jid = self.submit(self.gpt("plain"))
        j = self.wait(jid)
        self.assertEqual((j["state"], j["time_limit_s"], j["time_left_s"]), ("completed", 600.0, 0.0))


# Records who and where it runs, and its environment, into $1.
HOOK = """#!/bin/sh
{ echo "uid $(id -u)"; echo "groups $(id -G)"; echo "cwd $(pwd)"; echo "stdin $(readlink /proc/self/fd/0)"
  grep -E '^Cap(Eff|Prm|Amb)' /proc/self/status; env; } > "$1.tmp"
mv "$1.tmp" "$1"
echo "hook says hi"
"""


class JobEndHook(harness.DaemonTest):
    conf = "[daemon]\nclient_timeout = 60s\non_end_timeout = 1s\n"

    def setUp(self):
        # With systemd's watchdog on: a hook that runs for a while must not
        # look like a hung job thread.
        notify_dir = tempfile.mkdtemp(prefix="gradd-notify-")
        self.addCleanup(shutil.rmtree, notify_dir, ignore_errors=True)
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.addCleanup(self.notify.close)
        path = os.path.join(notify_dir, "notify")
        self.notify.bind(path)
        self.notify.settimeout(0.1)
        # Read, or the pings would fill its queue and block the daemon's loop.
        done = threading.Event()

        def drain():
            while not done.is_set():
                try:
                    self.notify.recv(4096)
                except socket.timeout:
                    pass
        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        self.addCleanup(reader.join)
        self.addCleanup(done.set)
        self.d = harness.Daemon(self.conf, env=dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC="500000"))
        self.dir, self.train = harness.scratch_corpus(self, "gradd-hook-")
        hook = os.path.join(self.dir, "hook.sh")
        with open(hook, "w") as f:
            f.write(HOOK)
        os.chmod(hook, 0o755)

    def write(self, name, text):
        path = os.path.join(self.dir, name + ".cfg")
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o644)
        return path

    def wait_hook(self, jid, timeout=30):
        deadline = time.time() + timeout
        while True:
            j = self.d.ctl_json("status", str(jid))
            if j["on_end_result"] or time.time() > deadline:
                return j
            time.sleep(0.05)

    @unittest.skipUnless(os.geteuid() == 0 and shutil.which("setpriv"), "needs root and setpriv to act as other users")
    def test_hook_runs_once_as_the_owner_with_its_environment(self):
        os.chmod(self.d.dir, 0o755)
        os.chmod(self.d.sock, 0o666)
        pw = pwd.getpwnam("nobody")
        home = os.path.join(self.dir, "nobody")
        os.mkdir(home, 0o755)
        os.chown(home, pw.pw_uid, pw.pw_gid)
        out = os.path.join(home, "out")
        record = os.path.join(home, "record.txt")
        cfg = self.write("hooked", GPT.format(name="hooked", job="on_end = ./hook.sh %s 'two words'" % record,
                                             train=self.train, steps=3, out=out, output=""))
        r = subprocess.run(["setpriv", "--reuid=%d" % pw.pw_uid, "--regid=%d" % pw.pw_gid, "--init-groups",
                            harness.GRADCTL, "-s", self.d.sock, "submit", cfg],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        jid = int(r.stdout.split()[1])
        j = self.wait_hook(jid)
        self.assertEqual((j["state"], j["on_end"], j["on_end_result"]),
                         ("completed", "./hook.sh %s 'two words'" % record, "exited with status 0"))
        with open(record) as f:
            lines = f.read().splitlines()
        self.assertEqual(os.stat(record).st_uid, pw.pw_uid)
        groups = sorted(set(os.getgrouplist("nobody", pw.pw_gid)))
        self.assertIn("uid %d" % pw.pw_uid, lines)
        self.assertEqual(sorted(map(int, lines[1].split()[1:])), groups)
        self.assertIn("cwd %s" % self.dir, lines)
        self.assertIn("stdin /dev/null", lines)
        for cap in ("CapEff:", "CapPrm:", "CapAmb:"):
            self.assertIn("%s\t0000000000000000" % cap, lines)
        env = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith(("uid", "cwd")))
        self.assertEqual({k: env.get(k) for k in ("GRADD_JOB_ID", "GRADD_JOB_STATE", "GRADD_JOB_NAME",
                                                  "GRADD_OUTPUT_DIR", "GRADD_JOB_REASON", "GRADD_SOCKET", "PATH",
                                                  "USER", "HOME")},
                         {"GRADD_JOB_ID": str(jid), "GRADD_JOB_STATE": "completed", "GRADD_JOB_NAME": "hooked",
                          "GRADD_OUTPUT_DIR": out, "GRADD_JOB_REASON": "", "GRADD_SOCKET": self.d.sock,
                          "PATH": "/usr/local/bin:/usr/bin:/bin", "USER": "nobody", "HOME": pw.pw_dir})
        log = self.d.ctl("logs", str(jid)).stdout
        self.assertIn("== job %d completed\n== on_end: started %s/hook.sh as pid " % (jid, self.dir), log)
        self.assertIn("\nhook says hi\n== on_end: exited with status 0\n", log)
        self.assertEqual(log.count("== on_end: started"), 1)
        text = self.d.ctl("status", str(jid)).stdout
        self.assertIn("  on end      ./hook.sh %s 'two words'\n              exited with status 0\n" % record, text)

    def test_a_hanging_hook_is_killed_at_its_bound_and_sees_the_failure(self):
        cfg = self.write("fails", "[job]\ntype = program\non_end = /bin/sh -c 'echo \"state=$GRADD_JOB_STATE "
                         "reason=$GRADD_JOB_REASON\"; exec sleep 600'\n[program]\ncommand = /bin/sh -c 'exit 3'\n")
        jid = int(self.d.ctl("submit", cfg).stdout.split()[1])
        t0 = time.time()
        j = self.wait_hook(jid)
        self.assertLess(time.time() - t0, 10)
        self.assertEqual((j["state"], j["reason"], j["on_end_result"]),
                         ("failed", "exited with status 3", "killed with SIGKILL after 1s ([daemon] on_end_timeout)"))
        log = self.d.ctl("logs", str(jid)).stdout
        self.assertIn("\nstate=failed reason=exited with status 3\n"
                      "== on_end: killed with SIGKILL after 1s ([daemon] on_end_timeout)\n", log)
        # (A tick late under load may say so as the job starts: not the hook's doing.)
        after_end = self.d.read_log().split("on cpu0: failed: exited with status 3\n", 1)[1]
        self.assertNotIn("made no progress", after_end)
        # Its slot is free again: the next job runs.
        nxt = int(self.d.ctl("submit", self.write("next", "[job]\ntype = program\n[program]\ncommand = /bin/true\n"))
                  .stdout.split()[1])
        self.assertEqual(harness.wait_job(self.d, nxt, ("completed", "failed"), 30)["state"], "completed")

    def test_refused_at_submit_and_not_run_when_the_daemon_stops(self):
        cfg = self.write("missing", "[job]\ntype = program\non_end = ./missing.sh\n[program]\ncommand = /bin/true\n")
        r = self.d.ctl("submit", cfg, check=False)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("%s:3: [job] on_end: cannot execute %s/missing.sh: No such file or directory"
                      % (cfg, self.dir), r.stderr)
        cfg = self.write("quote", "[job]\ntype = program\non_end = echo 'open\n[program]\ncommand = /bin/true\n")
        r = self.d.ctl("submit", cfg, check=False)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("%s:3: [job] on_end: " % cfg, r.stderr)
        # A daemon stop puts a running engine job back in the queue: not its end.
        marker = os.path.join(self.dir, "ran")
        long = self.write("long", GPT.format(name="long", job="on_end = /bin/touch %s" % marker, train=self.train,
                                             steps=1000000, out=os.path.join(self.dir, "out-long"), output=""))
        jid = int(self.d.ctl("submit", long).stdout.split()[1])
        harness.wait_job(self.d, jid, ("running",), 30)
        self.assertEqual(self.d.stop(), 0)
        self.assertFalse(os.path.exists(marker))


if __name__ == "__main__":
    harness.main()
