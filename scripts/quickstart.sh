#!/usr/bin/env bash
# quickstart.sh — from a fresh Debian machine to a trained model:
# install what is missing, build, start gradd in the foreground on a
# temporary socket, submit etc/jobs/fortunes-gpt.cfg (a small GPT on
# Debian's fortunes, a few minutes on a CPU), watch it train, then show the
# final loss, text sampled from the trained model, and the memory pool's
# summary, and stop the daemon.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build/release -Dbuildtype=release >/dev/null
bin=build/release
job=${1:-etc/jobs/fortunes-gpt.cfg}

tmp=$(mktemp -d /tmp/gradd-quickstart.XXXXXX)
sock=$tmp/gradd.sock
cleanup() {
  if [ -n "${pid:-}" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# A second run trains again: the job refuses an output directory that
# holds a finished run ([output] resume = auto), so an earlier run's model
# is moved aside, not written over.  An interrupted run is continued.
outdir=$(awk -F= '/^[[:space:]]*\[/ { sec = $0; gsub(/[][[:space:]]/, "", sec) }
  sec == "output" && $1 ~ /^[[:space:]]*dir[[:space:]]*$/ { v = $2; gsub(/^[[:space:]]+|[[:space:]]+$/, "", v); print v }' "$job")
if [ -n "$outdir" ]; then
  case $outdir in /*) ;; *) outdir=$(dirname "$job")/$outdir ;; esac
  if [ -f "$outdir/model.safetensors" ]; then
    aside=$outdir.$(date +%Y%m%d-%H%M%S)
    mv "$outdir" "$aside"
    echo "== an earlier run's model moved aside to $(realpath --relative-to=. "$aside")"
  fi
fi

echo "== gradd starting on $sock (log: $tmp/gradd.log)"
"$bin/daemon/gradd" -c etc/gradd.conf -s "$sock" --state-dir "$tmp/state" >"$tmp/gradd.log" 2>&1 &
pid=$!
for _ in $(seq 200); do
  [ -S "$sock" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$tmp/gradd.log"; exit 1; }
  sleep 0.05
done
ctl() { "$bin/client/gradctl" -s "$sock" "$@"; }

ctl status
echo
echo "== gradctl submit $job"
id=$(ctl --json submit "$job" | sed -n 's/.*"id":\([0-9]*\).*/\1/p')
echo "job $id queued"
echo "== gradctl watch $id"
ctl watch "$id"
echo
echo "== gradctl status $id"
ctl status "$id"
echo
json=$(ctl --json status "$id")
num() { printf '%s' "$json" | sed -n "s/.*\"$1\":\([-0-9.eE+]*\).*/\1/p"; }
printf '== final loss: %.3f (train), %.3f (validation); guessing among 256 bytes scores 5.545\n' "$(num loss)" "$(num val_loss)" 2>/dev/null || true
echo
echo "== gradctl sample $id --tokens 400 --seed 1 (text from the model it just trained)"
ctl sample "$id" --tokens 400 --temperature 0.8 --seed 1
echo
echo "== gradctl stats (the pool after the job: what it reserved, peaked at, and cached)"
ctl stats
echo
echo "== stopping gradd"
kill -TERM "$pid"
wait "$pid"
pid=
