"""A LoRA job's exports read back by their real consumers (the venv of
scripts/pyenv-hf.sh, -Dhf_venv, with PEFT; skips without it): a tiny random
Llama in Hugging Face layout is the [model] from of a real daemon's job
that trains adapters on every linear layer, with dropout 0.1 and
[finetune] merged = true; then
  - PEFT's PeftModel.from_pretrained loads adapter_model.safetensors and
    adapter_config.json (lora_dropout 0.1) onto that base as transformers
    loads it, and its logits (evaluation: no dropout) are those of
    transformers on gradd's merged model.safetensors;
  - the merged weights are W + (alpha / r)·B·A of the adapters and the
    base's files, worked out here with NumPy alone;
  - the adapters moved the model: the logits are not the base's."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import harness

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
try:
    import numpy as np
    import peft
    import torch
    import transformers
    from safetensors.numpy import load_file

    import hfdir
except ImportError:
    peft = None

C, L, H, KVH, F, T, V = 32, 2, 4, 2, 64, 24, 96
RANK, ALPHA, DROPOUT = 4, 8, 0.1
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# float32 on both sides, the adapters applied (PEFT) or merged (gradd) in
# different orders.  Seen: logits 8.5e-7 to 9.5e-7 of the largest (-O2 and
# -O0 builds); weights 9.3e-8.
LOGITS_RTOL = 1e-5
WEIGHTS_ATOL = 1e-6


def samples(rng, n):
    out = []
    for _ in range(n):
        ids = [int(t) for t in rng.integers(1, V, int(rng.integers(6, T)))]
        out.append({"input_ids": ids, "labels": ids})
    return out


@unittest.skipIf(peft is None, "no PEFT: scripts/pyenv-hf.sh makes a venv with it (-Dhf_venv)")
class Peft(harness.DaemonTest):
    def test_adapters_load_in_peft_and_merge(self):
        d = tempfile.mkdtemp(prefix="gradd-peft-")
        os.chmod(d, 0o755)
        self.addCleanup(subprocess.run, ["rm", "-rf", d])
        src = os.path.join(d, "hf")
        base_w = hfdir.write_llama(src, C=C, L=L, H=H, KVH=KVH, F=F, T=T, V=V, seed=7, dtype="F32")
        rng = np.random.default_rng(11)
        with open(os.path.join(d, "train.jsonl"), "w") as f:
            for s in samples(rng, 48):
                f.write(json.dumps(s) + "\n")
        out = os.path.join(d, "out")
        cfg = os.path.join(d, "job.cfg")
        harness.write_job(cfg, {
            "job": {"name": "peft"},
            "model": {"from": src},
            "data": {"format": "jsonl", "train": os.path.join(d, "train.jsonl")},
            "train": {"steps": 6, "batch": 8, "micro_batch": 4, "lr": "0.01", "warmup": 0, "threads": 1},
            "finetune": {"method": "lora", "rank": RANK, "alpha": ALPHA, "targets": ",".join(TARGETS),
                         "dropout": DROPOUT, "merged": "true"},
            "output": {"dir": out}})
        jid = self.d.ctl_json("submit", cfg)["id"]
        info = harness.wait_job(self.d, jid, ("completed", "failed"), timeout=180)
        self.assertEqual(info["state"], "completed", info)
        conf = harness.read_json(os.path.join(out, "adapter_config.json"))
        self.assertEqual(conf["base_model_name_or_path"], src)
        self.assertEqual(conf["lora_dropout"], DROPOUT)

        # The merged weights, from the adapters and the base's own file.
        ad = load_file(os.path.join(out, "adapter_model.safetensors"))
        merged = load_file(os.path.join(out, "model.safetensors"))
        self.assertEqual(sorted(merged), sorted(base_w))
        sites, worst_w = 0, 0.0
        for name, w in base_w.items():
            module = name[:-len(".weight")]
            a = ad.get("base_model.model." + module + ".lora_A.weight")
            if a is None:
                self.assertEqual(merged[name].tobytes(), w.tobytes(), name)
                continue
            b = ad["base_model.model." + module + ".lora_B.weight"]
            self.assertGreater(np.abs(b).max(), 0, name)
            want = w.astype(np.float64) + (ALPHA / RANK) * (b.astype(np.float64) @ a.astype(np.float64))
            worst_w = max(worst_w, float(np.abs(merged[name] - want).max()))
            self.assertLess(worst_w, WEIGHTS_ATOL, name)
            sites += 1
        print("merged weights: worst difference %.2g from W + s·B·A in float64" % worst_w, file=sys.stderr)
        self.assertEqual(sites, L * len(TARGETS))
        self.assertEqual(len(ad), 2 * sites)

        ids = torch.tensor([samples(rng, 1)[0]["input_ids"]])
        base = transformers.AutoModelForCausalLM.from_pretrained(src)
        base.eval()
        with torch.no_grad():
            base_logits = base(input_ids=ids).logits[0].numpy().copy()
        with_peft = peft.PeftModel.from_pretrained(base, out)
        with_peft.eval()
        self.assertEqual(with_peft.peft_config["default"].lora_dropout, DROPOUT)
        # Alone in a directory: transformers with PEFT installed would load
        # out/ as the base plus adapter_config.json's adapters instead.
        alone = os.path.join(d, "merged")
        os.mkdir(alone)
        for name in ("model.safetensors", "config.json"):
            os.link(os.path.join(out, name), os.path.join(alone, name))
        whole = transformers.AutoModelForCausalLM.from_pretrained(alone)
        whole.eval()
        self.assertEqual(type(whole).__name__, "LlamaForCausalLM")
        with torch.no_grad():
            lp = with_peft(input_ids=ids).logits[0].numpy()
            lm = whole(input_ids=ids).logits[0].numpy()
        scale = np.abs(lm).max()
        worst = float(np.abs(lp - lm).max() / scale)
        moved = float(np.abs(lm - base_logits).max() / scale)
        print("logits: PEFT against the merged export %.2g of the largest; the adapters moved them %.2g"
              % (worst, moved), file=sys.stderr)
        self.assertLess(worst, LOGITS_RTOL)
        self.assertGreater(moved, 1e-3)


if __name__ == "__main__":
    harness.main()
