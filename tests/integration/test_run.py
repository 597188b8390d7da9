"""`gradd run JOB.cfg` end to end, its outputs read by their real consumers:
safetensors (numpy), TensorBoard's EventAccumulator, and json for metrics."""
import json
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import time
import unittest

import harness

try:
    from prometheus_client.parser import text_string_to_metric_families
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    HAVE_READERS = True
except ImportError:  # the plain python3 of a build without the venv
    HAVE_READERS = False

GRADD = harness.GRADD


def read_lines(path):
    with open(path) as f:
        return f.readlines()


def wait_logged(metrics, n, poll):
    """Until metrics.jsonl has n step lines (or two minutes pass)."""
    deadline = time.time() + 120
    while time.time() < deadline:
        if os.path.exists(metrics) and sum(1 for l in read_lines(metrics) if '"loss"' in l) >= n:
            return
        time.sleep(poll)

JOB = """
[model]
type = gpt
layers = 2
heads = 2
width = 32
context = 16
vocab = 256
[data]
format = {fmt}
train = {train}
val_fraction = 0.1
[train]
steps = {steps}
batch = 8
micro_batch = 4
lr = 3e-3
warmup = 2
threads = 2
eval_every = 5
eval_batches = 2
[output]
dir = {out}
checkpoint_every = 3
log_every = 1
"""


@unittest.skipUnless(HAVE_READERS, "needs numpy, safetensors and tensorboard (scripts/pyenv.sh)")
class Run(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gradd-run-")
        self.train = os.path.join(self.dir, "corpus.txt")
        harness.write_corpus(self.train)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def job(self, name, steps=10, fmt="text", train=None):
        out = os.path.join(self.dir, name)
        cfg = os.path.join(self.dir, name + ".cfg")
        with open(cfg, "w") as f:
            f.write(JOB.format(fmt=fmt, train=train or self.train, steps=steps, out=out))
        return cfg, out

    def run_gradd(self, cfg, check=True):
        r = subprocess.run([GRADD, "run", cfg], capture_output=True, text=True, timeout=300)
        if check and r.returncode != 0:
            raise AssertionError("gradd run -> %d\n%s\n%s" % (r.returncode, r.stdout, r.stderr))
        return r

    def interrupt(self, cfg, out, sig):
        """gradd run cfg, sent sig once four steps are logged: it must stop
        with a checkpoint (exit 130).  The step it stopped at."""
        p = subprocess.Popen([GRADD, "run", cfg], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_logged(os.path.join(out, "metrics.jsonl"), 4, 0.01)
        p.send_signal(sig)
        stdout, stderr = p.communicate(timeout=120)
        if p.returncode == 0:
            self.skipTest("the run finished before the signal arrived")
        self.assertEqual(p.returncode, 130, stderr)
        self.assertIn("run the same command again to resume", stdout)
        return int(stdout.split("stopped at step ")[1].split(";")[0])

    def test_outputs_read_by_their_consumers(self):
        cfg, out = self.job("outputs")
        r = self.run_gradd(cfg)
        self.assertIn("done: 10 steps", r.stdout)
        # model.safetensors: GPT-2 names and layouts (Conv1D matrices are (in, out)).
        t = load_file(os.path.join(out, "model.safetensors"))
        self.assertEqual(t["wte.weight"].shape, (256, 32))
        self.assertEqual(t["wpe.weight"].shape, (16, 32))
        self.assertEqual(t["h.0.attn.c_attn.weight"].shape, (32, 96))
        self.assertEqual(t["h.1.mlp.c_fc.weight"].shape, (32, 128))
        self.assertEqual(t["h.1.mlp.c_proj.weight"].shape, (128, 32))
        self.assertEqual(t["ln_f.bias"].shape, (32,))
        self.assertEqual(len(t), 2 + 2 * 12 + 2)
        for name, v in t.items():
            self.assertEqual(v.dtype, np.float32, name)
            self.assertTrue(np.isfinite(v).all(), name)
        with safe_open(os.path.join(out, "model.safetensors"), "np") as f:
            meta = f.metadata()
        self.assertEqual(meta["format"], "pt")
        self.assertEqual(meta["step"], "10")
        # The resume state holds params and both Adam moments.
        rs = load_file(os.path.join(out, "resume.safetensors"))
        n = sum(v.size for v in t.values())
        self.assertEqual({k: v.shape for k, v in rs.items()}, {"params": (n,), "adam_m": (n,), "adam_v": (n,)})
        # metrics.jsonl: one line per step, then validations.
        lines = [json.loads(l) for l in read_lines(os.path.join(out, "metrics.jsonl"))]
        steps = [l["step"] for l in lines if "loss" in l]
        self.assertEqual(steps, list(range(1, 11)))
        first = lines[0]
        for key in ("loss", "lr", "grad_norm", "tokens_per_s", "micro", "accum", "allocated", "reserved"):
            self.assertIn(key, first)
        self.assertEqual((first["micro"], first["accum"]), (4, 2))
        # fp32 does not scale the loss: only fp16 lines carry loss_scale and skipped.
        for l in lines:
            self.assertNotIn("loss_scale", l)
            self.assertNotIn("skipped", l)
        self.assertEqual([l["step"] for l in lines if "val_loss" in l], [5, 10])
        # TensorBoard sees the loss curve.
        ea = EventAccumulator(os.path.join(out, "tensorboard"))
        ea.Reload()
        loss = ea.Scalars("train/loss")
        self.assertEqual([e.step for e in loss], list(range(1, 11)))
        self.assertAlmostEqual(loss[-1].value, [l["loss"] for l in lines if "loss" in l][-1], places=5)
        self.assertEqual([e.step for e in ea.Scalars("val/loss")], [5, 10])
        # Throughput, the pool's memory and the micro-batch, at every step,
        # as metrics.jsonl has them (scalars are float32).
        self.assertEqual(sorted(ea.Tags()["scalars"]),
                         ["batch/micro", "memory/allocated_bytes", "memory/reserved_bytes", "perf/tokens_per_s",
                          "train/grad_norm", "train/loss", "train/lr", "val/loss"])
        by_step = {l["step"]: l for l in lines if "loss" in l}
        self.assertEqual([(e.step, e.value) for e in ea.Scalars("batch/micro")], [(s, 4.0) for s in range(1, 11)])
        alloc = ea.Scalars("memory/allocated_bytes")
        res = ea.Scalars("memory/reserved_bytes")
        self.assertEqual([e.step for e in alloc], list(range(1, 11)))
        self.assertEqual([e.step for e in res], list(range(1, 11)))
        for a, r in zip(alloc, res):
            self.assertEqual(a.value, float(np.float32(by_step[a.step]["allocated"])), a.step)
            self.assertEqual(r.value, float(np.float32(by_step[r.step]["reserved"])), r.step)
            self.assertGreater(a.value, 0)
            self.assertGreaterEqual(r.value, a.value)
            self.assertLessEqual(r.value, 4 << 30)  # the default cpu device's capacity
        tok = ea.Scalars("perf/tokens_per_s")
        self.assertEqual([e.step for e in tok], list(range(1, 11)))
        for e in tok:  # metrics.jsonl keeps 6 digits
            self.assertGreater(e.value, 0)
            self.assertAlmostEqual(e.value / by_step[e.step]["tokens_per_s"], 1, delta=1e-5)

    def test_interrupt_and_resume_is_bitwise(self):
        # Long enough (some 0.3 s, ten times the poll's reaction) that the
        # interrupt lands mid-run: 12 steps were over before the poll below
        # saw 4, and the SIGINT found the run exiting.
        steps = 150
        cfg_a, out_a = self.job("straight", steps=steps)
        self.run_gradd(cfg_a)
        cfg_b, out_b = self.job("interrupted", steps=steps)
        stopped = self.interrupt(cfg_b, out_b, signal.SIGINT)
        self.assertLess(stopped, steps)
        r = self.run_gradd(cfg_b)
        self.assertIn("done: %d steps" % steps, r.stdout)
        # Where it resumed is said, and is no step line of its own.
        self.assertIn("resuming from its checkpoint at step %d\n" % stopped, r.stderr)
        self.assertNotIn("micro 0×0", r.stderr)
        with open(os.path.join(out_a, "model.safetensors"), "rb") as a, \
                open(os.path.join(out_b, "model.safetensors"), "rb") as b:
            self.assertEqual(a.read(), b.read(), "resumed model differs from the uninterrupted one")
        la = [l for l in read_lines(os.path.join(out_a, "metrics.jsonl")) if '"loss"' in l]
        lb = [l for l in read_lines(os.path.join(out_b, "metrics.jsonl")) if '"loss"' in l]
        strip = lambda l: {k: v for k, v in json.loads(l).items() if k not in ("tokens_per_s", "step_ms")}
        self.assertEqual([strip(l) for l in la], [strip(l) for l in lb])
        # Once more: a finished run is refused, as a submit refuses it, not
        # "done" with nothing trained.
        r = self.run_gradd(cfg_b, check=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("holds a finished run (step %d of [train] steps %d in resume.safetensors)" % (steps, steps),
                      r.stderr)
        # At the line of the key the file has: dir (resume is left out).
        with open(cfg_b) as f:
            line = f.read().split("\n").index("dir = %s" % out_b) + 1
        self.assertIn("%s:%d: [output] dir, with [output] resume = auto: " % (cfg_b, line), r.stderr)

    def test_damaged_checkpoint_metadata_is_named(self):
        # A finished run of 6 steps, continued to 9: its checkpoint's
        # metadata edited the ways a damaged file or another job's could.
        cfg, out = self.job("meta", steps=6)
        self.run_gradd(cfg)
        with open(cfg) as f:
            text = f.read().replace("steps = 6\n", "steps = 9\n")
        with open(cfg, "w") as f:
            f.write(text)
        path = os.path.join(out, "resume.safetensors")
        tensors = load_file(path)
        with safe_open(path, "np") as f:
            meta = f.metadata()
        cases = [({"data_epoch": "x"}, "metadata data_epoch is 'x', not a whole number (the file is damaged)"),
                 ({"data_index": None}, "metadata data_index is missing, not a whole number"),
                 ({"batch": "16"}, "was written with [train] batch 16, but the job has 8"),
                 ({"optimizer_steps": "7"}, "metadata optimizer_steps 7 is past its step 6")]
        for change, want in cases:
            m = dict(meta)
            for k, v in change.items():
                if v is None:
                    del m[k]
                else:
                    m[k] = v
            save_file(tensors, path, metadata=m)
            r = self.run_gradd(cfg, check=False)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("cannot resume: %s" % path, r.stderr)
            self.assertIn(want, r.stderr)
        # Put back, it continues.
        save_file(tensors, path, metadata=meta)
        self.assertIn("done: 9 steps", self.run_gradd(cfg).stdout)

    def test_sighup_stops_with_a_checkpoint(self):
        # The terminal went away: as ^C, not the default death.
        cfg, out = self.job("hup", steps=150)
        stopped = self.interrupt(cfg, out, signal.SIGHUP)
        with safe_open(os.path.join(out, "resume.safetensors"), "np") as f:
            self.assertEqual(int(f.metadata()["step"]), stopped)
        # Under nohup (SIGHUP ignored) it is not a stop: the run goes on.
        cfg, out = self.job("nohup", steps=150)
        p = subprocess.Popen([GRADD, "run", cfg], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
        wait_logged(os.path.join(out, "metrics.jsonl"), 4, 0.01)
        p.send_signal(signal.SIGHUP)
        stdout, stderr = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, stderr)
        self.assertIn("done: 150 steps", stdout)

    def test_kill9_tensorboard_sees_each_step_once(self):
        # kill -9 after step 5 of a run that checkpoints every 3: steps 4-5
        # were logged but are redone by the resumed run.  Its event file
        # opens with SessionLog START at step 4, so TensorBoard drops the
        # orphans instead of drawing the curve back over itself.
        cfg, out = self.job("killed", steps=150)
        p = subprocess.Popen([GRADD, "run", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        metrics = os.path.join(out, "metrics.jsonl")
        wait_logged(metrics, 5, 0.005)
        p.kill()
        p.wait()
        resume = os.path.join(out, "resume.safetensors")
        if not os.path.exists(resume):
            self.skipTest("killed before the first checkpoint")
        with safe_open(resume, "np") as f:
            kept = int(f.metadata()["step"])
        logged = [json.loads(l)["step"] for l in read_lines(metrics) if '"loss"' in l]
        if logged[-1] == kept:
            self.skipTest("killed right after a checkpoint (step %d): nothing orphaned" % kept)
        r = self.run_gradd(cfg)
        self.assertIn("done: 150 steps", r.stdout)
        self.assertGreater(len(os.listdir(os.path.join(out, "tensorboard"))), 1)
        ea = EventAccumulator(os.path.join(out, "tensorboard"))
        ea.Reload()
        loss = ea.Scalars("train/loss")
        self.assertEqual([e.step for e in loss], list(range(1, 151)))
        final = {json.loads(l)["step"]: json.loads(l)["loss"] for l in read_lines(metrics) if '"loss"' in l}
        for e in loss:
            self.assertAlmostEqual(e.value, final[e.step], places=5)

    def test_bad_job_file(self):
        cfg = os.path.join(self.dir, "bad.cfg")
        with open(cfg, "w") as f:
            f.write("[model]\ntype = gpt\nlayers = many\n")
        r = self.run_gradd(cfg, check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("%s:3: [model] layers: 'many' is not a whole number" % cfg, r.stderr)

    def test_bad_token_file(self):
        bad = os.path.join(self.dir, "bad.bin")
        with open(bad, "wb") as f:
            f.write(struct.pack("<256i", 12345, 1, 10, *([0] * 253)) + b"\0" * 20)
        cfg, out = self.job("badtokens", fmt="tokens", train=bad)
        r = self.run_gradd(cfg, check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn(bad, r.stderr)
        self.assertIn("magic", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(out, "model.safetensors")))

    def test_more_threads_than_cores_is_warned(self):
        cfg, out = self.job("threads", steps=3)
        with open(cfg) as f:
            text = f.read()
        n = len(os.sched_getaffinity(0))
        with open(cfg, "w") as f:
            f.write(text.replace("threads = 2", "threads = %d" % (n + 1)))
        r = self.run_gradd(cfg)
        self.assertIn("[train] threads = %d is more than the %d cores here" % (n + 1, n), r.stderr)

    def test_token_file_trains(self):
        tok = os.path.join(self.dir, "tokens.bin")
        with open(self.train, "rb") as f:
            data = f.read()
        with open(tok, "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, len(data), *([0] * 253)))
            f.write(struct.pack("<%dH" % len(data), *data))
        cfg, out = self.job("tokens", steps=3, fmt="tokens", train=tok)
        self.assertIn("done: 3 steps", self.run_gradd(cfg).stdout)


@unittest.skipUnless(HAVE_READERS, "needs prometheus-client (scripts/pyenv.sh)")
class Metrics(unittest.TestCase):
    """gradctl metrics, read by the Prometheus client library's own parser."""

    def test_prometheus_parses_metrics(self):
        # cpu1 is left to the test hooks, to make an allocation retry there.
        d = harness.Daemon("[cpu]\ncapacity = 1G\ndevices = 2\n", test_hooks=True)
        tmp = tempfile.mkdtemp(prefix="gradd-metrics-")
        try:
            train = os.path.join(tmp, "corpus.txt")
            harness.write_corpus(train)
            cfg = os.path.join(tmp, "job.cfg")
            with open(cfg, "w") as f:
                f.write(JOB.format(fmt="text", train=train, steps=100000, out=os.path.join(tmp, "out")).replace(
                    "[model]", "[job]\nname = quote\"d\\name\ndevice = cpu0\n[model]", 1))
            jid = d.ctl("--json", "submit", cfg).stdout
            jid = json.loads(jid)["id"]
            deadline = time.time() + 60
            while time.time() < deadline and d.ctl_json("status", str(jid))["step"] < 2:
                time.sleep(0.05)
            # 200M fits neither cpu1's cache nor what another "process"
            # leaves of it: the pool releases its cache and retries once.
            d.ctl("test-alloc", "-d", "cpu1", "--tag", "activations", "100M")
            d.ctl("test-alloc", "-d", "cpu1", "--free-all")
            d.ctl("test-pressure", "-d", "cpu1", "850M")
            r = d.ctl("test-alloc", "-d", "cpu1", "--tag", "activations", "200M", check=False)
            self.assertEqual(r.returncode, 1, r.stderr)
            text = d.ctl("metrics").stdout
            pools = {p["device"]: p for p in d.ctl_json("stats")["pools"] if not p.get("job")}
            fams = {f.name: f for f in text_string_to_metric_families(text)}
            self.assertEqual(fams["gradd_up"].samples[0].value, 1)
            mem = {s.labels["device"]: s.value for s in fams["gradd_device_memory_total_bytes"].samples}
            self.assertEqual(mem["cpu0"], 1 << 30)
            jobs = {s.labels["state"]: s.value for s in fams["gradd_jobs"].samples}
            self.assertEqual(jobs["running"], 1)
            step = [s for s in fams["gradd_job_step"].samples if s.labels["job"] == str(jid)]
            self.assertEqual(len(step), 1)
            self.assertGreaterEqual(step[0].value, 2)
            # A job name with a quote and a backslash survives the escaping.
            self.assertEqual(step[0].labels["name"], 'quote"d\\name')
            tags = {s.labels["tag"]: s.value for s in fams["gradd_pool_tag_allocated_bytes"].samples
                    if s.labels["device"] == "cpu0"}
            self.assertGreater(tags["params"], 0)
            self.assertEqual(fams["gradd_pool_ooms"].type, "counter")
            # Total device memory is a level, not a count, whatever its name says.
            self.assertEqual(fams["gradd_device_memory_total_bytes"].type, "gauge")
            self.assertEqual(fams["gradd_pool_reserved_bytes"].type, "gauge")
            # Retries per device: the one made on cpu1, none on cpu0.
            self.assertEqual(fams["gradd_pool_alloc_retries"].type, "counter")
            retries = {s.labels["device"]: s.value for s in fams["gradd_pool_alloc_retries"].samples
                       if s.name == "gradd_pool_alloc_retries_total"}
            self.assertEqual(retries, {"cpu0": pools["cpu0"]["alloc_retries"], "cpu1": 1})
            # build_info: what `gradd --version` says, value 1.
            ver = subprocess.run([GRADD, "--version"], capture_output=True, text=True).stdout.split()
            (bi,) = fams["gradd_build_info"].samples
            self.assertEqual(bi.value, 1)
            self.assertEqual((bi.labels["version"], bi.labels["protocol"]),
                             (ver[1], str(harness.PROTOCOL_VERSION)))
            self.assertIn(bi.labels["cuda"], ("yes", "no"))
            # Throughput in the unit of the model: a gpt job counts tokens
            # only; one metric per unit, none that means either.
            def job_samples(fam):
                return [s for s in fams[fam].samples if s.labels["job"] == str(jid)]
            (tok,) = job_samples("gradd_job_tokens_per_second")
            self.assertGreater(tok.value, 0)
            # The levers as gauges: neither is on for this job.
            self.assertEqual([s.value for s in job_samples("gradd_job_recompute")], [0])
            self.assertEqual([s.value for s in job_samples("gradd_job_lora")], [0])
            self.assertEqual(job_samples("gradd_job_samples_per_second"), [])
            self.assertNotIn("gradd_job_units_per_second", fams)
            # Memory by tag, now and at its peak, labelled as the other job
            # families; the persistent tags do not move while it trains, so
            # they equal what `gradctl stats` shows for the job.
            row = [j for j in pools["cpu0"]["jobs"] if j["job"] == jid][0]["tags"]
            now = {s.labels["tag"]: s.value for s in job_samples("gradd_job_memory_bytes")}
            peak = {s.labels["tag"]: s.value for s in job_samples("gradd_job_memory_peak_bytes")}
            self.assertEqual(set(now), set(tags))
            self.assertEqual(set(peak), set(tags))
            for t in ("params", "grads", "optimizer"):
                self.assertGreater(now[t], 0, t)
                self.assertEqual((now[t], peak[t]), (row[t]["current"], row[t]["peak"]), t)
            self.assertEqual(now["params"], now["grads"])
            self.assertEqual(now["optimizer"], 2 * now["params"])
            self.assertGreater(peak["activations"], 0)
            for t in tags:
                self.assertGreaterEqual(peak[t], now[t], t)
            (lab,) = {(s.labels["name"], s.labels["user"], s.labels["device"])
                      for s in job_samples("gradd_job_memory_bytes")}
            self.assertEqual(lab, ('quote"d\\name', step[0].labels["user"], "cpu0"))
            d.ctl("cancel", str(jid))
        finally:
            d.stop()
            d.cleanup()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    harness.main()
