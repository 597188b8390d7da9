#!/bin/sh
# bench/train/run.sh [BUILD_DIR] [THREADS] — gradd's CPU training step time
# against PyTorch CPU, in the same run.
#
# Builds bench/train/bench_train in BUILD_DIR (default: build/bench under the
# source root, set up as a release build when it does not exist yet), then
# for each configuration (gpt_tiny, gpt_small, llama_small, mlp; see bench_train.c) runs
# gradd and the PyTorch peer (peer_torch.py under Debian's
# /usr/bin/python3 with python3-torch) alternately, ROUNDS times, each with
# THREADS threads (default 2).  JSON lines (one per configuration) go to
# stdout, each run's own figures and a summary to stderr:
#   {"bench":"train_gpt_tiny","metric":"step_ms","value":<gradd>,"unit":"ms",
#    "peer":"pytorch-1.13.0a0-cpu","peer_value":<torch>,"ratio":<gradd/torch>,...}
# value and peer_value are the medians over the rounds of each round's median
# ms per step; ratio < 1 means gradd is faster.
#
# Environment:
#   ROUNDS=3            alternations per configuration
#   ONLY=gpt_tiny,...   configurations to run
#   WARMUP=, STEPS=     override the per-configuration warmup/step counts
#   PEER_PYTHON=/usr/bin/python3
#   QUIET_WAIT=120      before each run, wait up to this many seconds for the
#                       machine to go quiet (/proc/pressure/cpu "some avg10"
#                       below QUIET_PSI=10 %); 0 disables.  Other work on the
#                       cores swamps these figures (10x on a 2-core box).
#   OMP_WAIT_POLICY     passed to both sides unchanged.  Both use libgomp;
#                       on a loaded machine PASSIVE helps both a lot (spinning
#                       workers steal the cores), on an idle one ACTIVE (the
#                       default) is faster for short steps.
#   GOMP_SPINCOUNT      gradd's side runs with what gradd itself sets when
#                       neither is given (1000, see gradd(8) ENVIRONMENT);
#                       the peer with libgomp's default, as torch runs.
# The peer gets OPENBLAS_NUM_THREADS=THREADS (torch's GEMMs are threaded by
# OpenBLAS, not by torch.set_num_threads); gradd runs one single-threaded
# OpenBLAS per OpenMP thread itself.  Both run the same OpenBLAS kernels:
# the peer gets OPENBLAS_CORETYPE set to those gradd runs (gradd
# --version), which are the CPU's own where OpenBLAS would fall back to its
# generic ones (kernels/cpu/ctx.c); the lines say which ("blas_core").
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$root/bench/common/ensure_built.sh"
. "$root/bench/common/quiet.sh"
. "$root/bench/common/blas_core.sh"
build=${1:-$root/build/bench}
case $build in
    /*) ;;
    *) build=$PWD/$build ;;
esac
threads=${2:-2}
rounds=${ROUNDS:-3}
only=${ONLY:-gpt_tiny,gpt_small,llama_small,mlp}
py=${PEER_PYTHON:-/usr/bin/python3}

ensure_built "$root" "$build" bench/train/bench_train
ensure_built "$root" "$build" daemon/gradd
if ! "$py" -c 'import torch' 2>/dev/null; then
    echo "bench/train/run.sh: $py cannot import torch; apt-get install python3-torch" >&2
    exit 1
fi

steps_args=""
[ -n "${WARMUP:-}" ] && steps_args="$steps_args --warmup $WARMUP"
[ -n "${STEPS:-}" ] && steps_args="$steps_args --steps $STEPS"

# gradd's own spin (daemon/base/procenv.c): what its side runs with.
spin=${GOMP_SPINCOUNT:-}
[ -z "$spin" ] && [ -z "${OMP_WAIT_POLICY:-}" ] && spin=1000

core=$(blas_core "$build/daemon/gradd")

tmp=$(mktemp -d /tmp/bench_train.XXXXXX)
trap 'rm -rf "$tmp"' EXIT INT TERM

for cfg in $(echo "$only" | tr ',' ' '); do
    r=1
    while [ "$r" -le "$rounds" ]; do
        # Alternate which side goes first, so that drift hits both alike.
        if [ $((r % 2)) -eq 1 ]; then order="gradd torch"; else order="torch gradd"; fi
        for side in $order; do
            wait_quiet bench/train/run.sh
            load=$(cut -d' ' -f1 /proc/loadavg)
            echo "bench/train/run.sh: $cfg round $r/$rounds: $side (load average $load)" >&2
            if [ "$side" = gradd ]; then
                # shellcheck disable=SC2086
                env ${spin:+GOMP_SPINCOUNT=$spin} "$build/bench/train/bench_train" --threads "$threads" --only "$cfg" \
                    $steps_args >>"$tmp/gradd.jsonl"
            else
                # shellcheck disable=SC2086
                env ${core:+OPENBLAS_CORETYPE=$core} OPENBLAS_NUM_THREADS=$threads "$py" "$here/peer_torch.py" --threads "$threads" --only "$cfg" \
                    $steps_args >>"$tmp/torch.jsonl"
            fi
            echo "train_$cfg $load" >>"$tmp/load.txt"
        done
        r=$((r + 1))
    done
done

# Join: one line per configuration in the bench/ convention.
"$py" - "$tmp/gradd.jsonl" "$tmp/torch.jsonl" "$tmp/load.txt" "$threads" "${OMP_WAIT_POLICY:-}" "$spin" "$core" <<'EOF'
import json, statistics, sys
gradd_path, torch_path, load_path, threads, wait, spin, core = sys.argv[1:8]
def read(path):
    out = {}
    for line in open(path):
        line = line.strip()
        if line:
            rec = json.loads(line)
            out.setdefault(rec["bench"], []).append(rec)
    return out
g, t = read(gradd_path), read(torch_path)
loads = {}
for line in open(load_path):
    b, l = line.split()
    loads.setdefault(b, []).append(float(l))
for bench in g:
    if bench not in t:
        continue
    gv = [r["value"] for r in g[bench]]
    tv = [r["value"] for r in t[bench]]
    gm, tm = statistics.median(gv), statistics.median(tv)
    peer = t[bench][0]["impl"]
    line = {"bench": bench, "metric": "step_ms", "value": round(gm, 4), "unit": "ms", "peer": peer,
            "peer_value": round(tm, 4), "ratio": round(gm / tm, 4), "threads": int(threads),
            "rounds": len(gv), "gradd_rounds": gv, "peer_rounds": tv,
            "gradd_engine_ms": round(statistics.median(r["engine_ms"] for r in g[bench]), 4),
            "peer_torch_threads": [r["torch_threads"] for r in t[bench]],
            "peer_attn": [r["attn"] for r in t[bench]], "peer_foreach": [r["foreach"] for r in t[bench]],
            "omp_wait_policy": wait or "default", "gradd_gomp_spincount": spin or "default",
            "blas_core": core, "gradd_blas_core": sorted({r.get("blas_core", "?") for r in g[bench]}),
            "max_load_average": max(loads.get(bench, [0.0]))}
    print(json.dumps(line, separators=(",", ":")), flush=True)
    print(f"bench/train/run.sh: {bench:16s} gradd {gm:10.3f} ms  {peer} {tm:10.3f} ms  ratio {gm / tm:.3f}",
          file=sys.stderr)
EOF
