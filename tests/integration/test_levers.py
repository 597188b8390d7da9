"""The memory levers a job runs with, and why, through a real gradd and the
real gradctl: a deep GPT under a [memory] limit that its micro-batch 1 fits
only with activation recomputation runs with recompute = auto, and
`gradctl status ID` (a levers line) and `gradctl --json status ID` (the
"levers" key) say that recompute is on because micro-batch 1 did not fit;
`gradctl list` does not show it; a restarted daemon still says so.  The
limit is measured here, halfway between the job's peaks at micro-batch 1
with recompute off and on."""
import os
import subprocess

import harness


class Levers(harness.DaemonTest):
    def setUp(self):
        super().setUp()
        self.dir, self.corpus = harness.scratch_corpus(self, "gradd-levers-")

    def run_job(self, name, memory, micro_batch, steps, states=("completed",)):
        cfg = os.path.join(self.dir, name + ".cfg")
        # Deep and long enough that the 7 of 8 blocks' activations recompute
        # drops are megabytes, well above the pool's rounding.
        harness.write_job(cfg, {
            "job": {"name": name},
            "model": {"type": "gpt", "layers": 8, "heads": 4, "width": 64, "context": 128, "vocab": 256},
            "data": {"format": "text", "train": self.corpus},
            "train": {"steps": steps, "batch": 4, "micro_batch": micro_batch, "lr": "1e-3", "threads": 1},
            "memory": dict(memory, tune="off"),
            "output": {"dir": os.path.join(self.dir, "out-" + name)},
        })
        jid = int(self.d.ctl("submit", cfg).stdout.split()[1])
        j = harness.wait_job(self.d, jid, states, timeout=120)
        self.assertIn(j["state"], states, j)
        return jid, j

    def test_status_shows_recompute_and_why(self):
        _, off = self.run_job("peak-off", {"recompute": "off"}, 1, 1)
        _, on = self.run_job("peak-on", {"recompute": "on"}, 1, 1)
        self.assertEqual(off["levers"], "")
        self.assertEqual(on["levers"], "recompute (on in the job file)")
        self.assertLess(on["mem_peak"], 0.85 * off["mem_peak"], (on["mem_peak"], off["mem_peak"]))
        limit = (off["mem_peak"] + on["mem_peak"]) // 2
        print("micro-batch 1 peaks: %d bytes without recompute, %d with; limit %d"
              % (off["mem_peak"], on["mem_peak"], limit))

        # Without the lever the job fails at that limit; auto turns it on.
        _, failed = self.run_job("tight-off", {"recompute": "off", "limit": limit, "margin": 0}, "auto", 3,
                                 states=("failed",))
        self.assertIn("micro-batch 1", failed["reason"])
        jid, j = self.run_job("tight-auto", {"recompute": "auto", "limit": limit, "margin": 0}, "auto", 3)
        self.assertEqual(j["levers"], "recompute (micro-batch 1 did not fit)")
        self.assertEqual(j["last_change"]["reason"], "recompute")
        self.assertLessEqual(j["mem_peak"], limit)

        text = self.d.ctl("status", str(jid)).stdout
        lines = [ln.split(None, 1) for ln in text.splitlines() if ln.strip().startswith("levers")]
        self.assertEqual(lines, [["levers", "recompute (micro-batch 1 did not fit)"]], text)
        # The table stays as it was: no levers column.
        listing = self.d.ctl("list").stdout
        self.assertNotIn("recompute (", listing)
        self.assertNotIn("LEVERS", listing)

        # The queue's state file keeps it: a clean restart on the same state.
        self.assertEqual(self.d.stop(), 0)
        self.d.log = open(self.d.log_path, "a")
        self.d.proc = subprocess.Popen([harness.GRADD, "-c", self.d.conf, "-s", self.d.sock, "--state-dir",
                                        os.path.join(self.d.dir, "state")], stdout=self.d.log, stderr=subprocess.STDOUT)
        self.d.wait_ready()
        self.assertEqual(self.d.ctl_json("status", str(jid))["levers"], "recompute (micro-batch 1 did not fit)")


if __name__ == "__main__":
    harness.main()
