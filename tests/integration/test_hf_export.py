"""gradd's GPT-2 export in transformers (the venv of scripts/pyenv-hf.sh,
-Dhf_venv; skips without it): a tiny random GPT-2 imported from a Hugging
Face directory and trained a few steps by a real daemon is loaded by
AutoModelForCausalLM.from_pretrained; its loss on the job's validation
windows agrees with the val_loss gradd reported for the same weights, and
its greedy generation from a prompt of ids is gradctl sample's at
temperature 0, token for token.  The model is made for twice the positions
the job trains at ([model] context): the export keeps them all, the rows
of the position table past the context only decayed."""
import os
import sys
import unittest

import harness

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
try:
    import numpy as np
    import torch
    import transformers

    import hfdir
except ImportError:
    transformers = None

C, L, H, T, V = 32, 2, 4, 16, 64
# Both sides compute in float32 with differently ordered sums: the mean
# loss over 960 tokens agrees to this, relative (seen: about 1e-7).
LOSS_RTOL = 1e-5


def write_tokens(path, toks):
    """An llm.c token file: 256 int32 header (magic, version, count), uint16."""
    hdr = np.zeros(256, np.int32)
    hdr[:3] = (20240520, 1, len(toks))
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        f.write(np.asarray(toks, np.uint16).tobytes())


@unittest.skipIf(transformers is None, "no transformers: scripts/pyenv-hf.sh makes a venv with it (-Dhf_venv)")
class Export(harness.DaemonTest):
    def test_transformers_loads_what_gradd_trained(self):
        d, _ = harness.scratch_corpus(self, "gradd-hfx-")
        src = os.path.join(d, "hf")
        src_w = hfdir.write_gpt2(src, C=C, L=L, H=H, T=2 * T, V=V, seed=11)
        # A sequence with structure to learn: a walk over the vocabulary.
        r = np.random.default_rng(2)
        walk = np.cumsum(r.integers(1, 4, 6000)) % V
        write_tokens(os.path.join(d, "train.bin"), walk[:5000])
        val = walk[5000:5000 + 60 * T + 1]
        write_tokens(os.path.join(d, "val.bin"), val)
        out = os.path.join(d, "out")
        cfg = os.path.join(d, "job.cfg")
        harness.write_job(cfg, {
            "job": {"name": "hfx"},
            "model": {"from": src, "context": T},
            "data": {"format": "tokens", "train": os.path.join(d, "train.bin"), "val": os.path.join(d, "val.bin")},
            "train": {"steps": 4, "batch": 8, "lr": "0.003", "eval_batches": 0},
            "output": {"dir": out}})
        jid = self.d.ctl_json("submit", cfg)["id"]
        self.assertEqual(harness.wait_job(self.d, jid, ("completed", "failed"), timeout=120)["state"], "completed")
        metrics = harness.read_jsonl(os.path.join(out, "metrics.jsonl"))
        val_loss = [m["val_loss"] for m in metrics if "val_loss" in m][-1]

        model = transformers.AutoModelForCausalLM.from_pretrained(out)
        model.eval()
        self.assertEqual(type(model).__name__, "GPT2LMHeadModel")
        self.assertEqual((model.config.n_positions, model.config.n_ctx), (2 * T, 2 * T))
        # Rows T.. of wpe got no gradient: AdamW's decay alone, one factor
        # for every element (float32 rounding apart).
        wpe = model.transformer.wpe.weight.detach().numpy()
        self.assertEqual(wpe.shape, (2 * T, C))
        ratio = wpe[T:] / src_w["wpe.weight"][T:]
        print("rows past the context: factor %.9g to %.9g" % (ratio.min(), ratio.max()), file=sys.stderr)
        self.assertLess(ratio.max() - ratio.min(), 1e-5)
        self.assertTrue(0.9 < ratio.min() <= 1.0)
        self.assertGreater(np.abs(wpe[:T] - src_w["wpe.weight"][:T]).max(), 1e-4)  # trained
        # gradd's validation: windows of T+1 tokens at stride T, in order.
        n = (len(val) - 1) // T
        x = torch.tensor(np.stack([val[i * T:i * T + T] for i in range(n)]).astype(np.int64))
        y = torch.tensor(np.stack([val[i * T + 1:i * T + T + 1] for i in range(n)]).astype(np.int64))
        with torch.no_grad():
            logits = model(input_ids=x).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1)).item()
        print("val loss: transformers %.9g, gradd %.9g, relative difference %.2g"
              % (loss, val_loss, abs(loss - val_loss) / val_loss), file=sys.stderr)
        self.assertLess(abs(loss - val_loss), LOSS_RTOL * val_loss, (loss, val_loss))

        prompt = [int(t) for t in val[:3]]
        with torch.no_grad():
            g = model.generate(torch.tensor([prompt]), max_new_tokens=T - 3, do_sample=False,
                               attention_mask=torch.ones(1, 3, dtype=torch.long), pad_token_id=V - 1)
        want = g[0, 3:].tolist()
        got = self.d.ctl_json("sample", str(jid), "--prompt-ids", ",".join(map(str, prompt)), "--tokens",
                              str(T - 3), "--temperature", "0")["token_ids"]
        self.assertEqual(got, want)


if __name__ == "__main__":
    harness.main()
