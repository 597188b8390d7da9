/* bench_gqa_cuda.c — Llama's fused grouped-query attention on the GPU, the
 * two kernels gradd has for it in a 16-bit context, at one shape: the
 * tensor-core ones (kernels/cuda/gqa_mma.cu, GRADD_GQA=mma) against the
 * fp32 CUDA-core ones (gqa.cu, the default): the figures that choose the
 * default.
 * Milliseconds per call, forward and backward, each the best of 5 calls
 * timed to their completion; and how far the two outputs are apart.
 *
 * usage: bench_gqa_cuda MODULE [bf16|fp16] [B T NH KVH HS]
 *   default: bf16, Llama 3.2 1B's attention at batch 4 (B=4 T=2048 NH=32
 *   KVH=8 HS=64).  MODULE: the gradd-cuda.so to take the kernels from.
 * One JSON line per figure: value gqa_mma's, peer_value gqa.cu's, ratio
 * value / peer_value (< 1: the tensor cores are faster).
 *
 * And cuDNN's fused attention (kernels/cuda/cudnn_sdpa.c), twice:
 * - called directly on the same qkv and dout rounded to the 16-bit type:
 *   "attention_fwd_cudnn" and "attention_bwd_cudnn" lines with gqa.cu and
 *   with gqa_mma as the peer; the forward's with how far its output is
 *   from gqa.cu's (max_out_diff_vs_gqa, absolute), the backward's (which
 *   reads cuDNN's own forward's output and stats) with how far its dqkv is
 *   from gqa.cu's (max_dqkv_rel_diff_vs_gqa: the largest difference over
 *   the largest |value| of gqa.cu's).  Where cuDNN has no engine for a
 *   graph, or a run fails, that metric's line has value null and the
 *   reason;
 * - where both ran, as the model calls it (GRADD_GQA=cudnn: fp32 in and
 *   out, the roundings included): "attention_fwd_cudnn_op" and
 *   "attention_bwd_cudnn_op" lines, the same peers and differences.
 * Exits 77 without a usable GPU. */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cudnn_sdpa.h"
#include "kernels.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static float *dev_floats(size_t n)
{
    float *p = NULL;
    if (cudaMalloc((void **)&p, n * sizeof *p) != cudaSuccess) {
        fprintf(stderr, "bench_gqa_cuda: out of device memory (%zu floats)\n", n);
        exit(1);
    }
    return p;
}

/* n values in [-1.5, 1.5) (queries and keys of a peaked softmax) into p. */
static void fill(const kern_ops *ops, kern_ctx *k, float *p, size_t n, unsigned salt)
{
    float *h = malloc(n * sizeof *h);
    if (!h) {
        fprintf(stderr, "bench_gqa_cuda: out of host memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        h[i] = 3.0f * ((float)(((i + salt) * 2654435761u) % 1000) / 1000.0f - 0.5f);
    ops->copy_h2d(k, p, h, n * sizeof *h);
    ops->sync(k);
    free(h);
}

typedef struct {
    double fwd_ms, bwd_ms;
    float *out, *dqkv; /* host copies, fp32 */
} timing;

static uint16_t *dev_halves(size_t n)
{
    uint16_t *p = NULL;
    if (cudaMalloc((void **)&p, n * sizeof *p) != cudaSuccess) {
        fprintf(stderr, "bench_gqa_cuda: out of device memory (%zu 16-bit values)\n", n);
        exit(1);
    }
    return p;
}

/* n 16-bit values at src widened to fp32 through the device scratch
 * buffer tmp, into host memory (NULL if none). */
static float *widen_to_host(const kern_ops *ops, kern_ctx *k, bool bf16, float *tmp, const uint16_t *src, size_t n)
{
    (bf16 ? ops->cast_bf16_to_f32 : ops->cast_f16_to_f32)(k, tmp, src, n);
    float *h = malloc(n * sizeof *h);
    if (h)
        ops->copy_d2h(k, h, tmp, n * sizeof *h);
    return h;
}

/* The buffers of one cuDNN forward and backward, for a call of either. */
typedef struct {
    sdpa_plan *fwd, *bwd;
    const uint16_t *qkv16, *dout16;
    uint16_t *out16, *dqkv16;
    float *stats;
    void *scratch; /* the larger of the two plans' */
} dnn_call;

static int dnn_fwd(const dnn_call *c, char *why, size_t why_len)
{
    return sdpa_forward(c->fwd, c->qkv16, c->out16, c->stats, c->scratch, why, why_len);
}

static int dnn_bwd(const dnn_call *c, char *why, size_t why_len)
{
    return sdpa_backward(c->bwd, c->qkv16, c->out16, c->dout16, c->stats, c->dqkv16, c->scratch, why, why_len);
}

/* The best of 5 calls of run, each timed to its completion; -1 with why
 * where one fails. */
static double best_of_5(const kern_ops *ops, kern_ctx *k, int (*run)(const dnn_call *, char *, size_t),
                        const dnn_call *c, char *why, size_t why_len)
{
    double best = -1;
    for (int r = 0; r < 5; r++) {
        double t0 = now_ms();
        if (run(c, why, why_len) != 0)
            return -1;
        if (ops->sync(k) != KERN_OK) {
            snprintf(why, why_len, "CUDA: %s", ops->error(k));
            return -1;
        }
        double dt = now_ms() - t0;
        best = best < 0 || dt < best ? dt : best;
    }
    return best;
}

/* cuDNN's forward on the qkv of run() rounded to 16 bits, then its
 * backward from that forward's output and stats with the dout of run()
 * rounded to 16 bits: their times (best of 5) and outputs, widened;
 * fwd_ms or bwd_ms < 0 with why or bwd_why where cuDNN has none. */
static timing run_cudnn(const kern_ops *ops, kern_precision prec, int B, int T, int NH, int KVH, int HS, char *why,
                        char *bwd_why, size_t why_len)
{
    timing t = {-1, -1, NULL, NULL};
    unsetenv("GRADD_GQA");
    kern_ctx *k = ops->ctx_create(0, 0, prec, NULL);
    if (!k) {
        snprintf(why, why_len, "no CUDA context");
        snprintf(bwd_why, why_len, "no CUDA context");
        return t;
    }
    const size_t W = (size_t)(NH + 2 * KVH) * HS, BT = (size_t)B * T, C = (size_t)NH * HS;
    float *qkv = dev_floats(BT * W), *dout = dev_floats(BT * C), *stats = dev_floats(BT * NH);
    uint16_t *qkv16 = dev_halves(BT * W), *out16 = dev_halves(BT * C), *dout16 = dev_halves(BT * C);
    uint16_t *dqkv16 = dev_halves(BT * W);
    fill(ops, k, qkv, BT * W, 1);
    fill(ops, k, dout, BT * C, 7);
    bool bf16 = prec != KERN_FP16;
    (bf16 ? ops->cast_f32_to_bf16 : ops->cast_f32_to_f16)(k, qkv16, qkv, BT * W);
    (bf16 ? ops->cast_f32_to_bf16 : ops->cast_f32_to_f16)(k, dout16, dout, BT * C);
    ops->sync(k);
    sdpa_lib *lib = sdpa_open(ops->stream(k), why, why_len);
    dnn_call c = {NULL, NULL, qkv16, dout16, out16, dqkv16, stats, NULL};
    if (lib)
        c.fwd = sdpa_plan_make(lib, false, bf16, B, T, NH, KVH, HS, why, why_len);
    if (c.fwd)
        c.bwd = sdpa_plan_make(lib, true, bf16, B, T, NH, KVH, HS, bwd_why, why_len);
    size_t scratch = c.fwd ? sdpa_plan_scratch(c.fwd) : 0;
    if (c.bwd && sdpa_plan_scratch(c.bwd) > scratch)
        scratch = sdpa_plan_scratch(c.bwd);
    if (c.fwd && cudaMalloc(&c.scratch, scratch ? scratch : 256) != cudaSuccess) {
        fprintf(stderr, "bench_gqa_cuda: out of device memory (cuDNN's scratch, %zu bytes)\n", scratch);
        exit(1);
    }
    if (c.fwd)
        t.fwd_ms = best_of_5(ops, k, dnn_fwd, &c, why, why_len);
    /* once rounded, the fp32 dout and qkv serve as the widening's scratch */
    if (t.fwd_ms >= 0) {
        t.out = widen_to_host(ops, k, bf16, dout, out16, BT * C);
        if (c.bwd)
            t.bwd_ms = best_of_5(ops, k, dnn_bwd, &c, bwd_why, why_len);
        if (t.bwd_ms >= 0)
            t.dqkv = widen_to_host(ops, k, bf16, qkv, dqkv16, BT * W);
    } else if (!bwd_why[0]) {
        snprintf(bwd_why, why_len, "no cuDNN forward to take O and stats from");
    }
    sdpa_plan_free(c.bwd);
    sdpa_plan_free(c.fwd);
    sdpa_close(lib);
    cudaFree(c.scratch);
    cudaFree(qkv), cudaFree(dout), cudaFree(stats);
    cudaFree(qkv16), cudaFree(out16), cudaFree(dout16), cudaFree(dqkv16);
    ops->ctx_destroy(k);
    return t;
}

/* One metric's cuDNN lines: against gqa.cu and gqa_mma (peer_ms), with
 * the output difference diff named diff_name; or, value < 0, one line
 * with value null and why (made JSON-safe in place). */
static void print_cudnn(const char *pn, const char *metric, double value, const double peer_ms[2], const char *shape,
                        const char *diff_name, double diff, char *why)
{
    if (value < 0) {
        fprintf(stderr, "bench_gqa_cuda: cuDNN (%s): %s\n", metric, why);
        for (char *c = why; *c; c++)
            if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20)
                *c = ' ';
        printf("{\"bench\":\"gqa_%s\",\"metric\":\"%s\",\"value\":null,\"unit\":\"ms\","
               "\"peer\":\"gradd gqa.cu (fp32 CUDA cores)\",\"peer_value\":%.4f,\"ratio\":null,\"shape\":\"%s\","
               "\"error\":\"%s\"}\n",
               pn, metric, peer_ms[0], shape, why);
        return;
    }
    const char *peers[2] = {"gradd gqa.cu (fp32 CUDA cores)", "gradd gqa_mma.cu"};
    for (int i = 0; i < 2; i++)
        printf("{\"bench\":\"gqa_%s\",\"metric\":\"%s\",\"value\":%.4f,\"unit\":\"ms\","
               "\"peer\":\"%s\",\"peer_value\":%.4f,\"ratio\":%.4f,\"shape\":\"%s\","
               "\"%s\":%.3g}\n",
               pn, metric, value, peers[i], peer_ms[i], value / peer_ms[i], shape, diff_name, diff);
}

/* The largest |a - b| over n, and (max_b) the largest |b|. */
static double max_diff(const float *a, const float *b, size_t n, double *max_b)
{
    double d = 0, m = 0;
    for (size_t i = 0; a && b && i < n; i++) {
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    if (max_b)
        *max_b = m;
    return d;
}

/* Forward and backward in a context made with GRADD_GQA as given. */
static timing run(const kern_ops *ops, kern_precision prec, const char *gqa, int B, int T, int NH, int KVH, int HS)
{
    if (gqa)
        setenv("GRADD_GQA", gqa, 1);
    else
        unsetenv("GRADD_GQA");
    kern_ctx *k = ops->ctx_create(0, 0, prec, NULL);
    if (!k) {
        fprintf(stderr, "bench_gqa_cuda: no CUDA context\n");
        exit(1);
    }
    const size_t W = (size_t)(NH + 2 * KVH) * HS, BT = (size_t)B * T, C = (size_t)NH * HS;
    float *qkv = dev_floats(BT * W), *out = dev_floats(BT * C), *lse = dev_floats(BT * NH);
    float *dout = dev_floats(BT * C), *dqkv = dev_floats(BT * W);
    fill(ops, k, qkv, BT * W, 1);
    fill(ops, k, dout, BT * C, 7);
    timing t = {1e30, 1e30, NULL, NULL};
    for (int r = 0; r < 5; r++) {
        double t0 = now_ms();
        ops->attention_gqa_forward(k, out, lse, qkv, NULL, B, T, NH, KVH, HS);
        if (ops->sync(k) != KERN_OK) {
            fprintf(stderr, "bench_gqa_cuda: forward: %s\n", ops->error(k));
            exit(1);
        }
        double t1 = now_ms();
        ops->attention_gqa_backward(k, dqkv, dout, out, lse, qkv, NULL, B, T, NH, KVH, HS);
        if (ops->sync(k) != KERN_OK) {
            fprintf(stderr, "bench_gqa_cuda: backward: %s\n", ops->error(k));
            exit(1);
        }
        double t2 = now_ms();
        t.fwd_ms = t1 - t0 < t.fwd_ms ? t1 - t0 : t.fwd_ms;
        t.bwd_ms = t2 - t1 < t.bwd_ms ? t2 - t1 : t.bwd_ms;
    }
    t.out = malloc(BT * C * sizeof *t.out);
    if (t.out)
        ops->copy_d2h(k, t.out, out, BT * C * sizeof *t.out);
    t.dqkv = malloc(BT * W * sizeof *t.dqkv);
    if (t.dqkv)
        ops->copy_d2h(k, t.dqkv, dqkv, BT * W * sizeof *t.dqkv);
    cudaFree(qkv);
    cudaFree(out);
    cudaFree(lse);
    cudaFree(dout);
    cudaFree(dqkv);
    ops->ctx_destroy(k);
    return t;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_gqa_cuda MODULE [bf16|fp16] [B T NH KVH HS]\n");
        return 2;
    }
    kern_precision prec = argc > 2 && !strcmp(argv[2], "fp16") ? KERN_FP16 : KERN_BF16;
    int B = 4, T = 2048, NH = 32, KVH = 8, HS = 64;
    if (argc > 7)
        B = atoi(argv[3]), T = atoi(argv[4]), NH = atoi(argv[5]), KVH = atoi(argv[6]), HS = atoi(argv[7]);
    if (B <= 0 || T <= 0 || NH <= 0 || KVH <= 0 || NH % KVH || (HS != 64 && HS != 128)) {
        fprintf(stderr, "bench_gqa_cuda: bad shape B=%d T=%d NH=%d KVH=%d HS=%d (HS 64 or 128)\n", B, T, NH, KVH, HS);
        return 2;
    }
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        fprintf(stderr, "bench_gqa_cuda: skipped, no usable GPU: %s\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
        return 77;
    }
    void *mod = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    const kern_ops *ops = mod ? (const kern_ops *)dlsym(mod, KERN_CUDA_OPS_SYMBOL) : NULL;
    if (!ops) {
        fprintf(stderr, "bench_gqa_cuda: %s: %s\n", argv[1], dlerror());
        return 1;
    }
    timing base = run(ops, prec, NULL, B, T, NH, KVH, HS), mma = run(ops, prec, "mma", B, T, NH, KVH, HS);
    const size_t n = (size_t)B * T * NH * HS;
    double diff = max_diff(mma.out, base.out, n, NULL);
    char shape[96];
    snprintf(shape, sizeof shape, "B=%d T=%d NH=%d KVH=%d HS=%d", B, T, NH, KVH, HS);
    const char *pn = prec == KERN_FP16 ? "fp16" : "bf16";
    const char *metric[2] = {"attention_fwd", "attention_bwd"};
    double v[2] = {mma.fwd_ms, mma.bwd_ms}, p[2] = {base.fwd_ms, base.bwd_ms};
    for (int i = 0; i < 2; i++)
        printf("{\"bench\":\"gqa_%s\",\"metric\":\"%s\",\"value\":%.4f,\"unit\":\"ms\",\"peer\":\"gradd gqa.cu (fp32 "
               "CUDA cores)\",\"peer_value\":%.4f,\"ratio\":%.4f,\"shape\":\"%s\",\"max_out_diff\":%.3g}\n",
               pn, metric[i], v[i], p[i], v[i] / p[i], shape, diff);
    char why[1024] = "", bwd_why[1024] = "";
    timing dnn = run_cudnn(ops, prec, B, T, NH, KVH, HS, why, bwd_why, sizeof why);
    const size_t nqkv = (size_t)B * T * (NH + 2 * KVH) * HS;
    double bmax = 0, fdiff = max_diff(dnn.out, base.out, n, NULL), bdiff = max_diff(dnn.dqkv, base.dqkv, nqkv, &bmax);
    const double fwd_peers[2] = {base.fwd_ms, mma.fwd_ms}, bwd_peers[2] = {base.bwd_ms, mma.bwd_ms};
    print_cudnn(pn, "attention_fwd_cudnn", dnn.fwd_ms, fwd_peers, shape, "max_out_diff_vs_gqa", fdiff, why);
    print_cudnn(pn, "attention_bwd_cudnn", dnn.bwd_ms, bwd_peers, shape, "max_dqkv_rel_diff_vs_gqa",
                bmax > 0 ? bdiff / bmax : bdiff, bwd_why);
    if (dnn.fwd_ms >= 0 && dnn.bwd_ms >= 0) {
        timing op = run(ops, prec, "cudnn", B, T, NH, KVH, HS);
        fdiff = max_diff(op.out, base.out, n, NULL), bdiff = max_diff(op.dqkv, base.dqkv, nqkv, &bmax);
        print_cudnn(pn, "attention_fwd_cudnn_op", op.fwd_ms, fwd_peers, shape, "max_out_diff_vs_gqa", fdiff, why);
        print_cudnn(pn, "attention_bwd_cudnn_op", op.bwd_ms, bwd_peers, shape, "max_dqkv_rel_diff_vs_gqa",
                    bmax > 0 ? bdiff / bmax : bdiff, bwd_why);
        free(op.out);
        free(op.dqkv);
    }
    free(dnn.out);
    free(dnn.dqkv);
    free(base.out);
    free(mma.out);
    free(base.dqkv);
    free(mma.dqkv);
    return 0;
}
