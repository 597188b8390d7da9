"""A Llama round trip through transformers (the venv of scripts/pyenv-hf.sh,
-Dhf_venv; skips without it): a tiny random Llama in Hugging Face layout
(bf16 weights, grouped-query attention, untied head) is fine-tuned by a
real daemon on masked jsonl samples, packed; transformers'
AutoModelForCausalLM loads the export, and
  - its loss on the job's validation samples (Hugging Face's shift, -100
    ignored, averaged over the labelled tokens) is the val_loss gradd
    reported;
  - its logits on those samples are model_probe's (gradd's forward of the
    exported weights);
  - its greedy generation is gradctl sample's at temperature 0.
Once plain, once with Llama 3's rope_scaling (transformers 4.43 and later
read it; the venv has 4.44)."""
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
    import torch
    import transformers

    import hfdir
except ImportError:
    transformers = None

C, L, H, KVH, F, T, V = 32, 2, 4, 2, 64, 24, 96
# float32 on both sides with differently ordered sums.  Seen: loss 1e-7
# relative, logits 1e-6 of the largest.
LOSS_RTOL = 1e-5
LOGITS_RTOL = 1e-5
PROBE = os.environ.get("MODEL_PROBE", "")
# The jobs' device: the default (auto), or e.g. cuda:0 where
# scripts/gpu-session.sh runs this test on a GPU (fp32 there too: the
# comparisons are the same).
DEVICE = os.environ.get("GRADD_TEST_DEVICE", "")
JOB = {"name": "hfl", "device": DEVICE} if DEVICE else {"name": "hfl"}
# Llama 3.2's scaling, with the original context below the trained one so
# that the scaled frequencies matter at these positions.
LLAMA3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8}


def reads_llama3():
    v = tuple(int(x) for x in transformers.__version__.split(".")[:2])
    return v >= (4, 43)


def samples(rng, n):
    """Prompt then answer: the answer is the prompt reversed, shifted by
    one; only the answer is labelled."""
    out = []
    for _ in range(n):
        k = int(rng.integers(2, T // 2))
        prompt = [int(t) for t in rng.integers(1, V - 1, k)]
        answer = [(t + 1) % V for t in reversed(prompt)]
        ids = prompt + answer
        out.append({"input_ids": ids, "labels": [-100] * k + answer})
    return out


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def write_st(path, arrays):
    hfdir.write_safetensors(path, {k: ("I32", a.shape, np.ascontiguousarray(a, np.int32).tobytes())
                                   for k, a in arrays.items()})


def read_st(path):
    from safetensors.numpy import load_file
    return load_file(path)


@unittest.skipIf(transformers is None, "no transformers: scripts/pyenv-hf.sh makes a venv with it (-Dhf_venv)")
class Llama(harness.DaemonTest):
    def test_fine_tune_export_load(self):
        self.round_trip()

    def test_llama3_rope_scaling(self):
        if not reads_llama3():
            self.skipTest("transformers %s reads no llama3 rope_scaling (4.43 does)" % transformers.__version__)
        self.round_trip(LLAMA3)

    def round_trip(self, rope_scaling=None):
        d = tempfile.mkdtemp(prefix="gradd-hfl-")
        os.chmod(d, 0o755)
        self.addCleanup(subprocess.run, ["rm", "-rf", d])
        src = os.path.join(d, "hf")
        # Made for 4T positions, trained at T: the export keeps the 4T.
        extra = {"rope_scaling": rope_scaling} if rope_scaling else {}
        hfdir.write_llama(src, C=C, L=L, H=H, KVH=KVH, F=F, T=4 * T, V=V, seed=5, dtype="BF16", **extra)
        rng = np.random.default_rng(3)
        write_jsonl(os.path.join(d, "train.jsonl"), samples(rng, 64))
        val = samples(rng, 12)
        write_jsonl(os.path.join(d, "val.jsonl"), val)
        out = os.path.join(d, "out")
        cfg = os.path.join(d, "job.cfg")
        harness.write_job(cfg, {
            "job": JOB,
            "model": {"from": src, "context": T},
            "data": {"format": "jsonl", "train": os.path.join(d, "train.jsonl"),
                     "val": os.path.join(d, "val.jsonl"), "packing": "on"},
            "train": {"steps": 5, "batch": 8, "micro_batch": 4, "lr": "0.003", "eval_batches": 0},
            "output": {"dir": out}})
        jid = self.d.ctl_json("submit", cfg)["id"]
        info = harness.wait_job(self.d, jid, ("completed", "failed"), timeout=180)
        self.assertEqual(info["state"], "completed", info)
        metrics = harness.read_jsonl(os.path.join(out, "metrics.jsonl"))
        val_loss = [m["val_loss"] for m in metrics if "val_loss" in m][-1]

        model = transformers.AutoModelForCausalLM.from_pretrained(out)
        model.eval()
        self.assertEqual(type(model).__name__, "LlamaForCausalLM")
        self.assertEqual(model.config.max_position_embeddings, 4 * T)
        if rope_scaling:
            got = dict(model.config.rope_scaling)
            got.pop("type", None)  # transformers adds the old name beside rope_type
            self.assertEqual(got, rope_scaling)
        total, count, hf_logits = 0.0, 0, []
        with torch.no_grad():
            for s in val:
                ids = torch.tensor([s["input_ids"]])
                lg = model(input_ids=ids).logits[0]
                hf_logits.append(lg.numpy())
                lab = torch.tensor(s["labels"][1:])
                total += torch.nn.functional.cross_entropy(lg[:-1], lab, ignore_index=-100,
                                                           reduction="sum").item()
                count += int((lab != -100).sum())
        loss = total / count
        print("val loss: transformers %.9g, gradd %.9g, relative difference %.2g"
              % (loss, val_loss, abs(loss - val_loss) / val_loss), file=sys.stderr)
        self.assertLess(abs(loss - val_loss), LOSS_RTOL * val_loss, (loss, val_loss))

        if PROBE:
            # gradd's own forward of the exported weights, one sample a row.
            x = np.zeros((len(val), T), np.int32)
            y = np.full((len(val), T), -100, np.int32)
            for i, s in enumerate(val):
                n = len(s["input_ids"])
                x[i, :n] = s["input_ids"]
                y[i, :n - 1] = s["labels"][1:]
            write_st(os.path.join(d, "batch.safetensors"), {"x": x, "y": y})
            pcfg = os.path.join(d, "probe.cfg")
            harness.write_job(pcfg, {"model": {"from": out, "context": T}, "data": {"train": os.path.join(d, "train.jsonl"),
                                                                       "format": "jsonl"},
                                     "output": {"dir": os.path.join(d, "probe")}})
            r = subprocess.run([PROBE, pcfg, os.path.join(out, "model.safetensors"),
                                os.path.join(d, "batch.safetensors"), os.path.join(d, "probe.safetensors")],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            got = read_st(os.path.join(d, "probe.safetensors"))["logits"]
            worst = 0.0
            for i, s in enumerate(val):
                n = len(s["input_ids"])
                ref = hf_logits[i]
                worst = max(worst, float(np.abs(got[i, :n] - ref).max() / np.abs(ref).max()))
            print("logits: worst difference %.2g of the largest" % worst, file=sys.stderr)
            self.assertLess(worst, LOGITS_RTOL)

        prompt = val[0]["input_ids"][:4]
        with torch.no_grad():
            g = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False,
                               attention_mask=torch.ones(1, 4, dtype=torch.long), pad_token_id=0)
        want = g[0, 4:].tolist()
        got = self.d.ctl_json("sample", str(jid), "--prompt-ids", ",".join(map(str, prompt)), "--tokens", "8",
                              "--temperature", "0")["token_ids"]
        self.assertEqual(got, want)

        # The export imports again bitwise: a job from it at lr 0 exports
        # the very bits it read (bf16 in, fp32 out: the fp32 masters).
        again = os.path.join(d, "again")
        cfg2 = os.path.join(d, "again.cfg")
        harness.write_job(cfg2, {
            "job": dict(JOB, name="hfl2"),
            "model": {"from": out},
            "data": {"format": "jsonl", "train": os.path.join(d, "train.jsonl")},
            "train": {"steps": 1, "batch": 2, "lr": "0", "warmup": 0, "eval_batches": 1},
            "output": {"dir": again}})
        jid2 = self.d.ctl_json("submit", cfg2)["id"]
        self.assertEqual(harness.wait_job(self.d, jid2, ("completed", "failed"), timeout=120)["state"],
                         "completed")
        a, b = read_st(os.path.join(out, "model.safetensors")), read_st(os.path.join(again, "model.safetensors"))
        self.assertEqual(sorted(a), sorted(b))
        for k in a:
            self.assertEqual(a[k].tobytes(), b[k].tobytes(), k)
        self.assertEqual(harness.read_json(os.path.join(out, "config.json")),
                         harness.read_json(os.path.join(again, "config.json")))


if __name__ == "__main__":
    harness.main()
