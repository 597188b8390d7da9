/* cudnn_sdpa.h — cuDNN's fused causal attention (the graph API's scaled
 * dot-product attention patterns, built through the backend descriptors)
 * on Llama's layout, forward and backward: what GRADD_GQA=cudnn runs in
 * the gradd-cuda module (gqa_cudnn.cu), and what bench_gqa_cuda times
 * against gradd's own kernels.
 *
 * cuDNN is loaded when asked for (dlopen of libcudnn.so.9), not linked: a
 * machine without it still loads the module, and the attention then runs
 * on gradd's kernels.
 *
 * The forward graph: S = Q·Kᵀ · scale, the causal mask (key index > query
 * index set to -inf), softmax by its row maximum and sum, the rows'
 * log-sum-exp written to stats (what the backward needs), O = softmax(S)·V.
 * Q, K and V are strided views of one 16-bit qkv (B,T,W), W = (NH + 2·KVH)·HS:
 * each row NH query heads, then KVH key heads, then KVH value heads, as
 * gradd's attention reads them; query head h reads key/value head
 * h / (NH/KVH).  O (B,T,NH·HS) in 16 bits, stats (B,NH,T) fp32: the natural
 * log-sum-exp of the scaled scores, gradd's lse.
 *
 * The backward graph (flash attention's: P recomputed from stats, never
 * stored): P = exp(S − stats) with S scaled and masked as above,
 * dV = Pᵀ·dO, dS = P ∘ (dO·Vᵀ − Σ_row dO∘O) · scale, dQ = dS·K, dK = dSᵀ·Q;
 * dK and dV summed over the NH/KVH query heads of each group.  dQ, dK, dV
 * written as the same strided views of one 16-bit dqkv (B,T,W). */
#ifndef GRADD_CUDNN_SDPA_H
#define GRADD_CUDNN_SDPA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* libcudnn and one handle that queues on one CUDA stream. */
typedef struct sdpa_lib sdpa_lib;
/* One graph (a forward or a backward at one shape) and its plan. */
typedef struct sdpa_plan sdpa_plan;

/* Load cuDNN and make a handle on `stream` (NULL: the default stream):
 * NULL with why when the library, one of its functions or the handle
 * cannot be had (the build without cuDNN's headers says so). */
sdpa_lib *sdpa_open(void *stream, char *why, size_t why_len);
void sdpa_close(sdpa_lib *lib);
/* cuDNN's version (e.g. 91900). */
size_t sdpa_version(const sdpa_lib *lib);

/* A plan for the forward (backward false) or the backward, in bf16 or fp16:
 * NULL with why (the descriptor or call cuDNN refused, and cuDNN's own
 * message) when cuDNN has no engine for it. */
sdpa_plan *sdpa_plan_make(sdpa_lib *lib, bool backward, bool bf16, int B, int T, int NH, int KVH, int HS, char *why,
                          size_t why_len);
void sdpa_plan_free(sdpa_plan *p);
/* Build the graph's tensors and ops, each finalized by cuDNN, without a
 * device (no handle, no plan): the number of ops, or -1 with why.  What
 * cuDNN checks there (each op's shapes, types and attributes) can then be
 * checked on a machine without a GPU. */
int sdpa_check_ops(bool backward, bool bf16, int B, int T, int NH, int KVH, int HS, char *why, size_t why_len);
/* The device scratch one run of p needs, 256-byte aligned: cuDNN's
 * workspace and, for a backward, the two fp32 tensors its pattern names
 * as real ones: the rows' Σ dO∘O (B,NH,T) and dQ's accumulator
 * (B,NH,T,HS). */
size_t sdpa_plan_scratch(const sdpa_plan *p);

/* Queue one forward (device pointers; scratch of sdpa_plan_scratch bytes,
 * 256-byte aligned): 0, or -1 with why. */
int sdpa_forward(sdpa_plan *p, const uint16_t *qkv16, uint16_t *out16, float *stats, void *scratch, char *why,
                 size_t why_len);
/* Queue one backward from the forward's qkv, out and stats and dout
 * (B,T,NH·HS): dqkv overwritten, all of it; 0, or -1 with why. */
int sdpa_backward(sdpa_plan *p, const uint16_t *qkv16, const uint16_t *out16, const uint16_t *dout16,
                  const float *stats, uint16_t *dqkv16, void *scratch, char *why, size_t why_len);

#ifdef __cplusplus
}
#endif

#endif
