// encoder.cu — token + position embedding, forward and backward, and the
// forward from a 16-bit token table (a frozen base's).  wpe NULL: the token
// embedding alone (Llama, whose positions are rotary), and then dwpe is
// NULL too.
//
// Backward is deterministic, without float atomics:
//   dwpe[t] += Σ_b dout[b,t]          one thread per (t, c), b in order;
//   dwte[v] += Σ_{(b,t): inp=v} dout  positions sorted by token with a stable
//       radix sort (cub), then one block per run of equal tokens sums its
//       rows in position order.  Frequent tokens make long runs (and slow
//       blocks) but no contention.
#ifndef GRADD_CUDA_EMU // tests/emu sorts on the host, as cub's stable radix sort does
#include <cub/device/device_radix_sort.cuh>
#endif

#include "kern_cuda.cuh"

// E: wte's element type, fp32 or (encoder_forward16w, a frozen table held
// in 16 bits) bf16/fp16, widened exactly on load.
template <int W, class E>
__global__ static void encoder_forward_kernel(float *__restrict__ out, const int32_t *__restrict__ inp,
                                              const E *__restrict__ wte, const float *__restrict__ wpe,
                                              int BT, int T, int C)
{
    size_t per_row = (size_t)C / W;
    size_t total = (size_t)BT * per_row;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / per_row;
        int c = (int)(i % per_row) * W;
        int t = (int)(bt % (size_t)T);
        int tok = inp[bt];
        kc_fv<W> a = kc_ldE<E, W>(wte + (size_t)tok * C + c);
        if (wpe) {
            kc_fv<W> p = kc_ld<W>(wpe + (size_t)t * C + c);
#pragma unroll
            for (int j = 0; j < W; j++)
                a.v[j] += p.v[j];
        }
        kc_st<W>(out + bt * C + c, a);
    }
}

#ifndef GRADD_CUDA_EMU // the host launchers (tests/emu runs the kernels here itself)
void kc_encoder_forward(kern_ctx *k, float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                        int T, int C)
{
    if (B <= 0 || T <= 0 || C <= 0)
        return;
    kc_enter(k);
    int BT = B * T;
    if (C % 4 == 0 && kc_aligned(16, out, wte, wpe))
        encoder_forward_kernel<4><<<kc_grid(k, (size_t)BT * C / 4, 256), 256, 0, k->stream>>>(out, inp, wte, wpe, BT,
                                                                                           T, C);
    else
        encoder_forward_kernel<1><<<kc_grid(k, (size_t)BT * C, 256), 256, 0, k->stream>>>(out, inp, wte, wpe, BT, T,
                                                                                       C);
    kc_launched(k, "encoder_forward");
}

void kc_encoder_forward16w(kern_ctx *k, float *out, const int32_t *inp, const uint16_t *wte16, const float *wpe,
                           int B, int T, int C)
{
    if (B <= 0 || T <= 0 || C <= 0)
        return;
    kc_enter(k);
    int BT = B * T;
    bool vec = C % 4 == 0 && kc_aligned(16, out, wpe) && kc_aligned(8, wte16);
    // fp16 in an fp16 context, bf16 otherwise: the type the CPU's reads.
    kc_with16(k->prec != KERN_FP16, [&]<class E>() {
        const E *wte = reinterpret_cast<const E *>(wte16);
        if (vec)
            encoder_forward_kernel<4><<<kc_grid(k, (size_t)BT * C / 4, 256), 256, 0, k->stream>>>(out, inp, wte, wpe,
                                                                                               BT, T, C);
        else
            encoder_forward_kernel<1><<<kc_grid(k, (size_t)BT * C, 256), 256, 0, k->stream>>>(out, inp, wte, wpe, BT,
                                                                                           T, C);
    });
    kc_launched(k, "encoder_forward16w");
}
#endif

// dwpe[t, c] += Σ_b dout[b, t, c]
__global__ static void encoder_dwpe_kernel(float *__restrict__ dwpe, const float *__restrict__ dout, int B, int T,
                                           int C)
{
    size_t total = (size_t)T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int b = 0; b < B; b++)
            s += dout[(size_t)b * total + i];
        dwpe[i] += s;
    }
}

__global__ static void iota_kernel(int32_t *p, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        p[i] = i;
}

// Block i: when sorted position i starts a run of token v, dwte[v] += the sum
// of that run's dout rows, in sorted (= position) order.
template <int W>
__global__ static void encoder_dwte_kernel(float *__restrict__ dwte, const float *__restrict__ dout,
                                           const int32_t *__restrict__ keys, const int32_t *__restrict__ pos, int BT,
                                           int C)
{
    __shared__ int end_s;
    int i = blockIdx.x;
    int tok = keys[i];
    if (i > 0 && keys[i - 1] == tok)
        return;
    if (threadIdx.x == 0) {
        int e = i + 1;
        while (e < BT && keys[e] == tok)
            e++;
        end_s = e;
    }
    __syncthreads();
    int end = end_s;
    for (int c = threadIdx.x * W; c < C; c += blockDim.x * W) {
        kc_fv<W> s;
#pragma unroll
        for (int j = 0; j < W; j++)
            s.v[j] = 0.0f;
        for (int r = i; r < end; r++) {
            kc_fv<W> d = kc_ld<W>(dout + (size_t)pos[r] * C + c);
#pragma unroll
            for (int j = 0; j < W; j++)
                s.v[j] += d.v[j];
        }
        float *dst = dwte + (size_t)tok * C + c;
        kc_fv<W> g = kc_ld<W>(dst);
#pragma unroll
        for (int j = 0; j < W; j++)
            g.v[j] += s.v[j];
        kc_st<W>(dst, g);
    }
}

#ifndef GRADD_CUDA_EMU
void kc_encoder_backward(kern_ctx *k, float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                         int T, int C)
{
    if (B <= 0 || T <= 0 || C <= 0)
        return;
    kc_enter(k);
    int BT = B * T;
    if (dwpe) {
        encoder_dwpe_kernel<<<kc_grid(k, (size_t)T * C, 256), 256, 0, k->stream>>>(dwpe, dout, B, T, C);
        kc_launched(k, "encoder_backward(dwpe)");
    }
    if (!dwte)
        return;
    size_t temp_bytes = 0;
    if (!kc_ok(k,
               cub::DeviceRadixSort::SortPairs(NULL, temp_bytes, (const int32_t *)NULL, (int32_t *)NULL,
                                               (const int32_t *)NULL, (int32_t *)NULL, BT, 0, 32, k->stream),
               "encoder_backward(sort size)"))
        return;
    size_t ib = kc_round((size_t)BT * sizeof(int32_t), 256);
    char *buf = (char *)kc_scratch(k, 3 * ib + kc_round(temp_bytes, 256));
    if (!buf)
        return;
    int32_t *keys = (int32_t *)buf, *pos_in = (int32_t *)(buf + ib), *pos = (int32_t *)(buf + 2 * ib);
    void *temp = buf + 3 * ib;
    iota_kernel<<<kc_grid(k, (size_t)BT, 256), 256, 0, k->stream>>>(pos_in, BT);
    kc_launched(k, "encoder_backward(iota)");
    if (!kc_ok(k, cub::DeviceRadixSort::SortPairs(temp, temp_bytes, inp, keys, pos_in, pos, BT, 0, 32, k->stream),
               "encoder_backward(sort)"))
        return;
    unsigned threads = C >= 1024 ? 256 : 128;
    if (C % 4 == 0 && kc_aligned(16, dwte, dout))
        encoder_dwte_kernel<4><<<(unsigned)BT, threads, 0, k->stream>>>(dwte, dout, keys, pos, BT, C);
    else
        encoder_dwte_kernel<1><<<(unsigned)BT, threads, 0, k->stream>>>(dwte, dout, keys, pos, BT, C);
    kc_launched(k, "encoder_backward(dwte)");
}
#endif
