/* kernels.h — the compute interface.
 *
 * Every op the models need, forward and backward side by side, behind one
 * table of functions (kern_ops).  Two implementations:
 *   cpu  — the files in kernels/cpu: OpenBLAS sgemm for every GEMM, OpenMP loops;
 *          the reference every other backend is tested against.
 *   cuda — the .cu files in kernels/cuda, inside the gradd-cuda module: cuBLASLt for GEMM
 *          (bf16 or fp16 inputs with fp32 accumulation when the context asks
 *          for mixed precision), own kernels for the rest.
 * The training engine calls only through a kern_ops table, so one model
 * runs on either backend.
 *
 * Conventions (as in llm.c):
 *   - shapes are written at the top of each op: inp (B,T,C), weight (OC,C);
 *   - tensors are row-major float32 in device memory of the backend;
 *   - forward functions overwrite their outputs;
 *   - backward functions ACCUMULATE (+=) into the parameter gradients they
 *     produce (dweight, dbias), so that gradient accumulation over
 *     micro-batches needs no extra adds; callers zero those at the start of
 *     an optimizer step.  Gradients of activations are a different matter:
 *     matmul_backward's dinp, gelu_backward, relu_backward and
 *     crossentropy_backward OVERWRITE theirs, because each of those has a
 *     single producer in a model, and accumulating would need the buffer
 *     zeroed first (a full write of a (B,T,4C) tensor, per layer and step,
 *     for nothing).  The pointwise ones may work in place (dinp == dout).
 *     layernorm, attention and encoder backward still accumulate: the
 *     residual stream and the fused q/k/v gradient are sums;
 *   - CPU results are bitwise reproducible for a fixed thread count: no
 *     atomics in reductions, static work partitioning.
 */
#ifndef GRADD_KERNELS_H
#define GRADD_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __CUDACC__
#define KERN_HD __host__ __device__
#else
#define KERN_HD
#endif

typedef enum {
    KERN_FP32 = 0, /* everything in fp32 */
    KERN_BF16 = 1, /* GEMM inputs cast to bf16, fp32 accumulate and output */
    KERN_FP16 = 2, /* GEMM inputs cast to fp16, fp32 accumulate and output */
} kern_precision;

/* A backend's execution context: thread count (cpu), stream and cuBLASLt
 * handle (cuda), GEMM precision, and scratch memory.  Created and destroyed
 * through the backend's table. */
typedef struct kern_ctx kern_ctx;

/* Scratch memory is the caller's (it comes from the memory pool, tagged
 * workspace): a backend asks for it through this callback and gives it back
 * with `release`.  May be NULL for backends that need none. */
typedef struct {
    void *(*acquire)(void *user, size_t bytes);
    void (*release)(void *user, void *ptr);
    void *user;
} kern_scratch;

/* One tensor of a flat parameter buffer, for adamw_multi: its offset and
 * length in elements, and whether weight decay applies to it. */
typedef struct {
    size_t offset, n;
    int decay;
} kern_segment;

/* What sync returns. */
enum { KERN_OK = 0, KERN_ERR_OOM = 1, KERN_ERR_DEVICE = 2 };

typedef struct kern_ops {
    const char *name; /* "cpu", "cuda" */

    /* ---- context ---------------------------------------------------------- */
    /* threads: cpu worker threads (0 = all cores); device: cuda ordinal. */
    kern_ctx *(*ctx_create)(int threads, int device, kern_precision prec, const kern_scratch *scratch);
    void (*ctx_destroy)(kern_ctx *k);
    /* Wait for queued work (no-op on cpu).  KERN_OK, or the first failure
     * since the last sync: KERN_ERR_OOM when device memory ran out (the
     * caller may retry smaller), KERN_ERR_DEVICE for anything else (a
     * faulting kernel, a GEMM without an algorithm, a lost device), which
     * no smaller size cures.  `error` then says what failed, until the next
     * failure. */
    int (*sync)(kern_ctx *k);
    const char *(*error)(const kern_ctx *k);
    /* The cudaStream_t the context queues its work on (NULL on cpu): for
     * work of others that must follow it, such as NCCL's. */
    void *(*stream)(kern_ctx *k);

    /* ---- memory helpers (device pointers) ---------------------------------- */
    void (*zero)(kern_ctx *k, float *p, size_t n);
    void (*copy_h2d)(kern_ctx *k, void *dst, const void *src, size_t bytes);
    void (*copy_d2h)(kern_ctx *k, void *dst, const void *src, size_t bytes);
    /* p (n) *= s */
    void (*scale)(kern_ctx *k, float *p, size_t n, float s);
    /* Inverted dropout with rate p (0 <= p < 1): out[i] = inp[i]·(1/(1-p))
     * where kern_dropout_keep(seed, offset + i, ...) keeps element i, else 0
     * (kern_dropout_rate gives both constants).  out may be inp.  The mask
     * depends on (seed, offset + i) alone, so a tensor cut into pieces at
     * their offsets draws the mask of the whole, and the same call on a
     * gradient is the backward. */
    void (*dropout)(kern_ctx *k, float *out, const float *inp, size_t n, float p, uint64_t seed, uint64_t offset);

    /* ---- encoder: token + position embedding -------------------------------
     * out (B,T,C) = wte[inp[b,t]] (V,C) + wpe[t] (maxT,C); inp (B,T) int32.
     * wpe NULL: no position embedding (Llama: positions are rotary), and
     * then dwpe is NULL too. */
    void (*encoder_forward)(kern_ctx *k, float *out, const int32_t *inp, const float *wte, const float *wpe,
                            int B, int T, int C);
    void (*encoder_backward)(kern_ctx *k, float *dwte, float *dwpe, const float *dout, const int32_t *inp,
                             int B, int T, int C);
    /* encoder_forward from a 16-bit token table: out (B,T,C) = the exact
     * widening of wte16[inp[b,t]] (V,C; the context's 16-bit type) +
     * wpe[t] (fp32, or NULL).  For a frozen base held in 16 bits only
     * (lora.h), whose embedding is never trained and so needs no backward.
     * Called only in bf16/fp16 contexts. */
    void (*encoder_forward16w)(kern_ctx *k, float *out, const int32_t *inp, const uint16_t *wte16, const float *wpe,
                               int B, int T, int C);

    /* ---- layernorm -----------------------------------------------------------
     * inp, out (N,C); weight, bias (C); mean, rstd (N) saved for backward.
     * Backward: dinp (N,C) +=, dweight, dbias (C) +=; dweight and dbias
     * both given, or both NULL: a frozen norm, no weight gradients (the
     * reductions skipped), and dinp bitwise what it is with them. */
    void (*layernorm_forward)(kern_ctx *k, float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int N, int C);
    void (*layernorm_backward)(kern_ctx *k, float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *mean, const float *rstd,
                               int N, int C);

    /* ---- matmul with bias -----------------------------------------------------
     * out (N,OC) = inp (N,C) · weight (OC,C)^T + bias (OC); bias may be NULL */
    void (*matmul_forward)(kern_ctx *k, float *out, const float *inp, const float *weight, const float *bias,
                           int N, int C, int OC);
    /* dinp (N,C) = dout·weight (overwritten); dweight (OC,C) += dout^T·inp; dbias (OC) += Σ dout.
     * dinp or dbias may be NULL (not needed / no bias); dweight NULL: no
     * weight gradient (a frozen weight), inp then not read. */
    void (*matmul_backward)(kern_ctx *k, float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int N, int C, int OC);

    /* ---- causal multi-head self-attention -----------------------------------------
     * inp (B,T,3C): q,k,v concatenated; out (B,T,C); NH heads of C/NH.
     * preatt, att (B,NH,T,T): scores before and after the causal softmax,
     * saved for backward (entries above the diagonal are unspecified). */
    void (*attention_forward)(kern_ctx *k, float *out, float *preatt, float *att, const float *inp,
                              int B, int T, int C, int NH);
    /* dinp (B,T,3C) +=; dpreatt, datt (B,NH,T,T) are scratch the caller
     * provides (overwritten). */
    void (*attention_backward)(kern_ctx *k, float *dinp, float *dpreatt, float *datt, const float *dout,
                               const float *inp, const float *att, int B, int T, int C, int NH);

    /* Fused (flash) attention, optional: NULL where a backend has none, and
     * attention_fused_ok says for which shapes and precisions it runs.  The
     * (B,NH,T,T) matrices are never stored: lse (B,NH,T) keeps each row's
     * log-sum-exp of the scaled scores for backward, which recomputes the
     * probabilities.  Backward needs the forward's out; dinp (B,T,3C) +=. */
    bool (*attention_fused_ok)(kern_ctx *k, int C, int NH);
    void (*attention_fused_forward)(kern_ctx *k, float *out, float *lse, const float *inp, int B, int T, int C,
                                    int NH);
    void (*attention_fused_backward)(kern_ctx *k, float *dinp, const float *dout, const float *out,
                                     const float *lse, const float *inp, int B, int T, int C, int NH);
    /* The same with inp16, out16 and dout16 in 16 bits (the context's
     * type, as the 16-bit activation ops below): exactly the fp32 ops on
     * their widening, out16 the fp32 out rounded once.  The qkv GEMM writes
     * inp16 so (matmul_forward16_out16) and the kernels, whose tensor cores
     * read 16 bits anyway, take it as it is; out16 is read by the attention
     * projection's GEMM and by backward's row sums, and that GEMM's
     * backward writes dout16 (matmul_backward16's dinp16).  Unlike the fp32
     * backward, backward16 overwrites its gradient, dinp16 (B,T,3C) in 16
     * bits, which the qkv GEMM's backward reads as its dout16: dk and dv are
     * written as the kernels finish them, and dq, summed over key blocks
     * in fp32 in the caller's scratch dq (B,T,C, overwritten), is rounded
     * into it at the end.  Wherever
     * attention_fused_ok holds; NULL where a backend has none.  The cpu's
     * are references (for the GPU's tests and the 16-bit wiring's), with no
     * attention_fused_ok of their own. */
    void (*attention_fused_forward16)(kern_ctx *k, uint16_t *out16, float *lse, const uint16_t *inp16, int B,
                                      int T, int C, int NH);
    void (*attention_fused_backward16)(kern_ctx *k, uint16_t *dinp16, float *dq, const uint16_t *dout16,
                                       const uint16_t *out16, const float *lse, const uint16_t *inp16, int B, int T,
                                       int C, int NH);

    /* Incremental decoding, optional (NULL where a backend has none):
     * qkv (B,3C): q,k,v of one new position per sequence, t = Tc-1 (1 <= Tc <= Tmax);
     * kcache, vcache (B,Tmax,C): rows 0..Tc-2 hold the earlier positions'
     * keys and values; the op writes this position's k and v into row Tc-1;
     * att (B,NH,Tc): scratch the caller provides (overwritten);
     * out (B,C) = the last row of attention_forward over the Tc positions:
     * softmax(q·kᵀ/sqrt(C/NH)) · v per head, by the same softmax.
     * A key/value cache makes a generated token cost O(T) instead of a
     * forward over the whole prefix.  The op appends k and v itself because
     * the qkv matmul writes rows of 3C and the table has no strided copy to
     * move them.  The cpu's serves sampling (sample.c builds a cpu model). */
    void (*attention_decode)(kern_ctx *k, float *out, float *att, float *kcache, float *vcache, const float *qkv,
                             int B, int Tc, int Tmax, int C, int NH);

    /* ---- Llama: RMSNorm, rotary embeddings, SwiGLU, grouped-query attention ---------
     * Optional (NULL where a backend has none); the cpu has them all. */
    /* out (N,C) = inp · rstd · weight, rstd (N) = 1/sqrt(mean(inp²) + eps),
     * saved for backward. */
    void (*rmsnorm_forward)(kern_ctx *k, float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                            float eps);
    /* dinp (N,C) += (the residual stream's gradient, as layernorm's);
     * dweight (C) +=, or NULL: a frozen norm, no weight gradient, and dinp
     * bitwise what it is with one. */
    void (*rmsnorm_backward)(kern_ctx *k, float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int N, int C);
    /* Rotary position embedding, in place, in transformers' convention
     * (rotate_half): x holds N rows of `stride` floats; in each row, heads
     * 0..NHR-1 of HS floats each from the row's start are rotated, element
     * i < HS/2 paired with i + HS/2, by the angle pos·inv_freq[i] (the
     * product and its cos and sin in fp32).  inv_freq (HS/2) in device
     * memory (the model computes it, scaling included); pos (N) int32, or
     * NULL: row r is at position r % T.  Backward rotates the gradient
     * back (the transpose of a rotation), in place. */
    void (*rope_forward)(kern_ctx *k, float *x, const float *inv_freq, const int32_t *pos, int N, int T, int NHR,
                         int HS, int stride);
    void (*rope_backward)(kern_ctx *k, float *dx, const float *inv_freq, const int32_t *pos, int N, int T, int NHR,
                          int HS, int stride);
    /* SwiGLU: gu (N,2F) holds [gate | up] per row (one GEMM over the two
     * weights, which lie side by side); out (N,F) = silu(gate) · up.
     * Backward: dgu (N,2F) overwritten (one producer), not aliasing gu. */
    void (*swiglu_forward)(kern_ctx *k, float *out, const float *gu, int N, int F);
    void (*swiglu_backward)(kern_ctx *k, float *dgu, const float *gu, const float *dout, int N, int F);
    /* Causal grouped-query attention, fused (the (T,T) scores never
     * stored): qkv (B,T,W), W = (NH + 2·KVH)·HS, each row NH query heads,
     * then KVH key heads, then KVH value heads; query head h reads
     * key/value head h / (NH/KVH).  out (B,T,NH·HS) = softmax(q·kᵀ/sqrt(HS))·v
     * over the keys token t may see: start (B,T) int32 gives the first
     * (start[t] <= t, its sample's beginning, for packed samples), NULL: 0.
     * lse (B,NH,T): each row's log-sum-exp of the scaled scores, for
     * backward.  Backward OVERWRITES dqkv (B,T,W) (its one producer) from
     * dout (B,T,NH·HS) and the forward's out and lse.  attention_gqa_ok
     * says for which shapes a backend's run (the cpu: all). */
    bool (*attention_gqa_ok)(kern_ctx *k, int NH, int KVH, int HS);
    void (*attention_gqa_forward)(kern_ctx *k, float *out, float *lse, const float *qkv, const int32_t *start, int B,
                                  int T, int NH, int KVH, int HS);
    void (*attention_gqa_backward)(kern_ctx *k, float *dqkv, const float *dout, const float *out, const float *lse,
                                   const float *qkv, const int32_t *start, int B, int T, int NH, int KVH, int HS);
    /* Incremental decoding with a key/value cache, as attention_decode:
     * qkv (B,W) of position Tc-1 (RoPE already applied); kcache, vcache
     * (B,Tmax,KVH·HS), the op writes row Tc-1; att (B,NH,Tc) scratch;
     * out (B,NH·HS).  Optional. */
    void (*attention_gqa_decode)(kern_ctx *k, float *out, float *att, float *kcache, float *vcache, const float *qkv,
                                 int B, int Tc, int Tmax, int NH, int KVH, int HS);

    /* ---- pointwise ------------------------------------------------------------------- */
    /* GELU, tanh approximation: out (N) = gelu(inp); backward: dinp = dout·gelu'(inp) */
    void (*gelu_forward)(kern_ctx *k, float *out, const float *inp, size_t N);
    void (*gelu_backward)(kern_ctx *k, float *dinp, const float *inp, const float *dout, size_t N);
    /* ReLU: out = max(inp, 0); backward: dinp = dout where inp > 0, else 0 */
    void (*relu_forward)(kern_ctx *k, float *out, const float *inp, size_t N);
    void (*relu_backward)(kern_ctx *k, float *dinp, const float *inp, const float *dout, size_t N);
    /* residual: out (N) = a + b.  Its backward is accumulate: dst += src. */
    void (*residual_forward)(kern_ctx *k, float *out, const float *a, const float *b, size_t N);
    void (*accumulate)(kern_ctx *k, float *dst, const float *src, size_t N);
    /* N rows of `cols` floats between row strides: dst[i·ldd + j] = (or +=,
     * with accumulate) src[i·lds + j].  A GEMM whose output is a slice of
     * wider rows (LoRA on one of q, k, v, whose GEMM writes them side by
     * side) reads and writes its slice through this. */
    void (*copy2d)(kern_ctx *k, float *dst, int ldd, const float *src, int lds, int N, int cols, bool accumulate);

    /* ---- fused softmax + cross-entropy ------------------------------------------------
     * logits (N,Vp) of which the first V columns are real (Vp >= V pads for
     * alignment, padded columns are ignored); targets (N) int32 below V, a
     * negative one marks a row that is ignored (loss 0, and its whole
     * dlogits row 0: a prompt token or padding of fine-tuning data), one of
     * V or more gives a NaN loss; losses (N) = lse - logits[target];
     * lse (N) = log Σ_{v<V} exp(logits[v]), all backward needs of the
     * softmax: keeping one number per row instead of an (N,Vp) probabilities
     * matrix saves that matrix's memory and a write and a read of it. */
    void (*crossentropy_forward)(kern_ctx *k, float *losses, float *lse, const float *logits,
                                 const int32_t *targets, int N, int V, int Vp);
    /* dlogits (N,Vp) = dloss[i] · (exp(logits - lse[i]) - onehot(target)) for
     * the first V columns, 0 for the padding; dloss (N) is the gradient of
     * the total loss w.r.t. each row's loss (e.g. 1/total_rows of the
     * optimizer step for a mean).
     * The one backward that OVERWRITES instead of accumulating: its output
     * is never summed with another gradient, and overwriting lets dlogits be
     * the logits buffer itself (dlogits == logits is allowed), so the
     * gradient costs no second (N,Vp) buffer, no zeroing pass, and one read
     * and one write of the matrix. */
    void (*crossentropy_backward)(kern_ctx *k, float *dlogits, const float *logits, const float *lse,
                                  const int32_t *targets, const float *dloss, int N, int V, int Vp);

    /* ---- optimizer and norms ----------------------------------------------------------- */
    /* Sum of squares of g (n) in double, written to *out on the host. */
    void (*sumsq)(kern_ctx *k, double *out, const float *g, size_t n);
    /* AdamW for one tensor: m = b1·m + (1-b1)·g; v = b2·v + (1-b2)·g²;
     * p -= lr·( (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) + wd·p ).
     * g is read as grad_scale·g (clipping and loss scaling fold in here).
     * p16 (n) may be NULL; else (bf16/fp16 contexts only) it receives the
     * updated p rounded to the context's 16-bit type, as the casts round:
     * the weights as the 16-bit GEMMs read them (weight16), written where
     * the optimizer writes p anyway instead of cast again by every GEMM
     * that reads them, forward and backward, at every micro-batch. */
    void (*adamw)(kern_ctx *k, float *p, uint16_t *p16, const float *g, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, float grad_scale, int t);
    /* adamw on each of nsegs tensors of the flat buffers p, p16, g, m, v
     * (segs: offsets into them), with weight_decay where the segment's
     * decay is set and 0 elsewhere: the same update, element for element,
     * as one adamw call per segment.  Why: a model has many small tensors
     * (GPT-2 124M: 148, most of them 768 long), and on a GPU a launch per
     * tensor cost 1.44 ms a step where one launch over everything took
     * 0.94.  segs must not overlap. */
    void (*adamw_multi)(kern_ctx *k, float *p, uint16_t *p16, const float *g, float *m, float *v,
                        const kern_segment *segs, int nsegs, float lr, float beta1, float beta2, float eps,
                        float weight_decay, float grad_scale, int t);

    /* ---- casts (device memory; bf16/fp16 as raw uint16) ------------------------------- */
    void (*cast_f32_to_bf16)(kern_ctx *k, uint16_t *dst, const float *src, size_t n);
    void (*cast_bf16_to_f32)(kern_ctx *k, float *dst, const uint16_t *src, size_t n);
    void (*cast_f32_to_f16)(kern_ctx *k, uint16_t *dst, const float *src, size_t n);
    void (*cast_f16_to_f32)(kern_ctx *k, float *dst, const uint16_t *src, size_t n);
    /* Count of non-finite values in p (n), for fp16 loss-scale overflow checks. */
    size_t (*count_nonfinite)(kern_ctx *k, const float *p, size_t n);

    /* ---- 16-bit activations (bf16 and fp16 contexts) ----------------------------------
     * A GEMM in a 16-bit context reads 16-bit operands; given fp32 ones it
     * casts them first, at every call, forward and backward.  These ops let
     * the producer of an activation whose only readers are GEMMs store it in
     * the context's 16-bit type (raw uint16: bf16, or fp16, as the context's
     * precision; rounded to nearest even like the casts), so that it is
     * rounded once, written at half the size and read by the GEMMs as it
     * is.  The GEMMs' weights come in 16 bits too (weight16 (OC,C): the
     * fp32 weight rounded as the casts round, which the model keeps beside
     * the fp32 parameters and adamw's p16 refreshes), so no GEMM casts a
     * weight; their biases stay fp32.  What the ops compute is exactly the
     * fp32 op on the exact widening of their 16-bit inputs, followed by
     * that cast where the output is 16 bits.  All NULL where a backend has none;
     * called only in bf16/fp16 contexts.  act16_native says whether they
     * pay: true where the GEMMs compute in 16 bits (cuda); the cpu's are the
     * reference, slower than its fp32 ops, which a model should prefer. */
    bool act16_native;
    /* out16 (N,C) = layernorm(inp); mean, rstd (N) as layernorm_forward */
    void (*layernorm_forward16)(kern_ctx *k, uint16_t *out16, float *mean, float *rstd, const float *inp,
                                const float *weight, const float *bias, int N, int C);
    /* layernorm_backward, with dout given as either dout (fp32) or dout16
     * (the other NULL: the gradient a 16-bit GEMM backward wrote as its
     * dinp16), and dinp16 (N,C) = the updated dinp rounded (may be NULL):
     * the residual stream's gradient as the next GEMM backward reads it
     * (its dout16), written in the same pass instead of cast there.
     * dweight and dbias both NULL: as layernorm_backward's. */
    void (*layernorm_backward16)(kern_ctx *k, float *dinp, uint16_t *dinp16, float *dweight, float *dbias,
                                 const float *dout, const uint16_t *dout16, const float *inp, const float *weight,
                                 const float *mean, const float *rstd, int N, int C);
    /* out16 (N) = gelu(inp16); backward: dinp16 = dout16·gelu'(inp16)
     * (overwritten; may be dout16).  The MLP's hidden layer lives in 16
     * bits end to end: its GEMM writes it (matmul_forward16_out16), the
     * next GEMM writes its gradient (matmul_backward16's dinp16). */
    void (*gelu_forward16)(kern_ctx *k, uint16_t *out16, const uint16_t *inp16, size_t N);
    void (*gelu_backward16)(kern_ctx *k, uint16_t *dinp16, const uint16_t *inp16, const uint16_t *dout16, size_t N);
    /* out (N,OC) = inp16 (N,C) · weight16 (OC,C)^T + bias (OC); bias may be NULL */
    void (*matmul_forward16)(kern_ctx *k, float *out, const uint16_t *inp16, const uint16_t *weight16,
                             const float *bias, int N, int C, int OC);
    /* out (N,OC) = res (N,OC) + inp16 · weight16ᵀ + bias: matmul_forward16 and
     * residual_forward in one, for the projections that end a block's two
     * halves.  The GEMM adds res as it writes out (cuBLASLt's C operand), so
     * the product is never stored on its own.  out may not be res. */
    void (*matmul_forward16_residual)(kern_ctx *k, float *out, const uint16_t *inp16, const uint16_t *weight16,
                                      const float *bias, const float *res, int N, int C, int OC);
    /* As matmul_backward with inp and weight given as inp16 and weight16,
     * dout as either dout (fp32) or dout16 (the other NULL), and dinp
     * written as either dinp (fp32) or dinp16 (16 bits, the fp32 result
     * rounded once), at most one of them (overwritten; both NULL: no
     * dinp): dinp = dout·weight16;
     * dweight += doutᵀ·inp; dbias += Σ dout (may be NULL).  dweight NULL:
     * no weight gradient (a frozen weight), and inp16 may then be NULL. */
    void (*matmul_backward16)(kern_ctx *k, float *dinp, uint16_t *dinp16, float *dweight, float *dbias,
                              const float *dout, const uint16_t *dout16, const uint16_t *inp16,
                              const uint16_t *weight16, int N, int C, int OC);
    /* A 16-bit output as well (as autocast leaves it): out16 (N,OC) =
     * inp16 · weight16ᵀ + bias16, rounded once from the fp32 accumulator,
     * where bias16 is the bias (may be NULL) rounded to 16 bits first, as
     * autocast rounds it and as cuBLASLt's epilogue reads it for a 16-bit
     * output.  For the logits (no bias), which cross-entropy then reads and
     * overwrites with its 16-bit dlogits for the output GEMM's backward
     * (dout16): at a vocabulary of 50k the biggest tensors of a step; and
     * for the MLP's hidden layer, which only GELU reads. */
    void (*matmul_forward16_out16)(kern_ctx *k, uint16_t *out16, const uint16_t *inp16, const uint16_t *weight16,
                                   const float *bias, int N, int C, int OC);
    /* The MLP's fc layer with its GELU: pre16 = matmul_forward16_out16's
     * out16, out16 (N,OC) = gelu of it; and the gradient through the next
     * GEMM and the GELU: dinp16 (N,C) = (dout16 · weight16) ⊙ gelu'(pre16),
     * with dweight, dbias as matmul_backward16.  What they save is the
     * GELU's own pass over the hidden layer (cuda: in the GEMM's epilogue,
     * where GELU, or its derivative, is taken of the fp32 result before
     * the rounding: within an ulp of E of the cpu's, which are the two ops
     * one after the other).  Optional: a model runs the two ops without. */
    void (*matmul_forward16_gelu)(kern_ctx *k, uint16_t *out16, uint16_t *pre16, const uint16_t *inp16,
                                  const uint16_t *weight16, const float *bias, int N, int C, int OC);
    void (*matmul_backward16_dgelu)(kern_ctx *k, uint16_t *dinp16, const uint16_t *pre16, float *dweight,
                                    float *dbias, const uint16_t *dout16, const uint16_t *inp16,
                                    const uint16_t *weight16, int N, int C, int OC);
    /* Llama's: rmsnorm_forward into out16 (rstd as the fp32 op's), for the
     * GEMMs that read the norms; rmsnorm_backward with dout or dout16 and
     * dinp16 as layernorm_backward16's.  SwiGLU between 16-bit tensors:
     * [gate | up] as their GEMM wrote it (matmul_forward16_out16), its
     * output for the down projection's GEMM, and backward's dout16 as that
     * GEMM's backward wrote it (dinp16) into dgu16 for the gate/up GEMM's
     * backward. */
    void (*rmsnorm_forward16)(kern_ctx *k, uint16_t *out16, float *rstd, const float *inp, const float *weight, int N,
                              int C, float eps);
    void (*rmsnorm_backward16)(kern_ctx *k, float *dinp, uint16_t *dinp16, float *dweight, const float *dout,
                               const uint16_t *dout16, const float *inp, const float *weight, const float *rstd,
                               int N, int C);
    void (*swiglu_forward16)(kern_ctx *k, uint16_t *out16, const uint16_t *gu16, int N, int F);
    void (*swiglu_backward16)(kern_ctx *k, uint16_t *dgu16, const uint16_t *gu16, const uint16_t *dout16, int N,
                              int F);
    /* crossentropy_forward/backward on 16-bit logits (widened exactly);
     * dlogits16 = the fp32 result rounded, overwritten, may be logits16. */
    void (*crossentropy_forward16)(kern_ctx *k, float *losses, float *lse, const uint16_t *logits16,
                                   const int32_t *targets, int N, int V, int Vp);
    void (*crossentropy_backward16)(kern_ctx *k, uint16_t *dlogits16, const uint16_t *logits16, const float *lse,
                                    const int32_t *targets, const float *dloss, int N, int V, int Vp);
    /* Both in one, for a training step, where dloss is known before the
     * forward: losses (N) as crossentropy_forward16 gives them, and the
     * logits16 (N,Vp) overwritten by the dlogits16 crossentropy_backward16
     * gives from that forward's lse (which is not kept).  Its definition
     * is the two ops one after the other; what it saves is the backward's
     * read of the logits from memory, a row being read again right after
     * its forward (cuda: from L2).  Optional: a model runs the two ops
     * without it. */
    void (*crossentropy_fused16)(kern_ctx *k, float *losses, uint16_t *logits16, const int32_t *targets,
                                 const float *dloss, int N, int V, int Vp);
} kern_ops;

/* The CPU backend (always present). */
const kern_ops *kern_cpu_ops(void);

/* OpenBLAS's kernels for the CPU backend's GEMMs (ctx.c says why): the
 * name of those it runs (openblas_get_corename); the OPENBLAS_CORETYPE a
 * process should be started with instead, or NULL when OpenBLAS's choice
 * stands; and the rule behind that, for tests: `core` what OpenBLAS chose,
 * `avx512` the CPU (and OS) has AVX-512 F/CD/BW/DQ/VL, `avx2` AVX2 and FMA. */
const char *kern_cpu_blas_core(void);
const char *kern_cpu_blas_better(void);
const char *kern_cpu_blas_pick(const char *core, bool avx512, bool avx2);

/* The CUDA backend's table lives in the gradd-cuda module and is exported
 * under this symbol name (a `const kern_ops`), found with dlsym. */
#define KERN_CUDA_OPS_SYMBOL "gradd_kern_cuda_ops"

/* ---- host-side scalar helpers shared by both backends ------------------------- */

/* Round-to-nearest-even fp32 -> bf16, NaN kept quiet. */
static inline KERN_HD uint16_t kern_f32_to_bf16(float f)
{
    union {
        float f;
        uint32_t u;
    } x = {f};
    if ((x.u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x.u >> 16) | 0x40u);
    uint32_t rounding = 0x7fffu + ((x.u >> 16) & 1u);
    return (uint16_t)((x.u + rounding) >> 16);
}

static inline KERN_HD float kern_bf16_to_f32(uint16_t h)
{
    union {
        uint32_t u;
        float f;
    } x = {(uint32_t)h << 16};
    return x.f;
}

/* ---- counter-based random numbers ------------------------------------------------ */
/* splitmix64's output function: a 64-bit mix under which consecutive
 * counters give independent-looking values, for draws that any thread
 * (host or device) makes alike from (seed, index). */
static inline KERN_HD uint64_t kern_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ---- dropout's mask ------------------------------------------------------------ */
/* Element i of the stream `seed` is kept when the top 32 bits of
 * kern_mix64(seed + (i+1)·golden) reach drop_below: each with probability
 * 1 - drop_below / 2^32, independently of every other (i) and of the
 * thread that asks. */
static inline KERN_HD bool kern_dropout_keep(uint64_t seed, uint64_t i, uint32_t drop_below)
{
    return (uint32_t)(kern_mix64(seed + (i + 1) * 0x9E3779B97F4A7C15ull) >> 32) >= drop_below;
}

/* A rate's threshold for kern_dropout_keep and its kept elements' factor,
 * computed alike by every backend. */
static inline void kern_dropout_rate(float p, uint32_t *drop_below, float *keep_scale)
{
    double t = (double)p * 4294967296.0;
    *drop_below = p <= 0 ? 0u : t >= 4294967295.0 ? 4294967295u : (uint32_t)t;
    *keep_scale = p <= 0 ? 1.0f : 1.0f / (1.0f - p);
}

/* ---- fill_pattern --------------------------------------------------------- */
/* p (n,) uint32: p[i] = kern_pattern(seed, i).  Used to prove that memory the
 * pool hands out is really there and writable (every page of a mapped
 * expandable segment, every byte of a raw allocation). */
static inline KERN_HD uint32_t kern_pattern(uint32_t seed, uint64_t i)
{
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)seed << 32 | seed);
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (uint32_t)x;
}

void kern_cpu_fill_pattern(uint32_t *p, size_t n, uint32_t seed);
/* Returns the number of mismatching words (0 when p holds the pattern). */
size_t kern_cpu_check_pattern(const uint32_t *p, size_t n, uint32_t seed);

/* Device pointer p; stream is a cudaStream_t (NULL: the default stream).
 * Returns 0 or a cudaError_t value. */
int kern_cuda_fill_pattern(uint32_t *p, size_t n, uint32_t seed, void *stream);

#ifdef __cplusplus
}
#endif

#endif
