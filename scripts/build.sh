#!/usr/bin/env bash
# build.sh [BUILD_DIR] [meson options...] — configure once, then build.
# Re-running reconfigures only when options change (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
# The CUDA toolkit's nvcc is not on the default PATH on Debian.
[ -d /usr/local/cuda/bin ] && case ":$PATH:" in *:/usr/local/cuda/bin:*) ;; *) PATH=/usr/local/cuda/bin:$PATH ;; esac
export PATH
if [ -f "$dir/build.ninja" ]; then
  # --reconfigure (not `meson configure`) also accepts options added to
  # meson_options.txt since the directory was set up.
  meson setup --reconfigure "$dir" "$@" >/dev/null
else
  meson setup "$dir" "$@"
fi
ninja -C "$dir"
