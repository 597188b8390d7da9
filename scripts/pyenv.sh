#!/usr/bin/env bash
# pyenv.sh [DIR] — a virtualenv with the PyPI packages the tests read gradd's
# outputs with (tests/requirements.txt).  Idempotent: reinstalls only when
# the requirements change.  Prints the venv's python on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build/pyenv}
req=tests/requirements.txt
stamp=$dir/.requirements
if [ ! -x "$dir/bin/python" ]; then
  python3 -m venv "$dir" >&2
fi
if ! cmp -s "$req" "$stamp" 2>/dev/null; then
  "$dir/bin/python" -m pip install -q --disable-pip-version-check -r "$req" >&2
  cp "$req" "$stamp"
fi
echo "$PWD/$dir/bin/python"
