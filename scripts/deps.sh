#!/usr/bin/env bash
# deps.sh — install the Debian packages gradd needs, only those missing.
# Idempotent: a second run installs nothing and prints nothing but a summary.
set -euo pipefail

pkgs=(
  gcc g++ pkg-config meson ninja-build python3
  libuv1-dev libprotobuf-c-dev protobuf-c-compiler libsystemd-dev libinih-dev
  libopenblas-dev libcmocka-dev libjemalloc-dev zlib1g-dev libjansson-dev libsmartcols-dev scdoc
  clang libclang-rt-14-dev
  # One job as several ranks: `gradd run` under mpirun (tests/integration/test_dist).
  openmpi-bin libopenmpi-dev
  fortunes dataset-fashion-mnist
  # What the tests run beyond the build: python3 -m venv (scripts/pyenv.sh),
  # systemd-analyze and systemd-socket-activate (test_systemd), setpriv
  # (test_service_user).  A minimal Debian (debootstrap, a container) lacks
  # the first two.  python3-torch (CPU-only): the allocator shim's and the
  # `gradd` Python package's tests (tests/python), and the Trainer test's
  # venv (scripts/pyenv-hf.sh).
  python3-venv systemd util-linux python3-torch
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "deps: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "deps: installing ${missing[*]}"
sudo=()
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
# A fresh machine has no package lists yet; refresh them once if apt can't
# find what we ask for.
if ! "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"; then
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
