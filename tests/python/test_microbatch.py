"""gradd.AdaptiveBatch against a reference full-batch step, in float64.

The accumulated gradient must equal the full batch's for even and uneven
splits and for dict, tuple and list batches; an out-of-memory at a
micro-batch above K must leave the step equal to the full batch's (no
partial gradient applied) at a micro-batch of at most K; growth follows
the documented schedule; and `import gradd` must not import torch.
Run with the system's python3 (Debian's python3-torch)."""
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

try:
    import torch
except ImportError:  # pragma: no cover - the test's environment decides
    torch = None

import gradd  # noqa: E402
from fakes import FakeReporter  # noqa: E402

# float64 throughout: the only difference between a split and the whole
# batch is the order of the sums, a few ulps.
TOL = 1e-12


def model_and_opt(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)).double()
    return model, torch.optim.SGD(model.parameters(), lr=0.5)


def data(rows, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 5, generator=g, dtype=torch.double), torch.randn(rows, 3, generator=g, dtype=torch.double)


def reference_step(x, y):
    """Parameters after one plain SGD step on the whole batch, and its loss."""
    model, opt = model_and_opt()
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return [p.detach().clone() for p in model.parameters()], float(loss)


def setup(rows, micro):
    """A batch, a model and an AdaptiveBatch on it with a FakeReporter."""
    x, y = data(rows)
    model, opt = model_and_opt()
    rep = FakeReporter()
    return x, y, model, rep, gradd.AdaptiveBatch(opt, micro=micro, reporter=rep)


def assert_reference(test, model, loss, x, y):
    """model's parameters and the step's loss are the full batch's."""
    want, want_loss = reference_step(x, y)
    for got, exp in zip(model.parameters(), want):
        test.assertLess((got.detach() - exp).abs().max().item(), TOL)
    test.assertAlmostEqual(loss, want_loss, delta=TOL)


@unittest.skipIf(torch is None, "no torch for /usr/bin/python3 (scripts/deps.sh installs python3-torch)")
class Accumulation(unittest.TestCase):
    def check_step(self, batch_of, micro, rows=10):
        x, y, model, rep, step = setup(rows, micro)
        calls = []

        def loss_fn(mb):
            xs, ys = batch_of.unpack(mb)
            calls.append(xs.shape[0])
            return torch.nn.functional.mse_loss(model(xs), ys)

        assert_reference(self, model, step(batch_of.pack(x, y), loss_fn), x, y)
        return calls, rep

    class Tuple:
        pack = staticmethod(lambda x, y: (x, y))
        unpack = staticmethod(lambda mb: mb)

    class Dict:
        # A value that is not a tensor (and a 0-dim tensor) goes to every
        # micro-batch whole.
        pack = staticmethod(lambda x, y: {"x": x, "y": y, "tag": "t", "scale": torch.tensor(1.0)})

        @staticmethod
        def unpack(mb):
            assert mb["tag"] == "t" and mb["scale"].dim() == 0
            return mb["x"], mb["y"]

    class Nested:
        pack = staticmethod(lambda x, y: [{"x": x}, (y,)])
        unpack = staticmethod(lambda mb: (mb[0]["x"], mb[1][0]))

    def test_even_split(self):
        calls, rep = self.check_step(self.Tuple, 5)
        self.assertEqual(calls, [5, 5])
        self.assertEqual(rep.calls[0][:6], (5, 2, 0, 0, 5, "start"))

    def test_uneven_split(self):
        calls, rep = self.check_step(self.Tuple, 3)
        self.assertEqual(calls, [3, 3, 3, 1])
        self.assertEqual(rep.calls[0][:2], (3, 4))

    def test_whole_batch_by_default(self):
        calls, _ = self.check_step(self.Tuple, None)
        self.assertEqual(calls, [10])

    def test_micro_above_batch(self):
        calls, _ = self.check_step(self.Tuple, 64)
        self.assertEqual(calls, [10])

    def test_dict_batch(self):
        calls, _ = self.check_step(self.Dict, 4)
        self.assertEqual(calls, [4, 4, 2])

    def test_nested_batch(self):
        calls, _ = self.check_step(self.Nested, 7)
        self.assertEqual(calls, [7, 3])

    def test_bad_batches(self):
        _, opt = model_and_opt()
        step = gradd.AdaptiveBatch(opt, reporter=FakeReporter())
        with self.assertRaisesRegex(ValueError, r"differ in dim 0 \(4 and 5 rows\)"):
            step((torch.zeros(4, 1), torch.zeros(5, 1)), lambda mb: None)
        with self.assertRaisesRegex(ValueError, "no rows"):
            step({"a": 1}, lambda mb: None)
        with self.assertRaisesRegex(TypeError, "0-dim tensor"):
            step(torch.zeros(4, 1), lambda mb: mb.sum(1))
        with self.assertRaisesRegex(ValueError, "micro must be a positive int"):
            gradd.AdaptiveBatch(opt, micro=0)


class OOM(Exception):
    pass


@unittest.skipIf(torch is None, "no torch for /usr/bin/python3 (scripts/deps.sh installs python3-torch)")
class OutOfMemory(unittest.TestCase):
    def run_oom(self, make_error, limit, rows=16, fail_on_second=False, micro=None):
        """One step whose loss_fn raises make_error() for a micro-batch of
        more than `limit` rows (on its second micro-batch, after a first
        one's backward, when fail_on_second)."""
        x, y, model, rep, step = setup(rows, micro)
        seen = []

        def loss_fn(mb):
            n = mb[0].shape[0]
            seen.append(n)
            if n > limit and (not fail_on_second or len(seen) > 1 and seen[-2] == n):
                raise make_error()
            return torch.nn.functional.mse_loss(model(mb[0]), mb[1])

        assert_reference(self, model, step((x, y), loss_fn), x, y)
        self.assertTrue(all(p.grad is None for p in model.parameters()))
        return step, rep, seen

    def test_torch_oom_shrinks_and_redoes_the_step(self):
        step, rep, seen = self.run_oom(lambda: torch.cuda.OutOfMemoryError("CUDA out of memory. Tried"), 5)
        self.assertEqual(seen, [16, 8, 4, 4, 4, 4])
        self.assertEqual(step.micro, 4)
        self.assertEqual(step.failed, 8)
        self.assertEqual(step.oom_recoveries, 2)
        self.assertEqual(rep.changes(), [(0, 16, "start", 0), (16, 8, "oom", 0), (8, 4, "oom", 0)])
        # The report after each change carries what the next attempt runs.
        self.assertEqual([(c[0], c[1]) for c in rep.calls if c[5]], [(16, 1), (8, 2), (4, 4)])

    def test_gradd_allocator_text(self):
        # What gradd's allocator raises: a plain RuntimeError.
        step, _, _ = self.run_oom(lambda: RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB "
                                                       "(job 3's budget [memory] limit 4G)"), 3)
        self.assertEqual(step.micro, 2)

    def test_no_partial_gradient_applied(self):
        # 8 rows pass forward and backward, then the second micro-batch of
        # 8 fails: their gradient must not reach the step.
        step, _, seen = self.run_oom(lambda: torch.cuda.OutOfMemoryError("CUDA out of memory."), 4,
                                     fail_on_second=True, micro=8)
        self.assertEqual(seen, [8, 8, 4, 4, 4, 4])
        self.assertEqual(step.micro, 4)

    def test_other_errors_are_raised(self):
        _, opt = model_and_opt()
        step = gradd.AdaptiveBatch(opt, reporter=FakeReporter())
        with self.assertRaisesRegex(RuntimeError, "shape mismatch"):
            step(torch.zeros(4, 1), lambda mb: (_ for _ in ()).throw(RuntimeError("shape mismatch")))
        self.assertEqual(step.micro, 4)
        # A message that only mentions memory is not an OOM.
        with self.assertRaises(RuntimeError):
            step(torch.zeros(4, 1), lambda mb: (_ for _ in ()).throw(RuntimeError("out of memory?")))

    def test_oom_at_one_row_is_raised(self):
        _, opt = model_and_opt()
        step = gradd.AdaptiveBatch(opt, reporter=FakeReporter())
        with self.assertRaises(torch.cuda.OutOfMemoryError):
            step(torch.zeros(4, 1), lambda mb: (_ for _ in ()).throw(torch.cuda.OutOfMemoryError("CUDA out of memory.")))
        self.assertEqual(step.micro, 1)

    def test_is_oom(self):
        self.assertTrue(gradd.is_oom(torch.cuda.OutOfMemoryError("x")))
        self.assertTrue(gradd.is_oom(RuntimeError("CUDA out of memory. Tried to allocate")))
        self.assertFalse(gradd.is_oom(RuntimeError("CUDA error: out of memory")))
        self.assertFalse(gradd.is_oom(MemoryError("CUDA out of memory.")))


@unittest.skipIf(torch is None, "no torch for /usr/bin/python3 (scripts/deps.sh installs python3-torch)")
class Growth(unittest.TestCase):
    def test_schedule(self):
        """16 rows, room for 4 rows, grow_after 2, retry_after 4: the size
        halves on each OOM, grows toward the smallest failure's size less
        one, forgets the failure after 4 clean steps at that ceiling, and
        reaches the whole batch once there is room."""
        model, opt = model_and_opt()
        rep = FakeReporter()
        step = gradd.AdaptiveBatch(opt, grow_after=2, retry_after=4, reporter=rep, report_every=None)
        room = [4]
        x, y = data(16)

        def loss_fn(mb):
            if mb[0].shape[0] > room[0]:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory.")
            return torch.nn.functional.mse_loss(model(mb[0]), mb[1])

        for _ in range(12):
            step((x, y), loss_fn)
        self.assertEqual(rep.changes(), [
            (0, 16, "start", 0), (16, 8, "oom", 0), (8, 4, "oom", 0),
            (4, 7, "grow", 2), (7, 3, "oom", 2), (3, 6, "grow", 4), (6, 3, "oom", 4),
            (3, 5, "grow", 6), (5, 2, "oom", 6), (2, 4, "grow", 8),
            # Steps 9 to 12 at 4, the ceiling below the failure at 5: forgotten.
            (4, 8, "grow", 12),
        ])
        self.assertIsNone(step.failed)
        room[0] = 16
        for _ in range(2):
            step((x, y), loss_fn)
        self.assertEqual(rep.changes()[-1], (8, 16, "grow", 14))
        self.assertEqual(step.micro, 16)
        self.assertEqual(step.step, 14)
        self.assertEqual(step.oom_recoveries, 5)
        # Never past the whole batch: two more clean steps change nothing.
        for _ in range(2):
            step((x, y), loss_fn)
        self.assertEqual(len(rep.changes()), 12)
        # report_every=None: changes only.
        self.assertEqual(len(rep.calls), 12)

    def test_progress_reports(self):
        model, opt = model_and_opt()
        rep = FakeReporter()
        step = gradd.AdaptiveBatch(opt, micro=2, reporter=rep, report_every=0)
        x, y = data(6)
        losses = [step((x, y), lambda mb: torch.nn.functional.mse_loss(model(mb[0]), mb[1])) for _ in range(3)]
        self.assertEqual(rep.calls[0], (2, 3, 0, 0, 2, "start", None))
        self.assertEqual(rep.calls[1:], [(2, 3, i + 1, 0, 0, "", losses[i]) for i in range(3)])


class Import(unittest.TestCase):
    def test_import_is_cheap(self):
        # gradd's allocator shim imports the package in every Python program.
        code = ("import sys, gradd, gradd.hf; "
                "print(sorted(m for m in ('torch', 'transformers', 'socket') if m in sys.modules))")
        env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "..", "python"))
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "[]\n", ""))


if __name__ == "__main__":
    unittest.main()
