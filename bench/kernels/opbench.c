/* opbench.c — the op-by-op benchmarks' backend, buffers, timing and
 * output (opbench.h). */
#include "opbench.h"

#include <string.h>
#include <time.h>

#ifndef BENCH_NAME
#define BENCH_NAME "kernels_cpu"
#endif

#ifdef BENCH_CUDA
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#else
#include "base/procenv.h"
#endif

const kern_ops *ob_ops;
kern_ctx *ob_k;
kern_precision ob_prec = KERN_FP32;
char ob_shape[128];
const char *ob_path = "fp32";

static ob_time times[OB_MAX_OPS];
static int ntimes;

/* What ob_close frees: the backend's memory, and the host's. */
typedef struct {
    void **p;
    size_t n, cap;
} held;
static held backend, host;

static void hold(held *h, void *p)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 64;
        void **np = realloc(h->p, cap * sizeof *np);
        if (!np) {
            fprintf(stderr, "%s: out of memory\n", BENCH_NAME);
            exit(1);
        }
        h->p = np;
        h->cap = cap;
    }
    h->p[h->n++] = p;
}

static void release(held *h, void *p)
{
    for (size_t i = h->n; i-- > 0;)
        if (h->p[i] == p) {
            h->p[i] = h->p[--h->n];
            return;
        }
}

static void *host_alloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "%s: out of memory (%zu bytes)\n", BENCH_NAME, bytes);
        exit(1);
    }
    return p;
}

int ob_open(int argc, char **argv, const char *usage, int *first)
{
#ifdef BENCH_CUDA
    *first = 3;
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODULE fp32|bf16|fp16 [%s]\n", argv[0], usage);
        return 2;
    }
    if (strcmp(argv[2], "fp32") == 0) {
        ob_prec = KERN_FP32;
    } else if (strcmp(argv[2], "bf16") == 0) {
        ob_prec = KERN_BF16;
    } else if (strcmp(argv[2], "fp16") == 0) {
        ob_prec = KERN_FP16;
    } else {
        fprintf(stderr, "%s: precision %s: fp32, bf16 or fp16\n", argv[0], argv[2]);
        return 2;
    }
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        fprintf(stderr, "%s: skipped, no usable GPU: %s\n", argv[0],
                e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
        return 77;
    }
    void *mod = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    ob_ops = mod ? (const kern_ops *)dlsym(mod, KERN_CUDA_OPS_SYMBOL) : NULL;
    if (!ob_ops) {
        fprintf(stderr, "%s: %s: %s\n", argv[0], argv[1], dlerror());
        return 1;
    }
    ob_k = ob_ops->ctx_create(0, 0, ob_prec, NULL);
#else
    (void)usage;
    /* The cpu device's GEMMs on the kernels gradd runs them on. */
    procenv_settle(argv);
    *first = 2;
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    ob_ops = kern_cpu_ops();
    /* OB_PRECISION=bf16|fp16: a 16-bit context whose table says its 16-bit
     * ops pay, so that a benchmark runs the sequence of ops it runs on a
     * GPU, with the CPU's reference ops: a check of the benchmark itself
     * (buffers, shapes) without a GPU, not a figure. */
    static kern_ops forced;
    const char *p16 = getenv("OB_PRECISION");
    if (p16 && (!strcmp(p16, "bf16") || !strcmp(p16, "fp16"))) {
        ob_prec = !strcmp(p16, "bf16") ? KERN_BF16 : KERN_FP16;
        forced = *ob_ops;
        forced.act16_native = true;
        ob_ops = &forced;
    }
    ob_k = ob_ops->ctx_create(threads, 0, ob_prec, NULL);
#endif
    if (!ob_k) {
        fprintf(stderr, "%s: no %s context\n", argv[0], ob_ops->name);
        return 1;
    }
    return 0;
}

double ob_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void *ob_alloc(size_t bytes)
{
    void *p = NULL;
#ifdef BENCH_CUDA
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        fprintf(stderr, "%s: out of device memory (%zu bytes)\n", BENCH_NAME, bytes);
        exit(1);
    }
#else
    p = host_alloc(bytes);
#endif
    hold(&backend, p);
    return p;
}

void ob_free(void *p)
{
    release(&backend, p);
#ifdef BENCH_CUDA
    cudaFree(p);
#else
    free(p);
#endif
}

void ob_close(void)
{
    while (backend.n)
        ob_free(backend.p[backend.n - 1]);
    for (size_t i = 0; i < host.n; i++)
        free(host.p[i]);
    free(backend.p);
    free(host.p);
    backend = host = (held){0};
    ob_ops->ctx_destroy(ob_k);
    ob_k = NULL;
}

/* Host values (host_alloc'd), moved to the backend's memory where that is
 * not the host's. */
static void *to_backend(void *h, size_t bytes)
{
#ifdef BENCH_CUDA
    void *d = ob_alloc(bytes);
    ob_ops->copy_h2d(ob_k, d, h, bytes);
    ob_ops->sync(ob_k);
    free(h);
    return d;
#else
    (void)bytes;
    hold(&backend, h);
    return h;
#endif
}

static float *values(size_t n, bool square)
{
    float *p = host_alloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    if (square) /* AdamW's second moment must not be negative */
        for (size_t i = 0; i < n; i++)
            p[i] *= p[i];
    return to_backend(p, n * sizeof *p);
}

void ob_narrow(uint16_t *dst, const float *src, size_t n)
{
    if (ob_prec == KERN_FP16)
        ob_ops->cast_f32_to_f16(ob_k, dst, src, n);
    else
        ob_ops->cast_f32_to_bf16(ob_k, dst, src, n);
}

float *ob_buf(size_t n)
{
    return values(n, false);
}

float *ob_buf_sq(size_t n)
{
    return values(n, true);
}

uint16_t *ob_buf16(size_t n)
{
    float *f = ob_buf(n);
    uint16_t *h = ob_alloc(n * sizeof *h);
    ob_narrow(h, f, n);
    ob_ops->sync(ob_k);
    ob_free(f);
    return h;
}

int32_t *ob_tokens(size_t n, int V)
{
    int32_t *t = host_alloc(n * sizeof *t);
    for (size_t i = 0; i < n; i++)
        t[i] = (int32_t)(i * 7 % (size_t)V);
    return to_backend(t, n * sizeof *t);
}

void ob_check(const char *metric)
{
    if (ob_ops->sync(ob_k) != KERN_OK) { /* a failed op has no time */
        fprintf(stderr, "%s: %s: %s\n", BENCH_NAME, metric, ob_ops->error(ob_k));
        exit(1);
    }
}

void ob_record(const char *metric, double ms, int per_step, int part)
{
    if (ntimes < OB_MAX_OPS)
        times[ntimes++] = (ob_time){metric, ms, per_step, part};
}

/* per_step < 0: a composed figure, which has none. */
static void emit(const char *metric, double ms, int per_step)
{
    char ps[32] = "";
    if (per_step >= 0)
        snprintf(ps, sizeof ps, ",\"per_step\":%d", per_step);
    const char *prec = ob_prec == KERN_BF16 ? "bf16" : ob_prec == KERN_FP16 ? "fp16" : "fp32";
    printf("{\"bench\":\"%s\",\"metric\":\"%s\",\"value\":%.4f,\"unit\":\"ms\",\"shape\":\"%s\","
           "\"precision\":\"%s\",\"path\":\"%s\"%s,\"peer\":null,\"peer_value\":null,\"ratio\":null}\n",
           BENCH_NAME, metric, ms, ob_shape, prec, ob_path, ps);
}

void ob_emit_all(void)
{
    double part[3] = {0, 0, 0};
    for (int i = 0; i < ntimes; i++) {
        emit(times[i].metric, times[i].ms, times[i].per_step);
        part[times[i].part] += times[i].per_step * times[i].ms;
    }
    emit("step_sum_of_ops", part[OB_GEMM] + part[OB_ATTENTION] + part[OB_REST], -1);
    emit("step_gemm_part", part[OB_GEMM], -1);
    emit("step_attention_part", part[OB_ATTENTION], -1);
    emit("step_rest", part[OB_REST], -1);
}

void ob_tensors_init(ob_tensors *t, int n)
{
    *t = (ob_tensors){host_alloc((size_t)n * sizeof(size_t)), host_alloc((size_t)n * sizeof(size_t)),
                      host_alloc((size_t)n * sizeof(bool)), 0, 0};
    hold(&host, t->off);
    hold(&host, t->numel);
    hold(&host, t->decay);
}

size_t ob_add_tensor(ob_tensors *t, size_t numel, bool decay)
{
    size_t off = t->total;
    t->off[t->n] = off;
    t->numel[t->n] = numel;
    t->decay[t->n] = decay;
    t->n++;
    t->total += numel;
    return off;
}

void ob_optimizer(const ob_tensors *t, float *P, uint16_t *P16, float *D, float *m, float *v)
{
    kern_segment *segs = host_alloc((size_t)t->n * sizeof *segs);
    for (int i = 0; i < t->n; i++)
        segs[i] = (kern_segment){t->off[i], t->numel[i], t->decay[i]};
    double sq;
    OB_OP("zero", 1, OB_REST, ob_ops->zero(ob_k, D, t->total));
    OB_OP("sumsq", 1, OB_REST, ob_ops->sumsq(ob_k, &sq, D, t->total));
    OB_OP("adamw_multi", 1, OB_REST,
          ob_ops->adamw_multi(ob_k, P, P16, D, m, v, segs, t->n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1));
    free(segs);
}
