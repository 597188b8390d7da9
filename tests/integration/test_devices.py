"""A job over several devices of one daemon ([job] devices), through a real
gradd and the real gradctl, on two simulated cpu devices:

  - The queue holds it while one of its devices runs another job, though
    the other is free, and starts it once both are; a job submitted after
    it on the free device waits behind it.
  - While it runs, `gradctl status` names both devices and shows each
    one's part; the job trains a rank on each.
  - It ends with the weights of the same job trained in one process.
  - Cancelled, it stops on every rank with a checkpoint, and submitted
    again it resumes and ends at those same weights.
  - A device the daemon lacks is refused at submit, by name.
"""
import os
import shutil
import subprocess
import tempfile
import time

import harness

JOB = """[job]
name = {name}
{device}
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
val_fraction = 0.05
[train]
steps = {steps}
batch = 8
micro_batch = auto
lr = 1e-3
threads = 1
eval_batches = 1
seed = 3
[memory]
tune = off
[output]
dir = {out}
log_every = 1
checkpoint_every = 10
"""

TOL = 1e-5  # test_dist's: the ranks' sums in another order


class Devices(harness.DaemonTest):
    conf = "[daemon]\nclient_timeout = 60s\n[cpu]\ndevices = 2\ncapacity = 64M\n"

    def setUp(self):
        super().setUp()
        self.dir = tempfile.mkdtemp(prefix="gradd-devices-")
        self.train = os.path.join(self.dir, "train.txt")
        harness.write_corpus(self.train)

    def tearDown(self):
        super().tearDown()
        shutil.rmtree(self.dir, ignore_errors=True)

    def job(self, name, device, steps):
        path = os.path.join(self.dir, name + ".cfg")
        out = os.path.join(self.dir, "out-" + name)
        with open(path, "w") as f:
            f.write(JOB.format(name=name, device=device, train=self.train, steps=steps, out=out))
        return path, out

    def submit(self, cfg):
        return int(self.d.ctl("submit", cfg).stdout.split()[1])

    def info(self, jid):
        return self.d.ctl_json("status", str(jid))

    def wait(self, jid, pred, what, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            j = self.info(jid)
            if pred(j):
                return j
            time.sleep(0.05)
        self.fail("%s: %s" % (what, self.info(jid)))

    def alone(self, name, steps):
        """The same job trained by one `gradd run`: the weights to match."""
        cfg, out = self.job(name, "device = cpu", steps)
        r = subprocess.run([harness.GRADD, "run", cfg], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        return os.path.join(out, "model.safetensors")

    def test_held_until_both_devices_are_free_then_trains_as_one(self):
        steps = 150
        want = self.alone("alone", steps)
        busy_cfg, _ = self.job("busy", "device = cpu1", 1000000)
        busy = self.submit(busy_cfg)
        self.wait(busy, lambda j: j["state"] == "running", "the job on cpu1 runs")
        cfg, out = self.job("both", "devices = cpu0,cpu1", steps)
        jid = self.submit(cfg)
        # cpu0 is free, cpu1 is not: it waits, and keeps its place on cpu0
        # against a job submitted after it (else a busy server would never
        # free both at once).
        later_cfg, _ = self.job("later", "device = cpu0", 2)
        later = self.submit(later_cfg)
        time.sleep(1.0)
        self.assertEqual(self.info(jid)["state"], "queued")
        self.assertEqual(self.info(jid)["waiting"], "waiting for a free slot on cpu1")
        self.assertEqual(self.info(later)["state"], "queued")
        self.d.ctl("cancel", str(busy))
        j = self.wait(jid, lambda j: j["state"] != "queued", "start once cpu1 is free")
        self.assertEqual(j["device"], "cpu0,cpu1")
        j = self.wait(jid, lambda j: j["state"] != "running" or
                      (len(j["device_parts"]) == 2 and all(p["allocated"] > 0 for p in j["device_parts"])),
                      "both ranks hold memory")
        if j["state"] == "running":
            self.assertEqual([p["device"] for p in j["device_parts"]], ["cpu0", "cpu1"])
            text = self.d.ctl("status", str(jid)).stdout
            self.assertIn("on each     cpu0", text)
            self.assertIn("rank 1", text)
            # The daemon's status counts it on both devices, and names it
            # beside the process on each (if it still ran when asked).
            st, table = self.d.ctl_json("status"), self.d.ctl("status").stdout.split("\n\n")[1]
            if self.info(jid)["state"] == "running":
                jobs = {l.split()[0]: l.split()[-1] for l in table.splitlines()[1:]}
                self.assertEqual((jobs["cpu0"], jobs["cpu1"]), ("1", "1"), table)
                for dev in st["devices"]:
                    self.assertIn(jid, [k for p in dev["processes"] for k in p["jobs"]], dev)
        j = self.wait(jid, lambda j: j["state"] not in ("queued", "running"), "the end")
        self.assertEqual(j["state"], "completed", j)
        self.assertEqual(j["step"], steps)
        self.assertLessEqual(harness.max_weight_diff(want, os.path.join(out, "model.safetensors")), TOL)
        k = self.wait(later, lambda j: j["state"] not in ("queued", "running"), "the later job")
        self.assertEqual(k["state"], "completed")
        self.assertGreaterEqual(k["started_at"], j["started_at"])

    def test_cancel_stops_every_rank_and_resubmit_resumes(self):
        # Short enough that the order of the ranks' sums leaves the weights
        # within TOL: over 400 steps on this small corpus they drift 6.5e-3
        # apart, as any two summation orders do once the training overfits.
        steps = 100
        want = self.alone("alone-c", steps)
        cfg, out = self.job("cancelled", "devices = cpu1, cpu0", steps)
        jid = self.submit(cfg)
        self.wait(jid, lambda j: j["step"] >= 15, "some steps")
        self.d.ctl("cancel", str(jid))
        j = self.wait(jid, lambda j: j["state"] not in ("queued", "running"), "the stop")
        self.assertEqual(j["state"], "cancelled", j)
        self.assertLess(j["step"], steps)
        self.assertTrue(os.path.exists(os.path.join(out, "resume.safetensors")))
        # Both devices are free again: a job on each runs at once.
        for dev in ("cpu0", "cpu1"):
            c, _ = self.job("after-" + dev, "device = " + dev, 2)
            k = self.submit(c)
            self.assertEqual(self.wait(k, lambda j: j["state"] not in ("queued", "running"), dev)["state"],
                             "completed")
        jid = self.submit(cfg)
        j = self.wait(jid, lambda j: j["state"] not in ("queued", "running"), "the resumed run")
        self.assertEqual(j["state"], "completed", j)
        self.assertLessEqual(harness.max_weight_diff(want, os.path.join(out, "model.safetensors")), TOL)

    def test_missing_device_is_refused(self):
        cfg, _ = self.job("missing", "devices = cpu0,cpu5", 2)
        r = self.d.ctl("submit", cfg, check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("[job] devices: no device 'cpu5' on this daemon (it has cpu0, cpu1)\n", r.stderr)


if __name__ == "__main__":
    harness.main()
