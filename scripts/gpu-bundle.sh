#!/usr/bin/env bash
# scripts/gpu-bundle.sh [BUILD_DIR] — build with CUDA and gather what
# scripts/gpu-session.sh needs on the lent GPU machine into .device/ (git
# ignores it): the build's programs and the Debian libraries they load
# (../shared/tools/device-bundle), plus Debian's fortunes as training text.
# Then, with the device tool: run `scripts/gpu-session.sh $OUT`, carrying .device.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/gpu}
scripts/build.sh "$build" -Dcuda=enabled -Dbuildtype=release -Dtests=enabled >/dev/null
ninja -C "$build" >/dev/null
bundler=${DEVICE_BUNDLE:-../shared/tools/device-bundle}
mkdir -p "$(git rev-parse --git-dir)/info"
"$bundler" "$build"
mkdir -p .device/data/fortunes
find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' -exec cp {} .device/data/fortunes/ \;
du -sh .device
