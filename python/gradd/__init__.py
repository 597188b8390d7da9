"""gradd's Python package, on the path of every program job that gradd runs.

- AdaptiveBatch (gradd.microbatch): a plain PyTorch loop's optimizer step
  over micro-batches that shrink on CUDA out-of-memory and grow back,
  reported to the daemon so that `gradctl status` shows them.
- report_batch: the same report for a program that batches by itself.
- gradd.hf: a Hugging Face TrainerCallback that reports the Trainer's
  batch (with TrainingArguments(auto_find_batch_size=True)).

Importing it must stay cheap, as gradd's allocator shim imports it in
every Python program: torch and transformers are imported only where they
are used.
"""
from ._client import ReportError, Reporter
from .microbatch import AdaptiveBatch, is_oom

__all__ = ["AdaptiveBatch", "ReportError", "Reporter", "is_oom", "report_batch"]


def report_batch(micro, accum, step=0, change_from=0, reason="", loss=None):
    """Tell gradd the micro-batch and accumulation this job trains with
    now; with reason ("start", "oom" or "grow"), that it changed from
    change_from.  Does nothing outside a gradd program job, and never
    raises for a daemon that is away (it warns once).  True when the daemon
    took it."""
    from . import _client

    change_to = micro if reason else 0
    return _client.default_reporter().report(micro, accum, step, change_from, change_to, reason, loss)
