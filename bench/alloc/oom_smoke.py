"""Run under with_gradd_alloc.py: PyTorch on libgradd-alloc computes, an
allocation the device cannot hold raises an error whose message starts
"CUDA out of memory." (what accelerate's and the Trainer's batch finders
look for) instead of "succeeding" with NULL, and the process allocates
again afterwards."""
import ctypes, os, torch
lib = ctypes.CDLL(os.environ["GRADD_ALLOC_LIB"])
lib.gradd_memory_reserved.restype = ctypes.c_uint64
x = torch.randn(4096, 4096, device="cuda"); y = x @ x; torch.cuda.synchronize()
print("matmul ok", float(y.abs().sum()) > 0, "gradd reserved (ctypes)", lib.gradd_memory_reserved(0),
      "torch.cuda.memory_allocated", torch.cuda.memory_allocated())
try:
    torch.empty(2**50, device="cuda")
    print("OOM: FAIL (no error)")
except Exception as e:
    print("OOM raised", type(e).__name__, str(e)[:200].replace("\n", " "))
    print("OOM:", "PASS" if str(e).startswith("CUDA out of memory.") else "FAIL")
z = torch.ones(1024, device="cuda"); print("after OOM still allocates:", float(z.sum()))
