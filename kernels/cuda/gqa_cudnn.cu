// gqa_cudnn.cu — Llama's attention on cuDNN's fused attention
// (cudnn_sdpa.c), behind gqa.cu's interface, with GRADD_GQA=cudnn.
//
// cuDNN reads and writes 16 bits where the interface has fp32: the op
// rounds qkv (and for the backward out and dout) into its scratch, as the
// GEMMs round their inputs, and widens cuDNN's out and dqkv back.  lse is
// cuDNN's stats, written in place: the same natural log-sum-exp of the
// scaled scores as gqa.cu's.
//
// A shape's forward and backward plans are made together at its first call
// and kept (a few shapes: a run has one, probing a few more).  Where cuDNN
// has no engine for either, the shape stays on gradd's kernels for both,
// so that a backward never reads the stats of another kernel's forward.
// Packed samples (start) are left to gradd's kernels: cuDNN's causal mask
// has no per-row start.  Each decision is said once on stderr: the
// daemon's log (the journal under systemd), or gradd run's terminal.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cudnn_sdpa.h"
#include "kern_cuda.cuh"

#define KC_DNN_SHAPES 8

struct kc_dnn_shape {
    int B, T, NH, KVH, HS;
    sdpa_plan *fwd, *bwd; // both NULL: refused
};

struct kc_dnn {
    sdpa_lib *lib; // NULL: cuDNN could not be had, gradd's kernels for good
    kc_dnn_shape shapes[KC_DNN_SHAPES];
    int nshapes, next;
};

void kc_gqa_cudnn_destroy(kern_ctx *k)
{
    kc_dnn *d = k->dnn;
    if (!d)
        return;
    for (int i = 0; i < d->nshapes; i++) {
        sdpa_plan_free(d->shapes[i].fwd);
        sdpa_plan_free(d->shapes[i].bwd);
    }
    sdpa_close(d->lib);
    free(d);
    k->dnn = NULL;
}

// The library, loaded at the first call; NULL when it cannot be had.
static kc_dnn *dnn_of(kern_ctx *k)
{
    if (k->dnn)
        return k->dnn->lib ? k->dnn : NULL;
    k->dnn = (kc_dnn *)calloc(1, sizeof *k->dnn);
    if (!k->dnn) {
        k->gqa_cudnn = false;
        return NULL;
    }
    char why[512];
    k->dnn->lib = sdpa_open(k->stream, why, sizeof why);
    if (!k->dnn->lib) {
        fprintf(stderr, "gradd-cuda: GRADD_GQA=cudnn, but %s; attention runs on gradd's kernels\n", why);
        return NULL;
    }
    return k->dnn;
}

// The shape's plans, made at its first call; NULL when refused.
static kc_dnn_shape *shape_of(kern_ctx *k, int B, int T, int NH, int KVH, int HS)
{
    kc_dnn *d = dnn_of(k);
    if (!d)
        return NULL;
    for (int i = 0; i < d->nshapes; i++) {
        kc_dnn_shape *s = &d->shapes[i];
        if (s->B == B && s->T == T && s->NH == NH && s->KVH == KVH && s->HS == HS)
            return s->fwd ? s : NULL;
    }
    kc_dnn_shape *s;
    if (d->nshapes < KC_DNN_SHAPES) {
        s = &d->shapes[d->nshapes++];
    } else {
        // Plans are host objects: work queued with an evicted one does not
        // read it again.
        s = &d->shapes[d->next];
        d->next = (d->next + 1) % KC_DNN_SHAPES;
        sdpa_plan_free(s->fwd);
        sdpa_plan_free(s->bwd);
    }
    *s = (kc_dnn_shape){B, T, NH, KVH, HS, NULL, NULL};
    const bool bf16 = k->prec == KERN_BF16;
    char why[1024] = "";
    // Making a plan may compile kernels: its time is said, as a probe at
    // each micro-batch size pays it again.
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    s->fwd = sdpa_plan_make(d->lib, false, bf16, B, T, NH, KVH, HS, why, sizeof why);
    if (s->fwd)
        s->bwd = sdpa_plan_make(d->lib, true, bf16, B, T, NH, KVH, HS, why, sizeof why);
    if (!s->bwd) {
        sdpa_plan_free(s->fwd);
        s->fwd = NULL;
        fprintf(stderr, "gradd-cuda: cuDNN %zu has no attention for B=%d T=%d NH=%d KVH=%d HS=%d (%s); gradd's kernels "
                        "run it\n",
                sdpa_version(d->lib), B, T, NH, KVH, HS, why);
        return NULL;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    fprintf(stderr, "gradd-cuda: attention on cuDNN %zu for B=%d T=%d NH=%d KVH=%d HS=%d (plans made in %.0f ms)\n",
            sdpa_version(d->lib), B, T, NH, KVH, HS, ms);
    return s;
}

// One call's shape and sizes: qkv (nq values) and out (no).
struct kc_dnn_call {
    kc_dnn_shape *s;
    size_t nq, no;
};

// false where cuDNN does not take the call.
static bool take(kern_ctx *k, const int32_t *start, int B, int T, int NH, int KVH, int HS, kc_dnn_call *c)
{
    if (!k->gqa_cudnn || start || k->prec == KERN_FP32 || (HS != 64 && HS != 128))
        return false;
    c->s = shape_of(k, B, T, NH, KVH, HS);
    c->nq = (size_t)B * T * (size_t)(NH + 2 * KVH) * HS;
    c->no = (size_t)B * T * (size_t)NH * HS;
    return c->s != NULL;
}

bool kc_gqa_cudnn_forward(kern_ctx *k, float *out, float *lse, const float *qkv, const int32_t *start, int B, int T,
                          int NH, int KVH, int HS)
{
    kc_dnn_call c;
    if (!take(k, start, B, T, NH, KVH, HS, &c))
        return false;
    const size_t nq = c.nq, no = c.no, o_at = kc_round(nq * 2, 256), ws_at = o_at + kc_round(no * 2, 256);
    char *base = (char *)kc_scratch(k, ws_at + sdpa_plan_scratch(c.s->fwd));
    if (!base)
        return true;
    uint16_t *qkv16 = (uint16_t *)base, *out16 = (uint16_t *)(base + o_at);
    kc_cast_lowp(k, qkv16, qkv, nq, k->prec == KERN_BF16);
    char why[600];
    if (sdpa_forward(c.s->fwd, qkv16, out16, lse, base + ws_at, why, sizeof why) != 0) {
        kc_fail(k, (int)cudaErrorUnknown, "attention_gqa_forward (cuDNN)", why);
        return true;
    }
    kc_widen_lowp(k, out, out16, no);
    kc_launched(k, "attention_gqa_forward (cuDNN)");
    return true;
}

bool kc_gqa_cudnn_backward(kern_ctx *k, float *dqkv, const float *dout, const float *out, const float *lse,
                           const float *qkv, const int32_t *start, int B, int T, int NH, int KVH, int HS)
{
    kc_dnn_call c;
    if (!take(k, start, B, T, NH, KVH, HS, &c))
        return false;
    const size_t nq = c.nq, no = c.no, o_at = kc_round(nq * 2, 256), do_at = o_at + kc_round(no * 2, 256);
    const size_t dq_at = do_at + kc_round(no * 2, 256), ws_at = dq_at + kc_round(nq * 2, 256);
    char *base = (char *)kc_scratch(k, ws_at + sdpa_plan_scratch(c.s->bwd));
    if (!base)
        return true;
    uint16_t *qkv16 = (uint16_t *)base, *out16 = (uint16_t *)(base + o_at), *dout16 = (uint16_t *)(base + do_at);
    uint16_t *dqkv16 = (uint16_t *)(base + dq_at);
    kc_cast_lowp(k, qkv16, qkv, nq, k->prec == KERN_BF16);
    kc_cast_lowp(k, out16, out, no, k->prec == KERN_BF16);
    kc_cast_lowp(k, dout16, dout, no, k->prec == KERN_BF16);
    char why[600];
    if (sdpa_backward(c.s->bwd, qkv16, out16, dout16, lse, dqkv16, base + ws_at, why, sizeof why) != 0) {
        kc_fail(k, (int)cudaErrorUnknown, "attention_gqa_backward (cuDNN)", why);
        return true;
    }
    kc_widen_lowp(k, dqkv, dqkv16, nq);
    kc_launched(k, "attention_gqa_backward (cuDNN)");
    return true;
}
