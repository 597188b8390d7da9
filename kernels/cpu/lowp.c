/* lowp.c — the 16-bit activation ops (kernels.h), as their definition says:
 * the fp32 op on the exact widening of the 16-bit inputs, followed by the
 * cast to the context's 16-bit type where the output is 16 bits.
 *
 * They exist on the CPU as the reference the CUDA ones are tested against,
 * and so that a model's 16-bit wiring runs (and is tested) without a GPU.
 * The fp32 intermediates are whole tensors, taken from the caller's scratch
 * callback (the pool, tagged workspace) when there is one: clarity over
 * speed, as nothing trains in 16 bits on this backend. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"

static float *tmp_get(kern_ctx *k, size_t n)
{
    size_t bytes = (n ? n : 1) * sizeof(float);
    if (k->scratch.acquire)
        return k->scratch.acquire(k->scratch.user, bytes);
    return malloc(bytes);
}

static void tmp_put(kern_ctx *k, float *p)
{
    if (!p)
        return;
    if (k->scratch.acquire) {
        if (k->scratch.release)
            k->scratch.release(k->scratch.user, p);
    } else {
        free(p);
    }
}

/* A context asked for fp32 has no 16-bit type: bf16 stands in (the ops are
 * documented for bf16/fp16 contexts only). */
static void narrow(kern_ctx *k, uint16_t *dst, const float *src, size_t n)
{
    if (k->prec == KERN_FP16)
        kcpu_cast_f32_to_f16(k, dst, src, n);
    else
        kcpu_cast_f32_to_bf16(k, dst, src, n);
}

static void widen(kern_ctx *k, float *dst, const uint16_t *src, size_t n)
{
    if (k->prec == KERN_FP16)
        kcpu_cast_f16_to_f32(k, dst, src, n);
    else
        kcpu_cast_bf16_to_f32(k, dst, src, n);
}

/* A scratch copy of src (n) widened to fp32, or NULL (out of scratch). */
static float *tmp_widened(kern_ctx *k, const uint16_t *src, size_t n)
{
    float *t = tmp_get(k, n);
    if (t)
        widen(k, t, src, n);
    return t;
}

/* Out of scratch: the op leaves its outputs as they were.  The kern_ops
 * functions return nothing; callers that can run out (the engine) size
 * activations so that this does not happen, and the CPU backend is not
 * where 16-bit training runs. */

void kcpu_layernorm_forward16(kern_ctx *k, uint16_t *out16, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int N, int C)
{
    size_t n = (size_t)N * C;
    float *t = tmp_get(k, n);
    if (!t)
        return;
    kcpu_layernorm_forward(k, t, mean, rstd, inp, weight, bias, N, C);
    narrow(k, out16, t, n);
    tmp_put(k, t);
}

void kcpu_gelu_forward16(kern_ctx *k, uint16_t *out16, const uint16_t *inp16, size_t N)
{
    float *t = tmp_widened(k, inp16, N);
    if (!t)
        return;
    kcpu_gelu_forward(k, t, t, N);
    narrow(k, out16, t, N);
    tmp_put(k, t);
}

void kcpu_gelu_backward16(kern_ctx *k, uint16_t *dinp16, const uint16_t *inp16, const uint16_t *dout16, size_t N)
{
    float *t = tmp_get(k, 2 * N);
    if (!t)
        return;
    widen(k, t, inp16, N);
    widen(k, t + N, dout16, N);
    kcpu_gelu_backward(k, t + N, t, t + N, N);
    narrow(k, dinp16, t + N, N);
    tmp_put(k, t);
}

void kcpu_matmul_forward16(kern_ctx *k, float *out, const uint16_t *inp16, const uint16_t *weight16,
                           const float *bias, int N, int C, int OC)
{
    size_t ni = (size_t)N * C, nw = (size_t)OC * C;
    float *t = tmp_get(k, ni + nw);
    if (!t)
        return;
    widen(k, t, inp16, ni);
    widen(k, t + ni, weight16, nw);
    kcpu_matmul_forward(k, out, t, t + ni, bias, N, C, OC);
    tmp_put(k, t);
}

void kcpu_layernorm_backward16(kern_ctx *k, float *dinp, uint16_t *dinp16, float *dweight, float *dbias,
                               const float *dout, const uint16_t *dout16, const float *inp, const float *weight,
                               const float *mean, const float *rstd, int N, int C)
{
    if ((!dout) == (!dout16))
        return; /* exactly one of them, says kernels.h */
    size_t n = (size_t)N * C;
    float *t = NULL;
    if (dout16 && !(t = tmp_widened(k, dout16, n)))
        return;
    kcpu_layernorm_backward(k, dinp, dweight, dbias, dout16 ? t : dout, inp, weight, mean, rstd, N, C);
    if (dinp16)
        narrow(k, dinp16, dinp, n);
    tmp_put(k, t);
}

void kcpu_matmul_forward16_residual(kern_ctx *k, float *out, const uint16_t *inp16, const uint16_t *weight16,
                                    const float *bias, const float *res, int N, int C, int OC)
{
    kcpu_matmul_forward16(k, out, inp16, weight16, bias, N, C, OC);
    kcpu_residual_forward(k, out, res, out, (size_t)N * OC);
}

void kcpu_matmul_backward16(kern_ctx *k, float *dinp, uint16_t *dinp16, float *dweight, float *dbias,
                            const float *dout, const uint16_t *dout16, const uint16_t *inp16,
                            const uint16_t *weight16, int N, int C, int OC)
{
    if ((!dout) == (!dout16) || (dinp && dinp16))
        return; /* exactly one dout, at most one dinp, says kernels.h */
    /* Without a weight gradient (a frozen weight) inp16 is not read, and
     * may be NULL. */
    size_t ni = dweight ? (size_t)N * C : 0, nw = (size_t)OC * C, nd = dout16 ? (size_t)N * OC : 0,
           nx = dinp16 ? (size_t)N * C : 0;
    float *t = tmp_get(k, ni + nw + nd + nx);
    if (!t)
        return;
    float *w = t + ni, *d = w + nw, *di = dinp16 ? d + nd : dinp;
    if (dweight)
        widen(k, t, inp16, ni);
    widen(k, w, weight16, nw);
    if (dout16)
        widen(k, d, dout16, nd);
    kcpu_matmul_backward(k, di, dweight, dbias, dout16 ? d : dout, t, w, N, C, OC);
    if (dinp16)
        narrow(k, dinp16, di, nx);
    tmp_put(k, t);
}

void kcpu_matmul_forward16_out16(kern_ctx *k, uint16_t *out16, const uint16_t *inp16, const uint16_t *weight16,
                                 const float *bias, int N, int C, int OC)
{
    size_t no = (size_t)N * OC, nb = bias ? (size_t)OC : 0;
    float *t = tmp_get(k, no + nb + (nb + 1) / 2); /* output, bias, its 16-bit copy */
    if (!t)
        return;
    float *b = NULL;
    if (bias) { /* rounded to 16 bits first, as kernels.h says */
        b = t + no;
        uint16_t *b16 = (uint16_t *)(b + nb);
        narrow(k, b16, bias, nb);
        widen(k, b, b16, nb);
    }
    kcpu_matmul_forward16(k, t, inp16, weight16, b, N, C, OC);
    narrow(k, out16, t, no);
    tmp_put(k, t);
}

/* The definitions of the two fused ops (kernels.h): the ops they fuse, one
 * after the other. */
void kcpu_matmul_forward16_gelu(kern_ctx *k, uint16_t *out16, uint16_t *pre16, const uint16_t *inp16,
                                const uint16_t *weight16, const float *bias, int N, int C, int OC)
{
    kcpu_matmul_forward16_out16(k, pre16, inp16, weight16, bias, N, C, OC);
    kcpu_gelu_forward16(k, out16, pre16, (size_t)N * OC);
}

void kcpu_matmul_backward16_dgelu(kern_ctx *k, uint16_t *dinp16, const uint16_t *pre16, float *dweight, float *dbias,
                                  const uint16_t *dout16, const uint16_t *inp16, const uint16_t *weight16, int N,
                                  int C, int OC)
{
    kcpu_matmul_backward16(k, NULL, dinp16, dweight, dbias, NULL, dout16, inp16, weight16, N, C, OC);
    kcpu_gelu_backward16(k, dinp16, pre16, dinp16, (size_t)N * C);
}

void kcpu_crossentropy_forward16(kern_ctx *k, float *losses, float *lse, const uint16_t *logits16,
                                 const int32_t *targets, int N, int V, int Vp)
{
    float *t = tmp_widened(k, logits16, (size_t)N * Vp);
    if (!t)
        return;
    kcpu_crossentropy_forward(k, losses, lse, t, targets, N, V, Vp);
    tmp_put(k, t);
}

void kcpu_crossentropy_backward16(kern_ctx *k, uint16_t *dlogits16, const uint16_t *logits16, const float *lse,
                                  const int32_t *targets, const float *dloss, int N, int V, int Vp)
{
    size_t n = (size_t)N * Vp;
    float *t = tmp_widened(k, logits16, n);
    if (!t)
        return;
    kcpu_crossentropy_backward(k, t, t, lse, targets, dloss, N, V, Vp);
    narrow(k, dlogits16, t, n);
    tmp_put(k, t);
}

/* The definition (kernels.h): the two ops, the lse in scratch between them. */
void kcpu_crossentropy_fused16(kern_ctx *k, float *losses, uint16_t *logits16, const int32_t *targets,
                               const float *dloss, int N, int V, int Vp)
{
    float *lse = tmp_get(k, (size_t)N);
    if (!lse)
        return;
    kcpu_crossentropy_forward16(k, losses, lse, logits16, targets, N, V, Vp);
    kcpu_crossentropy_backward16(k, logits16, logits16, lse, targets, dloss, N, V, Vp);
    tmp_put(k, lse);
}

/* Llama's: RMSNorm into 16 bits (rstd fp32, bitwise the fp32 op's), its
 * backward as layernorm_backward16's, and SwiGLU between 16-bit tensors. */
void kcpu_rmsnorm_forward16(kern_ctx *k, uint16_t *out16, float *rstd, const float *inp, const float *weight, int N,
                            int C, float eps)
{
    size_t n = (size_t)N * C;
    float *t = tmp_get(k, n);
    if (!t)
        return;
    kcpu_rmsnorm_forward(k, t, rstd, inp, weight, N, C, eps);
    narrow(k, out16, t, n);
    tmp_put(k, t);
}

void kcpu_rmsnorm_backward16(kern_ctx *k, float *dinp, uint16_t *dinp16, float *dweight, const float *dout,
                             const uint16_t *dout16, const float *inp, const float *weight, const float *rstd, int N,
                             int C)
{
    if ((!dout) == (!dout16))
        return; /* exactly one of them, says kernels.h */
    size_t n = (size_t)N * C;
    float *t = NULL;
    if (dout16 && !(t = tmp_widened(k, dout16, n)))
        return;
    kcpu_rmsnorm_backward(k, dinp, dweight, dout16 ? t : dout, inp, weight, rstd, N, C);
    if (dinp16)
        narrow(k, dinp16, dinp, n);
    tmp_put(k, t);
}

void kcpu_swiglu_forward16(kern_ctx *k, uint16_t *out16, const uint16_t *gu16, int N, int F)
{
    size_t n = (size_t)N * F;
    float *t = tmp_get(k, 3 * n);
    if (!t)
        return;
    widen(k, t, gu16, 2 * n);
    kcpu_swiglu_forward(k, t + 2 * n, t, N, F);
    narrow(k, out16, t + 2 * n, n);
    tmp_put(k, t);
}

void kcpu_swiglu_backward16(kern_ctx *k, uint16_t *dgu16, const uint16_t *gu16, const uint16_t *dout16, int N, int F)
{
    size_t n = (size_t)N * F;
    float *t = tmp_get(k, 5 * n);
    if (!t)
        return;
    float *gu = t, *dout = t + 2 * n, *dgu = t + 3 * n;
    widen(k, gu, gu16, 2 * n);
    widen(k, dout, dout16, n);
    kcpu_swiglu_backward(k, dgu, gu, dout, N, F);
    narrow(k, dgu16, dgu, 2 * n);
    tmp_put(k, t);
}

/* Fused attention on a 16-bit qkv: the materialised ops (attention.c) on its
 * widening, the (B,NH,T,T) matrices in scratch; lse is each row's
 * log-sum-exp of the scaled scores over the causal prefix, in double. */
void kcpu_attention_fused_forward16(kern_ctx *k, uint16_t *out16, float *lse, const uint16_t *inp16, int B, int T,
                                    int C, int NH)
{
    size_t ni = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nt = (size_t)B * NH * T * T;
    float *t = tmp_get(k, ni + no + 2 * nt);
    if (!t)
        return;
    float *out = t + ni, *pre = out + no, *att = pre + nt;
    widen(k, t, inp16, ni);
    kcpu_attention_forward(k, out, pre, att, t, B, T, C, NH);
    narrow(k, out16, out, no);
    for (size_t row = 0; row < (size_t)B * NH * T; row++) {
        size_t q = row % (size_t)T;
        const float *s = pre + row * T;
        double m = s[0], sum = 0;
        for (size_t j = 1; j <= q; j++)
            m = s[j] > m ? s[j] : m;
        for (size_t j = 0; j <= q; j++)
            sum += exp((double)s[j] - m);
        lse[row] = (float)(m + log(sum));
    }
    tmp_put(k, t);
}

/* The probabilities again from the widened qkv (out and lse are what the
 * forward gave: the materialised backward needs neither); the fp32
 * gradient from zeros, then rounded into dinp16.  dq is not needed. */
void kcpu_attention_fused_backward16(kern_ctx *k, uint16_t *dinp16, float *dq, const uint16_t *dout16,
                                     const uint16_t *out16, const float *lse, const uint16_t *inp16, int B, int T,
                                     int C, int NH)
{
    (void)dq, (void)out16, (void)lse;
    size_t ni = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nt = (size_t)B * NH * T * T;
    float *t = tmp_get(k, 2 * ni + 2 * no + 3 * nt);
    if (!t)
        return;
    float *g = t + ni, *o = g + ni, *dout = o + no, *pre = dout + no, *att = pre + nt, *datt = att + nt;
    widen(k, t, inp16, ni);
    widen(k, dout, dout16, no);
    kcpu_attention_forward(k, o, pre, att, t, B, T, C, NH);
    memset(g, 0, ni * sizeof *g);
    kcpu_attention_backward(k, g, pre, datt, dout, t, att, B, T, C, NH);
    narrow(k, dinp16, g, ni);
    tmp_put(k, t);
}
