"""The shim on a real GPU (scripts/gpu-session.sh, step shim): a fresh
interpreter whose `import torch` made libgradd-alloc PyTorch's CUDA
allocator trains a small model eagerly and under torch.compile, its memory
functions answer from gradd's pool, and an allocation the device cannot hold
raises an error starting "CUDA out of memory." that the program catches and
carries on after.  Skips where torch has no CUDA or sees no GPU (CI),
unless GRADD_TEST_REQUIRE_GPU is set."""
import json
import os
import sys
import unittest

from test_shim import TORCH, run_python

MiB = 1 << 20

SCRIPT = r"""
import ctypes, json, torch
from gradd import _alloc
if not _alloc.installed:
    raise SystemExit("the shim did not install gradd's allocator (the gradd: line above says why)")
lib, cuda = _alloc.lib, torch.cuda
seen = {"installed": _alloc.installed,
        "backend": cuda.memory.get_allocator_backend() if hasattr(cuda.memory, "get_allocator_backend") else None}
# Every byte torch allocates is the pool's: its own counter moves by it.
before = lib.gradd_memory_allocated(0)
probe = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")
seen["probe_delta"] = lib.gradd_memory_allocated(0) - before
del probe

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).cuda()
data = torch.randn(64, 256, device="cuda")
for mode in ("eager", "compile"):
    net = model if mode == "eager" else torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(30):
        loss = (net(data) - data).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    cuda.synchronize()
    stats = cuda.memory_stats()
    seen[mode] = {"first": losses[0], "last": losses[-1], "allocated": cuda.memory_allocated(),
                  "reserved": cuda.memory_reserved(), "max_allocated": cuda.max_memory_allocated(),
                  "stats_allocated": stats.get("allocated_bytes.all.current"),
                  "keys": sorted(k for k in stats if not k.startswith("gradd.")),
                  "summary": "PyTorch CUDA memory summary" in cuda.memory_summary()}
    del opt, net

try:
    torch.empty(2**50, device="cuda")
    seen["oom"] = ["no error", ""]
except cuda.OutOfMemoryError as e:
    seen["oom"] = ["OutOfMemoryError", str(e)]
except RuntimeError as e:
    seen["oom"] = ["RuntimeError", str(e)]
seen["num_ooms"] = cuda.memory_stats()["num_ooms"]
after = torch.ones(1024, device="cuda")
seen["after_oom"] = float(after.sum())
# A block in a segment of its own, freed: empty_cache must return it.
big = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
del big
reserved = cuda.memory_reserved()
cuda.empty_cache()
seen["empty_cache"] = [reserved, cuda.memory_reserved(), lib.gradd_memory_reserved(0)]
print(json.dumps(seen))
"""

KEYS = ["active_bytes.all.current", "allocated_bytes.all.current", "allocated_bytes.all.peak",
        "allocation.all.current", "inactive_split_bytes.all.current", "num_alloc_retries", "num_ooms",
        "reserved_bytes.all.current", "reserved_bytes.large_pool.current", "reserved_bytes.small_pool.current",
        "segment.all.current"]


def gpu_visible():
    # The GPU session asks for the check: there a missing GPU is a failure.
    if os.environ.get("GRADD_TEST_REQUIRE_GPU"):
        return True
    if not TORCH or TORCH["cuda"] is None:
        return False
    r = run_python("import torch; print(torch.cuda.is_available())", lib=None)
    return r.stdout.strip() == "True"


VISIBLE = gpu_visible()


@unittest.skipUnless(VISIBLE, "needs a CUDA build of torch and a GPU")
class OnTheGpu(unittest.TestCase):
    def test_training_and_memory_functions_on_gradds_allocator(self):
        r = run_python(SCRIPT, GRADD_ALLOC_BACKEND="cuda")
        self.assertEqual(r.returncode, 0, r.stderr[-4000:])
        seen = json.loads(r.stdout.splitlines()[-1])
        print(json.dumps({k: v for k, v in seen.items() if k not in ("eager", "compile")}))
        self.assertTrue(seen["installed"], r.stderr)
        self.assertNotIn(seen["backend"], ("native", "cudaMallocAsync"))
        self.assertEqual(seen["probe_delta"], 4 * MiB)
        for mode in ("eager", "compile"):
            got = seen[mode]
            print(mode, {k: v for k, v in got.items() if k != "keys"})
            self.assertLess(got["last"], got["first"], mode)
            self.assertGreater(got["allocated"], 0, mode)
            self.assertEqual(got["stats_allocated"], got["allocated"], mode)
            self.assertGreaterEqual(got["reserved"], got["allocated"], mode)
            self.assertGreaterEqual(got["max_allocated"], got["allocated"], mode)
            self.assertTrue(set(KEYS) <= set(got["keys"]), set(KEYS) - set(got["keys"]))
            self.assertTrue(got["summary"], mode)
        kind, message = seen["oom"]
        self.assertIn(kind, ("OutOfMemoryError", "RuntimeError"), message)
        self.assertTrue(message.startswith("CUDA out of memory."), message)
        self.assertGreaterEqual(seen["num_ooms"], 1)
        self.assertEqual(seen["after_oom"], 1024.0)
        before, after, lib_after = seen["empty_cache"]
        self.assertGreaterEqual(before - after, 256 * MiB)
        self.assertEqual(after, lib_after)


if __name__ == "__main__":
    if not VISIBLE:
        print("skipped: needs a CUDA build of torch and a GPU")
        sys.exit(77)
    unittest.main(verbosity=2)
