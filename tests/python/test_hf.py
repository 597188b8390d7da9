"""gradd.hf.GraddCallback with the real Hugging Face Trainer on the CPU.

A tiny GPT-2 (built from a config in code, nothing downloaded) whose
forward fails as gradd's allocator does ("CUDA out of memory.") above 2
rows; with auto_find_batch_size=True the Trainer restarts at half the
batch until it fits, and the callback must report start 8x2, then oom
8->4 and 4->2, then the loss at each log.  Runs in the venv that
scripts/pyenv-hf.sh makes (-Dhf_venv); skips without transformers."""
import os
import shutil
import sys
import tempfile
import unittest
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

try:
    import torch
    import transformers
except ImportError:
    transformers = None

from fakes import FakeReporter  # noqa: E402
from gradd import hf  # noqa: E402


@unittest.skipIf(transformers is None, "no transformers: scripts/pyenv-hf.sh makes a venv with it (-Dhf_venv)")
class Trainer(unittest.TestCase):
    def test_auto_find_batch_size(self):
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2)
        model = transformers.GPT2LMHeadModel(cfg)
        forward = model.forward
        rows_seen = []

        def limited_forward(input_ids=None, **kw):
            rows_seen.append(input_ids.shape[0])
            if input_ids.shape[0] > 2:
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (gradd: job budget)")
            return forward(input_ids=input_ids, **kw)

        model.forward = limited_forward
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, 32, (64, 8), generator=g)
        dataset = [{"input_ids": r, "labels": r} for r in ids]
        out = tempfile.mkdtemp(prefix="gradd-hf-")
        self.addCleanup(shutil.rmtree, out, True)
        args = transformers.TrainingArguments(
            output_dir=out, per_device_train_batch_size=8, gradient_accumulation_steps=2, max_steps=3,
            auto_find_batch_size=True, use_cpu=True, report_to=[], save_strategy="no", logging_steps=1,
            disable_tqdm=True, dataloader_num_workers=0)
        rep = FakeReporter()
        trainer = transformers.Trainer(model=model, args=args, train_dataset=dataset,
                                       callbacks=[hf.GraddCallback(reporter=rep)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.train()
        self.assertEqual(rows_seen[:3], [8, 4, 2])
        self.assertEqual(rep.calls[:3], [(8, 2, 0, 0, 8, "start", None), (4, 2, 0, 8, 4, "oom", None),
                                         (2, 2, 0, 4, 2, "oom", None)])
        logs = rep.calls[3:]
        self.assertEqual([c[:6] for c in logs], [(2, 2, s, 0, 0, "") for s in (1, 2, 3)])
        want = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        self.assertEqual([c[6] for c in logs], want)
        self.assertEqual(trainer.state.global_step, 3)


if __name__ == "__main__":
    unittest.main()
