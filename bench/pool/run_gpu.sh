#!/usr/bin/env bash
# bench/pool/run_gpu.sh TRACE_OR_BUILD — the pool trace on one GPU: gradd's
# pool (fixed and expandable segments) against cudaMalloc, cudaMallocAsync
# and PyTorch's caching allocator, in the same run.
#
# TRACE_OR_BUILD is either
#   a build directory (build/hb) or a device bundle's bin/ (.device/bin, from
#   shared/tools/device-bundle): bench/pool/bench_pool_cuda and
#   daemon/gradd-cuda.so under it; the trace is its bench/pool/trace.txt,
#   else generated with bench/pool/gen_trace.py (deterministic: the same file
#   either way); or
#   a trace file: the program is then $BENCH_POOL_CUDA, else
#   .device/bin/bench/pool/bench_pool_cuda, else
#   build/hb/bench/pool/bench_pool_cuda.
#
# Steps: bench_pool_cuda (bench_pool_cuda.c), then peer_torch_gpu.py on the
# same trace, then join_peer.py (all three in bench/pool/).  stdout:
# bench_pool_cuda's JSON lines (peers cudaMallocAsync, cudaMalloc, ideal),
# then one line per gradd bench and metric with peer "torch" (torch._C's
# caching-allocator bindings, the calls torch.cuda.caching_allocator_alloc/
# delete make) and "torch_public_api" (those functions themselves); ratio =
# gradd / peer, < 1: gradd better.  The torch figures are host time per
# call timed from Python, corrected for the Python call overhead (see each
# line's peer_note).  stderr: both programs' tables.
#
# Environment:
#   REPEAT=5              repeats of each side (figures: the median run)
#   DEVICE=0              CUDA device ordinal, both sides
#   BENCH_ARGS, PEER_ARGS extra arguments for bench_pool_cuda / the torch peer
#   TORCH_PYTHON          the python with torch (default python3, else
#                         /opt/torch/.venv/bin/python3)
#   DEVICE_ENV            a device bundle's env.sh, sourced for bench_pool_cuda
#                         only (default: BUNDLE/env.sh when the program is
#                         BUNDLE/bin/bench/pool/bench_pool_cuda)
#   GRADD_LD_LIBRARY_PATH put before LD_LIBRARY_PATH for bench_pool_cuda only
#                         (default, without a bundle: where this machine keeps
#                         libcudart.so.13 and libcublasLt.so.13, under
#                         /usr/local/cuda and /opt/torch/.venv, if the program
#                         or gradd-cuda.so cannot find them as they are)
#                         The torch peer runs in the caller's environment, so
#                         none of this reaches that machine's Python.
#   RESULTS_DIR           also keep gradd.jsonl, torch.jsonl, joined.jsonl and
#                         the stderr logs there
# Exit: 0; 77 where there is no usable GPU (bench_pool_cuda's skip); else 1.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
if [ $# -lt 1 ]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
fi
arg=$1
repeat=${REPEAT:-5}
device=${DEVICE:-0}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench_pool_gpu.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

if [ -d "$arg" ]; then
    base=$(cd "$arg" && pwd)
    exe=$base/bench/pool/bench_pool_cuda
    trace=$base/bench/pool/trace.txt
else
    base=
    trace=$arg
    exe=${BENCH_POOL_CUDA:-}
    if [ -z "$exe" ]; then
        for c in "$root/.device/bin/bench/pool/bench_pool_cuda" "$root/build/hb/bench/pool/bench_pool_cuda"; do
            if [ -x "$c" ]; then exe=$c; break; fi
        done
    fi
fi
if [ -z "$exe" ] || [ ! -x "$exe" ]; then
    echo "bench/pool/run_gpu.sh: no bench_pool_cuda (${exe:-none found}); build it with" \
         "scripts/build.sh BUILD -Dcuda=enabled, or set BENCH_POOL_CUDA" >&2
    exit 1
fi
if [ ! -s "$trace" ]; then
    if [ -n "$base" ]; then
        trace=$tmp/trace.txt
        echo "bench/pool/run_gpu.sh: generating the trace with bench/pool/gen_trace.py" >&2
        python3 "$here/gen_trace.py" -o "$trace"
    else
        echo "bench/pool/run_gpu.sh: no trace at $trace" >&2
        exit 1
    fi
fi
# bench_pool_cuda's libraries: a device bundle's env.sh when the program
# comes from one (BUNDLE/bin/bench/pool/bench_pool_cuda), else, only if the
# program or the module cannot find libcudart / libcublasLt, the folders
# that hold them on this machine.  Either way for bench_pool_cuda alone.
env_sh=${DEVICE_ENV:-}
bundle=$(cd "$(dirname "$exe")/../../.." && pwd)
if [ -z "$env_sh" ] && [ -f "$bundle/env.sh" ]; then
    env_sh=$bundle/env.sh
fi
gradd_ld=${GRADD_LD_LIBRARY_PATH:-}
if [ -z "$env_sh" ] && [ -z "$gradd_ld" ] &&
    ldd "$exe" "$(dirname "$exe")/../../daemon/gradd-cuda.so" 2>/dev/null | grep -q 'not found'; then
    gradd_ld=$(find /usr/local/cuda/ /opt/torch/.venv/ -xdev \( -name libcudart.so.13 -o \
        -name libcublasLt.so.13 \) -printf '%h\n' 2>/dev/null | sort -u | tr '\n' ':')
    gradd_ld=${gradd_ld%:}
fi

# ---- gradd's side ----
echo "bench/pool/run_gpu.sh: $exe on $trace${env_sh:+ (environment: $env_sh)}${gradd_ld:+ (libraries: $gradd_ld)}" >&2
set +e
(
    if [ -n "$env_sh" ]; then . "$env_sh"; fi
    if [ -n "$gradd_ld" ]; then export LD_LIBRARY_PATH="$gradd_ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
    # shellcheck disable=SC2086
    exec "$exe" "$trace" --repeat "$repeat" --device "$device" ${BENCH_ARGS:-}
) >"$tmp/gradd.jsonl" 2> >(tee "$tmp/gradd.err" >&2)
rc=$?
set -e
wait  # for tee
if [ "$rc" -eq 77 ]; then
    echo "bench/pool/run_gpu.sh: skipped: bench_pool_cuda found no usable GPU" >&2
    exit 77
fi
if [ "$rc" -ne 0 ]; then
    echo "bench/pool/run_gpu.sh: bench_pool_cuda failed (exit $rc)" >&2
    exit 1
fi
cat "$tmp/gradd.jsonl"

# ---- torch's side ----
py=${TORCH_PYTHON:-python3}
if ! "$py" -c 'import torch' 2>/dev/null; then
    if [ -z "${TORCH_PYTHON:-}" ] && [ -x /opt/torch/.venv/bin/python3 ]; then
        py=/opt/torch/.venv/bin/python3
    else
        echo "bench/pool/run_gpu.sh: $py cannot import torch; set TORCH_PYTHON" >&2
        exit 1
    fi
fi
echo "bench/pool/run_gpu.sh: torch peer with $py" >&2
set +e
# shellcheck disable=SC2086
"$py" "$here/peer_torch_gpu.py" "$trace" --repeat "$repeat" --device "$device" ${PEER_ARGS:-} \
    >"$tmp/torch.jsonl" 2> >(tee "$tmp/torch.err" >&2)
rc=$?
set -e
wait
if [ "$rc" -ne 0 ]; then
    echo "bench/pool/run_gpu.sh: the torch peer failed (exit $rc); gradd's lines above stand alone" >&2
    exit 1
fi

# ---- the join ----
python3 "$here/join_peer.py" "$tmp/gradd.jsonl" "$tmp/torch.jsonl" | tee "$tmp/joined.jsonl"
if [ -n "${RESULTS_DIR:-}" ]; then
    mkdir -p "$RESULTS_DIR"
    cp "$tmp"/gradd.jsonl "$tmp"/torch.jsonl "$tmp"/joined.jsonl "$tmp"/*.err "$RESULTS_DIR"/
fi
