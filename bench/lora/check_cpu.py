#!/usr/bin/env python3
"""bench/lora/check_cpu.py GRADD - the LoRA benchmark, gradd and its peft
peer, run at a tiny shape on the CPU (fp32), so that it reaches the GPU
machine working: both sides give their step time, the ratio is computed,
and gradd's peak by tag has a frozen base and adapters far smaller than it.
Run with the Hugging Face venv's python (peft); exit 77 (skipped) without
peft."""
import json
import os
import subprocess
import sys

try:
    import peft  # noqa: F401
except ImportError:
    print("check_cpu: no peft here: skipped")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
env = dict(os.environ, SHAPE="2 64 4 2 128 50304 32", DEVICE="cpu", PRECISION="fp32", LIMIT="1G", BATCH="4",
           PEER_PYTHON=sys.executable)
r = subprocess.run(["bash", os.path.join(here, "run_gpu.sh"), sys.argv[1], "5"], env=env, capture_output=True,
                   text=True, timeout=300)
sys.stderr.write(r.stderr[-4000:])
lines = {l["metric"]: l for l in map(json.loads, filter(str.strip, r.stdout.splitlines()))}
units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size(metric):
    v = lines[metric]["value"]
    return float(v[:-1]) * units[v[-1]]


bad = []
if r.returncode != 0:
    bad.append(f"exit status {r.returncode}")
for m in ("step_ms", "tokens_per_s"):
    l = lines.get(m)
    if not l or not l["peer"] or not l["peer"].startswith("peft-") or not (l["ratio"] or 0) > 0:
        bad.append(f"{m}: {l}")
for m in ("peak_frozen", "peak_params", "peak_grads", "peak_optimizer"):
    if m not in lines:
        bad.append(f"no {m}")
if not bad:
    # The base, 2 layers of width 64 and a 50304-token table, in fp32; the
    # adapters (q and v, rank 8) a few thousand values.
    P = 50304 * 64 + 2 * (2 * 64 + 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128) + 64
    A = 2 * (8 * (64 + 64) + 8 * (64 + 32))
    if abs(size("peak_frozen") - 4 * P) > 0.01 * 4 * P:
        bad.append(f"frozen {lines['peak_frozen']['value']}, want {4 * P} bytes")
    if size("peak_params") > 4 * A + (16 << 10) or size("peak_optimizer") > 8 * A + (32 << 10):
        bad.append("the adapters' buffers are larger than the adapters")
if bad:
    print("check_cpu:", "; ".join(bad))
    sys.exit(1)
print("check_cpu: ok:", lines["step_ms"]["value"], "ms against", lines["step_ms"]["peer_value"], "ms")
