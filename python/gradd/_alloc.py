"""gradd's allocator library (libgradd-alloc) as PyTorch's CUDA allocator, and
torch.cuda's memory functions served from it.

gradd's sitecustomize calls install() right after a program job's
`import torch`, with GRADD_ALLOC_LIB naming the library.  install():

1. loads the library with ctypes and starts it (gradd_alloc_init reads what
   gradd set in the environment: the backend, the budget, the shared page);
2. makes it torch's CUDA allocator through
   torch.cuda.memory.CUDAPluggableAllocator (its entry points
   gradd_alloc_throwing and gradd_free), which a CUDA build of PyTorch 2.0 or
   later has and which must happen before the first CUDA allocation;
3. replaces torch.cuda's memory functions, in torch.cuda.memory and in the
   torch.cuda namespace, with ones served from the library's getters under
   PyTorch's names: memory_allocated, memory_reserved, max_memory_allocated,
   max_memory_reserved, memory_stats (an OrderedDict, as torch's),
   memory_stats_as_nested_dict, memory_summary, reset_peak_memory_stats,
   reset_max_memory_allocated and empty_cache.  With a pluggable allocator,
   PyTorch's own raise "CUDAPluggableAllocator does not yet support
   getDeviceStats" and its empty_cache() does not reach the plug-in, so a
   program that logs its memory would crash without these.

When step 1 or 2 cannot be done (the library is missing or refuses its
environment, PyTorch is a CPU-only build or older than 2.0, or CUDA was
already initialised because torch was imported and used before this shim
could run, e.g. from a .pth file), one line on stderr starting "gradd:" says
why, and PyTorch keeps its own allocator and functions untouched: the
program still runs, with its memory seen by gradd through NVML only.

Test mode: with GRADD_ALLOC_BACKEND=cpu the library serves a simulated device
in host memory and there is no CUDA, so install() skips step 2 and does 1 and
3.  A test on a CPU-only machine then allocates through `lib` (the loaded
ctypes library: lib.gradd_alloc(size, device, None), lib.gradd_free(ptr,
size, device, None)) and checks that torch.cuda.memory_allocated(),
memory_stats() and the rest report exactly that.  The current device is
then 0, as there is no CUDA to ask.
"""
import collections
import ctypes
import json
import os
import sys

import torch

# The loaded library (ctypes.CDLL) once install() has loaded it, else None.
lib = None
# True once torch's memory functions are served from the library.
installed = False
_test_mode = False
_tried = False
_torch_memory_summary = None


def _say(why):
    if sys.stderr is not None:
        sys.stderr.write("gradd: %s; PyTorch's own CUDA allocator is used\n" % " ".join(why.split()))
        sys.stderr.flush()


def _load(path):
    """The library with its prototypes, or the reason it cannot be used."""
    if not os.path.isabs(path):
        return None, "GRADD_ALLOC_LIB=%s is not an absolute path" % path
    try:
        dll = ctypes.CDLL(path)
        protos = {
            "gradd_alloc_init": (ctypes.c_int, []),
            "gradd_alloc_last_error": (ctypes.c_char_p, []),
            "gradd_alloc": (ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]),
            "gradd_free": (None, [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]),
            "gradd_memory_allocated": (ctypes.c_uint64, [ctypes.c_int]),
            "gradd_memory_reserved": (ctypes.c_uint64, [ctypes.c_int]),
            "gradd_max_memory_allocated": (ctypes.c_uint64, [ctypes.c_int]),
            "gradd_max_memory_reserved": (ctypes.c_uint64, [ctypes.c_int]),
            "gradd_reset_peak_memory_stats": (None, [ctypes.c_int]),
            "gradd_memory_stats_json": (ctypes.c_size_t, [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]),
            "gradd_empty_cache": (None, []),
            # Not called from Python (it throws C++ exceptions): only checked.
            "gradd_alloc_throwing": (ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]),
        }
        for name, (restype, argtypes) in protos.items():
            fn = getattr(dll, name)
            fn.restype, fn.argtypes = restype, argtypes
    except (OSError, AttributeError) as e:
        return None, "cannot use GRADD_ALLOC_LIB=%s: %s" % (path, e)
    if dll.gradd_alloc_init() != 0:
        return None, dll.gradd_alloc_last_error().decode(errors="replace")
    return dll, None


def _plug_in(path):
    """Make the library torch's CUDA allocator; the reason when it cannot be."""
    memory = torch.cuda.memory
    if torch.version.cuda is None:
        return "this PyTorch (%s) is built without CUDA" % torch.__version__
    if not hasattr(memory, "CUDAPluggableAllocator") or not hasattr(memory, "change_current_allocator"):
        return "this PyTorch (%s) has no CUDAPluggableAllocator (2.0 and later have it)" % torch.__version__
    if torch.cuda.is_initialized():
        return ("CUDA was initialised before gradd's allocator could be installed (torch was imported "
                "and used before gradd's sitecustomize ran, e.g. from a .pth file)")
    try:
        memory.change_current_allocator(memory.CUDAPluggableAllocator(path, "gradd_alloc_throwing", "gradd_free"))
    except (RuntimeError, OSError, AttributeError, TypeError) as e:
        return "PyTorch refused gradd's allocator: %s" % e
    return None


def install():
    """Install the library named by GRADD_ALLOC_LIB (see the module's text).

    Runs once; later calls return the first one's result.  True when
    torch's memory functions are served from the library."""
    global lib, installed, _test_mode, _tried, _torch_memory_summary
    if _tried:
        return installed
    _tried = True
    path = os.environ.get("GRADD_ALLOC_LIB", "")
    if not path:
        return False
    dll, why = _load(path)
    if why is None:
        _test_mode = os.environ.get("GRADD_ALLOC_BACKEND") == "cpu"
        why = None if _test_mode else _plug_in(path)
    if why is not None:
        _say(why)
        return False
    lib = dll
    _torch_memory_summary = torch.cuda.memory.memory_summary
    for name, fn in _SERVED.items():
        if name == "memory_stats_as_nested_dict" and not hasattr(torch.cuda.memory, name):
            continue
        setattr(torch.cuda.memory, name, fn)
        if hasattr(torch.cuda, name):
            setattr(torch.cuda, name, fn)
    installed = True
    return True


# ==== the device argument ======================================================


def _current():
    return 0 if _test_mode else torch.cuda.current_device()


def _index(device):
    """The device index that torch's functions take: None, an int, "cuda",
    "cuda:N", torch.device or torch.cuda.device; torch's ValueError for
    a device that is not CUDA."""
    if isinstance(device, str):
        device = torch.device(device)
    if device is None or (isinstance(device, torch.device) and device.type == "cuda" and device.index is None):
        return _current()
    return torch.cuda._utils._get_device_index(device, optional=True)


# ==== torch.cuda's memory functions ==============================================


def memory_allocated(device=None):
    """torch.cuda.memory_allocated, served by gradd's allocator."""
    return lib.gradd_memory_allocated(_index(device))


def memory_reserved(device=None):
    """torch.cuda.memory_reserved, served by gradd's allocator."""
    return lib.gradd_memory_reserved(_index(device))


def max_memory_allocated(device=None):
    """torch.cuda.max_memory_allocated, served by gradd's allocator."""
    return lib.gradd_max_memory_allocated(_index(device))


def max_memory_reserved(device=None):
    """torch.cuda.max_memory_reserved, served by gradd's allocator."""
    return lib.gradd_max_memory_reserved(_index(device))


def reset_peak_memory_stats(device=None):
    """torch.cuda.reset_peak_memory_stats, served by gradd's allocator."""
    lib.gradd_reset_peak_memory_stats(_index(device))


def reset_max_memory_allocated(device=None):
    """torch.cuda.reset_max_memory_allocated: resets every peak, as torch's does."""
    reset_peak_memory_stats(device)


def empty_cache():
    """torch.cuda.empty_cache: gradd's pools give their cached free memory back."""
    lib.gradd_empty_cache()


_OVERSIZE = ("oversize_allocations", "oversize_segments")


def memory_stats(device=None):
    """torch.cuda.memory_stats, served by gradd's allocator: PyTorch's keys,
    plus gradd's own under "gradd.", sorted as torch sorts them."""
    index = _index(device)
    size = 8192
    while True:
        buf = ctypes.create_string_buffer(size)
        need = lib.gradd_memory_stats_json(index, buf, size)
        if need < size:
            break
        size = need + 1
    stats = json.loads(buf.value)
    # With no max_split_size no block is oversize, as in PyTorch; the pool
    # does not count them otherwise, so they are left out rather than made up.
    if stats.get("max_split_size") == -1:
        for name in _OVERSIZE:
            for field in ("current", "peak", "allocated", "freed"):
                stats.setdefault("%s.%s" % (name, field), 0)
    return collections.OrderedDict(sorted(stats.items()))


def memory_stats_as_nested_dict(device=None):
    """torch.cuda.memory_stats_as_nested_dict, served by gradd's allocator."""
    nested = {}
    for key, value in memory_stats(device).items():
        *path, last = key.split(".")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return nested


def memory_summary(device=None, abbreviated=False):
    """torch.cuda.memory_summary, PyTorch's table of gradd's figures."""
    return _torch_memory_summary(device=_index(device), abbreviated=abbreviated)


_SERVED = {
    "memory_allocated": memory_allocated,
    "memory_reserved": memory_reserved,
    "max_memory_allocated": max_memory_allocated,
    "max_memory_reserved": max_memory_reserved,
    "memory_stats": memory_stats,
    "memory_stats_as_nested_dict": memory_stats_as_nested_dict,
    "memory_summary": memory_summary,
    "reset_peak_memory_stats": reset_peak_memory_stats,
    "reset_max_memory_allocated": reset_max_memory_allocated,
    "empty_cache": empty_cache,
}
