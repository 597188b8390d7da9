/* opbench.h — what the op-by-op benchmarks share (bench_kernels.c: a GPT
 * step; bench_llama_kernels.c: a Llama step): the backend (the CPU
 * kernels, or with BENCH_CUDA the gradd-cuda module's), buffers in its
 * memory, the timing of one op (best of OB_R calls, each to its
 * completion) and the JSON lines.
 *
 * Each benchmark's executable compiles opbench.c with its own BENCH_CUDA
 * and BENCH_NAME, so there is one backend per process: the state below is
 * the process's. */
#ifndef GRADD_OPBENCH_H
#define GRADD_OPBENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels.h"

extern const kern_ops *ob_ops;
extern kern_ctx *ob_k;
extern kern_precision ob_prec;

/* argv as the benchmark takes it: THREADS (cpu) or MODULE PRECISION (cuda),
 * then the shape, from argv[*first] on.  0 with ob_ops and ob_k set, or the
 * exit status (77: no usable GPU).  `usage`: the shape's part of the usage
 * line. */
int ob_open(int argc, char **argv, const char *usage, int *first);

double ob_now_ms(void);
/* Memory of the backend (exits when there is none); n values in [-0.5,
 * 0.5), or their squares; the same rounded to the context's 16-bit type by
 * the backend's own cast; n token ids below V. */
void *ob_alloc(size_t bytes);
void ob_free(void *p);
/* Everything the calls above and ob_tensors_init took, and the context. */
void ob_close(void);
float *ob_buf(size_t n);
float *ob_buf_sq(size_t n);
uint16_t *ob_buf16(size_t n);
int32_t *ob_tokens(size_t n, int V);
/* The context's 16-bit cast (bf16 unless fp16), as the models narrow. */
void ob_narrow(uint16_t *dst, const float *src, size_t n);

/* ---- timings -------------------------------------------------------------------------- */

enum { OB_GEMM, OB_ATTENTION, OB_REST };

typedef struct {
    const char *metric;
    double ms;
    int per_step; /* calls in one training step (0: shown, not part of the step) */
    int part;
} ob_time;

#define OB_MAX_OPS 64
#define OB_R 5
void ob_record(const char *metric, double ms, int per_step, int part);
/* Exits on the backend's error, naming the metric. */
void ob_check(const char *metric);

/* Time the statement (best of OB_R calls, each to its completion) and
 * record it as `metric`, made per_step times in a step. */
#define OB_OP(metric_, per_step_, part_, stmt)                                                                  \
    do {                                                                                                        \
        double best_ = 1e30;                                                                                    \
        for (int r_ = 0; r_ < OB_R; r_++) {                                                                     \
            double t0_ = ob_now_ms();                                                                           \
            stmt;                                                                                               \
            ob_check(metric_);                                                                                  \
            double dt_ = ob_now_ms() - t0_;                                                                     \
            if (dt_ < best_)                                                                                    \
                best_ = dt_;                                                                                    \
        }                                                                                                       \
        ob_record((metric_), best_, (per_step_), (part_));                                                      \
    } while (0)

/* The lines' shape, precision and path fields; then every recorded op and
 * the step's sums (all, GEMMs, attention, the rest). */
extern char ob_shape[128];
extern const char *ob_path;
void ob_emit_all(void);

/* ---- the parameter layout ----------------------------------------------------------------- */

typedef struct {
    size_t *off, *numel;
    bool *decay;
    int n;
    size_t total;
} ob_tensors;

/* Room for n tensors (exits when there is none; ob_close frees it). */
void ob_tensors_init(ob_tensors *t, int n);
/* Append a tensor of numel parameters; returns its offset. */
size_t ob_add_tensor(ob_tensors *t, size_t numel, bool decay);
/* The optimizer step as train.c makes it: zero the gradients, their norm,
 * adamw_multi over the tensors (P16 may be NULL). */
void ob_optimizer(const ob_tensors *t, float *P, uint16_t *P16, float *D, float *m, float *v);

#endif
