"""Adaptive batch sizing through a real daemon and the real gradctl: a
simulated process takes device memory and the job shrinks its micro-batch
(visible in `gradctl status`, `list` and metrics.jsonl), the process goes
away and the micro-batch grows back, tuning for throughput picks a size at
or below the fit and growth returns to it, and two jobs with limits share
one device and both finish."""
import json
import os
import shutil
import tempfile
import time

import harness

JOB = """
[job]
name = {name}
[model]
type = gpt
layers = 2
heads = 2
width = 32
context = 32
vocab = 256
[data]
format = text
train = {train}
val_fraction = 0.1
[train]
steps = {steps}
batch = 64
micro_batch = auto
lr = 1e-3
threads = 1
eval_batches = 1
[memory]
limit = {limit}
grow_after = {grow_after}
tune = {tune}
[output]
dir = {out}
log_every = 1
"""

# 64 MiB of simulated device; the pool trims under pressure below 8 MiB free.
CONF = """[daemon]
max_jobs_per_device = 2
[cpu]
capacity = 64M
[pool]
low_watermark = 8M
"""


class Adaptive(harness.DaemonTest):
    conf = CONF
    test_hooks = True

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gradd-adapt-")
        # Cleanups run after DaemonTest.tearDown has stopped the daemon.
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        os.chmod(self.dir, 0o755)
        self.train = os.path.join(self.dir, "corpus.txt")
        harness.write_corpus(self.train)
        super().setUp()

    def submit(self, name, steps, limit="0", tune="on", grow_after=4):
        cfg = os.path.join(self.dir, name + ".cfg")
        with open(cfg, "w") as f:
            f.write(JOB.format(name=name, train=self.train, steps=steps, limit=limit, tune=tune, grow_after=grow_after,
                               out=os.path.join(self.dir, "out-" + name)))
        r = self.d.ctl("submit", cfg)
        return int(r.stdout.split()[1])

    def info(self, jid):
        return self.d.ctl_json("status", str(jid))

    def wait_for(self, jid, pred, what, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            j = self.info(jid)
            if pred(j):
                return j
            self.assertIn(j["state"], ("queued", "running"), "job ended while waiting for %s: %s" % (what, j))
            time.sleep(0.05)
        self.fail("job %d: no %s within %ds: %s" % (jid, what, timeout, self.info(jid)))

    def device_free(self):
        return self.d.ctl_json("stats")["pools"][0]["device_free"]

    def events(self, jid):
        path = os.path.join(self.info(jid)["out_dir"], "metrics.jsonl")
        with open(path) as f:
            return [e for e in map(json.loads, f) if e.get("event") == "batch_change"]

    def test_pressure_shrinks_then_grows_back(self):
        # At the fitted size from the first step: tuning (below) would move it.
        # grow_after 40: under this pressure the shrink frees and trims the
        # segment whose slack caused it, and the job may then fit at its old
        # size again and grow back while the process still holds its memory
        # (seen in CI at the default 4, between the shrink and `list`).  40
        # steps leave the checks below ample time to see the shrink.
        jid = self.submit("squeeze", steps=100000, tune="off", grow_after=40)
        j = self.wait_for(jid, lambda j: j["step"] >= 3, "first steps")
        m0 = j["micro"]
        self.assertEqual(j["accum"], -(-64 // m0))
        self.assertEqual(j["last_change"]["reason"], "fit")
        # Another process takes all but 4 MiB of the free memory: under the
        # watermark, nothing cached to trim, so the job shrinks.
        free = self.device_free()
        self.d.ctl("test-pressure", "-d", "cpu0", str(free - (4 << 20)))
        j = self.wait_for(jid, lambda j: j["micro"] < m0, "shrink")
        self.assertEqual(j["last_change"]["reason"] in ("pressure", "oom"), True, j)
        self.assertEqual(j["accum"], -(-64 // j["micro"]))
        text = self.d.ctl("status", str(jid)).stdout
        self.assertIn("last change", text)
        self.assertIn("%d → %d" % (m0, j["micro"]), text)
        self.assertIn("->%d" % j["micro"], self.d.ctl("list").stdout)
        ev = self.events(jid)
        self.assertTrue(any(e["to"] == j["micro"] and e["reason"] in ("pressure", "oom") for e in ev), ev)
        # The process exits: after grow_after steps the job is back.
        self.d.ctl("test-pressure", "-d", "cpu0", "0")
        j = self.wait_for(jid, lambda j: j["micro"] == m0, "growth back")
        self.assertEqual(j["last_change"]["reason"], "grow")
        self.assertTrue(any(e["reason"] == "grow" and e["to"] == m0 for e in self.events(jid)))
        self.d.ctl("cancel", str(jid))

    def test_tuned_size_is_visible_and_growth_returns_to_it(self):
        jid = self.submit("tuned", steps=100000)
        # The sizes it tries and the choice, as events and in status/list.
        j = self.wait_for(jid, lambda j: j["last_change"] and j["last_change"]["reason"] == "tuned", "tuning")
        m0 = j["micro"]
        self.assertEqual(j["last_change"]["to"], m0)
        self.assertLessEqual(m0, j["micro_fit"])
        self.assertEqual(j["accum"], -(-64 // m0))
        ev = self.events(jid)
        self.assertEqual(ev[0]["reason"], "fit", ev)
        self.assertEqual(ev[0]["to"], j["micro_fit"], ev)
        tried = [e["to"] for e in ev if e["reason"] == "tuning"]
        self.assertTrue(tried, ev)
        self.assertTrue(all(b < a for a, b in zip([ev[0]["to"]] + tried, tried)), ev)
        self.assertIn(m0, [ev[0]["to"]] + tried)
        self.assertEqual(ev[-1]["reason"], "tuned", ev)
        self.assertIn("tuned", self.d.ctl("status", str(jid)).stdout)
        text = self.d.ctl("list").stdout
        self.assertIn("->%d tuned" % m0, text)
        # FIT is the size found to fit, where growth stops.
        row = [l.split() for l in text.splitlines() if l.split()[:1] == [str(jid)]][0]
        self.assertEqual(row[-4], str(j["micro_fit"]), text)  # ... FIT OOMS "1->16 tuned@21"
        if m0 == 1:
            # Seen on a loaded 2-core machine, where timing favours tiny
            # sizes: there is nothing smaller to shrink to.  The tuning
            # tests of test_batch_ctl and test_batch_fit cover growth back
            # to the tuned size with a cost they control.
            self.d.ctl("cancel", str(jid))
            self.skipTest("tuned to micro-batch 1: nothing to shrink to")
        # Pressure, then none: growth goes back to the tuned size, not the
        # fit.  The sizes tried on the way down left segments cached; a
        # small tuned size fits in the small pool, so the pressure trim
        # would hand all of them back and the job would have no need to
        # shrink (trim first, then shrink).  Trim now, so that the 4 MiB
        # left is what remains after the cache is gone.
        self.d.ctl("trim", "-d", "cpu0")
        free = self.device_free()
        self.d.ctl("test-pressure", "-d", "cpu0", str(free - (4 << 20)))
        j = self.wait_for(jid, lambda j: j["micro"] < m0, "shrink")
        self.d.ctl("test-pressure", "-d", "cpu0", "0")
        j = self.wait_for(jid, lambda j: j["micro"] == m0, "growth back")
        self.assertEqual(j["last_change"]["reason"], "grow")
        step = j["step"]
        j = self.wait_for(jid, lambda j: j["step"] >= step + 8, "steps after growth")
        self.assertEqual(j["micro"], m0, j)
        self.assertFalse(any(e["reason"] == "grow" and e["to"] != m0 for e in self.events(jid)), self.events(jid))
        self.d.ctl("cancel", str(jid))

    def test_two_jobs_fitting_at_once_share_the_device(self):
        self.d.stop()
        self.d.cleanup()
        # No watermark: only the two jobs' own budgets keep them apart.
        self.d = harness.Daemon("[daemon]\nmax_jobs_per_device = 2\n[cpu]\ncapacity = 48M\n", test_hooks=True)
        # Each alone would take more than half the device (batch 32 at about
        # 1M a sample).  Submitted together they fit one after the other,
        # each counting what the other settled on: no OOM, and each has
        # exactly one fit.
        ids = []
        for name in ("first", "second"):
            cfg = os.path.join(self.dir, name + ".cfg")
            with open(cfg, "w") as f:
                f.write(JOB.format(name=name, train=self.train, steps=12, limit="0", tune="on", grow_after=0,
                                   out=os.path.join(self.dir, "out-" + name))
                        .replace("width = 32", "width = 64").replace("context = 32", "context = 64")
                        .replace("batch = 64", "batch = 32"))
            ids.append(cfg)
        ids = [int(self.d.ctl("submit", cfg).stdout.split()[1]) for cfg in ids]
        deadline = time.time() + 240
        while time.time() < deadline and any(self.info(j)["state"] in ("queued", "running") for j in ids):
            time.sleep(0.05)
        fits = []
        for jid in ids:
            j = self.info(jid)
            self.assertEqual(j["state"], "completed", j)
            self.assertEqual(j["oom_recoveries"], 0, (j, self.events(jid)))
            # One fit, said once; the pool's rounding may still take the
            # device under its watermark and shrink one of them (pressure).
            ev = self.events(jid)
            reasons = [e["reason"] for e in ev]
            self.assertEqual(reasons[:1], ["fit"], ev)
            self.assertTrue(set(reasons[1:]) <= {"pressure", "grow", "tuning", "tuned"}, ev)
            self.assertNotIn("fit", reasons[1:], ev)
            fits.append(ev[0]["to"])
        # Not both at the full batch: together they would not have fitted.
        self.assertLess(min(fits), 32, fits)

    def test_two_jobs_with_limits_share_a_device(self):
        a = self.submit("left", steps=40, limit="20M")
        b = self.submit("right", steps=40, limit="20M")
        both = False
        deadline = time.time() + 240
        while time.time() < deadline:
            ja, jb = self.info(a), self.info(b)
            both |= ja["state"] == "running" and jb["state"] == "running"
            if ja["state"] not in ("queued", "running") and jb["state"] not in ("queued", "running"):
                break
            time.sleep(0.05)
        for j in (self.info(a), self.info(b)):
            self.assertEqual(j["state"], "completed", j)
            self.assertEqual(j["oom_recoveries"], 0, j)
        self.assertTrue(both, "the two jobs never ran at the same time")


if __name__ == "__main__":
    harness.main()
