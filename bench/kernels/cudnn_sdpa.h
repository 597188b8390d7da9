/* cudnn_sdpa.h — cuDNN's fused causal attention (the graph API's scaled
 * dot-product attention pattern, built through the backend descriptors) on
 * Llama's layout, for bench_gqa_cuda to time against gradd's own kernels.
 *
 * The graph: S = Q·Kᵀ · scale, the causal mask (key index > query index
 * set to -inf), softmax by its row maximum and sum, the rows' log-sum-exp
 * written to stats (what a backward needs), O = softmax(S)·V.  Q, K and V
 * are strided views of one 16-bit qkv (B,T,W), W = (NH + 2·KVH)·HS: each
 * row NH query heads, then KVH key heads, then KVH value heads, as gradd's
 * attention reads them; query head h reads key/value head h / (NH/KVH).
 * O (B,T,NH·HS) in 16 bits, stats (B,NH,T) fp32. */
#ifndef GRADD_CUDNN_SDPA_H
#define GRADD_CUDNN_SDPA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct sdpa_fwd sdpa_fwd;

/* A plan for that forward on the CUDA stream `stream` (NULL: the default
 * one), in bf16 or fp16: NULL with why (the descriptor or call cuDNN
 * refused, and cuDNN's own message) when cuDNN has no engine for it. */
sdpa_fwd *sdpa_fwd_plan(void *stream, bool bf16, int B, int T, int NH, int KVH, int HS, char *why, size_t why_len);
/* Queue one forward (device pointers); 0, or -1 with why. */
int sdpa_fwd_run(sdpa_fwd *p, const uint16_t *qkv16, uint16_t *out16, float *stats, char *why, size_t why_len);
void sdpa_fwd_free(sdpa_fwd *p);

#endif
