// test_llama_emu.cc — the CUDA Llama kernels (llama.cu: RMSNorm, also
// frozen, without dweight; RoPE, SwiGLU; gqa.cu: the fused grouped-query
// attention; gqa_mma.cu: the same on the tensor cores, 16-bit operands,
// against the same reference within flash attention's 16-bit tolerances,
// 2e-2 relative and 2e-2 of the largest |reference|; RMSNorm and SwiGLU in
// 16 bits, bitwise their fp32 selves rounded, and within one 16-bit ulp of
// the CPU's 16-bit ops) run on the CPU under
// cuda_emu.h, against the CPU backend's ops (kernels/cpu/llama.c), each
// kernel launched through emu_launch with the grid and block its launcher
// uses.
//
// Both sides compute in fp32 from the same inputs but in other orders (the
// CPU's attention goes through BLAS), so the comparisons are within
// |got − ref| ≤ 1e-5·|ref| + 1e-5 (attention) or 1e-6 (the rest) times the
// largest |ref|; the errors seen are below 1e-6 of it.  What it cannot
// check: the device's own expf, cosf and sinf (glibc's run here; CUDA's
// differ by an ulp or two) and nvcc's FMA contraction.
//
// Exit status: 0 pass, 1 failure.
#define GRADD_CUDA_EMU 1
#include "gqa.cu"
#include "gqa_mma.cu"
#include "llama.cu"
#include "reduce.cu"

#include "emu_check.h"

namespace {

uint64_t rng_state = 0x243F6A8885A308D3ull;
float rnd() { return emu_uniform(&rng_state); }

std::vector<float> rnd_vec(size_t n, float scale, float off = 0.0f)
{
    std::vector<float> v(n);
    for (auto &x : v)
        x = off + scale * rnd();
    return v;
}

// ---- RMSNorm ---------------------------------------------------------------------------
// N rows (not a multiple of the 8 a block holds), C not a multiple of 32.
void test_rmsnorm(int N, int C)
{
    const std::string name = "rmsnorm N=" + std::to_string(N) + " C=" + std::to_string(C);
    const float eps = 1e-5f;
    auto x = rnd_vec((size_t)N * C, 1.0f, 0.3f), w = rnd_vec(C, 0.5f, 1.0f);
    std::vector<float> out((size_t)N * C, NAN), rstd(N, NAN), out_ref((size_t)N * C), rstd_ref(N);
    H->rmsnorm_forward(cpu32, out_ref.data(), rstd_ref.data(), x.data(), w.data(), N, C, eps);
    {
        float *o = out.data(), *r = rstd.data();
        const float *xi = x.data(), *wi = w.data();
        emu_launch(dim3((unsigned)((N + LL_ROWS - 1) / LL_ROWS)), dim3(LL_THREADS),
                   [=] { rms_forward_kernel(o, r, xi, wi, N, C, eps); });
    }
    compare(name, "out", out.data(), out_ref.data(), out.size(), 1e-5, 1e-6);
    compare(name, "rstd", rstd.data(), rstd_ref.data(), N, 1e-5, 0);

    // Backward accumulates: both start from the same random dinp, dweight.
    auto dout = rnd_vec((size_t)N * C, 1.0f), dx0 = rnd_vec((size_t)N * C, 0.1f), dw0 = rnd_vec(C, 0.1f);
    std::vector<float> dx = dx0, dw = dw0, dx_ref = dx0, dw_ref = dw0;
    H->rmsnorm_backward(cpu32, dx_ref.data(), dw_ref.data(), dout.data(), x.data(), w.data(), rstd_ref.data(), N, C);
    kern_ctx kc{};
    const int S = rms_splits(&kc, N, C), rows = (N + S - 1) / S;
    std::vector<float> part((size_t)S * C, NAN);
    {
        float *d = dx.data(), *dwp = dw.data(), *pp = part.data();
        const float *g = dout.data(), *xi = x.data(), *wi = w.data(), *r = rstd_ref.data();
        emu_launch(dim3((unsigned)((N + LL_ROWS - 1) / LL_ROWS)), dim3(LL_THREADS),
                   [=] { rms_backward_kernel<float, float>(d, nullptr, g, xi, wi, r, N, C); });
        emu_launch(dim3((unsigned)((C + 31) / 32), (unsigned)S), dim3(32, 8),
                   [=] { rms_dweight_kernel(pp, g, xi, r, N, C, rows); });
        emu_launch(dim3((unsigned)((C + CS_COLS - 1) / CS_COLS)), dim3(CS_COLS, CM_ROWS),
                   [=] { colsum_merge(dwp, nullptr, pp, nullptr, S, C); });
    }
    compare(name, "dinp (+=)", dx.data(), dx_ref.data(), dx.size(), 1e-5, 1e-6);
    compare(name, "dweight (+=)", dw.data(), dw_ref.data(), C, 1e-5, 1e-6);

    // A frozen norm (dweight NULL): kc_rmsnorm_backward launches the dinp
    // kernel alone, which must give the bits it gives beside the weight
    // gradient's kernels; against the CPU's op without dweight.
    std::vector<float> dxf = dx0, dxf_ref = dx0;
    H->rmsnorm_backward(cpu32, dxf_ref.data(), nullptr, dout.data(), x.data(), w.data(), rstd_ref.data(), N, C);
    {
        float *d = dxf.data();
        const float *g = dout.data(), *xi = x.data(), *wi = w.data(), *r = rstd_ref.data();
        emu_launch(dim3((unsigned)((N + LL_ROWS - 1) / LL_ROWS)), dim3(LL_THREADS),
                   [=] { rms_backward_kernel<float, float>(d, nullptr, g, xi, wi, r, N, C); });
    }
    same<float>(name, "dinp, frozen", dxf.data(), dx.data(), dxf.size());
    compare(name, "dinp, frozen cpu", dxf.data(), dxf_ref.data(), dxf.size(), 1e-5, 1e-6);
}

// ---- RoPE ------------------------------------------------------------------------------
// Rows of W = (NH + 2·KVH)·HS as the model's qkv: the NH + KVH query and
// key heads turn, the value heads must stay as they were, bit for bit.
// pos NULL (row r at r % T) or explicit positions up to a few thousand
// (packed samples that restart, large angles).
void test_rope(int B, int T, int NH, int KVH, int HS, bool with_pos)
{
    char buf[96];
    std::snprintf(buf, sizeof buf, "rope B=%d T=%d NH=%d KVH=%d HS=%d %s", B, T, NH, KVH, HS,
                  with_pos ? "pos" : "no pos");
    const std::string name = buf;
    const int N = B * T, W = (NH + 2 * KVH) * HS, NHR = NH + KVH;
    std::vector<float> inv(HS / 2);
    for (int i = 0; i < HS / 2; i++)
        inv[i] = (float)std::pow(500000.0, -2.0 * i / HS);
    std::vector<int32_t> pos(N);
    for (int r = 0; r < N; r++)
        pos[r] = r % 23 == 7 ? 0 : 4000 + 3 * r; // a sample starts at every row ≡ 7 (mod 23)
    const int32_t *pp = with_pos ? pos.data() : nullptr;
    const auto x0 = rnd_vec((size_t)N * W, 1.0f);
    std::vector<float> x = x0, x_ref = x0;
    H->rope_forward(cpu32, x_ref.data(), inv.data(), pp, N, T, NHR, HS, W);
    const size_t work = (size_t)N * (HS / 2);
    const dim3 grid = grid_for(work, 256, 4); // the grid-stride loop goes round
    {
        float *xp = x.data();
        const float *ip = inv.data();
        emu_launch(grid, dim3(256), [=] { rope_kernel(xp, ip, pp, N, T, NHR, HS, W, 1.0f); });
    }
    compare(name, "forward", x.data(), x_ref.data(), x.size(), 1e-5, 1e-6);
    size_t bad = 0;
    for (int r = 0; r < N; r++)
        bad += std::memcmp(&x[(size_t)r * W + NHR * HS], &x0[(size_t)r * W + NHR * HS],
                           (size_t)KVH * HS * sizeof(float)) != 0;
    verdict(name, "values untouched", bad, N, 0, "bitwise");

    // Backward: the gradient turned back, against the CPU's, and the
    // round trip returns the input (a rotation's transpose is its inverse).
    std::vector<float> d = x, d_ref = x;
    H->rope_backward(cpu32, d_ref.data(), inv.data(), pp, N, T, NHR, HS, W);
    {
        float *dp = d.data();
        const float *ip = inv.data();
        emu_launch(grid, dim3(256), [=] { rope_kernel(dp, ip, pp, N, T, NHR, HS, W, -1.0f); });
    }
    compare(name, "backward", d.data(), d_ref.data(), d.size(), 1e-5, 1e-6);
    compare(name, "round trip", d.data(), x0.data(), d.size(), 1e-5, 1e-6);
}

// ---- SwiGLU ----------------------------------------------------------------------------
void test_swiglu(int N, int F)
{
    const std::string name = "swiglu N=" + std::to_string(N) + " F=" + std::to_string(F);
    const auto gu = rnd_vec((size_t)N * 2 * F, 4.0f); // gates far into both tails of σ
    std::vector<float> out((size_t)N * F, NAN), out_ref((size_t)N * F);
    H->swiglu_forward(cpu32, out_ref.data(), gu.data(), N, F);
    const dim3 grid = grid_for((size_t)N * F, 256, 2);
    {
        float *o = out.data();
        const float *g = gu.data();
        emu_launch(grid, dim3(256), [=] { swiglu_forward_kernel(o, g, N, F); });
    }
    compare(name, "forward", out.data(), out_ref.data(), out.size(), 1e-5, 1e-6);
    const auto dout = rnd_vec((size_t)N * F, 1.0f);
    std::vector<float> dgu((size_t)N * 2 * F, NAN), dgu_ref((size_t)N * 2 * F, NAN); // overwritten
    H->swiglu_backward(cpu32, dgu_ref.data(), gu.data(), dout.data(), N, F);
    {
        float *d = dgu.data();
        const float *g = gu.data(), *go = dout.data();
        emu_launch(grid, dim3(256), [=] { swiglu_backward_kernel(d, g, go, N, F); });
    }
    compare(name, "backward", dgu.data(), dgu_ref.data(), dgu.size(), 1e-5, 1e-6);
}

// ---- the 16-bit RMSNorm and SwiGLU (kernels.h's 16-bit activation ops) -------------------
// Each 16-bit kernel against the same kernel in fp32 on the same (widened)
// inputs, rounded: bitwise, as llama.cu says (rounding only at the store);
// and against the CPU's 16-bit op, within one 16-bit ulp of E where the
// fp32 values on either side of a rounding boundary differ, plus the fp32
// comparisons' allowance.
template <class E>
void close16(const std::string &name, const char *what, const uint16_t *got, const uint16_t *ref, size_t n)
{
    double maxref = 0, err = 0;
    for (size_t i = 0; i < n; i++)
        maxref = std::fmax(maxref, std::fabs((double)from_e<E>(ref[i])));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        const double r = from_e<E>(ref[i]), d = std::fabs((double)from_e<E>(got[i]) - r);
        err = std::fmax(err, d / maxref);
        bad += !(d <= ulp_e<E>((float)r) + 1e-6 * maxref);
    }
    verdict(name, what, bad, n, err, "of max");
}

template <class E> std::vector<uint16_t> round_all(const std::vector<float> &v)
{
    std::vector<uint16_t> r(v.size());
    for (size_t i = 0; i < v.size(); i++)
        r[i] = to_e<E>(v[i]);
    return r;
}

template <class E> std::vector<float> widen_all(const std::vector<uint16_t> &v)
{
    std::vector<float> r(v.size());
    for (size_t i = 0; i < v.size(); i++)
        r[i] = from_e<E>(v[i]);
    return r;
}

template <class E> void test_rmsnorm16(int N, int C)
{
    const std::string name = std::string("rmsnorm16 ") + ename<E>() + " N=" + std::to_string(N) +
                             " C=" + std::to_string(C);
    const float eps = 1e-5f;
    const size_t n = (size_t)N * C;
    auto x = rnd_vec(n, 1.0f, 0.3f), w = rnd_vec(C, 0.5f, 1.0f);
    const dim3 rows((unsigned)((N + LL_ROWS - 1) / LL_ROWS));
    std::vector<float> out32(n), r32(N), r16(N, NAN);
    std::vector<uint16_t> out16(n, 0x7fff), ref16(n);
    {
        float *o = out32.data(), *r = r32.data(), *rh = r16.data();
        E *o16 = reinterpret_cast<E *>(out16.data());
        const float *xi = x.data(), *wi = w.data();
        emu_launch(rows, dim3(LL_THREADS), [=] { rms_forward_kernel<float>(o, r, xi, wi, N, C, eps); });
        emu_launch(rows, dim3(LL_THREADS), [=] { rms_forward_kernel<E>(o16, rh, xi, wi, N, C, eps); });
    }
    same<E>(name, "out = rnd(fp32)", out16.data(), round_all<E>(out32).data(), n);
    same<float>(name, "rstd", r16.data(), r32.data(), N);
    std::vector<float> rstd_ref(N);
    H->rmsnorm_forward16(cpu_ctx<E>(), ref16.data(), rstd_ref.data(), x.data(), w.data(), N, C, eps);
    close16<E>(name, "out vs cpu", out16.data(), ref16.data(), n);

    // Backward from a 16-bit dout (as the gate/up GEMM's backward writes
    // it), writing dinp16 too: against the CPU's rmsnorm_backward16.
    const auto dout16 = round_all<E>(rnd_vec(n, 1.0f));
    const auto dx0 = rnd_vec(n, 0.1f), dw0 = rnd_vec(C, 0.1f);
    std::vector<float> dx = dx0, dw = dw0, dx_ref = dx0, dw_ref = dw0;
    std::vector<uint16_t> dx16(n, 0x7fff), dx16_ref(n);
    H->rmsnorm_backward16(cpu_ctx<E>(), dx_ref.data(), dx16_ref.data(), dw_ref.data(), nullptr, dout16.data(),
                          x.data(), w.data(), rstd_ref.data(), N, C);
    kern_ctx kc{};
    const int S = rms_splits(&kc, N, C), rws = (N + S - 1) / S;
    std::vector<float> part((size_t)S * C, NAN);
    {
        float *d = dx.data(), *dwp = dw.data(), *pp = part.data();
        E *d16 = reinterpret_cast<E *>(dx16.data());
        const E *g = reinterpret_cast<const E *>(dout16.data());
        const float *xi = x.data(), *wi = w.data(), *r = rstd_ref.data();
        emu_launch(rows, dim3(LL_THREADS), [=] { rms_backward_kernel<E, E>(d, d16, g, xi, wi, r, N, C); });
        emu_launch(dim3((unsigned)((C + 31) / 32), (unsigned)S), dim3(32, 8),
                   [=] { rms_dweight_kernel<E>(pp, g, xi, r, N, C, rws); });
        emu_launch(dim3((unsigned)((C + CS_COLS - 1) / CS_COLS)), dim3(CS_COLS, CM_ROWS),
                   [=] { colsum_merge(dwp, nullptr, pp, nullptr, S, C); });
    }
    compare(name, "dinp (+=)", dx.data(), dx_ref.data(), n, 1e-5, 1e-6);
    same<E>(name, "dinp16 = rnd(dinp)", dx16.data(), round_all<E>(dx).data(), n);
    close16<E>(name, "dinp16 vs cpu", dx16.data(), dx16_ref.data(), n);
    compare(name, "dweight (+=)", dw.data(), dw_ref.data(), C, 1e-5, 1e-6);

    // The fp32 kernel on the widened dout gives the same dinp bits.
    std::vector<float> dxw = dx0;
    {
        float *d = dxw.data();
        const auto wide = widen_all<E>(dout16);
        const float *g = wide.data(), *xi = x.data(), *wi = w.data(), *r = rstd_ref.data();
        emu_launch(rows, dim3(LL_THREADS), [=] { rms_backward_kernel<float, float>(d, nullptr, g, xi, wi, r, N, C); });
    }
    same<float>(name, "dinp = fp32 op", dx.data(), dxw.data(), n);
}

template <class E> void test_swiglu16(int N, int F)
{
    const std::string name = std::string("swiglu16 ") + ename<E>() + " N=" + std::to_string(N) +
                             " F=" + std::to_string(F);
    const size_t n = (size_t)N * F;
    const auto gu16 = round_all<E>(rnd_vec(2 * n, 4.0f)), dout16 = round_all<E>(rnd_vec(n, 1.0f));
    const auto gu = widen_all<E>(gu16), dout = widen_all<E>(dout16);
    const dim3 grid = grid_for(n, 256, 2);
    std::vector<float> out32(n), dgu32(2 * n);
    std::vector<uint16_t> out16(n, 0x7fff), dgu16(2 * n, 0x7fff), out_ref(n), dgu_ref(2 * n);
    {
        float *o = out32.data(), *dg = dgu32.data();
        const float *g = gu.data(), *go = dout.data();
        E *o16 = reinterpret_cast<E *>(out16.data()), *dg16 = reinterpret_cast<E *>(dgu16.data());
        const E *g16 = reinterpret_cast<const E *>(gu16.data()), *go16 = reinterpret_cast<const E *>(dout16.data());
        emu_launch(grid, dim3(256), [=] { swiglu_forward_kernel<float>(o, g, N, F); });
        emu_launch(grid, dim3(256), [=] { swiglu_forward_kernel<E>(o16, g16, N, F); });
        emu_launch(grid, dim3(256), [=] { swiglu_backward_kernel<float>(dg, g, go, N, F); });
        emu_launch(grid, dim3(256), [=] { swiglu_backward_kernel<E>(dg16, g16, go16, N, F); });
    }
    same<E>(name, "out = rnd(fp32)", out16.data(), round_all<E>(out32).data(), n);
    same<E>(name, "dgu = rnd(fp32)", dgu16.data(), round_all<E>(dgu32).data(), 2 * n);
    H->swiglu_forward16(cpu_ctx<E>(), out_ref.data(), gu16.data(), N, F);
    H->swiglu_backward16(cpu_ctx<E>(), dgu_ref.data(), gu16.data(), dout16.data(), N, F);
    close16<E>(name, "out vs cpu", out16.data(), out_ref.data(), n);
    close16<E>(name, "dgu vs cpu", dgu16.data(), dgu_ref.data(), 2 * n);
}

// ---- grouped-query attention -------------------------------------------------------------
// packed: each sequence holds samples of 1, 9, 17, ... tokens in turn
// (start[t] = the first token of t's sample), else start NULL.
// The attention tests' inputs: qkv (B,T,W) with the queries scaled up, so
// that the softmax is far from uniform; and packed samples' starts, the
// samples of sequence b 1 + 8b tokens long, then 8 more each.
std::vector<float> gqa_qkv(int B, int T, int NH, int KVH, int HS)
{
    const int W = (NH + 2 * KVH) * HS;
    auto qkv = rnd_vec((size_t)B * T * W, 1.0f);
    for (size_t r = 0; r < (size_t)B * T; r++)
        for (int i = 0; i < NH * HS; i++)
            qkv[r * W + i] *= 3.0f;
    return qkv;
}

std::vector<int32_t> gqa_starts(int B, int T)
{
    std::vector<int32_t> start((size_t)B * T);
    for (int b = 0; b < B; b++) {
        int s0 = 0, len = 1 + 8 * b;
        for (int t = 0; t < T; t++) {
            if (t - s0 >= len) {
                s0 = t;
                len += 8;
            }
            start[(size_t)b * T + t] = s0;
        }
    }
    return start;
}

// dqkv against the reference per part of the row (dq, dk, dv), each
// relative to its own largest |reference|.
void compare_dqkv(const std::string &name, const std::vector<float> &dqkv, const std::vector<float> &ref, int B, int T,
                  int NH, int KVH, int HS, double rtol, double atol)
{
    const int W = (NH + 2 * KVH) * HS;
    std::vector<float> part[3], part_ref[3];
    for (size_t r = 0; r < (size_t)B * T; r++)
        for (int i = 0; i < W; i++) {
            const int p = i < NH * HS ? 0 : i < (NH + KVH) * HS ? 1 : 2;
            part[p].push_back(dqkv[r * W + i]);
            part_ref[p].push_back(ref[r * W + i]);
        }
    const char *what[3] = {"dq", "dk", "dv"};
    for (int p = 0; p < 3; p++)
        compare(name, what[p], part[p].data(), part_ref[p].data(), part[p].size(), rtol, atol);
}

template <int HS> void test_gqa(int B, int T, int NH, int KVH, bool packed)
{
    char buf[96];
    std::snprintf(buf, sizeof buf, "gqa B=%d T=%d NH=%d KVH=%d HS=%d %s", B, T, NH, KVH, HS,
                  packed ? "packed" : "causal");
    const std::string name = buf;
    if (!kc_attention_gqa_ok(nullptr, NH, KVH, HS)) {
        verdict(name, "shape supported", 1, 1, 0, "");
        return;
    }
    const int C = NH * HS;
    const float scale = 1.0f / std::sqrt((float)HS);
    auto qkv = gqa_qkv(B, T, NH, KVH, HS);
    auto start = gqa_starts(B, T);
    const int32_t *st = packed ? start.data() : nullptr;

    std::vector<float> out((size_t)B * T * C, NAN), lse((size_t)B * NH * T, NAN);
    std::vector<float> out_ref(out.size()), lse_ref(lse.size());
    H->attention_gqa_forward(cpu32, out_ref.data(), lse_ref.data(), qkv.data(), st, B, T, NH, KVH, HS);
    {
        float *o = out.data(), *l = lse.data();
        const float *in = qkv.data();
        constexpr int BQ = GQ_WARPS * GQ_FWD_R;
        emu_launch(dim3((unsigned)((T + BQ - 1) / BQ), (unsigned)(B * NH)), dim3(GQ_THREADS),
                   [=] { gqa_forward_kernel<HS>(o, l, in, st, T, NH, KVH, scale); });
    }
    compare(name, "out", out.data(), out_ref.data(), out.size(), 1e-5, 1e-5);
    compare(name, "lse", lse.data(), lse_ref.data(), lse.size(), 1e-5, 1e-6);

    // Backward from the CPU's out and lse (both sides the same inputs);
    // dqkv starts as NaN on both: every element must be written.
    const auto dout = rnd_vec(out.size(), 1.0f);
    std::vector<float> dqkv(qkv.size(), NAN), dqkv_ref(qkv.size(), NAN), Dsum((size_t)B * NH * T, NAN);
    H->attention_gqa_backward(cpu32, dqkv_ref.data(), dout.data(), out_ref.data(), lse_ref.data(), qkv.data(), st, B,
                              T, NH, KVH, HS);
    {
        float *dq = dqkv.data(), *D = Dsum.data();
        const float *go = dout.data(), *o = out_ref.data(), *l = lse_ref.data(), *in = qkv.data();
        emu_launch(grid_for((size_t)B * T * NH, GQ_WARPS, 3), dim3(GQ_THREADS),
                   [=] { gqa_dsum_kernel<HS>(D, go, o, B, T, NH); });
        constexpr int BQ = GQ_WARPS * GQ_DQ_R, BKV = GQ_WARPS * GQ_DKV_R;
        emu_launch(dim3((unsigned)((T + BQ - 1) / BQ), (unsigned)(B * NH)), dim3(GQ_THREADS),
                   [=] { gqa_dq_kernel<HS>(dq, go, l, D, in, st, T, NH, KVH, scale); });
        emu_launch(dim3((unsigned)((T + BKV - 1) / BKV), (unsigned)(B * KVH)), dim3(GQ_THREADS),
                   [=] { gqa_dkv_kernel<HS>(dq, go, l, D, in, st, T, NH, KVH, scale); });
    }
    compare_dqkv(name, dqkv, dqkv_ref, B, T, NH, KVH, HS, 1e-5, 1e-5);
}

// gqa_mma.cu's kernels in E (bf16 or fp16), with the data test_gqa uses,
// over T long enough for several query and key blocks of each head size.
template <class E, int HS> void test_gqa_mma(int B, int T, int NH, int KVH, bool packed)
{
    char buf[112];
    std::snprintf(buf, sizeof buf, "gqa mma %s B=%d T=%d NH=%d KVH=%d HS=%d %s",
                  std::is_same_v<E, __nv_bfloat16> ? "bf16" : "fp16", B, T, NH, KVH, HS, packed ? "packed" : "causal");
    const std::string name = buf;
    using SH = gm_shape<HS>;
    const int W = (NH + 2 * KVH) * HS, C = NH * HS;
    auto qkv = gqa_qkv(B, T, NH, KVH, HS);
    auto start = gqa_starts(B, T);
    const int32_t *st = packed ? start.data() : nullptr;
    std::vector<float> out((size_t)B * T * C, NAN), lse((size_t)B * NH * T, NAN);
    std::vector<float> out_ref(out.size()), lse_ref(lse.size());
    H->attention_gqa_forward(cpu32, out_ref.data(), lse_ref.data(), qkv.data(), st, B, T, NH, KVH, HS);
    {
        float *o = out.data(), *l = lse.data();
        const float *in = qkv.data();
        const float sl2 = 1.44269504088896341f / std::sqrt((float)HS);
        emu_launch(kc_attn_grid(B, T, NH, SH::BR), dim3(SH::FWD_THREADS),
                   [=] { gm_forward<E, HS>(o, l, in, st, T, NH, KVH, sl2); });
    }
    compare(name, "out", out.data(), out_ref.data(), out.size(), 2e-2, 2e-2);
    compare(name, "lse", lse.data(), lse_ref.data(), lse.size(), 1e-2, 1e-3);

    // Backward from the CPU's out and lse; dk and dv start as NaN (every
    // element must be written), dq as the zeros the launcher sets.
    const auto dout = rnd_vec(out.size(), 1.0f);
    std::vector<float> dqkv(qkv.size(), NAN), dqkv_ref(qkv.size(), NAN), Dsum((size_t)B * NH * T, NAN);
    for (size_t r = 0; r < (size_t)B * T; r++)
        for (int i = 0; i < NH * HS; i++)
            dqkv[r * W + i] = 0.0f;
    H->attention_gqa_backward(cpu32, dqkv_ref.data(), dout.data(), out_ref.data(), lse_ref.data(), qkv.data(), st, B,
                              T, NH, KVH, HS);
    {
        float *dq = dqkv.data(), *D = Dsum.data();
        const float *go = dout.data(), *o = out_ref.data(), *l = lse_ref.data(), *in = qkv.data();
        emu_launch(grid_for((size_t)B * T * NH, GQ_WARPS, 3), dim3(GQ_THREADS),
                   [=] { gqa_dsum_kernel<HS>(D, go, o, B, T, NH); });
        const float sc = 1.0f / std::sqrt((float)HS);
        emu_launch(kc_attn_grid(B, T, KVH, SH::B), dim3(SH::BWD_THREADS),
                   [=] { gm_backward<E, HS>(dq, go, l, D, in, st, T, NH, KVH, sc); });
    }
    compare_dqkv(name, dqkv, dqkv_ref, B, T, NH, KVH, HS, 2e-2, 2e-2);
}

void test_gqa_ok()
{
    size_t bad = 0;
    bad += !kc_attention_gqa_ok(nullptr, 32, 8, 64);  // Llama 3.2 1B
    bad += !kc_attention_gqa_ok(nullptr, 32, 8, 128); // Llama 3 8B
    bad += !kc_attention_gqa_ok(nullptr, 12, 12, 64); // no grouping
    bad += kc_attention_gqa_ok(nullptr, 32, 6, 64);   // KVH must divide NH
    bad += kc_attention_gqa_ok(nullptr, 8, 8, 80);    // a head size without a kernel
    bad += kc_attention_gqa_ok(nullptr, 8, 8, 256);
    verdict("attention_gqa_ok", "shapes", bad, 6, 0, "");
}

} // namespace

int main()
{
    const auto t0 = std::chrono::steady_clock::now();
    if (!cpu_open())
        return 1;
    test_rmsnorm(13, 200);
    test_rmsnorm(9, 64);
    test_rope(2, 37, 4, 2, 64, false);
    test_rope(1, 29, 2, 1, 128, true);
    test_swiglu(7, 300);
    test_rmsnorm16<__nv_bfloat16>(13, 200);
    test_rmsnorm16<__half>(9, 64);
    test_swiglu16<__nv_bfloat16>(7, 300);
    test_swiglu16<__half>(5, 96);
    test_gqa_ok();
    // Head sizes 64 and 128, KVH < NH (groups of 2 and 4) and KVH = NH,
    // odd T (a partial last query block and key tile), with and without
    // the packed-sample mask.
    test_gqa<64>(2, 37, 4, 2, false);
    test_gqa<64>(2, 45, 4, 2, true);
    test_gqa<128>(1, 41, 4, 1, false);
    test_gqa<128>(2, 35, 2, 2, true);
    // The other head sizes attention_gqa_ok accepts.
    test_gqa<32>(1, 33, 4, 2, true);
    test_gqa<96>(1, 19, 2, 1, false);
    // The tensor-core kernels: several query blocks (forward 128 or 64
    // rows, backward 64 or 32) and key blocks, a partial last one, groups
    // of 2 and 4, and packed samples whose blocks are skipped.
    test_gqa_mma<__nv_bfloat16, 64>(1, 150, 4, 2, false);
    test_gqa_mma<__nv_bfloat16, 64>(2, 150, 4, 2, true);
    test_gqa_mma<__half, 64>(1, 70, 2, 2, true);
    test_gqa_mma<__nv_bfloat16, 128>(1, 100, 4, 1, false);
    test_gqa_mma<__nv_bfloat16, 128>(1, 100, 4, 1, true);
    return cpu_close(t0);
}
