"""One of the two PyTorch programs of the GPU session's `programs` step,
run as a gradd program job (its PyTorch on gradd's pool by the shim, or
on its own allocator with [program] allocator = pytorch).

    pair.py hold FRACTION SECONDS   take FRACTION of the device, free it
                                    (PyTorch keeps it cached), stay
    pair.py need FRACTION           take FRACTION of the device: exit 0
                                    when it fits, 3 on an OOM

With PyTorch's own allocator the holder's cache is invisible to the
other program, which OOMs; on gradd's pool the daemon has the holder give
it back first."""
import sys
import time

import torch

mode, frac = sys.argv[1], float(sys.argv[2])
free, total = torch.cuda.mem_get_info()
n = int(total * frac)
print("allocator", torch.cuda.memory.get_allocator_backend(), "device free %.2f of %.2f GiB"
      % (free / 2**30, total / 2**30), flush=True)
if mode == "hold":
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    del x
    # memory_reserved is served by gradd's shim on gradd's pool.
    print("cached %.2f GiB" % (torch.cuda.memory_reserved() / 2**30), flush=True)
    time.sleep(float(sys.argv[3]))
    print("still here, reserved %.2f GiB" % (torch.cuda.memory_reserved() / 2**30), flush=True)
else:
    t0 = time.perf_counter()
    try:
        x = torch.empty(n, dtype=torch.uint8, device="cuda")
        x.fill_(2)
        torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError as e:
        print("oom after %.1f ms: %s" % ((time.perf_counter() - t0) * 1e3, str(e).splitlines()[0][:200]), flush=True)
        sys.exit(3)
    print("got %.2f GiB in %.1f ms" % (n / 2**30, (time.perf_counter() - t0) * 1e3), flush=True)
