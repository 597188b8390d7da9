"""LoRA ([finetune] method = lora) through a real gradd and the real gradctl,
on the CPU device: a tiny Llama trains adapters on a frozen fp32 base.

  - The job completes; its memory by tag is the frozen base once (P fp32
    values, "frozen") and the adapters with their gradients and AdamW's two
    moments ("params", "grads", "optimizer"): no gradient or optimizer
    state of the base.  The shape is chosen so that each buffer is a whole
    number of the pool's 512-byte blocks, and the sizes are then exact.
  - `gradctl status` shows the lever; the output directory holds
    adapter_model.safetensors (PEFT's names, fp32) and adapter_config.json,
    and no model.safetensors without [finetune] merged, which `gradctl
    sample` says.
  - A job cancelled after a few steps and submitted again continues from
    its adapters and ends at the loss of an uninterrupted run; one with
    other adapters in the same directory is refused, naming both, and so
    is one that trains the whole model.
  - Under a [memory] limit between LoRA's peak and what full fine-tuning
    holds before its first activation, the full job fails and LoRA runs;
    [finetune] method = auto there chooses LoRA (its levers and first
    batch_change say why), and without the limit the whole model.
"""
import json
import os
import struct
import time

import harness

# Every size below a multiple of 128 floats: see the module's comment.
C, L, H, KVH, F, T, V = 128, 1, 4, 2, 256, 32, 256
RANK, ALPHA = 4, 8
HD = C // H


def llama_params():
    """P of the Llama above (untied head), as gradd lays it out."""
    layer = C + C * C + 2 * C * KVH * HD + C * C + C + 3 * C * F
    return V * C + L * layer + C + V * C


def adapter_params():
    """q_proj (C -> C) and v_proj (C -> KVH·HD): A (r,in) and B (out,r)."""
    return L * (RANK * (C + C) + RANK * (C + KVH * HD))


def st_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


class Lora(harness.DaemonTest):
    def setUp(self):
        super().setUp()
        self.dir, self.corpus = harness.scratch_corpus(self, "gradd-lora-")

    def job(self, name, steps, finetune=None, memory=None, out=None, lr="3e-3"):
        cfg = os.path.join(self.dir, name + ".cfg")
        sections = {
            "job": {"name": name},
            "model": {"type": "llama", "layers": L, "heads": H, "kv_heads": KVH, "width": C, "mlp_width": F,
                      "context": T, "vocab": V},
            "data": {"format": "text", "train": self.corpus},
            # A constant learning rate: a run resumed under fewer steps
            # follows the same schedule as one that never stopped.
            "train": {"steps": steps, "batch": 4, "micro_batch": 2, "lr": lr, "min_lr": lr, "warmup": 0,
                      "threads": 1},
            "output": {"dir": os.path.join(self.dir, out or "out-" + name), "checkpoint_every": 0},
        }
        if finetune is not None:
            sections["finetune"] = finetune
        if memory is not None:
            sections["memory"] = memory
        harness.write_job(cfg, sections)
        return cfg

    def submit(self, cfg):
        return self.d.ctl_json("submit", cfg)["id"]

    def run_job(self, cfg, states=("completed",), timeout=120):
        jid = self.submit(cfg)
        j = harness.wait_job(self.d, jid, states + (("failed",) if "failed" not in states else ()), timeout=timeout)
        self.assertIn(j["state"], states, j)
        return jid, j

    def last_loss(self, out):
        rows = harness.read_jsonl(os.path.join(out, "metrics.jsonl"))
        return [r for r in rows if "loss" in r][-1]["loss"]

    LORA = {"method": "lora", "rank": RANK, "alpha": ALPHA}

    def test_memory_levers_and_export(self):
        jid, j = self.run_job(self.job("tags", 3, finetune=dict(self.LORA, dropout=0.05)))
        P, A = llama_params(), adapter_params()
        tags = {t: v["peak"] for t, v in j["mem_tags"].items()}
        print("P %d, adapters %d; peaks by tag: %s" % (P, A, tags))
        self.assertEqual(tags["frozen"], 4 * P)
        self.assertEqual(tags["params"], 4 * A)
        self.assertEqual(tags["grads"], 4 * A)
        self.assertEqual(tags["optimizer"], 2 * 4 * A)
        self.assertEqual(j["levers"], "lora (r=%d alpha=%d targets=q_proj,v_proj dropout=0.05; base frozen in fp32)"
                         % (RANK, ALPHA))
        text = self.d.ctl("status", str(jid)).stdout
        self.assertIn("lora (r=%d" % RANK, text)

        out = j["out_dir"]
        self.assertFalse(os.path.exists(os.path.join(out, "model.safetensors")))
        h = st_header(os.path.join(out, "adapter_model.safetensors"))
        names = sorted(k for k in h if k != "__metadata__")
        want = []
        for layer in range(L):
            for proj, out_dim in (("q_proj", C), ("v_proj", KVH * HD)):
                m = "base_model.model.model.layers.%d.self_attn.%s" % (layer, proj)
                want += [(m + ".lora_A.weight", [RANK, C]), (m + ".lora_B.weight", [out_dim, RANK])]
        self.assertEqual([(n, h[n]["shape"]) for n in names], sorted(want))
        self.assertTrue(all(h[n]["dtype"] == "F32" for n in names))
        peft = harness.read_json(os.path.join(out, "adapter_config.json"))
        self.assertEqual((peft["r"], peft["lora_alpha"], peft["lora_dropout"], sorted(peft["target_modules"])),
                         (RANK, ALPHA, 0.05, ["q_proj", "v_proj"]))
        self.assertEqual(peft["base_model_name_or_path"], "")

        # No whole model to sample: said, with what to do.
        r = self.d.ctl("sample", str(jid), "--tokens", "4", check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("LoRA", r.stderr)
        self.assertIn("merged = true", r.stderr)

    def test_resume_after_cancel_and_other_adapters(self):
        # Stopped after a few steps; the checkpoint it leaves holds the
        # adapters and their moments, not the base.
        jid = self.submit(self.job("long", 100000, finetune=self.LORA, out="out-resume"))
        deadline = time.time() + 60
        while self.d.ctl_json("status", str(jid))["step"] < 3 and time.time() < deadline:
            time.sleep(0.02)
        # Prometheus sees the lever.
        self.assertRegex(self.d.ctl("metrics").stdout, r'\ngradd_job_lora\{job="%d",[^}]*\} 1\n' % jid)
        self.d.ctl("cancel", str(jid))
        c = harness.wait_job(self.d, jid, ("cancelled",))
        k = c["step"]
        self.assertGreaterEqual(k, 3, c)
        out = os.path.join(self.dir, "out-resume")
        h = st_header(os.path.join(out, "resume.safetensors"))
        self.assertNotIn("params", h)
        self.assertEqual(h["adam_m"]["shape"], [adapter_params()])
        self.assertTrue(h["__metadata__"]["lora"].startswith("lora r=%d" % RANK), h["__metadata__"])

        # Other adapters in that directory: refused, naming both.
        other = dict(self.LORA, rank=8)
        _, bad = self.run_job(self.job("other", k + 3, finetune=other, out="out-resume"), states=("failed",))
        self.assertIn("cannot resume", bad["reason"])
        self.assertIn("lora r=%d" % RANK, bad["reason"])
        self.assertIn("lora r=8", bad["reason"])
        # Nor does a job that trains the whole model take them for its own.
        _, full = self.run_job(self.job("whole", k + 3, out="out-resume"), states=("failed",))
        self.assertIn("cannot resume", full["reason"])
        self.assertIn("holds LoRA adapters (lora r=%d" % RANK, full["reason"])

        # The same adapters go on from step k to k + 3, and end where a run
        # that never stopped does: on the cpu backend with one thread the
        # same operations in the same order, so the same bits.
        _, done = self.run_job(self.job("again", k + 3, finetune=self.LORA, out="out-resume"))
        self.assertEqual(done["resumed_from_step"], k, done)
        _, ref = self.run_job(self.job("straight", k + 3, finetune=self.LORA))
        resumed, straight = self.last_loss(out), self.last_loss(ref["out_dir"])
        print("final loss after step %d: resumed at %d %.9g, uninterrupted %.9g" % (k + 3, k, resumed, straight))
        self.assertEqual(resumed, straight)

    def test_tight_limit_full_fails_lora_runs(self):
        _, lora = self.run_job(self.job("peak", 2, finetune=self.LORA))
        P = llama_params()
        # What full fine-tuning holds before any activation: P fp32 values
        # of weights, gradients and two moments.
        full_lasting = 16 * P
        self.assertLess(lora["mem_peak"], full_lasting, lora["mem_peak"])
        limit = (lora["mem_peak"] + full_lasting) // 2
        print("LoRA peak %d bytes, full fine-tuning's lasting state %d; limit %d"
              % (lora["mem_peak"], full_lasting, limit))
        _, full = self.run_job(self.job("tight-full", 2, memory={"limit": limit}), states=("failed",))
        self.assertIn("out of memory", full["reason"])
        self.assertIn("[memory] limit", full["reason"])
        self.assertIn("or train LoRA adapters on the frozen model ([finetune] method = lora or auto)", full["reason"])
        _, ok = self.run_job(self.job("tight-lora", 2, finetune=self.LORA, memory={"limit": limit}))
        self.assertLessEqual(ok["mem_peak"], limit)

        # method = auto chooses for itself: LoRA under that limit, with
        # the reason in the levers and as the first batch_change's.
        auto = dict(self.LORA, method="auto")
        jid, chose = self.run_job(self.job("tight-auto", 2, finetune=auto, memory={"limit": limit}))
        self.assertLessEqual(chose["mem_peak"], limit)
        self.assertEqual(chose["mem_tags"]["frozen"]["peak"], 4 * P)
        self.assertRegex(chose["levers"], r"^lora \(r=4 alpha=8 targets=q_proj,v_proj; base frozen in fp32; "
                                          r"method = auto: full fine-tuning needs [0-9.]+[KMG]? at micro-batch 1, "
                                          r"the job has [0-9.]+[KMG]?\)$")
        print("auto under the limit: %s" % chose["levers"])
        self.assertIn("== levers: " + chose["levers"] + "\n", self.d.ctl("logs", str(jid)).stdout)
        out = chose["out_dir"]
        changes = [r for r in harness.read_jsonl(os.path.join(out, "metrics.jsonl"))
                   if r.get("event") == "batch_change"]
        self.assertEqual(changes[0]["reason"], "lora", changes)
        self.assertTrue(os.path.exists(os.path.join(out, "adapter_model.safetensors")))
        self.assertFalse(os.path.exists(os.path.join(out, "model.safetensors")))
        # And without it, the whole model: no adapters, no LoRA lever.
        _, whole = self.run_job(self.job("roomy-auto", 2, finetune=auto))
        self.assertNotIn("lora", whole["levers"])
        self.assertEqual(whole["mem_tags"]["params"]["peak"], 4 * P)
        self.assertTrue(os.path.exists(os.path.join(whole["out_dir"], "model.safetensors")))
        self.assertFalse(os.path.exists(os.path.join(whole["out_dir"], "adapter_model.safetensors")))


if __name__ == "__main__":
    harness.main()
