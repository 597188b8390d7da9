/* test_kernels_loss.c — the CPU fused softmax cross-entropy: losses and
 * log-sum-exp against double, dlogits against the formula and central
 * finite differences, padded columns ignored, huge logits stable, targets
 * out of range reported as NaN, and dlogits in place bitwise equal to out
 * of place. */
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

/* ---- cross-entropy ------------------------------------------------------------------------ */

typedef struct {
    kern_ctx *k;
    float *losses, *lse, *logits, *dloss;
    int32_t *targets;
    int N, V, Vp;
} ce_case;

static double ce_loss(void *p)
{
    ce_case *c = p;
    ops->crossentropy_forward(c->k, c->losses, c->lse, c->logits, c->targets, c->N, c->V, c->Vp);
    return dotd(c->dloss, c->losses, c->N);
}

static void test_crossentropy(void **state)
{
    (void)state;
    enum { N = 5, V = 7, Vp = 8 };
    kern_ctx *k = ctx(2);
    int32_t targets[N] = {0, 6, 3, 3, 1};
    ce_case c = {k, zerov(N), zerov(N), randv(N * Vp, 3), randv(N, 1), targets, N, V, Vp};
    for (int i = 0; i < N; i++)
        c.logits[i * Vp + V] = 1e30f; /* padding: must be ignored */
    ce_loss(&c);
    double want_dl[N * Vp];
    for (int i = 0; i < N; i++) {
        const float *x = c.logits + i * Vp;
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < V; j++)
            mx = fmax(mx, x[j]);
        for (int j = 0; j < V; j++)
            s += exp(x[j] - mx);
        double want = log(s) + mx - x[targets[i]], lse = log(s) + mx;
        assert_true(fabs(c.losses[i] - want) <= 1e-5 * fabs(want) + 1e-6);
        assert_true(fabs(c.lse[i] - lse) <= 1e-6 * fabs(lse) + 1e-6);
        for (int j = 0; j < V; j++)
            want_dl[i * Vp + j] = c.dloss[i] * (exp(x[j] - mx) / s - (j == targets[i]));
        want_dl[i * Vp + V] = 0.0;
    }
    /* Backward overwrites: what the buffer held before does not matter, and
     * the padded column comes out exactly 0. */
    float *dl = randv(N * Vp, 100);
    for (int i = 0; i < N; i++)
        dl[i * Vp + V] = 42.0f;
    ops->crossentropy_backward(k, dl, c.logits, c.lse, targets, c.dloss, N, V, Vp);
    assert_close("crossentropy dlogits", dl, want_dl, N * Vp, 1e-5, 1e-7);
    for (int i = 0; i < N; i++)
        assert_true(dl[i * Vp + V] == 0.0f);
    unsigned char skip[N * Vp] = {0};
    for (int i = 0; i < N; i++)
        skip[i * Vp + V] = 1; /* the padded logit is 1e30: no difference quotient there */
    check_grad("crossentropy dlogits", c.logits, dl, N * Vp, ce_loss, &c, skip);

    /* Huge logits: stable, and a certain prediction costs 0. */
    float big[2 * Vp], lb[2], sb[2];
    int32_t tb[2] = {2, 5};
    for (int j = 0; j < 2 * Vp; j++)
        big[j] = -1000.0f;
    big[2] = 1000.0f;      /* row 0: target 2 certain */
    big[Vp + 1] = 3000.0f; /* row 1: target 5 hopeless */
    ops->crossentropy_forward(k, lb, sb, big, tb, 2, V, Vp);
    assert_true(lb[0] == 0.0f && sb[0] == 1000.0f);
    assert_true(fabs(lb[1] - 4000.0) < 1e-3 * 4000 && sb[1] == 3000.0f);
    ops->crossentropy_backward(k, big, big, sb, tb, c.dloss, 2, V, Vp);
    for (int j = 0; j < 2 * Vp; j++)
        assert_true(isfinite(big[j]));

    /* A target of V or more cannot pass unnoticed; a negative one is
     * ignored: loss 0 and a zero gradient row, padding included. */
    int32_t bad[2] = {V, -100};
    ops->crossentropy_forward(k, lb, sb, c.logits, bad, 2, V, Vp);
    assert_true(isnan(lb[0]) && lb[1] == 0.0f && isfinite(sb[0]) && isfinite(sb[1]));
    float ig[2 * Vp];
    for (int j = 0; j < 2 * Vp; j++)
        ig[j] = 1.0f;
    ops->crossentropy_backward(k, ig, c.logits, sb, bad, c.dloss, 2, V, Vp);
    for (int j = Vp; j < 2 * Vp; j++)
        assert_true(ig[j] == 0.0f);
    free(c.losses), free(c.lse), free(c.logits), free(c.dloss), free(dl);
    ops->ctx_destroy(k);
}

/* The models compute dlogits over the logits: in place must give the very
 * bits of out of place, on the threaded and vectorised path (N·V above
 * KCPU_PAR_MIN) and with rows that are not 16-byte aligned (Vp odd). */
static void test_crossentropy_in_place(void **state)
{
    (void)state;
    static const int shapes[][3] = {{64, 1000, 1024}, {33, 997, 1001}, {5, 7, 8}};
    kern_ctx *k = ctx(3);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], V = shapes[s][1], Vp = shapes[s][2];
        size_t n = (size_t)N * Vp;
        float *logits = randv(n, 8), *lse = zerov(N), *losses = zerov(N), *dloss = randv(N, 1);
        float *out = randv(n, 1), *again = randv(n, 1);
        int32_t *tg = malloc((size_t)N * sizeof *tg);
        assert_non_null(tg);
        for (int i = 0; i < N; i++)
            tg[i] = (int32_t)(rng_u32() % (uint32_t)V);
        ops->crossentropy_forward(k, losses, lse, logits, tg, N, V, Vp);
        ops->crossentropy_backward(k, out, logits, lse, tg, dloss, N, V, Vp);
        ops->crossentropy_backward(k, again, logits, lse, tg, dloss, N, V, Vp);
        assert_memory_equal(out, again, n * sizeof *out); /* overwrites, whatever was there */
        ops->crossentropy_backward(k, logits, logits, lse, tg, dloss, N, V, Vp);
        assert_memory_equal(logits, out, n * sizeof *out);
        free(logits), free(lse), free(losses), free(dloss), free(out), free(again), free(tg);
    }
    ops->ctx_destroy(k);
}

int main(void)
{
    ops = kern_cpu_ops();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crossentropy),
        cmocka_unit_test(test_crossentropy_in_place),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
