#!/usr/bin/env python3
"""bench/pool/join_peer.py GRADD_JSONL TORCH_JSONL - gradd's pool against torch.

Reads bench_pool_cuda's JSON lines (benches pool_trace_cuda and
pool_trace_cuda_expandable) and bench/pool/peer_torch_gpu.py's (bench
pool_trace_torch, one set per api) and prints, for every gradd bench and
every metric both have, one line in the bench/ convention:

  {"bench":"pool_trace_cuda","metric":"pair_ns_median","value":<gradd>,"unit":"ns",
   "peer":"torch","peer_value":<torch>,"ratio":<gradd/torch>,
   "peer_impl":"torch-2.11.0+cu130","peer_api":"raw","peer_overhead_ns":{...},
   "peer_note":"... includes the Python call overhead, corrected by ..."}

peer "torch" is api "raw" (torch._C's allocator bindings), peer
"torch_public_api" is api "public" (torch.cuda.caching_allocator_alloc/
delete).  ratio < 1: gradd's pool is better.  Standard library only: it runs
under any python3.  Exit 1 when a file has no usable line.
"""
import json
import sys

GRADD_BENCHES = ("pool_trace_cuda", "pool_trace_cuda_expandable")
PEER_NAMES = {"raw": "torch", "public": "torch_public_api"}


def read_jsonl(path):
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line.startswith("{"):
                continue  # the programs print JSON lines only, but be lenient with logs
            try:
                out.append(json.loads(line))
            except ValueError as e:
                raise SystemExit(f"join_peer: {path}:{n}: {e}")
    return out


def join(gradd, torch):
    """The joined lines, in gradd's bench order, then torch's metric order."""
    values = {}  # (bench, metric) -> gradd value, unit: every peer line carries both
    for rec in gradd:
        if rec.get("bench") in GRADD_BENCHES and "metric" in rec:
            values.setdefault((rec["bench"], rec["metric"]), (rec.get("value"), rec.get("unit")))
    peers = [r for r in torch if r.get("bench") == "pool_trace_torch"]
    out = []
    for bench in GRADD_BENCHES:
        for p in peers:
            key = (bench, p.get("metric"))
            if key not in values:
                continue
            v, unit = values[key]
            pv = p.get("value")
            ratio = (round(v / pv, 4) if isinstance(v, (int, float)) and
                     isinstance(pv, (int, float)) and pv != 0 else None)
            api = p.get("api", "raw")
            out.append({"bench": bench, "metric": p["metric"], "value": v, "unit": unit,
                        "peer": PEER_NAMES.get(api, "torch_" + str(api)), "peer_value": pv,
                        "ratio": ratio, "peer_impl": p.get("impl"), "peer_api": api,
                        "peer_overhead_ns": p.get("overhead_ns"),
                        "peer_alloc_conf": p.get("alloc_conf", ""),
                        "peer_note": p.get("note", "")})
    return out


def main(argv):
    if len(argv) != 3:
        print(__doc__.split("\n")[0], file=sys.stderr)
        return 2
    gradd, torch = read_jsonl(argv[1]), read_jsonl(argv[2])
    lines = join(gradd, torch)
    if not lines:
        print(f"join_peer: nothing to join: {len(gradd)} gradd line(s) in {argv[1]}, "
              f"{len(torch)} torch line(s) in {argv[2]}", file=sys.stderr)
        return 1
    for rec in lines:
        print(json.dumps(rec, separators=(",", ":")))
    for rec in lines:
        r = rec["ratio"]
        print(f"bench/pool/run_gpu.sh: {rec['bench']:27s} {rec['metric']:30s} gradd {rec['value']!s:>10} "
              f"{rec['peer']:16s} {rec['peer_value']!s:>10}  ratio "
              f"{r if r is not None else 'n/a'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
