#!/bin/sh
# bench/kernels/run.sh [BUILD_DIR] [THREADS [B T C NH V L]] — where a CPU
# training step's time goes, op by op (bench_kernels.c): JSON lines on
# stdout.  No peer: bench/train compares whole steps with PyTorch.
#
# BUILD_DIR (default: build/bench under the source root) is set up as a
# release build when it does not exist yet.  The GPU variant,
# bench_kernels_cuda MODULE PRECISION [B T C NH V L], runs from
# scripts/gpu-session.sh (STEPS=kernels).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$root/bench/common/ensure_built.sh"
build=${1:-$root/build/bench}
[ $# -gt 0 ] && shift
case $build in /*) ;; *) build=$PWD/$build ;; esac

ensure_built "$root" "$build" bench/kernels/bench_kernels
exec "$build/bench/kernels/bench_kernels" "$@"
