"""Jobs through a real daemon and the real gradctl: lifecycle, cancel,
kill -9 and resume (bitwise), a queue that survives restarts in order,
ownership, bad job files, and watchers that hang up."""
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest

import harness
from harness import GRADCTL, GRADD, Daemon

def read_text(path):
    with open(path) as f:
        return f.read()


JOB = """
[job]
name = {name}
[model]
type = gpt
layers = 2
heads = 2
width = 32
context = 16
vocab = 256
[data]
format = text
train = {train}
val_fraction = 0.1
[train]
steps = {steps}
batch = 8
micro_batch = 4
lr = 3e-3
warmup = 2
threads = 1
eval_every = 0
eval_batches = 2
[output]
dir = {out}
checkpoint_every = {ckpt}
log_every = 1
"""


class Jobs(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gradd-jobs-")
        os.chmod(self.dir, 0o755)
        self.train = os.path.join(self.dir, "corpus.txt")
        harness.write_corpus(self.train)
        os.chmod(self.train, 0o644)
        self.state = os.path.join(self.dir, "state")
        self.d = None

    def tearDown(self):
        if self.d:
            self.d.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, conf="[daemon]\nmax_jobs_per_device = 1\n"):
        self.d = Daemon(conf, args=("--state-dir", self.state))
        return self.d

    def restart(self):
        """kill -9, then a new daemon on the same state dir and socket."""
        self.d.proc.kill()
        self.d.proc.wait()
        log = open(os.path.join(self.dir, "second.log"), "w")
        self.d.proc = subprocess.Popen([GRADD, "-c", self.d.conf, "-s", self.d.sock, "--state-dir", self.state],
                                       stdout=log, stderr=subprocess.STDOUT)
        self.d.wait_ready()

    def job(self, name, steps=6, ckpt=0, out=None):
        cfg = os.path.join(self.dir, name + ".cfg")
        with open(cfg, "w") as f:
            f.write(JOB.format(name=name, train=self.train, steps=steps, ckpt=ckpt,
                               out=out or os.path.join(self.dir, "out-" + name)))
        os.chmod(cfg, 0o644)
        return cfg

    def submit(self, cfg, *extra):
        r = self.d.ctl("submit", cfg, *extra)
        self.assertRegex(r.stdout, r"^job \d+ queued \(")
        return int(r.stdout.split()[1])

    def info(self, jid):
        return self.d.ctl_json("status", str(jid))

    def wait_state(self, jid, states, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            j = self.info(jid)
            if j["state"] in states:
                return j
            time.sleep(0.05)
        raise AssertionError("job %d stuck in %s" % (jid, self.info(jid)["state"]))

    def wait_step(self, jid, step, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            j = self.info(jid)
            if j["step"] >= step or j["state"] not in ("queued", "running"):
                return j
            time.sleep(0.02)
        raise AssertionError("job %d never reached step %d" % (jid, step))

    # ---- lifecycle -------------------------------------------------------------

    def test_submit_watch_complete(self):
        self.start()
        jid = self.submit(self.job("life", steps=8))
        r = self.d.ctl("watch", str(jid))  # not a tty: plain lines, until the end
        self.assertIn("job %d completed" % jid, r.stdout)
        self.assertIn("step 8/8", r.stdout)
        j = self.info(jid)
        self.assertEqual((j["state"], j["step"], j["steps"]), ("completed", 8, 8))
        self.assertEqual(j["user"], pwd.getpwuid(os.getuid()).pw_name)
        self.assertTrue(os.path.exists(os.path.join(j["out_dir"], "model.safetensors")))
        rows = self.d.ctl_json("list")["jobs"]
        self.assertEqual([(x["id"], x["state"]) for x in rows], [(jid, "completed")])
        self.assertEqual(self.d.ctl_json("list", "--state", "queued")["jobs"], [])
        self.assertIn("job %d completed" % jid, self.d.ctl("logs", str(jid)).stdout)
        text = self.d.ctl("list").stdout
        self.assertIn("life", text)
        self.assertIn("8/8", text)
        # The job's memory went back to the pool.
        self.assertEqual(self.d.ctl_json("stats")["pools"][0]["allocated_bytes"]["all"]["current"], 0)
        m = self.d.ctl("metrics").stdout
        self.assertIn('gradd_jobs{state="completed"} 1', m)

    def test_results_outlive_the_daemon(self):
        # A finished job's step, losses and time are in its state, not only
        # in the daemon's memory: a restart keeps them.
        self.start()
        jid = self.submit(self.job("kept", steps=8, ckpt=4))
        before = self.wait_state(jid, ("completed", "failed"))
        self.assertEqual(before["state"], "completed", before["reason"])
        self.restart()
        after = self.info(jid)
        keys = ("state", "step", "loss", "val_loss", "micro", "accum", "elapsed_s")
        self.assertEqual({k: after[k] for k in keys}, {k: before[k] for k in keys})
        self.assertEqual(after["step"], 8)
        self.assertIn("8/8", self.d.ctl("list").stdout)
        # The same job again on its finished output: nothing to train, so
        # it is refused ([output] resume) rather than "completed" at once.
        r = self.d.ctl("submit", self.job("kept", steps=8, ckpt=4), check=False)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("holds a finished run (step 8 of [train] steps 8", r.stderr)

    @unittest.skipUnless(os.path.exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"),
                         "needs Debian's dataset-fashion-mnist")
    def test_mlp_job(self):
        self.start()
        fm = "/usr/share/datasets/fashion-mnist/"
        cfg = os.path.join(self.dir, "mlp.cfg")
        with open(cfg, "w") as f:
            f.write("[model]\ntype = mlp\nhidden = 64\n[data]\nformat = idx\n"
                    "train = %strain-images-idx3-ubyte.gz\ntrain_labels = %strain-labels-idx1-ubyte.gz\n"
                    "val = %st10k-images-idx3-ubyte.gz\nval_labels = %st10k-labels-idx1-ubyte.gz\n"
                    "subset = 2048\nval_subset = 512\n[train]\nsteps = 40\nbatch = 64\nlr = 2e-3\nthreads = 1\n"
                    "[output]\ndir = %s/out-mlp\n" % (fm, fm, fm, fm, self.dir))
        jid = self.submit(cfg)
        r = self.d.ctl("watch", str(jid))
        self.assertIn("job %d completed" % jid, r.stdout)
        j = self.info(jid)
        self.assertEqual(j["steps"], 40)
        self.assertGreater(j["val_accuracy"], 0.5)
        self.assertTrue(os.path.exists(os.path.join(self.dir, "out-mlp", "model.safetensors")))

    def test_priority_then_submit_order(self):
        self.start()
        first = self.submit(self.job("blocker", steps=100000))
        self.wait_state(first, ("running",))
        low = self.submit(self.job("low", steps=2))
        high = self.submit(self.job("high", steps=2), "--priority", "9")
        mid = self.submit(self.job("mid", steps=2), "--priority", "9")
        self.d.ctl("cancel", str(first))
        for jid in (high, mid, low):
            self.wait_state(jid, ("completed",))
        started = {jid: self.info(jid)["started_at"] for jid in (high, mid, low)}
        self.assertLess(started[high], started[mid])
        self.assertLess(started[mid], started[low])

    # ---- cancel ----------------------------------------------------------------

    def test_cancel_queued_and_running(self):
        self.start()
        run = self.submit(self.job("running", steps=100000, ckpt=0))
        queued = self.submit(self.job("waiting", steps=5))
        self.wait_step(run, 2)
        # The overview: the device counts its running job; both active jobs
        # follow, running first.
        text = self.d.ctl("status").stdout
        dev = [l.split() for l in text.splitlines() if l.startswith("cpu0")]
        self.assertEqual(dev[0][-1], "1", text)
        rows = [l.split() for l in text.splitlines() if l.strip()[:1].isdigit()]
        self.assertEqual([(int(r[0]), r[3]) for r in rows], [(run, "running"), (queued, "queued")], text)
        # The running job tells the pool what it needs at its micro-batch
        # (what other jobs' budgets count), which covers what it holds.
        usage = [u for u in self.d.ctl_json("stats")["pools"][0]["jobs"] if u["job"] == run]
        self.assertEqual(len(usage), 1)
        self.assertGreater(usage[0]["need"], 0)
        self.assertGreaterEqual(usage[0]["need"], usage[0]["allocated"])
        self.assertIn("NEED", self.d.ctl("stats").stdout)
        # Its memory by tag, each with the peak since it started: the
        # activations come and go, the parameters stay.
        tags = self.info(run)["mem_tags"]
        self.assertGreater(tags["activations"]["peak"], 0)
        for name, t in tags.items():
            self.assertGreaterEqual(t["peak"], t["current"], name)
        self.assertEqual(tags["params"]["peak"], tags["params"]["current"])
        job_tags = usage[0]["tags"]
        self.assertGreater(job_tags["activations"]["peak"], 0)
        r = self.d.ctl("cancel", str(queued))
        self.assertIn("job %d cancelled" % queued, r.stdout)
        self.assertEqual(self.info(queued)["state"], "cancelled")
        r = self.d.ctl("cancel", str(run))
        self.assertIn("stopping", r.stdout)
        j = self.wait_state(run, ("cancelled",))
        self.assertIn("cancelled at step", j["reason"])
        # The stop left a checkpoint to resume from.
        self.assertTrue(os.path.exists(os.path.join(j["out_dir"], "resume.safetensors")))
        r = self.d.ctl("cancel", str(run), check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("job %d is already cancelled" % run, r.stderr)
        r = self.d.ctl("cancel", "999", check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no job 999", r.stderr)
        # Nothing active: no job table.
        self.assertNotIn("STATE", self.d.ctl("status").stdout)

    # ---- kill -9 and resume ------------------------------------------------------

    def test_kill9_resume_is_bitwise(self):
        # The reference: the same job file trained straight through.
        # Long enough (2000 steps, a few seconds) to be running still after
        # the resume has been recorded.
        ref_cfg = self.job("reference", steps=2000, ckpt=50)
        subprocess.run([GRADD, "run", ref_cfg], check=True, capture_output=True, timeout=300)
        self.start()
        jid = self.submit(self.job("crashy", steps=2000, ckpt=50))
        j = self.wait_step(jid, 60)
        self.assertEqual(j["state"], "running", "the job finished before the test could interrupt it")
        self.restart()
        # Once resumed, the count is on disk at once, not
        # only at the job's end: a second crash must not lose it.
        state = os.path.join(self.state, "jobs", str(jid), "state")
        deadline = time.time() + 30
        while "resumes=1\n" not in read_text(state):
            self.assertLess(time.time(), deadline, "the resume was never recorded")
            time.sleep(0.05)
        j = self.info(jid)
        self.assertEqual(j["state"], "running", "the job finished before the test could interrupt it again")
        self.restart()
        j = self.wait_state(jid, ("completed", "failed"), timeout=300)
        self.assertEqual(j["state"], "completed", j["reason"])
        self.assertEqual(j["resumes"], 2)
        a = open(os.path.join(self.dir, "out-reference", "model.safetensors"), "rb").read()
        b = open(os.path.join(self.dir, "out-crashy", "model.safetensors"), "rb").read()
        self.assertEqual(a, b, "the resumed job's model differs from an uninterrupted run")

    def test_sigterm_requeues_and_restart_resumes(self):
        ref_cfg = self.job("ref-term", steps=600, ckpt=0)
        subprocess.run([GRADD, "run", ref_cfg], check=True, capture_output=True, timeout=300)
        self.start()
        jid = self.submit(self.job("termed", steps=600, ckpt=0))
        j = self.wait_step(jid, 3)
        self.assertEqual(j["state"], "running", "the job finished before the test could interrupt it")
        # SIGTERM: the job checkpoints at its next poll and goes back
        # to the queue; the daemon exits cleanly.
        self.d.proc.send_signal(signal.SIGTERM)
        self.assertEqual(self.d.proc.wait(timeout=60), 0)
        with open(os.path.join(self.state, "jobs", str(jid), "state")) as f:
            self.assertIn("state=queued", f.read())
        self.assertTrue(os.path.exists(os.path.join(self.dir, "out-termed", "resume.safetensors")))
        log = open(os.path.join(self.dir, "third.log"), "w")
        self.d.proc = subprocess.Popen([GRADD, "-c", self.d.conf, "-s", self.d.sock, "--state-dir", self.state],
                                       stdout=log, stderr=subprocess.STDOUT)
        self.d.wait_ready()
        j = self.wait_state(jid, ("completed", "failed"), timeout=300)
        self.assertEqual(j["state"], "completed", j["reason"])
        self.assertEqual(j["resumes"], 1)
        a = open(os.path.join(self.dir, "out-ref-term", "model.safetensors"), "rb").read()
        b = open(os.path.join(self.dir, "out-termed", "model.safetensors"), "rb").read()
        self.assertEqual(a, b, "the requeued job's model differs from an uninterrupted run")

    def test_a_refused_resume_keeps_the_steps_it_had(self):
        # Stopped with a checkpoint, which is then damaged: the restarted
        # job fails naming it, and still shows the step it had reached.
        self.start()
        jid = self.submit(self.job("damaged", steps=100000, ckpt=0))
        self.wait_step(jid, 3)
        self.d.proc.send_signal(signal.SIGTERM)
        self.assertEqual(self.d.proc.wait(timeout=60), 0)
        with open(os.path.join(self.state, "jobs", str(jid), "state")) as f:
            step = int([l for l in f.read().splitlines() if l.startswith("step=")][0].split("=")[1])
        self.assertGreaterEqual(step, 3)
        resume = os.path.join(self.dir, "out-damaged", "resume.safetensors")
        os.truncate(resume, 16)
        log = open(os.path.join(self.dir, "third.log"), "w")
        self.d.proc = subprocess.Popen([GRADD, "-c", self.d.conf, "-s", self.d.sock, "--state-dir", self.state],
                                       stdout=log, stderr=subprocess.STDOUT)
        self.d.wait_ready()
        j = self.wait_state(jid, ("completed", "failed"), timeout=120)
        self.assertEqual(j["state"], "failed", j)
        self.assertTrue(j["reason"].startswith("cannot resume: %s" % resume), j["reason"])
        self.assertEqual(j["step"], step)

    def test_fifty_queued_jobs_survive_restart_in_order(self):
        self.start()
        # The blocker outranks the rest, so after the restart it runs first
        # again and the fifty stay queued.
        blocker = self.submit(self.job("blocker", steps=100000), "--priority", "10")
        self.wait_state(blocker, ("running",))
        # Each in its own output directory: one live job per directory.
        ids = [self.submit(self.job("many-%02d" % i, steps=2), "--name", "many-%02d" % i, "--priority", str(i % 3))
               for i in range(50)]
        before = [(x["id"], x["name"], x["priority"], x["state"]) for x in self.d.ctl_json("list")["jobs"]]
        self.restart()
        after = [(x["id"], x["name"], x["priority"], x["state"]) for x in self.d.ctl_json("list")["jobs"]]
        # Same jobs, same order, none lost or finished by the restart (the
        # worker of the new daemon may already have started one of them).
        self.assertEqual([a[:3] for a in after], [b[:3] for b in before])
        self.assertEqual(len(after), 51)
        self.assertTrue(all(a[3] == "queued" for a in after[1:]), after)
        # A job not started yet shows the micro-batch its file fixes.
        queued = [x for x in self.d.ctl_json("list")["jobs"] if x["state"] == "queued"]
        self.assertEqual({(x["micro"], x["accum"]) for x in queued}, {(4, 2)})
        self.assertIn(" 4×2 ", self.d.ctl("list", "--state", "queued").stdout)
        # Newly submitted jobs get fresh ids after a restart.
        nid = self.submit(self.job("many-new", steps=2))
        self.assertEqual(nid, ids[-1] + 1)
        for jid in [blocker] + ids + [nid]:
            self.d.ctl("cancel", str(jid), check=False)

    def test_finished_job_outlives_its_data(self):
        # A finished job's data may be deleted: after a restart it keeps its
        # settings and results (its output dir, its steps, a model to
        # sample from).  (A queued one whose data is gone fails instead.)
        own = os.path.join(self.dir, "own-corpus.txt")
        shutil.copy(self.train, own)
        cfg = self.job("gone", steps=6)
        with open(cfg) as f:
            text = f.read().replace(self.train, own)
        with open(cfg, "w") as f:
            f.write(text)
        self.start()
        jid = self.submit(cfg)
        self.wait_state(jid, ("completed",))
        before = self.info(jid)
        os.unlink(own)
        self.restart()
        after = self.info(jid)
        self.assertEqual(after["state"], "completed", after)
        for key in ("out_dir", "step", "steps", "loss", "model"):
            self.assertEqual(after.get(key), before.get(key), (key, before, after))
        self.assertNotIn("without its settings", read_text(os.path.join(self.dir, "second.log")))
        r = self.d.ctl("sample", str(jid), "--tokens", "20", "--seed", "1", check=False)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_long_list_comes_in_frames(self):
        # 301 jobs: more than one ListResponse frame (256 a frame).  gradctl
        # gathers them: every job once, in id order, in list, list --json,
        # a filtered list and status.
        self.start("[daemon]\nmax_jobs_per_device = 1\nmax_queued_per_user = 1000\n")
        blocker = self.submit(self.job("blocker", steps=100000), "--priority", "10")
        self.wait_state(blocker, ("running",))
        ids = [self.submit(self.job("many-%03d" % i, steps=2), "--name", "many-%03d" % i) for i in range(300)]
        jobs = self.d.ctl_json("list")["jobs"]
        self.assertEqual([j["id"] for j in jobs], [blocker] + ids)
        queued = self.d.ctl_json("list", "--state", "queued")["jobs"]
        self.assertEqual([j["id"] for j in queued], ids)
        text = self.d.ctl("list").stdout.splitlines()
        self.assertEqual(len(text), 1 + 301)
        self.assertIn("many-299", text[-1])
        self.assertEqual(sum("many-" in line for line in self.d.ctl("status").stdout.splitlines()), 300)
        # On the wire: frames with `more` set, then one without.
        s = harness.connect(self.d.sock)
        s.sendall(harness.frame(harness.field_varint(1, harness.PROTOCOL_VERSION) + harness.field_bytes(21, b"")))
        counts, mores = [], []
        while True:
            lr = harness.parse_fields(harness.parse_fields(harness.recv_frame(s))[21][0])
            counts.append(len(lr.get(1, [])))
            mores.append(lr.get(2, [0])[0])
            if not mores[-1]:
                break
        s.close()
        self.assertEqual(sum(counts), 301)
        self.assertEqual(counts[0], 256)
        self.assertEqual(mores, [1] * (len(mores) - 1) + [0])
        for jid in [blocker] + ids:
            self.d.ctl("cancel", str(jid), check=False)

    # ---- ownership and bad files --------------------------------------------------

    @unittest.skipUnless(os.geteuid() == 0, "needs root to act as a second user (setpriv)")
    def test_other_user_cannot_cancel(self):
        self.start()
        os.chmod(self.d.dir, 0o755)
        os.chmod(self.d.sock, 0o666)
        jid = self.submit(self.job("mine", steps=100000))
        self.wait_state(jid, ("running",))
        nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
        r = subprocess.run(nobody + [GRADCTL, "-s", self.d.sock, "cancel", str(jid)],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("only its owner, root or group", r.stderr)
        self.assertEqual(self.info(jid)["state"], "running")
        r = subprocess.run(nobody + [GRADCTL, "-s", self.d.sock, "rm", str(jid)],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("only its owner, root or group", r.stderr)
        self.assertIn("may remove it", r.stderr)
        # Its log is its owner's, as a batch job's output file would be.
        r = subprocess.run(nobody + [GRADCTL, "-s", self.d.sock, "logs", str(jid)],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("may read its log", r.stderr)
        self.assertEqual(r.stdout, "")
        # Anyone may list and watch.
        r = subprocess.run(nobody + [GRADCTL, "-s", self.d.sock, "--json", "list"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["jobs"][0]["id"], jid)
        # nobody cannot have root's private data read for it.
        secret = os.path.join(self.dir, "secret.txt")
        shutil.copy(self.train, secret)
        os.chmod(secret, 0o600)
        cfg = os.path.join(self.dir, "steal.cfg")
        with open(cfg, "w") as f:
            f.write(JOB.format(name="steal", train=secret, steps=2, ckpt=0, out="/tmp/gradd-steal-%d" % os.getpid()))
        os.chmod(cfg, 0o644)
        r = subprocess.run(nobody + [GRADCTL, "-s", self.d.sock, "submit", cfg],
                           capture_output=True, text=True, timeout=30)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("secret.txt", r.stderr)
        self.assertIn("ermission denied", r.stderr)
        self.d.ctl("cancel", str(jid))

    @unittest.skipUnless(os.geteuid() == 0, "needs root to act as other users (setpriv)")
    def test_admin_group_is_not_the_socket_group(self):
        # The socket's group may use gradd; only admin_group acts on others' jobs.
        import grp
        self.start("[daemon]\nsocket_group = daemon\nadmin_group = nogroup\n")
        self.assertEqual(os.stat(self.d.sock).st_gid, grp.getgrnam("daemon").gr_gid)
        self.assertEqual(os.stat(self.d.sock).st_mode & 0o777, 0o660)
        os.chmod(self.d.dir, 0o755)
        jid = self.submit(self.job("roots", steps=100000))
        self.wait_state(jid, ("running",))

        def ctl_as(group, *args):
            return subprocess.run(["setpriv", "--reuid=daemon", "--regid=" + group, "--groups=daemon", GRADCTL,
                                   "-s", self.d.sock] + list(args), capture_output=True, text=True, timeout=30)
        r = ctl_as("daemon", "logs", str(jid))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("only its owner, root or group 'nogroup' may read its log", r.stderr)
        r = ctl_as("daemon", "cancel", str(jid))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertEqual(self.info(jid)["state"], "running")
        r = ctl_as("nogroup", "logs", str(jid))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("== job %d (roots) starting on cpu0" % jid, r.stdout)
        r = ctl_as("nogroup", "cancel", str(jid))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.wait_state(jid, ("cancelled",))["state"], "cancelled")

    def test_bad_job_files(self):
        self.start()
        bad = os.path.join(self.dir, "bad.cfg")
        with open(bad, "w") as f:
            f.write("[model]\ntype = gpt\nwdith = 64\n")
        r = self.d.ctl("submit", bad, check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("%s:3: [model] wdith: unknown key" % bad, r.stderr)
        with open(bad, "w") as f:
            f.write(JOB.format(name="x", train="/nonexistent/data.txt", steps=2, ckpt=0, out=self.dir + "/o"))
        r = self.d.ctl("submit", bad, check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("[data] train: cannot read /nonexistent/data.txt", r.stderr)
        # A 16-bit job that could only land on a CPU device would fail when
        # it starts: refused at submit instead (no GPU in CI; with one,
        # device = cpu says the same).
        # What only the daemon can find out still names the line.
        def line_of(text, key):
            return [l.split(" =")[0] for l in text.split("\n")].index(key) + 1
        for prec in ("bf16", "fp16"):
            text = (JOB.format(name="x", train=self.train, steps=2, ckpt=0, out=self.dir + "/o")
                    .replace("[train]", "[train]\nprecision = %s" % prec).replace("[job]", "[job]\ndevice = cpu"))
            with open(bad, "w") as f:
                f.write(text)
            r = self.d.ctl("submit", bad, check=False)
            self.assertEqual(r.returncode, 2, r.stdout)
            self.assertIn("%s:%d: [train] precision: %s needs a CUDA device, and [job] device 'cpu' runs on a CPU"
                          % (bad, line_of(text, "precision"), prec), r.stderr)
        text = JOB.format(name="x", train=self.train, steps=2, ckpt=0, out=self.dir + "/o").replace(
            "[job]", "[job]\ndevice = cpu7")
        with open(bad, "w") as f:
            f.write(text)
        r = self.d.ctl("submit", bad, check=False)
        self.assertEqual(r.returncode, 2, r.stdout)
        # Naming the devices there are, and nothing of CUDA for a CPU.
        self.assertIn("%s:%d: [job] device: no device 'cpu7' on this daemon (it has cpu0)\n"
                      % (bad, line_of(text, "device")), r.stderr)
        # A name is shown in every user's terminal: no control characters,
        # whether it comes from the key or from the file's name.
        with open(bad, "w") as f:
            f.write(JOB.format(name="x\x1b]0;pwned\x07", train=self.train, steps=2, ckpt=0, out=self.dir + "/o"))
        r = self.d.ctl("submit", bad, check=False)
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn("%s:3: [job] name: contains a control character" % bad, r.stderr)
        odd = os.path.join(self.dir, "odd\x1b[2J.cfg")
        with open(odd, "w") as f:
            f.write(JOB.format(name="x", train=self.train, steps=2, ckpt=0, out=self.dir + "/o")
                    .replace("name = x\n", ""))
        r = self.d.ctl("submit", odd, check=False)
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn("[job] name: contains a control character (it is the file's name", r.stderr)
        self.assertEqual(self.d.ctl_json("list")["jobs"], [])
        # No jobs: the headings say the answer is none; scripts ask for none.
        out = self.d.ctl("list").stdout
        self.assertEqual(len(out.splitlines()), 1, out)
        self.assertTrue(out.startswith("ID  USER  NAME  STATE  DEVICE"), out)
        self.assertEqual(self.d.ctl("list", "--noheadings").stdout, "")
        self.assertEqual(self.d.ctl("history", "-o", "job,state").stdout, "JOB  STATE\n")

    def test_refused_submit_leaves_no_directory(self):
        # Refused by a check after the one that makes [output] dir, by the
        # daemon's queue, or while accepted: the job makes the directory
        # when it starts, and a submit leaves none behind.
        self.start()
        top = os.path.join(self.dir, "deep")
        out = os.path.join(top, "a", "b")
        cases = [(self.job("req", out=out), ("--hold",), "[output] resume = require",
                  "[output]\nresume = require"),
                 (self.job("after", out=out), ("--after", "99999"), "--after 99999: no such job", None),
                 (self.job("end", out=out), (), "[job] on_end: cannot execute /nonexistent/cmd",
                  "[job]\non_end = /nonexistent/cmd")]
        for cfg, extra, want, add in cases:
            if add:
                with open(cfg) as f:
                    text = f.read()
                section = add.split("\n")[0]
                with open(cfg, "w") as f:
                    f.write(text.replace(section + "\n", add + "\n", 1))
            r = self.d.ctl("submit", cfg, *extra, check=False)
            self.assertNotEqual(r.returncode, 0, r.stdout)
            self.assertIn(want, r.stderr)
            self.assertFalse(os.path.exists(top), "%s left %s behind" % (want, top))
        # Accepted and held: still no directory, until it runs.
        jid = self.submit(self.job("held", out=out), "--hold")
        self.assertFalse(os.path.exists(top))
        self.d.ctl("release", str(jid))
        self.assertEqual(self.wait_state(jid, ("completed", "failed"))["state"], "completed")
        self.assertTrue(os.path.isfile(os.path.join(out, "model.safetensors")))

    def test_job_file_limit_fits_the_frame(self):
        # Every file under the limit can be sent, and one over it is told
        # its size, not that a frame was too big.
        self.start("[daemon]\nmax_frame = 64K\nmax_job_file = 1M\n")
        text = JOB.format(name="big", train=self.train, steps=2, ckpt=0, out=os.path.join(self.dir, "o"))
        limit = 64 * 1024 - 8192
        cfg = os.path.join(self.dir, "big.cfg")
        for size, ok in ((limit, True), (limit + 1, False)):
            pad = size - len(text.encode())
            lines, rest = divmod(pad, 100)
            with open(cfg, "w") as f:
                f.write(text + ("#" * 99 + "\n") * lines + "#" * (rest - 1) + "\n")
            self.assertEqual(os.path.getsize(cfg), size)
            r = self.d.ctl("submit", cfg, check=False)
            if ok:
                self.assertEqual(r.returncode, 0, r.stderr)
            else:
                self.assertEqual(r.returncode, 2, r.stdout)
                self.assertIn("%s: %d bytes is more than this daemon accepts (%d: [daemon] max_job_file, at most "
                              "max_frame less 8192)" % (cfg, size, limit), r.stderr)

    def test_submit_overrides_checked_by_the_daemon(self):
        # Any client can send a SubmitRequest: its name and priority are
        # held to the job file's rules, not only gradctl's.
        self.start()
        cfg = self.job("raw", steps=2)
        with open(cfg, "rb") as f:
            contents = f.read()

        def submit(extra):
            body = harness.field_bytes(1, cfg.encode()) + harness.field_bytes(2, contents) + extra
            s = harness.connect(self.d.sock)
            s.sendall(harness.frame(harness.field_varint(1, harness.PROTOCOL_VERSION) + harness.field_bytes(20, body)))
            reply = harness.recv_frame(s)
            s.close()
            return harness.error_message(reply)

        self.assertEqual(submit(harness.field_bytes(3, b"a\nb\x1b[2J")),
                         "submit: the job name contains a control character")
        self.assertEqual(submit(harness.field_bytes(3, b"\xff\xfe")), "submit: the job name is not valid UTF-8")
        self.assertEqual(submit(harness.field_bytes(3, b"n" * 64)), "submit: the job name is too long")
        self.assertEqual(submit(harness.field_varint(4, 1) + harness.field_varint(5, 10**15)),
                         "submit: priority 1000000000000000 is not from 0 to 1000")
        self.assertEqual(submit(harness.field_varint(4, 1) + harness.field_varint(5, (1 << 64) - 2)),
                         "submit: priority -2 is not from 0 to 1000")
        self.assertEqual(self.d.ctl_json("list")["jobs"], [])
        self.assertIsNone(submit(harness.field_bytes(3, "größe".encode()) + harness.field_varint(4, 1)
                                 + harness.field_varint(5, 1000)))
        j = self.d.ctl_json("list")["jobs"][0]
        self.assertEqual((j["name"], j["priority"]), ("größe", 1000))

    def test_submit_from_stdin(self):
        # A generated job piped in: relative paths mean what they do in the
        # shell that piped it, and messages name "(stdin)" there.
        self.start()
        text = JOB.format(name="piped", train=os.path.basename(self.train), steps=2, ckpt=0, out="rel-out")
        r = subprocess.run([GRADCTL, "-s", self.d.sock, "submit", "-"], input=text, capture_output=True, text=True,
                           timeout=60, cwd=os.path.dirname(self.train))
        self.assertEqual(r.returncode, 0, r.stderr)
        jid = int(r.stdout.split()[1])
        j = self.wait_state(jid, ("completed", "failed"))
        self.assertEqual(j["state"], "completed", j["reason"])
        base = os.path.realpath(os.path.dirname(self.train))
        self.assertEqual(j["out_dir"], os.path.join(base, "rel-out"))
        self.assertEqual(j["job_file"], os.path.join(base, "(stdin)"))
        r = subprocess.run([GRADCTL, "-s", self.d.sock, "submit", "-"], input="[model]\ntype = gpt\nlayers = x\n",
                           capture_output=True, text=True, timeout=60, cwd=base)
        self.assertEqual(r.returncode, 2)
        self.assertIn("gradctl submit: (stdin):3: [model] layers: 'x' is not a whole number", r.stderr)
        self.assertNotIn(base, r.stderr)

    def test_rm_forgets_a_finished_job(self):
        self.start()
        done = self.submit(self.job("done", steps=3))
        self.assertEqual(self.wait_state(done, ("completed",))["state"], "completed")
        out = self.info(done)["out_dir"]
        running = self.submit(self.job("busy", steps=100000))
        self.wait_step(running, 1)
        r = self.d.ctl("rm", str(running), check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("job %d is running; cancel it first" % running, r.stderr)
        r = self.d.ctl("rm", str(done))
        self.assertEqual(r.stdout, "job %d removed (done)\n" % done)
        self.assertEqual([x["id"] for x in self.d.ctl_json("list")["jobs"]], [running])
        self.assertFalse(os.path.exists(os.path.join(self.state, "jobs", str(done))))
        # Its outputs are the owner's, and stay.
        self.assertTrue(os.path.exists(os.path.join(out, "model.safetensors")))
        r = self.d.ctl("rm", str(done), check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no job %d" % done, r.stderr)
        self.d.ctl("cancel", str(running))
        self.wait_state(running, ("cancelled",))
        # Gone after a restart too, and its id is not given again.
        self.restart()
        self.assertEqual([x["id"] for x in self.d.ctl_json("list")["jobs"]], [running])
        self.assertEqual(self.submit(self.job("next", steps=2)), running + 1)

    def test_keep_finished_forgets_old_jobs(self):
        # [daemon] keep_finished = 1s: a finished job goes about a second
        # after it ends, as gradctl rm; a running one stays.
        self.start("[daemon]\nkeep_finished = 1s\n")
        done = self.submit(self.job("short", steps=2))
        self.wait_state(done, ("completed",))
        busy = self.submit(self.job("long", steps=100000))
        deadline = time.time() + 30
        while done in [x["id"] for x in self.d.ctl_json("list")["jobs"]]:
            self.assertLess(time.time(), deadline, "job %d was never forgotten" % done)
            time.sleep(0.1)
        self.assertFalse(os.path.exists(os.path.join(self.state, "jobs", str(done))))
        self.assertIn("job %d (short) forgotten" % done, self.d.read_log())
        self.assertIn("[daemon] keep_finished", self.d.read_log())
        self.assertEqual(self.info(busy)["state"], "running")
        self.d.ctl("cancel", str(busy))
        self.wait_state(busy, ("cancelled",))

    def test_all_cores_shared_among_cpu_slots(self):
        # threads = 0 with two CPU job slots: each job gets half the cores
        # (OpenMP threads of two jobs on the same cores stall each other).
        self.start("[cpu]\ndevices = 2\n")
        cfg = self.job("share", steps=3)
        with open(cfg) as f:
            text = f.read().replace("threads = 1\n", "")
        with open(cfg, "w") as f:
            f.write(text)
        jid = self.submit(cfg)
        self.assertEqual(self.wait_state(jid, ("completed", "failed"))["state"], "completed")
        share = max(1, len(os.sched_getaffinity(0)) // 2)
        self.assertIn("threads = 0: %d, this job's share of the cores among 2 CPU job slots" % share,
                      self.d.ctl("logs", str(jid)).stdout)
        # One slot: all cores, nothing said.
        self.d.stop()
        self.d.cleanup()
        self.start("[cpu]\ndevices = 1\n")
        shutil.rmtree(os.path.join(self.dir, "out-share"))  # else refused: it holds a finished run
        jid = self.submit(cfg)
        self.assertEqual(self.wait_state(jid, ("completed", "failed"))["state"], "completed")
        self.assertNotIn("share of the cores", self.d.ctl("logs", str(jid)).stdout)

    # ---- watchers ------------------------------------------------------------------

    def test_watcher_hanging_up_does_not_disturb_the_job(self):
        self.start()
        jid = self.submit(self.job("watched", steps=30))
        for _ in range(5):
            p = subprocess.Popen([GRADCTL, "-s", self.d.sock, "watch", str(jid)], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL)
            p.stdout.readline()
            p.kill()
            p.wait()
        s = harness.connect(self.d.sock)
        s.sendall(harness.frame(harness.field_varint(1, 1) + harness.field_bytes(24, harness.field_varint(1, jid))))
        harness.recv_frame(s)
        s.close()  # mid-stream, without reading further
        j = self.wait_state(jid, ("completed", "failed"))
        self.assertEqual(j["state"], "completed", j["reason"])


if __name__ == "__main__":
    harness.main()
