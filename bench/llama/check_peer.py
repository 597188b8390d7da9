#!/usr/bin/env python3
"""bench/llama/check_peer.py - the Llama benchmark's PyTorch peer, run at a
tiny shape on the CPU (Debian's torch), so that it reaches the GPU machine
working: both attention forms give one JSON line each, with a step time and
the first steps' loss near ln(vocab) (random init, uniform predictions).
Exit 77 (skipped) without torch."""
import json
import math
import os
import subprocess
import sys

try:
    import torch  # noqa: F401
except ImportError:
    print("check_peer: no torch here: skipped")
    sys.exit(77)

V = 300
peer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_torch_gpu.py")
args = [sys.executable, peer, "--device", "cpu", "--modes", "eager,eager-explicit", "--layers", "2", "--width", "64",
        "--heads", "4", "--kv-heads", "2", "--mlp", "96", "--vocab", str(V), "--context", "16", "--batch", "2",
        "--warmup", "1", "--steps", "2"]
r = subprocess.run(args, capture_output=True, text=True, timeout=120)
sys.stderr.write(r.stderr)
lines = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
bad = []
if r.returncode != 0:
    bad.append(f"exit status {r.returncode}")
if [l["impl"].rsplit("-", 1)[-1] for l in lines] != ["eager", "explicit"]:
    bad.append(f"modes {[l['impl'] for l in lines]}")
for l in lines:
    print(json.dumps(l))
    if not (l["step_ms"] > 0 and abs(l["loss"] - math.log(V)) < 0.5):
        bad.append(f"{l['impl']}: step_ms {l['step_ms']}, loss {l['loss']} (ln V = {math.log(V):.3f})")
if bad:
    print("check_peer: FAIL: " + "; ".join(bad))
    sys.exit(1)
print("check_peer: ok")
