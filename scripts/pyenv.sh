#!/usr/bin/env bash
# pyenv.sh [DIR] — a virtualenv with the PyPI packages the tests read gradd's
# outputs with (tests/requirements.txt).  Idempotent: reinstalls only when
# the requirements change.  Prints the venv's python on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build/pyenv}
case $dir in /*) ;; *) dir=$PWD/$dir ;; esac
req=tests/requirements.txt
# Written only once every requirement is installed: a venv without it (or
# with older requirements) is unfinished, whatever else is in it.
stamp=$dir/.requirements
if [ -x "$dir/bin/python" ] && cmp -s "$req" "$stamp" 2>/dev/null; then
  echo "$dir/bin/python"
  exit 0
fi
# A venv whose pip does not run (python3 -m venv stopped half-way, e.g.
# without python3-venv's ensurepip) cannot repair itself: make it anew.
if ! "$dir/bin/python" -m pip --version >/dev/null 2>&1; then
  if [ -e "$dir" ] && [ ! -f "$dir/pyvenv.cfg" ] && [ -n "$(ls -A "$dir")" ]; then
    echo "pyenv: $dir is not a virtualenv; not replacing it" >&2
    exit 1
  fi
  rm -rf "$dir"
  if ! python3 -m venv "$dir" >&2; then
    rm -rf "$dir"
    echo "pyenv: python3 -m venv failed (scripts/deps.sh installs python3-venv)" >&2
    exit 1
  fi
fi
"$dir/bin/python" -m pip install -q --disable-pip-version-check -r "$req" >&2
cp "$req" "$stamp"
echo "$dir/bin/python"
