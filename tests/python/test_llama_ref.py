"""gradd's llama against an independent float64 NumPy Llama.

The reference below is written from the architecture's definition
(transformers' LlamaForCausalLM: RMSNorm pre-norm, rotary embeddings in the
rotate_half convention with Llama 3's frequency scaling, grouped-query
attention, a SwiGLU MLP, no biases, the head tied to the embedding or not)
with its own backward, which test_reference_backward checks against central
differences of its own forward, so a disagreement points at gradd.

model_probe (tests/unit/model_probe.c, built by meson) runs gradd's model
on the cpu kernels from the same parameters and batch and writes its
logits, loss, gradients and the parameters after one AdamW step.  Cases:
untied with plain RoPE; tied with Llama 3 scaling and packed samples
(pos, start); one key/value head with packing.  Each has ignored (-100)
targets.

Tolerances (fp32 against float64): per tensor, max |gradd - ref| below
1e-4 of max |ref| for logits, gradients and decode; the loss to 1e-5
relative; the step to 1e-3·lr where Adam's direction is well defined.
"""
import math
import os
import subprocess
import tempfile
import unittest

try:
    import numpy as np
    from safetensors.numpy import load_file, save_file
except ImportError:  # scripts/pyenv.sh's venv has both
    np = None

PROBE = os.environ.get("MODEL_PROBE", "")

# ---- the reference ---------------------------------------------------------------------------


def inv_freq(cfg):
    hs = cfg["width"] // cfg["heads"]
    f = 1.0 / cfg["rope_theta"] ** (np.arange(0, hs, 2, dtype=np.float64) / hs)
    if cfg.get("rope_scaling") == "llama3":
        factor, lo, hi, ctx = cfg["rope_factor"], cfg["rope_low_freq"], cfg["rope_high_freq"], cfg["rope_context"]
        wavelen = 2 * math.pi / f
        out = []
        for fi, wl in zip(f, wavelen):
            if wl < ctx / hi:
                out.append(fi)
            elif wl > ctx / lo:
                out.append(fi / factor)
            else:
                s = (ctx / wl - lo) / (hi - lo)
                out.append((1 - s) * fi / factor + s * fi)
        f = np.array(out)
    return f


def rope(x, cos, sin, inverse=False):
    """x (n,T,H,HS); cos, sin (n,T,HS/2)."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    if inverse:
        s = -s
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def rmsnorm(x, w, eps):
    r = 1.0 / np.sqrt((x * x).mean(-1) + eps)
    return x * r[..., None] * w, r


def rmsnorm_back(dy, x, w, r):
    c = x.shape[-1]
    dw = (dy * x * r[..., None]).sum((0, 1))
    dot = (dy * w * x).sum(-1)
    dx = r[..., None] * w * dy - x * (r ** 3 * dot / c)[..., None]
    return dx, dw


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def lora_name(module, ab):
    """PEFT's name of a linear layer's adapter A or B."""
    return "base_model.model.%s.lora_%s.weight" % (module, ab)


class Llama:
    """adapters: LoRA's A (r,in) and B (out,r) under lora_name, for some of
    the linear layers; each such layer adds scale·(x·Aᵀ)·Bᵀ (PEFT's).
    dropout: None, or a function (module, shape) -> the factors (0, or the
    kept elements' scale) that the layer's adapters see its input through:
    scale·((x·mask)·Aᵀ)·Bᵀ, PEFT's lora_dropout in training."""

    def __init__(self, cfg, params, adapters=None, scale=1.0, dropout=None):
        self.c = cfg
        self.p = {k: v.astype(np.float64) for k, v in params.items()}
        self.ad = {k: v.astype(np.float64) for k, v in (adapters or {}).items()}
        self.scale = scale
        self.drop = dropout
        self.inv = inv_freq(cfg)

    def mask(self, module, x):
        return self.drop(module, x.shape) if self.drop else 1.0

    def lin(self, module, x):
        y = x @ self.p[module + ".weight"].T
        if lora_name(module, "A") in self.ad:
            A, B = self.ad[lora_name(module, "A")], self.ad[lora_name(module, "B")]
            y = y + self.scale * ((x * self.mask(module, x)) @ A.T) @ B.T
        return y

    def lin_back(self, d, module, dy, x):
        """lin's backward: the gradients of its weight and adapters into d;
        returns the input's."""
        W = self.p[module + ".weight"]
        dy2, x2 = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
        d[module + ".weight"] += dy2.T @ x2
        dx = dy @ W
        if lora_name(module, "A") in self.ad:
            A, B = self.ad[lora_name(module, "A")], self.ad[lora_name(module, "B")]
            mask = self.mask(module, x)
            xa = (x * mask).reshape(x2.shape)  # what the adapters see
            gu = self.scale * dy2 @ B  # the gradient of xa·Aᵀ
            d[lora_name(module, "B")] += self.scale * dy2.T @ (xa @ A.T)
            d[lora_name(module, "A")] += gu.T @ xa
            dx = dx + (gu @ A).reshape(dx.shape) * mask
        return dx

    def head(self):
        return self.p["model.embed_tokens.weight"] if self.c["tie"] else self.p["lm_head.weight"]

    def forward(self, x, y, pos, start):
        c, p = self.c, self.p
        n, T = x.shape
        NH, KVH, C = c["heads"], c["kv_heads"], c["width"]
        HS, G = C // NH, NH // KVH
        ang = pos[..., None] * self.inv
        cos, sin = np.cos(ang), np.sin(ang)
        t = np.arange(T)
        mask = (t[None, None, :] <= t[None, :, None]) & (t[None, None, :] >= start[:, :, None])  # (n,T,U)
        h = p["model.embed_tokens.weight"][x]
        caches = []
        for l in range(c["layers"]):
            L = "model.layers.%d." % l
            a, r1 = rmsnorm(h, p[L + "input_layernorm.weight"], c["norm_eps"])
            q = self.lin(L + "self_attn.q_proj", a).reshape(n, T, NH, HS)
            k = self.lin(L + "self_attn.k_proj", a).reshape(n, T, KVH, HS)
            v = self.lin(L + "self_attn.v_proj", a).reshape(n, T, KVH, HS)
            qr, kr = rope(q, cos, sin), rope(k, cos, sin)
            kx, vx = np.repeat(kr, G, axis=2), np.repeat(v, G, axis=2)
            s = np.einsum("bthd,buhd->bhtu", qr, kx) / math.sqrt(HS)
            s = np.where(mask[:, None], s, -np.inf)
            P = np.exp(s - s.max(-1, keepdims=True))
            P /= P.sum(-1, keepdims=True)
            o = np.einsum("bhtu,buhd->bthd", P, vx).reshape(n, T, C)
            h2 = h + self.lin(L + "self_attn.o_proj", o)
            b, r2 = rmsnorm(h2, p[L + "post_attention_layernorm.weight"], c["norm_eps"])
            g = self.lin(L + "mlp.gate_proj", b)
            u = self.lin(L + "mlp.up_proj", b)
            m = g * sigmoid(g) * u
            h3 = h2 + self.lin(L + "mlp.down_proj", m)
            caches.append((h, a, r1, qr, kr, kx, vx, v, P, o, h2, b, r2, g, u, m))
            h = h3
        f, rf = rmsnorm(h, p["model.norm.weight"], c["norm_eps"])
        logits = f @ self.head().T
        keep = y >= 0
        z = logits - logits.max(-1, keepdims=True)
        lp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        nll = -np.take_along_axis(lp, np.maximum(y, 0)[..., None], -1)[..., 0]
        loss = (nll * keep).sum() / keep.sum()
        self.saved = (x, y, keep, cos, sin, caches, h, f, rf, lp)
        return logits, loss

    def backward(self):
        c, p = self.c, self.p
        x, y, keep, cos, sin, caches, hlast, f, rf, lp = self.saved
        n, T = x.shape
        NH, KVH, C = c["heads"], c["kv_heads"], c["width"]
        HS, G = C // NH, NH // KVH
        d = {k: np.zeros_like(v) for k, v in list(p.items()) + list(self.ad.items())}
        dlog = np.exp(lp)
        np.put_along_axis(dlog, np.maximum(y, 0)[..., None], np.take_along_axis(dlog, np.maximum(y, 0)[..., None], -1) - 1, -1)
        dlog *= (keep / keep.sum())[..., None]
        hd = "model.embed_tokens.weight" if c["tie"] else "lm_head.weight"
        d[hd] += dlog.reshape(-1, dlog.shape[-1]).T @ f.reshape(-1, C)
        dh, dw = rmsnorm_back(dlog @ self.head(), hlast, p["model.norm.weight"], rf)
        d["model.norm.weight"] += dw
        for l in reversed(range(c["layers"])):
            L = "model.layers.%d." % l
            h, a, r1, qr, kr, kx, vx, v, P, o, h2, b, r2, g, u, m = caches[l]
            # MLP
            dm = self.lin_back(d, L + "mlp.down_proj", dh, m)
            sg = sigmoid(g)
            dg = dm * u * sg * (1 + g * (1 - sg))
            du = dm * g * sg
            db = self.lin_back(d, L + "mlp.gate_proj", dg, b) + self.lin_back(d, L + "mlp.up_proj", du, b)
            dx2, dw = rmsnorm_back(db, h2, p[L + "post_attention_layernorm.weight"], r2)
            d[L + "post_attention_layernorm.weight"] += dw
            dh2 = dh + dx2
            # attention
            do = self.lin_back(d, L + "self_attn.o_proj", dh2, o).reshape(n, T, NH, HS)
            dP = np.einsum("bthd,buhd->bhtu", do, vx)
            dS = P * (dP - (dP * P).sum(-1, keepdims=True)) / math.sqrt(HS)
            dqr = np.einsum("bhtu,buhd->bthd", dS, kx)
            dkx = np.einsum("bhtu,bthd->buhd", dS, qr)
            dvx = np.einsum("bhtu,bthd->buhd", P, do)
            dkr = dkx.reshape(n, T, KVH, G, HS).sum(3)
            dv = dvx.reshape(n, T, KVH, G, HS).sum(3)
            dq = rope(dqr, cos, sin, inverse=True).reshape(n, T, -1)
            dk = rope(dkr, cos, sin, inverse=True).reshape(n, T, -1)
            dv = dv.reshape(n, T, -1)
            da = 0
            for nm, dd in (("q", dq), ("k", dk), ("v", dv)):
                da = da + self.lin_back(d, L + "self_attn.%s_proj" % nm, dd, a)
            dx1, dw = rmsnorm_back(da, h, p[L + "input_layernorm.weight"], r1)
            d[L + "input_layernorm.weight"] += dw
            dh = dh2 + dx1
        np.add.at(d["model.embed_tokens.weight"], x.reshape(-1), dh.reshape(-1, C))
        return d


def adamw(p, g, lr, b1, b2, eps, wd, decay):
    m, v = (1 - b1) * g, (1 - b2) * g * g
    mh, vh = m / (1 - b1), v / (1 - b2)
    return p - lr * (mh / (np.sqrt(vh) + eps) + (wd * p if decay else 0))


# ---- the cases -------------------------------------------------------------------------------

TRAIN = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)


def names(cfg):
    out = ["model.embed_tokens.weight"]
    for l in range(cfg["layers"]):
        L = "model.layers.%d." % l
        out += [L + s for s in ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                                "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                                "mlp.down_proj.weight")]
    out.append("model.norm.weight")
    if not cfg["tie"]:
        out.append("lm_head.weight")
    return out


def random_params(cfg, rng):
    C, F, V = cfg["width"], cfg["mlp_width"], cfg["vocab"]
    HS = C // cfg["heads"]
    shapes = {"q_proj": (C, C), "k_proj": (cfg["kv_heads"] * HS, C), "v_proj": (cfg["kv_heads"] * HS, C),
              "o_proj": (C, C), "gate_proj": (F, C), "up_proj": (F, C), "down_proj": (C, F)}
    out = {}
    for nm in names(cfg):
        if nm.endswith("layernorm.weight") or nm == "model.norm.weight":
            a = 1 + 0.2 * rng.standard_normal(C)
        elif nm in ("model.embed_tokens.weight", "lm_head.weight"):
            a = 0.15 * rng.standard_normal((V, C))
        else:
            shape = shapes[nm.split(".")[-2]]
            a = rng.standard_normal(shape) / math.sqrt(shape[1]) * 1.5
        out[nm] = a.astype(np.float32)
    return out


def packed_batch(rng, cfg, samples):
    """samples: per sequence, the lengths of its packed samples.  The last
    token of each sample and a prompt of 2 tokens are ignored targets."""
    T, V = cfg["context"], cfg["vocab"]
    n = len(samples)
    x = rng.integers(0, V, (n, T)).astype(np.int32)
    y = np.full((n, T), -100, np.int32)
    pos = np.zeros((n, T), np.int32)
    start = np.zeros((n, T), np.int32)
    for b, lens in enumerate(samples):
        t0 = 0
        for ln in lens:
            for i in range(ln):
                pos[b, t0 + i] = i
                start[b, t0 + i] = t0
                if 2 <= i < ln - 1:
                    y[b, t0 + i] = x[b, t0 + i + 1]
            t0 += ln
        assert t0 == T
    return x, y, pos, start


def job_text(cfg):
    lines = ["[model]", "type = llama"]
    for k in ("layers", "heads", "kv_heads", "width", "mlp_width", "context", "vocab", "rope_theta", "norm_eps"):
        lines.append("%s = %s" % (k, cfg[k]))
    lines.append("tie_embeddings = %s" % ("on" if cfg["tie"] else "off"))
    if cfg.get("rope_scaling") == "llama3":
        lines += ["rope_scaling = llama3", "rope_factor = %s" % cfg["rope_factor"],
                  "rope_low_freq = %s" % cfg["rope_low_freq"], "rope_high_freq = %s" % cfg["rope_high_freq"],
                  "rope_context = %s" % cfg["rope_context"]]
    lines += ["[data]", "train = data.txt", "[train]"] + ["%s = %s" % kv for kv in TRAIN.items()]
    lines += ["[output]", "dir = out"]
    return "\n".join(lines) + "\n"


BASE = dict(layers=2, heads=4, kv_heads=2, width=64, mlp_width=96, context=16, vocab=300, rope_theta=10000.0,
            norm_eps=1e-5, tie=False)
# rope_context 64 over head size 16 puts wavelengths in all three bands.
LLAMA3 = dict(rope_scaling="llama3", rope_factor=4.0, rope_low_freq=1.0, rope_high_freq=4.0, rope_context=64)
CASES = {
    "untied": (dict(BASE), None),
    "tied_llama3_packed": (dict(BASE, tie=True, **LLAMA3), [[5, 7, 4], [10, 6]]),
    "mqa_packed": (dict(BASE, kv_heads=1, rope_theta=500000.0), [[16], [3, 3, 10]]),
}


def rel(a, b):
    return float(np.abs(a.astype(np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


def batch_for(rng, cfg, packing):
    """The probe's batch and x, y, pos, start: packed samples (packing, as
    packed_batch's), or else two sequences with some targets ignored."""
    if packing:
        x, y, pos, start = packed_batch(rng, cfg, packing)
        return dict(x=x, y=y, pos=pos, start=start), x, y, pos, start
    T, V = cfg["context"], cfg["vocab"]
    x = rng.integers(0, V, (2, T)).astype(np.int32)
    y = rng.integers(0, V, (2, T)).astype(np.int32)
    y[0, :3] = -100
    y[1, 7] = -100
    pos = np.tile(np.arange(T, dtype=np.int32), (2, 1))
    return dict(x=x, y=y), x, y, pos, np.zeros_like(pos)


def report(name, loss, worst):
    """The loss and the four worst relative errors, for the test's log."""
    print("%s: loss %.6f; worst relative errors: %s" % (
        name, loss, ", ".join("%s %.2g" % (k, v) for k, v in sorted(worst.items(), key=lambda kv: -kv[1])[:4])))


@unittest.skipIf(np is None, "needs numpy and safetensors (scripts/pyenv.sh)")
class ProbeCase(unittest.TestCase):
    """A test that runs model_probe in a temporary directory."""

    def setUp(self):
        if not PROBE:
            self.skipTest("MODEL_PROBE is not set (meson test sets it)")
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def probe(self, job, tensors, batch):
        """model_probe on the job file's text, the tensors and the batch: what it wrote."""
        d = self.tmp.name
        with open(os.path.join(d, "job.cfg"), "w") as f:
            f.write(job)
        save_file(tensors, os.path.join(d, "params.safetensors"))
        save_file(batch, os.path.join(d, "batch.safetensors"))
        out = os.path.join(d, "out.safetensors")
        r = subprocess.run([PROBE, os.path.join(d, "job.cfg"), os.path.join(d, "params.safetensors"),
                            os.path.join(d, "batch.safetensors"), out], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        return load_file(out)

    def check_central(self, ref, table, names, grads, batch, rng):
        """ref's gradients of the tensors `names` in `table` (ref.p or ref.ad)
        against central differences of its forward, at 3 elements each."""
        for nm in names:
            flat = table[nm].reshape(-1)
            for i in rng.choice(flat.size, 3, replace=False):
                old = flat[i]
                flat[i] = old + 1e-6
                lp = ref.forward(*batch)[1]
                flat[i] = old - 1e-6
                lm = ref.forward(*batch)[1]
                flat[i] = old
                num = (lp - lm) / 2e-6
                self.assertLess(abs(num - grads[nm].reshape(-1)[i]), 1e-6 + 1e-5 * abs(num), nm)


class LlamaReference(ProbeCase):
    def run_case(self, name):
        cfg, packing = CASES[name]
        rng = np.random.default_rng(sum(map(ord, name)))
        params = random_params(cfg, rng)
        batch, x, y, pos, start = batch_for(rng, cfg, packing)
        got = self.probe(job_text(cfg), params, batch)
        ref = Llama(cfg, params)
        logits, loss = ref.forward(x, y, pos, start)
        grads = ref.backward()
        return cfg, params, got, logits, loss, grads, ref

    def check(self, name):
        cfg, params, got, logits, loss, grads, ref = self.run_case(name)
        worst = {}
        self.assertLess(abs(float(got["loss"]) - loss) / loss, 1e-5, "loss %r vs %r" % (float(got["loss"]), loss))
        worst["logits"] = rel(got["logits"], logits)
        self.assertLess(worst["logits"], 1e-4)
        if "decode_logits" in got:
            worst["decode"] = rel(got["decode_logits"], logits)
            self.assertLess(worst["decode"], 1e-4)
        self.assertEqual(sorted(k[5:] for k in got if k.startswith("grad.")), sorted(names(cfg)))
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
        clip = min(1.0, TRAIN["grad_clip"] / norm)
        lr = TRAIN["lr"]
        for nm in names(cfg):
            g = got["grad." + nm]
            worst[nm] = e = rel(g, grads[nm])
            self.assertLess(e, 1e-4, "%s: gradient off by %.3g of its largest element" % (nm, e))
            decay = params[nm].ndim == 2
            p64 = params[nm].astype(np.float64)
            # The step as gradd takes it, from gradd's own gradient: exact to fp32.
            mine = adamw(p64, g.astype(np.float64) * clip, lr, TRAIN["beta1"], TRAIN["beta2"], TRAIN["eps"],
                         TRAIN["weight_decay"], decay)
            self.assertLess(np.abs(got["step." + nm] - mine).max(), 1e-5 * lr + 1e-6, nm)
            # From the reference's gradient: Adam's first step moves each element by about lr·sign(g), so
            # compare where the sign is well defined (|g| well above fp32's rounding of the sum).
            full = adamw(p64, grads[nm] * clip, lr, TRAIN["beta1"], TRAIN["beta2"], TRAIN["eps"],
                         TRAIN["weight_decay"], decay)
            sure = np.abs(grads[nm]) > 1e-4 * np.abs(grads[nm]).max()
            if params[nm].shape[0] != cfg["vocab"]:  # rows of unlikely tokens have tiny gradients
                self.assertGreater(sure.mean(), 0.9, nm)
            self.assertLess(np.abs(got["step." + nm] - full)[sure].max(initial=0), 1e-3 * lr, nm)
        report(name, loss, worst)

    def test_untied(self):
        self.check("untied")

    def test_tied_llama3_packed(self):
        self.check("tied_llama3_packed")

    def test_mqa_packed(self):
        self.check("mqa_packed")

    def test_reference_backward(self):
        """The reference's backward against central differences of its forward."""
        cfg, packing = CASES["tied_llama3_packed"]
        rng = np.random.default_rng(7)
        params = random_params(cfg, rng)
        x, y, pos, start = packed_batch(rng, cfg, packing)
        ref = Llama(cfg, params)
        ref.forward(x, y, pos, start)
        grads = ref.backward()
        self.check_central(ref, ref.p, names(cfg), grads, (x, y, pos, start), rng)

    def test_llama3_frequencies(self):
        """Llama 3 scaling keeps the fast rotations, slows the slow ones by
        the factor, and blends the band between."""
        cfg = dict(BASE, **LLAMA3)
        plain, scaled = inv_freq(dict(BASE)), inv_freq(cfg)
        wl = 2 * math.pi / plain
        self.assertTrue(np.allclose(scaled[wl < 16], plain[wl < 16]))
        self.assertTrue(np.allclose(scaled[wl > 64], plain[wl > 64] / 4))
        mid = (wl >= 16) & (wl <= 64)
        self.assertTrue(mid.any() and (scaled[mid] < plain[mid]).all() and (scaled[mid] > plain[mid] / 4).all())


if __name__ == "__main__":
    unittest.main(verbosity=2)
