"""Run a PyTorch program with libgradd-alloc as its CUDA allocator.

    python3 with_gradd_alloc.py LIB PROGRAM [ARGS...]

The allocator must be installed before the program's first CUDA
allocation, so this runs first and then the program as __main__.  PyTorch
cannot ask a pluggable allocator for its statistics: the few memory
functions a benchmark calls are answered from the library's getters (the
shim gradd will put on a program job's path does the same for all of
them)."""
import ctypes
import runpy
import sys

import torch

lib_path, prog = sys.argv[1], sys.argv[2]
lib = ctypes.CDLL(lib_path)
for name in ("gradd_memory_allocated", "gradd_memory_reserved", "gradd_max_memory_allocated"):
    getattr(lib, name).restype = ctypes.c_uint64
    getattr(lib, name).argtypes = [ctypes.c_int]
lib.gradd_reset_peak_memory_stats.argtypes = [ctypes.c_int]

torch.cuda.memory.change_current_allocator(
    torch.cuda.memory.CUDAPluggableAllocator(lib_path, "gradd_alloc_throwing", "gradd_free"))


def device_index(device=None):
    return torch.cuda.current_device() if device is None else torch.device("cuda", device).index \
        if isinstance(device, int) else torch.device(device).index or 0


torch.cuda.memory_allocated = lambda device=None: lib.gradd_memory_allocated(device_index(device))
torch.cuda.memory_reserved = lambda device=None: lib.gradd_memory_reserved(device_index(device))
torch.cuda.max_memory_allocated = lambda device=None: lib.gradd_max_memory_allocated(device_index(device))
torch.cuda.reset_peak_memory_stats = lambda device=None: lib.gradd_reset_peak_memory_stats(device_index(device))

sys.argv = sys.argv[2:]
runpy.run_path(prog, run_name="__main__")
