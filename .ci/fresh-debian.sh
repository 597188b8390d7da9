#!/usr/bin/env bash
# fresh-debian.sh [REPO_DIR_OR_REV] — the README's Quick start commands, as
# the README writes them, run one after the other on a fresh Debian 12: a
# `debootstrap --variant=minbase bookworm` chroot that holds a clone of the
# repository and nothing else.  Fails if any command fails.
#   REPO_DIR_OR_REV  a git checkout (its HEAD is cloned: committed files
#                    only), or a revision of the repository this script is
#                    in; default: that repository's HEAD.
# Needs root (debootstrap, chroot, mounts) and the network (the Debian
# mirror; PyPI for the tests' venv).  Installs debootstrap if missing.
# Environment:
#   DEBIAN_MIRROR    default http://deb.debian.org/debian
#   GRADD_CI_CACHE   where the base system's downloaded .debs are kept
#                    (default /var/cache/gradd-ci), fetched anew after 7
#                    days.  Only downloads are kept: every run installs
#                    the base system and all the scripts add from packages.
#   GRADD_CI_KEEP=1  leave the chroot behind (its path is printed).
set -euo pipefail

# Inside the private mount and PID namespaces made below: mount what a
# booted machine has, then run each command in the chroot.  Every mount
# and every process left (a daemon a test failed to stop) goes with the
# namespaces when this ends, however it ends.
if [ "${1:-}" = --inside ]; then
  root=$2
  shift 2
  # Which processes are in the namespace: the cleanup waits for them all.
  stat -L -c %i /proc/self/ns/pid >"$(dirname "$root")/pidns"
  mount -t proc proc "$root/proc"
  mount --bind /dev "$root/dev"
  mount --bind /dev/pts "$root/dev/pts"
  mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"
  mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$root/sys"
  for c in "$@"; do
    echo "=== fresh-debian: # $c"
    t0=$SECONDS
    rc=0
    # A login's environment, not this script's.  Proxy settings pass so
    # apt and pip reach their servers the way this machine does.
    chroot "$root" /usr/bin/env -i HOME=/root TERM="${TERM:-dumb}" LANG=C.UTF-8 \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      ${http_proxy:+http_proxy=$http_proxy} ${https_proxy:+https_proxy=$https_proxy} \
      ${no_proxy:+no_proxy=$no_proxy} \
      /bin/bash -c "cd /root/gradd && $c" || rc=$?
    echo "=== fresh-debian: '$c' exited $rc after $((SECONDS - t0)) s"
    [ "$rc" = 0 ] || exit "$rc"
  done
  exit 0
fi

here=$(cd "$(dirname "$0")/.." && pwd)
src=${1:-HEAD}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache=${GRADD_CI_CACHE:-/var/cache/gradd-ci}
[ "$(id -u)" = 0 ] || { echo "fresh-debian: needs root (debootstrap, chroot, mount)" >&2; exit 1; }

if ! command -v debootstrap >/dev/null || [ ! -f /usr/share/keyrings/debian-archive-keyring.gpg ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends debootstrap debian-archive-keyring ||
    { apt-get update -q && apt-get install -y -q --no-install-recommends debootstrap debian-archive-keyring; }
fi

work=$(mktemp -d "${TMPDIR:-/var/tmp}/gradd-fresh-debian.XXXXXX")
child=
cleanup() {
  # unshare ignores SIGINT and SIGTERM while it waits; killed, it takes
  # the namespace's first process with it (--kill-child), and the kernel
  # then kills every other process in the namespace.  They die a moment
  # later; the chroot is removed only once none is left.
  if [ -n "$child" ]; then
    echo "fresh-debian: stopping everything in the chroot" >&2
    kill -KILL "$child" 2>/dev/null || true
    wait "$child" 2>/dev/null || true
  fi
  if [ -s "$work/pidns" ]; then
    ns=$(cat "$work/pidns")
    for _ in $(seq 300); do
      grep -qxF "$ns" <<<"$(stat -L -c %i /proc/[0-9]*/ns/pid 2>/dev/null || true)" || break
      sleep 0.1
    done
  fi
  if [ "${GRADD_CI_KEEP:-}" = 1 ]; then
    echo "fresh-debian: chroot kept in $work/root"
  else
    # Nothing is mounted here (the mounts lived in the namespace); even
    # so, never cross into another file system.
    rm -rf --one-file-system "$work"
  fi
  rm -f "${tarball:-/nonexistent}.$$"
}
trap cleanup EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
root=$work/root
start=$SECONDS

# The tree under test: committed files only, as a user's clone has them.
if [ -d "$src" ]; then
  git clone -q "$src" "$work/gradd"
else
  git clone -q --no-checkout "$here" "$work/gradd"
  git -C "$work/gradd" checkout -q --detach "$(git -C "$here" rev-parse --verify "$src^{commit}")"
fi
echo "=== fresh-debian: testing $(git -C "$work/gradd" log -1 --format='%h %s')"

# The commands, from the Quick start's first sh block in that tree's
# README, without their comments: a change to the README is what is tested.
mapfile -t cmds < <(awk '/^## /{q = ($0 == "## Quick start")} q && /^```sh/{b=1; next} b && /^```/{exit} b' \
  "$work/gradd/README.md" | sed 's/[[:space:]]*#.*$//; /^[[:space:]]*$/d')
((${#cmds[@]} > 0)) || { echo "fresh-debian: no sh block under README.md's '## Quick start'" >&2; exit 1; }

# The base system, from downloads cached for a week.
arch=$(dpkg --print-architecture)
tarball=$cache/bookworm-minbase-$arch.tgz
mkdir -p "$cache"
if [ -z "$(find "$tarball" -mtime -7 2>/dev/null)" ]; then
  rm -rf "$work/dl"
  debootstrap --variant=minbase --make-tarball="$tarball.$$" bookworm "$work/dl" "$mirror" >/dev/null
  mv "$tarball.$$" "$tarball"
  rm -rf "$work/dl"
fi
debootstrap --variant=minbase --unpack-tarball="$tarball" bookworm "$root" "$mirror" >/dev/null
# What a machine on this network has: its name servers, and the CAs it
# trusts, which may include a proxy's that pip must trust to reach PyPI.
# The local ones go where update-ca-certificates finds them again when
# scripts/deps.sh installs ca-certificates and the bundle is rebuilt.
cp /etc/resolv.conf "$root/etc/resolv.conf"
mkdir -p "$root/etc/ssl/certs" "$root/usr/local/share/ca-certificates"
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
if [ -d /usr/local/share/ca-certificates ]; then
  cp -r /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
fi
mv "$work/gradd" "$root/root/gradd"
echo "=== fresh-debian: bookworm minbase ready in $((SECONDS - start)) s"

# In the background so that a signal to this script runs its traps at
# once instead of after the commands.
unshare --mount --propagation private --pid --fork --kill-child "$BASH" "$0" --inside "$root" "${cmds[@]}" &
child=$!
rc=0
wait "$child" || rc=$?
child=
echo "=== fresh-debian: $([ "$rc" = 0 ] && echo PASS || echo "FAIL ($rc)") in $((SECONDS - start)) s"
exit "$rc"
