# bench/common/ensure_built.sh — sourced by the runners (bench/*/run.sh), not
# run: `ensure_built ROOT BUILD TARGET` sets BUILD up as a release build of
# the source tree ROOT when it is not a build directory yet, then builds
# TARGET there, or says why it cannot and exits.  Progress goes to stderr:
# the callers' stdout is JSON lines.
ensure_built() {
    if [ ! -f "$2/build.ninja" ]; then
        meson setup "$2" "$1" -Dbuildtype=release >&2
    fi
    if ! ninja -C "$2" -t query "$3" >/dev/null 2>&1; then
        # The runner by its path in the tree: every runner is named run.sh.
        me=$(cd "$(dirname "$0")" && pwd)/${0##*/}
        echo "${me#"$1"/}: $2 has no $3 target;" \
             "is subdir('bench') in the top-level meson.build?" >&2
        exit 1
    fi
    ninja -C "$2" "$3" >&2
}
