/* cudnn_sdpa.h — cuDNN's fused causal attention (the graph API's scaled
 * dot-product attention patterns, built through the backend descriptors)
 * on Llama's layout, forward and backward, for bench_gqa_cuda to time
 * against gradd's own kernels.
 *
 * The forward graph: S = Q·Kᵀ · scale, the causal mask (key index > query
 * index set to -inf), softmax by its row maximum and sum, the rows'
 * log-sum-exp written to stats (what the backward needs), O = softmax(S)·V.
 * Q, K and V are strided views of one 16-bit qkv (B,T,W), W = (NH + 2·KVH)·HS:
 * each row NH query heads, then KVH key heads, then KVH value heads, as
 * gradd's attention reads them; query head h reads key/value head
 * h / (NH/KVH).  O (B,T,NH·HS) in 16 bits, stats (B,NH,T) fp32.
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

typedef struct sdpa_fwd sdpa_fwd;
typedef struct sdpa_bwd sdpa_bwd;

/* A plan for that forward on the CUDA stream `stream` (NULL: the default
 * one), in bf16 or fp16: NULL with why (the descriptor or call cuDNN
 * refused, and cuDNN's own message) when cuDNN has no engine for it. */
sdpa_fwd *sdpa_fwd_plan(void *stream, bool bf16, int B, int T, int NH, int KVH, int HS, char *why, size_t why_len);
/* Queue one forward (device pointers); 0, or -1 with why. */
int sdpa_fwd_run(sdpa_fwd *p, const uint16_t *qkv16, uint16_t *out16, float *stats, char *why, size_t why_len);
void sdpa_fwd_free(sdpa_fwd *p);

/* A plan for the backward, as sdpa_fwd_plan.  It holds, besides cuDNN's
 * workspace, the two fp32 buffers the pattern names as real tensors: the
 * rows' Σ dO∘O (B,NH,T) and dQ's accumulator (B,NH,T,HS), which the
 * engine adds each key block's share into before dQ is rounded to 16 bits. */
sdpa_bwd *sdpa_bwd_plan(void *stream, bool bf16, int B, int T, int NH, int KVH, int HS, char *why, size_t why_len);
/* Queue one backward (device pointers) from the forward's qkv, out and
 * stats and dout (B,T,NH·HS): dqkv overwritten, all of it; 0, or -1 with
 * why. */
int sdpa_bwd_run(sdpa_bwd *p, const uint16_t *qkv16, const uint16_t *out16, const uint16_t *dout16,
                 const float *stats, uint16_t *dqkv16, char *why, size_t why_len);
void sdpa_bwd_free(sdpa_bwd *p);

#endif
