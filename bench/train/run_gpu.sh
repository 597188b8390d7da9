#!/usr/bin/env bash
# bench/train/run_gpu.sh GRADD [STEPS] — GPT-2 124M in bf16 on cuda:0: gradd
# against PyTorch eager and torch.compile, in the same run, on the same GPU.
#
# GRADD is the gradd executable (gradd-cuda.so beside it).  gradd trains a
# job file written here (L=12 C=768 H=12 T=1024 V=50304, batch = micro =
# $BATCH (16), precision bf16, AdamW, grad clip 1.0) on random llm.c-format
# tokens; its figure is the median of metrics.jsonl's step_ms over the steps
# after the first 5.  peer_torch_gpu.py trains the same architecture
# with the same batch, precision and optimizer.  The PyTorch side runs with
# python3 from PATH ($PEER_PYTHON to override) and the environment this
# script was started with; set GRADD_ENV to a file to source (e.g. the
# device bundle's env.sh) before gradd alone runs.
#
# Output: JSON lines, {"bench":"train_gpt2_124m_bf16","metric":…,"value":…,
# "unit":…,"peer":…,"peer_value":…,"ratio":…}; ratio < 1 means gradd is
# better (step_ms: gradd/peer; tokens_per_s and mfu: peer/gradd).  PEER_MODES
# picks the peer's modes (default eager,compile; none: no peer, for a
# second gradd build compared with a peer run just before on the same GPU).
set -euo pipefail
gradd=${1:?usage: bench/train/run_gpu.sh GRADD [STEPS]}
steps=${2:-30}
batch=${BATCH:-16}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/gpt2_job.sh"
py=${PEER_PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$py" "$here/make_tokens.py" "$work/tokens.bin"

{ gpt2_job gpt2-124m-bench "$work/tokens.bin"; cat <<CFG
[train]
steps = $steps
batch = $batch
micro_batch = $batch
lr = 6e-4
warmup = 10
weight_decay = 0.1
grad_clip = 1.0
precision = bf16
seed = 1337
eval_every = 0
[output]
dir = $work/out
checkpoint_every = 0
log_every = 1
CFG
} >"$work/gpt2.cfg"

# VARIANTS lists the gradd runs, one training run each, as NAME or
# NAME:VAR=VALUE,VAR=VALUE (environment for that run): the default runs with
# the environment as it is; e.g. "default wmma:GRADD_FLASH=wmma
# fp32act:GRADD_ACT16=0" (kernels/cuda/flash.cu, daemon/models/model_gpt.c).  The
# peers run once and every gradd run is compared with them.  Device time is
# scarce: a failed variant or peer is reported and the rest still run, and
# each variant's metrics.jsonl is copied to $METRICS_DIR (when set) as soon
# as it ends, so a run killed later still leaves them.
runs=()
for variant in ${VARIANTS:-default}; do
  name=${variant%%:*}
  envs=()
  [[ $variant == *:* ]] && IFS=, read -ra envs <<<"${variant#*:}"
  rm -rf "$work/out"
  if ! (
    # The env file may run commands that fail harmlessly (a missing lib dir):
    # not under this script's errexit/pipefail.
    if [ -n "${GRADD_ENV:-}" ]; then set +e +o pipefail; . "$GRADD_ENV"; set -e -o pipefail; fi
    env "${envs[@]}" "$gradd" run "$work/gpt2.cfg" >&2
  ); then
    echo "bench/train/run_gpu.sh: variant $name failed" >&2
    continue
  fi
  cp "$work/out/metrics.jsonl" "$work/metrics-$name.jsonl"
  [ -n "${METRICS_DIR:-}" ] && cp "$work/metrics-$name.jsonl" "$METRICS_DIR/metrics-gpt2-$name.jsonl"
  "$py" -c 'import json, statistics, sys
s = [json.loads(l) for l in open(sys.argv[1]) if "\"loss\"" in l]
print("bench/train/run_gpu.sh: %s: median step %.2f ms (steps 6-%d)" % (sys.argv[2], statistics.median(x["step_ms"] for x in s[5:]), len(s)))' \
    "$work/metrics-$name.jsonl" "$name" >&2 || true
  runs+=("$name=$work/metrics-$name.jsonl")
done
# Each mode's line as it comes (to stderr too): a kill in torch.compile
# leaves eager's.
: >"$work/peer.jsonl"
if [ "${PEER_MODES:-}" != none ]; then
  "$py" "$here/peer_torch_gpu.py" --modes "${PEER_MODES:-eager,compile}" --batch "$batch" --steps 20 --warmup 5 |
    tee "$work/peer.jsonl" >&2 || echo "bench/train/run_gpu.sh: the PyTorch peer failed" >&2
fi
((${#runs[@]})) || { echo "bench/train/run_gpu.sh: no gradd variant ran" >&2; exit 1; }

"$py" - "$work/peer.jsonl" "$batch" "${runs[@]}" <<'PY'
import json, statistics, sys
L, C, T, V, B = 12, 768, 1024, 50304, int(sys.argv[2])
# Parameters of gradd's GPT: wte, wpe, per block 2 layernorms (4C), qkv (3C²+3C),
# proj (C²+C), fc (4C²+4C), fc proj (4C²+C), then ln_f (2C).
n = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
peers = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
if not peers:  # gradd's figures still count
    peers = [{"impl": None, "step_ms": None, "tokens_per_s": None, "mfu": None}]
for run in sys.argv[3:]:
    name, path = run.split("=", 1)
    steps = [json.loads(l) for l in open(path) if '"loss"' in l]
    ms = statistics.median(s["step_ms"] for s in steps[5:])
    tps = B * T / (ms / 1e3)
    mfu = tps * (6 * n + 12 * L * C * T) / 989.4e12
    bench = "train_gpt2_124m_bf16" + ("" if name == "default" else "_" + name)
    for p in peers:
        has = p["impl"] is not None
        for metric, v, pv, unit, r in (("step_ms", ms, p["step_ms"], "ms", has and ms / p["step_ms"]),
                                       ("tokens_per_s", tps, p["tokens_per_s"], "tok/s", has and p["tokens_per_s"] / tps),
                                       ("mfu", mfu, p["mfu"], "fraction", has and p["mfu"] / mfu)):
            r = round(r, 4) if has else None
            print(json.dumps({"bench": bench, "metric": metric, "value": round(v, 4), "unit": unit,
                              "peer": p["impl"], "peer_value": pv, "ratio": r}))
PY
