#!/usr/bin/env bash
# bench/batch/run.sh [BUILD_DIR] [STEPS] — the batch controller benchmark
# (bench_batch.c): JSON lines on stdout.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-build}
steps=${2:-60}
ninja -C "$dir" bench/batch/bench_batch >/dev/null
exec "$dir/bench/batch/bench_batch" "$steps"
