// test_flash_emu.cc — both fused attention kernel families, the WMMA ones
// (kernels/cuda/flash.cu) and the mma.sync ones (flash_mma.cu, the default),
// run on the CPU under cuda_emu.h, against the CPU backend's materialised
// attention.
//
// No GPU is needed: the kernel source itself is compiled by g++ with
// GRADD_CUDA_EMU, so what is checked is the kernels' own indexing, masking,
// online softmax and fragment plumbing, with mma/ldmatrix emulated from the
// PTX ISA.  flash.cu's two small backward kernels (fa_rowdot's row sums D,
// fa_dq_round's rounding of dq into the 16-bit dinp) are checked on their
// own; the attention cases compute D and round dq themselves.  What it
// cannot check: timing, memory-model effects between CTAs (they run one at
// a time), and the hardware's accumulation order.
//
// Tolerances as tests/gpu/test_gpu_kernels.c uses for fused attention:
// |got − ref| ≤ rtol·|ref| + atol·max|ref|, 2e-2 and 2e-2 (16-bit operands),
// lse 1e-2 and 1e-3; lse is compared with a double-precision log-sum-exp.
//
// Exit status: 0 pass, 1 failure.
#define GRADD_CUDA_EMU 1
#include "flash.cu"
#include "flash_mma.cu"

#include <chrono>
#include <string>

#include "kernels.h"

namespace {

int failures;

uint64_t rng_state = 0x243F6A8885A308D3ull;
float rnd() { return emu_uniform(&rng_state); }

std::vector<float> mk(size_t n, float scale)
{
    std::vector<float> v(n);
    for (auto &x : v)
        x = scale * rnd();
    return v;
}

struct Err {
    double maxref, max_abs, max_rel;
    size_t bad;
};

// scale_floor: the least max|ref| that atol is taken of (for a reference
// that is zero or nearly, e.g. dq at T = 1, where only rounding is left).
Err compare(const float *got, const float *ref, size_t n, double rtol, double atol, double scale_floor = 0)
{
    Err e{scale_floor, 0, 0, 0};
    for (size_t i = 0; i < n; i++)
        if (std::isfinite(ref[i]))
            e.maxref = std::fmax(e.maxref, std::fabs((double)ref[i]));
    for (size_t i = 0; i < n; i++) {
        double x = got[i], y = ref[i], d = std::fabs(x - y);
        if (!(d <= rtol * std::fabs(y) + atol * e.maxref)) // NaN fails
            e.bad++;
        if (d > e.max_abs || std::isnan(d))
            e.max_abs = d;
        double rel = d / std::fmax(std::fabs(y), 1e-3 * e.maxref + 1e-30);
        if (rel > e.max_rel || std::isnan(rel))
            e.max_rel = rel;
    }
    return e;
}

void check(const std::string &name, const char *what, const float *got, const float *ref, size_t n, double rtol,
           double atol, double scale_floor = 0)
{
    Err e = compare(got, ref, n, rtol, atol, scale_floor);
    const char *verdict = e.bad ? "FAIL" : "ok";
    std::printf("  %-40s %-6s max|ref| %-9.3g max abs err %-9.3g max rel err %-9.3g %s\n", name.c_str(), what,
                e.maxref, e.max_abs, e.max_rel, verdict);
    if (e.bad) {
        std::printf("    %zu of %zu elements out of tolerance (rtol %g, atol %g·max)\n", e.bad, n, rtol, atol);
        failures++;
    }
}

const kern_ops *H;
kern_ctx *hk;

// One 16-bit value of type E: its bits, and the fp32 value they are.
template <class E> uint16_t to_bits(float f)
{
    if constexpr (std::is_same_v<E, __nv_bfloat16>)
        return kern_f32_to_bf16(f);
    else
        return __half_as_ushort(__float2half_rn(f));
}
template <class E> float from_bits(uint16_t h)
{
    if constexpr (std::is_same_v<E, __nv_bfloat16>)
        return kern_bf16_to_f32(h);
    else
        return __half2float(__ushort_as_half(h));
}

// in16: q,k,v and dout given to the kernels in E (as the GEMMs write them
// on the 16-bit path), the reference run on the same values widened, and
// the output and dinp written in E too.
// wmma: flash.cu's kernels, launched as fa_launch_forward/backward do;
// else flash_mma.cu's, as fm_launch_forward/backward do.
template <class E>
void run_case(bool wmma, const char *prec, int B, int T, int C, int NH, float amp, bool in16)
{
    const auto t0 = std::chrono::steady_clock::now();
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s %s%s B=%d T=%d C=%d NH=%d amp=%g", wmma ? "wmma" : "mma", prec,
                  in16 ? " in16" : "", B, T, C, NH, amp);
    const std::string name = buf;
    const int hs = C / NH;
    if (hs != FM_HS) {
        std::printf("  %s: head size %d, the kernels need %d\n", name.c_str(), hs, FM_HS);
        failures++;
        return;
    }
    const size_t BTC = (size_t)B * T * C, TT = (size_t)B * NH * T * T, rows = (size_t)B * NH * T;

    // ---- forward
    std::vector<float> inp = mk(3 * BTC, amp), out_ref(BTC), pre(TT), att(TT);
    std::vector<uint16_t> inp16(in16 ? 3 * BTC : 0);
    for (size_t i = 0; i < inp16.size(); i++) {
        inp16[i] = to_bits<E>(inp[i]);
        inp[i] = from_bits<E>(inp16[i]);
    }
    const E *in_e = reinterpret_cast<const E *>(inp16.data());
    H->attention_forward(hk, out_ref.data(), pre.data(), att.data(), inp.data(), B, T, C, NH);
    std::vector<float> out(BTC, NAN), lse(rows, NAN); // NaN: an element never written fails
    std::vector<uint16_t> out16(in16 ? BTC : 0, 0x7fc0);  // a NaN in bf16 and fp16 alike
    {
        float *o = out.data(), *l = lse.data();
        E *o16 = reinterpret_cast<E *>(out16.data());
        const float *in = inp.data();
        const float scale_log2 = 1.44269504088896341f / sqrtf((float)FM_HS); // as fm_launch_forward
        const float scale = 1.0f / sqrtf((float)FA_HS);                      // as fa_launch_forward
        if (wmma)
            emu_launch(kc_attn_grid(B, T, NH, FA_B), dim3(FA_THREADS), [=] {
                if (in16)
                    fa_forward<E, E, E>(o16, l, in_e, T, C, NH, scale);
                else
                    fa_forward<E, float, float>(o, l, in, T, C, NH, scale);
            });
        else
            emu_launch(kc_attn_grid(B, T, NH, FM_FWD_BR), dim3(FM_FWD_THREADS),
                       [=] {
                           if (in16)
                               fm_forward<E, E, E>(o16, l, in_e, T, C, NH, scale_log2);
                           else
                               fm_forward<E, float, float>(o, l, in, T, C, NH, scale_log2);
                       });
    }
    for (size_t i = 0; i < out16.size(); i++) // what backward's row sums read, as fp32
        out[i] = from_bits<E>(out16[i]);
    check(name, "out", out.data(), out_ref.data(), BTC, 2e-2, 2e-2);

    // lse: log Σ_{j ≤ t} exp(q_t·k_j / √hs), in double from q and k as the
    // kernels multiply them, rounded to E (exactly the inputs when in16):
    // from the unrounded ones, a single key's lse near 0 is off by the
    // rounding of q·k alone, far beyond the tolerance relative to it.
    std::vector<float> qk(3 * BTC);
    for (size_t i = 0; i < qk.size(); i++)
        qk[i] = from_bits<E>(to_bits<E>(inp[i]));
    std::vector<float> lse_ref(rows);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = &qk[((size_t)b * T + t) * 3 * C + (size_t)h * hs];
                std::vector<double> s(t + 1);
                double m = -INFINITY;
                for (int j = 0; j <= t; j++) {
                    const float *k = &qk[((size_t)b * T + j) * 3 * C + C + (size_t)h * hs];
                    double d = 0;
                    for (int i = 0; i < hs; i++)
                        d += (double)q[i] * k[i];
                    s[j] = d / std::sqrt((double)hs);
                    m = std::fmax(m, s[j]);
                }
                double sum = 0;
                for (int j = 0; j <= t; j++)
                    sum += std::exp(s[j] - m);
                lse_ref[((size_t)b * NH + h) * T + t] = (float)(m + std::log(sum));
            }
    check(name, "lse", lse.data(), lse_ref.data(), rows, 1e-2, 1e-3);

    // ---- backward: dinp starts non-zero, both sides accumulate into it;
    // in16, where the op overwrites its 16-bit dinp16, that starts as NaNs
    // the kernel must overwrite (dk, dv; dq is rounded in from the zeroed
    // fp32 dq scratch afterwards, as the launcher does).
    std::vector<float> dout = mk(BTC, 1.0f), dinp0 = mk(3 * BTC, 1.0f), dpre(TT), datt(TT);
    std::vector<uint16_t> dout16(in16 ? BTC : 0); // in16: dout in E as well, the reference on its widening
    for (size_t i = 0; i < dout16.size(); i++) {
        dout16[i] = to_bits<E>(dout[i]);
        dout[i] = from_bits<E>(dout16[i]);
    }
    std::vector<float> dinp = dinp0, dq(in16 ? BTC : 0, 0.0f);
    std::vector<uint16_t> dinp16(in16 ? 3 * BTC : 0, 0x7fc0);
    if (in16)
        std::fill(dinp0.begin(), dinp0.end(), 0.0f); // the increments below are then the values
    std::vector<float> dinp_ref = dinp0;
    H->attention_backward(hk, dinp_ref.data(), dpre.data(), datt.data(), dout.data(), inp.data(), att.data(), B, T,
                          C, NH);
    // D (B,NH,T) = Σ_d dout·out over the head, from the kernel's own out (as
    // flash.cu's fa_rowdot does before launching the backward).
    std::vector<float> D(rows);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                size_t o = ((size_t)b * T + t) * C + (size_t)h * hs;
                float s = 0;
                for (int i = 0; i < hs; i++)
                    s += dout[o + i] * out[o + i];
                D[((size_t)b * NH + h) * T + t] = s;
            }
    {
        float *g = dinp.data(), *gq = dq.data();
        E *g16 = reinterpret_cast<E *>(dinp16.data());
        const E *dO16 = reinterpret_cast<const E *>(dout16.data());
        const float *dO = dout.data(), *l = lse.data(), *d = D.data(), *in = inp.data();
        const float scale = 1.0f / sqrtf((float)FM_HS); // as fm_launch_backward and fa_launch_backward
        if (wmma)
            emu_launch(kc_attn_grid(B, T, NH, FA_B), dim3(FA_THREADS), [=] {
                if (in16)
                    fa_backward<E, E>(g16, gq, C, dO16, l, d, in_e, T, C, NH, scale, false);
                else
                    fa_backward<E, float>(g, g, 3 * C, dO, l, d, in, T, C, NH, scale, true);
            });
        else
            emu_launch(kc_attn_grid(B, T, NH, FM_BWD_B), dim3(FM_BWD_THREADS),
                       [=] {
                           if (in16)
                               fm_backward<E, E>(g16, gq, C, dO16, l, d, in_e, T, C, NH, scale, false);
                           else
                               fm_backward<E, float>(g, g, 3 * C, dO, l, d, in, T, C, NH, scale, true);
                       });
    }
    if (in16) { // dq rounded into dinp16 (fa_dq_round), then all of it widened
        for (size_t r = 0; r < (size_t)B * T; r++)
            for (int c = 0; c < C; c++)
                dinp16[r * 3 * C + c] = to_bits<E>(dq[r * C + c]);
        for (size_t i = 0; i < dinp.size(); i++)
            dinp[i] = from_bits<E>(dinp16[i]);
    }
    check(name, "dinp", dinp.data(), dinp_ref.data(), 3 * BTC, 2e-2, 2e-2);

    // The increments alone, q, k and v apart, each against its own largest
    // value: stricter than the above, where dinp0 dominates max|ref|.  The
    // scale is at least 5% of the largest increment of the three, for dq and
    // dk at T = 1: zero exactly, and only rounding (D from the 16-bit out,
    // dP from 16-bit operands) in the kernel's.
    std::vector<float> inc[2][3];
    double inc_max = 0;
    for (int part = 0; part < 3; part++) {
        inc[0][part].resize(BTC);
        inc[1][part].resize(BTC);
        for (size_t r = 0; r < (size_t)B * T; r++)
            for (int c = 0; c < C; c++) {
                size_t i = r * 3 * C + (size_t)part * C + c;
                inc[0][part][r * C + c] = dinp[i] - dinp0[i];
                inc[1][part][r * C + c] = dinp_ref[i] - dinp0[i];
                inc_max = std::fmax(inc_max, std::fabs((double)inc[1][part][r * C + c]));
            }
    }
    const char *what[3] = {"dq", "dk", "dv"};
    for (int part = 0; part < 3; part++)
        check(name, what[part], inc[0][part].data(), inc[1][part].data(), BTC, 2e-2, 2e-2, 0.05 * inc_max);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("  %-40s %.2f s\n", name.c_str(), secs);
}

// ---- the backward's two small kernels -------------------------------------------------

// fa_rowdot and fa_dq_round as fa_backward_any launches them, on kc_grid's
// grid (within max_blocks, so that the loops go round).  D, from fp32 and
// from 16-bit dout and out, against a double sum: each lane rounds two
// products and their sum, five shuffle levels add, so within
// 8·2⁻²⁴·Σ|dout·out|.  dq rounded into dinp16's q columns: one rounding,
// bitwise; the k and v columns keep what they held.
template <class E> void test_bwd_small(const char *prec, int B, int T, int NH, unsigned max_blocks)
{
    char buf[96];
    std::snprintf(buf, sizeof buf, "rowdot, dq_round %s B=%d T=%d NH=%d", prec, B, T, NH);
    const std::string name = buf;
    const int C = NH * FA_HS;
    const size_t rows = (size_t)B * NH * T, BT = (size_t)B * T, BTC = BT * C;
    kern_ctx k{};
    k.sm_count = 1;
    auto grid = [&](size_t work) { return dim3(std::min(kc_grid(&k, work, 256), max_blocks)); };
    std::vector<float> dout = mk(BTC, 1.0f), out = mk(BTC, 1.0f);
    std::vector<uint16_t> dout16(BTC), out16(BTC);
    for (size_t i = 0; i < BTC; i++) {
        dout16[i] = to_bits<E>(dout[i]);
        out16[i] = to_bits<E>(out[i]);
    }
    for (int in16 = 0; in16 < 2; in16++) {
        std::vector<float> D(rows, NAN);
        float *d = D.data();
        if (in16) {
            const E *a = reinterpret_cast<const E *>(dout16.data()), *o = reinterpret_cast<const E *>(out16.data());
            emu_launch(grid(rows * 32), dim3(256), [=] { fa_rowdot<E>(d, a, o, rows, T, C, NH); });
        } else {
            const float *a = dout.data(), *o = out.data();
            emu_launch(grid(rows * 32), dim3(256), [=] { fa_rowdot<float>(d, a, o, rows, T, C, NH); });
        }
        size_t bad = 0;
        double err = 0; // in units of the bound
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++)
                for (int t = 0; t < T; t++) {
                    const size_t o = ((size_t)b * T + t) * C + (size_t)h * FA_HS;
                    double sum = 0, mass = 0;
                    for (int i = 0; i < FA_HS; i++) {
                        const double x = in16 ? from_bits<E>(dout16[o + i]) : dout[o + i];
                        const double y = in16 ? from_bits<E>(out16[o + i]) : out[o + i];
                        sum += x * y;
                        mass += std::fabs(x * y);
                    }
                    const double got = D[((size_t)b * NH + h) * T + t], bound = 8 * std::ldexp(mass, -24);
                    err = std::fmax(err, std::fabs(got - sum) / bound);
                    bad += !(std::fabs(got - sum) <= bound);
                }
        std::printf("  %-40s %-6s max err %-9.3g of bound %s\n", name.c_str(), in16 ? "D 16" : "D fp32", err,
                    bad ? "FAIL" : "ok");
        failures += bad != 0;
    }

    std::vector<float> dq = mk(BTC, 1.0f);
    std::vector<uint16_t> dinp16(3 * BTC, 0x7fc0);
    {
        uint16_t *g = dinp16.data();
        const float *q = dq.data();
        emu_launch(grid(BTC / 4), dim3(256), [=] { fa_dq_round<E>(g, q, BT, C); });
    }
    size_t bad = 0;
    for (size_t r = 0; r < BT; r++)
        for (int c = 0; c < 3 * C; c++)
            bad += dinp16[r * 3 * C + c] != (c < C ? to_bits<E>(dq[r * C + c]) : 0x7fc0);
    std::printf("  %-40s %-6s bitwise %s\n", name.c_str(), "dq", bad ? "FAIL" : "ok");
    failures += bad != 0;
}

} // namespace

int main(int argc, char **argv)
{
    // A quick run (the meson test) covers the shapes below; `all` adds longer
    // and sharper ones for a manual run.
    const bool all = argc > 1 && !std::strcmp(argv[1], "all");
    H = kern_cpu_ops();
    hk = H->ctx_create(1, 0, KERN_FP32, nullptr);
    if (!hk) {
        std::fprintf(stderr, "cpu context\n");
        return 1;
    }
    struct Shape {
        int B, T, C, NH;
        float amp; // inputs uniform in [-amp, amp): 1 as the GPU test; more makes the softmax peaked
    };
    std::vector<Shape> shapes = {{1, 64, 64, 1, 1.0f}, {1, 200, 128, 2, 1.0f}, {2, 133, 128, 2, 1.0f}};
    if (all) {
        shapes.push_back({1, 1, 64, 1, 1.0f});
        shapes.push_back({1, 17, 64, 1, 3.0f});
        shapes.push_back({1, 128, 64, 1, 3.0f});
        shapes.push_back({1, 129, 64, 1, 3.0f});
        shapes.push_back({1, 320, 64, 1, 3.0f});
        shapes.push_back({1, 70, 192, 3, 2.0f});
    }
    const auto t0 = std::chrono::steady_clock::now();
    // Per family and shape, fp32 q,k,v in one precision and 16-bit ones
    // (the other staging path: tile16.cuh's copy, cp.async in the mma
    // kernels) in the other, alternating by shape, so the quick run covers
    // every combination on a shape of several blocks and stays short (each
    // CUDA thread is a thread here, and under ASan in CI that adds up);
    // `all` runs every combination on every shape.
    for (int wmma = 0; wmma < 2; wmma++)
        for (size_t i = 0; i < shapes.size(); i++) {
            const Shape &s = shapes[i];
            const bool odd = i % 2;
            if (!odd || all)
                run_case<__nv_bfloat16>(wmma, "bf16", s.B, s.T, s.C, s.NH, s.amp, false);
            if (odd || all)
                run_case<__half>(wmma, "fp16", s.B, s.T, s.C, s.NH, s.amp, false);
            if (odd || all)
                run_case<__nv_bfloat16>(wmma, "bf16", s.B, s.T, s.C, s.NH, s.amp, true);
            if (!odd || all)
                run_case<__half>(wmma, "fp16", s.B, s.T, s.C, s.NH, s.amp, true);
        }
    // Rows not a multiple of the 8 warps a block, on fewer blocks than
    // rows (the warps go round).
    test_bwd_small<__nv_bfloat16>("bf16", 1, 99, 2, 8);
    test_bwd_small<__half>("fp16", 1, 99, 2, 8);
    H->ctx_destroy(hk);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s: %d failure(s), %.1f s\n", failures ? "FAIL" : "PASS", failures, secs);
    return failures ? 1 : 0;
}
