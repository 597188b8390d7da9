/* test_kernels_attention.c — the CPU causal attention: forward against
 * naive attention in double across its 64-row blocks, backward against
 * central finite differences (never reading above the diagonal), and
 * attention_decode as the last row of the full forward over a KV cache. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels.h"
#include "kern_check.h"

/* ---- attention ------------------------------------------------------------------------- */

typedef struct {
    kern_ctx *k;
    float *out, *preatt, *att, *inp, *wt;
    int B, T, C, NH;
} att_case;

static double att_loss(void *p)
{
    att_case *c = p;
    ops->attention_forward(c->k, c->out, c->preatt, c->att, c->inp, c->B, c->T, c->C, c->NH);
    return dotd(c->wt, c->out, (size_t)c->B * c->T * c->C);
}

/* Naive attention in double: per row, scores, softmax over t2 <= t, sum of v. */
static void att_reference(double *out, double *att, const float *inp, int B, int T, int C, int NH)
{
    int hs = C / NH;
    double scale = 1.0 / sqrt(hs);
    double *row = malloc(T * sizeof *row);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = inp + ((size_t)b * T + t) * 3 * C + h * hs;
                double mx = -INFINITY, sum = 0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *kk = inp + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    double s = 0;
                    for (int i = 0; i < hs; i++)
                        s += (double)q[i] * kk[i];
                    row[t2] = s * scale;
                    mx = fmax(mx, row[t2]);
                }
                for (int t2 = 0; t2 <= t; t2++)
                    sum += (row[t2] = exp(row[t2] - mx));
                double *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++)
                    o[i] = 0;
                double *a = att + (((size_t)b * NH + h) * T + t) * T;
                for (int t2 = 0; t2 < T; t2++)
                    a[t2] = t2 <= t ? row[t2] / sum : 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = inp + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++)
                        o[i] += a[t2] * v[i];
                }
            }
    free(row);
}

/* T = 70 crosses the 64-row blocks of the implementation. */
static void test_attention_forward(void **state)
{
    (void)state;
    static const int shapes[][4] = {{2, 5, 8, 2}, {2, 70, 32, 4}, {1, 130, 12, 3}};
    for (int threads = 1; threads <= 2; threads++) {
        kern_ctx *k = ctx(threads);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], NH = shapes[s][3];
            size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
            float *inp = randv(nq, 2), *out = zerov(no), *pre = zerov(na), *att = zerov(na);
            double *wo = malloc(no * sizeof *wo), *wa = malloc(na * sizeof *wa);
            ops->attention_forward(k, out, pre, att, inp, B, T, C, NH);
            att_reference(wo, wa, inp, B, T, C, NH);
            assert_close("attention out", out, wo, no, 1e-4, 1e-5);
            /* att: only the causal triangle is specified */
            for (size_t r = 0; r < (size_t)B * NH * T; r++)
                for (int t2 = 0; t2 <= (int)(r % T); t2++) {
                    double want = wa[r * T + t2], got = att[r * T + t2];
                    if (!(fabs(got - want) <= 1e-5 + 1e-4 * want)) {
                        print_error("att[%zu,%d]: got %.9g want %.9g\n", r, t2, got, want);
                        fail();
                    }
                }
            free(inp), free(out), free(pre), free(att), free(wo), free(wa);
        }
        ops->ctx_destroy(k);
    }
}

static void attention_grad_case(int B, int T, int C, int NH)
{
    kern_ctx *k = ctx(2);
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    att_case c = {k, zerov(no), zerov(na), zerov(na), randv(nq, 1.5), randv(no, 1), B, T, C, NH};
    att_loss(&c);
    /* The backward must not read att above the diagonal: poison it. */
    for (size_t r = 0; r < (size_t)B * NH * T; r++)
        for (int t2 = (int)(r % T) + 1; t2 < T; t2++)
            c.att[r * T + t2] = NAN;
    float *dinp = zerov(nq), *dpre = randv(na, 1), *datt = randv(na, 1);
    ops->attention_backward(k, dinp, dpre, datt, c.wt, c.inp, c.att, B, T, C, NH);
    check_grad("attention dinp", c.inp, dinp, nq, att_loss, &c, NULL);
    free(c.out), free(c.preatt), free(c.att), free(c.inp), free(c.wt), free(dinp), free(dpre), free(datt);
    ops->ctx_destroy(k);
}

static void test_attention_grad(void **state)
{
    (void)state;
    attention_grad_case(2, 5, 8, 2);
    attention_grad_case(1, 67, 4, 2); /* two row blocks */
}

/* attention_decode at Tc positions is the last row of attention_forward
 * over the same Tc positions: the cache holds rows 0..Tc-2 of the keys and
 * values, qkv the last position.  The op writes the new row into the cache
 * and nothing past it (a NaN sentinel there would also poison the output if
 * it were read).  Tc runs over 1, a single block and past the 64-row
 * blocks of the full attention; NH = 3 gives a head size that is not a
 * power of two. */
static void test_attention_decode(void **state)
{
    (void)state;
    static const int tcs[] = {1, 2, 7, 64, 65, 70};
    const int B = 2, C = 24, Tmax = 72;
    for (int threads = 1; threads <= 2; threads++) {
        kern_ctx *k = ctx(threads);
        for (int NH = 2; NH <= 3; NH++)
            for (size_t i = 0; i < sizeof tcs / sizeof tcs[0]; i++) {
                int Tc = tcs[i];
                size_t nq = (size_t)B * Tc * 3 * C, no = (size_t)B * Tc * C, na = (size_t)B * NH * Tc * Tc;
                size_t nc = (size_t)B * Tmax * C;
                float *inp = randv(nq, 2), *out = zerov(no), *pre = zerov(na), *att = zerov(na);
                float *kc = malloc(nc * sizeof *kc), *vc = malloc(nc * sizeof *vc), *qkv = zerov((size_t)B * 3 * C);
                float *dout = zerov((size_t)B * C), *datt = zerov((size_t)B * NH * Tc);
                for (size_t j = 0; j < nc; j++)
                    kc[j] = vc[j] = NAN;
                for (int b = 0; b < B; b++) {
                    const float *rows = inp + (size_t)b * Tc * 3 * C;
                    for (int t = 0; t < Tc - 1; t++) {
                        memcpy(kc + ((size_t)b * Tmax + t) * C, rows + (size_t)t * 3 * C + C, C * sizeof(float));
                        memcpy(vc + ((size_t)b * Tmax + t) * C, rows + (size_t)t * 3 * C + 2 * C, C * sizeof(float));
                    }
                    memcpy(qkv + (size_t)b * 3 * C, rows + (size_t)(Tc - 1) * 3 * C, 3 * C * sizeof(float));
                }
                ops->attention_forward(k, out, pre, att, inp, B, Tc, C, NH);
                ops->attention_decode(k, dout, datt, kc, vc, qkv, B, Tc, Tmax, C, NH);
                double *want = malloc((size_t)B * C * sizeof *want), mx = 0;
                for (int b = 0; b < B; b++)
                    for (int c = 0; c < C; c++) {
                        want[b * C + c] = out[((size_t)b * Tc + Tc - 1) * C + c];
                        mx = fmax(mx, fabs(want[b * C + c]));
                    }
                assert_close("attention_decode out", dout, want, (size_t)B * C, 1e-5, 1e-5 * mx);
                for (int b = 0; b < B; b++) {
                    const float *last = qkv + (size_t)b * 3 * C;
                    assert_memory_equal(kc + ((size_t)b * Tmax + Tc - 1) * C, last + C, C * sizeof(float));
                    assert_memory_equal(vc + ((size_t)b * Tmax + Tc - 1) * C, last + 2 * C, C * sizeof(float));
                    for (size_t j = ((size_t)b * Tmax + Tc) * C; j < (size_t)(b + 1) * Tmax * C; j++)
                        assert_true(isnan(kc[j]) && isnan(vc[j]));
                }
                free(inp), free(out), free(pre), free(att), free(kc), free(vc), free(qkv), free(dout), free(datt);
                free(want);
            }
        ops->ctx_destroy(k);
    }
}

int main(void)
{
    ops = kern_cpu_ops();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_forward),
        cmocka_unit_test(test_attention_grad),
        cmocka_unit_test(test_attention_decode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
