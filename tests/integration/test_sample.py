"""gradctl sample through a real daemon: a tiny GPT trained on Debian's
fortunes writes printable text of the requested length, a seed repeats it,
a running job samples from its checkpoint, and a bad id, an mlp job or a
job with no weights yet get clear errors."""
import json
import os
import shutil
import tempfile
import time
import unittest

import harness

FORTUNES = "/usr/share/games/fortunes"
FASHION = "/usr/share/datasets/fashion-mnist/"

GPT = """[job]
name = {name}
priority = {priority}
[model]
type = gpt
layers = 1
heads = 2
width = 32
context = 32
vocab = 256
[data]
format = text
train = {train}
val_fraction = 0.01
[train]
steps = {steps}
batch = 8
micro_batch = 8
lr = 1e-2
warmup = 2
threads = 1
eval_every = 0
eval_batches = 1
[output]
dir = {out}
checkpoint_every = {ckpt}
"""


@unittest.skipUnless(os.path.isdir(FORTUNES), "needs Debian's fortunes")
class Sample(harness.DaemonTest):
    conf = "[daemon]\nmax_jobs_per_device = 1\n"

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gradd-sample-")
        # Cleanups run after DaemonTest.tearDown has stopped the daemon.
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        os.chmod(self.dir, 0o755)
        super().setUp()

    def submit(self, name, steps=40, priority=0, ckpt=0):
        cfg = os.path.join(self.dir, name + ".cfg")
        with open(cfg, "w") as f:
            f.write(GPT.format(name=name, priority=priority, train=FORTUNES, steps=steps, ckpt=ckpt,
                               out=os.path.join(self.dir, name)))
        return json.loads(self.d.ctl("--json", "submit", cfg).stdout)["id"]

    def test_sample_a_trained_job(self):
        jid = self.submit("fortunes")
        self.d.ctl("watch", str(jid))
        r = self.d.ctl("sample", str(jid), "--prompt", "Q: ", "--tokens", "120", "--temperature", "0.7",
                       "--seed", "5")
        self.assertTrue(r.stdout.startswith("Q: "), r.stdout)
        # Fortunes are plain text: what a model of them writes is too (a
        # byte that is not UTF-8 prints as U+FFFD, itself printable).
        self.assertTrue(all(c.isprintable() or c in "\n\t" for c in r.stdout), repr(r.stdout))
        self.assertIn("model.safetensors (step 40), seed 5, 120 tokens", r.stderr)
        # The same seed, the same text; JSON carries the exact tokens.
        again = self.d.ctl_json("sample", str(jid), "--prompt", "Q: ", "--tokens", "120", "--temperature", "0.7",
                                "--seed", "5")
        self.assertEqual(len(again["token_ids"]), 120)
        raw = bytes(again["token_ids"])
        try:
            self.assertEqual(raw.decode("utf-8"), again["text"])
        except UnicodeDecodeError:
            self.assertIn("\ufffd", again["text"])
        self.assertEqual(r.stdout, "Q: " + again["text"] + ("" if raw.endswith(b"\n") else "\n"))
        self.assertEqual((again["vocab"], again["step"], again["seed"]), (256, 40, 5))
        # Without a seed, one is chosen and reported.
        fresh = self.d.ctl_json("sample", str(jid), "--tokens", "8")
        self.assertEqual(len(fresh["token_ids"]), 8)
        self.assertIsInstance(fresh["seed"], int)
        self.assertIn("sampled 120 tokens", self.d.read_log())

    def test_running_job_samples_its_checkpoint(self):
        jid = self.submit("long", steps=100000, ckpt=5)
        ckpt = os.path.join(self.dir, "long", "resume.safetensors")
        deadline = time.time() + 60
        while not os.path.exists(ckpt):
            self.assertLess(time.time(), deadline, "no checkpoint:\n" + self.d.read_log())
            time.sleep(0.05)
        s = self.d.ctl_json("sample", str(jid), "--tokens", "16", "--seed", "1")
        self.assertTrue(s["model_path"].endswith("/long/resume.safetensors"), s)
        self.assertGreaterEqual(s["step"], 5)
        self.assertEqual(len(s["token_ids"]), 16)
        self.d.ctl("cancel", str(jid))

    def test_errors(self):
        r = self.d.ctl("sample", "99", check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no job 99", r.stderr)
        # A job that has not run yet: nothing to sample (the first job
        # keeps the only slot busy).
        first = self.submit("first", steps=100000)
        queued = self.submit("queued", priority=0)
        r = self.d.ctl("sample", str(queued), check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("has no model.safetensors (written when the job finishes) and no resume.safetensors", r.stderr)
        self.assertIn(os.path.join(self.dir, "queued"), r.stderr)
        if os.path.exists(FASHION + "train-images-idx3-ubyte.gz"):
            cfg = os.path.join(self.dir, "mlp.cfg")
            with open(cfg, "w") as f:
                f.write("[model]\ntype = mlp\nhidden = 16\n[data]\nformat = idx\n"
                        "train = %strain-images-idx3-ubyte.gz\ntrain_labels = %strain-labels-idx1-ubyte.gz\n"
                        "subset = 64\n[train]\nsteps = 2\nbatch = 8\n[output]\ndir = %s/mlp\n"
                        % (FASHION, FASHION, self.dir))
            mid = json.loads(self.d.ctl("--json", "submit", cfg).stdout)["id"]
            r = self.d.ctl("sample", str(mid), check=False)
            self.assertEqual(r.returncode, 1)
            self.assertIn("job %d (mlp) trains an mlp classifier; only gpt jobs generate text" % mid, r.stderr)
        r = self.d.ctl("sample", str(first), "--tokens", "0", check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--tokens: '0' is not a whole number from 1 to 4096", r.stderr)
        r = self.d.ctl("sample", str(first), "--temperature", "hot", check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--temperature: 'hot'", r.stderr)
        r = self.d.ctl("sample", check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("a job id is required", r.stderr)
        self.d.ctl("cancel", str(first))


if __name__ == "__main__":
    harness.main()
