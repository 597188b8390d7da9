# bench/common/quiet.sh — sourced by the CPU runners, not run: `wait_quiet
# NAME` waits up to $QUIET_WAIT seconds (default 120; 0: not at all) for the
# machine to go quiet, /proc/pressure/cpu "some avg10" below $QUIET_PSI %
# (default 10), saying so on stderr under NAME.  Then it returns either
# way: on a 2-core box other work on the cores swamps the figures, and a
# run that measures anyway says how busy the machine was.
wait_quiet() {
    [ "${QUIET_WAIT:-120}" -gt 0 ] && [ -r /proc/pressure/cpu ] || return 0
    waited=0
    while :; do
        psi=$(sed -n 's/^some avg10=\([0-9.]*\).*/\1/p' /proc/pressure/cpu)
        if [ "${psi%.*}" -lt "${QUIET_PSI:-10}" ]; then
            [ "$waited" -gt 0 ] && echo "$1: quiet after ${waited}s (cpu pressure $psi%)" >&2
            return 0
        fi
        if [ "$waited" -ge "${QUIET_WAIT:-120}" ]; then
            echo "$1: still busy after ${waited}s (cpu pressure $psi%); measuring anyway" >&2
            return 0
        fi
        [ "$waited" -eq 0 ] && echo "$1: waiting for the machine to go quiet (cpu pressure $psi%)" >&2
        sleep 5
        waited=$((waited + 5))
    done
}
