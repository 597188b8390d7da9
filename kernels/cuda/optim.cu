// optim.cu — AdamW (per tensor, or every tensor of a model in one launch) and
// the sum of squares for the global gradient norm.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kern_cuda.cuh"

namespace {

// E: the 16-bit type of p16, the context's (bf16 or fp16); p16 NULL: none.
template <class E> struct adamw_f {
    float *p, *m, *v;
    E *p16;
    const float *g;
    float lr, b1, b2, eps, wd, gs, bc1, bc2;
    template <int W> __device__ void run(size_t i) const
    {
        kc_fv<W> pv = kc_ld<W>(p + i), mv = kc_ld<W>(m + i), vv = kc_ld<W>(v + i), gv = kc_ld<W>(g + i);
#pragma unroll
        for (int j = 0; j < W; j++) {
            float grad = gs * gv.v[j];
            float mj = b1 * mv.v[j] + (1.0f - b1) * grad;
            float vj = b2 * vv.v[j] + (1.0f - b2) * grad * grad;
            float mhat = mj / bc1, vhat = vj / bc2;
            pv.v[j] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * pv.v[j]);
            mv.v[j] = mj;
            vv.v[j] = vj;
        }
        kc_st<W>(p + i, pv);
        kc_st<W>(m + i, mv);
        kc_st<W>(v + i, vv);
        if (p16)
            kc_stE<E, W>(p16 + i, pv);
    }
};

// The functor for step t, bias corrections computed on the host (tests/emu
// builds it the same way).
template <class E>
adamw_f<E> adamw_make(float *p, uint16_t *p16, const float *g, float *m, float *v, float lr, float beta1,
                      float beta2, float eps, float weight_decay, float grad_scale, int t)
{
    adamw_f<E> f;
    f.p = p;
    f.p16 = reinterpret_cast<E *>(p16);
    f.m = m;
    f.v = v;
    f.g = g;
    f.lr = lr;
    f.b1 = beta1;
    f.b2 = beta2;
    f.eps = eps;
    f.wd = weight_decay;
    f.gs = grad_scale;
    f.bc1 = 1.0f - powf(beta1, (float)t);
    f.bc2 = 1.0f - powf(beta2, (float)t);
    return f;
}

// Four elements at a time need p, g, m, v 16-byte aligned and p16 8-byte.
inline bool adamw_vec(const float *p, const uint16_t *p16, const float *g, const float *m, const float *v)
{
    return kc_aligned(16, p, g, m, v) && (!p16 || kc_aligned(8, p16));
}

// ---- adamw_multi: every tensor in one launch ----
//
// The segments are cut into chunks of at most ADAMW_CHUNK elements, one
// block each, so a block's table entry says everything it needs: where,
// how many, whether decay applies, and whether it may go four at a time
// (the chunk starts on a multiple of 4 and holds a multiple of 4; a
// segment's unaligned head and its tail get scalar chunks of their own).
// Each element gets adamw_f's very arithmetic, so the bits are those of
// one adamw call per tensor.
#define ADAMW_CHUNK 16384
#define ADAMW_THREADS 256

// Writes the chunks of segs (when out is not NULL) and returns how many
// there are.  vec: the buffers' bases allow four at a time.
inline size_t adamw_chunks(const kern_segment *segs, int nsegs, bool vec, kc_adamw_chunk *out)
{
    size_t c = 0;
    auto put = [&](size_t off, size_t n, unsigned flags) {
        while (n > 0) {
            size_t take = n < ADAMW_CHUNK ? n : ADAMW_CHUNK;
            if (out)
                out[c] = kc_adamw_chunk{off, (unsigned)take, flags};
            c++;
            off += take;
            n -= take;
        }
    };
    for (int i = 0; i < nsegs; i++) {
        size_t off = segs[i].offset, n = segs[i].n;
        unsigned decay = segs[i].decay ? (unsigned)KC_CHUNK_DECAY : 0u;
        size_t head = vec ? (4 - off % 4) % 4 : n;
        if (head > n)
            head = n;
        put(off, head, decay);
        size_t body = (n - head) / 4 * 4;
        put(off + head, body, decay | KC_CHUNK_VEC);
        put(off + head + body, n - head - body, decay);
    }
    return c;
}

template <class E>
__global__ static void adamw_multi_kernel(adamw_f<E> f, float wd, const kc_adamw_chunk *__restrict__ chunks)
{
    const kc_adamw_chunk c = chunks[blockIdx.x];
    adamw_f<E> h = f;
    h.wd = (c.flags & KC_CHUNK_DECAY) ? wd : 0.0f;
    if (c.flags & KC_CHUNK_VEC) {
        for (unsigned i = threadIdx.x * 4; i < c.n; i += ADAMW_THREADS * 4)
            h.template run<4>(c.off + i);
    } else {
        for (unsigned i = threadIdx.x; i < c.n; i += ADAMW_THREADS)
            h.template run<1>(c.off + i);
    }
}

} // namespace

#ifndef GRADD_CUDA_EMU // the host launchers (tests/emu runs the functor and kernels here itself)
void kc_adamw(kern_ctx *k, float *p, uint16_t *p16, const float *g, float *m, float *v, size_t n, float lr,
              float beta1, float beta2, float eps, float weight_decay, float grad_scale, int t)
{
    kc_enter(k);
    kc_with16(k->prec != KERN_FP16, [&]<class E>() {
        adamw_f<E> f = adamw_make<E>(p, p16, g, m, v, lr, beta1, beta2, eps, weight_decay, grad_scale, t);
        kc_ew(k, n, adamw_vec(p, p16, g, m, v), f, "adamw");
    });
}

// The chunk table for segs, made and copied to the device only when the
// segments or the vector choice differ from the last call's.
static bool adamw_table(kern_ctx *k, const kern_segment *segs, int nsegs, bool vec)
{
    if (k->adamw_chunks && k->adamw_nsegs == nsegs && k->adamw_vec == vec &&
        !memcmp(k->adamw_segs, segs, (size_t)nsegs * sizeof *segs))
        return true;
    kc_dev_free(k, k->adamw_chunks);
    k->adamw_chunks = NULL;
    k->adamw_nchunks = 0;
    free(k->adamw_segs);
    k->adamw_segs = NULL;
    size_t n = adamw_chunks(segs, nsegs, vec, NULL);
    if (n == 0) // only empty segments: nothing to run, nothing to keep
        return true;
    kc_adamw_chunk *host = (kc_adamw_chunk *)malloc(n * sizeof *host);
    kern_segment *keep = (kern_segment *)malloc((size_t)nsegs * sizeof *keep);
    kc_adamw_chunk *dev = (kc_adamw_chunk *)kc_dev_alloc(k, n * sizeof *dev);
    bool ok = host && keep && dev;
    if (ok) {
        adamw_chunks(segs, nsegs, vec, host);
        // Synchronous: host is freed below (once per run, so its cost does not matter).
        ok = kc_ok(k, cudaMemcpy(dev, host, n * sizeof *dev, cudaMemcpyHostToDevice), "adamw_multi: chunk table");
    } else {
        kc_ok(k, cudaErrorMemoryAllocation, "adamw_multi: chunk table");
    }
    free(host);
    if (!ok) {
        kc_dev_free(k, dev);
        free(keep);
        return false;
    }
    memcpy(keep, segs, (size_t)nsegs * sizeof *keep);
    k->adamw_chunks = dev;
    k->adamw_nchunks = n;
    k->adamw_segs = keep;
    k->adamw_nsegs = nsegs;
    k->adamw_vec = vec;
    return true;
}

void kc_adamw_multi(kern_ctx *k, float *p, uint16_t *p16, const float *g, float *m, float *v,
                    const kern_segment *segs, int nsegs, float lr, float beta1, float beta2, float eps,
                    float weight_decay, float grad_scale, int t)
{
    if (nsegs <= 0)
        return;
    kc_enter(k);
    if (!adamw_table(k, segs, nsegs, adamw_vec(p, p16, g, m, v)) || k->adamw_nchunks == 0)
        return;
    kc_with16(k->prec != KERN_FP16, [&]<class E>() {
        adamw_f<E> f = adamw_make<E>(p, p16, g, m, v, lr, beta1, beta2, eps, weight_decay, grad_scale, t);
        adamw_multi_kernel<E>
            <<<(unsigned)k->adamw_nchunks, ADAMW_THREADS, 0, k->stream>>>(f, weight_decay, k->adamw_chunks);
    });
    kc_launched(k, "adamw_multi");
}
#endif

// ---- sumsq: fixed grid (depends on n only), double partials, ordered final sum ----

#define SQ_THREADS 256

__device__ static double block_sum_d(double x)
{
    __shared__ double w[SQ_THREADS / 32];
    x = kc_warp_sum(x);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
        w[warp] = x;
    __syncthreads();
    x = 0.0;
    if (warp == 0) {
        x = lane < SQ_THREADS / 32 ? w[lane] : 0.0;
        x = kc_warp_sum(x);
    }
    return x; // valid in thread 0
}

template <int W> __global__ static void sumsq_partial(const float *__restrict__ g, size_t n, double *partial)
{
    double acc = 0.0;
    size_t nw = n / W;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nw; i += (size_t)gridDim.x * blockDim.x) {
        kc_fv<W> x = kc_ld<W>(g + i * W);
#pragma unroll
        for (int j = 0; j < W; j++)
            acc += (double)x.v[j] * (double)x.v[j];
    }
    if (blockIdx.x == 0 && threadIdx.x < n - nw * W) {
        double x = g[nw * W + threadIdx.x];
        acc += x * x;
    }
    acc = block_sum_d(acc);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = acc;
}

__global__ static void sumsq_final(const double *partial, int nblocks, double *out)
{
    double acc = 0.0;
    for (int i = threadIdx.x; i < nblocks; i += SQ_THREADS)
        acc += partial[i];
    acc = block_sum_d(acc);
    if (threadIdx.x == 0)
        *out = acc;
}

#ifndef GRADD_CUDA_EMU
void kc_sumsq(kern_ctx *k, double *out, const float *g, size_t n)
{
    *out = 0.0;
    if (n == 0)
        return;
    kc_enter(k);
    bool vec = kc_aligned(16, g);
    size_t work = vec ? n / 4 : n;
    size_t blocks = (work + SQ_THREADS - 1) / SQ_THREADS;
    if (blocks > KC_SUMSQ_BLOCKS)
        blocks = KC_SUMSQ_BLOCKS;
    if (blocks == 0)
        blocks = 1;
    if (vec)
        sumsq_partial<4><<<(unsigned)blocks, SQ_THREADS, 0, k->stream>>>(g, n, k->d_small->partial);
    else
        sumsq_partial<1><<<(unsigned)blocks, SQ_THREADS, 0, k->stream>>>(g, n, k->d_small->partial);
    kc_launched(k, "sumsq");
    sumsq_final<<<1, SQ_THREADS, 0, k->stream>>>(k->d_small->partial, (int)blocks, &k->d_small->sumsq);
    kc_launched(k, "sumsq(final)");
    kc_ok(k, cudaMemcpyAsync(&k->h_small->sumsq, &k->d_small->sumsq, sizeof(double), cudaMemcpyDeviceToHost,
                             k->stream),
          "sumsq(copy)");
    if (kc_ok(k, cudaStreamSynchronize(k->stream), "sumsq(sync)"))
        *out = k->h_small->sumsq;
    else
        *out = NAN;
}
#endif
