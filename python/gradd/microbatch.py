"""Adaptive micro-batching for a plain PyTorch training loop.

One optimizer step over a batch of N rows, run as micro-batches of at most
`micro` rows with gradient accumulation, so that a batch too large for the
GPU's memory still trains with the same effective batch:

    import gradd

    step = gradd.AdaptiveBatch(optimizer)           # owns zero_grad and step
    for batch in loader:                            # a tensor, or a dict/tuple/list of tensors
        loss = step(batch, lambda mb: model(**mb).loss)

`loss_fn(micro_batch)` returns the mean loss over the micro-batch's rows,
as PyTorch's losses do by default.  Each micro-batch's loss is weighted by
its share of the rows (n_i / N) before backward, so the accumulated
gradient is the full batch's, an uneven last micro-batch included, up to
floating-point reassociation.  A call returns the batch's mean loss as a
float.

On CUDA out-of-memory (torch.cuda.OutOfMemoryError, or a RuntimeError
whose message starts "CUDA out of memory.", which is what gradd's
allocator raises) the partial gradients are dropped, the micro-batch is
halved and the whole step is redone: a partial gradient is never applied.
The micro-batch that failed is remembered: after `grow_after` clean steps
the micro-batch doubles again, never past the full batch nor to a size
that failed; after `retry_after` clean steps at that ceiling the failure
is forgotten (the memory that other jobs held may have been given back)
and a larger size is tried again.

Under gradd (GRADD_SOCKET and GRADD_JOB_ID set in a program job) every
change is reported to the daemon, so `gradctl status` shows the job's
micro-batch x accumulation and its last change ("start", "oom", "grow");
with `report_every` seconds, the step and loss are reported as well.
Without them nothing is reported and nothing else changes.

torch (and collections.abc) are imported only when a step runs: `import
gradd` stays cheap.
"""
import math
import time

from . import _client

OOM_PREFIX = "CUDA out of memory."


def is_oom(exc):
    """Whether exc is a CUDA out-of-memory error: PyTorch's
    OutOfMemoryError, or a RuntimeError whose message starts with the text
    that PyTorch's allocator and gradd's both use."""
    import torch

    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return True
    return isinstance(exc, RuntimeError) and str(exc).startswith(OOM_PREFIX)


# ---- splitting a batch on dim 0 ----------------------------------------------

def _leaves(batch):
    from collections.abc import Mapping

    import torch

    if torch.is_tensor(batch):
        if batch.dim() > 0:
            yield batch
    elif isinstance(batch, Mapping):
        for v in batch.values():
            yield from _leaves(v)
    elif isinstance(batch, (tuple, list)):
        for v in batch:
            yield from _leaves(v)


def batch_rows(batch):
    """The rows (dim 0) of a batch: a tensor, or a dict, tuple or list of
    them (nested too), whose tensors all have the same dim 0.  Values that
    are not tensors, and 0-dim tensors, go to every micro-batch whole."""
    rows = None
    for t in _leaves(batch):
        if rows is None:
            rows = t.shape[0]
        elif t.shape[0] != rows:
            raise ValueError("the batch's tensors differ in dim 0 (%d and %d rows): "
                             "it cannot be split into micro-batches" % (rows, t.shape[0]))
    if not rows:
        raise ValueError("the batch has no rows to split (no tensor with a dim 0, or 0 rows)")
    return rows


def batch_slice(batch, lo, hi):
    """Rows lo..hi of every tensor of the batch, in the batch's shape."""
    from collections.abc import Mapping

    import torch

    if torch.is_tensor(batch):
        return batch[lo:hi] if batch.dim() > 0 else batch
    if isinstance(batch, Mapping):
        return {k: batch_slice(v, lo, hi) for k, v in batch.items()}
    if isinstance(batch, tuple):
        parts = [batch_slice(v, lo, hi) for v in batch]
        return type(batch)(*parts) if hasattr(batch, "_fields") else tuple(parts)
    if isinstance(batch, list):
        return [batch_slice(v, lo, hi) for v in batch]
    return batch


# ---- the step ---------------------------------------------------------------

class AdaptiveBatch:
    """One optimizer step per call, over micro-batches that shrink on OOM
    and grow back.

    optimizer:     a torch.optim.Optimizer; this object calls its zero_grad
                   and step (so a step that ran out of memory is never applied).
    micro:         the first micro-batch size; None: the whole batch.
    grow_after:    clean steps before the micro-batch doubles again.
    retry_after:   clean steps at a size below one that failed before that
                   size is tried again (default 10 x grow_after).
    max_grad_norm: clip the accumulated gradient's norm to this before the step.
    report_every:  seconds between reports of step and loss to gradd (changes
                   are always reported); None: changes only.
    reporter:      a gradd._client.Reporter; default: this job's, from the
                   environment.

    Attributes: micro (the size the next step starts with), step (optimizer
    steps done), failed (the smallest size that ran out of memory and is
    not yet forgotten), oom_recoveries, last_change ((from, to, reason,
    step) or None).
    """

    def __init__(self, optimizer, micro=None, grow_after=50, retry_after=None, max_grad_norm=None,
                 report_every=10.0, reporter=None):
        if micro is not None and (not isinstance(micro, int) or micro < 1):
            raise ValueError("micro must be a positive int or None, not %r" % (micro,))
        if not isinstance(grow_after, int) or grow_after < 1:
            raise ValueError("grow_after must be a positive int, not %r" % (grow_after,))
        if retry_after is None:
            retry_after = 10 * grow_after
        if not isinstance(retry_after, int) or retry_after < grow_after:
            raise ValueError("retry_after must be an int >= grow_after (%d), not %r" % (grow_after, retry_after))
        self.optimizer = optimizer
        self.micro = micro
        self.grow_after = grow_after
        self.retry_after = retry_after
        self.max_grad_norm = max_grad_norm
        self.report_every = report_every
        self.reporter = reporter if reporter is not None else _client.default_reporter()
        self.step = 0
        self.failed = None
        self.oom_recoveries = 0
        self.last_change = None
        self._clean = 0          # steps since the last change
        self._reported_at = None  # monotonic time of the last report
        self._started = False

    def accum(self, rows):
        """Micro-batches in a step of `rows` rows at the current size."""
        return math.ceil(rows / min(self.micro, rows))

    def __call__(self, batch, loss_fn):
        rows = batch_rows(batch)
        if self.micro is None:
            self.micro = rows
        if not self._started:
            self._started = True
            self._change(0, min(self.micro, rows), "start", rows)
        while True:
            m = min(self.micro, rows)
            loss = self._attempt(batch, rows, m, loss_fn)
            if loss is not None:
                break
            # Out of memory: the exception, its frames and their tensors
            # are gone by now, so the smaller retry has their memory.
            self.failed = m if self.failed is None else min(self.failed, m)
            self.oom_recoveries += 1
            self._change(m, max(1, m // 2), "oom", rows)
        self.step += 1
        self._clean += 1
        self._maybe_grow(rows)
        if self.report_every is not None and (self._reported_at is None or
                                              time.monotonic() - self._reported_at >= self.report_every):
            self._report(rows, loss=loss)
        return loss

    def _attempt(self, batch, rows, m, loss_fn):
        """Run the step at micro-batch m: its mean loss, or None after an
        out-of-memory (gradients dropped, nothing applied).  An OOM at
        micro-batch 1 has nowhere left to go and is raised."""
        import torch

        opt = self.optimizer
        opt.zero_grad(set_to_none=True)
        total = None
        try:
            for lo in range(0, rows, m):
                hi = min(rows, lo + m)
                loss = loss_fn(batch_slice(batch, lo, hi))
                if not torch.is_tensor(loss) or loss.dim() != 0:
                    raise TypeError("loss_fn must return a 0-dim tensor (the micro-batch's mean loss), not %r"
                                    % (type(loss).__name__ if not torch.is_tensor(loss) else tuple(loss.shape),))
                share = (hi - lo) / rows
                (loss * share).backward()
                # One host sync per step (the float below), not one per micro-batch.
                part = loss.detach() * share
                total = part if total is None else total + part
                del loss, part
        except Exception as e:  # noqa: BLE001 - only OOMs are handled, the rest re-raised
            if m == 1 or not is_oom(e):
                raise
            opt.zero_grad(set_to_none=True)
            return None
        if self.max_grad_norm is not None:
            params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
            torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(total)

    def _maybe_grow(self, rows):
        if self._clean < self.grow_after:
            return
        if self.failed is not None and self._clean >= self.retry_after:
            # Long enough below it: the memory other jobs held may be free.
            self.failed = None
        ceiling = rows if self.failed is None else min(rows, self.failed - 1)
        m = min(self.micro, rows)
        if m < ceiling:
            self._change(m, min(ceiling, 2 * m), "grow", rows)

    def _change(self, old, new, reason, rows):
        self.micro = new
        self._clean = 0
        self.last_change = (old, new, reason, self.step)
        self._report(rows, change=(old, new, reason))

    def _report(self, rows, change=(0, 0, ""), loss=None):
        self._reported_at = time.monotonic()
        old, new, reason = change
        self.reporter.report(min(self.micro, rows), self.accum(rows), self.step, old, new, reason, loss)
