// test_kernels_emu.cc — the CUDA cross-entropy, layernorm (forward, backward), 16-bit GELU
// and column-sum kernels run on the CPU under cuda_emu.h, against the CPU
// backend (kern_cpu_ops(); its *16 ops in kernels/cpu/lowp.c define the
// 16-bit results: the fp32 op, then the cast).
//
// The real kernel sources are compiled by g++ with GRADD_CUDA_EMU (which
// leaves out their <<<>>> host launchers); each kernel is launched here
// through emu_launch with the grid and block its launcher uses, for every
// element type and both vector widths the launchers pick from.  The 4-wide
// loads and stores check their alignment (kern_cuda.cuh), so a vector path
// taken where the GPU would fault fails here too.
//
// What it cannot check: the device's own expf/tanhf/logf (glibc's run here;
// CUDA's differ by an ulp or two, hence tolerances against the CPU) and FMA
// contraction (nvcc contracts, g++ for x86-64 does not): comparisons said to
// be bitwise are between two emulated runs, where both are the same.
//
// This translation unit sees CUDA's struct kern_ctx (kern_cuda.cuh); the CPU
// contexts are only passed back to the CPU ops, never looked into.
//
// Exit status: 0 pass, 1 failure.
#define GRADD_CUDA_EMU 1
#include "layernorm.cu"
#include "loss.cu"
#include "pointwise.cu"
#include "reduce.cu"

#include <algorithm>
#include <chrono>
#include <string>
#include <type_traits>

namespace {

int failures;

uint64_t rng_state = 0x13198A2E03707344ull;
float rnd() { return emu_uniform(&rng_state); }

void verdict(const std::string &name, const char *what, size_t bad, size_t n, double max_err, const char *unit)
{
    std::printf("  %-34s %-14s max err %-10.3g %-8s %s\n", name.c_str(), what, max_err, unit, bad ? "FAIL" : "ok");
    if (bad) {
        std::printf("    %zu of %zu elements wrong\n", bad, n);
        failures++;
    }
}

uint32_t fbits(float f)
{
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// ---- the element types -----------------------------------------------------------------
// E's storage on the host: float, or the raw uint16 bits of a bf16/fp16.
template <class E> using S = std::conditional_t<std::is_same_v<E, float>, float, uint16_t>;
template <class E> constexpr bool is16 = !std::is_same_v<E, float>;

template <class E> S<E> to_e(float f)
{
    if constexpr (std::is_same_v<E, float>)
        return f;
    else if constexpr (std::is_same_v<E, __nv_bfloat16>)
        return kern_f32_to_bf16(f);
    else
        return __half_as_ushort(__float2half_rn(f));
}

template <class E> float from_e(S<E> h)
{
    if constexpr (std::is_same_v<E, float>)
        return h;
    else if constexpr (std::is_same_v<E, __nv_bfloat16>)
        return kern_bf16_to_f32(h);
    else
        return __half2float(__ushort_as_half(h));
}

// The spacing of E's values at |x| (0 for fp32: "within one 16-bit ulp" is
// only a 16-bit allowance).
template <class E> double ulp_e(float x)
{
    if constexpr (std::is_same_v<E, float>) {
        return 0;
    } else {
        S<E> h = to_e<E>(std::fabs(x));
        return std::fabs((double)from_e<E>((S<E>)(h + 1)) - from_e<E>(h));
    }
}

template <class E> const char *ename()
{
    return std::is_same_v<E, float> ? "fp32" : std::is_same_v<E, __nv_bfloat16> ? "bf16" : "fp16";
}

const kern_ops *H;
kern_ctx *cpu32, *cpu_bf16, *cpu_f16; // CPU contexts: the *16 ops narrow to the context's type

template <class E> kern_ctx *cpu_ctx()
{
    return std::is_same_v<E, float> ? cpu32 : std::is_same_v<E, __nv_bfloat16> ? cpu_bf16 : cpu_f16;
}

// ---- cross-entropy -----------------------------------------------------------------------

// Rows 1 and 2 (when there are) have targets −1 and V: NaN loss, and a
// backward without the −1 (no one-hot column).
template <class E, int W> void test_ce(int N, int V, int Vp)
{
    char buf[96];
    std::snprintf(buf, sizeof buf, "ce %s W=%d N=%d V=%d Vp=%d", ename<E>(), W, N, V, Vp);
    const std::string name = buf;
    if (W == 4 && Vp % 4) {
        std::printf("  %s: W=4 needs Vp %% 4 == 0\n", name.c_str());
        failures++;
        return;
    }
    const size_t n = (size_t)N * Vp;
    // Logits rounded to E; the padding holds 1e4, whose exp overflows: a
    // forward that reads it gives inf or NaN.
    std::vector<S<E>> x(n);
    std::vector<float> xf(n); // the same values in fp32
    for (size_t i = 0; i < n; i++) {
        x[i] = to_e<E>(i % Vp < (size_t)V ? 4.0f * rnd() : 1e4f);
        xf[i] = from_e<E>(x[i]);
    }
    std::vector<int32_t> tg(N);
    for (int r = 0; r < N; r++)
        tg[r] = r == 1 ? -1 : r == 2 ? V : (int32_t)((rnd() + 1.0f) * 0.5f * V) % V;

    // ---- forward
    std::vector<float> loss(N, 12345.0f), lse(N, 12345.0f), loss_ref(N), lse_ref(N);
    if constexpr (is16<E>)
        H->crossentropy_forward16(cpu_ctx<E>(), loss_ref.data(), lse_ref.data(), x.data(), tg.data(), N, V, Vp);
    else
        H->crossentropy_forward(cpu32, loss_ref.data(), lse_ref.data(), x.data(), tg.data(), N, V, Vp);
    {
        float *l = loss.data(), *s = lse.data();
        const E *in = reinterpret_cast<const E *>(x.data());
        const int32_t *t = tg.data();
        if (!kc_aligned(4 * sizeof(E), in) && W == 4) // the launcher's condition for W = 4
            emu::fail("test: logits not aligned for W = 4");
        emu_launch(dim3((unsigned)N), dim3(CE_THREADS), [=] { ce_forward_kernel<E, W>(l, s, in, t, V, Vp); });
    }
    size_t bad_l = 0, bad_s = 0;
    double err_l = 0, err_s = 0;
    for (int r = 0; r < N; r++) {
        const bool oob = tg[r] < 0 || tg[r] >= V;
        if (oob) {
            bad_l += !std::isnan(loss[r]);
        } else {
            double d = std::fabs((double)loss[r] - loss_ref[r]);
            err_l = std::fmax(err_l, d / std::fmax(std::fabs(loss_ref[r]), 1e-30));
            bad_l += !(d <= 1e-5 * std::fabs(loss_ref[r]) + 1e-6);
        }
        double d = std::fabs((double)lse[r] - lse_ref[r]);
        err_s = std::fmax(err_s, d / std::fmax(std::fabs(lse_ref[r]), 1e-30));
        bad_s += !(d <= 1e-5 * std::fabs(lse_ref[r]) + 1e-6);
    }
    verdict(name, "loss (NaN oob)", bad_l, N, err_l, "rel");
    verdict(name, "lse", bad_s, N, err_s, "rel");

    // ---- backward, from the reference lse (both sides the same input)
    std::vector<float> dloss(N);
    for (auto &d : dloss)
        d = rnd();
    std::vector<S<E>> g(n, is16<E> ? (S<E>)0x7fff : (S<E>)NAN), g_ref(n); // NaN: an element never written fails
    if constexpr (is16<E>) {
        H->crossentropy_backward16(cpu_ctx<E>(), g_ref.data(), x.data(), lse_ref.data(), tg.data(), dloss.data(), N, V,
                                   Vp);
    } else {
        H->crossentropy_backward(cpu32, g_ref.data(), x.data(), lse_ref.data(), tg.data(), dloss.data(), N, V, Vp);
    }
    std::vector<S<E>> g_in = x; // in place: dlogits == logits
    {
        const float *s = lse_ref.data(), *dl = dloss.data();
        const int32_t *t = tg.data();
        const E *in = reinterpret_cast<const E *>(x.data());
        E *out = reinterpret_cast<E *>(g.data()), *io = reinterpret_cast<E *>(g_in.data());
        emu_launch(dim3((unsigned)N), dim3(CE_THREADS),
                   [=] { ce_backward_kernel<E, W>(out, in, s, t, dl, V, Vp); });
        emu_launch(dim3((unsigned)N), dim3(CE_THREADS),
                   [=] { ce_backward_kernel<E, W>(io, io, s, t, dl, V, Vp); });
    }
    double maxref = 0;
    for (size_t i = 0; i < n; i++)
        maxref = std::fmax(maxref, std::fabs((double)from_e<E>(g_ref[i])));
    size_t bad_g = 0, bad_pad = 0, bad_inplace = 0;
    double err_g = 0;
    for (size_t i = 0; i < n; i++) {
        if (i % Vp >= (size_t)V) {
            bad_pad += fbits(from_e<E>(g[i])) != 0; // +0 exactly
        } else {
            const double ref = from_e<E>(g_ref[i]), d = std::fabs((double)from_e<E>(g[i]) - ref);
            err_g = std::fmax(err_g, d / maxref);
            bad_g += !(d <= ulp_e<E>((float)ref) + 1e-4 * maxref); // NaN fails
        }
        bad_inplace += std::memcmp(&g[i], &g_in[i], sizeof(S<E>)) != 0;
    }
    verdict(name, "dlogits", bad_g, n, err_g, "of max");
    verdict(name, "padding == 0", bad_pad, n, 0, "");
    verdict(name, "in place", bad_inplace, n, 0, "bitwise");
}

// ---- layernorm ----------------------------------------------------------------

struct LnIn {
    int N, C;
    std::vector<float> x, w, b;
};

LnIn ln_inputs(int N, int C)
{
    LnIn in{N, C, std::vector<float>((size_t)N * C), std::vector<float>(C), std::vector<float>(C)};
    for (auto &v : in.x)
        v = 0.5f + rnd(); // off zero, so that the mean matters
    for (int c = 0; c < C; c++) {
        in.w[c] = 1.0f + 0.5f * rnd();
        in.b[c] = 0.2f * rnd();
    }
    return in;
}

// out points `off` elements into a buffer of its own (off = 4 with 16-bit
// outputs: 8-byte aligned, not 16, which the 16-bit launcher allows).
template <int W, class O>
void ln_run(const LnIn &in, S<O> *out, float *mean, float *rstd)
{
    const int N = in.N, C = in.C;
    const float *x = in.x.data(), *w = in.w.data(), *b = in.b.data();
    O *o = reinterpret_cast<O *>(out);
    emu_launch(dim3((unsigned)((N + LN_WARPS - 1) / LN_WARPS)), dim3(32 * LN_WARPS),
               [=] { ln_forward_kernel<W, O>(o, mean, rstd, x, w, b, N, C); });
}

template <int W> void test_ln(int N, int C)
{
    char buf[96];
    std::snprintf(buf, sizeof buf, "layernorm W=%d N=%d C=%d", W, N, C);
    const std::string name = buf;
    const size_t n = (size_t)N * C;
    const LnIn in = ln_inputs(N, C);

    // fp32 against the CPU.
    std::vector<float> out(n, NAN), mean(N, NAN), rstd(N, NAN), out_ref(n), mean_ref(N), rstd_ref(N);
    H->layernorm_forward(cpu32, out_ref.data(), mean_ref.data(), rstd_ref.data(), in.x.data(), in.w.data(),
                         in.b.data(), N, C);
    ln_run<W, float>(in, out.data(), mean.data(), rstd.data());
    auto cmp = [&](const char *what, const float *got, const float *ref, size_t m, double rtol, double atol) {
        double maxref = 0, err = 0;
        for (size_t i = 0; i < m; i++)
            maxref = std::fmax(maxref, std::fabs((double)ref[i]));
        size_t bad = 0;
        for (size_t i = 0; i < m; i++) {
            double d = std::fabs((double)got[i] - ref[i]);
            err = std::fmax(err, d / maxref);
            bad += !(d <= rtol * std::fabs(ref[i]) + atol * maxref);
        }
        verdict(name, what, bad, m, err, "of max");
    };
    cmp("out fp32", out.data(), out_ref.data(), n, 1e-5, 1e-5);
    cmp("mean", mean.data(), mean_ref.data(), N, 1e-5, 1e-6);
    cmp("rstd", rstd.data(), rstd_ref.data(), N, 1e-5, 0);

    auto run16 = [&]<class O>(O *, kern_ctx *ctx) {
        std::vector<uint16_t> buf16(n + 4, 0x7fff), ref16(n);
        uint16_t *o16 = buf16.data() + 4;
        std::vector<float> m16(N, NAN), r16(N, NAN), mr(N), rr(N);
        ln_run<W, O>(in, o16, m16.data(), r16.data());
        // Bitwise the emulated fp32 run rounded, mean and rstd included.
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += o16[i] != to_e<O>(out[i]);
        for (int r = 0; r < N; r++)
            bad += fbits(m16[r]) != fbits(mean[r]) || fbits(r16[r]) != fbits(rstd[r]);
        verdict(name, is16<O> && std::is_same_v<O, __half> ? "fp16 = rnd(fp32)" : "bf16 = rnd(fp32)", bad, n, 0,
                "bitwise");
        // Against the CPU's layernorm_forward16: one 16-bit ulp, where the
        // fp32 values on either side round differently, plus the fp32 allowance.
        H->layernorm_forward16(ctx, ref16.data(), mr.data(), rr.data(), in.x.data(), in.w.data(), in.b.data(), N, C);
        double maxref = 0, err = 0;
        for (size_t i = 0; i < n; i++)
            maxref = std::fmax(maxref, std::fabs((double)from_e<O>(ref16[i])));
        bad = 0;
        for (size_t i = 0; i < n; i++) {
            double ref = from_e<O>(ref16[i]), d = std::fabs((double)from_e<O>(o16[i]) - ref);
            err = std::fmax(err, d / maxref);
            bad += !(d <= ulp_e<O>((float)ref) + 1e-5 * maxref);
        }
        verdict(name, std::is_same_v<O, __half> ? "fp16 vs cpu" : "bf16 vs cpu", bad, n, err, "of max");
    };
    run16((__nv_bfloat16 *)nullptr, cpu_bf16);
    run16((__half *)nullptr, cpu_f16);

    // Backward from the CPU's mean and rstd: dinp += the gradient (from a
    // random start), against the CPU's layernorm_backward; with dinp16, the
    // same fp32 dinp and its rounding, bitwise (layernorm_backward16).
    std::vector<float> dout(n), dinp0(n);
    for (size_t i = 0; i < n; i++) {
        dout[i] = rnd();
        dinp0[i] = rnd();
    }
    std::vector<float> dref = dinp0, dw(C, 0.0f), db(C, 0.0f);
    H->layernorm_backward(cpu32, dref.data(), dw.data(), db.data(), dout.data(), in.x.data(), in.w.data(),
                          mean_ref.data(), rstd_ref.data(), N, C);
    auto bwd = [&]<class E>(E *, const char *what) {
        std::vector<float> g = dinp0;
        std::vector<uint16_t> g16(n + 4, 0x7fff);
        float *gp = g.data();
        E *g16p = std::is_same_v<E, float> ? nullptr : reinterpret_cast<E *>(g16.data() + 4);
        const float *d = dout.data(), *x = in.x.data(), *w = in.w.data(), *m = mean_ref.data(), *r = rstd_ref.data();
        emu_launch(dim3((unsigned)((N + LN_WARPS - 1) / LN_WARPS)), dim3(32 * LN_WARPS),
                   [=] { ln_backward_kernel<W, E, float>(gp, g16p, d, x, w, m, r, N, C); });
        cmp(what, g.data(), dref.data(), n, 1e-5, 1e-5);
        if constexpr (!std::is_same_v<E, float>) {
            // dout in 16 bits (as the GEMM backwards write it): against the
            // CPU's layernorm_backward16 from the same 16-bit dout.
            std::vector<uint16_t> d16(n);
            for (size_t i = 0; i < n; i++)
                d16[i] = to_e<E>(dout[i]);
            std::vector<float> g2 = dinp0, gref = dinp0, dw2(C, 0.0f), db2(C, 0.0f);
            kern_ctx *ctx = std::is_same_v<E, __half> ? cpu_f16 : cpu_bf16;
            H->layernorm_backward16(ctx, gref.data(), nullptr, dw2.data(), db2.data(), nullptr, d16.data(), in.x.data(),
                                    in.w.data(), mean_ref.data(), rstd_ref.data(), N, C);
            float *g2p = g2.data();
            const E *d16p = reinterpret_cast<const E *>(d16.data());
            emu_launch(dim3((unsigned)((N + LN_WARPS - 1) / LN_WARPS)), dim3(32 * LN_WARPS),
                       [=] { ln_backward_kernel<W, E, E>(g2p, nullptr, d16p, x, w, m, r, N, C); });
            cmp(std::is_same_v<E, __half> ? "dinp from fp16" : "dinp from bf16", g2.data(), gref.data(), n, 1e-5,
                1e-5);
        }
        if constexpr (!std::is_same_v<E, float>) {
            size_t bad = 0;
            for (size_t i = 0; i < n; i++)
                bad += g16[4 + i] != to_e<E>(g[i]);
            verdict(name, std::is_same_v<E, __half> ? "dinp16 fp16" : "dinp16 bf16", bad, n, 0, "bitwise");
        }
    };
    bwd((__nv_bfloat16 *)nullptr, "dinp");
    bwd((__half *)nullptr, "dinp (fp16 copy)");
}

// ---- GELU with 16-bit results, through kc_ew's kernel --------------------------------------

// kc_ew's split: with vec, the first n/4·4 elements four at a time, the rest
// one at a time; the grid kc_ew's (kc_grid), at most max_blocks: kc_grid's
// cap, which on a large n makes the grid-stride loop go round, at a size a
// CPU runs quickly (every CUDA thread is a thread here).
template <class F> void ew_run(size_t n, bool vec, const F &f, unsigned max_blocks)
{
    kern_ctx k{};
    k.sm_count = 1;
    auto grid = [&](size_t work) { return dim3(std::min(kc_grid(&k, work, 256), max_blocks)); };
    size_t head = 0;
    if (vec && n >= 4) {
        const size_t nv = n / 4;
        emu_launch(grid(nv), dim3(256), [=] { kc_ew_kernel<4, F>(0, nv, f); });
        head = nv * 4;
    }
    if (head < n)
        emu_launch(grid(n - head), dim3(256), [=] { kc_ew_kernel<1, F>(head, n - head, f); });
}

template <bool BF16> void test_gelu16(size_t n, bool vec, unsigned max_blocks)
{
    using E = kc_e16<BF16>;
    char buf[96];
    std::snprintf(buf, sizeof buf, "gelu16 %s n=%zu %s grid<=%u", ename<E>(), n, vec ? "vec" : "scalar", max_blocks);
    const std::string name = buf;
    // Scalar: the pointers one element in, as a caller's unaligned ones
    // (kc_gelu_forward16 would then pick the scalar path).
    const size_t off = vec ? 0 : 1;
    std::vector<uint16_t> xb(n + off), db(n + off), yb(n + off, 0x7fff), ref(n);
    std::vector<float> xw(n), dw(n), f32(n, NAN);
    for (size_t i = 0; i < n + off; i++) {
        xb[i] = to_e<E>(4.0f * rnd());
        db[i] = to_e<E>(rnd());
    }
    uint16_t *x = xb.data() + off, *d = db.data() + off, *y = yb.data() + off;
    for (size_t i = 0; i < n; i++) { // the fp32 functors' inputs: the 16-bit ones widened
        xw[i] = from_e<E>(x[i]);
        dw[i] = from_e<E>(d[i]);
    }
    E *xe = reinterpret_cast<E *>(x), *de = reinterpret_cast<E *>(d), *ye = reinterpret_cast<E *>(y);
    kern_ctx *ctx = BF16 ? cpu_bf16 : cpu_f16;
    for (int pass = 0; pass < 3; pass++) { // forward, backward, backward in place over dout
        std::fill(yb.begin(), yb.end(), 0x7fff);
        if (pass == 0) {
            ew_run(n, vec, gelu_fwd_f<E>{ye, xe}, max_blocks);
            ew_run(n, vec, gelu_fwd_f<float>{f32.data(), xw.data()}, max_blocks);
            H->gelu_forward16(ctx, ref.data(), x, n);
        } else {
            if (pass == 2)
                std::copy(d, d + n, y);
            ew_run(n, vec, gelu_bwd_f<E>{ye, xe, pass == 2 ? ye : de}, max_blocks);
            ew_run(n, vec, gelu_bwd_f<float>{f32.data(), xw.data(), dw.data()}, max_blocks);
            H->gelu_backward16(ctx, ref.data(), x, d, n);
        }
        const char *what[] = {"fwd", "bwd", "bwd in place"};
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += y[i] != to_e<E>(f32[i]);
        verdict(name, (std::string(what[pass]) + " = rnd(fp32)").c_str(), bad, n, 0, "bitwise");
        double maxref = 0, err = 0;
        for (size_t i = 0; i < n; i++)
            maxref = std::fmax(maxref, std::fabs((double)from_e<E>(ref[i])));
        bad = 0;
        for (size_t i = 0; i < n; i++) {
            double r = from_e<E>(ref[i]), dd = std::fabs((double)from_e<E>(y[i]) - r);
            err = std::fmax(err, dd / maxref);
            bad += !(dd <= ulp_e<E>((float)r) + 1e-6 * maxref);
        }
        verdict(name, (std::string(what[pass]) + " vs cpu").c_str(), bad, n, err, "of max");
    }
    if (yb[0] != 0x7fff && off) // the element before the output is not the kernel's
        verdict(name, "out of range", 1, 1, 0, "");
}

// ---- column sums -----------------------------------------------------------------------

// dst_a[c] (+ dst_b with LN) after colsum_partial<LN, T> over S splits of
// `rows` rows and colsum_final, as kc_colsum / kc_colsum16 launch them.
template <bool LN, class T>
void colsum_run(std::vector<float> &dst_a, std::vector<float> &dst_b, const S<T> *dout, const float *inp,
                const float *mean, const float *rstd, int N, int C, int nsplit, int rows)
{
    std::vector<float> part((size_t)nsplit * C * (LN ? 2 : 1), NAN);
    float *pa = part.data(), *pb = LN ? part.data() + (size_t)nsplit * C : nullptr;
    const T *d = reinterpret_cast<const T *>(dout);
    emu_launch(dim3((unsigned)((C + CS_COLS - 1) / CS_COLS), (unsigned)nsplit), dim3(CS_COLS, CS_ROWS),
               [=] { colsum_partial<LN, T>(d, inp, mean, rstd, pa, pb, N, C, rows); });
    float *a = dst_a.data(), *b = LN ? dst_b.data() : nullptr;
    emu_launch(dim3((unsigned)((C + 255) / 256)), dim3(256), [=] { colsum_final(a, b, pa, pb, nsplit, C); });
}

// custom_S > 0: that many splits instead of kc_colsum's (more rows per split
// than its shapes give at a test's size, so each thread adds several).
template <bool LN, class T> void test_colsum(int N, int C, int custom_S)
{
    cs_shape sh = cs_shape_of(N, C);
    int nsplit = sh.S, rows = sh.rows;
    if (custom_S > 0) {
        rows = (N + custom_S - 1) / custom_S;
        nsplit = (N + rows - 1) / rows;
    }
    char buf[112];
    std::snprintf(buf, sizeof buf, "colsum%s %s N=%d C=%d S=%d", LN ? " ln" : "", ename<T>(), N, C, nsplit);
    const std::string name = buf;
    const size_t n = (size_t)N * C;
    std::vector<S<T>> dout(n);
    std::vector<float> inp(LN ? n : 0), mean(LN ? N : 0), rstd(LN ? N : 0), a0(C), b0(C);
    for (auto &v : dout)
        v = to_e<T>(rnd());
    for (auto &v : inp)
        v = rnd();
    for (int r = 0; r < (LN ? N : 0); r++) {
        mean[r] = 0.1f * rnd();
        rstd[r] = 1.5f + rnd();
    }
    for (int c = 0; c < C; c++) {
        a0[c] = rnd();
        b0[c] = rnd();
    }
    std::vector<float> a1 = a0, b1 = b0, a2 = a0, b2 = b0;
    const float *ip = LN ? inp.data() : nullptr, *mp = LN ? mean.data() : nullptr, *rp = LN ? rstd.data() : nullptr;
    colsum_run<LN, T>(a1, b1, dout.data(), ip, mp, rp, N, C, nsplit, rows);
    colsum_run<LN, T>(a2, b2, dout.data(), ip, mp, rp, N, C, nsplit, rows);

    // Double-precision reference, and the bound of recursive fp32 summation:
    // depth·2⁻²⁴·(Σ|terms| + |dst|), depth = the longest chain of additions a
    // term goes through (its thread's rows, the 8 threads of its column, the
    // S splits, the final +=), +3 for the rounding of an LN term's product.
    const double u = std::ldexp(1.0, -24);
    const double depth = (rows + CS_ROWS - 1) / CS_ROWS + CS_ROWS + nsplit + 1 + (LN ? 3 : 0);
    size_t bad = 0, bad_det = 0;
    double err = 0; // in units of the bound
    for (int part = 0; part < (LN ? 2 : 1); part++) {
        const std::vector<float> &got = part ? b1 : a1, &again = part ? b2 : a2, &d0 = part ? b0 : a0;
        for (int c = 0; c < C; c++) {
            double s = d0[c], sa = std::fabs((double)d0[c]);
            for (int r = 0; r < N; r++) {
                const size_t i = (size_t)r * C + c;
                double t = from_e<T>(dout[i]);
                if (LN && part == 0)
                    t *= ((double)inp[i] - mean[r]) * rstd[r];
                s += t;
                sa += std::fabs(t);
            }
            const double d = std::fabs((double)got[c] - s), bound = depth * u * sa;
            err = std::fmax(err, d / bound);
            bad += !(d <= bound);
            bad_det += fbits(got[c]) != fbits(again[c]);
        }
    }
    verdict(name, "vs double", bad, (size_t)C * (LN ? 2 : 1), err, "of bound");
    verdict(name, "same bits twice", bad_det, (size_t)C * (LN ? 2 : 1), 0, "");
}

} // namespace

int main()
{
    const auto t0 = std::chrono::steady_clock::now();
    H = kern_cpu_ops();
    cpu32 = H->ctx_create(1, 0, KERN_FP32, nullptr);
    cpu_bf16 = H->ctx_create(1, 0, KERN_BF16, nullptr);
    cpu_f16 = H->ctx_create(1, 0, KERN_FP16, nullptr);
    if (!cpu32 || !cpu_bf16 || !cpu_f16) {
        std::fprintf(stderr, "cpu context\n");
        return 1;
    }

    // Cross-entropy: W = 4 with Vp % 4 == 0 (V not: the forward's scalar
    // tail, and a padding), W = 1 with an odd Vp; V > 256·4 so that the
    // block's threads go round the row more than once.
    test_ce<float, 4>(5, 1201, 1204);
    test_ce<float, 1>(5, 777, 779);
    test_ce<__nv_bfloat16, 4>(5, 1201, 1204);
    test_ce<__nv_bfloat16, 1>(5, 777, 779);
    test_ce<__half, 4>(5, 1201, 1204);
    test_ce<__half, 1>(5, 777, 779);

    // Layernorm: N not a multiple of the 8 rows per block (whole warps
    // return), C not a multiple of 32·W (lanes idle in the last step).
    test_ln<4>(13, 200);
    test_ln<1>(13, 200);
    test_ln<1>(9, 77);

    // GELU16: odd n (a scalar tail after the vectors), and a grid smaller
    // than the work (the grid-stride loop).
    test_gelu16<true>(2001, true, 32);
    test_gelu16<true>(2001, true, 1);
    test_gelu16<true>(1001, false, 2);
    test_gelu16<false>(2001, true, 32);
    test_gelu16<false>(2001, true, 1);
    test_gelu16<false>(1001, false, 2);

    // Column sums: kc_colsum's splits (C not a multiple of 32: idle
    // columns), and fewer, longer splits (the last one shorter).
    for (int custom_S : {0, 2}) {
        test_colsum<false, float>(43, 40, custom_S);
        test_colsum<true, float>(43, 40, custom_S);
        test_colsum<false, __nv_bfloat16>(43, 40, custom_S);
        test_colsum<false, __half>(43, 40, custom_S);
        // The layernorm form on a 16-bit dout (layernorm_backward16's dout16).
        test_colsum<true, __nv_bfloat16>(43, 40, custom_S);
        test_colsum<true, __half>(43, 40, custom_S);
    }

    H->ctx_destroy(cpu32);
    H->ctx_destroy(cpu_bf16);
    H->ctx_destroy(cpu_f16);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s: %d failure(s), %.1f s\n", failures ? "FAIL" : "PASS", failures, secs);
    return failures ? 1 : 0;
}
