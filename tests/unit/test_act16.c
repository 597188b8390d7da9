/* test_act16.c — the 16-bit activations (kernels.h) of GPT and Llama,
 * wired end to end on the cpu.
 *
 * In a bf16/fp16 job on a backend whose 16-bit ops pay (act16_native: cuda)
 * a GPT stores ln1, ln2, fch, fch_gelu, lnf and the logits in 16 bits
 * (and qkv and the attention output, where attention is fused),
 * and hands dfch_gelu, dfch and dlogits between their ops in 16 bits; a
 * Llama its norms, [gate | up], the SwiGLU output, lnf and the logits
 * (model_llama.c).  The cpu has the same ops as the reference but does
 * not claim they pay, so here a copy of its table that does, and the
 * engine's test-only seam for mixed precision on the cpu, make the model
 * take exactly the path it takes on a GPU: what is tested is the wiring
 * (which buffer feeds which op, the activation layout and its estimate),
 * with the cpu's reference ops standing in for the kernels, which
 * tests/gpu/test_gpu_kernels.c compares with these.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "fixture.h"
#include "jobcfg.h"
#include "kernels.h"
#include "engine/train.h"

static kern_ops act16_ops, fused16_ops;

/* The cpu's fused 16-bit attention ops are references with no
 * attention_fused_ok: here one that says yes, as the GPU's does for head
 * size 64, so that the model takes its 16-bit qkv path. */
static bool fused_ok(kern_ctx *k, int C, int NH)
{
    (void)k;
    return NH > 0 && C % NH == 0;
}

static int setup(void **state)
{
    (void)state;
    act16_ops = *kern_cpu_ops();
    act16_ops.act16_native = true;
    fused16_ops = act16_ops;
    fused16_ops.attention_fused_ok = fused_ok;
    if (fx_setup("act16", (size_t)512 << 20, NULL) != 0 || fx_write_corpus() != 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return fx_teardown();
}

enum { L = 2, NH = 2, C = 64, T = 32 };

static void job(job_config *j, const char *out, int precision)
{
    fx_job(j, out);
    fx_gpt(j, L, NH, C, T);
    j->steps = 40;
    j->batch = 8;
    j->micro_batch = 8;
    j->lr = 3e-3;
    j->seed = 11;
    j->threads = 2;
    j->eval_every = 40;
    j->precision = precision;
}

static void train(const job_config *j, const kern_ops *k, bool mixed, train_result *res)
{
    train_hooks h = {.cpu_mixed_precision = mixed};
    train_outcome o = train_run(j, fx_pool, k, 1, &h, res);
    pool_job_forget(fx_pool, 1);
    if (o != TRAIN_DONE)
        fail_msg("%s: %s", j->out_dir, res->message);
}

/* The same job in fp32 and in bf16 with 16-bit activations: the estimate
 * shrinks by exactly the bytes the layout says, and the model learns the
 * same (bf16 rounding of four activations, nothing else differs). */
static void test_bf16_activations(void **state)
{
    (void)state;
    job_config j32, j16;
    train_result r32, r16;
    job(&j32, "fp32", JOBCFG_FP32);
    job(&j16, "bf16", JOBCFG_BF16);
    train(&j32, kern_cpu_ops(), false, &r32);
    train(&j16, &act16_ops, true, &r16);

    /* Per sample, ln1 and ln2 (L·T·C each), fch and fch_gelu (L·T·4C
     * each), lnf (T·C) and the logits (T·V) go from 4 bytes to 2, and the
     * backward's dfch scratch (T·4C) too; the residual stream's gradient
     * gets a 16-bit copy (T·C) for the GEMMs, and the layernorms' dout one
     * (T·C) from them: every buffer here is a multiple of the 64-byte
     * alignment, so exactly. */
    size_t saved = 2 * ((size_t)L * 10 * T * C + (size_t)T * C + (size_t)T * 256 + (size_t)T * 4 * C) -
                   2 * 2 * (size_t)T * C;
    printf("activations per sample: fp32 %zu, bf16 %zu bytes (saved %zu)\n", r32.act_per_sample,
           r16.act_per_sample, r32.act_per_sample - r16.act_per_sample);
    assert_int_equal(r32.act_per_sample - r16.act_per_sample, saved);

    printf("final loss: fp32 %.4f, bf16 %.4f; validation %.4f, %.4f\n", r32.final_loss, r16.final_loss,
           r32.val_loss, r16.val_loss);
    assert_true(r32.final_loss < log(256.0) - 1.5); /* it learned */
    /* 40 steps from the same start: bf16 rounding moves the trajectory a
     * little (0.1% when this was written; the cpu is bitwise reproducible,
     * so that is what it gives); 1% leaves room and still fails a miswired
     * buffer, which gives garbage or stalls learning. */
    assert_true(fabs(r16.final_loss - r32.final_loss) <= 0.01 * r32.final_loss);
    assert_true(fabs(r16.val_loss - r32.val_loss) <= 0.01 * r32.val_loss);
}

/* bf16 again with fused attention on 16 bits: the estimate shrinks
 * by exactly what the layout says, and it learns the same. */
static void test_bf16_fused_qkv16(void **state)
{
    (void)state;
    job_config j32, j16, jf;
    train_result r32, r16, rf;
    job(&j32, "fp32-2", JOBCFG_FP32);
    job(&j16, "bf16-2", JOBCFG_BF16);
    job(&jf, "bf16-fused", JOBCFG_BF16);
    train(&j32, kern_cpu_ops(), false, &r32);
    train(&j16, &act16_ops, true, &r16);
    train(&jf, &fused16_ops, true, &rf);

    /* Per sample: att keeps lse (L·NH·T) instead of the probabilities
     * (L·NH·T·T), the one-layer scratch preatt and datt (NH·T·T each) go,
     * qkv (L·T·3C) and atty (L·T·C) go from 4 bytes to 2, the
     * projections' scratch output (T·C, fp32) goes (both add into the
     * residual stream in their GEMMs), the qkv gradient (T·3C, fp32)
     * becomes a 16-bit one and an fp32 one for dq alone (T·C), and the fp32
     * scratch for datty (T·C) goes: it is 16-bit too. */
    size_t saved = 4 * ((size_t)L * NH * T * T - (size_t)L * NH * T) + 4 * 2 * (size_t)NH * T * T +
                   2 * (size_t)L * T * 4 * C + 4 * (size_t)T * C + (12 - 6 - 4) * (size_t)T * C + 4 * (size_t)T * C;
    printf("activations per sample: bf16 %zu, bf16 fused with 16-bit qkv %zu bytes (saved %zu)\n",
           r16.act_per_sample, rf.act_per_sample, r16.act_per_sample - rf.act_per_sample);
    assert_int_equal(r16.act_per_sample - rf.act_per_sample, saved);

    printf("final loss: fp32 %.4f, bf16 fused %.4f; validation %.4f, %.4f\n", r32.final_loss, rf.final_loss,
           r32.val_loss, rf.val_loss);
    assert_true(fabs(rf.final_loss - r32.final_loss) <= 0.01 * r32.final_loss);
    assert_true(fabs(rf.val_loss - r32.val_loss) <= 0.01 * r32.val_loss);
}

/* The MLP's GEMM+GELU ops (matmul_forward16_gelu, matmul_backward16_dgelu)
 * are optional: a backend without them gets the two ops each.  The cpu's
 * are exactly those two ops, so the same job trained both ways must give
 * the same bits: what differs is only which of the model's two wirings
 * fed them, and a wrong buffer in either changes the losses. */
static void test_gelu_ops_optional(void **state)
{
    (void)state;
    kern_ops without = fused16_ops;
    without.matmul_forward16_gelu = NULL;
    without.matmul_backward16_dgelu = NULL;
    job_config ja, jb;
    train_result ra, rb;
    job(&ja, "gelu-fused", JOBCFG_BF16);
    job(&jb, "gelu-apart", JOBCFG_BF16);
    train(&ja, &fused16_ops, true, &ra);
    train(&jb, &without, true, &rb);
    printf("final loss: with the GEMM+GELU ops %.6f, without %.6f; validation %.6f, %.6f\n", ra.final_loss,
           rb.final_loss, ra.val_loss, rb.val_loss);
    assert_memory_equal(&ra.final_loss, &rb.final_loss, sizeof ra.final_loss);
    assert_memory_equal(&ra.val_loss, &rb.val_loss, sizeof ra.val_loss);
    assert_int_equal(ra.act_per_sample, rb.act_per_sample);
}

/* The fused cross-entropy (crossentropy_fused16) is optional too, and the
 * cpu's is the two ops: training with and without it gives the same bits,
 * so the model's fused wiring (the loss and its gradient before the
 * backward, the losses read back after it) feeds the same buffers. */
static void test_ce_fused_optional(void **state)
{
    (void)state;
    kern_ops without = fused16_ops;
    without.crossentropy_fused16 = NULL;
    job_config ja, jb;
    train_result ra, rb;
    job(&ja, "ce-fused", JOBCFG_BF16);
    job(&jb, "ce-apart", JOBCFG_BF16);
    /* A dozen steps: every one must match, and a wrong buffer shows in the
     * first (the sanitizer build pays for each step). */
    ja.steps = jb.steps = 12;
    ja.eval_every = jb.eval_every = 12;
    train(&ja, &fused16_ops, true, &ra);
    train(&jb, &without, true, &rb);
    printf("final loss: with the fused cross-entropy %.6f, without %.6f; validation %.6f, %.6f\n", ra.final_loss,
           rb.final_loss, ra.val_loss, rb.val_loss);
    assert_true(isfinite(ra.final_loss) && isfinite(ra.val_loss));
    assert_memory_equal(&ra.final_loss, &rb.final_loss, sizeof ra.final_loss);
    assert_memory_equal(&ra.val_loss, &rb.val_loss, sizeof ra.val_loss);
}

/* ---- llama ------------------------------------------------------------------------------
 * The same wiring for llama (model_llama.c): ln1, ln2, [gate | up], the
 * SwiGLU output, lnf and the logits in 16 bits, and the gradients handed
 * between them. */
enum { LF = 128, LKV = 2, LNH = 4 };

static void llama_job(job_config *j, const char *out, int precision)
{
    job(j, out, precision);
    snprintf(j->model, sizeof j->model, "llama");
    j->heads = LNH;
    j->kv_heads = LKV;
    j->mlp_width = LF;
}

/* The estimate shrinks by exactly what the layout says, it learns as
 * fp32 does, and the fused cross-entropy's wiring gives the bits of the
 * two ops. */
static void test_llama_bf16(void **state)
{
    (void)state;
    job_config j32, j16, jc;
    train_result r32, r16, rc;
    llama_job(&j32, "llama-fp32", JOBCFG_FP32);
    llama_job(&j16, "llama-bf16", JOBCFG_BF16);
    train(&j32, kern_cpu_ops(), false, &r32);
    train(&j16, &act16_ops, true, &r16);

    /* Per sample, from 4 bytes to 2: ln1 and ln2 (L·T·C each), [gate |
     * up] (L·T·2F), the SwiGLU output (L·T·F), lnf (T·C), the logits
     * (T·V), and the backward's dgu and dhid (T·3F); the fp32 projection
     * output (T·C) goes, as both projections add into the stream in their
     * GEMMs; the 16-bit atty16, dres16 and dln16 (T·C each) come.  Every
     * buffer is a multiple of the 64-byte alignment, so exactly. */
    size_t saved = 2 * (size_t)L * T * (2 * C + 3 * LF) + 2 * (size_t)T * C + 2 * (size_t)T * 256 +
                   2 * (size_t)T * 3 * LF + 4 * (size_t)T * C - 3 * 2 * (size_t)T * C;
    printf("llama activations per sample: fp32 %zu, bf16 %zu bytes (saved %zu)\n", r32.act_per_sample,
           r16.act_per_sample, r32.act_per_sample - r16.act_per_sample);
    assert_int_equal(r32.act_per_sample - r16.act_per_sample, saved);

    printf("llama final loss: fp32 %.4f, bf16 %.4f; validation %.4f, %.4f\n", r32.final_loss, r16.final_loss,
           r32.val_loss, r16.val_loss);
    assert_true(r32.final_loss < log(256.0) - 1.5); /* it learned */
    /* As gpt's: bf16 rounding moves 40 steps a little; a miswired buffer
     * gives garbage or stalls. */
    assert_true(fabs(r16.final_loss - r32.final_loss) <= 0.01 * r32.final_loss);
    assert_true(fabs(r16.val_loss - r32.val_loss) <= 0.01 * r32.val_loss);

    kern_ops apart = act16_ops;
    apart.crossentropy_fused16 = NULL;
    llama_job(&jc, "llama-ce-apart", JOBCFG_BF16);
    train(&jc, &apart, true, &rc);
    printf("llama final loss: with the fused cross-entropy %.6f, without %.6f\n", r16.final_loss, rc.final_loss);
    assert_memory_equal(&r16.final_loss, &rc.final_loss, sizeof rc.final_loss);
    assert_memory_equal(&r16.val_loss, &rc.val_loss, sizeof rc.val_loss);
}

/* GRADD_ACT16=0 keeps llama's activations in fp32, as gpt's. */
static void test_llama_act16_off(void **state)
{
    (void)state;
    job_config j16, joff;
    train_result r16, roff, r32;
    llama_job(&j16, "llama-on", JOBCFG_BF16);
    llama_job(&joff, "llama-off", JOBCFG_BF16);
    j16.steps = joff.steps = 2;
    train(&j16, &act16_ops, true, &r16);
    setenv("GRADD_ACT16", "0", 1);
    train(&joff, &act16_ops, true, &roff);
    unsetenv("GRADD_ACT16");
    job_config j32;
    llama_job(&j32, "llama-off32", JOBCFG_FP32);
    j32.steps = 2;
    train(&j32, kern_cpu_ops(), false, &r32);
    assert_int_equal(roff.act_per_sample, r32.act_per_sample);
    assert_true(r16.act_per_sample < roff.act_per_sample);
}

/* ---- resume on the 16-bit path ---------------------------------------------------------------
 * The 16-bit GEMMs read the weights' 16-bit copy, which the optimizer
 * keeps and which a checkpoint does not hold: a resumed run must rebuild
 * it from the loaded parameters (a stale or missing copy changes every
 * loss after the resume), and then match the uninterrupted run bit for
 * bit, as fp32 does. */
static void test_resume_bitwise16(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    fx_stopper full = {0}, part = {.stop_after = 4};
    train_hooks hf = {.on_step = fx_record, .user = &full, .cpu_mixed_precision = true};
    train_hooks hp = {.on_step = fx_record, .should_stop = fx_stop_now, .user = &part, .cpu_mixed_precision = true};
    /* The interrupted run first, then the whole one: the resumed run gets
     * its pool blocks back holding the whole run's last values, not the
     * copy the stopped run left behind, so a copy not rebuilt shows. */
    job(&j, "resume16-parts", JOBCFG_BF16);
    j.steps = 9;
    j.checkpoint_every = 3;
    assert_int_equal(train_run(&j, fx_pool, &fused16_ops, 1, &hp, &res), TRAIN_STOPPED);
    pool_job_forget(fx_pool, 1);
    assert_int_equal(res.steps_done, 4);

    job_config jf;
    job(&jf, "resume16-full", JOBCFG_BF16);
    jf.steps = 9;
    jf.checkpoint_every = 3;
    assert_int_equal(train_run(&jf, fx_pool, &fused16_ops, 1, &hf, &res), TRAIN_DONE);
    pool_job_forget(fx_pool, 1);

    part.stop_after = 0;
    assert_int_equal(train_run(&j, fx_pool, &fused16_ops, 1, &hp, &res), TRAIN_DONE);
    pool_job_forget(fx_pool, 1);
    assert_true(part.resumed);
    for (int s = 1; s <= 9; s++)
        if (memcmp(&full.losses[s], &part.losses[s], sizeof(double)) != 0)
            fail_msg("step %d: loss %.17g uninterrupted, %.17g resumed", s, full.losses[s], part.losses[s]);
    printf("bf16 losses at steps 5 and 9: %.6f %.6f, resumed and not\n", part.losses[5], part.losses[9]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_activations),
        cmocka_unit_test(test_bf16_fused_qkv16),
        cmocka_unit_test(test_gelu_ops_optional),
        cmocka_unit_test(test_ce_fused_optional),
        cmocka_unit_test(test_resume_bitwise16),
        cmocka_unit_test(test_llama_bf16),
        cmocka_unit_test(test_llama_act16_off),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
