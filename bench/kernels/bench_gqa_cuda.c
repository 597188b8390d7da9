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
 * Where the build found cuDNN (HAVE_CUDNN), its fused attention too
 * (cudnn_sdpa.c, forward), on the same qkv rounded to the 16-bit type:
 * "attention_fwd_cudnn" lines with gqa_mma and with gqa.cu as the peer,
 * and how far its output is from gqa.cu's; or, where cuDNN has no engine
 * for the graph, a line with value null and its reason.  Exits 77 without
 * a usable GPU. */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"
#ifdef HAVE_CUDNN
#include "cudnn_sdpa.h"
#endif

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
    float *out;
} timing;

#ifdef HAVE_CUDNN
/* cuDNN's forward on the qkv of run() rounded to 16 bits: its time (best
 * of 5) and output, widened; fwd_ms < 0 with why where it has none. */
static timing run_cudnn(const kern_ops *ops, kern_precision prec, int B, int T, int NH, int KVH, int HS, char *why,
                        size_t why_len)
{
    timing t = {-1, -1, NULL};
    unsetenv("GRADD_GQA");
    kern_ctx *k = ops->ctx_create(0, 0, prec, NULL);
    if (!k) {
        snprintf(why, why_len, "no CUDA context");
        return t;
    }
    const size_t W = (size_t)(NH + 2 * KVH) * HS, BT = (size_t)B * T, C = (size_t)NH * HS;
    float *qkv = dev_floats(BT * W), *out = dev_floats(BT * C), *stats = dev_floats(BT * NH);
    uint16_t *qkv16 = NULL, *out16 = NULL;
    if (cudaMalloc((void **)&qkv16, BT * W * 2) != cudaSuccess ||
        cudaMalloc((void **)&out16, BT * C * 2) != cudaSuccess) {
        fprintf(stderr, "bench_gqa_cuda: out of device memory\n");
        exit(1);
    }
    fill(ops, k, qkv, BT * W, 1);
    bool bf16 = prec != KERN_FP16;
    (bf16 ? ops->cast_f32_to_bf16 : ops->cast_f32_to_f16)(k, qkv16, qkv, BT * W);
    ops->sync(k);
    sdpa_fwd *p = sdpa_fwd_plan(ops->stream(k), bf16, B, T, NH, KVH, HS, why, why_len);
    for (int r = 0; p && r < 5; r++) {
        double t0 = now_ms();
        if (sdpa_fwd_run(p, qkv16, out16, stats, why, why_len) != 0 || ops->sync(k) != KERN_OK) {
            t.fwd_ms = -1;
            break;
        }
        double dt = now_ms() - t0;
        t.fwd_ms = t.fwd_ms < 0 || dt < t.fwd_ms ? dt : t.fwd_ms;
    }
    if (t.fwd_ms >= 0) {
        (bf16 ? ops->cast_bf16_to_f32 : ops->cast_f16_to_f32)(k, out, out16, BT * C);
        t.out = malloc(BT * C * sizeof *t.out);
        if (t.out)
            ops->copy_d2h(k, t.out, out, BT * C * sizeof *t.out);
    }
    sdpa_fwd_free(p);
    cudaFree(qkv), cudaFree(out), cudaFree(stats), cudaFree(qkv16), cudaFree(out16);
    ops->ctx_destroy(k);
    return t;
}
#endif

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
    timing t = {1e30, 1e30, NULL};
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
    double diff = 0;
    const size_t n = (size_t)B * T * NH * HS;
    for (size_t i = 0; base.out && mma.out && i < n; i++)
        diff = fmax(diff, fabs((double)base.out[i] - (double)mma.out[i]));
    char shape[96];
    snprintf(shape, sizeof shape, "B=%d T=%d NH=%d KVH=%d HS=%d", B, T, NH, KVH, HS);
    const char *pn = prec == KERN_FP16 ? "fp16" : "bf16";
    const char *metric[2] = {"attention_fwd", "attention_bwd"};
    double v[2] = {mma.fwd_ms, mma.bwd_ms}, p[2] = {base.fwd_ms, base.bwd_ms};
    for (int i = 0; i < 2; i++)
        printf("{\"bench\":\"gqa_%s\",\"metric\":\"%s\",\"value\":%.4f,\"unit\":\"ms\",\"peer\":\"gradd gqa.cu (fp32 "
               "CUDA cores)\",\"peer_value\":%.4f,\"ratio\":%.4f,\"shape\":\"%s\",\"max_out_diff\":%.3g}\n",
               pn, metric[i], v[i], p[i], v[i] / p[i], shape, diff);
#ifdef HAVE_CUDNN
    char why[1024] = "";
    timing dnn = run_cudnn(ops, prec, B, T, NH, KVH, HS, why, sizeof why);
    if (dnn.fwd_ms < 0) {
        fprintf(stderr, "bench_gqa_cuda: cuDNN: %s\n", why);
        for (char *c = why; *c; c++)
            if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20)
                *c = ' ';
        printf("{\"bench\":\"gqa_%s\",\"metric\":\"attention_fwd_cudnn\",\"value\":null,\"unit\":\"ms\","
               "\"peer\":\"gradd gqa.cu (fp32 CUDA cores)\",\"peer_value\":%.4f,\"ratio\":null,\"shape\":\"%s\","
               "\"error\":\"%s\"}\n",
               pn, base.fwd_ms, shape, why);
    } else {
        double ddiff = 0;
        for (size_t i = 0; base.out && dnn.out && i < n; i++)
            ddiff = fmax(ddiff, fabs((double)base.out[i] - (double)dnn.out[i]));
        const char *peers[2] = {"gradd gqa.cu (fp32 CUDA cores)", "gradd gqa_mma.cu"};
        double pv[2] = {base.fwd_ms, mma.fwd_ms};
        for (int i = 0; i < 2; i++)
            printf("{\"bench\":\"gqa_%s\",\"metric\":\"attention_fwd_cudnn\",\"value\":%.4f,\"unit\":\"ms\","
                   "\"peer\":\"%s\",\"peer_value\":%.4f,\"ratio\":%.4f,\"shape\":\"%s\","
                   "\"max_out_diff_vs_gqa\":%.3g}\n",
                   pn, dnn.fwd_ms, peers[i], pv[i], dnn.fwd_ms / pv[i], shape, ddiff);
    }
    free(dnn.out);
#endif
    free(base.out);
    free(mma.out);
    return 0;
}
