/* kern_ws.h — the CPU kernels, plus a GEMM workspace taken from the
 * caller's scratch callbacks around every matmul, as the CUDA backend takes
 * cuBLASLt's.  On the simulated device this makes a training step allocate
 * in its middle, so tests and benchmarks can run it out of memory there
 * (the plain CPU kernels need no scratch at all).  When the workspace is
 * refused the matmul is skipped, as CUDA's sticky error would skip it. */
#ifndef GRADD_TEST_KERN_WS_H
#define GRADD_TEST_KERN_WS_H

#include <stddef.h>

#include "kernels.h"

/* Workspace per matmul: fixed + per_row × N × OC × 4 bytes.  Call before
 * kern_ws_ops; the table is built once. */
const kern_ops *kern_ws_ops(size_t fixed_bytes, size_t row_factor);

#endif
