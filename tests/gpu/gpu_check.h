/* gpu_check.h — what the parts of test_gpu_kernels share: the two ops
 * tables and their contexts, paired host/device buffers filled from one
 * random stream, and comparisons that print a line per result and count
 * failures rather than stop.  The tolerances are test_gpu_kernels.c's.
 *
 * Each check runs one op at one shape; test_gpu_kernels.c calls them in a
 * fixed order, so the one random stream gives every check the same inputs
 * on every run. */
#ifndef GRADD_TEST_GPU_CHECK_H
#define GRADD_TEST_GPU_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels.h"

extern const kern_ops *G; /* cuda */
extern const kern_ops *H; /* cpu */
extern kern_ctx *hk;      /* cpu context */
extern kern_ctx *gk;      /* the cuda context under test (switched per precision) */
extern int failures;
/* The 16-bit type of the context under test: bf16 (true) or fp16. */
extern bool ctx_bf16;

#define FAIL(...)                                                                                               \
    do {                                                                                                        \
        fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                    \
        fprintf(stderr, __VA_ARGS__);                                                                           \
        fputc('\n', stderr);                                                                                    \
        failures++;                                                                                             \
    } while (0)

/* ---- random numbers ------------------------------------------------------------------ */

uint32_t rnd_u32(void);
/* Uniform in [-1, 1). */
float rnd(void);

/* ---- paired buffers: the same contents on the host (cpu) and the device (cuda) ------ */

typedef struct {
    float *h, *d;
    size_t n;
} buf;

typedef struct {
    int32_t *h, *d;
    size_t n;
} ibuf;

/* The same 16-bit values (raw uint16 of the context's type) on both sides. */
typedef struct {
    uint16_t *h, *d;
    size_t n;
} buf16;

/* Device memory, held until free_all(); host memory.  Either exits the
 * program when there is none. */
void *dmalloc(size_t bytes);
void *hmalloc(size_t bytes);
void free_all(void);

/* scale·uniform[-1,1), or zeros when scale is 0. */
buf mk(size_t n, float scale);
/* The cpu's casts to and from the context's 16-bit type. */
void narrow16(uint16_t *dst, const float *src, size_t n);
void widen16(float *dst, const uint16_t *src, size_t n);
/* scale·uniform[-1,1) rounded to 16 bits; scale 0: random bit patterns, for
 * outputs that must be overwritten (and a prefix that must not be). */
buf16 mk16(size_t n, float scale);
/* Integers uniform in [lo, hi). */
ibuf mki(size_t n, int lo, int hi);
/* Make the device copy equal the host reference again, so that an op that
 * accumulates into a buffer starts from the same bits on both sides (a
 * previous op's tolerated difference must not count against the next). */
void resync(buf *b);
/* Free the host side (the device side goes with free_all). */
void bfree(buf *b);
void ibfree(ibuf *b);
void b16free(buf16 *b);
/* Sync the cuda context; an error is a failure of `op`. */
void gsync(const char *op);

/* ---- comparison ----------------------------------------------------------------------- */

/* got (device, n with row stride ld, the first `cols` of each row compared)
 * against ref (host); `lower` (T) compares only the causal lower triangle of
 * T×T blocks. */
typedef struct {
    size_t rows, cols, ld; /* rows × cols of ld; 0 rows: one flat row of n */
    int tri_T;             /* > 0: (.., T, T) blocks, compare j <= t only */
} layout;

void cmp_l(const char *op, const char *what, const float *dgot, const float *ref, size_t n, layout L, double rtol,
           double atol);
/* b's device side against its host side, as one flat row. */
void cmp(const char *op, const char *what, const buf *b, double rtol, double atol);
/* The spacing of the 16-bit type at |x| (its unit in the last place; the
 * subnormal spacing below the smallest normal). */
double ulp16(double x);
/* A 16-bit result (device) against the CPU's (host): widened to fp32,
 * |gpu − cpu| ≤ ulp16(cpu) + rtol·|cpu| + atol·max|cpu|, that is at most one
 * 16-bit rounding step apart beyond what the fp32 op itself may differ by.
 * Prints how many are bitwise equal. */
void cmp16(const char *op, const char *what, const buf16 *b, double rtol, double atol);
/* Two device arrays of n 16-bit values: how many differ. */
size_t diff16(const uint16_t *d1, const uint16_t *d2, size_t n);
/* The GPU's own cast of an fp32 device array to the context's 16-bit type. */
void gcast16(uint16_t *dst, const float *src, size_t n);
/* An op of kernels.h's 16-bit section missing from a table: a failure of its
 * own, named, rather than a crash. */
bool have16(const char *name, const char *op, bool in_cpu, bool in_cuda);
/* The reductions that the CUDA side promises to keep deterministic (no
 * float atomics): the same inputs twice give the same bits. */
bool same_bits(const float *d1, const float *d2, size_t n);

/* ---- the checks ------------------------------------------------------------------------ */

/* gpu_check_layers.c */
void test_memory(void);
void test_encoder(int B, int T, int C, int V);
void test_layernorm(int N, int C);
void test_matmul(const char *prec, int N, int C, int OC, bool bias, bool want_dinp, int offset, double rtol,
                 double atol);
void test_attention(const char *prec, int B, int T, int C, int NH, double rtol, double atol);
void test_attention_fused(const char *prec, int B, int T, int C, int NH, double rtol, double atol);
void test_attention_fused16(const char *prec, int B, int T, int C, int NH, double rtol, double atol);
void test_pointwise(size_t n, int offset);
void test_crossentropy(int N, int V, int Vp);

/* gpu_check_optim.c */
void test_sumsq(size_t n, int offset);
void test_adamw(size_t n);
void test_adamw16(size_t n, int offset);
void test_casts(size_t n);
void test_nonfinite(size_t n, int offset);
void test_adamw_multi(int offset, bool with16);
void test_determinism(void);

/* gpu_check_act16.c */
void test_layernorm16(int N, int C, int out_off);
void test_gelu16(size_t n, int in_off, int out_off);
void test_matmul16(int N, int C, int OC, bool bias, bool want_dinp, int offset);
void test_out16_bias(int N, int C, int OC, int offset);
void test_gelu_gemm16(int N, int C, int Hd, int offset);
void test_logits16(int N, int C, int V, int Vp);
void test_determinism16(void);

/* gpu_check_llama.c */
void test_encoder_nowpe(int B, int T, int C, int V);
void test_rmsnorm(int N, int C);
void test_rope(int B, int T, int NH, int KVH, int HS, bool with_pos);
void test_swiglu(int N, int F);
void test_gqa(int B, int T, int NH, int KVH, int HS, bool packed, double rtol, double atol);
void test_rmsnorm16(int N, int C);
void test_swiglu16(int N, int F);

/* gpu_check_frozen.c */
void test_encoder16w(int B, int T, int C, int V, bool with_wpe, int table_off);
void test_frozen_norms(int N, int C);
void test_frozen_mm(int N, int C, int OC, double rtol, double atol);
void test_frozen_norms16(int N, int C);
void test_frozen_mm16(int N, int C, int OC);

#endif
