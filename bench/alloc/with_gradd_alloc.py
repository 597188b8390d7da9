"""Run a PyTorch program with libgradd-alloc as its CUDA allocator.

    python3 with_gradd_alloc.py LIB PROGRAM [ARGS...]

The program gets what a program job's PyTorch gets: gradd's shim
(python/gradd/_alloc.py) installs the library as the allocator and serves
torch.cuda's memory functions from it.  Then the program runs as
__main__."""
import os
import runpy
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
os.environ["GRADD_ALLOC_LIB"] = os.path.abspath(sys.argv[1])

import torch  # noqa: E402  (the shim is installed on torch, after its path is set)
from gradd import _alloc  # noqa: E402

if not _alloc.install():
    sys.exit("with_gradd_alloc: gradd's allocator is not installed (the gradd: line above says why)")
prog = sys.argv[2]
sys.argv = sys.argv[2:]
runpy.run_path(prog, run_name="__main__")
