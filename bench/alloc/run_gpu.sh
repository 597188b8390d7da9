#!/usr/bin/env bash
# bench/alloc/run_gpu.sh LIB — a PyTorch GPT-2 124M training step (eager,
# bf16 autocast, B=16, T=1024: bench/train/peer_torch_gpu.py) on PyTorch's
# caching allocator and on libgradd-alloc, each in its own process (an
# allocator is chosen before the first CUDA allocation), in the same run.
# Prints one JSON line per metric; ratio < 1: gradd's allocator is faster.
# The peer's Python: $PEER_PYTHON, else python3.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
lib=${1:?usage: run_gpu.sh path/to/libgradd-alloc.so}
py=${PEER_PYTHON:-python3}
step=$here/../train/peer_torch_gpu.py
args=(--modes "${ALLOC_MODES:-eager}" --batch "${ALLOC_BATCH:-16}" --steps "${ALLOC_STEPS:-20}" --warmup 5)
torch_json=$("$py" "$step" "${args[@]}" | grep '^{' | tail -1)
gradd_json=$("$py" "$here/with_gradd_alloc.py" "$lib" "$step" "${args[@]}" | grep '^{' | tail -1)
echo "torch caching allocator: $torch_json" >&2
echo "libgradd-alloc:          $gradd_json" >&2
"$py" - "$torch_json" "$gradd_json" <<'PY'
import json, sys
peer, ours = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for metric, unit in (("step_ms", "ms"), ("peak_mem_gib", "GiB")):
    v, pv = ours[metric], peer[metric]
    print(json.dumps({"bench": "alloc_torch_gpt2_124m_step", "metric": metric, "value": v, "unit": unit,
                      "peer": "pytorch-caching-allocator-" + peer["impl"].split("-")[1], "peer_value": pv,
                      "ratio": round(v / pv, 4) if pv else None}))
PY
