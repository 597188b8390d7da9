// test_train_emu.cc — the CUDA kernels of a training step that test_kernels_emu.cc and
// test_flash_emu.cc leave out, run on the CPU under cuda_emu.h: the token
// and position embedding (encoder.cu: forward, also without the position
// embedding and from a 16-bit token table; backward's dwpe, iota and dwte
// kernels), the unfused
// attention's causal softmax (attention.cu, forward and backward), AdamW (per tensor, and adamw_multi's chunk table
// and kernel) and the gradient norm's sum of squares
// (optim.cu), the kernels gemm.cu falls back on where cuBLASLt declines
// (bias, 16-bit bias, the k = 0 scaling), and the pool's fill pattern
// (fill.cu).
//
// As in test_kernels_emu.cc, the real sources are compiled by g++ with
// GRADD_CUDA_EMU, which leaves out their host launchers (and the cuBLASLt
// calls of gemm.cu and attention.cu); each kernel is launched here with its
// launcher's grid and block, for both vector widths where the launcher
// picks one.  What a launcher computes on the host is done here the same
// way: kc_adamw's bias corrections (through its own adamw_make), and
// kc_encoder_backward's sort of the positions by token, cub's stable radix
// sort there, std::stable_sort here (a stable sort has one result: equal
// tokens keep their positions' order).
// The GEMMs that the fallback kernels follow are the CPU backend's.
//
// References: the CPU backend (kern_cpu_ops(), kern_cpu_check_pattern) for
// all but the softmax, which is held to double precision.  Bitwise where
// both sides round once; sums whose order differs from the CPU's to the
// bound of recursive summation, other tolerances as stated where they are
// used.
//
// What it cannot check: cub's sort itself, the device's expf/sqrtf/powf
// (glibc's run here), FMA contraction (nvcc contracts; g++ for x86-64 does
// not, the CPU backend's AVX2 clones may), and memory ordering between CTAs
// (they run one at a time).
//
// Exit status: 0 pass, 1 failure.
#define GRADD_CUDA_EMU 1
#include "attention.cu"
#include "encoder.cu"
#include "fill.cu"
#include "gemm.cu"
#include "optim.cu"

#include "emu_check.h"

namespace {

uint64_t rng_state = 0x452821E638D01377ull;
float rnd() { return emu_uniform(&rng_state); }

std::vector<float> random_vec(size_t n, float scale)
{
    std::vector<float> v(n);
    for (auto &x : v)
        x = scale * rnd();
    return v;
}

const double u = std::ldexp(1.0, -24); // fp32's unit roundoff

// ---- encoder -------------------------------------------------------------------------------

// W as the launchers pick it: 4 where C % 4 == 0 (the vectors here are
// 16-byte aligned), else 1.  Tokens from a vocabulary of V: with a small V
// most repeat (long runs for the dwte kernel), with a larger one some occur
// once and some not at all.  max_blocks caps the grid-stride kernels'
// grids (forward, dwpe, iota) so that their loops go round.
template <int W> void test_encoder(int B, int T, int C, int V, unsigned max_blocks)
{
    char buf[96];
    std::snprintf(buf, sizeof buf, "encoder W=%d B=%d T=%d C=%d V=%d", W, B, T, C, V);
    const std::string name = buf;
    const int BT = B * T;
    const size_t n = (size_t)BT * C;
    std::vector<int32_t> inp(BT);
    for (auto &t : inp)
        t = (int32_t)((rnd() + 1.0f) * 0.5f * V) % V;
    const std::vector<float> wte = random_vec((size_t)V * C, 1.0f), wpe = random_vec((size_t)T * C, 1.0f);
    std::vector<float> out(n, NAN), ref(n);
    const bool w4 = C % 4 == 0 && kc_aligned(16, out.data(), wte.data(), wpe.data()); // kc_encoder_forward's test
    if (w4 != (W == 4))
        emu::fail("test: the launcher would not pick this W");

    // ---- forward: one add per element, bitwise
    {
        float *o = out.data();
        const int32_t *in = inp.data();
        const float *we = wte.data(), *wp = wpe.data();
        emu_launch(grid_for(n / W, 256, max_blocks), dim3(256),
                   [=] { encoder_forward_kernel<W>(o, in, we, wp, BT, T, C); });
    }
    H->encoder_forward(cpu32, ref.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
    same<float>(name, "forward", out.data(), ref.data(), n);
    // wpe NULL (Llama: rotary positions): the token rows alone, bitwise.
    {
        std::vector<float> out0(n, NAN), ref0(n);
        float *o = out0.data();
        const int32_t *in = inp.data();
        const float *we = wte.data();
        emu_launch(grid_for(n / W, 256, max_blocks), dim3(256),
                   [=] { encoder_forward_kernel<W>(o, in, we, nullptr, BT, T, C); });
        H->encoder_forward(cpu32, ref0.data(), inp.data(), wte.data(), nullptr, B, T, C);
        same<float>(name, "forward, no wpe", out0.data(), ref0.data(), n);
    }

    // ---- backward, into random dwte and dwpe (they accumulate)
    const std::vector<float> dout = random_vec(n, 1.0f), dwte0 = random_vec((size_t)V * C, 1.0f),
                             dwpe0 = random_vec((size_t)T * C, 1.0f);
    std::vector<float> dwte_ref = dwte0, dwpe_ref = dwpe0;
    H->encoder_backward(cpu32, dwte_ref.data(), dwpe_ref.data(), dout.data(), inp.data(), B, T, C);
    size_t bad_iota = 0;
    auto backward = [&](std::vector<float> &dwte, std::vector<float> &dwpe) {
        float *dp = dwpe.data(), *dt = dwte.data();
        const float *d = dout.data();
        emu_launch(grid_for((size_t)T * C, 256, max_blocks), dim3(256),
                   [=] { encoder_dwpe_kernel(dp, d, B, T, C); });
        std::vector<int32_t> pos_in(BT, -1), keys(BT), pos(BT), order(BT);
        int32_t *pi = pos_in.data();
        emu_launch(grid_for((size_t)BT, 256, max_blocks), dim3(256), [=] { iota_kernel(pi, BT); });
        for (int i = 0; i < BT; i++)
            bad_iota += pos_in[i] != i;
        // cub::DeviceRadixSort::SortPairs(keys inp -> keys, values pos_in -> pos).
        for (int i = 0; i < BT; i++)
            order[i] = i;
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return inp[a] < inp[b]; });
        for (int i = 0; i < BT; i++) {
            keys[i] = inp[order[i]];
            pos[i] = pos_in[order[i]];
        }
        const int32_t *kp = keys.data(), *pp = pos.data();
        emu_launch(dim3((unsigned)BT), dim3(C >= 1024 ? 256 : 128),
                   [=] { encoder_dwte_kernel<W>(dt, d, kp, pp, BT, C); });
    };
    std::vector<float> dwte1 = dwte0, dwpe1 = dwpe0, dwte2 = dwte0, dwpe2 = dwpe0;
    backward(dwte1, dwpe1);
    backward(dwte2, dwpe2);
    verdict(name, "iota", bad_iota, 2 * (size_t)BT, 0, "");

    // Against the CPU, which adds the rows into dwte and dwpe one by one
    // where the kernels sum them first: each side is within depth·2⁻²⁴·Σ|terms|
    // of the exact sum (depth: the count of rows summed, plus the start
    // value), so the two within twice that.  A row of a token that does
    // not occur must not change at all (bound 0).
    auto check = [&](const char *what, const std::vector<float> &got, const std::vector<float> &again,
                     const std::vector<float> &want, const std::vector<float> &start, bool wte_rows) {
        const size_t rows = start.size() / C;
        std::vector<int> count(rows, 0);
        std::vector<double> mass(start.size(), 0.0);
        for (size_t i = 0; i < start.size(); i++)
            mass[i] = std::fabs((double)start[i]);
        for (int bt = 0; bt < BT; bt++) {
            const size_t row = wte_rows ? (size_t)inp[bt] : (size_t)(bt % T);
            count[row]++;
            for (int c = 0; c < C; c++)
                mass[row * C + c] += std::fabs((double)dout[(size_t)bt * C + c]);
        }
        size_t bad = 0, bad_det = 0;
        double err = 0; // in units of the bound
        for (size_t i = 0; i < start.size(); i++) {
            const int cnt = count[i / C];
            const double d = std::fabs((double)got[i] - want[i]), bound = cnt ? 2.0 * (cnt + 1) * u * mass[i] : 0.0;
            if (bound > 0)
                err = std::fmax(err, d / bound);
            bad += !(d <= bound);
            bad_det += fbits(got[i]) != fbits(again[i]);
        }
        verdict(name, what, bad, start.size(), err, "of bound");
        verdict(name, (std::string(what) + " same bits twice").c_str(), bad_det, start.size(), 0, "");
    };
    check("dwpe", dwpe1, dwpe2, dwpe_ref, dwpe0, false);
    check("dwte", dwte1, dwte2, dwte_ref, dwte0, true);
}

// ---- encoder from a 16-bit token table (encoder_forward16w) ----------------------------------

// The forward kernel on a bf16/fp16 table as kc_encoder_forward16w launches
// it, with and without wpe, against the CPU's op in a context of that type:
// bitwise (each element one exact widening, then one add).  off moves the
// table off its 8-byte alignment, where the launcher takes W = 1.
template <class E, int W> void test_encoder16w(int B, int T, int C, int V, int off, unsigned max_blocks)
{
    char buf[96];
    std::snprintf(buf, sizeof buf, "encoder16w %s W=%d B=%d T=%d C=%d+%d", ename<E>(), W, B, T, C, off);
    const std::string name = buf;
    const int BT = B * T;
    const size_t n = (size_t)BT * C;
    std::vector<int32_t> inp(BT);
    for (auto &t : inp)
        t = (int32_t)((rnd() + 1.0f) * 0.5f * V) % V;
    std::vector<uint16_t> tab((size_t)V * C + off);
    for (auto &h : tab)
        h = to_e<E>(4.0f * rnd());
    const uint16_t *wte16 = tab.data() + off;
    const std::vector<float> wpe = random_vec((size_t)T * C, 1.0f);
    const bool w4 = C % 4 == 0 && kc_aligned(16, wpe.data()) && kc_aligned(8, wte16); // kc_encoder_forward16w's test
    if (w4 != (W == 4))
        emu::fail("test: the launcher would not pick this W");
    for (const float *wp : {wpe.data(), (const float *)nullptr}) {
        std::vector<float> out(n, NAN), ref(n, NAN);
        float *o = out.data();
        const int32_t *in = inp.data();
        const E *we = reinterpret_cast<const E *>(wte16);
        emu_launch(grid_for(n / W, 256, max_blocks), dim3(256),
                   [=] { encoder_forward_kernel<W>(o, in, we, wp, BT, T, C); });
        H->encoder_forward16w(cpu_ctx<E>(), ref.data(), inp.data(), wte16, wp, B, T, C);
        same<float>(name, wp ? "forward" : "forward, no wpe", out.data(), ref.data(), n);
    }
}

// ---- causal softmax (the unfused attention) --------------------------------------------

// B·NH·T rows of T; row r is query t = r % T, which sees keys 0..t.  Above
// the diagonal preatt, att (unspecified there, says kernels.h) and datt
// hold NaN, which spreads should a kernel read them; the outputs start as
// NaN, so an element not written fails.
void test_softmax(int B, int NH, int T)
{
    char buf[96];
    std::snprintf(buf, sizeof buf, "att softmax B=%d NH=%d T=%d", B, NH, T);
    const std::string name = buf;
    const size_t rows = (size_t)B * NH * T, n = rows * T;
    const dim3 grid((unsigned)((rows + ATT_WARPS - 1) / ATT_WARPS)), block(32 * ATT_WARPS);
    std::vector<float> pre(n), att(n, NAN);
    for (size_t i = 0; i < n; i++)
        pre[i] = (int)(i % T) <= (int)(i / T % T) ? 8.0f * rnd() : NAN;
    {
        float *a = att.data();
        const float *p = pre.data();
        emu_launch(grid, block, [=] { att_softmax_forward(a, p, rows, T); });
    }
    // Forward, against double: |p − max| ≤ 16 rounded to fp32 moves exp by
    // up to 16·2⁻²⁴ relative, the sums and expf add a few 2⁻²⁴ more: 1e-5.
    size_t bad = 0, bad_zero = 0;
    double err = 0;
    for (size_t r = 0; r < rows; r++) {
        const int t = (int)(r % T);
        const float *p = &pre[r * T], *a = &att[r * T];
        double m = -INFINITY, s = 0;
        for (int j = 0; j <= t; j++)
            m = std::fmax(m, p[j]);
        for (int j = 0; j <= t; j++)
            s += std::exp((double)p[j] - m);
        for (int j = 0; j < T; j++) {
            if (j > t) {
                bad_zero += fbits(a[j]) != 0;
                continue;
            }
            const double ref = std::exp((double)p[j] - m) / s, d = std::fabs(a[j] - ref);
            err = std::fmax(err, d / ref);
            bad += !(d <= 1e-5 * ref);
        }
    }
    verdict(name, "att", bad, n, err, "rel");
    verdict(name, "att above diag", bad_zero, n, 0, "== +0");

    // Backward from that att (NaN above the diagonal) and a random datt.
    std::vector<float> att_in(n), datt(n), dpre(n, NAN);
    for (size_t i = 0; i < n; i++) {
        const bool causal = (int)(i % T) <= (int)(i / T % T);
        att_in[i] = causal ? att[i] : NAN;
        datt[i] = causal ? rnd() : NAN;
    }
    const std::vector<float> datt0 = datt;
    {
        float *dp = dpre.data(), *da = datt.data();
        const float *a = att_in.data();
        emu_launch(grid, block, [=] { att_softmax_backward(dp, da, a, rows, T); });
    }
    // dpre_j = a_j·(da_j − s), s = Σ a_k·da_k: s is within (L + 6)·2⁻²⁴·Σ|a_k·da_k|
    // of exact (L = ⌈(t+1)/32⌉ terms a lane, 5 shuffle levels, the
    // products), the difference and the product add 2·2⁻²⁴ relative.
    bad = bad_zero = 0;
    err = 0;
    size_t bad_att = 0;
    for (size_t r = 0; r < rows; r++) {
        const int t = (int)(r % T);
        const float *a = &att_in[r * T], *da0 = &datt0[r * T], *dp = &dpre[r * T], *da = &datt[r * T];
        double s = 0, mass = 0;
        for (int j = 0; j <= t; j++) {
            s += (double)a[j] * da0[j];
            mass += std::fabs((double)a[j] * da0[j]);
        }
        const double depth = (t + 32) / 32 + 8;
        for (int j = 0; j < T; j++) {
            if (j > t) {
                bad_zero += fbits(dp[j]) != 0 || fbits(da[j]) != 0;
                continue;
            }
            const double ref = a[j] * (da0[j] - s), d = std::fabs(dp[j] - ref);
            const double bound = depth * u * a[j] * (std::fabs(da0[j]) + mass);
            err = std::fmax(err, d / bound);
            bad += !(d <= bound);
            bad_att += fbits(da[j]) != fbits(a[j]); // datt becomes the masked att, for the dV GEMM
        }
    }
    verdict(name, "dpreatt", bad, n, err, "of bound");
    verdict(name, "datt = att", bad_att, n, 0, "bitwise");
    verdict(name, "both above diag", bad_zero, n, 0, "== +0");
}

// ---- sum of squares --------------------------------------------------------------------

// Every square of an fp32 is exact in double and every term positive, so a
// sum in double is within depth·2⁻⁵³ relative of the exact one (depth < 100
// here), which a long double sum stands in for: 1e-13 relative, and the same
// against the CPU.
void check_sumsq(const std::string &name, const char *what, double got, long double exact, double cpu)
{
    const double err = std::fabs((double)(got - exact)) / (double)exact;
    verdict(name, what, !(err <= 1e-13) || !(std::fabs(got - cpu) <= 1e-13 * cpu), 1, err, "rel");
}

// sumsq_partial<W> and sumsq_final as kc_sumsq launches them: W = 4 when g
// is 16-byte aligned (the n % 4 left over go to block 0), ⌈n/W / 256⌉
// blocks, at most KC_SUMSQ_BLOCKS; max_blocks stands in for that cap at a
// size that runs here, so that the partial kernel's loop goes round.
template <int W> void test_sumsq(size_t n, unsigned max_blocks)
{
    char buf[96];
    std::snprintf(buf, sizeof buf, "sumsq W=%d n=%zu grid<=%u", W, n, max_blocks);
    const size_t off = W == 4 ? 0 : 1;
    std::vector<float> gb(n + off);
    float *g = gb.data() + off;
    if (kc_aligned(16, g) != (W == 4))
        emu::fail("test: g does not make the launcher pick W");
    for (size_t i = 0; i < n; i++) // magnitudes over 2⁻¹⁰..2⁹
        g[i] = std::ldexp(rnd(), (int)(i % 20) - 10);
    const size_t work = W == 4 ? n / 4 : n;
    const unsigned want = (unsigned)((work + SQ_THREADS - 1) / SQ_THREADS);
    const unsigned blocks = std::max(1u, std::min({want, (unsigned)KC_SUMSQ_BLOCKS, max_blocks}));
    std::vector<double> partial(blocks, NAN);
    double got = NAN, *part = partial.data(), *out = &got, cpu;
    emu_launch(dim3(blocks), dim3(SQ_THREADS), [=] { sumsq_partial<W>(g, n, part); });
    emu_launch(dim3(1), dim3(SQ_THREADS), [=] { sumsq_final(part, (int)blocks, out); });
    H->sumsq(cpu32, &cpu, g, n);
    long double exact = 0;
    for (size_t i = 0; i < n; i++)
        exact += (long double)g[i] * g[i];
    check_sumsq(buf, "sum", got, exact, cpu);
}

// sumsq_final over a full KC_SUMSQ_BLOCKS partials (its loop goes round
// four times), which sumsq_partial would need a million elements to make.
void test_sumsq_final()
{
    std::vector<double> partial(KC_SUMSQ_BLOCKS);
    long double exact = 0;
    for (auto &p : partial) {
        p = std::ldexp(1.0 + rnd(), (int)(rnd() * 20));
        exact += p;
    }
    double got = NAN, *out = &got;
    const double *part = partial.data();
    emu_launch(dim3(1), dim3(SQ_THREADS), [=] { sumsq_final(part, KC_SUMSQ_BLOCKS, out); });
    check_sumsq("sumsq_final 1024 partials", "sum", got, exact, (double)exact);
}

// ---- AdamW -----------------------------------------------------------------------------

// adamw_f<E> set up as kc_adamw does (bias corrections 1 − βᵗ in fp32 with
// powf; the CPU takes them in double), through kc_ew's kernel: vec when p,
// g, m and v are 16-byte aligned (and p16 8-byte), one element in
// otherwise.  With with16 it also writes p16, which must be the updated p
// rounded to E bit for bit; p, m and v are checked against the CPU's
// without a copy.
template <class E> void test_adamw(size_t n, bool vec, int t, float wd, float gs, unsigned max_blocks, bool with16)
{
    char buf[112];
    std::snprintf(buf, sizeof buf, "adamw n=%zu %s t=%d grid<=%u%s", n, vec ? "vec" : "scalar", t, max_blocks,
                  !with16 ? "" : std::is_same_v<E, __half> ? " p16 fp16" : " p16 bf16");
    const std::string name = buf;
    // A large lr, so that the step, not p's own rounding, decides p.
    const float lr = 0.05f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    const size_t off = vec ? 0 : 1;
    std::vector<float> pb = random_vec(n + off, 1.0f), gb(n + off), mb = random_vec(n + off, 0.1f), vb(n + off);
    std::vector<uint16_t> p16b(n + off, 0xffffu);
    for (size_t i = 0; i < n + off; i++) {
        gb[i] = std::ldexp(rnd(), (int)(i % 9) - 6); // gradients over 2⁻⁶..2²
        vb[i] = 0.01f * (1.0f + rnd());
    }
    const std::vector<float> p0 = pb, m0 = mb, v0 = vb;
    float *p = pb.data() + off, *g = gb.data() + off, *m = mb.data() + off, *v = vb.data() + off;
    uint16_t *p16 = with16 ? p16b.data() + off : nullptr;
    if (adamw_vec(p, p16, g, m, v) != vec)
        emu::fail("test: the pointers do not make the launcher pick the path under test");
    const adamw_f<E> f = adamw_make<E>(p, p16, g, m, v, lr, b1, b2, eps, wd, gs, t);
    ew_run(n, vec, f, max_blocks);
    std::vector<float> pr(p0.begin() + off, p0.end()), mr(m0.begin() + off, m0.end()), vr(v0.begin() + off, v0.end());
    H->adamw(cpu32, pr.data(), nullptr, g, mr.data(), vr.data(), n, lr, b1, b2, eps, wd, gs, t);
    if (with16) {
        std::vector<uint16_t> want(n);
        for (size_t i = 0; i < n; i++)
            want[i] = to_e<E>(p[i]);
        same<uint16_t>(name, "p16", p16, want.data(), n);
    }

    // m and v: each side rounds the scaled gradient, two products and a sum
    // (the CPU's may be contracted), so within 4·2⁻²⁴ of the terms' sum each
    // way (6 for v: the gradient squared).  p: bc in fp32 moves 1/bc by up
    // to 2⁻²⁴/(1 − βᵗ) relative, the step's arithmetic by some 2⁻²⁴ (16
    // allowed), and p − lr·step rounds: the two sides may be an ulp apart,
    // at most 2·2⁻²⁴·|p|.
    const double bc_rel = u / (1.0 - std::pow((double)b1, t)) + u / (1.0 - std::pow((double)b2, t));
    size_t bad_m = 0, bad_v = 0, bad_p = 0;
    double err_m = 0, err_v = 0, err_p = 0; // in units of the bound
    for (size_t i = 0; i < n; i++) {
        const double gi = (double)gs * g[i];
        const double mass_m = std::fabs(b1 * m0[off + i]) + std::fabs((1.0 - b1) * gi);
        const double mass_v = std::fabs(b2 * v0[off + i]) + std::fabs((1.0 - b2) * gi * gi);
        const double dm = std::fabs((double)m[i] - mr[i]), bm = 8 * u * mass_m;
        const double dv = std::fabs((double)v[i] - vr[i]), bv = 12 * u * mass_v;
        const double mhat = mr[i] / (1.0 - std::pow((double)b1, t)), vhat = vr[i] / (1.0 - std::pow((double)b2, t));
        const double step = std::fabs(mhat / (std::sqrt(vhat) + eps)) + std::fabs(wd * (double)p0[off + i]);
        const double dp = std::fabs((double)p[i] - pr[i]);
        const double bp = 2 * u * std::fabs(pr[i]) + lr * step * (bc_rel + 16 * u);
        err_m = std::fmax(err_m, dm / bm);
        err_v = std::fmax(err_v, dv / bv);
        err_p = std::fmax(err_p, dp / bp);
        bad_m += !(dm <= bm);
        bad_v += !(dv <= bv);
        bad_p += !(dp <= bp);
    }
    verdict(name, "m", bad_m, n, err_m, "of bound");
    verdict(name, "v", bad_v, n, err_v, "of bound");
    verdict(name, "p", bad_p, n, err_p, "of bound");
}

// adamw_multi's chunk table and kernel against kc_adamw once per segment
// (ew_run, each segment's own vector choice), bitwise for p, m, v and p16:
// the kernel must give each element the per-tensor arithmetic whatever
// chunk it falls in.  The segments: one over three chunks, a scalar one of
// 3, one whose start is not a multiple of 4 (scalar head, vector body,
// scalar tail), one of 1, and a gap between two that must stay untouched.
// base_off 1 makes the buffers' bases unaligned: every chunk scalar.
template <class E> void test_adamw_multi(size_t base_off, int t, bool with16)
{
    char buf[96];
    std::snprintf(buf, sizeof buf, "adamw_multi base+%zu t=%d%s", base_off, t, with16 ? " p16" : "");
    const std::string name = buf;
    const kern_segment segs[] = {{0, 2 * ADAMW_CHUNK + 4099, 1}, {2 * ADAMW_CHUNK + 4099, 3, 0},
                                 {2 * ADAMW_CHUNK + 4102, 771, 1}, {2 * ADAMW_CHUNK + 4873, 1, 0},
                                 {2 * ADAMW_CHUNK + 4879, 2001, 0}};
    const int nsegs = (int)(sizeof segs / sizeof segs[0]);
    const size_t total = 2 * ADAMW_CHUNK + 4879 + 2001 + base_off;
    const float lr = 0.05f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.1f, gs = 0.75f;
    std::vector<float> p0 = random_vec(total, 1.0f), g(total), m0 = random_vec(total, 0.1f), v0(total);
    for (size_t i = 0; i < total; i++) {
        g[i] = std::ldexp(rnd(), (int)(i % 9) - 6);
        v0[i] = 0.01f * (1.0f + rnd());
    }
    std::vector<float> p1 = p0, m1 = m0, v1 = v0, p2 = p0, m2 = m0, v2 = v0;
    std::vector<uint16_t> h1(total, 0xffffu), h2(total, 0xffffu);
    const size_t o = base_off;
    auto at16 = [&](std::vector<uint16_t> &h, size_t i) { return with16 ? h.data() + o + i : nullptr; };

    for (const kern_segment &s : segs) {
        float *p = p1.data() + o + s.offset, *m = m1.data() + o + s.offset, *v = v1.data() + o + s.offset;
        const float *gp = g.data() + o + s.offset;
        uint16_t *p16 = at16(h1, s.offset);
        ew_run(s.n, adamw_vec(p, p16, gp, m, v),
               adamw_make<E>(p, p16, gp, m, v, lr, b1, b2, eps, s.decay ? wd : 0.0f, gs, t), 65535);
    }

    float *p = p2.data() + o, *m = m2.data() + o, *v = v2.data() + o;
    const float *gp = g.data() + o;
    uint16_t *p16 = at16(h2, 0);
    const bool vec = adamw_vec(p, p16, gp, m, v);
    if (vec != (base_off == 0))
        emu::fail("test: the bases do not make adamw_multi pick the path under test");
    const size_t nchunks = adamw_chunks(segs, nsegs, vec, nullptr);
    std::vector<kc_adamw_chunk> table(nchunks);
    adamw_chunks(segs, nsegs, vec, table.data());
    // The table: each segment's elements once, in order, no chunk over
    // ADAMW_CHUNK, vector chunks on multiples of 4.
    size_t c = 0, table_bad = 0;
    for (const kern_segment &s : segs) {
        size_t at = s.offset;
        while (at < s.offset + s.n && c < nchunks) {
            const kc_adamw_chunk &ch = table[c++];
            const bool v4 = ch.flags & KC_CHUNK_VEC;
            table_bad += ch.off != at || ch.n == 0 || ch.n > ADAMW_CHUNK || (ch.flags & KC_CHUNK_DECAY) != (s.decay ? 1u : 0u) ||
                         (v4 && (!vec || ch.off % 4 || ch.n % 4));
            at += ch.n;
        }
        table_bad += at != s.offset + s.n;
    }
    table_bad += c != nchunks;
    verdict(name, "chunk table", table_bad, nchunks, 0, "entries wrong");

    const adamw_f<E> f = adamw_make<E>(p, p16, gp, m, v, lr, b1, b2, eps, wd, gs, t);
    const kc_adamw_chunk *tp = table.data();
    emu_launch(dim3((unsigned)nchunks), dim3(ADAMW_THREADS), [=] { adamw_multi_kernel<E>(f, wd, tp); });
    same<float>(name, "p", p2.data(), p1.data(), total);
    same<float>(name, "m", m2.data(), m1.data(), total);
    same<float>(name, "v", v2.data(), v1.data(), total);
    if (with16)
        same<uint16_t>(name, "p16", h2.data(), h1.data(), total);
}

// ---- GEMM fallbacks ----------------------------------------------------------------------

// What gemm.cu runs where cuBLASLt declines, with the CPU's GEMMs standing
// in for cuBLASLt's: out (N, OC) = inp·weightᵀ without the bias epilogue,
// then add_bias_kernel; a 16-bit out = rnd(inp16·weightᵀ), then
// add_bias16_kernel<E> with the bias cast to E (rounded twice where the
// CPU's matmul_forward16_out16, like the epilogue, rounds once); and
// k = 0 (C = 0, an empty sum): scale_matrix_kernel with beta 0 (out = 0
// whatever it held, NaN included), then the bias.  The grids are the
// launchers' kc_grid (within max_blocks).
void test_gemm_fallbacks(int N, int C, int OC, unsigned max_blocks)
{
    char buf[96];
    std::snprintf(buf, sizeof buf, "gemm fallbacks N=%d C=%d OC=%d", N, C, OC);
    const std::string name = buf;
    const size_t no = (size_t)N * OC;
    const std::vector<float> inp = random_vec((size_t)N * C, 1.0f), weight = random_vec((size_t)OC * C, 0.5f),
                             bias = random_vec(OC, 1.0f);
    const dim3 grid = grid_for(no, 256, max_blocks);
    const float *bp = bias.data();

    // fp32: the CPU's sgemm adds the product to the bias (beta 1), the
    // fallback the bias to the same product: the same sum where sgemm adds
    // beta·C after the product, as OpenBLAS does; 2⁻²⁴ of |ref| and of
    // max|ref| allowed, should its order differ by a rounding.
    std::vector<float> out(no), ref(no);
    H->matmul_forward(cpu32, out.data(), inp.data(), weight.data(), nullptr, N, C, OC);
    H->matmul_forward(cpu32, ref.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
    float *o = out.data();
    emu_launch(grid, dim3(256), [=] { add_bias_kernel(o, bp, (size_t)N, OC); });
    compare(name, "bias fp32", out.data(), ref.data(), no, u, u);

    auto bias16 = [&]<class E>(E *) {
        std::vector<uint16_t> in16((size_t)N * C), out16(no), ref16(no), b16(OC);
        for (size_t i = 0; i < in16.size(); i++)
            in16[i] = to_e<E>(inp[i]);
        std::vector<uint16_t> w16((size_t)OC * C);
        for (size_t i = 0; i < w16.size(); i++)
            w16[i] = to_e<E>(weight[i]);
        for (int c = 0; c < OC; c++)
            b16[c] = to_e<E>(bias[c]); // kc_cast_lowp's rounding
        H->matmul_forward16_out16(cpu_ctx<E>(), out16.data(), in16.data(), w16.data(), nullptr, N, C, OC);
        H->matmul_forward16_out16(cpu_ctx<E>(), ref16.data(), in16.data(), w16.data(), bias.data(), N, C, OC);
        const std::vector<uint16_t> gemm16 = out16;
        uint16_t *o16 = out16.data();
        const uint16_t *b = b16.data();
        emu_launch(grid, dim3(256), [=] { add_bias16_kernel<E>(o16, b, (size_t)N, OC); });
        // Half an ulp of the GEMM's 16-bit result and half of the sum's,
        // against half of the CPU's sum (of the same 16-bit bias): an ulp
        // of the first and of the last, plus the fp32 allowance.
        double maxref = 0, err = 0;
        for (size_t i = 0; i < no; i++)
            maxref = std::fmax(maxref, std::fabs((double)from_e<E>(ref16[i])));
        size_t bad = 0;
        for (size_t i = 0; i < no; i++) {
            const double r = from_e<E>(ref16[i]), d = std::fabs((double)from_e<E>(out16[i]) - r);
            err = std::fmax(err, d / maxref);
            bad += !(d <= ulp_e<E>(from_e<E>(gemm16[i])) + ulp_e<E>((float)r) + 1e-6 * maxref);
        }
        verdict(name, std::is_same_v<E, __half> ? "bias fp16" : "bias bf16", bad, no, err, "of max");
    };
    bias16((__nv_bfloat16 *)nullptr);
    bias16((__half *)nullptr);

    // k = 0, as gemm_run: out = beta·out with beta 0 (forward's), then the
    // bias; 0 + bias rounds nothing, so bitwise.
    std::vector<float> zero_ref(no);
    for (size_t i = 0; i < no; i++)
        zero_ref[i] = 0.0f + bias[i % OC];
    std::fill(out.begin(), out.end(), NAN);
    emu_launch(grid_for(no, 256, max_blocks), dim3(256), [=] { scale_matrix_kernel(o, OC, N, OC, 0.0f); });
    emu_launch(grid, dim3(256), [=] { add_bias_kernel(o, bp, (size_t)N, OC); });
    same<float>(name, "k=0 bias", out.data(), zero_ref.data(), no);

    // The scaling's other betas, on a D whose ld leaves rows unused: those
    // keep their values; one product each, bitwise.
    const int m = OC - 3, ld = OC;
    std::vector<float> d = random_vec(no, 1.0f), d_ref = d;
    for (size_t i = 0; i < no; i++)
        if ((int)(i % ld) < m)
            d_ref[i] *= 0.5f;
    float *dp = d.data();
    emu_launch(grid_for((size_t)m * N, 256, max_blocks), dim3(256), [=] { scale_matrix_kernel(dp, m, N, ld, 0.5f); });
    same<float>(name, "beta 0.5, ld>m", d.data(), d_ref.data(), no);
}

// ---- fill pattern ----------------------------------------------------------------------

// kern_cuda_fill_pattern's grid (⌈n/256⌉ blocks, at most 65535; within
// max_blocks, so that the loop goes round), word for word against the CPU's
// kern_cpu_check_pattern; the word past the end stays as it was.
void test_fill(size_t n, uint32_t seed, unsigned max_blocks)
{
    char buf[96];
    std::snprintf(buf, sizeof buf, "fill n=%zu grid<=%u", n, max_blocks);
    std::vector<uint32_t> words(n + 1, 0xdeadbeefu);
    uint32_t *p = words.data();
    const unsigned blocks = (unsigned)std::min({(n + 255) / 256, (size_t)65535, (size_t)max_blocks});
    emu_launch(dim3(blocks), dim3(256), [=] { fill_pattern_kernel(p, n, seed); });
    const size_t bad = kern_cpu_check_pattern(p, n, seed) + (words[n] != 0xdeadbeefu);
    verdict(buf, "pattern", bad, n + 1, 0, "bitwise");
}

} // namespace

int main()
{
    const auto t0 = std::chrono::steady_clock::now();
    if (!cpu_open())
        return 1;

    // Encoder: C % 4 == 0 (W = 4, 128 threads for dwte: most idle) and not
    // (W = 1), runs of many equal tokens (V = 7) and tokens once or never
    // (V = 50); C ≥ 1024 (256 threads, the channel loop going round twice).
    test_encoder<4>(2, 16, 100, 7, 2);
    test_encoder<1>(2, 16, 101, 50, 2);
    test_encoder<4>(1, 5, 1032, 3, 4);
    test_encoder<1>(1, 5, 1030, 3, 4);
    // From a 16-bit table (a frozen base's): both types, both widths, and
    // a grid that goes round.
    test_encoder16w<__nv_bfloat16, 4>(2, 16, 100, 7, 0, 2);
    test_encoder16w<__nv_bfloat16, 1>(2, 16, 100, 50, 1, 2);
    test_encoder16w<__half, 4>(1, 5, 1032, 3, 0, 4);
    test_encoder16w<__half, 1>(2, 7, 101, 9, 0, 32);

    // Causal softmax: T > 64 (lanes go round a row three times), rows not
    // a multiple of the 8 per block (whole warps return); short rows.
    test_softmax(1, 2, 70);
    test_softmax(3, 1, 9);

    // Sum of squares: W = 4 with a tail of 3, on the launcher's grid and on
    // two blocks; W = 1; n < 4 (all tail); the final sum over 1024 partials.
    test_sumsq<4>(5003, KC_SUMSQ_BLOCKS);
    test_sumsq<4>(5003, 2);
    test_sumsq<1>(5003, KC_SUMSQ_BLOCKS);
    test_sumsq<4>(3, KC_SUMSQ_BLOCKS);
    test_sumsq_final();

    // AdamW: the vector path on one block (the loop goes round) with weight
    // decay at t = 1; the scalar path at t = 10 with a gradient scale.
    test_adamw<__nv_bfloat16>(2001, true, 1, 0.1f, 1.0f, 1, false);
    test_adamw<__nv_bfloat16>(2001, false, 10, 0.0f, 0.5f, 2, false);
    test_adamw<__nv_bfloat16>(2001, true, 3, 0.1f, 1.0f, 3, true);
    test_adamw<__half>(2001, false, 2, 0.1f, 0.5f, 2, true);
    // adamw_multi: aligned bases (vector chunks), unaligned (all scalar).
    test_adamw_multi<__nv_bfloat16>(0, 3, true);
    test_adamw_multi<__half>(1, 1, true);
    test_adamw_multi<__nv_bfloat16>(0, 7, false);

    // GEMM fallbacks: N·OC over two blocks, and one block (the loop).
    test_gemm_fallbacks(13, 24, 40, 32);
    test_gemm_fallbacks(13, 24, 40, 1);

    // Fill: the launcher's grid, and two blocks.
    test_fill(3001, 0x9e3779b9u, 65535);
    test_fill(3001, 7, 2);

    return cpu_close(t0);
}
