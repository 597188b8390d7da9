#!/bin/sh
# bench/pool/run.sh [BUILD_DIR] — build, generate the trace, run the pool benchmark.
#
# JSON lines (one per figure) go to stdout, a human summary to stderr.
# BUILD_DIR (default: build/bench under the source root) is set up as a
# release build when it does not exist yet.  Extra arguments after BUILD_DIR go to bench_pool
# (e.g. --repeat 5, --no-timeline, --only pool,jemalloc).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$root/bench/common/ensure_built.sh"
if [ $# -gt 0 ]; then
    build=$1
    shift
    case $build in
        /*) ;;
        *) build=$PWD/$build ;;
    esac
else
    build=$root/build/bench
fi

ensure_built "$root" "$build" bench/pool/bench_pool

trace=$build/bench/pool/trace.txt
if [ ! -s "$trace" ]; then
    # The build's own rule (bench/pool/meson.build: pool_trace_txt) when it can,
    # the script directly otherwise; the trace is the same either way.
    ninja -C "$build" bench/pool/trace.txt >&2 ||
        python3 "$here/gen_trace.py" -o "$trace"
fi

exec "$build/bench/pool/bench_pool" "$trace" "$@"
