"""Jobs that wait for other jobs (submit --after) and held jobs, through a
real gradd and the real gradctl: a chain that runs in order, a failure that
cancels the rest of its chain, an unknown id refused, dependencies and holds
that survive a daemon restart, hold and release, requeue of a failed and of
a running job, and another user refused all three."""
import os
import shutil
import subprocess
import time
import unittest

import harness
import test_jobs
from harness import GRADCTL, Daemon

# Three slots on the one device: without its dependency, a waiting job
# would start at once beside it.
CONF = "[daemon]\nmax_jobs_per_device = 3\n"



class Depend(unittest.TestCase):
    def setUp(self):
        self.dir, self.corpus = harness.scratch_corpus(self, "gradd-depend-")
        self.d = Daemon(CONF)
        self.addCleanup(self.d.cleanup)

    def program(self, name, command):
        """A program job running `command` (a shell line) in self.dir."""
        path = os.path.join(self.dir, name + ".cfg")
        with open(path, "w") as f:
            f.write("[job]\nname = %s\ntype = program\ndevice = cpu\n[program]\ncommand = /bin/sh -c '%s'\n"
                    % (name, command))
        os.chmod(path, 0o644)
        return path

    def gpt(self, name, steps):
        path = os.path.join(self.dir, name + ".cfg")
        with open(path, "w") as f:
            f.write(test_jobs.JOB.format(name=name, train=self.corpus, steps=steps, ckpt=0,
                                         out=os.path.join(self.dir, "out-" + name)))
        os.chmod(path, 0o644)
        return path

    def submit(self, cfg, *extra):
        r = self.d.ctl("submit", cfg, *extra)
        self.assertRegex(r.stdout, r"^job \d+ queued \(")
        return int(r.stdout.split()[1])

    def info(self, jid):
        return self.d.ctl_json("status", str(jid))

    def wait(self, jid, pred, what, timeout=60):
        deadline = time.time() + timeout
        while True:
            j = self.info(jid)
            if pred(j):
                return j
            if time.time() > deadline:
                raise AssertionError("job %d never %s: %s\n%s" % (jid, what, j, self.d.read_log()))
            time.sleep(0.02)

    def wait_state(self, jid, *states):
        return self.wait(jid, lambda j: j["state"] in states, "/".join(states))

    def row(self, jid):
        """The job's line in `gradctl list`."""
        for line in self.d.ctl("list").stdout.splitlines()[1:]:
            if line.split()[0] == str(jid):
                return line
        raise AssertionError("job %d not listed" % jid)

    # ---- chains ------------------------------------------------------------------

    def test_chain_runs_in_order(self):
        # a starts held, so that the others are queued behind it however
        # slowly this machine submits them.
        a = self.submit(self.program("a", "sleep 0.2"), "--hold")
        b = self.submit(self.program("b", "sleep 0.2"), "--after", str(a))
        c = self.submit(self.program("c", "true"), "--after", "%d,%d" % (b, a))
        j = self.info(c)
        self.assertEqual(j["state"], "queued")
        self.assertEqual(j["depends_on"], [a, b])
        self.assertFalse(j["held"])
        self.assertEqual(j["waiting"], "waiting for %d, %d" % (a, b))
        self.assertIn("queued (waiting for %d, %d)" % (a, b), self.row(c))
        self.assertIn("waiting     waiting for %d, %d" % (a, b), self.d.ctl("status", str(c)).stdout)
        listed = {x["id"]: x for x in self.d.ctl_json("list")["jobs"]}
        self.assertEqual(listed[b]["depends_on"], [a])
        self.assertEqual(listed[a]["depends_on"], [])
        self.d.ctl("release", str(a))
        ends = [self.wait_state(x, "completed") for x in (a, b, c)]
        # Each started only after the one it waits for had finished.
        self.assertGreaterEqual(ends[1]["started_at"], ends[0]["finished_at"])
        self.assertGreaterEqual(ends[2]["started_at"], ends[1]["finished_at"])
        self.assertEqual(ends[2]["waiting"], "")

    def test_failure_cancels_the_chain(self):
        a = self.submit(self.program("a", "exit 1"), "--hold")
        b = self.submit(self.program("b", "true"), "--after", str(a))
        c = self.submit(self.program("c", "true"), "--after", str(b))
        other = self.submit(self.program("other", "true"))
        self.d.ctl("release", str(a))
        self.assertEqual(self.wait_state(a, "failed")["reason"], "exited with status 1")
        jb = self.wait_state(b, "cancelled")
        self.assertEqual(jb["reason"], "dependency %d failed" % a)
        self.assertIsNone(jb["started_at"])
        jc = self.wait_state(c, "cancelled")
        self.assertEqual(jc["reason"], "dependency %d was cancelled" % b)
        self.assertIn("reason      dependency %d was cancelled" % b, self.d.ctl("status", str(c)).stdout)
        self.wait_state(other, "completed")
        # A failed job is no dependency: refused, naming it.
        r = self.d.ctl("submit", "--after", str(a), self.program("d", "true"), check=False)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("--after %d: that job is failed, so this one could never start" % a, r.stderr)
        # A queued job cancelled by hand takes its dependents with it.
        h = self.submit(self.program("h", "true"), "--hold")
        w = self.submit(self.program("w", "true"), "--after", str(h))
        self.d.ctl("cancel", str(h))
        self.assertFalse(self.info(h)["held"])  # a hold is on a start
        self.assertEqual(self.info(w)["state"], "cancelled")
        self.assertEqual(self.info(w)["reason"], "dependency %d was cancelled" % h)

    def test_unknown_or_bad_ids_are_refused(self):
        a = self.submit(self.program("a", "true"))
        before = len(self.d.ctl_json("list")["jobs"])
        r = self.d.ctl("submit", "--after", "%d,999" % a, self.program("b", "true"), check=False)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("submit: --after 999: no such job", r.stderr)
        r = self.d.ctl("--json", "submit", "--after", "999", self.program("b", "true"), check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--after 999: no such job", r.stdout + r.stderr)
        for bad, why in (("x", "--after: 'x' is not a job id"), ("0", "--after: '0' is not a job id"),
                         (",", "--after needs a job id"),
                         (",".join(str(i) for i in range(1, 18)), "--after: at most 16 jobs")):
            r = self.d.ctl("submit", "--after", bad, self.program("b", "true"), check=False)
            self.assertEqual(r.returncode, 2, (bad, r.stderr))
            self.assertIn(why, r.stderr)
        # Nothing was queued, and no id spent: the next job is a + 1.
        self.assertEqual(len(self.d.ctl_json("list")["jobs"]), before)
        self.assertEqual(self.submit(self.program("c", "true")), a + 1)

    def test_removed_dependency_counts_as_completed(self):
        a = self.submit(self.program("a", "true"))
        x = self.submit(self.program("x", "true"), "--hold")
        b = self.submit(self.program("b", "true"), "--after", "%d,%d" % (a, x))
        self.wait_state(a, "completed")
        self.d.ctl("rm", str(a))
        self.assertEqual(self.info(b)["waiting"], "waiting for %d" % x)
        self.d.ctl("release", str(x))
        j = self.wait_state(b, "completed")
        self.assertEqual(j["depends_on"], [a, x])

    # ---- a daemon restart ---------------------------------------------------------

    def test_dependencies_and_hold_survive_a_restart(self):
        a = self.submit(self.program("a", "true"), "--hold")
        b = self.submit(self.program("b", "true"), "--after", str(a))
        self.assertEqual(self.d.stop(), 0)
        state = os.path.join(self.d.dir, "state")
        with open(os.path.join(state, "jobs", str(b), "state")) as f:
            self.assertIn("\nafter=%d\n" % a, f.read())
        self.d = Daemon(CONF, args=("--state-dir", state))
        self.addCleanup(self.d.cleanup)
        ja, jb = self.info(a), self.info(b)
        self.assertEqual((ja["state"], ja["held"], ja["waiting"]), ("queued", True, "held"))
        self.assertEqual((jb["state"], jb["depends_on"], jb["waiting"]), ("queued", [a], "waiting for %d" % a))
        time.sleep(0.5)  # a free device, and still nothing starts
        self.assertIsNone(self.info(b)["started_at"])
        self.d.ctl("release", str(a))
        ja, jb = self.wait_state(a, "completed"), self.wait_state(b, "completed")
        self.assertGreaterEqual(jb["started_at"], ja["finished_at"])

    # ---- hold and release ---------------------------------------------------------

    def test_hold_and_release(self):
        blocker = self.submit(self.program("blocker", "sleep 30"), "--hold")
        h = self.submit(self.program("h", "true"))
        r = self.d.ctl("hold", str(blocker))  # held already: still fine
        self.assertEqual(r.stdout, "job %d held\n" % blocker)
        # h may start at once; holding it first is a race, so hold a queued one.
        j = self.d.ctl_json("hold", str(blocker))
        self.assertEqual((j["state"], j["held"], j["waiting"]), ("queued", True, "held"))
        self.assertIn("queued (held)", self.row(blocker))
        self.wait_state(h, "completed")
        time.sleep(0.5)  # three free slots, and the held job stays
        j = self.info(blocker)
        self.assertEqual(j["state"], "queued")
        self.assertIsNone(j["started_at"])
        r = self.d.ctl("release", str(blocker))
        self.assertEqual(r.stdout, "job %d released\n" % blocker)
        j = self.wait_state(blocker, "running")
        self.assertFalse(j["held"])
        self.assertEqual(j["waiting"], "")
        # Only a queued job is held or released.
        for cmd in ("hold", "release"):
            r = self.d.ctl(cmd, str(blocker), check=False)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("job %d is running; only a queued job can be %s" % (blocker, "held" if cmd == "hold" else "released"),
                          r.stderr)
        r = self.d.ctl("hold", "999", check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no job 999", r.stderr)
        self.d.ctl("cancel", str(blocker))
        self.wait_state(blocker, "cancelled")

    # ---- inputs that an earlier job makes ----------------------------------------------

    def test_data_and_model_that_a_dependency_makes(self):
        # Prepare the data, train on it, then fine-tune what that trained:
        # each job names files that do not exist when it is submitted.
        prepared = os.path.join(self.dir, "prepared.txt")
        prep = self.submit(self.program("prep", "cp %s %s" % (self.corpus, prepared)), "--hold")
        base_cfg = self.gpt("base", steps=3).replace(".cfg", "") + ".cfg"
        with open(base_cfg) as f:
            text = f.read().replace("train = %s" % self.corpus, "train = %s" % prepared)
        with open(base_cfg, "w") as f:
            f.write(text)
        # Without --after, a missing file is refused at submit, as ever.
        r = self.d.ctl("submit", base_cfg, check=False)
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn("[data] train: cannot read %s: No such file or directory" % prepared, r.stderr)
        base = self.submit(base_cfg, "--after", str(prep))
        base_out = os.path.join(self.dir, "out-base")
        tune_cfg = os.path.join(self.dir, "tune.cfg")
        with open(tune_cfg, "w") as f:
            f.write("[model]\nfrom = %s\n[data]\nformat = text\ntrain = %s\n[train]\nsteps = 2\nbatch = 4\n"
                    "threads = 1\n[output]\ndir = %s\n" % (base_out, prepared, os.path.join(self.dir, "out-tune")))
        tune = self.submit(tune_cfg, "--after", str(base))
        # A dependency that does not make what it should: the job fails
        # when it starts, naming the file.
        never = self.submit(self.program("never", "true"), "--hold")
        missing = os.path.join(self.dir, "never-made.txt")
        lost_cfg = self.gpt("lost", steps=2)
        with open(lost_cfg) as f:
            text = f.read().replace("train = %s" % self.corpus, "train = %s" % missing)
        with open(lost_cfg, "w") as f:
            f.write(text)
        lost = self.submit(lost_cfg, "--after", str(never))
        # A daemon restart keeps their leave to wait for their inputs.
        self.assertEqual(self.d.stop(), 0)
        self.d = Daemon(CONF, args=("--state-dir", os.path.join(self.d.dir, "state")))
        self.addCleanup(self.d.cleanup)
        for jid in (base, tune, lost):
            j = self.info(jid)
            self.assertEqual((j["state"], j["reason"]), ("queued", ""), j)
        self.d.ctl("release", str(prep))
        self.d.ctl("release", str(never))
        self.assertEqual(self.wait_state(tune, "completed", "failed", "cancelled")["state"], "completed",
                         self.d.ctl("logs", str(tune)).stdout)
        self.assertEqual(self.info(base)["state"], "completed")
        self.assertTrue(os.path.isfile(os.path.join(self.dir, "out-tune", "model.safetensors")))
        j = self.wait_state(lost, "completed", "failed", "cancelled")
        self.assertEqual(j["state"], "failed", j)
        self.assertIn(missing, j["reason"])

    # ---- requeue ------------------------------------------------------------------

    def test_requeue_a_failed_job(self):
        # Fails the first time, succeeds the second.
        flag = os.path.join(self.dir, "flag")
        a = self.submit(self.program("a", "test -e %s || { touch %s; exit 3; }" % (flag, flag)), "--hold")
        b = self.submit(self.program("b", "true"), "--after", str(a))
        self.d.ctl("release", str(a))
        self.assertEqual(self.wait_state(a, "failed")["reason"], "exited with status 3")
        self.wait_state(b, "cancelled")
        r = self.d.ctl("requeue", str(a))
        self.assertEqual(r.stdout, "job %d requeued\n" % a)
        j = self.wait_state(a, "completed")
        self.assertEqual(j["reason"], "")
        # What a failure cancelled stays cancelled; it can go again itself.
        self.assertEqual(self.info(b)["state"], "cancelled")
        self.d.ctl("requeue", str(b))
        self.wait_state(b, "completed")
        r = self.d.ctl("requeue", str(b), check=False)  # requeue of a completed job runs it again
        self.assertEqual(r.returncode, 0, r.stderr)
        self.wait_state(b, "completed")
        h = self.submit(self.program("h", "true"), "--hold")
        r = self.d.ctl("requeue", str(h), check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("job %d is queued already" % h, r.stderr)
        self.d.ctl("cancel", str(h))

    def test_requeue_a_running_engine_job_resumes(self):
        a = self.submit(self.gpt("run", steps=400))
        j = self.wait(a, lambda j: j["step"] >= 3, "reached step 3")
        self.assertEqual(j["resumes"], 0)
        r = self.d.ctl("requeue", str(a))
        self.assertIn("job %d stopping, to be queued again" % a, r.stdout)
        # Stopped after a checkpoint, queued, then resumed from it.
        j = self.wait(a, lambda j: j["resumes"] == 1 and j["state"] == "running" and j["step"] > 0,
                      "resumed from its checkpoint")
        self.assertEqual(j["reason"], "")
        r = self.d.ctl("logs", str(a))
        self.assertEqual(r.stdout.count("starting on cpu0"), 2, r.stdout)
        self.d.ctl("cancel", str(a))
        self.assertIn("cancelled at step", self.wait_state(a, "cancelled")["reason"])
        # A completed engine job's run is finished: queued again it would
        # train nothing, so it is refused, naming its directory.
        done = self.submit(self.gpt("done", steps=3))
        self.wait_state(done, "completed")
        r = self.d.ctl("requeue", str(done), check=False)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("job %d completed: its run in %s is finished" % (done, self.info(done)["out_dir"]), r.stderr)
        self.assertEqual(self.info(done)["state"], "completed")

    # ---- another user ---------------------------------------------------------------

    @unittest.skipUnless(os.geteuid() == 0 and shutil.which("setpriv"), "needs root and setpriv to act as nobody")
    def test_other_user_cannot_hold_release_or_requeue(self):
        os.chmod(self.d.dir, 0o755)
        os.chmod(self.d.sock, 0o666)
        held = self.submit(self.program("held", "true"), "--hold")
        done = self.submit(self.program("done", "exit 1"))
        self.wait_state(done, "failed")
        nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
        for cmd, jid, what in (("hold", held, "hold it"), ("release", held, "release it"),
                               ("requeue", done, "requeue it")):
            r = subprocess.run(nobody + [GRADCTL, "-s", self.d.sock, cmd, str(jid)],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertIn("job %d belongs to root; only its owner, root or group" % jid, r.stderr)
            self.assertIn("may %s" % what, r.stderr)
        self.assertEqual((self.info(held)["state"], self.info(held)["held"]), ("queued", True))
        self.assertEqual(self.info(done)["state"], "failed")
        # Waiting for another user's job is allowed: everyone sees every job.
        cfg = self.program("theirs", "true")
        r = subprocess.run(nobody + [GRADCTL, "-s", self.d.sock, "submit", "--after", str(held), cfg],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        theirs = int(r.stdout.split()[1])
        self.assertEqual(self.info(theirs)["waiting"], "waiting for %d" % held)
        self.d.ctl("release", str(held))
        self.wait_state(theirs, "completed")


if __name__ == "__main__":
    unittest.main()
