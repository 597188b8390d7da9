"""gradctl sample through a real daemon: a tiny GPT trained on Debian's
fortunes writes printable text of the requested length, a seed repeats it,
a llama samples too, a running job samples from its checkpoint, and a bad
id, an mlp job or a job with no weights yet get clear errors."""
import json
import os
import shutil
import tempfile
import time
import unittest

import harness

try:
    import numpy as np
    from safetensors.numpy import load_file
except ImportError:  # the test venv has both; a bare python may not
    np = None


def gpt2_logits(t, ids):
    """GPT-2's forward, written from its definition, over the tensors of a
    model.safetensors in GPT-2's layout (Conv1D weights are (in, out)), in
    float64: the logits at every position, (T, V)."""
    x = t["wte.weight"][ids].astype(np.float64) + t["wpe.weight"][: len(ids)]
    C = x.shape[1]
    L = 1 + max(int(k.split(".")[1]) for k in t if k.startswith("h."))

    def ln(v, w, b):
        m = v.mean(-1, keepdims=True)
        var = ((v - m) ** 2).mean(-1, keepdims=True)
        return (v - m) / np.sqrt(var + 1e-5) * w + b

    def gelu(v):
        return 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))

    T = len(ids)
    for l in range(L):
        p = "h.%d." % l
        a = ln(x, t[p + "ln_1.weight"], t[p + "ln_1.bias"])
        qkv = a @ t[p + "attn.c_attn.weight"] + t[p + "attn.c_attn.bias"]
        q, k, v = np.split(qkv, 3, axis=-1)
        H = HEADS
        q, k, v = (m.reshape(T, H, C // H).transpose(1, 0, 2) for m in (q, k, v))
        att = q @ k.transpose(0, 2, 1) / np.sqrt(C // H)
        att = np.where(np.tril(np.ones((T, T), bool)), att, -np.inf)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(1, 0, 2).reshape(T, C)
        x = x + y @ t[p + "attn.c_proj.weight"] + t[p + "attn.c_proj.bias"]
        m = ln(x, t[p + "ln_2.weight"], t[p + "ln_2.bias"])
        x = x + gelu(m @ t[p + "mlp.c_fc.weight"] + t[p + "mlp.c_fc.bias"]) @ t[p + "mlp.c_proj.weight"] \
            + t[p + "mlp.c_proj.bias"]
    x = ln(x, t["ln_f.weight"], t["ln_f.bias"])
    return x @ t["wte.weight"].T.astype(np.float64)

FORTUNES = "/usr/share/games/fortunes"
FASHION = "/usr/share/datasets/fashion-mnist/"

HEADS = 2
GPT = """[job]
name = {name}
priority = {priority}
[model]
type = gpt
layers = {layers}
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

    def submit(self, name, steps=40, priority=0, ckpt=0, layers=1):
        cfg = os.path.join(self.dir, name + ".cfg")
        with open(cfg, "w") as f:
            f.write(GPT.format(name=name, priority=priority, train=FORTUNES, steps=steps, ckpt=ckpt,
                               out=os.path.join(self.dir, name), layers=layers))
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

    @unittest.skipIf(np is None, "needs numpy and safetensors")
    def test_exported_model_is_gpt2(self):
        # The exported tensors, run by an independent GPT-2 forward, choose
        # the tokens the daemon's own model chooses: names, layouts (the
        # transposed Conv1D weights, q/k/v order, tied output) all agree.
        jid = self.submit("gpt2", steps=30, layers=2)
        self.d.ctl("watch", str(jid))
        t = load_file(os.path.join(self.dir, "gpt2", "model.safetensors"))
        s = self.d.ctl_json("sample", str(jid), "--prompt", "Q: ", "--tokens", "28", "--temperature", "0")
        ids = list(b"Q: ")
        for i, tok in enumerate(s["token_ids"]):
            logits = gpt2_logits(t, ids)[-1]
            # The daemon computes in fp32: its pick is the reference's
            # argmax, or within fp32 noise of it (a near tie).
            self.assertLessEqual(logits.max() - logits[tok], 1e-4 * max(1.0, abs(logits.max())),
                                 "token %d: gradd chose %d, the reference %d" % (i, tok, int(logits.argmax())))
            ids.append(tok)

    @unittest.skipIf(np is None, "needs numpy and safetensors")
    def test_exported_model_gives_the_validation_loss(self):
        # Every logit, not only the argmax: the reference's mean loss over
        # the validation windows (stride T from the start of the val file,
        # gradd-job(5)) is the one gradd reported for its own model.
        val = os.path.join(self.dir, "val.txt")
        with open(os.path.join(FORTUNES, "fortunes"), "rb") as f:
            text = f.read(32 * 12 + 1)
        with open(val, "wb") as f:
            f.write(text)
        os.chmod(val, 0o644)
        cfg = os.path.join(self.dir, "valtest.cfg")
        with open(cfg, "w") as f:
            f.write(GPT.format(name="valtest", priority=0, train=FORTUNES, steps=30, ckpt=0,
                               out=os.path.join(self.dir, "valtest"), layers=2)
                    .replace("val_fraction = 0.01", "val = " + val).replace("eval_batches = 1", "eval_batches = 0"))
        jid = json.loads(self.d.ctl("--json", "submit", cfg).stdout)["id"]
        self.d.ctl("watch", str(jid))
        j = self.d.ctl_json("status", str(jid))
        t = load_file(os.path.join(self.dir, "valtest", "model.safetensors"))
        T, losses = 32, []
        for w in range((len(text) - 1) // T):
            ids = list(text[w * T:w * T + T + 1])
            logits = gpt2_logits(t, ids[:-1])
            m = logits.max(-1, keepdims=True)
            lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
            losses += list(lse - logits[np.arange(T), ids[1:]])
        self.assertEqual(len(losses), 12 * T)
        # fp32 against float64 over a few hundred tokens: 1e-5 relative.
        self.assertAlmostEqual(j["val_loss"], float(np.mean(losses)), delta=1e-5 * float(np.mean(losses)))

    def test_sample_a_llama(self):
        # A llama job samples as a gpt does: its describe line builds the
        # model back (Llama 3 scaling and a tied head included), and the
        # key/value cache decodes with rotary positions and grouped heads
        # (test_llama_ref checks the numbers against a float64 reference).
        cfg = os.path.join(self.dir, "llama.cfg")
        with open(cfg, "w") as f:
            f.write(GPT.format(name="llama", priority=0, train=FORTUNES, steps=20, ckpt=0,
                               out=os.path.join(self.dir, "llama"), layers=1)
                    .replace("type = gpt", "type = llama\nkv_heads = 1\nmlp_width = 48\ntie_embeddings = on\n"
                             "rope_scaling = llama3\nrope_context = 16"))
        jid = json.loads(self.d.ctl("--json", "submit", cfg).stdout)["id"]
        self.d.ctl("watch", str(jid))
        runs = [self.d.ctl_json("sample", str(jid), "--prompt", "Q: ", "--tokens", "40", "--seed", "3")
                for _ in range(2)]
        self.assertEqual(runs[0]["token_ids"], runs[1]["token_ids"])
        self.assertEqual(len(runs[0]["token_ids"]), 40)
        self.assertEqual((runs[0]["vocab"], runs[0]["step"]), (256, 20))

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
            self.assertIn("job %d (mlp) trains an mlp classifier; only gpt or llama jobs generate text" % mid, r.stderr)
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
