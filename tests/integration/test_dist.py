"""One job as several ranks: `gradd run` under OpenMPI's mpirun, on cpu
devices, against the same job in one process.  The ranks split every step
of the same samples and all-reduce the gradients, so the trained weights
are one process's up to the order of the float sums; the smallest fit
among the ranks is every rank's, and an OOM on one rank shrinks them all;
a rank killed or stopped fails the whole job within its rank_timeout, and
the job resumes from its checkpoint at another number of ranks, ending
where an uninterrupted run ends; with the optimizer state sharded, each
rank holds its share of it and the training is the same; LoRA's dropout
draws one process's masks on any number of ranks."""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import harness

GRADD = harness.GRADD
MPIRUN = shutil.which("mpirun")

# Weights after training, one process against several: the same sums in
# another order.  Seen: 1.2e-7 on weights of about 1.
TOL = 1e-5

JOB = """[job]
name = dist
device = cpu
rank_timeout = {timeout}
allreduce_bucket = {bucket}
[model]
type = gpt
layers = 2
heads = 2
width = {width}
context = 32
vocab = 256
[data]
format = text
train = {train}
val_fraction = 0.05
[train]
steps = {steps}
batch = {batch}
micro_batch = {micro}
lr = 1e-3
threads = 1
eval_batches = 1
seed = 3
[memory]
tune = off
shard_optimizer = {shard}
[output]
dir = {out}
log_every = 1
checkpoint_every = {ckpt}
"""


def mpi_env():
    env = dict(os.environ)
    # CI runs as root; a container has fewer cores than ranks and may
    # forbid the cross-memory attach OpenMPI's shared memory tries first.
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
                "OMPI_MCA_btl": "self,vader", "OMPI_MCA_plm_rsh_agent": "false"})
    if harness.SANITIZED:
        # MPI keeps its own allocations to the process's end.
        env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":")
    return env


def steps_logged(out):
    path = os.path.join(out, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(l) for l in f if '"loss"' in l]


def val_loss(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if '"val_loss"' in l][-1]["val_loss"]


@unittest.skipUnless(MPIRUN, "mpirun not found (openmpi-bin)")
class Dist(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gradd-dist-")
        self.train = os.path.join(self.dir, "train.txt")
        harness.write_corpus(self.train)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def job(self, name, steps=8, batch=8, micro="auto", ckpt=0, timeout="5m", width=32, shard="off", bucket="25M"):
        out = os.path.join(self.dir, "out-" + name)
        path = os.path.join(self.dir, name + ".cfg")
        with open(path, "w") as f:
            f.write(JOB.format(train=self.train, steps=steps, batch=batch, micro=micro, ckpt=ckpt, out=out,
                               timeout=timeout, width=width, shard=shard, bucket=bucket))
        return path, out

    def conf(self, name, capacity):
        path = os.path.join(self.dir, name + ".conf")
        with open(path, "w") as f:
            f.write("[cpu]\ncapacity = %s\n" % capacity)
        return path

    def run1(self, cfg, conf=None, check=True, env=None, hooks=False):
        cmd = [GRADD] + (["-c", conf] if conf else []) + (["--test-hooks"] if hooks else []) + ["run", cfg]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        if check:
            self.assertEqual(r.returncode, 0, r.stderr)
        return r

    def mpirun(self, n, cfg, conf=None, check=True):
        cmd = [MPIRUN, "-np", str(n), GRADD] + (["-c", conf] if conf else []) + ["run", cfg]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=mpi_env())
        if check:
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r

    @unittest.skipUnless(os.environ.get("DIST_ID_PROBE"), "DIST_ID_PROBE is not built")
    def test_nccl_id_over_mpi(self):
        # Ranks that are processes (mpirun, srun) on CUDA devices: rank 0
        # makes NCCL's id and every rank opens with its bytes, sent over
        # MPI; when rank 0 cannot make one, every rank fails and none waits.
        # (A stand-in for NCCL's interface: the rest needs GPUs.)
        probe = os.environ["DIST_ID_PROBE"]
        for n in (2, 3):
            r = subprocess.run([MPIRUN, "-np", str(n), probe, "ok"], capture_output=True, text=True, timeout=120,
                               env=mpi_env())
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            for k in range(n):
                self.assertIn("rank %d: opened with rank 0's id\n" % k, r.stdout)
        r = subprocess.run([MPIRUN, "-np", "3", probe, "fail"], capture_output=True, text=True, timeout=120,
                           env=mpi_env())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("rank 0: failed as it should: the stand-in makes no id\n", r.stdout)
        for k in (1, 2):
            self.assertIn("rank %d: failed as it should: rank %d of 3 on " % (k, k), r.stdout)

    def test_same_weights_as_one_process(self):
        cfg1, out1 = self.job("one")
        self.run1(cfg1)
        # 2 ranks of 4 samples each, and 3 of 3, 3 and 2.
        for n in (2, 3):
            cfg, out = self.job("np%d" % n)
            r = self.mpirun(n, cfg)
            # Rank 0 alone reports and writes.
            self.assertEqual(r.stdout.count("done: 8 steps"), 1, r.stdout)
            d = harness.max_weight_diff(os.path.join(out1, "model.safetensors"), os.path.join(out, "model.safetensors"))
            self.assertLessEqual(d, TOL, "np %d" % n)
            a, b = steps_logged(out1), steps_logged(out)
            self.assertEqual(len(b), 8)
            for x, y in zip(a, b):
                self.assertAlmostEqual(x["loss"], y["loss"], delta=1e-5)
            # The ranks evaluate a share of the validation set each and add
            # up: one process's validation loss, in another sum order.
            self.assertAlmostEqual(val_loss(out1), val_loss(out), delta=1e-6 * val_loss(out1))
            # Each rank splits its share: 4 (or 3) samples a step.
            self.assertEqual(b[-1]["micro"] * b[-1]["accum"] >= (8 + n - 1) // n, True, b[-1])
            self.assertEqual(sorted(os.listdir(out)), sorted(os.listdir(out1)))

    def test_lora_dropout_same_as_one_process(self):
        # Dropout's masks belong to the step's samples (their place among
        # them), not to the rank that runs them: two ranks train one
        # process's adapters.  Masks drawn per rank would put them apart
        # by far more than TOL.  method = auto under a limit the whole
        # model cannot meet (16 bytes a parameter, 35K parameters) chooses
        # the adapters on every rank alike.
        outs = []
        for name, n in (("drop1", 1), ("drop2", 2)):
            cfg, out = self.job(name)
            with open(cfg) as f:
                text = f.read().replace("[output]\n", "[finetune]\nmethod = auto\nrank = 4\ndropout = 0.2\n[output]\n")
                text = text.replace("[memory]\n", "[memory]\nlimit = 400K\n")
            with open(cfg, "w") as f:
                f.write(text)
            r = self.run1(cfg) if n == 1 else self.mpirun(n, cfg)
            # `gradd run` says the choice and lists the adapters' files.
            self.assertRegex(r.stderr, r"levers: .*lora \(r=4 alpha=16 targets=c_attn dropout=0\.2; base frozen in "
                                       r"fp32; method = auto: full fine-tuning needs ")
            self.assertIn("adapter_model.safetensors, adapter_config.json, metrics.jsonl", r.stdout)
            outs.append(os.path.join(out, "adapter_model.safetensors"))
        self.assertLessEqual(harness.max_weight_diff(outs[0], outs[1]), TOL)

    def test_devices_of_one_process(self):
        # [job] devices: a rank per device as threads of one `gradd run`,
        # no MPI; the same training, sharded optimizer state or not.
        conf = self.conf("three", "64M").replace(".conf", "")
        with open(conf + ".conf", "a") as f:
            f.write("devices = 3\n")
        cfg1, out1 = self.job("threads-one")
        self.run1(cfg1)
        for devices, shard in (("cpu0,cpu1", "off"), ("cpu2, cpu0, cpu1", "on")):
            cfg, out = self.job("threads-%d%s" % (devices.count(",") + 1, shard), shard=shard)
            with open(cfg) as f:
                text = f.read().replace("device = cpu\n", "devices = %s\n" % devices)
            with open(cfg, "w") as f:
                f.write(text)
            r = self.run1(cfg, conf + ".conf")
            self.assertLessEqual(harness.max_weight_diff(os.path.join(out1, "model.safetensors"),
                                          os.path.join(out, "model.safetensors")), TOL, devices)
            n = devices.count(",") + 1
            for k in range(1, n):
                self.assertIn("rank %d of %d: done: 8 steps" % (k, n), r.stderr)
        # A device this gradd does not have is named.
        cfg, _ = self.job("no-cpu2", shard="on")
        with open(cfg) as f:
            text = f.read().replace("device = cpu\n", "devices = cpu2, cpu0, cpu1\n")
        with open(cfg, "w") as f:
            f.write(text)
        r = self.run1(cfg, check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("[job] devices: no device cpu2 here", r.stderr)

    def model_of(self, out):
        return os.path.join(out, "model.safetensors")

    def test_buckets_summed_while_the_backward_runs(self):
        # 1 KiB buckets: the 2-layer model's ~35K gradients in 35 sums, each
        # started once the last micro-batch's backward is done with the
        # layers it holds.  A bucket started before a contribution to it
        # would lose the other rank's share of that: weights apart.  Two
        # ranks sum every element alike whatever the buckets (a + b), so
        # the weights are bitwise those of one sum after the backward.
        cfg1, out1 = self.job("one")
        self.run1(cfg1)
        cfg0, out0 = self.job("whole", bucket="0")
        self.mpirun(2, cfg0)
        cfgb, outb = self.job("buckets", bucket="1K")
        self.mpirun(2, cfgb)
        self.assertEqual(harness.max_weight_diff(self.model_of(out0), self.model_of(outb)), 0.0)
        self.assertLessEqual(harness.max_weight_diff(self.model_of(out1), self.model_of(outb)), TOL)
        early = [s["allreduce_early"] for s in steps_logged(outb)]
        self.assertEqual(len(early), 8)
        # Every 256-float bucket (counted from the end) above the
        # embeddings starts early: those (wte 8192 and wpe 1024 floats)
        # get their last addition in the encoder backward, at the very end.
        C = 32
        layer = 12 * C * C + 13 * C
        P = 256 * C + 32 * C + 2 * layer + 2 * C
        started = (P - 256 * C - 32 * C) // 256 * 256
        for e in early:
            self.assertAlmostEqual(e, started / P, places=4)
        self.assertEqual({s["allreduce_early"] for s in steps_logged(out0)}, {0.0})
        # Llama reports its layers alike (its untied head after the final
        # norm), under LoRA nothing (the adapters all go at the end).
        for name, extra in (("llama", "type = llama\nkv_heads = 1\ntie_embeddings = off\n"),
                            ("lora", "[finetune]\nmethod = lora\nrank = 4\n[model]\n")):
            got = []
            for bucket in ("0", "1K"):
                cfg, out = self.job("%s-%s" % (name, bucket), bucket=bucket)
                with open(cfg) as f:
                    text = f.read().replace("type = gpt\n", extra if name == "llama" else "type = gpt\n")
                if name == "lora":
                    text = text.replace("[model]\n", extra, 1)
                with open(cfg, "w") as f:
                    f.write(text)
                self.mpirun(2, cfg)
                got.append(out)
            files = ["adapter_model.safetensors"] if name == "lora" else ["model.safetensors"]
            for fn in files:
                self.assertEqual(harness.max_weight_diff(os.path.join(got[0], fn), os.path.join(got[1], fn)), 0.0,
                                 name)
            early = {s["allreduce_early"] for s in steps_logged(got[1])}
            if name == "lora":
                self.assertEqual(early, {0.0})
            else:
                self.assertEqual(len(early), 1)
                self.assertGreater(early.pop(), 0.5)
        # Three ranks sum in an order MPI picks by size: one process's
        # training, to rounding.
        cfg3, out3 = self.job("buckets3", bucket="1K")
        self.mpirun(3, cfg3)
        self.assertLessEqual(harness.max_weight_diff(self.model_of(out1), self.model_of(out3)), TOL)

    def test_buckets_of_devices_and_a_world_of_one(self):
        # Threads sum in rank order, in one piece or in many: bitwise.
        conf = self.conf("two", "64M")
        with open(conf, "a") as f:
            f.write("devices = 2\n")
        outs = {}
        for bucket in ("0", "1K"):
            cfg, out = self.job("threads-" + bucket, bucket=bucket)
            with open(cfg) as f:
                text = f.read().replace("device = cpu\n", "devices = cpu0,cpu1\n")
            with open(cfg, "w") as f:
                f.write(text)
            self.run1(cfg, conf)
            outs[bucket] = out
        self.assertEqual(harness.max_weight_diff(self.model_of(outs["0"]), self.model_of(outs["1K"])), 0.0)
        # A world of one rank (a test hook: what one GPU can check of the
        # ranks' path, NCCL's included) trains as one process, bitwise: a
        # sum over one rank is its own gradient.
        cfg1, out1 = self.job("alone")
        self.run1(cfg1)
        cfgw, outw = self.job("world1", bucket="1K")
        env = dict(os.environ, GRADD_TEST_GROUP="1")
        r = self.run1(cfgw, env=env, hooks=True)
        self.assertEqual(harness.max_weight_diff(self.model_of(out1), self.model_of(outw)), 0.0)
        self.assertEqual(len([s for s in steps_logged(outw) if "allreduce_early" in s]), 8, r.stdout)
        self.assertFalse([s for s in steps_logged(out1) if "allreduce_early" in s])

    def test_batch_smaller_than_ranks_is_refused(self):
        cfg, out = self.job("tiny", batch=1)
        r = self.mpirun(2, cfg, check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("batch = 1 is smaller than the 2 ranks", r.stderr)

    def test_smallest_fit_wins(self):
        # Rank 1's device is small: alone it fits fewer samples than rank
        # 0's; together both run at its size, and train as one process.
        cfg, out = self.job("fit", batch=32, width=64)
        small = self.conf("small", "6M")
        big = self.conf("big", "64M")
        cfg_s, out_s = self.job("small-alone", batch=16, width=64)
        self.run1(cfg_s, small)
        alone_small = steps_logged(out_s)[0]["micro"]
        cfg_b, out_b = self.job("big-alone", batch=16, width=64)
        self.run1(cfg_b, big)
        alone_big = steps_logged(out_b)[0]["micro"]
        self.assertLess(alone_small, alone_big)
        cmd = [MPIRUN, "-np", "1", GRADD, "-c", big, "run", cfg, ":", "-np", "1", GRADD, "-c", small, "run", cfg]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=mpi_env())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        got = steps_logged(out)
        self.assertEqual({s["micro"] for s in got}, {alone_small}, got)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            fits = [json.loads(l) for l in f if '"batch_change"' in l]
        self.assertEqual(fits[0]["reason"], "fit")
        self.assertEqual(fits[0]["to"], alone_small)
        cfg1, out1 = self.job("fit-one", batch=32, width=64)
        self.run1(cfg1, big)
        self.assertLessEqual(harness.max_weight_diff(os.path.join(out1, "model.safetensors"), os.path.join(out, "model.safetensors")),
                             TOL)

    def test_oom_on_one_rank_shrinks_all(self):
        # Rank k's step 3 runs out of memory (a test hook): every rank
        # redoes it at half the micro-batch, and the training is still one
        # process's.  With rank 0's OOM the gradients go in 1 KiB buckets:
        # the step thrown away has started them all the same, and the
        # steps after it start them in their second micro-batch.
        cfg1, out1 = self.job("oom-one", batch=16)
        self.run1(cfg1)
        for k in (1, 0):
            cfg, out = self.job("oom%d" % k, batch=16, bucket="1K" if k == 0 else "25M")
            env = mpi_env()
            env["GRADD_TEST_OOM"] = "%d:3" % k
            r = subprocess.run([MPIRUN, "-np", "2", GRADD, "--test-hooks", "run", cfg], capture_output=True,
                               text=True, timeout=300, env=env)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            with open(os.path.join(out, "metrics.jsonl")) as f:
                changes = [json.loads(l) for l in f if '"batch_change"' in l]
            self.assertEqual([(c["reason"], c["from"], c["to"], c["step"]) for c in changes],
                             [("fit", 8, 8, 0), ("oom", 8, 4, 2)], changes)
            self.assertEqual([s["micro"] for s in steps_logged(out)], [8, 8] + [4] * 6)
            # Rank 1's own part, in its one line.
            self.assertIn("rank 1 of 2", r.stderr)
            self.assertIn("micro-batch 4 at the end, 1 OOM recoveries", r.stderr)
            self.assertLessEqual(harness.max_weight_diff(os.path.join(out1, "model.safetensors"),
                                          os.path.join(out, "model.safetensors")), TOL)

    def test_sharded_optimizer(self):
        # Each rank holds the optimizer state of its share of the
        # parameters: half of it each at 2 ranks, and the same training.
        cfg1, out1 = self.job("shard-one")
        r1 = self.run1(cfg1)
        for n in (2, 3):
            cfg, out = self.job("shard%d" % n, shard="on")
            r = self.mpirun(n, cfg)
            self.assertLessEqual(harness.max_weight_diff(os.path.join(out1, "model.safetensors"),
                                          os.path.join(out, "model.safetensors")), TOL)
            # The checkpoint holds the whole state, gathered on rank 0.
            self.assertLessEqual(harness.max_weight_diff(os.path.join(out1, "resume.safetensors"),
                                          os.path.join(out, "resume.safetensors")), TOL)
            whole, share = self.opt_bytes(r1.stdout), self.opt_bytes(r.stdout)
            self.assertLessEqual(share, whole / n * 1.05 + 4096, (whole, share))

    @staticmethod
    def opt_bytes(stdout):
        """The optimizer tag of a `gradd run`'s peak memory line, in bytes."""
        line = next(l for l in stdout.splitlines() if l.startswith("peak memory"))
        size = line.split("optimizer ", 1)[1].split(",")[0].strip()
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        return float(size[:-1]) * mult[size[-1]] if size[-1] in mult else float(size.rstrip("B"))

    def test_stopped_ranks_resume_sharded_at_another_size(self):
        # Stopped as 2 ranks with sharded optimizer state (SIGTERM, as srun
        # or systemd send it), resumed as 3: the uninterrupted weights.
        steps = 120
        cfg1, out1 = self.job("whole-s", steps=steps, ckpt=50, width=64)
        self.run1(cfg1)
        cfg, out = self.job("stopped-s", steps=steps, ckpt=50, width=64, shard="on")
        p = self.start_ranks(2, cfg)
        self.wait_steps(out, 12, p)
        for k in (0, 1):
            os.kill(self.rank_pid(p, k), signal.SIGTERM)
        out_s, err = p.communicate(timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("stopped at step", out_s, err)
        done = len(steps_logged(out))
        self.assertLess(done, steps)
        r = self.mpirun(3, cfg)
        self.assertIn("done: %d steps" % steps, r.stdout)
        self.assertLessEqual(harness.max_weight_diff(os.path.join(out1, "model.safetensors"), os.path.join(out, "model.safetensors")),
                             TOL)

    def start_ranks(self, n, cfg):
        p = subprocess.Popen([MPIRUN, "-np", str(n), GRADD, "run", cfg], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=mpi_env(), start_new_session=True)
        self.addCleanup(lambda: p.poll() is None and os.killpg(p.pid, signal.SIGKILL))
        return p

    def rank_pid(self, p, rank, timeout=30):
        """The pid of gradd rank `rank` under mpirun p."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    with open("/proc/%s/environ" % pid, "rb") as f:
                        env = f.read().split(b"\0")
                    with open("/proc/%s/cmdline" % pid, "rb") as f:
                        cmd = f.read().split(b"\0")
                except OSError:
                    continue
                if cmd[0].endswith(b"/gradd") and b"OMPI_COMM_WORLD_RANK=%d" % rank in env and \
                        self.under(int(pid), p.pid):
                    return int(pid)
            time.sleep(0.05)
        self.fail("rank %d did not start" % rank)

    @staticmethod
    def under(pid, ancestor):
        while pid > 1:
            if pid == ancestor:
                return True
            try:
                with open("/proc/%d/stat" % pid) as f:
                    pid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                return False
        return False

    def wait_steps(self, out, n, p):
        deadline = time.time() + 120
        while time.time() < deadline and len(steps_logged(out)) < n:
            self.assertIsNone(p.poll(), "the ranks ended early")
            time.sleep(0.02)
        self.assertGreaterEqual(len(steps_logged(out)), n)

    def test_killed_rank_fails_all_and_resumes_at_another_size(self):
        steps = 120
        cfg1, out1 = self.job("whole", steps=steps, ckpt=5, width=64)
        self.run1(cfg1)
        cfg, out = self.job("killed", steps=steps, ckpt=5, timeout="10s", width=64)
        p = self.start_ranks(2, cfg)
        self.wait_steps(out, 12, p)
        t0 = time.time()
        os.kill(self.rank_pid(p, 1), signal.SIGKILL)
        try:
            _, err = p.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            self.fail("the other rank did not end after one was killed")
        self.assertNotEqual(p.returncode, 0)
        self.assertLess(time.time() - t0, 40)
        done = len(steps_logged(out))
        self.assertLess(done, steps, "killed too late to test a resume")
        # One process now: from the checkpoint, to the same weights.
        r = self.run1(cfg)
        self.assertIn("resum", r.stderr.lower() + r.stdout.lower())
        self.assertLessEqual(harness.max_weight_diff(os.path.join(out1, "model.safetensors"), os.path.join(out, "model.safetensors")),
                             TOL)

    def test_stopped_rank_times_out(self):
        cfg, out = self.job("hung", steps=100000, ckpt=5, timeout="2s", width=128)
        p = self.start_ranks(2, cfg)
        self.wait_steps(out, 6, p)
        pid = self.rank_pid(p, 1)
        os.kill(pid, signal.SIGSTOP)
        self.addCleanup(lambda: os.kill(pid, signal.SIGKILL) if os.path.exists("/proc/%d" % pid) else None)
        t0 = time.time()
        try:
            _, err = p.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            self.fail("rank 0 waited for the stopped rank past its timeout")
        self.assertNotEqual(p.returncode, 0)
        self.assertLess(time.time() - t0, 40)
        self.assertIn("did not complete within 2 s", err)
        self.assertIn("rank 0 of 2", err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
