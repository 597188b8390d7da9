#!/bin/sh
# bench/control/run.sh [BUILD_DIR] — gradd's control plane under load while a
# job trains (issue 5, "control-plane load"): the training step's slowdown
# with 50 clients issuing 1,000 status/list requests/s against the same job
# with no clients (same run), the p50/p99 request latency, and whether 1,000
# concurrent connections are all answered.
#
# Builds gradd and gradctl in BUILD_DIR (default: build/ctl under the source
# root, set up as a release build when it does not exist yet), then runs
# bench_control.py with the python3 on PATH (stdlib only).  JSON lines go to
# stdout, progress and CPU figures to stderr.  Extra arguments after
# BUILD_DIR go to bench_control.py (e.g. --phase 15 --rate 1000 --clients 50).
#
# Environment:
#   QUIET_WAIT=120  first wait up to this many seconds for the machine to go
#                   quiet (/proc/pressure/cpu "some avg10" below QUIET_PSI=10 %);
#                   0 disables.  On a 2-core box other work on the cores
#                   swamps the slowdown; the JSON line's other_cpu_pct_* say
#                   how much CPU the rest of the machine took in each phase.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$root/bench/common/quiet.sh"
build=${1:-$root/build/ctl}
[ $# -gt 0 ] && shift
case $build in
    /*) ;;
    *) build=$PWD/$build ;;
esac

if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" "$root" -Dbuildtype=release >&2
fi
ninja -C "$build" daemon/gradd client/gradctl >&2

wait_quiet bench/control/run.sh
echo "bench/control/run.sh: load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2

exec python3 "$here/bench_control.py" --gradd "$build/daemon/gradd" --gradctl "$build/client/gradctl" "$@"
