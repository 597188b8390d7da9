#!/bin/sh
# bench/dist/run.sh [BUILD_DIR] — data parallel on this machine's cores:
# gradd run as 2 ranks under mpirun (1 thread each) against one process
# with 2 threads, and PyTorch's DistributedDataParallel (gloo) the same
# way, in the same run.
#
# The model is bench/train's gpt_small (6 layers, width 384, 6 heads,
# context 256, vocab 256), batch 8 (4 per rank, no accumulation), fp32, on
# fortunes' text.  Three JSON lines on stdout:
#   {"bench":"dist_gpt_small","metric":"step_ms_2ranks",...}  the step of 2
#     ranks; ratio gradd/torch, < 1: gradd faster
#   {"bench":"dist_gpt_small","metric":"speedup_2ranks",...}  one process
#     with 2 threads over 2 ranks of 1 thread (> 1: the ranks are faster);
#     ratio torch's/gradd's, < 1: gradd gains more
#   {"bench":"dist_gpt_small","metric":"allreduce_wait_ms_2ranks",...}
#     what the 2 ranks still wait for the gradients' sum after the backward
#     with 4 MB buckets started during it, against gradd with
#     allreduce_bucket = 0 (all of it after the backward); ratio < 1: the
#     buckets hide some of the sum
# Each side's figure is the median ms per step over STEPS (15) steps after
# WARMUP (3); PEER_PYTHON (/usr/bin/python3) runs the peer.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$root/bench/common/ensure_built.sh"
. "$root/bench/common/blas_core.sh"
build=${1:-$root/build/bench}
case $build in /*) ;; *) build=$root/$build ;; esac
ensure_built "$root" "$build" daemon/gradd
gradd=$build/daemon/gradd
core=$(blas_core "$gradd") # the peer's GEMMs on gradd's OpenBLAS kernels
peer_python=${PEER_PYTHON:-/usr/bin/python3}
warmup=${WARMUP:-3}
steps=${STEPS:-15}
command -v mpirun >/dev/null || { echo "bench/dist: mpirun not found (openmpi-bin)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# job NAME MICRO THREADS [BUCKET]: a job file whose metrics go to $work/NAME.
job() {
    cat >"$work/$1.cfg" <<JOB
[job]
name = $1
device = cpu
allreduce_bucket = ${4:-25M}
[model]
type = gpt
layers = 6
heads = 6
width = 384
context = 256
vocab = 256
[data]
format = text
train = /usr/share/games/fortunes/fortunes
val_fraction = 0.05
[train]
steps = $((warmup + steps))
batch = 8
micro_batch = $2
threads = $3
eval_batches = 1
[output]
dir = $work/$1
log_every = 1
JOB
    echo "$work/$1.cfg"
}

# The median KEY (default step_ms) of a run's steps after the warmup.
median_ms() {
    python3 - "$1" "$warmup" "${2:-step_ms}" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step_ms"' in l]
print(statistics.median(r[sys.argv[3]] for r in rows[int(sys.argv[2]):]))
PY
}

"$gradd" run "$(job one 8 2)" >/dev/null 2>"$work/one.err" || { cat "$work/one.err" >&2; exit 1; }
mpirun -np 2 "$gradd" run "$(job two 4 1)" >/dev/null 2>"$work/two.err" || { cat "$work/two.err" >&2; exit 1; }
g1=$(median_ms "$work/one/metrics.jsonl")
g2=$(median_ms "$work/two/metrics.jsonl")
echo "gradd: 1 process x 2 threads $g1 ms, 2 ranks x 1 thread $g2 ms" >&2
for b in 4M 0; do
    mpirun -np 2 "$gradd" run "$(job "b$b" 4 1 "$b")" >/dev/null 2>"$work/b$b.err" || { cat "$work/b$b.err" >&2; exit 1; }
done
w4=$(median_ms "$work/b4M/metrics.jsonl" allreduce_wait_ms)
w0=$(median_ms "$work/b0/metrics.jsonl" allreduce_wait_ms)
s4=$(median_ms "$work/b4M/metrics.jsonl")
s0=$(median_ms "$work/b0/metrics.jsonl")
echo "gradd 2 ranks: 4 MB buckets wait $w4 ms (step $s4 ms), one sum after the backward $w0 ms (step $s0 ms)" >&2

peer() {
    env ${core:+OPENBLAS_CORETYPE=$core} OPENBLAS_NUM_THREADS=$2 "$peer_python" "$here/peer_ddp.py" --ranks "$1" --threads "$2" --batch 8 \
        --warmup "$warmup" --steps "$steps"
}
p1=$(peer 1 2)
p2=$(peer 2 1)
echo "torch: $p1 / $p2" >&2

python3 - "$g1" "$g2" "$p1" "$p2" "$w4" "$w0" "$s4" "$s0" "$core" <<'PY'
import json, sys
core = sys.argv[9]
g1, g2 = float(sys.argv[1]), float(sys.argv[2])
w4, w0, s4, s0 = (float(x) for x in sys.argv[5:9])
p1, p2 = json.loads(sys.argv[3]), json.loads(sys.argv[4])
t1, t2 = p1["step_ms"], p2["step_ms"]
peer = p2["impl"]
print(json.dumps({"bench": "dist_gpt_small", "metric": "step_ms_2ranks", "value": round(g2, 3), "unit": "ms",
                  "peer": peer, "peer_value": round(t2, 3), "ratio": round(g2 / t2, 3), "threads_per_rank": 1,
                  "blas_core": core}))
print(json.dumps({"bench": "dist_gpt_small", "metric": "speedup_2ranks", "value": round(g1 / g2, 3), "unit": "x",
                  "peer": peer, "peer_value": round(t1 / t2, 3), "ratio": round((t1 / t2) / (g1 / g2), 3),
                  "one_process_ms": round(g1, 3), "peer_one_process_ms": round(t1, 3), "blas_core": core}))
print(json.dumps({"bench": "dist_gpt_small", "metric": "allreduce_wait_ms_2ranks", "value": round(w4, 3), "unit": "ms",
                  "peer": "gradd allreduce_bucket=0", "peer_value": round(w0, 3), "ratio": round(w4 / w0, 3),
                  "step_ms": round(s4, 3), "peer_step_ms": round(s0, 3)}))
PY
