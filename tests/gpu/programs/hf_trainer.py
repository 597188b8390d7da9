"""A small Hugging Face Trainer fine-tune for the GPU session's `programs`
step, run as a gradd program job: GPT-2 (4 layers, 256 wide, built here,
nothing downloaded) on the bundled fortunes text as bytes, 60 steps,
logging PyTorch's memory functions as a seed's program does (on gradd's
pool they are served by the shim; PyTorch's own would raise).

    hf_trainer.py TEXT OUTDIR [BATCH]

Run under a [memory] limit that the first batch does not fit, the
Trainer's auto_find_batch_size halves it on gradd's "CUDA out of memory."
(the budget's), and gradd.hf.GraddCallback reports each size to gradctl
status."""
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

text, outdir = sys.argv[1], sys.argv[2]
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 32
raw = open(text, "rb").read()[: 2 << 20]
T = 128
ids = torch.tensor(list(raw[: len(raw) // T * T]), dtype=torch.long).view(-1, T)


class Bytes(torch.utils.data.Dataset):
    def __len__(self):
        return ids.shape[0]

    def __getitem__(self, i):
        return {"input_ids": ids[i], "labels": ids[i]}


class Memory(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kw):
        print("step %d loss %s allocated %.1f MiB reserved %.1f MiB peak %.1f MiB"
              % (state.global_step, (logs or {}).get("loss"), torch.cuda.memory_allocated() / 2**20,
                 torch.cuda.memory_reserved() / 2**20, torch.cuda.max_memory_allocated() / 2**20), flush=True)


callbacks = [Memory()]
try:
    from gradd.hf import GraddCallback  # reports the batch to gradctl status when the package has it
    callbacks.append(GraddCallback())
except ImportError as e:
    print("no gradd.hf callback:", e, flush=True)

model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=T, n_embd=256, n_layer=4, n_head=4))
args = TrainingArguments(output_dir=outdir, per_device_train_batch_size=batch, max_steps=60, logging_steps=10,
                         learning_rate=1e-3, bf16=True, report_to=[], save_strategy="no",
                         auto_find_batch_size=True, dataloader_num_workers=0)
trainer = Trainer(model=model, args=args, train_dataset=Bytes(), callbacks=callbacks)
out = trainer.train()
print("done: loss %.3f, stats keys %d, allocator %s" % (out.training_loss, len(torch.cuda.memory_stats()),
                                                     torch.cuda.memory.get_allocator_backend()), flush=True)
