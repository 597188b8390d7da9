"""gradd's LoRA on llama against the float64 NumPy Llama of test_llama_ref.py.

The reference's linear layers add scale·(x·Aᵀ)·Bᵀ where a layer has
adapters, with their own backward (Llama.lin_back), which
test_reference_backward checks against central differences of the
forward in A and B.  model_probe runs gradd's model on the cpu kernels
from the same base, adapters (under PEFT's names) and batch, and writes
its loss, logits (and decode logits), the adapters' gradients, and the
adapters after one AdamW step; the base gets no gradient.

Adapters on q_proj, v_proj, o_proj and down_proj, rank 4, alpha 8; A drawn
as PEFT does (uniform within ±1/√in), B nonzero so that every path
matters.  Cases: untied with GQA (decode checked too); tied, one
key/value head, Llama 3 scaling and packed samples; each again with
dropout 0.2 on the adapters' inputs, the masks drawn here from gradd's
definition of them (the logits and decoding then without, as evaluation).

Tolerances (fp32 against float64), as test_llama_ref's: per tensor, max
|gradd - ref| below 1e-4 of max |ref| for logits and gradients; the loss
to 1e-5 relative; the step to 1e-5·lr from gradd's own gradient.
"""
import math
import unittest

from test_llama_ref import BASE, LLAMA3, TRAIN, Llama, ProbeCase, adamw, batch_for, job_text, lora_name, np, \
    random_params, rel, report

TARGETS = ("q_proj", "v_proj", "o_proj", "down_proj")
RANK, ALPHA = 4, 8.0
CASES = {
    "untied_gqa": (dict(BASE), None),
    "tied_mqa_llama3_packed": (dict(BASE, tie=True, kv_heads=1, **LLAMA3), [[5, 7, 4], [10, 6]]),
}


def modules(cfg):
    """The adapted layers: (module, in, out)."""
    C, F, HS = cfg["width"], cfg["mlp_width"], cfg["width"] // cfg["heads"]
    sizes = {"q_proj": (C, C), "v_proj": (C, cfg["kv_heads"] * HS), "o_proj": (C, C), "down_proj": (F, C)}
    out = []
    for l in range(cfg["layers"]):
        for t in TARGETS:
            part = "mlp" if t == "down_proj" else "self_attn"
            out.append(("model.layers.%d.%s.%s" % (l, part, t),) + sizes[t])
    return out


def random_adapters(cfg, rng):
    ad = {}
    for mod, n_in, n_out in modules(cfg):
        bound = 1 / math.sqrt(n_in)
        ad[lora_name(mod, "A")] = rng.uniform(-bound, bound, (RANK, n_in)).astype(np.float32)
        ad[lora_name(mod, "B")] = (0.3 * rng.standard_normal((n_out, RANK))).astype(np.float32)
    return ad


def lora_job(cfg, dropout=0.0):
    text = job_text(cfg).replace("[train]\n", "[train]\nseed = %d\n" % SEED)
    return text + "[finetune]\nmethod = lora\nrank = %d\nalpha = %s\ntargets = %s\ndropout = %s\n" % (
        RANK, ALPHA, ",".join(TARGETS), dropout)


# Dropout's masks as gradd defines them (lora.h, kernels.h), written anew:
# a layer's stream is splitmix64's mix of (the step's stream, FNV-1a 64 of
# the module's name), and element i of its input (rows of `in` in a row
# major (n,T,in)) is kept when the top 32 bits of the mix of
# stream + (i+1)·0x9E3779B97F4A7C15 reach p·2³², p as fp32.  Kept ones are
# scaled by 1/(1-p) in fp32.  The probe's step stream is [train] seed.
SEED = 20261128
U64 = np.uint64


def mix64(z):
    z = (z ^ (z >> U64(30))) * U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> U64(27))) * U64(0x94D049BB133111EB)
    return z ^ (z >> U64(31))


def rand_u64(seed, i):
    with np.errstate(over="ignore"):
        return int(mix64(U64(seed) * U64(0x9E3779B97F4A7C15) + U64(i) * U64(0xD1B54A32D192ED03) +
                         U64(0x94D049BB133111EB)))


def fnv1a64(text):
    h = 0xcbf29ce484222325
    for c in text.encode():
        h = ((h ^ c) * 0x100000001b3) % (1 << 64)
    return h


def dropout_masks(p, seed):
    p32 = np.float32(p)
    below = min(int(float(p32) * 2.0 ** 32), 2 ** 32 - 1)
    keep = float(np.float32(1) / (np.float32(1) - p32))

    def mask(module, shape):
        site = U64(rand_u64(seed, fnv1a64(module)))
        i = np.arange(int(np.prod(shape)), dtype=np.uint64)
        with np.errstate(over="ignore"):
            z = mix64(site + (i + U64(1)) * U64(0x9E3779B97F4A7C15))
        return np.where((z >> U64(32)) >= U64(below), keep, 0.0).reshape(shape)
    return mask


class LoraReference(ProbeCase):
    def check(self, name, dropout=0.0):
        cfg, packing = CASES[name]
        rng = np.random.default_rng(sum(map(ord, name)))
        params = random_params(cfg, rng)
        adapters = random_adapters(cfg, rng)
        batch, x, y, pos, start = batch_for(rng, cfg, packing)
        got = self.probe(lora_job(cfg, dropout), dict(params, **adapters), batch)
        ref = Llama(cfg, params, adapters, ALPHA / RANK, dropout_masks(dropout, SEED) if dropout else None)
        loss = ref.forward(x, y, pos, start)[1]
        grads = ref.backward()
        # Evaluation (the logits, decoding) runs without dropout.
        logits, plain = Llama(cfg, params, adapters, ALPHA / RANK).forward(x, y, pos, start)

        worst = {}
        self.assertLess(abs(float(got["loss"]) - loss) / loss, 1e-5, "loss %r vs %r" % (float(got["loss"]), loss))
        if dropout:  # it matters: the training loss is not the evaluation's
            self.assertGreater(abs(loss - plain) / loss, 1e-3)
        worst["logits"] = rel(got["logits"], logits)
        self.assertLess(worst["logits"], 1e-4)
        if "decode_logits" in got:
            worst["decode"] = rel(got["decode_logits"], logits)
            self.assertLess(worst["decode"], 1e-4)
        else:
            self.assertIsNotNone(packing, "an unpacked batch is decoded too")
        # The adapters train, and nothing else.
        self.assertEqual(sorted(k[5:] for k in got if k.startswith("grad.")), sorted(adapters))
        # The adapters move the model: their gradients and the logits differ
        # from the base model's by far more than the tolerance.
        base_logits = Llama(cfg, params).forward(x, y, pos, start)[0]
        self.assertGreater(rel(got["logits"], base_logits), 1e-2)
        norm = math.sqrt(sum(float((grads[k] ** 2).sum()) for k in adapters))
        clip = min(1.0, TRAIN["grad_clip"] / norm)
        lr = TRAIN["lr"]
        for nm in adapters:
            g = got["grad." + nm]
            worst[nm] = e = rel(g, grads[nm])
            self.assertLess(e, 1e-4, "%s: gradient off by %.3g of its largest element" % (nm, e))
            mine = adamw(adapters[nm].astype(np.float64), g.astype(np.float64) * clip, lr, TRAIN["beta1"],
                         TRAIN["beta2"], TRAIN["eps"], TRAIN["weight_decay"], True)
            self.assertLess(np.abs(got["step." + nm] - mine).max(), 1e-5 * lr + 1e-6, nm)
        report(name + (" dropout=%g" % dropout if dropout else ""), loss, worst)

    def test_untied_gqa(self):
        self.check("untied_gqa")

    def test_tied_mqa_llama3_packed(self):
        self.check("tied_mqa_llama3_packed")

    def test_untied_gqa_dropout(self):
        self.check("untied_gqa", 0.2)

    def test_tied_mqa_llama3_packed_dropout(self):
        self.check("tied_mqa_llama3_packed", 0.2)

    def test_reference_backward(self):
        """The reference's adapter gradients (through dropout's masks) against
        central differences of its forward."""
        cfg, packing = CASES["tied_mqa_llama3_packed"]
        rng = np.random.default_rng(11)
        params = random_params(cfg, rng)
        adapters = random_adapters(cfg, rng)
        _, x, y, pos, start = batch_for(rng, cfg, packing)
        ref = Llama(cfg, params, adapters, ALPHA / RANK, dropout_masks(0.2, SEED))
        ref.forward(x, y, pos, start)
        grads = ref.backward()
        self.check_central(ref, ref.ad, sorted(adapters), grads, (x, y, pos, start), rng)


if __name__ == "__main__":
    unittest.main(verbosity=2)
