"""torch.cuda's memory functions as gradd._alloc serves them, in a fresh
interpreter whose `import torch` installed the shim in test mode (the
library's simulated device): after allocations and frees made through the
library with ctypes, each function reports exactly the pool's figures
(requests rounded to 512 B; 2 MiB segments for requests up to 1 MiB, a
shared 20 MiB one under 10 MiB, the request rounded to 2 MiB above:
daemon/pool/POOL.md), memory_stats agrees key by key with the library's own
JSON, and every device argument torch accepts names the same device."""
import json
import unittest

from test_shim import NO_TORCH, TORCH, run_python

MiB = 1 << 20

# Runs in the child: allocates through the library, records what the
# functions say at each point, prints it as one JSON object.
SCRIPT = r"""
import collections, ctypes, json, torch
from gradd import _alloc
lib, cuda = _alloc.lib, torch.cuda
MiB = 1 << 20
seen = {}

def figures(tag):
    stats = cuda.memory_stats()
    seen[tag] = {"allocated": cuda.memory_allocated(), "reserved": cuda.memory_reserved(),
                 "max_allocated": cuda.max_memory_allocated(), "max_reserved": cuda.max_memory_reserved(),
                 "stats": dict(stats), "ordered": type(stats) is collections.OrderedDict,
                 "sorted": list(stats) == sorted(stats)}

def library_json(device):
    buf = ctypes.create_string_buffer(1 << 16)
    lib.gradd_memory_stats_json(device, buf, len(buf))
    return json.loads(buf.value)

figures("start")
a = lib.gradd_alloc(1000, 0, None)
figures("small")
b = lib.gradd_alloc(3 * MiB, 0, None)
c = lib.gradd_alloc(25 * MiB + 1, 0, None)
figures("three")
lib.gradd_free(c, 25 * MiB + 1, 0, None)
figures("freed")
seen["library_json"] = library_json(0)
seen["getters"] = [lib.gradd_memory_allocated(0), lib.gradd_memory_reserved(0),
                   lib.gradd_max_memory_allocated(0), lib.gradd_max_memory_reserved(0)]
seen["summary"] = cuda.memory_summary(abbreviated=True)
seen["nested"] = cuda.memory_stats_as_nested_dict()["allocated_bytes"]["all"]
cuda.reset_peak_memory_stats()
figures("reset")
lib.gradd_alloc(2 * MiB, 0, None)
cuda.reset_max_memory_allocated(0)
seen["reset_max"] = cuda.max_memory_allocated()
cuda.empty_cache()
figures("emptied")
d = lib.gradd_alloc(512, 1, None)
devices = [None, 0, "cuda", "cuda:0", torch.device("cuda"), torch.device("cuda", 0), torch.cuda.device(0)]
seen["by_device"] = [[f(d) for d in devices] for f in (cuda.memory_allocated, cuda.memory.memory_allocated,
                                                           cuda.memory_reserved, cuda.max_memory_allocated)]
seen["device1"] = [cuda.memory_allocated(1), cuda.memory_allocated("cuda:1"),
                   cuda.memory_stats(torch.device("cuda", 1))["allocated_bytes.all.current"]]
try:
    cuda.memory_allocated("cpu")
    seen["cpu"] = "no error"
except ValueError as e:
    seen["cpu"] = str(e)
big = lib.gradd_alloc(1 << 30, 0, None)
seen["oom"] = [big, lib.gradd_alloc_last_error().decode(), cuda.memory_stats()["num_ooms"]]
print(json.dumps(seen))
"""


@unittest.skipUnless(TORCH, NO_TORCH)
class MemoryFunctions(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        r = run_python(SCRIPT, GRADD_ALLOC_CPU_CAPACITY="256M")
        if r.returncode != 0 or r.stderr:
            raise AssertionError("child failed (%d): %s" % (r.returncode, r.stderr))
        cls.seen = json.loads(r.stdout)

    def check(self, tag, allocated, reserved, max_allocated, max_reserved):
        got = self.seen[tag]
        self.assertEqual([got["allocated"], got["reserved"], got["max_allocated"], got["max_reserved"]],
                         [allocated, reserved, max_allocated, max_reserved], tag)
        stats = got["stats"]
        self.assertEqual([stats["allocated_bytes.all.current"], stats["reserved_bytes.all.current"],
                          stats["allocated_bytes.all.peak"], stats["reserved_bytes.all.peak"]],
                         [allocated, reserved, max_allocated, max_reserved], tag)
        self.assertTrue(got["ordered"] and got["sorted"], tag)
        return stats

    def test_figures_after_each_step(self):
        self.check("start", 0, 0, 0, 0)
        self.check("small", 1024, 2 * MiB, 1024, 2 * MiB)
        peak = 1024 + 3 * MiB + 26 * MiB
        # 3 MiB opens a 20 MiB segment; 25 MiB does not fit its rest and
        # gets one of its own, rounded to 26 MiB, whose 1 MiB rest is too
        # small to split off: the block is the whole segment.
        s = self.check("three", peak, 48 * MiB, peak, 48 * MiB)
        self.assertEqual([s["allocation.all.current"], s["segment.all.current"], s["segment.large_pool.current"],
                          s["reserved_bytes.small_pool.current"], s["reserved_bytes.large_pool.current"],
                          s["requested_bytes.all.current"], s["num_device_alloc"]],
                         [3, 3, 2, 2 * MiB, 46 * MiB, 1000 + 28 * MiB + 1, 3])
        # A freed block stays cached: reserved does not move.
        s = self.check("freed", 1024 + 3 * MiB, 48 * MiB, peak, 48 * MiB)
        self.assertEqual([s["allocation.all.current"], s["allocated_bytes.all.freed"], s["num_device_free"]],
                         [2, 26 * MiB, 0])
        # Peaks restart from the current figures.
        self.check("reset", 1024 + 3 * MiB, 48 * MiB, 1024 + 3 * MiB, 48 * MiB)
        self.assertEqual(self.seen["reset_max"], 1024 + 5 * MiB)
        # The 2 MiB block went into the 20 MiB segment; empty_cache gives
        # back the wholly free 26 MiB one.
        s = self.check("emptied", 1024 + 5 * MiB, 22 * MiB, 1024 + 5 * MiB, 48 * MiB)
        self.assertEqual([s["segment.all.current"], s["num_device_free"], s["gradd.trims"]], [2, 1, 1])

    def test_stats_are_the_librarys_under_torchs_keys(self):
        freed = self.seen["freed"]["stats"]
        lib = self.seen["library_json"]
        oversize = {k: v for k, v in freed.items() if k.startswith("oversize_")}
        # The pool does not split by max_split_size, so nothing is oversize.
        self.assertEqual(lib["max_split_size"], -1)
        self.assertEqual(oversize, {"%s.%s" % (n, f): 0 for n in ("oversize_allocations", "oversize_segments")
                                    for f in ("current", "peak", "allocated", "freed")})
        self.assertEqual({k: v for k, v in freed.items() if k not in oversize}, lib)
        for pool in ("all", "small_pool", "large_pool"):
            for field in ("current", "peak", "allocated", "freed"):
                for name in ("allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes",
                             "allocation", "segment", "active", "inactive_split", "requested_bytes"):
                    self.assertIn("%s.%s.%s" % (name, pool, field), freed)
        self.assertEqual(self.seen["getters"], [1024 + 3 * MiB, 48 * MiB, 1024 + 29 * MiB, 48 * MiB])
        self.assertEqual(self.seen["nested"], {"current": 1024 + 3 * MiB, "peak": 1024 + 29 * MiB,
                                               "allocated": 1024 + 29 * MiB, "freed": 26 * MiB})

    def test_summary_is_torchs_table_of_the_pools_figures(self):
        summary = self.seen["summary"]
        self.assertIn("PyTorch CUDA memory summary, device ID 0", summary)
        self.assertIn("| Allocated memory      |    3073 KB |   29697 KB |   29697 KB |   26624 KB |", summary)
        self.assertIn("| GPU reserved memory   |   49152 KB |   49152 KB |   49152 KB |       0 B  |", summary)

    def test_every_device_argument(self):
        for row in self.seen["by_device"]:
            self.assertEqual(len(set(row)), 1, row)
        self.assertEqual([row[0] for row in self.seen["by_device"]],
                         [1024 + 5 * MiB, 1024 + 5 * MiB, 22 * MiB, 1024 + 5 * MiB])
        self.assertEqual(self.seen["device1"], [512, 512, 512])
        self.assertEqual(self.seen["cpu"], "Expected a cuda device, but got: cpu")

    def test_out_of_memory(self):
        ptr, message, ooms = self.seen["oom"]
        self.assertIsNone(ptr)
        self.assertTrue(message.startswith("CUDA out of memory. Tried to allocate 1.00G on device 0. (gradd: "), message)
        self.assertEqual(ooms, 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
