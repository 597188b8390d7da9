#!/usr/bin/env bash
# bench/llama/run_gpu.sh GRADD [STEPS] — one bf16 training step of a model
# shaped like Llama 3.2 1B (16 layers, width 2048, 32 heads, 8 key/value
# heads, MLP 8192, vocabulary 128256, context 2048, tied embeddings, random
# init) on cuda:0: gradd against PyTorch eager and torch.compile of the
# same architecture (peer_torch_gpu.py), in the same run, on the same GPU.
#
# GRADD is the gradd executable (gradd-cuda.so beside it).  gradd trains a
# job file written here ([model] type = llama, batch = micro = $BATCH (4),
# precision bf16, AdamW, grad clip 1.0) on bench/train's random llm.c
# tokens (ids below 50257: a step's work does not depend on which rows of
# the embedding the tokens pick); its figure is the median of
# metrics.jsonl's step_ms over the steps after the first 3.  The PyTorch
# side runs with python3 from PATH ($PEER_PYTHON to override); GRADD_ENV,
# a file to source before gradd alone runs (the device bundle's env.sh);
# PEER_MODES the peer's modes (default eager,compile; none: no peer);
# METRICS_DIR, where gradd's metrics.jsonl is copied as soon as it ends.
#
# Output: JSON lines {"bench":"train_llama_1b_bf16","metric":…,"value":…,
# "unit":…,"peer":…,"peer_value":…,"ratio":…}; ratio < 1 means gradd is
# better (step_ms: gradd/peer; tokens_per_s and mfu: peer/gradd).
set -euo pipefail
gradd=${1:?usage: bench/llama/run_gpu.sh GRADD [STEPS]}
steps=${2:-15}
batch=${BATCH:-4}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/llama_job.sh"
py=${PEER_PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The shape, one place for both sides: SHAPE="L C NH KVH F V T", DEVICE
# (a gradd device) and PRECISION change it, for a small run where there
# is no GPU (DEVICE=cpu PRECISION=fp32).
read -r L C NH KVH F V T <<<"${SHAPE:-16 2048 32 8 8192 128256 2048}"
THETA=500000 device=${DEVICE:-cuda:0} precision=${PRECISION:-bf16}
bench=train_llama_1b_$precision
[ -n "${SHAPE:-}" ] && bench=train_llama_${L}x${C}_$precision

"$py" "$here/../train/make_tokens.py" "$work/tokens.bin"

{ llama_job llama-1b-bench "$device" "$work/tokens.bin"; cat <<CFG
[train]
steps = $steps
batch = $batch
micro_batch = $batch
lr = 3e-4
warmup = 2
weight_decay = 0.1
grad_clip = 1.0
precision = $precision
seed = 1337
eval_every = 0
[output]
dir = $work/out
checkpoint_every = 0
log_every = 1
CFG
} >"$work/llama.cfg"

ran=0
if (
  if [ -n "${GRADD_ENV:-}" ]; then set +e +o pipefail; . "$GRADD_ENV"; set -e -o pipefail; fi
  "$gradd" run "$work/llama.cfg" >&2
); then
  ran=1
  [ -n "${METRICS_DIR:-}" ] && cp "$work/out/metrics.jsonl" "$METRICS_DIR/metrics-llama-1b.jsonl"
else
  echo "bench/llama/run_gpu.sh: gradd failed" >&2
fi
: >"$work/peer.jsonl"
if [ "${PEER_MODES:-}" != none ]; then
  "$py" "$here/peer_torch_gpu.py" --modes "${PEER_MODES:-eager,compile}" --batch "$batch" --steps 10 --warmup 3 \
    --device "${device%%[0-9:]*}" --layers $L --width $C --heads $NH --kv-heads $KVH --mlp $F --vocab $V --context $T --rope-theta $THETA |
    tee "$work/peer.jsonl" >&2 || echo "bench/llama/run_gpu.sh: the PyTorch peer failed" >&2
fi
((ran)) || exit 1

"$py" - "$bench" "$work/peer.jsonl" "$work/out/metrics.jsonl" "$batch" $L $C $NH $KVH $F $V $T <<'PY'
import json, statistics, sys
bench, peer_path, metrics, B, L, C, NH, KVH, F, V, T = *sys.argv[1:4], *map(int, sys.argv[4:])
HS = C // NH
# Parameters: the (tied) embedding, per block two RMSNorm weights, q, k, v,
# o and the three MLP matrices, then the final norm.
n = V * C + L * (2 * C + C * NH * HS + 2 * C * KVH * HS + NH * HS * C + 3 * C * F) + C
steps = [json.loads(l) for l in open(metrics) if '"loss"' in l]
ms = statistics.median(s["step_ms"] for s in steps[3:])
tps = B * T / (ms / 1e3)
mfu = tps * (6 * n + 12 * L * C * T) / 989.4e12
peers = [json.loads(l) for l in open(peer_path) if l.strip()] or [{"impl": None}]
for p in peers:
    has = p["impl"] is not None
    for metric, v, unit, key, inv in (("step_ms", ms, "ms", "step_ms", False),
                                      ("tokens_per_s", tps, "tok/s", "tokens_per_s", True),
                                      ("mfu", mfu, "fraction", "mfu", True)):
        pv = p.get(key)
        r = round((pv / v if inv else v / pv), 4) if has and pv else None
        print(json.dumps({"bench": bench, "metric": metric, "value": round(v, 4), "unit": unit,
                          "peer": p["impl"], "peer_value": pv, "ratio": r}))
PY
