"""An idle device gives its memory back, and one engine job's cache goes to
another before an OOM, through a real daemon and the real gradctl.

With [pool] idle_trim = 1s, a finished job's cache goes back to the
simulated device between one and two ticks after the job ends: reserved
falls to 0, `gradctl stats` and the metrics count one idle trim of exactly
what was reserved, and the timeline holds that trim with reason idle.
With idle_trim = 0 the cache stays.  A running job keeps its memory, and
cache that no job holds, however long idle_trim has passed.  Two engine
jobs on one 80 MiB device: what the first left cached, the second gets
back through the pool's trim and retry, and no OOM is counted."""
import json
import os
import time

import harness

MiB = 1 << 20
# The daemon's timer ticks once a second; the sanitizers slow it down.
LATE = 4.0 if harness.SANITIZED else 3.0


class JobsMixin:
    def setUp(self):
        self.dir, self.train = harness.scratch_corpus(self, "gradd-idle-")
        super().setUp()

    def submit(self, name, steps=3, width=32, context=32, micro=8):
        """A small byte-level GPT with a fixed micro-batch (no probing or
        tuning, so its memory is the same on every run)."""
        cfg = os.path.join(self.dir, name + ".cfg")
        harness.write_job(cfg, {
            "job": {"name": name},
            "model": {"type": "gpt", "layers": 2, "heads": 2, "width": width, "context": context, "vocab": 256},
            "data": {"format": "text", "train": self.train, "val_fraction": 0.1},
            "train": {"steps": steps, "batch": micro, "micro_batch": micro, "threads": 1, "eval_batches": 1},
            "memory": {"tune": "off"},
            "output": {"dir": os.path.join(self.dir, "out-" + name)},
        })
        return int(self.d.ctl("submit", cfg).stdout.split()[1])

    def info(self, jid):
        return self.d.ctl_json("status", str(jid))

    def finish_big_job(self, name):
        """Run a job with 20 MiB and more of activations to its end;
        (its id, the pool's stats then, what the pool holds then)."""
        jid = self.submit(name, width=64, context=64, micro=32)
        harness.wait_job(self.d, jid, ("completed",))
        p = self.pool()
        # What the job left: all of it cached, none of it in use.
        self.assertEqual(p["allocated_bytes"]["all"]["current"], 0)
        self.assertGreater(self.reserved(p), 20 * MiB)
        return jid, p, self.reserved(p)

    def pool(self):
        return self.d.ctl_json("stats")["pools"][0]

    def reserved(self, p=None):
        return (p or self.pool())["reserved_bytes"]["all"]["current"]

    def trace(self):
        out = os.path.join(self.d.dir, "trace.json")
        self.d.ctl("timeline", "-d", "cpu0", "-o", out)
        with open(out) as f:
            return [e for e in json.load(f)["traceEvents"] if e.get("ph") in ("i", "e")]


class IdleTrim(JobsMixin, harness.DaemonTest):
    conf = "[cpu]\ncapacity = 256M\n[pool]\nidle_trim = 1s\n"
    test_hooks = True

    def test_finished_job_cache_goes_back(self):
        jid, p, before = self.finish_big_job("done")
        self.assertEqual((p["trims"], p["idle_trims"], p["idle_trimmed_bytes"]), (0, 0, 0))
        deadline = time.time() + LATE + 1
        while self.reserved() and time.time() < deadline:
            time.sleep(0.05)
        p = self.pool()
        self.assertEqual(self.reserved(p), 0)
        self.assertEqual(p["device_free"], 256 * MiB)
        self.assertEqual((p["trims"], p["trimmed_bytes"]), (1, before))
        self.assertEqual((p["idle_trims"], p["idle_trimmed_bytes"]), (1, before))
        text = self.d.ctl("stats", "-d", "cpu0").stdout
        self.assertIn("(idle: 1, ", text)
        metrics = self.d.ctl("metrics").stdout
        self.assertIn('gradd_pool_idle_trims_total{device="cpu0",kind="cpu"} 1\n', metrics)
        self.assertIn('gradd_pool_idle_trimmed_bytes_total{device="cpu0",kind="cpu"} %d\n' % before, metrics)
        # The trim in the timeline, one to two ticks after the job's last free.
        ev = self.trace()
        trims = [e for e in ev if e["name"] == "trim"]
        self.assertEqual([(e["args"]["reason"], e["args"]["bytes"]) for e in trims], [("idle", before)])
        # A block's free ends its slice on its job's track ("free" only
        # where the ring lost its alloc).
        last_free = max(e["ts"] for e in ev if e["name"] == "job %d" % jid and e["ph"] == "e"
                        or e["name"] == "free" and e["args"]["job"] == jid)
        after = (trims[0]["ts"] - last_free) / 1e6
        self.assertGreaterEqual(after, 1.0)
        self.assertLess(after, LATE)
        # Nothing left to give back: no more trims, however long it stays idle.
        time.sleep(1.5)
        self.assertEqual(self.pool()["trims"], 1)

    def test_running_job_keeps_its_memory(self):
        jid = self.submit("long", steps=1000000)
        harness.wait_job(self.d, jid, ("running",))
        deadline = time.time() + 60
        while self.info(jid)["step"] < 3 and time.time() < deadline:
            time.sleep(0.02)
        # Cache no job holds, beside the job's own memory: a 30 MiB segment.
        self.d.ctl("test-alloc", "-d", "cpu0", "--job", "999", "30M")
        self.d.ctl("test-alloc", "-d", "cpu0", "--free-all")
        held = self.reserved()
        self.assertGreaterEqual(held, 30 * MiB)
        end = time.time() + 2.5
        while time.time() < end:
            p = self.pool()
            self.assertEqual((self.reserved(p), p["trims"]), (held, 0))
            time.sleep(0.1)
        self.assertEqual(self.info(jid)["state"], "running")
        # Once it stops, the device is idle and all of it goes back.
        self.d.ctl("cancel", str(jid))
        harness.wait_job(self.d, jid, ("cancelled",))
        deadline = time.time() + LATE + 1
        while self.reserved() and time.time() < deadline:
            time.sleep(0.05)
        p = self.pool()
        self.assertEqual((self.reserved(p), p["idle_trims"], p["idle_trimmed_bytes"]), (0, 1, p["trimmed_bytes"]))
        self.assertGreaterEqual(p["idle_trimmed_bytes"], held)


class Sharing(JobsMixin, harness.DaemonTest):
    # Two job slots on one small device; no idle trim, so that the first
    # job's cache is still there when the second needs its memory.
    conf = "[daemon]\nmax_jobs_per_device = 2\n[cpu]\ncapacity = 80M\n[pool]\nidle_trim = 0\n"

    def test_idle_trim_off_keeps_the_cache(self):
        _, _, before = self.finish_big_job("kept")
        time.sleep(2.5)
        p = self.pool()
        self.assertEqual((self.reserved(p), p["trims"], p["idle_trims"]), (before, 0, 0))

    def test_second_job_reclaims_the_first_jobs_cache(self):
        _, _, left = self.finish_big_job("first")
        # Twice the micro-batch: more than the 80 MiB cap minus what the
        # first job left cached.
        b = self.submit("second", width=64, context=64, micro=64)
        j = harness.wait_job(self.d, b, ("completed", "failed"))
        self.assertEqual(j["state"], "completed", j)
        # No OOM reached the job: its fixed micro-batch never changed.
        self.assertEqual((j["micro"], j["accum"], j["last_change"]), (64, 1, None), j)
        p = self.pool()
        self.assertEqual((p["ooms"], p["alloc_retries"], p["trims"], p["idle_trims"]), (0, 1, 1, 0))
        # What the trim gave back came from the first job's cache, and
        # without it the pool would have held more than its cap.
        freed = p["trimmed_bytes"]
        self.assertGreater(freed, 0)
        self.assertLessEqual(freed, left)
        self.assertGreater(self.reserved(p) + freed, p["cap"])
        ev = self.trace()
        self.assertEqual([(e["args"]["reason"], e["args"]["bytes"]) for e in ev if e["name"] == "trim"],
                         [("oom", freed)])
        self.assertEqual([e for e in ev if e["name"] == "oom"], [])


if __name__ == "__main__":
    harness.main()
