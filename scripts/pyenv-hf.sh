#!/usr/bin/env bash
# pyenv-hf.sh [DIR] — a virtualenv on the system's python3 with Debian's
# torch (--system-site-packages) and the Hugging Face Trainer from PyPI
# (tests/requirements-hf.txt), for tests/python/test_hf.py, and PEFT
# (tests/requirements-hf-nodeps.txt, without its dependencies), for
# tests/integration/test_peft.py.  Idempotent:
# reinstalls only when the requirements change.  Prints the venv's python
# on stdout; exits 1 (with why on stderr) when it cannot be made, e.g.
# offline, and the test then skips.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build/pyenv-hf}
case $dir in /*) ;; *) dir=$PWD/$dir ;; esac
req=tests/requirements-hf.txt
nodeps=tests/requirements-hf-nodeps.txt
# Written only once every requirement is installed.
stamp=$dir/.requirements
if [ -x "$dir/bin/python" ] && cat "$req" "$nodeps" | cmp -s - "$stamp" 2>/dev/null; then
  echo "$dir/bin/python"
  exit 0
fi
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "pyenv-hf: /usr/bin/python3 has no torch (scripts/deps.sh installs python3-torch)" >&2
  exit 1
fi
if [ -e "$dir" ] && [ ! -f "$dir/pyvenv.cfg" ] && [ -n "$(ls -A "$dir")" ]; then
  echo "pyenv-hf: $dir is not a virtualenv; not replacing it" >&2
  exit 1
fi
rm -rf "$dir"
if ! /usr/bin/python3 -m venv --system-site-packages "$dir" >&2 ||
   ! "$dir/bin/python" -m pip install -q --disable-pip-version-check -r "$req" >&2 ||
   ! "$dir/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$nodeps" >&2; then
  rm -rf "$dir"
  echo "pyenv-hf: could not install $req and $nodeps (offline?)" >&2
  exit 1
fi
cat "$req" "$nodeps" >"$stamp"
echo "$dir/bin/python"
