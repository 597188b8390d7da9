#!/usr/bin/env python3
"""bench/pool/peer_torch_gpu.py - PyTorch's CUDA caching allocator on the pool trace.

The PyTorch peer of bench_pool_cuda (bench/pool/bench_pool_cuda.c): the same trace
(bench/pool/gen_trace.py), read and checked the same way, replayed from one thread
on one GPU through torch's caching allocator, with the same figures.
bench/pool/run_gpu.sh runs both and joins the figures; on its own:

    python3 bench/pool/peer_torch_gpu.py TRACE [--repeat 5] [--warm-steps 2] [--device 0]
    python3 bench/pool/peer_torch_gpu.py TRACE --dry-run     # no GPU needed

Imports nothing but the standard library and torch (and torch only where a
GPU is used or --dry-run reports its version).

The calls.  torch.cuda.caching_allocator_alloc(size, device, stream) checks
its arguments in Python, enters `with torch.cuda.device(device)` and calls
torch._C._cuda_cudaCachingAllocator_raw_alloc(size, stream), a C binding
that parses the arguments, releases the GIL and calls the allocator's
raw_alloc_with_stream; caching_allocator_delete(ptr) calls
torch._C._cuda_cudaCachingAllocator_raw_delete(ptr) likewise.  --api picks
what is timed: "raw" (the bindings, peer "torch" in the joined output: the
least Python there can be) and "public" (the documented functions, peer
"torch_public_api"); the default runs both, interleaved.  Each replay uses
the device's current (default) stream, as PyTorch's own operators do.

Timing.  Each call is timed alone with time.perf_counter_ns(); a pair is one
request's alloc time plus its free time, over the requests allocated from
optimizer step --warm-steps on (bench_pool's definition; median = the lower
middle value, p99 = nearest rank; "small": requests <= 1 MiB).  These
figures include Python's cost of making the call.  It is subtracted: before
every replay the very same call path is timed with the allocator's work
taken out - alloc of 0 bytes (raw_alloc_with_stream returns NULL at once for
0 bytes, before any lock or search; checked: it must return 0) and delete of
NULL (raw_delete returns at once) - and the medians of those (timer, Python
call, argument parsing, GIL release and re-acquire, result object, and for
"public" the Python wrapper) are subtracted from every alloc and every free,
clamped at 0.  What is left is the allocator's own work as seen from the
host, comparable with bench_pool_cuda's figures (its timer overhead is
subtracted the same way).  Both overheads are printed with the figures.  The
cyclic garbage collector is off during replays, so that no collection lands
inside a timed call.

Device allocations: memory_stats()["num_device_alloc"] (cudaMalloc calls;
"segment.all.allocated" where a torch lacks it), read at every step
boundary, untimed: per 1,000 requests overall and steady (optimizer steps
whose index within their phase is >= --warm-steps).  Peaks:
memory_stats()["reserved_bytes.all.peak"] / ["allocated_bytes.all.peak"]
over each replay.  Between replays everything is freed, empty_cache() gives
the memory back and the statistics are reset, so each replay starts cold,
as bench_pool_cuda's fresh pool does.

Output: one JSON object per figure and api on stdout,
  {"bench":"pool_trace_torch","metric":M,"value":V,"unit":U,"impl":"torch-2.11.0+cu130",
   "api":"raw","overhead_ns":{"alloc":A,"free":F},"note":...}
with M among bench_pool_cuda's metrics; a table on stderr.
"""
import argparse
import gc
import json
import math
import os
import statistics
import sys
import time

TAGS = ("params", "grads", "optimizer", "activations", "workspace", "data", "other")
SMALL_REQUEST = 1 << 20  # the pool's small-pool limit: the small/large split
HOT_PAIRS = 100000
HOT_SIZE = 512
OP_ALLOC, OP_FREE, OP_STEP = 0, 1, 2


class TraceError(Exception):
    pass


class Trace:
    """bench/pool/gen_trace.py's format, checked as bench/pool/trace.c checks it."""

    def __init__(self, path):
        self.path = path
        self.ops = []  # (kind, id, size); OP_STEP: (OP_STEP, step, 0)
        self.steps = []  # [phase, in_phase, allocs]
        self.phase_micro = []
        self.alloc_step = []  # per id; -1: setup
        self.setup_allocs = 0
        self.nallocs = self.nfrees = 0
        self.peak_live = 0
        size_of = []
        state = []  # 0 unseen, 1 live, 2 freed
        live = 0
        cur_step = -1
        phase_first = 0
        with open(path) as f:
            for lineno, line in enumerate(f, 1):
                if line == "\n":
                    continue
                if line.startswith("#"):
                    w = line[1:].split()
                    if len(w) >= 2 and w[0] == "phase" and w[1].lstrip("-").isdigit():
                        micro = [x for x in w[2:] if x.startswith("micro=")]
                        if not micro:
                            continue
                        p = int(w[1])
                        if p != len(self.phase_micro) or p >= 64:
                            raise TraceError(f"{path}:{lineno}: phase {p} out of order")
                        self.phase_micro.append(int(micro[0][6:]))
                        phase_first = len(self.steps)
                    elif len(w) >= 2 and w[0] == "step" and w[1].lstrip("-").isdigit():
                        s = int(w[1])
                        if s != len(self.steps) or not self.phase_micro:
                            raise TraceError(f"{path}:{lineno}: step {s} out of order or "
                                             "before a phase")
                        self.steps.append([len(self.phase_micro) - 1, s - phase_first, 0])
                        cur_step = s
                        self.ops.append((OP_STEP, s, 0))
                    continue
                w = line.split()
                if w and w[0] == "a" and len(w) >= 4:
                    i, size, tag = int(w[1]), int(w[2]), w[3]
                    if tag not in TAGS or not 0 <= i < (1 << 31) or size <= 0:
                        raise TraceError(f"{path}:{lineno}: bad alloc line: {line.rstrip()}")
                    if i >= len(state):
                        grow = i + 1 - len(state)
                        state += [0] * grow
                        size_of += [0] * grow
                        self.alloc_step += [0] * grow
                    if state[i]:
                        raise TraceError(f"{path}:{lineno}: id {i} allocated twice")
                    state[i] = 1
                    size_of[i] = size
                    self.alloc_step[i] = cur_step
                    if cur_step < 0:
                        self.setup_allocs += 1
                    else:
                        self.steps[cur_step][2] += 1
                    self.ops.append((OP_ALLOC, i, size))
                    self.nallocs += 1
                    live += size
                    self.peak_live = max(self.peak_live, live)
                elif w and w[0] == "f" and len(w) >= 2:
                    i = int(w[1])
                    if not 0 <= i < len(state) or state[i] != 1:
                        raise TraceError(f"{path}:{lineno}: free of id {i}, which is not live")
                    state[i] = 2
                    live -= size_of[i]
                    self.ops.append((OP_FREE, i, size_of[i]))
                    self.nfrees += 1
                else:
                    raise TraceError(f"{path}:{lineno}: cannot parse: {line.rstrip()}")
        if self.nallocs == 0 or not self.steps:
            raise TraceError(f"{path} has no allocations or no steps")
        self.nids = len(state)

    def counts(self, warm_steps):
        """What a replay will time and count, without replaying."""
        pairs = small = 0
        for kind, i, size in self.ops:
            if kind == OP_FREE and self.alloc_step[i] >= warm_steps:
                pairs += 1
                small += size <= SMALL_REQUEST
        steady = sum(s[2] for s in self.steps if s[1] >= warm_steps)
        return {"ops": len(self.ops), "allocs": self.nallocs, "frees": self.nfrees,
                "steps": len(self.steps), "phases": len(self.phase_micro),
                "micro": self.phase_micro, "peak_live": self.peak_live,
                "setup_allocs": self.setup_allocs, "pairs_timed": pairs, "small": small,
                "large": pairs - small, "requests_steady": steady}


def lower_median(v):
    """bench_pool's median: the lower middle value of the sorted list."""
    v = sorted(v)
    return v[(len(v) - 1) // 2] if v else 0


def p99(v):
    """Nearest rank, as bench_pool."""
    if not v:
        return 0
    v = sorted(v)
    k = math.ceil(0.99 * len(v))
    return v[max(k, 1) - 1]


class TorchAlloc:
    """The two call paths (api) into torch's caching allocator, plus stats."""

    def __init__(self, torch, device):
        self.torch = torch
        self.device = device
        torch.cuda.set_device(device)
        torch.cuda.init()
        self.stream = torch.cuda.current_stream(device).cuda_stream
        self.raw_alloc = getattr(torch._C, "_cuda_cudaCachingAllocator_raw_alloc", None)
        self.raw_delete = getattr(torch._C, "_cuda_cudaCachingAllocator_raw_delete", None)
        pub_alloc = torch.cuda.caching_allocator_alloc
        self.pub_delete = torch.cuda.caching_allocator_delete
        dev = device

        def public_alloc(size, stream):
            return pub_alloc(size, dev, stream)

        self.pub_alloc = public_alloc
        st = torch.cuda.memory_stats(device)
        self.dev_key = "num_device_alloc" if "num_device_alloc" in st else "segment.all.allocated"

    def calls(self, api):
        if api == "raw":
            return self.raw_alloc, self.raw_delete
        return self.pub_alloc, self.pub_delete

    def device_allocs(self):
        return self.torch.cuda.memory_stats(self.device).get(self.dev_key, 0)

    def reset(self):
        torch = self.torch
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        torch.cuda.reset_accumulated_memory_stats(self.device)

    def peaks(self):
        st = self.torch.cuda.memory_stats(self.device)
        return st.get("reserved_bytes.all.peak", 0), st.get("allocated_bytes.all.peak", 0)


def call_overhead(A, F, stream, n=20001):
    """Median ns of a timed alloc of 0 bytes and a timed free of NULL through
    the same call path: everything but the allocator's work."""
    pc = time.perf_counter_ns
    ta, tf = [], []
    for _ in range(n):
        t0 = pc()
        p = A(0, stream)
        t1 = pc()
        F(0)
        t2 = pc()
        ta.append(t1 - t0)
        tf.append(t2 - t1)
        if p:
            raise RuntimeError(f"an alloc of 0 bytes returned {p:#x}, not 0: the empty call "
                               "does allocator work here, so it cannot measure the overhead")
    return lower_median(ta), lower_median(tf)


def replay(trace, alloc, api, warm_steps):
    """One pass over the trace through `api`; the figures of bench_pool's
    summarise(), with the call overhead subtracted."""
    A, F = alloc.calls(api)
    stream = alloc.stream
    alloc.reset()
    oa, of = call_overhead(A, F, stream)
    alloc.reset()  # the overhead runs allocated nothing, but start from clean stats
    pc = time.perf_counter_ns
    n = trace.nids
    ptr = [0] * n
    at = [0] * n
    ft = [0] * n
    step_dev = [0] * (len(trace.steps) + 1)
    base = alloc.device_allocs()
    gc.collect()
    gc.disable()
    try:
        w0 = pc()
        for kind, i, size in trace.ops:
            if kind == OP_ALLOC:
                t0 = pc()
                p = A(size, stream)
                t1 = pc()
                if not p:
                    raise RuntimeError(f"allocation {i} of {size} bytes failed")
                ptr[i] = p
                at[i] = t1 - t0
            elif kind == OP_FREE:
                p = ptr[i]
                t0 = pc()
                F(p)
                t1 = pc()
                ft[i] = t1 - t0
                ptr[i] = 0
            else:
                step_dev[i] = alloc.device_allocs() - base
        step_dev[-1] = alloc.device_allocs() - base
        wall_ms = (pc() - w0) / 1e6
    finally:
        gc.enable()
    peak_reserved, peak_allocated = alloc.peaks()
    for kind, i, _ in trace.ops:  # the leftovers, untimed
        if kind == OP_ALLOC and ptr[i]:
            F(ptr[i])
            ptr[i] = 0

    pairs, smalls, larges = [], [], []
    for kind, i, size in trace.ops:
        if kind != OP_FREE or trace.alloc_step[i] < warm_steps:
            continue
        v = max(at[i] - oa, 0) + max(ft[i] - of, 0)
        pairs.append(v)
        (smalls if size <= SMALL_REQUEST else larges).append(v)

    # The hit path alone, as bench_pool's hot_pairs().
    for _ in range(1000):
        F(A(HOT_SIZE, stream))
    hot = []
    for _ in range(HOT_PAIRS):
        t0 = pc()
        p = A(HOT_SIZE, stream)
        t1 = pc()
        F(p)
        t2 = pc()
        hot.append(max(t1 - t0 - oa, 0) + max(t2 - t1 - of, 0))

    dev_all = step_dev[-1]
    dev_steady = req_steady = 0
    for s, (phase, in_phase, allocs) in enumerate(trace.steps):
        if in_phase >= warm_steps:
            dev_steady += step_dev[s + 1] - step_dev[s]
            req_steady += allocs
    return {
        "pair_ns_median": lower_median(pairs),
        "pair_ns_p99": p99(pairs),
        "pair_ns_mean": statistics.fmean(pairs) if pairs else 0.0,
        "pair_ns_median_small": lower_median(smalls),
        "pair_ns_median_large": lower_median(larges),
        "pair_ns_hot_512B": lower_median(hot),
        "device_allocs": dev_all,
        "device_allocs_per_1000": 1000.0 * dev_all / trace.nallocs,
        "device_allocs_per_1000_steady": (1000.0 * dev_steady / req_steady
                                          if req_steady else None),
        "peak_reserved": peak_reserved,
        "peak_allocated": peak_allocated,
        "reserved_over_allocated_peak": (peak_reserved / peak_allocated
                                         if peak_allocated else None),
        "overhead_alloc_ns": oa,
        "overhead_free_ns": of,
        "wall_ms": wall_ms,
        "npairs": len(pairs),
    }


TIMED = ("pair_ns_median", "pair_ns_p99", "pair_ns_mean", "pair_ns_median_small",
         "pair_ns_median_large", "pair_ns_hot_512B", "overhead_alloc_ns", "overhead_free_ns",
         "wall_ms")
METRICS = (("pair_ns_median", "ns", 0.1), ("pair_ns_p99", "ns", 0.1),
           ("pair_ns_median_small", "ns", 0.1), ("pair_ns_median_large", "ns", 0.1),
           ("pair_ns_hot_512B", "ns", 0.1), ("device_allocs_per_1000", "per_1000_requests", 1e-4),
           ("device_allocs_per_1000_steady", "per_1000_requests", 1e-4),
           ("reserved_over_allocated_peak", "ratio", 1e-4))


def median_run(runs):
    """Timing figures: the median over the repeats; counts: the first run's."""
    out = dict(runs[0])
    for k in TIMED:
        out[k] = statistics.median(r[k] for r in runs)
    return out


def rounded(v, q):
    if v is None:
        return None
    r = round(v / q) * q
    return round(r, 6)


def note(api, oa, of):
    what = ("torch._C._cuda_cudaCachingAllocator_raw_alloc/raw_delete (what "
            "torch.cuda.caching_allocator_alloc/delete call)" if api == "raw" else
            "torch.cuda.caching_allocator_alloc/caching_allocator_delete")
    return (f"host ns per call of {what}, timed from Python with time.perf_counter_ns; "
            f"includes the Python call overhead, corrected by subtracting the median time of "
            f"the same calls doing no allocator work (alloc of 0 bytes, free of NULL): "
            f"{oa:.0f} ns per alloc, {of:.0f} ns per free")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--warm-steps", type=int, default=2)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--api", default="raw,public",
                    help="comma-separated: raw (torch._C bindings), public "
                         "(torch.cuda.caching_allocator_alloc/delete)")
    ap.add_argument("--dry-run", action="store_true",
                    help="parse the trace, print what a replay would time and count, and "
                         "whether torch has the calls; no GPU needed")
    a = ap.parse_args()
    apis = [x for x in a.api.split(",") if x]
    if a.repeat < 1 or a.warm_steps < 0 or not apis or any(x not in ("raw", "public")
                                                          for x in apis):
        ap.error("--repeat >= 1, --warm-steps >= 0, --api from raw,public")

    try:
        trace = Trace(a.trace)
    except (OSError, ValueError, TraceError) as e:
        print(f"peer_torch_gpu: {e}", file=sys.stderr)
        return 1
    counts = trace.counts(a.warm_steps)

    if a.dry_run:
        info = {"dry_run": True, "trace": a.trace, "warm_steps": a.warm_steps, **counts}
        try:
            import torch
            info["torch"] = torch.__version__
            info["torch_has"] = {
                "caching_allocator_alloc": hasattr(torch.cuda, "caching_allocator_alloc"),
                "caching_allocator_delete": hasattr(torch.cuda, "caching_allocator_delete"),
                "raw_alloc": hasattr(torch._C, "_cuda_cudaCachingAllocator_raw_alloc"),
                "raw_delete": hasattr(torch._C, "_cuda_cudaCachingAllocator_raw_delete"),
                "memory_stats": hasattr(torch.cuda, "memory_stats"),
            }
            info["cuda_available"] = torch.cuda.is_available()
        except ImportError as e:
            info["torch"] = None
            info["torch_error"] = str(e)
        print(json.dumps(info, separators=(",", ":")), flush=True)
        return 0

    import torch
    if not torch.cuda.is_available():
        print("peer_torch_gpu: skipped, torch sees no usable CUDA device", file=sys.stderr)
        return 77
    if a.device >= torch.cuda.device_count():
        print(f"peer_torch_gpu: --device {a.device}, but torch sees "
              f"{torch.cuda.device_count()} device(s)", file=sys.stderr)
        return 2
    if "raw" in apis and not hasattr(torch._C, "_cuda_cudaCachingAllocator_raw_alloc"):
        print(f"peer_torch_gpu: torch {torch.__version__} has no "
              "torch._C._cuda_cudaCachingAllocator_raw_alloc; api raw skipped", file=sys.stderr)
        apis.remove("raw")
        if not apis:
            return 1
    alloc = TorchAlloc(torch, a.device)
    impl = f"torch-{torch.__version__}"
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    backend = (torch.cuda.get_allocator_backend()
               if hasattr(torch.cuda, "get_allocator_backend") else "native")
    print(f"trace {a.trace}: {counts['ops']} ops ({counts['allocs']} allocs, {counts['frees']} "
          f"frees), {counts['steps']} steps in {counts['phases']} phases (micro "
          f"{','.join(map(str, counts['micro']))}), peak live {counts['peak_live'] / 2**30:.2f} GiB",
          file=sys.stderr)
    print(f"{impl} on cuda:{a.device} ({torch.cuda.get_device_name(a.device)}), allocator "
          f"backend {backend}, PYTORCH_CUDA_ALLOC_CONF={conf!r}, device allocations from "
          f"memory_stats()[{alloc.dev_key!r}]; {a.repeat} repeats, apis {','.join(apis)}",
          file=sys.stderr)

    runs = {api: [] for api in apis}
    for _ in range(a.repeat):
        for api in apis:  # interleaved, so drift hits both alike
            runs[api].append(replay(trace, alloc, api, a.warm_steps))
    alloc.reset()

    print(f"\n{'api':8s} {'median':>9s} {'p99':>9s} {'mean':>9s} {'small':>9s} {'large':>9s} "
          f"{'hot':>8s} {'ovh a':>7s} {'ovh f':>7s} {'replay':>8s} {'dev':>6s} {'/1000':>8s} "
          f"{'/1000':>8s} {'res/alloc':>9s}", file=sys.stderr)
    for api in apis:
        r = median_run(runs[api])
        steady = r["device_allocs_per_1000_steady"]
        ratio = r["reserved_over_allocated_peak"]
        print(f"{api:8s} {r['pair_ns_median']:9.1f} {r['pair_ns_p99']:9.1f} "
              f"{r['pair_ns_mean']:9.1f} {r['pair_ns_median_small']:9.1f} "
              f"{r['pair_ns_median_large']:9.1f} {r['pair_ns_hot_512B']:8.1f} "
              f"{r['overhead_alloc_ns']:7.0f} {r['overhead_free_ns']:7.0f} {r['wall_ms']:8.1f} "
              f"{r['device_allocs']:6d} {r['device_allocs_per_1000']:8.3f} "
              f"{steady if steady is not None else float('nan'):8.3f} "
              f"{ratio if ratio is not None else float('nan'):9.4f}", file=sys.stderr)
        for metric, unit, q in METRICS:
            rec = {"bench": "pool_trace_torch", "metric": metric, "value": rounded(r[metric], q),
                   "unit": unit, "impl": impl, "api": api,
                   "overhead_ns": {"alloc": r["overhead_alloc_ns"], "free": r["overhead_free_ns"]},
                   "alloc_conf": conf, "device_alloc_key": alloc.dev_key,
                   "peak_reserved": r["peak_reserved"], "peak_allocated": r["peak_allocated"],
                   "pairs": r["npairs"], "repeats": a.repeat,
                   "note": note(api, r["overhead_alloc_ns"], r["overhead_free_ns"])}
            print(json.dumps(rec, separators=(",", ":")), flush=True)
    print(f"({counts['pairs_timed']} pairs timed: {counts['small']} small <= 1 MiB, "
          f"{counts['large']} large; times are per call from Python minus the empty-call "
          "overhead (ovh a/f, ns); hot: one 512-byte request allocated and freed "
          f"{HOT_PAIRS} times)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
