/* test_recompute.c — activation recomputation ([memory] recompute, model.h)
 * changes where a block's activations live, never what is computed: on the
 * cpu a training step with it is bitwise the step without it.
 *
 * For gpt (fp32, and the 16-bit activation paths, unfused and fused,
 * through a cpu table that claims they pay, as test_act16.c does; the cpu
 * has no fp32 fused attention) and for llama (packed samples, ignored
 * targets; fp32, and its 16-bit activations), one
 * micro-batch forward and backward and one AdamW step, with and without
 * recompute: the loss, every gradient and the parameters after the step
 * compared with memcmp.  The activation buffers start filled with a
 * different pattern in each run, so a read of something the recomputation
 * failed to write would show.  And activation_bytes per sample is strictly
 * smaller with recompute, by at least the L - 1 blocks it no longer keeps.
 * Also the job file's [memory] recompute and its refusals.
 */
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
#include "models/model.h"

enum { N = 3, LAYERS = 3 };

#define TAIL "[data]\ntrain = corpus.txt\n[output]\ndir = out\n"
#define GPT_JOB "[model]\ntype = gpt\nlayers = 3\nheads = 2\nwidth = 32\ncontext = 16\nvocab = 64\n" TAIL
#define LLAMA_JOB                                                                                                 \
    "[model]\ntype = llama\nlayers = 3\nheads = 4\nkv_heads = 2\nwidth = 32\nmlp_width = 48\ncontext = 16\n"      \
    "vocab = 64\n" TAIL

/* What one step leaves: the loss, the gradients, the parameters after
 * AdamW, and the activation estimate it ran under. */
typedef struct {
    double loss;
    float *grads, *params;
    size_t num_params, fixed, per;
} step_result;

static bool fused_yes(kern_ctx *k, int C, int NH)
{
    (void)k;
    return NH > 0 && C % NH == 0;
}

static void load(const char *text, int precision, job_config *j)
{
    char err[512];
    if (jobcfg_load_record(text, strlen(text), "/tmp/job.cfg", j, err, sizeof err) != 0 ||
        model_check_job(j, err, sizeof err) != 0)
        fail_msg("job: %s", err);
    j->precision = precision;
}

/* A micro-batch of N sequences of T tokens; with `packed`, two samples in
 * the second sequence (pos and start), and some targets ignored. */
typedef struct {
    int32_t x[N * 16], y[N * 16], pos[N * 16], start[N * 16];
} batch_data;

static model_batch make_batch(batch_data *d, uint32_t T, uint32_t V, bool packed)
{
    for (uint32_t i = 0; i < N * T; i++) {
        d->x[i] = (int32_t)((i * 37 + 11) % V);
        d->y[i] = (int32_t)((i * 53 + 5) % V);
        d->pos[i] = (int32_t)(i % T);
        d->start[i] = 0;
    }
    d->y[2] = d->y[T + 7] = -100; /* a prompt token, padding: no loss, no gradient */
    if (packed)
        for (uint32_t t = 6; t < T; t++) {
            d->pos[T + t] = (int32_t)(t - 6);
            d->start[T + t] = 6;
        }
    return (model_batch){.x = d->x, .y = d->y, .n = N, .pos = packed ? d->pos : NULL,
                         .start = packed ? d->start : NULL};
}

static void run_step(const job_config *j, const kern_ops *ops, kern_precision prec, bool recompute, int fill,
                     step_result *r)
{
    kern_ctx *kc = ops->ctx_create(2, 0, prec, NULL);
    assert_non_null(kc);
    model *m;
    char err[512];
    if (model_create(j, 0, 0, ops, kc, &m, err, sizeof err) != 0)
        fail_msg("model_create: %s", err);
    assert_true(m->kind->recomputes);
    m->recompute = recompute;
    size_t P = m->num_params;
    r->num_params = P;
    r->params = calloc(P, sizeof(float));
    r->grads = calloc(P, sizeof(float));
    float *mv = calloc(2 * P, sizeof(float));
    uint16_t *p16 = m->needs_params16 ? calloc(P, sizeof(uint16_t)) : NULL;
    assert_true(r->params && r->grads && mv && (p16 || !m->needs_params16));
    m->ops->init_params(m, r->params, 1234);
    if (p16)
        ops->cast_f32_to_bf16(kc, p16, r->params, P);
    m->params = r->params;
    m->grads = r->grads;
    m->params16 = p16;

    m->ops->activation_bytes(m, &r->fixed, &r->per);
    size_t bytes = (r->fixed + r->per * N + 63) / 64 * 64;
    void *acts = aligned_alloc(64, bytes);
    assert_non_null(acts);
    memset(acts, fill, bytes);
    m->ops->bind_activations(m, acts, N);

    batch_data d;
    uint32_t T = m->ops->units_per_sample(m);
    model_batch b = make_batch(&d, T, j->vocab, m->kind->packs);
    float dloss = 1.0f / (float)(N * T);
    if (m->ops->forward_backward) {
        r->loss = m->ops->forward_backward(m, &b, dloss);
    } else {
        r->loss = m->ops->forward(m, &b, NULL);
        m->ops->backward(m, &b, dloss);
    }
    assert_false(m->stopped);
    ops->adamw(kc, r->params, p16, r->grads, mv, mv + P, P, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1);
    assert_int_equal(ops->sync(kc), KERN_OK);

    model_destroy(m);
    ops->ctx_destroy(kc);
    free(acts);
    free(mv);
    free(p16);
}

static void free_result(step_result *r)
{
    free(r->grads);
    free(r->params);
}

/* The step with recompute against the one without: bitwise; and the
 * activations per sample smaller by at least `saved_min` bytes. */
static void check_same(const char *text, const kern_ops *ops, int precision, size_t saved_min)
{
    static job_config j;
    load(text, precision, &j);
    kern_precision kp = precision == JOBCFG_BF16 ? KERN_BF16 : KERN_FP32;
    step_result off, on;
    run_step(&j, ops, kp, false, 0x00, &off);
    run_step(&j, ops, kp, true, 0x7f, &on);
    assert_int_equal(off.num_params, on.num_params);
    assert_memory_equal(&off.loss, &on.loss, sizeof off.loss);
    assert_true(off.loss > 0);
    assert_memory_equal(off.grads, on.grads, off.num_params * sizeof(float));
    assert_memory_equal(off.params, on.params, off.num_params * sizeof(float));
    /* A gradient that is all zeros would compare equal for any model. */
    size_t nonzero = 0;
    for (size_t i = 0; i < off.num_params; i++)
        nonzero += off.grads[i] != 0.0f;
    assert_true(nonzero > off.num_params / 2);
    assert_true(on.per < off.per);
    assert_true(off.per - on.per >= saved_min);
    print_message("%s%s: per sample %zu -> %zu bytes (%.1f%%), fixed %zu -> %zu\n",
                  strstr(text, "llama") ? "llama" : "gpt", precision == JOBCFG_BF16 ? " lp16" : "", off.per, on.per,
                  100.0 * (double)on.per / (double)off.per, off.fixed, on.fixed);
    free_result(&off);
    free_result(&on);
}

/* The bytes per sample of the kept per-layer activations that recompute
 * drops for L - 1 blocks: a lower bound on the saving (ln1, residual2,
 * ln2, the MLP's hidden layer at least; T = 16, C = 32). */
static size_t dropped_min(size_t hidden, size_t elem)
{
    return (LAYERS - 1) * (size_t)16 * (3 * 32 + 2 * hidden) * elem;
}

static void test_gpt_fp32(void **state)
{
    (void)state;
    check_same(GPT_JOB, kern_cpu_ops(), JOBCFG_FP32, dropped_min(128, sizeof(float)));
}

/* The 16-bit activations (ln1, ln2, fch, fch_gelu in bf16), unfused and
 * with qkv and the attention output in 16 bits too. */
static void test_gpt_lp16(void **state)
{
    (void)state;
    kern_ops ops = *kern_cpu_ops();
    ops.act16_native = true;
    check_same(GPT_JOB, &ops, JOBCFG_BF16, dropped_min(128, sizeof(uint16_t)));
    ops.attention_fused_ok = fused_yes;
    check_same(GPT_JOB, &ops, JOBCFG_BF16, dropped_min(128, sizeof(uint16_t)));
}

static void test_llama(void **state)
{
    (void)state;
    check_same(LLAMA_JOB, kern_cpu_ops(), JOBCFG_FP32, dropped_min(48, sizeof(float)));
}

/* ln1, ln2, [gate | up] and the SwiGLU output in bf16; the recomputed
 * block also rounds its attention output into atty16 again. */
static void test_llama_lp16(void **state)
{
    (void)state;
    kern_ops ops = *kern_cpu_ops();
    ops.act16_native = true;
    check_same(LLAMA_JOB, &ops, JOBCFG_BF16, dropped_min(48, sizeof(uint16_t)));
}

/* Recompute leaves the forward alone: sampling's logits are the same. */
static void test_logits_same(void **state)
{
    (void)state;
    static job_config j;
    const char *jobs[] = {GPT_JOB, LLAMA_JOB};
    for (int which = 0; which < 2; which++) {
        load(jobs[which], JOBCFG_FP32, &j);
        const kern_ops *ops = kern_cpu_ops();
        float out[2][2 * 64];
        for (int rc = 0; rc < 2; rc++) {
            kern_ctx *kc = ops->ctx_create(2, 0, KERN_FP32, NULL);
            model *m;
            char err[512];
            assert_int_equal(model_create(&j, 0, 0, ops, kc, &m, err, sizeof err), 0);
            m->recompute = rc;
            float *params = calloc(m->num_params, sizeof(float));
            assert_non_null(params);
            m->ops->init_params(m, params, 99);
            m->params = params;
            size_t fixed, per;
            m->ops->activation_bytes(m, &fixed, &per);
            void *acts = aligned_alloc(64, (fixed + 2 * per + 63) / 64 * 64);
            assert_non_null(acts);
            m->ops->bind_activations(m, acts, 2);
            int32_t tokens[2 * 9];
            for (int i = 0; i < 18; i++)
                tokens[i] = (i * 7 + 3) % 64;
            assert_int_equal(m->ops->forward_logits(m, tokens, 2, 9, out[rc]), 0);
            void *cache = aligned_alloc(64, (m->ops->decode_bytes(m, 2) + 63) / 64 * 64);
            assert_int_equal(m->ops->decode_start(m, cache, 2), 0);
            float row[2 * 64];
            for (uint32_t t = 0; t < 9; t++) {
                int32_t tok[2] = {tokens[t], tokens[9 + t]};
                assert_int_equal(m->ops->decode_step(m, tok, t, row), 0);
            }
            for (int i = 0; i < 2 * 64; i++)
                assert_float_equal(row[i], out[rc][i], 1e-4);
            model_destroy(m);
            ops->ctx_destroy(kc);
            free(cache);
            free(acts);
            free(params);
        }
        assert_memory_equal(out[0], out[1], sizeof out[0]);
    }
}

/* The key: auto by default; a word it does not know and on for a model
 * without blocks are refused, naming the line and key. */
static void test_job_key(void **state)
{
    (void)state;
    static job_config j;
    char err[512];
    load(GPT_JOB, JOBCFG_FP32, &j);
    assert_int_equal(j.recompute, JOBCFG_RECOMPUTE_AUTO);
    const char *bad = GPT_JOB "[memory]\nrecompute = sometimes\n";
    assert_int_not_equal(jobcfg_load_record(bad, strlen(bad), "/tmp/job.cfg", &j, err, sizeof err), 0);
    assert_non_null(strstr(err, "[memory] recompute"));
    const char *mlp = "[model]\ntype = mlp\n[data]\nformat = idx\ntrain = i\ntrain_labels = l\n[output]\ndir = o\n"
                      "[memory]\nrecompute = on\n";
    assert_int_equal(jobcfg_load_record(mlp, strlen(mlp), "/tmp/job.cfg", &j, err, sizeof err), 0);
    assert_int_equal(j.recompute, JOBCFG_RECOMPUTE_ON);
    assert_int_not_equal(model_check_job(&j, err, sizeof err), 0);
    assert_non_null(strstr(err, "/tmp/job.cfg:10: [memory] recompute: on, but an mlp has no transformer blocks"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt_fp32),
        cmocka_unit_test(test_gpt_lp16),
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_llama_lp16),
        cmocka_unit_test(test_logits_same),
        cmocka_unit_test(test_job_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
