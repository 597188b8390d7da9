#!/usr/bin/env bash
# quickstart.sh — from a fresh Debian machine to a running gradd:
# install what is missing, build, start gradd in the foreground on a
# temporary socket, ask it for its status and memory statistics, stop it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build/release -Dbuildtype=release >/dev/null
bin=build/release

tmp=$(mktemp -d /tmp/gradd-quickstart.XXXXXX)
sock=$tmp/gradd.sock
cleanup() {
  [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

echo "== starting gradd on $sock (log: $tmp/gradd.log)"
"$bin/daemon/gradd" -c etc/gradd.conf -s "$sock" --state-dir "$tmp/state" >"$tmp/gradd.log" 2>&1 &
pid=$!
for _ in $(seq 100); do
  [ -S "$sock" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$tmp/gradd.log"; exit 1; }
  sleep 0.05
done

echo "== gradctl status"
"$bin/client/gradctl" -s "$sock" status
echo
echo "== gradctl stats"
"$bin/client/gradctl" -s "$sock" stats
echo
echo "== stopping gradd"
kill -TERM "$pid"
wait "$pid"
pid=
tail -n 3 "$tmp/gradd.log"
