# bench/common/blas_core.sh — sourced by the runners and scripts/test.sh, not run:
# `blas_core GRADD` prints the OpenBLAS kernels that GRADD runs its CPU
# GEMMs on (the second line of its --version), for the peer's
# OPENBLAS_CORETYPE (or the tests'): where gradd chose the CPU's own
# kernels over OpenBLAS's generic fallback (kernels/cpu/ctx.c), the peer,
# on the same OpenBLAS, gets them too.
blas_core() {
    "$1" --version | sed -n "s/^cpu GEMMs: OpenBLAS's \([^ ]*\) kernels.*/\1/p"
}
