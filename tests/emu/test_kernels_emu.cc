// test_kernels_emu.cc — the CUDA cross-entropy, layernorm (forward, backward; the general
// and the register kernels, the latter with the fused weight gradients), column-sum
// and elementwise kernels (pointwise.cu: GELU in fp32 and 16 bits, ReLU,
// residual, accumulate, scale, dropout, the fp32 <-> bf16/fp16 casts, the non-finite
// count) run on the CPU under cuda_emu.h, against the CPU backend
// (kern_cpu_ops(); its *16 ops in kernels/cpu/lowp.c define the 16-bit
// results: the fp32 op, then the cast).  test_train_emu.cc covers the other
// kernels of a training step, test_flash_emu.cc the fused attention.
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
// be bitwise are between two emulated runs, where both are the same, or
// with the CPU for ops of one rounding (ReLU, add, scale, the casts), which
// contraction cannot change.  A NaN matches any NaN: the casts' NaN payloads
// here are the host's, not the GPU's.
//
// Exit status: 0 pass, 1 failure.
#define GRADD_CUDA_EMU 1
#include "layernorm.cu"
#include "loss.cu"
#include "pointwise.cu"
#include "reduce.cu"

#include "emu_check.h"

namespace {

uint64_t rng_state = 0x13198A2E03707344ull;
float rnd() { return emu_uniform(&rng_state); }

// ---- cross-entropy -----------------------------------------------------------------------

// dlogits g against the CPU's g_ref (n = rows·Vp): within an ulp of E plus
// 1e-4 of the largest |ref| on each row's first V columns (NaN fails), +0
// exactly on the padding.
template <class E>
void check_dlogits(const std::string &name, const char *what, const S<E> *g, const S<E> *g_ref, size_t n, int V,
                   int Vp)
{
    double maxref = 0;
    for (size_t i = 0; i < n; i++)
        maxref = std::fmax(maxref, std::fabs((double)from_e<E>(g_ref[i])));
    size_t bad_g = 0, bad_pad = 0;
    double err_g = 0;
    for (size_t i = 0; i < n; i++) {
        if (i % Vp >= (size_t)V) {
            bad_pad += fbits(from_e<E>(g[i])) != 0;
        } else {
            const double ref = from_e<E>(g_ref[i]), d = std::fabs((double)from_e<E>(g[i]) - ref);
            err_g = std::fmax(err_g, d / maxref);
            bad_g += !(d <= ulp_e<E>((float)ref) + 1e-4 * maxref);
        }
    }
    verdict(name, what, bad_g, n, err_g, "of max");
    verdict(name, "padding == 0", bad_pad, n, 0, "");
}

// The loss of each of N rows against the CPU's: 1e-5 relative, exactly
// +0 where the target is negative (an ignored row), and NaN where it is V
// or more.
inline void check_losses(const std::string &name, const float *loss, const float *loss_ref, const int32_t *tg, int N,
                         int V)
{
    size_t bad_l = 0;
    double err_l = 0;
    for (int r = 0; r < N; r++) {
        if (tg[r] < 0) {
            bad_l += fbits(loss[r]) != 0;
        } else if (tg[r] >= V) {
            bad_l += !std::isnan(loss[r]);
        } else {
            double d = std::fabs((double)loss[r] - loss_ref[r]);
            err_l = std::fmax(err_l, d / std::fmax(std::fabs(loss_ref[r]), 1e-30));
            bad_l += !(d <= 1e-5 * std::fabs(loss_ref[r]) + 1e-6);
        }
    }
    verdict(name, "loss (0 ign, NaN oob)", bad_l, N, err_l, "rel");
}

// The rows of ignored (negative) targets hold +0 throughout, padding included.
template <class E>
void check_ignored_rows(const std::string &name, const S<E> *g, const int32_t *tg, int N, int Vp)
{
    size_t bad = 0, n = 0;
    for (int r = 0; r < N; r++)
        if (tg[r] < 0)
            for (int v = 0; v < Vp; v++, n++)
                bad += fbits(from_e<E>(g[(size_t)r * Vp + v])) != 0;
    verdict(name, "ignored rows == 0", bad, n, 0, "");
}

// Rows 1 and 2 (when there are) have targets −1 and V, row 3 −100
// (Hugging Face's): loss 0 and a zero gradient row for the negative ones, a
// NaN loss and no one-hot column for V.
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
        tg[r] = r == 1 ? -1 : r == 2 ? V : r == 3 ? -100 : (int32_t)((rnd() + 1.0f) * 0.5f * V) % V;

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
    check_losses(name, loss.data(), loss_ref.data(), tg.data(), N, V);
    size_t bad_s = 0;
    double err_s = 0;
    for (int r = 0; r < N; r++) {
        double d = std::fabs((double)lse[r] - lse_ref[r]);
        err_s = std::fmax(err_s, d / std::fmax(std::fabs(lse_ref[r]), 1e-30));
        bad_s += !(d <= 1e-5 * std::fabs(lse_ref[r]) + 1e-6);
    }
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
    check_dlogits<E>(name, "dlogits", g.data(), g_ref.data(), n, V, Vp);
    check_ignored_rows<E>(name, g.data(), tg.data(), N, Vp);
    size_t bad_inplace = 0;
    for (size_t i = 0; i < n; i++)
        bad_inplace += std::memcmp(&g[i], &g_in[i], sizeof(S<E>)) != 0;
    verdict(name, "in place", bad_inplace, n, 0, "bitwise");

    // ---- fused (16 bits, as the launcher exists for): the two kernels'
    // bits, the backward taken from the emulated forward's own lse.
    if constexpr (is16<E>) {
        std::vector<S<E>> two = x, one = x;
        std::vector<float> loss1(N, 12345.0f);
        {
            const float *s = lse.data(), *dl = dloss.data();
            const int32_t *t = tg.data();
            float *l1 = loss1.data();
            E *io2 = reinterpret_cast<E *>(two.data()), *io1 = reinterpret_cast<E *>(one.data());
            emu_launch(dim3((unsigned)N), dim3(CE_THREADS),
                       [=] { ce_backward_kernel<E, W>(io2, io2, s, t, dl, V, Vp); });
            emu_launch(dim3((unsigned)N), dim3(CE_THREADS), [=] { ce_fused_kernel<E, W>(l1, io1, t, dl, V, Vp); });
        }
        same<float>(name, "fused loss", loss1.data(), loss.data(), N);
        same<S<E>>(name, "fused dlogits", one.data(), two.data(), n);
    }
}

// The register-resident fused kernel (ce_fused_reg_kernel, T threads, NV
// vectors of 8 each), against the CPU's forward16 and backward16: it sums
// in another order and with exp2f, so within the tolerances of the
// backward above, not the two kernels' bits.  In place over the logits,
// as it runs.  Row 0 is offset by +40 (the loss is then a small difference
// of large terms), rows 1 and 2 have targets −1 (ignored: loss 0, a zero
// row) and V (NaN, no one-hot), the last row's target is V − 1, in the
// row's last vector.
template <class E, int T, int NV> void test_ce_reg(int N, int V, int Vp)
{
    char buf[96];
    std::snprintf(buf, sizeof buf, "ce_reg %s T=%d NV=%d N=%d V=%d Vp=%d", ename<E>(), T, NV, N, V, Vp);
    const std::string name = buf;
    if (Vp % CE_VEC || Vp > T * NV * CE_VEC) {
        std::printf("  %s: Vp must be a multiple of %d covered by T·NV vectors\n", name.c_str(), CE_VEC);
        failures++;
        return;
    }
    const size_t n = (size_t)N * Vp;
    std::vector<S<E>> x(n);
    for (size_t i = 0; i < n; i++)
        x[i] = to_e<E>(i % Vp < (size_t)V ? 4.0f * rnd() + (i < (size_t)Vp ? 40.0f : 0.0f) : 1e4f);
    std::vector<int32_t> tg(N);
    for (int r = 0; r < N; r++)
        tg[r] = r == 1 ? -1 : r == 2 ? V : r == N - 1 ? V - 1 : (int32_t)((rnd() + 1.0f) * 0.5f * V) % V;
    std::vector<float> dloss(N);
    for (auto &d : dloss)
        d = rnd();

    std::vector<float> loss_ref(N), lse_ref(N), loss(N, 12345.0f);
    std::vector<S<E>> g_ref(n), g = x;
    H->crossentropy_forward16(cpu_ctx<E>(), loss_ref.data(), lse_ref.data(), x.data(), tg.data(), N, V, Vp);
    H->crossentropy_backward16(cpu_ctx<E>(), g_ref.data(), x.data(), lse_ref.data(), tg.data(), dloss.data(), N, V,
                               Vp);
    {
        float *l = loss.data();
        const float *dl = dloss.data();
        const int32_t *t = tg.data();
        E *io = reinterpret_cast<E *>(g.data());
        if (!ce_reg_nv(Vp, io)) // the launcher's condition (here with the launcher's own T, not this test's)
            emu::fail("test: the launcher would not take the register path");
        emu_launch(dim3((unsigned)N), dim3(T), [=] { ce_fused_reg_kernel<E, T, NV>(l, io, t, dl, V, Vp); });
    }
    check_losses(name, loss.data(), loss_ref.data(), tg.data(), N, V);
    check_dlogits<E>(name, "dlogits in place", g.data(), g_ref.data(), n, V, Vp);
    check_ignored_rows<E>(name, g.data(), tg.data(), N, Vp);
}

// The launcher's choice between the register path and ce_fused_kernel.
void test_ce_reg_choice()
{
    alignas(16) static uint16_t row[16];
    size_t bad = 0;
    bad += ce_reg_nv(50304, row) != 7;                                  // GPT-2's padded vocabulary
    bad += ce_reg_nv(50257, row) != 0;                                  // odd: rows off 16 bytes
    bad += ce_reg_nv(50304, row + 4) != 0;                              // the base 8 bytes off
    bad += ce_reg_nv(CE_REG_THREADS * CE_REG_NV_MAX * CE_VEC, row) != CE_REG_NV_MAX; // the most that fits
    bad += ce_reg_nv(CE_REG_THREADS * CE_REG_NV_MAX * CE_VEC + CE_VEC, row) != 0;    // one vector more
    bad += ce_reg_nv(8, row) != 1;
    verdict("ce_reg_nv", "register path or fallback", bad, 6, 0, "");
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
    compare(name, "out fp32", out.data(), out_ref.data(), n, 1e-5, 1e-5);
    compare(name, "mean", mean.data(), mean_ref.data(), N, 1e-5, 1e-6);
    compare(name, "rstd", rstd.data(), rstd_ref.data(), N, 1e-5, 0);

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
        compare(name, what, g.data(), dref.data(), n, 1e-5, 1e-5);
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
            compare(name, std::is_same_v<E, __half> ? "dinp from fp16" : "dinp from bf16", g2.data(), gref.data(), n,
                    1e-5, 1e-5);
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

// ---- layernorm, the register kernels ------------------------------------------------------

// The launchers' choices, which the emulation cannot reach (they are in the
// <<<>>> part): which C and alignments take the register kernels, and the
// rows per block of the backward (from N alone).
void test_ln_pick()
{
    size_t bad = 0;
    bad += ln_reg_v(768, true, false) != 6 || ln_reg_v(768, true, true) != 6;
    bad += ln_reg_v(1024, true, false) != 8 || ln_reg_v(1024, true, true) != 0; // bwd: shared memory
    bad += ln_reg_v(768, false, false) != 0 || ln_reg_v(768, false, true) != 0; // misaligned
    bad += ln_reg_v(200, true, false) != 0 || ln_reg_v(640, true, true) != 0;   // not a compiled width
    bad += lnb_rows(16384) != 64 || lnb_rows(13) != 1 || lnb_rows(257) != 2 || lnb_rows(256) != 1;
    verdict("layernorm register path", "choices", bad, 13, 0, "");
}

// Forward: ln_forward_reg<V, O> bitwise ln_forward_kernel<4, O> (the same
// operations in the same order) for O = fp32, bf16, fp16, mean and rstd
// included, and fp32 against the CPU.  N not a multiple of the 8 rows per
// block.
template <int V> void test_ln_reg_fwd(int N)
{
    constexpr int C = 128 * V;
    char buf[96];
    std::snprintf(buf, sizeof buf, "layernorm reg fwd N=%d C=%d", N, C);
    const std::string name = buf;
    const size_t n = (size_t)N * C;
    const LnIn in = ln_inputs(N, C);
    const float *x = in.x.data(), *w = in.w.data(), *b = in.b.data();
    const dim3 grid((unsigned)((N + LN_WARPS - 1) / LN_WARPS)), block(32 * LN_WARPS);
    auto one = [&]<class O>(O *, const char *what) {
        std::vector<S<O>> o1(n), o2(n);
        std::vector<float> m1(N, NAN), r1(N, NAN), m2(N, NAN), r2(N, NAN);
        O *p1 = reinterpret_cast<O *>(o1.data()), *p2 = reinterpret_cast<O *>(o2.data());
        float *mp1 = m1.data(), *rp1 = r1.data(), *mp2 = m2.data(), *rp2 = r2.data();
        emu_launch(grid, block, [=] { ln_forward_reg<V, O>(p1, mp1, rp1, x, w, b, N); });
        emu_launch(grid, block, [=] { ln_forward_kernel<4, O>(p2, mp2, rp2, x, w, b, N, C); });
        same<O>(name, what, o1.data(), o2.data(), n);
        same<float>(name, "mean = W=4's", m1.data(), m2.data(), N);
        same<float>(name, "rstd = W=4's", r1.data(), r2.data(), N);
        if constexpr (std::is_same_v<O, float>) {
            std::vector<float> ref(n), mr(N), rr(N);
            H->layernorm_forward(cpu32, ref.data(), mr.data(), rr.data(), x, w, b, N, C);
            compare(name, "out vs cpu", o1.data(), ref.data(), n, 1e-5, 1e-5);
        }
    };
    one((float *)nullptr, "fp32 = W=4's");
    one((__nv_bfloat16 *)nullptr, "bf16 = W=4's");
    one((__half *)nullptr, "fp16 = W=4's");
}

// Backward: ln_backward_reg<V, E, DO> with R rows per block, then
// colsum_merge, as ln_backward_reg_launch runs them.  dinp (+=, from a
// random start) and dinp16 bitwise those of ln_backward_kernel<4, E, DO>;
// dweight/dbias (+=, from random values) against a double reference within
// the bound of recursive fp32 summation, and the same bits on a second run;
// without the weight gradients (part NULL), the same dinp.
template <int V, class E, class DO> void test_ln_reg_bwd(int N, int R, bool with16)
{
    constexpr int C = 128 * V;
    const int S_ = (N + R - 1) / R;
    char buf[128];
    std::snprintf(buf, sizeof buf, "layernorm reg bwd %s dout %s N=%d C=%d R=%d", ename<E>(), ename<DO>(), N, C, R);
    const std::string name = buf;
    const size_t n = (size_t)N * C;
    const LnIn in = ln_inputs(N, C);
    std::vector<float> mean(N), rstd(N), tmp(n);
    H->layernorm_forward(cpu32, tmp.data(), mean.data(), rstd.data(), in.x.data(), in.w.data(), in.b.data(), N, C);
    std::vector<S<DO>> dout(n);
    std::vector<float> dinp0(n), dw0(C), db0(C);
    for (size_t i = 0; i < n; i++) {
        dout[i] = to_e<DO>(rnd());
        dinp0[i] = rnd();
    }
    for (int c = 0; c < C; c++) {
        dw0[c] = rnd();
        db0[c] = rnd();
    }
    const DO *d = reinterpret_cast<const DO *>(dout.data());
    const float *x = in.x.data(), *w = in.w.data(), *m = mean.data(), *r = rstd.data();
    struct Out {
        std::vector<float> g, dw, db;
        std::vector<uint16_t> g16;
    };
    auto run = [&](bool wgrad) {
        Out o{dinp0, dw0, db0, std::vector<uint16_t>(n, 0x7fff)};
        std::vector<float> part(wgrad ? (size_t)2 * S_ * C : 0, NAN);
        float *gp = o.g.data(), *pp = wgrad ? part.data() : nullptr;
        E *g16p = with16 ? reinterpret_cast<E *>(o.g16.data()) : nullptr;
        const int N_ = N, R_ = R;
        emu_launch(dim3((unsigned)S_), dim3(32 * LN_WARPS),
                   [=] { ln_backward_reg<V, E, DO>(gp, g16p, pp, d, x, w, m, r, N_, R_); });
        if (wgrad) {
            float *a = o.dw.data(), *b = o.db.data();
            const float *pa = pp, *pb = pp + (size_t)S_ * C;
            const int s = S_;
            emu_launch(dim3((unsigned)((C + CS_COLS - 1) / CS_COLS)), dim3(CS_COLS, CM_ROWS),
                       [=] { colsum_merge(a, b, pa, pb, s, C); });
        }
        return o;
    };
    const Out o1 = run(true), o2 = run(true), o3 = run(false);

    // The general kernel's dinp and dinp16.
    std::vector<float> g4 = dinp0;
    std::vector<uint16_t> g16_4(n, 0x7fff);
    {
        float *gp = g4.data();
        E *g16p = with16 ? reinterpret_cast<E *>(g16_4.data()) : nullptr;
        emu_launch(dim3((unsigned)((N + LN_WARPS - 1) / LN_WARPS)), dim3(32 * LN_WARPS),
                   [=] { ln_backward_kernel<4, E, DO>(gp, g16p, d, x, w, m, r, N, C); });
    }
    same<float>(name, "dinp = W=4's", o1.g.data(), g4.data(), n);
    if (with16)
        same<E>(name, "dinp16 = W=4's", o1.g16.data(), g16_4.data(), n);
    else
        verdict(name, "no dinp16",
                (size_t)std::count_if(o1.g16.begin(), o1.g16.end(), [](uint16_t h) { return h != 0x7fff; }), n, 0, "");
    same<float>(name, "dinp w/o wgrad", o3.g.data(), o1.g.data(), n);
    // ... which is a frozen norm's: against the CPU's without dweight and dbias.
    {
        std::vector<float> gref = dinp0;
        if constexpr (std::is_same_v<DO, float>) {
            H->layernorm_backward(cpu32, gref.data(), nullptr, nullptr, d, x, w, m, r, N, C);
        } else {
            H->layernorm_backward16(cpu_ctx<DO>(), gref.data(), nullptr, nullptr, nullptr, nullptr, dout.data(), x, w,
                                    m, r, N, C);
        }
        compare(name, "dinp frozen cpu", o3.g.data(), gref.data(), n, 1e-5, 1e-5);
    }
    same<float>(name, "dweight twice", o2.dw.data(), o1.dw.data(), C);
    same<float>(name, "dbias twice", o2.db.data(), o1.db.data(), C);
    verdict(name, "wgrad untouched", (size_t)(o3.dw != dw0 || o3.db != db0), 1, 0, "");

    // Double reference; the longest chain of fp32 additions a term goes
    // through: its lane's rows (⌈R/8⌉), the 8 warps, its thread's partials
    // in colsum_merge (⌈S/16⌉), their 16 sums, the +=; +3 for the product.
    const double u = std::ldexp(1.0, -24);
    const double depth = (R + LN_WARPS - 1) / LN_WARPS + LN_WARPS + (S_ + CM_ROWS - 1) / CM_ROWS + CM_ROWS + 1 + 3;
    size_t bad = 0;
    double err = 0;
    for (int p = 0; p < 2; p++) {
        const std::vector<float> &got = p ? o1.db : o1.dw, &start = p ? db0 : dw0;
        for (int c = 0; c < C; c++) {
            double s = start[c], sa = std::fabs((double)start[c]);
            for (int row = 0; row < N; row++) {
                const size_t i = (size_t)row * C + c;
                double t = from_e<DO>(dout[i]);
                if (p == 0)
                    t *= (double)(((float)in.x[i] - mean[row]) * rstd[row]);
                s += t;
                sa += std::fabs(t);
            }
            const double dd = std::fabs((double)got[c] - s), bound = depth * u * sa;
            err = std::fmax(err, dd / bound);
            bad += !(dd <= bound);
        }
    }
    verdict(name, "dw, db vs double", bad, 2 * (size_t)C, err, "of bound");
}

// ---- GELU with 16-bit results, through kc_ew's kernel --------------------------------------

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

// ---- the fp32 elementwise ops, through kc_ew's kernel ------------------------------------

// Every pointer 16-byte aligned (vec: the launchers then go four at a time)
// or one element in (they go one at a time); n odd, so the vector path has
// a scalar tail.  The values where the ops' corner cases are (±0, ±inf,
// NaN, fp32 subnormals, ±FLT_MAX) are mixed into their inputs, except
// GELU's, whose CPU form is another formula.
void test_pointwise(size_t n, bool vec, unsigned max_blocks)
{
    char buf[96];
    std::snprintf(buf, sizeof buf, "pointwise n=%zu %s grid<=%u", n, vec ? "vec" : "scalar", max_blocks);
    const std::string name = buf;
    const size_t off = vec ? 0 : 1;
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -3e-39f, FLT_MAX, -FLT_MAX};
    auto input = [&](float scale, bool specials) {
        std::vector<float> v(n + off);
        for (size_t i = 0; i < v.size(); i++)
            v[i] = specials && i % 23 == 5 ? special[i / 23 % std::size(special)] : scale * rnd();
        return v;
    };
    std::vector<float> xb = input(4.0f, true), db = input(1.0f, true), gb = input(6.0f, false),
                       eb = input(1.0f, false), yb(n + off), ref(n);
    float *x = xb.data() + off, *d = db.data() + off, *g = gb.data() + off, *e = eb.data() + off,
          *y = yb.data() + off;
    if (kc_aligned(16, x, d, g, e, y) != vec)
        emu::fail("test: the pointers do not make the launchers pick the path under test");
    auto run = [&](const char *what, auto f, auto cpu_op, bool bitwise) {
        std::fill(yb.begin(), yb.end(), NAN);
        ew_run(n, vec, f, max_blocks);
        cpu_op();
        if (bitwise)
            same<float>(name, what, y, ref.data(), n);
        else // GELU: tanh here, the logistic function on the CPU; glibc's tanhf and expf
            compare(name, what, y, ref.data(), n, 1e-5, 1e-6);
    };
    run("relu fwd", relu_fwd_f{y, x}, [&] { H->relu_forward(cpu32, ref.data(), x, n); }, true);
    run("relu bwd", relu_bwd_f{y, x, d}, [&] { H->relu_backward(cpu32, ref.data(), x, d, n); }, true);
    run("residual", add_f{y, x, d}, [&] { H->residual_forward(cpu32, ref.data(), x, d, n); }, true);
    run("gelu fwd", gelu_fwd_f<float>{y, g}, [&] { H->gelu_forward(cpu32, ref.data(), g, n); }, false);
    run("gelu bwd", gelu_bwd_f<float>{y, g, e}, [&] { H->gelu_backward(cpu32, ref.data(), g, e, n); }, false);
    // In place, as kc_accumulate and kc_scale run (the output is an input).
    std::copy(x, x + n, ref.data());
    std::copy(x, x + n, y);
    ew_run(n, vec, add_f{y, y, d}, max_blocks);
    H->accumulate(cpu32, ref.data(), d, n);
    same<float>(name, "accumulate", y, ref.data(), n);
    for (float s : {0.37f, 0.0f, -INFINITY}) {
        std::copy(x, x + n, ref.data());
        std::copy(x, x + n, y);
        ew_run(n, vec, scale_f{y, s}, max_blocks);
        H->scale(cpu32, ref.data(), n, s);
        same<float>(name, s == 0.37f ? "scale 0.37" : s == 0.0f ? "scale 0" : "scale -inf", y, ref.data(), n);
    }
    // Dropout's mask is a function of (seed, offset + i): the vector path's
    // lanes and the grid-stride loop must number elements as the CPU does.
    // Out of place, then in place (its backward's form).
    for (float p : {0.3f, 0.0f}) {
        uint32_t below;
        float keep;
        kern_dropout_rate(p, &below, &keep);
        const uint64_t seed = 0x5eedf00dull, at = 123456789011ull;
        run(p > 0 ? "dropout 0.3" : "dropout 0", dropout_f{y, x, seed, at, below, keep},
            [&] { H->dropout(cpu32, ref.data(), x, n, p, seed, at); }, true);
        std::copy(x, x + n, y);
        ew_run(n, vec, dropout_f{y, y, seed, at, below, keep}, max_blocks);
        same<float>(name, p > 0 ? "dropout 0.3 in place" : "dropout 0 in place", y, ref.data(), n);
    }
}

// ---- copy2d -------------------------------------------------------------------------------

// A slice of wider rows copied out and added back, as LoRA's adapters on one
// of q, k and v do, against the CPU op: bitwise (one add per element).  A
// grid of `blocks` blocks of 256 (smaller than the work: the stride loop).
void test_copy2d(int N, int cols, int ldd, int lds, unsigned blocks)
{
    const std::string name = "copy2d N=" + std::to_string(N) + " cols=" + std::to_string(cols);
    std::vector<float> src((size_t)N * lds), dst0((size_t)N * ldd);
    for (auto &v : src)
        v = rnd();
    for (auto &v : dst0)
        v = rnd();
    for (bool acc : {false, true}) {
        std::vector<float> got = dst0, ref = dst0;
        float *g = got.data();
        const float *s = src.data();
        size_t n = (size_t)N * cols;
        emu_launch(dim3(blocks), dim3(256), [=] { copy2d_kernel(g, ldd, s, lds, n, cols, acc); });
        H->copy2d(cpu32, ref.data(), ldd, src.data(), lds, N, cols, acc);
        same<float>(name, acc ? "accumulate" : "copy", got.data(), ref.data(), got.size());
    }
}

// ---- the casts ---------------------------------------------------------------------------

// Both ways on every 16-bit value: widening each of the 65536 patterns;
// narrowing each value, the midpoint between it and its neighbour away from
// zero (a tie: to even), the fp32 values either side of that midpoint, and
// values past the 16-bit range.  vec and the pointers as in test_pointwise
// (the launchers' condition: fp32 side 16-byte, 16-bit side 8-byte aligned).
template <bool BF16> void test_casts(bool vec, unsigned max_blocks)
{
    using E = kc_e16<BF16>;
    char buf[96];
    std::snprintf(buf, sizeof buf, "casts %s %s grid<=%u", ename<E>(), vec ? "vec" : "scalar", max_blocks);
    const std::string name = buf;
    const size_t off = vec ? 0 : 1;
    std::vector<float> wide(off);
    for (uint32_t h = 0; h < 65536; h++) {
        const float v = from_e<E>((uint16_t)h), w = from_e<E>((uint16_t)(h + 1));
        wide.push_back(v);
        if ((h & 0x7fff) == 0x7fff || !std::isfinite(v) || !std::isfinite(w))
            continue;
        const float mid = (float)(((double)v + w) / 2); // exact: one bit more than E has
        wide.push_back(mid);
        wide.push_back(std::nextafter(mid, -INFINITY));
        wide.push_back(std::nextafter(mid, INFINITY));
    }
    for (float f : {FLT_MAX, -FLT_MAX, 65520.0f, 65519.99f, 1e-8f, 3e-8f, 1e-40f})
        wide.push_back(f);
    const size_t n = wide.size() - off;
    std::vector<uint16_t> narrow(n + off, 0x7fff), narrow_ref(n), bits(65536 + off);
    std::vector<float> back(65536 + off, NAN), back_ref(65536);
    for (uint32_t h = 0; h < 65536; h++)
        bits[off + h] = (uint16_t)h;
    const float *src = wide.data() + off;
    uint16_t *dst = narrow.data() + off, *b16 = bits.data() + off;
    float *b32 = back.data() + off;
    if ((kc_aligned(16, src) && kc_aligned(8, dst)) != vec || (kc_aligned(16, b32) && kc_aligned(8, b16)) != vec)
        emu::fail("test: the pointers do not make the launchers pick the path under test");
    ew_run(n, vec, to16_f<BF16>{dst, src}, max_blocks);
    ew_run(65536, vec, from16_f<BF16>{b32, b16}, max_blocks);
    if constexpr (BF16) {
        H->cast_f32_to_bf16(cpu32, narrow_ref.data(), src, n);
        H->cast_bf16_to_f32(cpu32, back_ref.data(), b16, 65536);
    } else {
        H->cast_f32_to_f16(cpu32, narrow_ref.data(), src, n);
        H->cast_f16_to_f32(cpu32, back_ref.data(), b16, 65536);
    }
    same<E>(name, "fp32 to 16", dst, narrow_ref.data(), n);
    same<float>(name, "16 to fp32", b32, back_ref.data(), 65536);
}

// ---- non-finite count ----------------------------------------------------------------------

// nonfinite_kernel as kc_count_nonfinite launches it: W = 4 (p 16-byte
// aligned; n % 4 elements left to block 0) on a grid for n/4 + 1 items, else
// W = 1; ±inf and NaN among finite values (FLT_MAX, subnormals), at both
// ends and in the tail.
template <int W> void test_nonfinite(size_t n, unsigned max_blocks)
{
    char buf[96];
    std::snprintf(buf, sizeof buf, "nonfinite W=%d n=%zu grid<=%u", W, n, max_blocks);
    const size_t off = W == 4 ? 0 : 1;
    std::vector<float> pb(n + off);
    float *p = pb.data() + off;
    if (kc_aligned(16, p) != (W == 4))
        emu::fail("test: p does not make the launcher pick W");
    const float special[] = {INFINITY, FLT_MAX, NAN, 1e-40f, -INFINITY, -NAN};
    for (size_t i = 0; i < n; i++)
        p[i] = i % 31 == 3 ? special[i / 31 % std::size(special)] : rnd();
    p[0] = p[n - 1] = INFINITY;
    p[n - 2] = NAN;
    unsigned long long count = 0, *c = &count;
    emu_launch(grid_for(W == 4 ? n / 4 + 1 : n, 256, max_blocks), dim3(256),
               [=] { nonfinite_kernel<W>(p, n, c); });
    const size_t ref = H->count_nonfinite(cpu32, p, n);
    verdict(buf, "count", count != ref, 1, (double)count - (double)ref, "");
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
    if (!cpu_open())
        return 1;

    // Cross-entropy: W = 4 with Vp % 4 == 0 (V not: the forward's scalar
    // tail, and a padding), W = 1 with an odd Vp; V > 256·4 so that the
    // block's threads go round the row more than once.
    test_ce<float, 4>(5, 1201, 1204);
    test_ce<float, 1>(5, 777, 779);
    test_ce<__nv_bfloat16, 4>(5, 1201, 1204);
    test_ce<__nv_bfloat16, 1>(5, 777, 779);
    test_ce<__half, 4>(5, 1201, 1204);
    test_ce<__half, 1>(5, 777, 779);
    // The register path: V % 8 != 0 (a partial last vector, then the
    // padding), several vectors a thread with the last ones past the row
    // (NV·T·8 > Vp), a padding longer than a vector, V == Vp, and the
    // launcher's 1024 threads with NV = 1 (threads past the row).  The
    // fallback for the rows it refuses is ce_fused_kernel, tested above.
    test_ce_reg<__nv_bfloat16, 128, 3>(4, 3001, 3008);
    test_ce_reg<__half, 128, 3>(4, 2990, 3008);
    test_ce_reg<__nv_bfloat16, 64, 6>(4, 3072, 3072);
    test_ce_reg<__half, CE_REG_THREADS, 1>(3, 3001, 3008);
    test_ce_reg_choice();

    // Layernorm: N not a multiple of the 8 rows per block (whole warps
    // return), C not a multiple of 32·W (lanes idle in the last step).
    test_ln<4>(13, 200);
    test_ln<1>(13, 200);
    test_ln<1>(9, 77);
    // The register kernels: GPT-2's C = 768 and C = 256; the backward with
    // one row per block (lnb_rows below 256 rows), and with 16 (two rows
    // per warp, a last block of 5 rows: warps with none).  The general
    // kernels (the fallback) are test_ln's above.
    test_ln_pick();
    test_ln_reg_fwd<6>(13);
    test_ln_reg_fwd<2>(9);
    test_ln_reg_bwd<6, __nv_bfloat16, float>(13, lnb_rows(13), true);
    test_ln_reg_bwd<6, __nv_bfloat16, __nv_bfloat16>(37, 16, false);
    test_ln_reg_bwd<6, __half, __half>(37, 16, true);
    test_ln_reg_bwd<2, __nv_bfloat16, float>(21, 8, false);
    test_ln_reg_bwd<2, __half, float>(37, 1, true); // 37 partial rows: colsum_merge strides them

    // GELU16: odd n (a scalar tail after the vectors), and a grid smaller
    // than the work (the grid-stride loop).
    test_gelu16<true>(2001, true, 32);
    test_gelu16<true>(2001, true, 1);
    test_gelu16<true>(1001, false, 2);
    test_gelu16<false>(2001, true, 32);
    test_gelu16<false>(2001, true, 1);
    test_gelu16<false>(1001, false, 2);

    // The fp32 elementwise ops and the casts: the vector path with a grid
    // of one block (the grid-stride loop goes round), and the scalar path.
    test_pointwise(2001, true, 1);
    test_pointwise(2001, false, 2);
    test_copy2d(37, 48, 160, 48, 3);  // into columns of wider rows (the LoRA forward)
    test_copy2d(37, 48, 48, 160, 64); // out of them (its backward)
    test_casts<true>(true, 2);
    test_casts<true>(false, 2);
    test_casts<false>(true, 2);
    test_casts<false>(false, 2);

    // Non-finite count: the launcher's grid and a grid of one block (W = 4,
    // the tail of 3 in block 0), W = 1, and n < 4 (all of it tail).
    test_nonfinite<4>(2003, 32);
    test_nonfinite<4>(2003, 1);
    test_nonfinite<1>(2003, 32);
    test_nonfinite<4>(3, 32);

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

    return cpu_close(t0);
}
