/* test_lora_core.c — lora.c on its own, under a made-up model kind: the
 * targets a job names, the sites and the adapters' PEFT-named table, one
 * GEMM's forward and backward (two sites sharing it, side by side in its
 * rows) against plain double-precision loops, merging, a 16-bit base, the
 * starting values, and PEFT's config.  The llama kind's use of it, and the
 * gradients through a whole model, are test_lora.c's. */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "jobcfg.h"
#include "kernels.h"
#include "models/lora.h"
#include "models/model.h"

static const char *const fake_targets[] = {"a_proj", "b_proj", "c_proj", NULL};
static const model_kind fake = {
    .name = "fake",
    .a_name = "a fake",
    .hf_prefix = "net.",
    .lora_targets = fake_targets,
    .lora_default = "a_proj",
};

/* One GEMM of C = 16 inputs over a_proj (12 outputs) then b_proj (20) side
 * by side, and c_proj (16 → 8) on its own. */
enum { C = 16, OA = 12, OB = 20, OC = OA + OB, OCC = 8, N = 7 };

typedef struct {
    model m;
    job_config j;
    int sa, sb, sc;
} fixture;

static void add(model *m, const char *name, size_t rows, size_t cols)
{
    size_t shape[2] = {rows, cols};
    model_add_tensor(m, name, 2, shape, true, false);
}

/* 0, or -1 with err from lora_create or lora_finish. */
static int build(fixture *f, const char *targets, uint32_t rank, int precision, char *err, size_t err_len)
{
    memset(f, 0, sizeof *f);
    jobcfg_defaults(&f->j);
    snprintf(f->j.source, sizeof f->j.source, "/tmp/job.cfg");
    f->j.ft_method = JOBCFG_FT_LORA;
    f->j.lora_rank = rank;
    f->j.lora_alpha = 6;
    f->j.precision = precision;
    snprintf(f->j.lora_targets, sizeof f->j.lora_targets, "%s", targets);
    model *m = &f->m;
    m->kind = &fake;
    m->k = kern_cpu_ops();
    add(m, "x.a_proj.weight", OA, C);
    add(m, "x.b_proj.weight", OB, C);
    add(m, "x.c_proj.weight", OCC, C);
    if (lora_create(m, &f->j, err, err_len) != 0)
        return -1;
    f->sa = lora_site(m, "net.x.a_proj", "a_proj", C, OA, OC, 0);
    f->sb = lora_site(m, "net.x.b_proj", "b_proj", C, OB, OC, OA);
    f->sc = lora_site(m, "net.x.c_proj", "c_proj", C, OCC, OCC, 0);
    return lora_finish(m, err, err_len);
}

static float rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) * 0x1.0p-53 * 2 - 1);
}

static float *rndv(size_t n, uint64_t seed, float scale)
{
    float *v = malloc(n * sizeof *v);
    assert_non_null(v);
    for (size_t i = 0; i < n; i++)
        v[i] = scale * rnd(&seed);
    return v;
}

/* ---- settings --------------------------------------------------------------------------- */

static void test_targets(void **state)
{
    (void)state;
    fixture f;
    char err[512];
    assert_int_equal(build(&f, "a_proj, c_proj", 4, JOBCFG_FP32, err, sizeof err), 0);
    assert_int_equal(f.m.lora->targets, 5u);
    assert_true(f.sa >= 0 && f.sb == -1 && f.sc >= 0);
    lora_describe(&f.m, err, sizeof err);
    assert_string_equal(err, "lora r=4 alpha=6 targets=a_proj,c_proj");
    lora_destroy(&f.m);
    /* empty: the kind's default */
    assert_int_equal(build(&f, "", 4, JOBCFG_FP32, err, sizeof err), 0);
    assert_int_equal(f.m.lora->targets, 1u);
    lora_destroy(&f.m);
    static const struct {
        const char *targets, *says;
    } bad[] = {
        {"a_proj,d_proj", "[finetune] targets: 'd_proj' is not one of a_proj, b_proj, c_proj"},
        {"b_proj, a_proj,b_proj", "[finetune] targets: 'b_proj' is named twice"},
        {" , ", "[finetune] targets: '' is not one of"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        assert_int_equal(build(&f, bad[i].targets, 4, JOBCFG_FP32, err, sizeof err), -1);
        if (!strstr(err, bad[i].says))
            fail_msg("'%s' gave '%s'", bad[i].targets, err);
        assert_null(f.m.lora);
    }
    /* a rank past a targeted layer's smaller side */
    assert_int_equal(build(&f, "a_proj,c_proj", 9, JOBCFG_FP32, err, sizeof err), -1);
    assert_non_null(strstr(err, "[finetune] rank: 9 is above c_proj's smaller side (8 × 16)"));
    lora_destroy(&f.m);
}

static void test_table(void **state)
{
    (void)state;
    fixture f;
    char err[256];
    assert_int_equal(build(&f, "a_proj,b_proj,c_proj", 4, JOBCFG_FP32, err, sizeof err), 0);
    const lora *l = f.m.lora;
    assert_int_equal(l->nsites, 3);
    assert_int_equal(l->ntensors, 6);
    assert_string_equal(l->tensors[0].name, "base_model.model.net.x.a_proj.lora_A.weight");
    assert_string_equal(l->tensors[3].name, "base_model.model.net.x.b_proj.lora_B.weight");
    assert_int_equal(l->tensors[3].shape[0], OB);
    assert_int_equal(l->tensors[3].shape[1], 4);
    assert_int_equal(l->num_params, 4 * (C + OA) + 4 * (C + OB) + 4 * (C + OCC));
    /* each site found its base weight through the kind's hf_prefix */
    assert_int_equal(l->site[f.sb].w, (size_t)OA * C);
    assert_int_equal(l->site[f.sc].w, (size_t)OC * C);
    size_t end = 0;
    for (int i = 0; i < l->ntensors; i++) {
        assert_int_equal(l->tensors[i].offset, end);
        end += l->tensors[i].numel;
    }
    lora_destroy(&f.m);
}

/* ---- the GEMM against loops --------------------------------------------------------------- */

/* ref (N,OC) = x·Wᵀ + s·(x·Aᵀ)·Bᵀ in the sites' columns, in double. */
static void forward_ref(const fixture *f, const float *x, const float *W, const float *ad, double *ref)
{
    const lora *l = f->m.lora;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double acc = 0;
            for (int c = 0; c < C; c++)
                acc += (double)x[n * C + c] * W[o * C + c];
            ref[n * OC + o] = acc;
        }
    int sites[2] = {f->sa, f->sb};
    for (int i = 0; i < 2; i++) {
        const lora_site_t *s = &l->site[sites[i]];
        for (int n = 0; n < N; n++)
            for (int o = 0; o < s->out; o++) {
                double acc = 0;
                for (uint32_t q = 0; q < l->rank; q++) {
                    double u = 0;
                    for (int c = 0; c < C; c++)
                        u += (double)x[n * C + c] * ad[s->a + q * C + c];
                    acc += u * ad[s->b + o * l->rank + q];
                }
                ref[n * OC + s->col + o] += l->scale * acc;
            }
    }
}

/* dref (N,C) = dout·W for a GEMM's weight W (OC,C), in double. */
static void dinp_ref(const float *dout, const float *W, double *dref)
{
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double acc = 0;
            for (int o = 0; o < OC; o++)
                acc += (double)dout[n * OC + o] * W[o * C + c];
            dref[n * C + c] = acc;
        }
}

static void close_to(const float *got, const double *ref, size_t n, double rel, const char *what)
{
    double big = 0;
    for (size_t i = 0; i < n; i++)
        big = fmax(big, fabs(ref[i]));
    for (size_t i = 0; i < n; i++)
        if (!(fabs(got[i] - ref[i]) <= rel * big))
            fail_msg("%s[%zu]: %.8g, want %.8g (tolerance %.3g)", what, i, got[i], ref[i], rel * big);
}

static void test_forward_backward_fp32(void **state)
{
    (void)state;
    fixture f;
    char err[256];
    assert_int_equal(build(&f, "a_proj,b_proj", 4, JOBCFG_FP32, err, sizeof err), 0);
    model *m = &f.m;
    lora *l = m->lora;
    m->kc = m->k->ctx_create(2, 0, KERN_FP32, NULL);
    float *W = rndv((size_t)OC * C + OCC * C, 1, 0.3f), *x = rndv((size_t)N * C, 2, 1.0f);
    float *ad = rndv(l->num_params, 3, 0.5f), *gr = calloc(l->num_params, sizeof *gr);
    void *scratch = malloc(lora_scratch_bytes(m, N));
    m->params = W;
    l->params = ad;
    l->grads = gr;
    lora_bind(m, scratch, N);
    int sites[3] = {f.sa, -1, f.sb};
    float out[N * OC];
    double ref[N * OC];
    lora_linear_forward(m, out, x, 0, LORA_NO_BIAS, sites, 3, N, C, OC);
    forward_ref(&f, x, W, ad, ref);
    close_to(out, ref, N * OC, 1e-5, "out");

    /* merged: a plain GEMM on W + s·B·A gives the same */
    float *Wm = malloc(((size_t)OC * C + OCC * C) * sizeof *Wm);
    memcpy(Wm, W, ((size_t)OC * C + OCC * C) * sizeof *Wm);
    lora_merge(m, Wm, ad);
    float outm[N * OC];
    m->k->matmul_forward(m->kc, outm, x, Wm, NULL, N, C, OC);
    close_to(outm, ref, N * OC, 1e-5, "merged");
    /* c_proj has no adapter: merging left it alone */
    assert_memory_equal(Wm + OC * C, W + OC * C, OCC * C * sizeof *W);

    /* backward: finite differences of L = Σ dout·out are exact for a
     * function linear in each of x, A and B; here against the closed forms */
    float *dout = rndv(N * OC, 4, 1.0f), dinp[N * C];
    lora_linear_backward(m, dinp, dout, x, 0, LORA_NO_BIAS, sites, 3, N, C, OC);
    double dref[N * C];
    dinp_ref(dout, Wm, dref); /* the merged weight's: the adapters' share included */
    close_to(dinp, dref, N * C, 1e-5, "dinp");
    for (int i = 0; i < 2; i++) {
        const lora_site_t *s = &l->site[i ? f.sb : f.sa];
        uint32_t r = l->rank;
        /* dB[o][q] = s·Σ_n dout[n][col+o]·u[n][q]; dA[q][c] = s·Σ_n g[n][q]·x[n][c], g = dout·B */
        double *dA = calloc(r * C, sizeof *dA), *dB = calloc((size_t)s->out * r, sizeof *dB);
        for (int n = 0; n < N; n++)
            for (uint32_t q = 0; q < r; q++) {
                double u = 0, g = 0;
                for (int c = 0; c < C; c++)
                    u += (double)x[n * C + c] * ad[s->a + q * C + c];
                for (int o = 0; o < s->out; o++) {
                    dB[o * r + q] += l->scale * dout[n * OC + s->col + o] * u;
                    g += (double)dout[n * OC + s->col + o] * ad[s->b + o * r + q];
                }
                for (int c = 0; c < C; c++)
                    dA[q * C + c] += l->scale * g * x[n * C + c];
            }
        close_to(gr + s->a, dA, r * C, 1e-5, "dA");
        close_to(gr + s->b, dB, (size_t)s->out * r, 1e-5, "dB");
        free(dA), free(dB);
    }
    /* the adapters' gradients accumulate; the base has none (m->grads NULL) */
    float *once = malloc(l->num_params * sizeof *once);
    memcpy(once, gr, l->num_params * sizeof *once);
    lora_linear_backward(m, NULL, dout, x, 0, LORA_NO_BIAS, sites, 3, N, C, OC);
    for (size_t i = 0; i < l->num_params; i++)
        assert_true(fabsf(gr[i] - 2 * once[i]) <= 1e-6f * (1 + fabsf(once[i])));
    free(once), free(dout), free(Wm), free(W), free(x), free(ad), free(gr), free(scratch);
    m->k->ctx_destroy(m->kc);
    lora_destroy(m);
}

static uint16_t bf16(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* A 16-bit base: m->params NULL, the GEMM reads params16 with its input
 * rounded into the scratch; the result is the fp32 one to bf16's rounding. */
static void test_base16(void **state)
{
    (void)state;
    fixture f;
    char err[256];
    assert_int_equal(build(&f, "a_proj,b_proj", 4, JOBCFG_BF16, err, sizeof err), 0);
    model *m = &f.m;
    lora *l = m->lora;
    assert_true(l->base16 && l->bf16);
    m->kc = m->k->ctx_create(2, 0, KERN_BF16, NULL);
    size_t P = (size_t)OC * C + OCC * C;
    float *W = rndv(P, 1, 0.3f), *x = rndv((size_t)N * C, 2, 1.0f);
    uint16_t *W16 = malloc(P * sizeof *W16);
    for (size_t i = 0; i < P; i++)
        W16[i] = bf16(W[i]);
    float *ad = rndv(l->num_params, 3, 0.5f), *gr = calloc(l->num_params, sizeof *gr);
    size_t bytes = lora_scratch_bytes(m, N);
    assert_true(bytes >= (size_t)N * C * 2 + 3 * 64); /* room for the rounded input */
    void *scratch = malloc(bytes);
    m->params = NULL;
    m->params16 = W16;
    l->params = ad;
    l->grads = gr;
    lora_bind(m, scratch, N);
    int sites[2] = {f.sa, f.sb};
    float out[N * OC];
    double ref[N * OC];
    lora_linear_forward(m, out, x, 0, LORA_NO_BIAS, sites, 2, N, C, OC);
    forward_ref(&f, x, W, ad, ref);
    close_to(out, ref, N * OC, 2e-2, "out (bf16)");
    float *dout = rndv(N * OC, 4, 1.0f), dinp[N * C];
    lora_linear_backward(m, dinp, dout, x, 0, LORA_NO_BIAS, sites, 2, N, C, OC);
    float *Wm = malloc(P * sizeof *Wm);
    memcpy(Wm, W, P * sizeof *Wm);
    lora_merge(m, Wm, ad);
    double dref[N * C];
    dinp_ref(dout, Wm, dref);
    close_to(dinp, dref, N * C, 2e-2, "dinp (bf16)");
    free(Wm), free(dout), free(W), free(W16), free(x), free(ad), free(gr), free(scratch);
    m->k->ctx_destroy(m->kc);
    lora_destroy(m);
}

/* ---- values and config -------------------------------------------------------------------- */

static void test_init(void **state)
{
    (void)state;
    fixture f;
    char err[256];
    assert_int_equal(build(&f, "a_proj,c_proj", 4, JOBCFG_FP32, err, sizeof err), 0);
    const lora *l = f.m.lora;
    float *a = malloc(l->num_params * sizeof *a), *b = malloc(l->num_params * sizeof *b);
    lora_init(&f.m, a, 7);
    lora_init(&f.m, b, 7);
    assert_memory_equal(a, b, l->num_params * sizeof *a);
    for (int i = 0; i < l->nsites; i++) {
        const lora_site_t *s = &l->site[i];
        double bound = 1 / sqrt((double)s->in), lo = 0, hi = 0;
        for (size_t e = 0; e < l->rank * (size_t)s->in; e++) {
            assert_true(fabs(a[s->a + e]) <= bound);
            lo = fmin(lo, a[s->a + e]);
            hi = fmax(hi, a[s->a + e]);
        }
        assert_true(lo < -bound / 2 && hi > bound / 2); /* spread over the range, not one value */
        for (size_t e = 0; e < (size_t)s->out * l->rank; e++)
            assert_true(a[s->b + e] == 0.0f);
    }
    lora_init(&f.m, b, 8);
    assert_memory_not_equal(a, b, l->num_params * sizeof *a);
    free(a), free(b);
    lora_destroy(&f.m);
}

static void test_peft_config(void **state)
{
    (void)state;
    fixture f;
    char err[256];
    assert_int_equal(build(&f, "c_proj,a_proj", 4, JOBCFG_FP32, err, sizeof err), 0);
    json_t *c = lora_peft_config(&f.m, "/models/base");
    assert_non_null(c);
    assert_true(json_real_value(json_object_get(c, "lora_dropout")) == 0.0);
    json_decref(c);
    f.m.lora->dropout = 0.1; /* [finetune] dropout, as PEFT writes it */
    c = lora_peft_config(&f.m, "/models/base");
    assert_non_null(c);
    assert_string_equal(json_string_value(json_object_get(c, "peft_type")), "LORA");
    assert_string_equal(json_string_value(json_object_get(c, "base_model_name_or_path")), "/models/base");
    assert_int_equal(json_integer_value(json_object_get(c, "r")), 4);
    assert_int_equal(json_integer_value(json_object_get(c, "lora_alpha")), 6);
    assert_true(json_real_value(json_object_get(c, "lora_dropout")) == 0.1);
    json_t *t = json_object_get(c, "target_modules");
    assert_int_equal(json_array_size(t), 2);
    assert_string_equal(json_string_value(json_array_get(t, 0)), "a_proj");
    assert_string_equal(json_string_value(json_array_get(t, 1)), "c_proj");
    assert_true(json_is_false(json_object_get(c, "fan_in_fan_out")));
    json_decref(c);
    lora_destroy(&f.m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_targets),    cmocka_unit_test(test_table),       cmocka_unit_test(test_forward_backward_fp32),
        cmocka_unit_test(test_base16),     cmocka_unit_test(test_init),        cmocka_unit_test(test_peft_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
