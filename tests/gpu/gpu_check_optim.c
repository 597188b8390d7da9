/* gpu_check_optim.c — the CUDA optimizer, reductions and casts against
 * the CPU's (see test_gpu_kernels.c): the sum of squares, AdamW (with its
 * 16-bit copy and per segment), the bf16/fp16 casts, the count of
 * non-finite values, and the reductions that must give the same bits
 * twice. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "gpu_check.h"

void test_sumsq(size_t n, int offset)
{
    size_t o = (size_t)offset;
    buf g = mk(n + o, 3);
    double hs = 0, gs = 0;
    H->sumsq(hk, &hs, g.h + o, n);
    G->sumsq(gk, &gs, g.d + o, n);
    gsync("sumsq");
    double e = fabs(gs - hs), rel = e / fmax(fabs(hs), 1e-300);
    printf("  %-22s %-9s ref %-12.9g abs err %-9.3g rel err %-9.3g %s\n", "sumsq", o ? "unal" : "", hs, e, rel,
           rel <= 1e-10 ? "ok" : "FAIL");
    if (!(rel <= 1e-10))
        FAIL("sumsq n=%zu: gpu %.17g cpu %.17g", n, gs, hs);
    bfree(&g);
}

void test_adamw(size_t n)
{
    buf p = mk(n, 1), g = mk(n, 1), m = mk(n, 0.1f), v = mk(n, 0);
    for (size_t i = 0; i < n; i++)
        v.h[i] = 0.01f * fabsf(rnd());
    G->copy_h2d(gk, v.d, v.h, n * sizeof(float));
    for (int t = 1; t <= 3; t++) {
        H->adamw(hk, p.h, NULL, g.h, m.h, v.h, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
        G->adamw(gk, p.d, NULL, g.d, m.d, v.d, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
    }
    gsync("adamw");
    cmp("adamw", "p", &p, 1e-6, 1e-6);
    cmp("adamw", "m", &m, 1e-6, 1e-7);
    cmp("adamw", "v", &v, 1e-6, 1e-7);
    bfree(&p), bfree(&g), bfree(&m), bfree(&v);
}

/* AdamW in a 16-bit context with the 16-bit copy of p (p16), at an offset
 * that takes the scalar path too: p16 is exactly the GPU's own cast of the
 * GPU's p (bitwise), and within an ulp16 of the cpu's p16. */
void test_adamw16(size_t n, int offset)
{
    const char *name = ctx_bf16 ? "adamw16 bf16" : "adamw16 fp16";
    size_t o = (size_t)offset;
    buf p = mk(n + o, 1), g = mk(n + o, 1), m = mk(n + o, 0.1f), v = mk(n + o, 0);
    buf16 p16 = mk16(n + o, 0), again = mk16(n + o, 0);
    for (size_t i = 0; i < n + o; i++)
        v.h[i] = 0.01f * fabsf(rnd());
    G->copy_h2d(gk, v.d, v.h, (n + o) * sizeof(float));
    for (int t = 1; t <= 3; t++) {
        H->adamw(hk, p.h + o, p16.h + o, g.h + o, m.h + o, v.h + o, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
        G->adamw(gk, p.d + o, p16.d + o, g.d + o, m.d + o, v.d + o, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
    }
    gcast16(again.d + o, p.d + o, n);
    gsync(name);
    cmp(name, "p", &p, 1e-6, 1e-6);
    cmp16(name, "p16", &p16, 1e-6, 1e-6);
    size_t d = diff16(p16.d + o, again.d + o, n);
    printf("  %-22s %-9s %zu of p16 differ from the gpu's cast of its p %s\n", name, o ? "unal" : "", d,
           d ? "FAIL" : "ok");
    if (d)
        FAIL("%s: %zu values of p16 are not the cast of the updated p", name, d);
    bfree(&p), bfree(&g), bfree(&m), bfree(&v), b16free(&p16), b16free(&again);
}

static bool same16(uint16_t a, uint16_t b, bool bf16)
{
    if (a == b)
        return true;
    /* NaN: any quiet NaN will do (the payload may differ). */
    uint16_t expm = bf16 ? 0x7f80u : 0x7c00u, manm = bf16 ? 0x007fu : 0x03ffu;
    bool na = (a & expm) == expm && (a & manm), nb = (b & expm) == expm && (b & manm);
    return na && nb;
}

void test_casts(size_t n)
{
    float *src = hmalloc(n * sizeof(float));
    static const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65520.0f, 1e6f, -1e6f, 6e-8f, 3e-8f,
                                    1e-40f, 3.4e38f, INFINITY, -INFINITY, NAN, 1.00390625f, 1.0009765625f};
    size_t ns = sizeof special / sizeof special[0];
    for (size_t i = 0; i < n; i++) {
        if (i < ns) {
            src[i] = special[i];
        } else {
            /* Random bit patterns: every exponent, rounding ties included. */
            uint32_t u = rnd_u32() ^ (rnd_u32() << 16);
            memcpy(&src[i], &u, 4);
        }
    }
    float *dsrc = dmalloc(n * sizeof(float));
    uint16_t *d16 = dmalloc(n * 2), *h16 = hmalloc(n * 2), *g16 = hmalloc(n * 2);
    float *dback = dmalloc(n * sizeof(float)), *hback = hmalloc(n * sizeof(float)), *gback = hmalloc(n * sizeof(float));
    G->copy_h2d(gk, dsrc, src, n * sizeof(float));
    for (int bf = 1; bf >= 0; bf--) {
        const char *name = bf ? "cast bf16" : "cast f16";
        if (bf) {
            H->cast_f32_to_bf16(hk, h16, src, n);
            G->cast_f32_to_bf16(gk, d16, dsrc, n);
        } else {
            H->cast_f32_to_f16(hk, h16, src, n);
            G->cast_f32_to_f16(gk, d16, dsrc, n);
        }
        G->copy_d2h(gk, g16, d16, n * 2);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < n; i++)
            if (!same16(g16[i], h16[i], bf)) {
                if (!bad)
                    first = i;
                bad++;
            }
        /* Back to fp32 from the same 16-bit values. */
        G->copy_h2d(gk, d16, h16, n * 2);
        if (bf) {
            H->cast_bf16_to_f32(hk, hback, h16, n);
            G->cast_bf16_to_f32(gk, dback, d16, n);
        } else {
            H->cast_f16_to_f32(hk, hback, h16, n);
            G->cast_f16_to_f32(gk, dback, d16, n);
        }
        G->copy_d2h(gk, gback, dback, n * sizeof(float));
        gsync(name);
        size_t bad2 = 0;
        for (size_t i = 0; i < n; i++)
            if (memcmp(&gback[i], &hback[i], 4) && !(isnan(gback[i]) && isnan(hback[i])))
                bad2++;
        printf("  %-22s %-9s %zu values, %zu differ to 16 bits, %zu differ back to fp32 %s\n", name, "", n, bad,
               bad2, bad || bad2 ? "FAIL" : "ok");
        if (bad)
            FAIL("%s: %zu mismatches, first at %zu: %.9g -> gpu 0x%04x cpu 0x%04x", name, bad, first,
                 (double)src[first], g16[first], h16[first]);
        if (bad2)
            FAIL("%s: %zu mismatches back to fp32", name, bad2);
    }
    free(src), free(h16), free(g16), free(hback), free(gback);
}

void test_nonfinite(size_t n, int offset)
{
    size_t o = (size_t)offset;
    buf p = mk(n + o, 1);
    size_t put = 0;
    for (size_t i = o; i < n + o; i += 997, put++)
        p.h[i] = put % 3 == 0 ? NAN : put % 3 == 1 ? INFINITY : -INFINITY;
    p.h[n + o - 1] = NAN; /* the tail */
    G->copy_h2d(gk, p.d, p.h, (n + o) * sizeof(float));
    size_t hc = H->count_nonfinite(hk, p.h + o, n), gc = G->count_nonfinite(gk, p.d + o, n);
    gsync("count_nonfinite");
    printf("  %-22s %-9s cpu %zu gpu %zu %s\n", "count_nonfinite", o ? "unal" : "", hc, gc, hc == gc ? "ok" : "FAIL");
    if (hc != gc)
        FAIL("count_nonfinite: gpu %zu cpu %zu", gc, hc);
    bfree(&p);
}

/* A device copy of b (host side too). */
static buf clone(const buf *b)
{
    buf c = mk(b->n, 0);
    memcpy(c.h, b->h, b->n * sizeof(float));
    G->copy_h2d(gk, c.d, c.h, b->n * sizeof(float));
    return c;
}

/* adamw_multi against adamw once per segment, both on the GPU: the same
 * bits for p, m, v and (with16) p16.  The segments mix decay, span several
 * of its chunks, start off a multiple of 4 and leave a gap between two
 * (which both sides leave alone); offset 1 puts every base off 16 bytes.
 * Steps 1 and 2 reuse the chunk table made at step 1, step 3 has other
 * segments, so the table is made again. */
void test_adamw_multi(int offset, bool with16)
{
    char name[64];
    snprintf(name, sizeof name, "adamw_multi%s%s", with16 ? (ctx_bf16 ? " bf16" : " fp16") : "", offset ? " unal" : "");
    enum { LEN = 40780 + 2001 }; /* the elements the segments span */
    const kern_segment segs[] = {{0, 40000, 1}, {40000, 3, 0}, {40003, 771, 1}, {40774, 1, 0}, {40780, 2001, 0}};
    const kern_segment other[] = {{0, 40003, 0}, {40003, LEN - 40003, 1}};
    for (int i = 0; i < 5; i++) /* past the buffers, both sides would write into their neighbours */
        if (segs[i].offset + segs[i].n > LEN || (i < 2 && other[i].offset + other[i].n > LEN)) {
            FAIL("%s: test segment %d ends past the buffers", name, i);
            return;
        }
    size_t o = (size_t)offset, n = LEN + o;
    buf p1 = mk(n, 1), g = mk(n, 1), m1 = mk(n, 0.1f), v1 = mk(n, 0);
    for (size_t i = 0; i < n; i++)
        v1.h[i] = 0.01f * fabsf(rnd());
    G->copy_h2d(gk, v1.d, v1.h, n * sizeof(float));
    buf p2 = clone(&p1), m2 = clone(&m1), v2 = clone(&v1);
    buf16 h1 = mk16(n, 0), h2 = mk16(n, 0);
    G->copy_h2d(gk, h2.d, h1.h, n * 2);
    for (int t = 1; t <= 3; t++) {
        const kern_segment *s = t < 3 ? segs : other;
        int ns = t < 3 ? 5 : 2;
        for (int i = 0; i < ns; i++) {
            size_t at = o + s[i].offset;
            G->adamw(gk, p1.d + at, with16 ? h1.d + at : NULL, g.d + at, m1.d + at, v1.d + at, s[i].n, 1e-3f,
                     0.9f, 0.95f, 1e-8f, s[i].decay ? 0.1f : 0.0f, 0.5f, t);
        }
        G->adamw_multi(gk, p2.d + o, with16 ? h2.d + o : NULL, g.d + o, m2.d + o, v2.d + o, s, ns, 1e-3f, 0.9f,
                       0.95f, 1e-8f, 0.1f, 0.5f, t);
    }
    gsync(name);
    bool same = same_bits(p1.d, p2.d, n) && same_bits(m1.d, m2.d, n) && same_bits(v1.d, v2.d, n);
    size_t d16 = with16 ? diff16(h1.d, h2.d, n) : 0;
    printf("  %-22s p, m, v%s the bits of adamw per segment %s\n", name, with16 ? ", p16" : "",
           same && !d16 ? "ok" : "FAIL");
    if (!same || d16)
        FAIL("%s: not the bits of adamw per segment (p, m, v %s; %zu of p16 differ)", name,
             same ? "same" : "differ", d16);
    bfree(&p1), bfree(&g), bfree(&m1), bfree(&v1), bfree(&p2), bfree(&m2), bfree(&v2);
    b16free(&h1), b16free(&h2);
}

void test_determinism(void)
{
    int B = 8, T = 64, C = 128, V = 7, N = B * T;
    buf dout = mk((size_t)N * C, 1), inp = mk((size_t)N * C, 1), w = mk(C, 1), mean = mk(N, 0), rstd = mk(N, 0);
    ibuf tok = mki((size_t)N, 0, V);
    buf g1 = mk((size_t)V * C, 0), g2 = mk((size_t)V * C, 0), p1 = mk((size_t)T * C, 0), p2 = mk((size_t)T * C, 0);
    G->encoder_backward(gk, g1.d, p1.d, dout.d, tok.d, B, T, C);
    G->encoder_backward(gk, g2.d, p2.d, dout.d, tok.d, B, T, C);
    bool enc = same_bits(g1.d, g2.d, g1.n) && same_bits(p1.d, p2.d, p1.n);
    buf o = mk((size_t)N * C, 0), bb = mk(C, 0);
    G->layernorm_forward(gk, o.d, mean.d, rstd.d, inp.d, w.d, bb.d, N, C);
    buf w1 = mk(C, 0), w2 = mk(C, 0), b1 = mk(C, 0), b2 = mk(C, 0);
    G->layernorm_backward(gk, NULL, w1.d, b1.d, dout.d, inp.d, w.d, mean.d, rstd.d, N, C);
    G->layernorm_backward(gk, NULL, w2.d, b2.d, dout.d, inp.d, w.d, mean.d, rstd.d, N, C);
    bool ln = same_bits(w1.d, w2.d, C) && same_bits(b1.d, b2.d, C);
    /* With dinp (from zeros): the register kernel's fused weight gradients
     * (C = 128), twice the same bits. */
    buf d1 = mk((size_t)N * C, 0), d2 = mk((size_t)N * C, 0), w3 = mk(C, 0), w4 = mk(C, 0), b3 = mk(C, 0),
        b4 = mk(C, 0);
    G->layernorm_backward(gk, d1.d, w3.d, b3.d, dout.d, inp.d, w.d, mean.d, rstd.d, N, C);
    G->layernorm_backward(gk, d2.d, w4.d, b4.d, dout.d, inp.d, w.d, mean.d, rstd.d, N, C);
    ln = ln && same_bits(w3.d, w4.d, C) && same_bits(b3.d, b4.d, C) && same_bits(d1.d, d2.d, d1.n);
    bfree(&d1), bfree(&d2), bfree(&w3), bfree(&w4), bfree(&b3), bfree(&b4);
    double s1 = 0, s2 = 0;
    G->sumsq(gk, &s1, dout.d, dout.n);
    G->sumsq(gk, &s2, dout.d, dout.n);
    gsync("determinism");
    printf("  %-22s encoder_backward %s, layernorm_backward %s, sumsq %s\n", "determinism", enc ? "ok" : "FAIL",
           ln ? "ok" : "FAIL", s1 == s2 ? "ok" : "FAIL");
    if (!enc || !ln || s1 != s2)
        FAIL("a deterministic reduction gave different bits on a second run");
    bfree(&dout), bfree(&inp), bfree(&w), bfree(&mean), bfree(&rstd), ibfree(&tok), bfree(&g1), bfree(&g2);
    bfree(&p1), bfree(&p2), bfree(&o), bfree(&bb), bfree(&w1), bfree(&w2), bfree(&b1), bfree(&b2);
}
