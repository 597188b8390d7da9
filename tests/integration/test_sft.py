"""Fine-tuning samples (jsonl) through a real gradd and the real gradctl.

The samples are made here from Debian's fortunes: byte tokens, the
fortune's first line the prompt (labels -100), the rest the answer that is
learnt.  A job over them runs to completion (found by its .jsonl name,
over-long samples cut to the context); a file with a malformed line, or an
over-long sample under the default [data] overlong = refuse, fails its job
with the file and the line named, before any training output is written.
"""
import json
import math
import os
import shutil
import tempfile
import unittest

import harness
from harness import Daemon

FORTUNES = "/usr/share/games/fortunes"
CONTEXT = 64

def fortune_samples(limit=240):
    """(input_ids, labels) of the fortunes, in the files' name order, with
    a first line short enough to leave the answer a token within the
    context."""
    out = []
    for name in sorted(os.listdir(FORTUNES)):
        path = os.path.join(FORTUNES, name)
        if name.startswith(".") or name.endswith((".dat", ".u8")) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            text = f.read()
        for fortune in text.split(b"\n%\n"):
            head, sep, rest = fortune.partition(b"\n")
            if not sep or not rest.strip() or len(head) + 2 >= CONTEXT:
                continue
            prompt = head + b"\n"
            out.append((list(prompt + rest), [-100] * len(prompt) + list(rest)))
            if len(out) == limit:
                return out
    return out


def write_jsonl(path, samples):
    with open(path, "w") as f:
        for ids, labels in samples:
            f.write(json.dumps({"input_ids": ids, "labels": labels, "source": "fortunes"}) + "\n")
    os.chmod(path, 0o644)


@unittest.skipUnless(os.path.exists(FORTUNES), "Debian's fortunes package is not installed")
class Sft(harness.DaemonTest):
    def setUp(self):
        super().setUp()
        self.dir = tempfile.mkdtemp(prefix="gradd-sft-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        os.chmod(self.dir, 0o755)
        self.samples = fortune_samples()
        self.assertGreater(len(self.samples), 100)
        # Some are longer than the context: cut under overlong = truncate.
        self.assertTrue(any(len(ids) > CONTEXT for ids, _ in self.samples))

    def job(self, name, train, overlong="truncate"):
        path = os.path.join(self.dir, name + ".cfg")
        harness.write_job(path, {
            "job": {"name": name},
            "model": {"type": "gpt", "layers": 2, "heads": 2, "width": 32, "context": CONTEXT, "vocab": 256},
            "data": {"train": train, "val_fraction": 0.1, "overlong": overlong},
            "train": {"steps": 6, "batch": 8, "micro_batch": 4, "lr": 3e-3, "warmup": 2, "threads": 1,
                      "eval_every": 3, "eval_batches": 1},
            "output": {"dir": os.path.join(self.dir, "out-" + name), "log_every": 1},
        })
        return path

    def submit(self, cfg):
        r = self.d.ctl("submit", cfg)
        self.assertRegex(r.stdout, r"^job \d+ queued \(")
        return int(r.stdout.split()[1])

    def test_fortunes_job_completes(self):
        train = os.path.join(self.dir, "fortunes.jsonl")
        write_jsonl(train, self.samples)
        jid = self.submit(self.job("sft", train))
        j = harness.wait_job(self.d, jid, ("completed", "failed", "cancelled"), timeout=240)
        self.assertEqual(j["state"], "completed", j.get("reason"))
        self.assertEqual(j["step"], 6)
        out = os.path.join(self.dir, "out-sft")
        self.assertTrue(os.path.exists(os.path.join(out, "model.safetensors")))
        steps, vals = [], []
        with open(os.path.join(out, "metrics.jsonl")) as f:
            for line in f:
                rec = json.loads(line)
                if "val_loss" in rec:
                    vals.append(rec)
                elif "loss" in rec and "step" in rec:
                    steps.append(rec)
        self.assertEqual([s["step"] for s in steps], list(range(1, 7)))
        # Byte-level, untrained: near ln 256 = 5.55 per labelled token at
        # first, and every loss finite.
        self.assertTrue(all(math.isfinite(s["loss"]) for s in steps))
        self.assertLess(abs(steps[0]["loss"] - math.log(256)), 0.5)
        self.assertEqual(len(vals), 2)
        self.assertTrue(all(math.isfinite(v["val_loss"]) and v["val_loss"] > 0 for v in vals))

    def test_malformed_line_names_file_and_line(self):
        train = os.path.join(self.dir, "broken.jsonl")
        write_jsonl(train, self.samples[:40])
        with open(train) as f:
            lines = f.readlines()
        lines[4] = lines[4][: len(lines[4]) // 2] + "\n"  # line 5, cut short
        with open(train, "w") as f:
            f.writelines(lines)
        jid = self.submit(self.job("broken", train))
        j = harness.wait_job(self.d, jid, ("completed", "failed", "cancelled"), timeout=120)
        self.assertEqual(j["state"], "failed")
        self.assertIn(train + ":5: not valid JSON", j["reason"])
        for name in ("model.safetensors", "resume.safetensors", "metrics.jsonl"):
            self.assertFalse(os.path.exists(os.path.join(self.dir, "out-broken", name)), name)

    def test_overlong_refused_by_default(self):
        train = os.path.join(self.dir, "long.jsonl")
        write_jsonl(train, self.samples)
        first = 1 + next(i for i, (ids, _) in enumerate(self.samples) if len(ids) > CONTEXT)
        jid = self.submit(self.job("long", train, overlong="refuse"))
        j = harness.wait_job(self.d, jid, ("completed", "failed", "cancelled"), timeout=120)
        self.assertEqual(j["state"], "failed")
        self.assertIn("%s:%d: the sample has" % (train, first), j["reason"])
        self.assertIn("[data] overlong = truncate", j["reason"])


if __name__ == "__main__":
    harness.main()
