"""gradd's fp32 training steps against an independent float64 reference.

train_trace (a helper built beside this test) trains a tiny GPT and a tiny
MLP with gradd's engine and reports, for every optimizer step, the loss, the
learning rate and the gradient norm, with the samples the step trained on
and the parameters before and after.  This file redoes the same steps in
float64 numpy from the definitions (GPT-2; an MLP with ReLU and softmax
cross-entropy; AdamW; global-norm clipping; linear warmup then cosine decay,
gradd-job(5)), written without reference to gradd's C code, and compares.

What that covers beyond the per-op gradient checks and the accumulation and
resume tests: the whole backward through the model (the tied embedding's
two gradients, the residual paths), one step's batch split into uneven
micro-batches weighted into one mean, clipping by the global norm, AdamW's
bias correction, epsilon and decoupled weight decay on the matrices only,
and the schedule's value at every step, down to min_lr at the last.

The reference's own backward is checked against central differences of its
own forward (test_reference_gradients), so a disagreement points at gradd.
Only numpy is needed; safetensors files are read here directly.
"""
import json
import math
import os
import shutil
import subprocess
import tempfile
import unittest

import harness

try:
    import numpy as np
except ImportError:  # scripts/pyenv.sh's venv has it; a bare python may not
    np = None

# ---- the jobs --------------------------------------------------------------------------------

# Both jobs split their batch unevenly (6 = 4 + 2, 7 = 3 + 3 + 1), warm up,
# decay to a min_lr above zero, decay weights hard enough for a wrong set of
# decayed tensors to show, and clip at a norm their gradients cross: the
# test asserts that some steps clip and some do not.
COMMON = """
[train]
steps = 7
warmup = 2
lr = 1e-2
min_lr = 1e-3
weight_decay = 0.5
beta1 = 0.9
beta2 = 0.95
eps = 1e-8
seed = 4242
threads = 1
eval_every = 0
batch = {batch}
micro_batch = {micro}
grad_clip = {clip}
[memory]
tune = off
[output]
dir = {out}
"""

GPT_JOB = """[model]
type = gpt
layers = 2
heads = 2
width = 32
context = 16
vocab = 256
[data]
format = text
train = {train}
val_fraction = 0
""" + COMMON.replace("{batch}", "6").replace("{micro}", "4")

MLP_JOB = """[model]
type = mlp
hidden = 16, 8
[data]
format = npy
train = {train}
train_labels = {labels}
val_fraction = 0
""" + COMMON.replace("{batch}", "7").replace("{micro}", "3")

# Chosen between the steps' gradient norms (which the test prints on
# failure and checks straddle it): a clip above every norm would test
# nothing, one below every norm would not test the comparison.
GPT_CLIP = 1.4
MLP_CLIP = 1.5


def job_numbers(text):
    """The [train] numbers of a job file, as the reference needs them."""
    out = {}
    for line in text.splitlines():
        if "=" in line:
            key, val = (s.strip() for s in line.split("=", 1))
            try:
                out[key] = float(val)
            except ValueError:
                pass
    return out


# ---- reading gradd's files ---------------------------------------------------------------------

def load_safetensors(path):
    """{name: float64 array} of a safetensors file of F32 tensors."""
    return {name: np.frombuffer(data, dtype="<f4").reshape(shape).astype(np.float64)
            for name, (shape, data) in harness.f32_tensors(path).items()}


# ---- the GPT, from GPT-2's definition ---------------------------------------------------------
# Tensors in model.safetensors' layout: Conv1D weights (in, out), so a
# linear layer is x @ W + b; the output projection is wte's transpose.

LN_EPS = 1e-5
GELU_K = math.sqrt(2.0 / math.pi)


def layernorm(x, w, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + LN_EPS)
    xhat = (x - mu) * rstd
    return xhat * w + b, (xhat, rstd)


def layernorm_back(dy, w, cache):
    """y = xhat·w + b with xhat = (x - mean)/std over the last axis."""
    xhat, rstd = cache
    C = dy.shape[-1]
    dw = (dy * xhat).reshape(-1, C).sum(0)
    db = dy.reshape(-1, C).sum(0)
    dxhat = dy * w
    dx = rstd * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return dx, dw, db


def gelu(x):
    """GPT-2's tanh approximation."""
    return 0.5 * x * (1.0 + np.tanh(GELU_K * (x + 0.044715 * x ** 3)))


def gelu_grad(x):
    t = np.tanh(GELU_K * (x + 0.044715 * x ** 3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K * (1.0 + 3 * 0.044715 * x * x)


def linear_back(dy, x, W):
    """y = x @ W + b: (dx, dW, db), summing over every leading axis."""
    I, O = W.shape
    return dy @ W.T, x.reshape(-1, I).T @ dy.reshape(-1, O), dy.reshape(-1, O).sum(0)


def cross_entropy(logits, y):
    """Mean over every position of -log softmax(logits)[target], and its
    gradient with respect to the logits."""
    K = logits.shape[-1]
    z = logits.reshape(-1, K)
    t = y.reshape(-1)
    m = z.max(-1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(z - m).sum(-1))
    N = z.shape[0]
    loss = float((lse - z[np.arange(N), t]).mean())
    d = np.exp(z - lse[:, None])
    d[np.arange(N), t] -= 1.0
    return loss, (d / N).reshape(logits.shape)


def gpt_layers(P):
    return 1 + max(int(k.split(".")[1]) for k in P if k.startswith("h."))


def gpt_loss_grads(P, x, y, heads, want_grads=True):
    """Mean cross-entropy of targets y (B,T) after tokens x (B,T), and the
    gradient of that mean with respect to every tensor of P."""
    B, T = x.shape
    wte, wpe = P["wte.weight"], P["wpe.weight"]
    C = wte.shape[1]
    hs = C // heads
    causal = np.tril(np.ones((T, T), bool))
    h = wte[x] + wpe[:T]
    saved = []
    for l in range(gpt_layers(P)):
        p = "h.%d." % l
        a, ln1 = layernorm(h, P[p + "ln_1.weight"], P[p + "ln_1.bias"])
        qkv = a @ P[p + "attn.c_attn.weight"] + P[p + "attn.c_attn.bias"]
        q, k, v = (m.reshape(B, T, heads, hs).transpose(0, 2, 1, 3) for m in np.split(qkv, 3, axis=-1))
        s = np.where(causal, q @ k.transpose(0, 1, 3, 2) / math.sqrt(hs), -np.inf)
        att = np.exp(s - s.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        h2 = h + o @ P[p + "attn.c_proj.weight"] + P[p + "attn.c_proj.bias"]
        m2, ln2 = layernorm(h2, P[p + "ln_2.weight"], P[p + "ln_2.bias"])
        f = m2 @ P[p + "mlp.c_fc.weight"] + P[p + "mlp.c_fc.bias"]
        g = gelu(f)
        h3 = h2 + g @ P[p + "mlp.c_proj.weight"] + P[p + "mlp.c_proj.bias"]
        saved.append((a, ln1, q, k, v, att, o, m2, ln2, f, g))
        h = h3
    z, lnf = layernorm(h, P["ln_f.weight"], P["ln_f.bias"])
    loss, dlogits = cross_entropy(z @ wte.T, y)
    if not want_grads:
        return loss, None

    G = {}
    # The output layer is wte itself: its gradient here, the embedding's
    # lookup below, one tensor.
    G["wte.weight"] = dlogits.reshape(-1, wte.shape[0]).T @ z.reshape(-1, C)
    dh, G["ln_f.weight"], G["ln_f.bias"] = layernorm_back(dlogits @ wte, P["ln_f.weight"], lnf)
    for l in reversed(range(gpt_layers(P))):
        p = "h.%d." % l
        a, ln1, q, k, v, att, o, m2, ln2, f, g = saved[l]
        # h3 = h2 + mlp(h2): the stream's gradient goes on, plus the MLP's.
        dg, G[p + "mlp.c_proj.weight"], G[p + "mlp.c_proj.bias"] = linear_back(dh, g, P[p + "mlp.c_proj.weight"])
        dm2, G[p + "mlp.c_fc.weight"], G[p + "mlp.c_fc.bias"] = linear_back(dg * gelu_grad(f), m2,
                                                                            P[p + "mlp.c_fc.weight"])
        dx, G[p + "ln_2.weight"], G[p + "ln_2.bias"] = layernorm_back(dm2, P[p + "ln_2.weight"], ln2)
        dh = dh + dx
        # h2 = h + attn(h).
        do, G[p + "attn.c_proj.weight"], G[p + "attn.c_proj.bias"] = linear_back(dh, o,
                                                                                 P[p + "attn.c_proj.weight"])
        do = do.reshape(B, T, heads, hs).transpose(0, 2, 1, 3)
        datt = do @ v.transpose(0, 1, 3, 2)
        dv = att.transpose(0, 1, 3, 2) @ do
        ds = att * (datt - (datt * att).sum(-1, keepdims=True)) / math.sqrt(hs)
        dq, dk = ds @ k, ds.transpose(0, 1, 3, 2) @ q
        dqkv = np.concatenate([m.transpose(0, 2, 1, 3).reshape(B, T, C) for m in (dq, dk, dv)], axis=-1)
        da, G[p + "attn.c_attn.weight"], G[p + "attn.c_attn.bias"] = linear_back(dqkv, a,
                                                                                 P[p + "attn.c_attn.weight"])
        dx, G[p + "ln_1.weight"], G[p + "ln_1.bias"] = layernorm_back(da, P[p + "ln_1.weight"], ln1)
        dh = dh + dx
    np.add.at(G["wte.weight"], x.reshape(-1), dh.reshape(-1, C))
    G["wpe.weight"] = np.zeros_like(wpe)
    G["wpe.weight"][:T] = dh.sum(0)
    return loss, G


def gpt_exact_zeros(G):
    """The key bias adds q·b_k to every score of a row, which softmax does
    not see: its gradient is exactly zero, and what the float sum leaves
    there (~1e-18) is noise.  Adam would scale noise up to steps of ±lr,
    so it is set to the exact value."""
    for name in G:
        if name.endswith("attn.c_attn.bias"):
            C = G[name].shape[0] // 3
            assert np.abs(G[name][C:2 * C]).max() < 1e-12, np.abs(G[name][C:2 * C]).max()
            G[name][C:2 * C] = 0.0


# ---- the MLP -------------------------------------------------------------------------------
# layers.i.weight (out, in), layers.i.bias (out): y = x @ W.T + b, ReLU
# between layers, softmax cross-entropy over the classes.

def mlp_loss_grads(P, x, y, want_grads=True):
    n = len([k for k in P if k.endswith(".weight")])
    acts, pre = [x], []
    for i in range(n):
        z = acts[-1] @ P["layers.%d.weight" % i].T + P["layers.%d.bias" % i]
        pre.append(z)
        if i + 1 < n:
            acts.append(np.maximum(z, 0.0))
    loss, dz = cross_entropy(pre[-1], y)
    if not want_grads:
        return loss, None
    G = {}
    for i in reversed(range(n)):
        G["layers.%d.weight" % i] = dz.T @ acts[i]
        G["layers.%d.bias" % i] = dz.sum(0)
        if i:
            dz = (dz @ P["layers.%d.weight" % i]) * (pre[i - 1] > 0)
    return loss, G


# ---- the optimizer and the schedule ------------------------------------------------------------

def schedule(cfg, s):
    """The learning rate of 0-based step s (gradd-job(5)): lr·(s+1)/warmup
    over the warmup steps, so the last of them reaches lr; then a half
    cosine from lr at step `warmup` down to min_lr at the last step."""
    lr, lo, W, S = cfg["lr"], cfg["min_lr"], int(cfg["warmup"]), int(cfg["steps"])
    if s < W:
        return lr * (s + 1) / W
    span = S - 1 - W  # steps from the top of the cosine to its bottom
    x = (s - W) / span if span > 0 else 0.0
    return lo + (lr - lo) * (1 + math.cos(math.pi * x)) / 2


def reference_run(P0, batches, cfg, loss_grads, exact_zeros=None):
    """Every step of the job in float64: per step (loss, lr, grad_norm,
    clipped), and the final parameters."""
    P = {k: v.copy() for k, v in P0.items()}
    M = {k: np.zeros_like(v) for k, v in P.items()}
    V = {k: np.zeros_like(v) for k, v in P.items()}
    b1, b2, eps, wd, clip = cfg["beta1"], cfg["beta2"], cfg["eps"], cfg["weight_decay"], cfg["grad_clip"]
    steps = []
    for t, (x, y) in enumerate(batches, start=1):
        # The step's whole batch at once: its loss is the mean over every
        # unit of it, however gradd splits it.
        loss, G = loss_grads(P, x, y)
        if exact_zeros:
            exact_zeros(G)
        norm = math.sqrt(sum(float((g * g).sum()) for g in G.values()))
        scale = clip / norm if clip > 0 and norm > clip else 1.0
        lr = schedule(cfg, t - 1)
        for k in P:
            g = G[k] * scale
            M[k] = b1 * M[k] + (1 - b1) * g
            V[k] = b2 * V[k] + (1 - b2) * g * g
            mhat = M[k] / (1 - b1 ** t)
            vhat = V[k] / (1 - b2 ** t)
            # Decoupled decay (AdamW), on matrices only: the embeddings and
            # weight matrices, not biases or layernorm gains.
            decay = wd * P[k] if P[k].ndim == 2 else 0.0
            P[k] = P[k] - lr * (mhat / (np.sqrt(vhat) + eps) + decay)
        steps.append((loss, lr, norm, scale < 1.0))
    return steps, P


# ---- tolerances -------------------------------------------------------------------------------
# gradd computes in float32 (sums of losses and of squared gradients in
# double), the reference in float64, so the gap is float32 rounding, grown
# over 7 steps.  Measured on x86-64 with OpenBLAS for the jobs above (max
# over steps or tensors, gpt / mlp), and set about 10x above:
#   loss       relative error 9.9e-9 / 1.2e-7                  tolerance 1e-6
#   grad_norm  relative error 5.9e-8 / 2.4e-7                  tolerance 3e-6
#   lr         computed in double on both sides               tolerance 1e-12
#   updates    per tensor, final minus initial parameters:
#              |error| / |update|, 3.8e-6 / 1.2e-6            tolerance 4e-5
#              the largest element's error over the learning
#              rates summed over the run (the most Adam moves
#              one element, decay aside), 2.6e-5 / 3.6e-6     tolerance 3e-4
# The largest update errors are the layernorm gains': gradd stores them in
# float32 near 1, a rounding of up to 6e-8 at every step against updates
# of 1e-2 (rounding the reference's parameters to float32 after every step
# takes ln_f.weight's error to 0).  The element bound is looser because Adam
# divides by sqrt(v): an element whose gradient is near zero turns float32
# noise into a visible share of its step.
# The bugs this must catch are far above these (each was tried, see the
# commit message): not decaying the tied embedding changes a step's loss
# by up to 2.2e-3 relative and wte's update by 1.5e-2 of its norm; a cosine
# denominator off by one changes the fourth step's lr by 5e-2; clipping each
# tensor by its own norm changes a later step's grad_norm by 1.7e-2 and
# the updates by 2.6e-1 of their norm.
LOSS_RTOL = 1e-6
NORM_RTOL = 3e-6
LR_RTOL = 1e-12
UPDATE_RTOL = 4e-5
ELEMENT_TOL = 3e-4


@unittest.skipIf(np is None, "needs numpy")
class Reference(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="gradd-reference-")
        cls.exe = os.environ.get("TRAIN_TRACE", "")
        cls.verbose = bool(os.environ.get("GRADD_REFERENCE_VERBOSE"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def setUp(self):
        if not self.exe:
            self.skipTest("TRAIN_TRACE is not set (meson test sets it)")

    # -- data --

    def corpus(self):
        """About 50 windows of context 16 (the 7 steps read 42), of 42
        distinct bytes: the other 214 rows of the tied embedding learn
        through the output layer alone."""
        path = os.path.join(self.dir, "corpus.txt")
        rng = np.random.default_rng(7)
        words = ("the quick brown fox jumps over a lazy dog while five boxing wizards pack my box "
                 "with dozens of liquor jugs; Sphinx of black quartz, judge my vow! 0123456789").split()
        text = " ".join(words[i] for i in rng.integers(0, len(words), 150)) + "\n"
        with open(path, "w") as f:
            f.write(text)
        return path

    def images(self):
        """40 samples of 12 features in 4 classes (class-dependent means, so
        there is something to learn), as .npy: the 7 steps of 7 read into
        a second epoch.  Random floats, so no ReLU input sits exactly at
        its kink, where the derivative is a convention."""
        rng = np.random.default_rng(11)
        y = rng.integers(0, 4, 40).astype("<i4")
        centers = rng.normal(0, 1, (4, 12))
        x = (centers[y] + rng.normal(0, 0.7, (40, 12))).astype("<f4")
        px, py = os.path.join(self.dir, "x.npy"), os.path.join(self.dir, "y.npy")
        np.save(px, x)
        np.save(py, y)
        return px, py

    # -- running gradd --

    def trace(self, name, job):
        """Train `job` with train_trace: (job numbers, trace, initial and
        final parameters)."""
        out = os.path.join(self.dir, name)
        os.makedirs(out)
        cfg = os.path.join(self.dir, name + ".cfg")
        text = job.format(out=os.path.join(out, "run"))
        with open(cfg, "w") as f:
            f.write(text)
        r = subprocess.run([self.exe, cfg, out], capture_output=True, text=True, timeout=100)
        self.assertEqual(r.returncode, 0, "train_trace failed:\n" + r.stdout + r.stderr)
        with open(os.path.join(out, "trace.json")) as f:
            tr = json.load(f)
        init = load_safetensors(os.path.join(out, "init.safetensors"))
        final = load_safetensors(os.path.join(out, "run", "model.safetensors"))
        return job_numbers(text), tr, init, final

    # -- comparing --

    def compare(self, what, cfg, tr, init, final, ref_steps, ref_final):
        steps = tr["steps"]
        self.assertEqual(len(steps), int(cfg["steps"]))
        micro, batch = int(cfg["micro_batch"]), int(cfg["batch"])
        report = ["%s: step  loss (gradd, rel.err)  lr (gradd, ref)  grad_norm (gradd, rel.err)  clipped" % what]
        worst = {"loss": 0.0, "grad_norm": 0.0}
        for s, (loss, lr, norm, clipped) in zip(steps, ref_steps):
            el, en = abs(s["loss"] - loss) / loss, abs(s["grad_norm"] - norm) / norm
            worst["loss"], worst["grad_norm"] = max(worst["loss"], el), max(worst["grad_norm"], en)
            report.append("  %d  %.9f %.1e  %.9g %.9g  %.9g %.1e  %s" % (
                s["step"], s["loss"], el, s["lr"], lr, s["grad_norm"], en, "yes" if clipped else "no"))
        # The update of every tensor, gradd's against the reference's.
        self.assertEqual(sorted(final), sorted(ref_final))
        self.assertEqual(sorted(init), sorted(ref_final))
        lr_sum = sum(r[1] for r in ref_steps)
        tensors = []
        for k in sorted(ref_final):
            self.assertEqual(final[k].shape, ref_final[k].shape, k)
            du, dr = final[k] - init[k], ref_final[k] - init[k]
            rel = float(np.linalg.norm(du - dr) / max(np.linalg.norm(dr), 1e-30))
            elem = float(np.abs(du - dr).max() / lr_sum)
            tensors.append((k, rel, elem))
        report.append("  max rel. error: loss %.2e, grad_norm %.2e; updates: norm %.2e (%s), element %.2e lr (%s)" % (
            worst["loss"], worst["grad_norm"], max(t[1] for t in tensors), max(tensors, key=lambda t: t[1])[0],
            max(t[2] for t in tensors), max(tensors, key=lambda t: t[2])[0]))
        msg = "\n".join(report)
        if self.verbose:
            print("\n" + msg)

        for s, (loss, lr, norm, clipped) in zip(steps, ref_steps):
            n = s["step"]
            # The split is the configured one, the last micro-batch smaller.
            self.assertEqual((s["micro"], s["accum"]), (micro, -(-batch // micro)), msg)
            self.assertLessEqual(abs(s["lr"] - lr), LR_RTOL * lr, "step %d: lr\n%s" % (n, msg))
            self.assertLessEqual(abs(s["loss"] - loss), LOSS_RTOL * loss, "step %d: loss\n%s" % (n, msg))
            self.assertLessEqual(abs(s["grad_norm"] - norm), NORM_RTOL * norm, "step %d: grad_norm\n%s" % (n, msg))
        for k, rel, elem in tensors:
            self.assertLessEqual(rel, UPDATE_RTOL, "%s: update differs by %.2e of its norm\n%s" % (k, rel, msg))
            self.assertLessEqual(elem, ELEMENT_TOL, "%s: an element differs by %.2e of the lr sum\n%s" % (
                k, elem, msg))
        # The job exercises what it is meant to: clipping on some steps
        # and not on others, and a schedule that reaches min_lr.
        clipped = [r[3] for r in ref_steps]
        self.assertTrue(any(clipped) and not all(clipped), "clip %g against the norms:\n%s" % (
            cfg["grad_clip"], msg))
        self.assertEqual(ref_steps[-1][1], cfg["min_lr"])

    def test_gpt(self):
        job = GPT_JOB.replace("{train}", self.corpus()).replace("{clip}", str(GPT_CLIP))
        cfg, tr, init, final = self.trace("gpt", job)
        T, heads = int(cfg["context"]), int(cfg["heads"])
        batches = [(np.array(b["x"]).reshape(-1, T), np.array(b["y"]).reshape(-1, T)) for b in tr["batches"]]
        self.assertEqual(batches[0][0].shape, (int(cfg["batch"]), T))
        # The targets are the inputs shifted by one (windows of T+1 tokens).
        for x, y in batches:
            np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
        steps, ref = reference_run(init, batches, cfg, lambda P, x, y: gpt_loss_grads(P, x, y, heads),
                                   gpt_exact_zeros)
        self.compare("gpt", cfg, tr, init, final, steps, ref)

    def test_mlp(self):
        px, py = self.images()
        job = MLP_JOB.replace("{train}", px).replace("{labels}", py).replace("{clip}", str(MLP_CLIP))
        cfg, tr, init, final = self.trace("mlp", job)
        D = np.load(px).shape[1]
        batches = [(np.array(b["x"], dtype=np.float64).reshape(-1, D), np.array(b["y"])) for b in tr["batches"]]
        self.assertEqual(batches[0][0].shape, (int(cfg["batch"]), D))
        steps, ref = reference_run(init, batches, cfg, mlp_loss_grads)
        self.compare("mlp", cfg, tr, init, final, steps, ref)

    def test_reference_gradients(self):
        # The reference's backward is the derivative of its forward:
        # central differences in float64 at a few elements of every tensor
        # of a random GPT and MLP (with nonzero biases and gains, so that
        # no term hides behind a zero).
        rng = np.random.default_rng(3)

        def check(P, f):
            _, G = f(P, True)
            for k in sorted(P):
                for _ in range(3):
                    i = tuple(rng.integers(0, n) for n in P[k].shape)
                    old, h = P[k][i], 1e-5
                    P[k][i] = old + h
                    up = f(P, False)[0]
                    P[k][i] = old - h
                    down = f(P, False)[0]
                    P[k][i] = old
                    fd = (up - down) / (2 * h)
                    self.assertLessEqual(abs(fd - G[k][i]), 1e-7 * max(1.0, abs(fd)) + 1e-9,
                                         "%s%s: backward %.9g, central difference %.9g" % (k, i, G[k][i], fd))

        C, V, T, L, H = 8, 11, 5, 2, 2
        P = {"wte.weight": rng.normal(0, 0.5, (V, C)), "wpe.weight": rng.normal(0, 0.5, (T + 2, C)),
             "ln_f.weight": rng.normal(1, 0.3, C), "ln_f.bias": rng.normal(0, 0.3, C)}
        for l in range(L):
            p = "h.%d." % l
            for name, shape in (("ln_1.weight", C), ("ln_1.bias", C), ("attn.c_attn.weight", (C, 3 * C)),
                                ("attn.c_attn.bias", 3 * C), ("attn.c_proj.weight", (C, C)),
                                ("attn.c_proj.bias", C), ("ln_2.weight", C), ("ln_2.bias", C),
                                ("mlp.c_fc.weight", (C, 4 * C)), ("mlp.c_fc.bias", 4 * C),
                                ("mlp.c_proj.weight", (4 * C, C)), ("mlp.c_proj.bias", C)):
                P[p + name] = rng.normal(1 if name.startswith("ln") and name.endswith("weight") else 0, 0.5, shape)
        x, y = rng.integers(0, V, (3, T)), rng.integers(0, V, (3, T))
        check(P, lambda P, g: gpt_loss_grads(P, x, y, H, g))

        M = {"layers.0.weight": rng.normal(0, 0.5, (6, 5)), "layers.0.bias": rng.normal(0, 0.5, 6),
             "layers.1.weight": rng.normal(0, 0.5, (3, 6)), "layers.1.bias": rng.normal(0, 0.5, 3)}
        mx, my = rng.normal(0, 1, (4, 5)), rng.integers(0, 3, 4)
        check(M, lambda P, g: mlp_loss_grads(P, mx, my, g))

    def test_schedule_reference(self):
        # The schedule as gradd-job(5) states it, on its landmarks: the
        # first warmup step is lr/warmup, the last reaches lr, the cosine
        # starts at lr, passes the midpoint (lr + min_lr)/2 halfway and ends
        # at min_lr on the last step.
        cfg = {"lr": 1.0, "min_lr": 0.1, "warmup": 3, "steps": 14}
        self.assertAlmostEqual(schedule(cfg, 0), 1 / 3, places=15)
        self.assertAlmostEqual(schedule(cfg, 2), 1.0, places=15)
        self.assertAlmostEqual(schedule(cfg, 3), 1.0, places=15)
        self.assertAlmostEqual(schedule(cfg, 8), 0.55, places=15)
        self.assertAlmostEqual(schedule(cfg, 13), 0.1, places=15)


if __name__ == "__main__":
    unittest.main(verbosity=2)
