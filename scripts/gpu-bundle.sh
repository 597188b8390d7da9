#!/usr/bin/env bash
# scripts/gpu-bundle.sh [BUILD_DIR] — build with CUDA and gather what
# scripts/gpu-session.sh needs on the lent GPU machine into .device/ (git
# ignores it): the build's programs and the Debian libraries they load
# (../shared/tools/device-bundle), plus Debian's fortunes as training text,
# packed into .device.tar.xz (git ignores it too).  Then, with the device
# tool: run `scripts/gpu-session.sh $OUT`, carrying .device.tar.xz, which
# the session unpacks: .device itself (75 MiB, OpenBLAS alone 36) is over
# what a call carries (64 MiB with the working tree), packed it is 11.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/gpu}
scripts/build.sh "$build" -Dcuda=enabled -Dbuildtype=release -Dtests=enabled >/dev/null
ninja -C "$build" >/dev/null
bundler=${DEVICE_BUNDLE:-../shared/tools/device-bundle}
mkdir -p "$(git rev-parse --git-dir)/info"
"$bundler" "$build"
# The allocator library for PyTorch programs (alloc/): a library, not a
# program, so the bundler does not gather it; its Debian libraries
# (jansson) are the daemon's, already bundled.
mkdir -p .device/bin/alloc
cp "$build/alloc/libgradd-alloc.so" .device/bin/alloc/
# The shim that installs it in a program's PyTorch, beside it as installed
# (<libdir>/gradd/python); the session's shim step reads the checkout's.
rm -rf .device/bin/alloc/python
cp -r python .device/bin/alloc/python
find .device/bin/alloc/python -name __pycache__ -prune -exec rm -rf {} +
# Our own env.sh over the bundler's: the CUDA runtime is searched for too
# (the module links libcudart.so.13, which the bundle leaves to the
# machine), /opt (the torch venv's nvidia/*/lib) even when it is another
# file system, and the search runs once per machine, not per program.
cat >.device/env.sh <<'ENV'
# Sourced on the GPU machine: bundled Debian libraries first, then that machine's CUDA stack.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
libdirs=/tmp/gradd-device-libdirs
if [ ! -s "$libdirs" ]; then
  { ls -d /usr/local/cuda/lib64 /usr/local/cuda/lib 2>/dev/null
    find / /opt /usr/local -xdev \( -name 'libcudart.so.13' -o -name 'libcublasLt.so.13' -o -name 'libcudnn.so.9' \
      -o -name 'libnccl.so.2' \) -printf '%h\n' 2>/dev/null | sort -u
  } | awk '!seen[$0]++' | tr '\n' ':' >"$libdirs"
fi
export LD_LIBRARY_PATH="$here/lib:$(cat "$libdirs")${LD_LIBRARY_PATH:-}"
export PATH="$here/bin:$PATH"
ENV
mkdir -p .device/data/fortunes
find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' -exec cp {} .device/data/fortunes/ \;
# The CPU's tests stay here: of tests/unit the session runs model_probe
# (the hfllama step's) alone.
find .device/bin/tests/unit -type f ! -name model_probe -delete
rm -rf .device/bin/tests/emu
grep -qxF /.device.tar.xz "$(git rev-parse --git-dir)/info/exclude" || echo /.device.tar.xz >>"$(git rev-parse --git-dir)/info/exclude"
tar -cf - .device | xz -T2 -6 >.device.tar.xz
du -sh .device .device.tar.xz
