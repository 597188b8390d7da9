#!/usr/bin/env bash
# bench/lora/run_gpu.sh GRADD [STEPS] — LoRA fine-tuning of a model shaped
# like Llama 3.2 3B (28 layers, width 3072, 24 heads, 8 key/value heads, MLP
# 8192, vocabulary 128256, context 2048, tied embeddings, random init) in
# bf16 under [memory] limit = 24G on cuda:0: gradd against transformers +
# peft (peer_peft.py) on the same GPU in the same run, the peer's CUDA
# memory capped at the same 24 GiB.
#
# gradd trains a job file written here ([finetune] method = lora, rank 8,
# alpha 16, targets $TARGETS (q_proj,v_proj), batch $BATCH (4) with
# micro_batch auto and recompute auto) on bench/train's random llm.c tokens;
# its figures are the median of metrics.jsonl's step_ms over the steps after
# the first 3, and the job's peak memory by tag from the pool (`gradd run`
# prints it at the end).  SHAPE="L C NH KVH F V
# T", DEVICE and PRECISION change the shape for a small run where there is
# no GPU; GRADD_ENV is sourced before gradd alone runs (the device bundle's
# env.sh); PEER_PYTHON is the peer's python3; PEER=none skips it.
#
# Output: JSON lines {"bench":"lora_llama_3b_bf16","metric":…,"value":…,
# "unit":…,"peer":…,"peer_value":…,"ratio":…}; ratio < 1 means gradd is
# better (step_ms: gradd/peer; tokens_per_s: peer/gradd); and one line per
# pool tag of gradd's peak ("metric":"peak_<tag>", no peer).
set -euo pipefail
gradd=${1:?usage: bench/lora/run_gpu.sh GRADD [STEPS]}
steps=${2:-10}
batch=${BATCH:-4}
targets=${TARGETS:-q_proj,v_proj}
limit=${LIMIT:-24G}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../llama/llama_job.sh"
py=${PEER_PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
read -r L C NH KVH F V T <<<"${SHAPE:-28 3072 24 8 8192 128256 2048}"
device=${DEVICE:-cuda:0} precision=${PRECISION:-bf16}
bench=lora_llama_3b_$precision
[ -n "${SHAPE:-}" ] && bench=lora_llama_${L}x${C}_$precision

"$py" "$here/../train/make_tokens.py" "$work/tokens.bin"
{ llama_job lora-3b-bench "$device" "$work/tokens.bin"; cat <<CFG
[train]
steps = $steps
batch = $batch
micro_batch = auto
lr = 3e-4
weight_decay = 0.1
grad_clip = 1.0
precision = $precision
eval_every = 0
[memory]
limit = $limit
[finetune]
method = lora
rank = 8
alpha = 16
targets = $targets
[output]
dir = $work/out
log_every = 1
CFG
} >"$work/lora.cfg"

(
  if [ -n "${GRADD_ENV:-}" ]; then set +e +o pipefail; . "$GRADD_ENV"; set -e -o pipefail; fi
  "$gradd" run "$work/lora.cfg"
) >"$work/gradd.log" 2>&1 || { cat "$work/gradd.log" >&2; echo "bench/lora/run_gpu.sh: gradd failed" >&2; exit 1; }
cat "$work/gradd.log" >&2
: >"$work/peer.jsonl"
if [ "${PEER:-}" != none ]; then
  lim=${limit%G}
  "$py" "$here/peer_peft.py" --device "${device%%[0-9:]*}" --batch "$batch" --micro "${PEER_MICRO:-1}" \
    --mem-limit-gib "$lim" --targets "$targets" --layers $L --width $C --heads $NH --kv-heads $KVH --mlp $F \
    --vocab $V --context $T | tee "$work/peer.jsonl" >&2 || echo "bench/lora/run_gpu.sh: the peer failed" >&2
fi

"$py" - "$bench" "$work/peer.jsonl" "$work/out/metrics.jsonl" "$work/gradd.log" "$batch" "$T" <<'PY'
import json, re, statistics, sys
bench, peer_path, metrics, log = sys.argv[1:5]
B, T = map(int, sys.argv[5:])
steps = [json.loads(l) for l in open(metrics) if '"loss"' in l]
ms = statistics.median(s["step_ms"] for s in steps[3:] or steps)
tps = B * T / (ms / 1e3)
peers = [json.loads(l) for l in open(peer_path) if l.strip()] or [{"impl": None}]
for p in peers:
    for metric, v, unit, inv in (("step_ms", ms, "ms", False), ("tokens_per_s", tps, "tok/s", True)):
        pv = p.get(metric)
        r = round(pv / v if inv else v / pv, 4) if p["impl"] and pv else None
        print(json.dumps({"bench": bench, "metric": metric, "value": round(v, 3), "unit": unit,
                          "peer": p["impl"], "peer_value": pv, "ratio": r}))
    if p.get("peak_mem_gib") is not None:
        print(json.dumps({"bench": bench, "metric": "peak_mem_peer", "value": None, "unit": "GiB",
                          "peer": p["impl"], "peer_value": p["peak_mem_gib"], "ratio": None}))
# gradd run's closing line: "peak memory 21.3G: frozen 6.01G, params 9.2M, ...".
for line in open(log):
    if line.startswith("peak memory "):
        total, tags = line[len("peak memory "):].split(":", 1)
        for tag, size in [("total", total)] + [t.split() for t in tags.split(",")]:
            print(json.dumps({"bench": bench, "metric": "peak_" + tag, "value": size, "unit": "size",
                              "peer": None, "peer_value": None, "ratio": None}))
PY
