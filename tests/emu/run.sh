#!/usr/bin/env bash
# run.sh [tsan] — the emulated flash attention test (both kernel families)
# on every shape it knows (the
# meson test runs the first three), then the emulated cross-entropy,
# layernorm, column-sum and elementwise test (test_kernels_emu.cc) and the
# embedding, softmax, optimizer, GEMM fallback and fill test
# (test_train_emu.cc) and the Llama kernels' test (test_llama_emu.cc), as
# the meson tests run them, built with g++ into /tmp.
#   tsan   under ThreadSanitizer: the CUDA threads of a CTA are real threads
#          here, so a missing __syncthreads shows up as a data race report
#          (about 5x slower).
# Needs the CPU kernels library: scripts/build.sh build/emu -Dtests=enabled.
set -euo pipefail
cd "$(dirname "$0")/../.."
lib=build/emu/kernels/libgraddkernels.a
[ -f "$lib" ] || { echo "run.sh: build $lib first (scripts/build.sh build/emu -Dtests=enabled)" >&2; exit 1; }
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
flags=(-O2)
env=()
if [ "${1:-}" = tsan ]; then
  flags=(-O1 -fsanitize=thread)
  env=(TSAN_OPTIONS=halt_on_error=1)
fi
exe=$(mktemp /tmp/test_flash_emu.XXXXXX)
exe2=$(mktemp /tmp/test_kernels_emu.XXXXXX)
exe3=$(mktemp /tmp/test_train_emu.XXXXXX)
exe4=$(mktemp /tmp/test_llama_emu.XXXXXX)
trap 'rm -f "$exe" "$exe2" "$exe3" "$exe4"' EXIT
build() {
  g++ -std=c++20 -g "${flags[@]}" -Wall -Wextra -Wno-unknown-pragmas -fno-strict-aliasing -DGRADD_CUDA_EMU \
    -I"$cuda_inc" -Itests/emu -Ikernels -Ikernels/cuda "$1" "$lib" -lopenblas -fopenmp -lm -pthread -o "$2"
}
build tests/emu/test_flash_emu.cc "$exe"
build tests/emu/test_kernels_emu.cc "$exe2"
build tests/emu/test_train_emu.cc "$exe3"
build tests/emu/test_llama_emu.cc "$exe4"
env "${env[@]}" "$exe" all
env "${env[@]}" "$exe2"
env "${env[@]}" "$exe3"
env "${env[@]}" "$exe4"
