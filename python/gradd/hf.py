"""The Hugging Face Trainer under gradd: a callback that reports its batch.

The recipe: let the Trainer find the batch that fits, and tell gradd.

    from transformers import Trainer, TrainingArguments
    from gradd.hf import GraddCallback

    args = TrainingArguments(output_dir="out", per_device_train_batch_size=32,
                             gradient_accumulation_steps=4, auto_find_batch_size=True)
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[GraddCallback()])
    trainer.train()

With auto_find_batch_size=True, accelerate's find_executable_batch_size
reruns training with half the per-device batch whenever a step raises an
error whose message holds "CUDA out of memory." -- which is how PyTorch's
allocator and gradd's both fail.  The callback reports the per-device
batch x gradient_accumulation_steps when training begins ("start") and
each time the Trainer starts again at a smaller one ("oom"), and the step
and loss at each of the Trainer's logs, so that `gradctl status` shows
them.  Unlike gradd.AdaptiveBatch, the Trainer keeps
gradient_accumulation_steps as it is, so the effective batch shrinks with
the micro-batch, and it restarts training from its first step; it never
grows back.

transformers is imported when GraddCallback is first used, not when this
module is: importing it costs nothing in a program that does not train
with the Trainer.
"""
from . import _client

__all__ = ["GraddCallback"]


def _per_device_batch(args, state):
    total = getattr(state, "train_batch_size", None) or args.train_batch_size
    return max(1, total // max(1, args.n_gpu))


def _make_callback_class():
    import transformers

    class GraddCallback(transformers.TrainerCallback):
        """Reports the Trainer's per-device batch and accumulation to gradd
        (see the module's docstring).  reporter: a gradd._client.Reporter;
        default: this job's, from the environment."""

        def __init__(self, reporter=None):
            self.reporter = reporter if reporter is not None else _client.default_reporter()
            self.micro = None

        def on_train_begin(self, args, state, control, **kwargs):
            micro = _per_device_batch(args, state)
            accum = max(1, args.gradient_accumulation_steps)
            if self.micro is None:
                old, reason = 0, "start"
            elif micro < self.micro:
                old, reason = self.micro, "oom"
            elif micro > self.micro:
                old, reason = self.micro, "grow"
            else:
                old, reason = 0, ""
            self.micro = micro
            self.reporter.report(micro, accum, state.global_step, old, micro if reason else 0, reason)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if self.micro is None or not logs or "loss" not in logs:
                return
            self.reporter.report(self.micro, max(1, args.gradient_accumulation_steps), state.global_step,
                                 loss=float(logs["loss"]))

    return GraddCallback


def __getattr__(name):
    # Made on first use, so that importing this module imports nothing.
    if name == "GraddCallback":
        cls = _make_callback_class()
        globals()[name] = cls
        return cls
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
