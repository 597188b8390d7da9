/* kern_ws.c — see kern_ws.h. */
#include "kern_ws.h"

#include <pthread.h>
#include <stdint.h>

/* Kernel contexts are opaque, so the scratch callbacks each one was created
 * with are kept beside it here; test and benchmark processes create few. */
#define WS_MAX_CTX 16

static pthread_mutex_t ws_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t ws_once = PTHREAD_ONCE_INIT;
static struct {
    kern_ops ops;
    const kern_ops *cpu;
    size_t fixed, factor;
    struct {
        kern_ctx *k;
        kern_scratch s;
    } ctx[WS_MAX_CTX];
} ws;

static kern_ctx *ws_ctx_create(int threads, int device, kern_precision prec, const kern_scratch *scratch)
{
    kern_ctx *k = ws.cpu->ctx_create(threads, device, prec, scratch);
    if (!k || !scratch)
        return k;
    pthread_mutex_lock(&ws_lock);
    for (int i = 0; i < WS_MAX_CTX; i++)
        if (!ws.ctx[i].k) {
            ws.ctx[i].k = k;
            ws.ctx[i].s = *scratch;
            break;
        }
    pthread_mutex_unlock(&ws_lock);
    return k;
}

static void ws_ctx_destroy(kern_ctx *k)
{
    pthread_mutex_lock(&ws_lock);
    for (int i = 0; i < WS_MAX_CTX; i++)
        if (ws.ctx[i].k == k)
            ws.ctx[i].k = NULL;
    pthread_mutex_unlock(&ws_lock);
    ws.cpu->ctx_destroy(k);
}

static kern_scratch scratch_of(kern_ctx *k)
{
    kern_scratch s = {0};
    pthread_mutex_lock(&ws_lock);
    for (int i = 0; i < WS_MAX_CTX; i++)
        if (ws.ctx[i].k == k)
            s = ws.ctx[i].s;
    pthread_mutex_unlock(&ws_lock);
    return s;
}

static void ws_matmul_forward(kern_ctx *k, float *out, const float *inp, const float *weight, const float *bias,
                              int N, int C, int OC)
{
    kern_scratch s = scratch_of(k);
    void *w = NULL;
    if (s.acquire) {
        w = s.acquire(s.user, ws.fixed + ws.factor * (size_t)N * (size_t)OC * sizeof(float));
        if (!w)
            return;
    }
    ws.cpu->matmul_forward(k, out, inp, weight, bias, N, C, OC);
    if (w)
        s.release(s.user, w);
}

static void ws_matmul_backward(kern_ctx *k, float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, int N, int C, int OC)
{
    kern_scratch s = scratch_of(k);
    void *w = NULL;
    if (s.acquire) {
        w = s.acquire(s.user, ws.fixed + ws.factor * (size_t)N * (size_t)OC * sizeof(float));
        if (!w)
            return;
    }
    ws.cpu->matmul_backward(k, dinp, dweight, dbias, dout, inp, weight, N, C, OC);
    if (w)
        s.release(s.user, w);
}

static size_t once_fixed, once_factor;

static void build(void)
{
    ws.cpu = kern_cpu_ops();
    ws.ops = *ws.cpu;
    ws.ops.ctx_create = ws_ctx_create;
    ws.ops.ctx_destroy = ws_ctx_destroy;
    ws.ops.matmul_forward = ws_matmul_forward;
    ws.ops.matmul_backward = ws_matmul_backward;
    ws.fixed = once_fixed;
    ws.factor = once_factor;
}

const kern_ops *kern_ws_ops(size_t fixed_bytes, size_t row_factor)
{
    once_fixed = fixed_bytes;
    once_factor = row_factor;
    pthread_once(&ws_once, build);
    return &ws.ops;
}
