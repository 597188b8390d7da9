#!/usr/bin/env bash
# test.sh [--sanitize] — install missing packages, build, run the whole suite.
#   (default)    build/test with -Werror
#   --sanitize   build/asan with AddressSanitizer + UndefinedBehaviorSanitizer
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
py=$(scripts/pyenv.sh)
# The Trainer test's venv; without it (offline) that test skips.
hf=$(scripts/pyenv-hf.sh) || hf=
if [ "${1:-}" = "--sanitize" ]; then
  dir=build/asan
  opts=(-Dwerror=true -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug)
  # Fail on the first report; LSan checks every process at exit.
  export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
else
  dir=build/test
  opts=(-Dwerror=true)
fi
scripts/build.sh "$dir" "${opts[@]}" -Dpython_venv="$py" -Dhf_venv="$hf"
# Every test process's GEMMs on the OpenBLAS kernels gradd runs (doc/gradd.8,
# OPENBLAS_CORETYPE), not only gradd's: where OpenBLAS falls back to its
# generic ones, the unit tests' training steps take twice as long.
. bench/common/blas_core.sh
core=${OPENBLAS_CORETYPE:-$(blas_core "$dir/daemon/gradd")}
if [ -n "$core" ]; then export OPENBLAS_CORETYPE=$core; fi
meson test -C "$dir" --print-errorlogs --num-processes 2
