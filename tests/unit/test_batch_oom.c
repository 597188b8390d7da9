/* test_batch_oom.c — the batch controller in the real engine when memory
 * runs out: an OOM in the middle of a step changes nothing but the split,
 * the size grows back when the pressure leaves, micro-batch 1 out of
 * memory fails with a report, and a device failure is not taken for an
 * OOM. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/batch.h"
#include "fixture.h"
#include "jobcfg.h"
#include "pool/pool.h"
#include "engine/train.h"
#include "batch_fx.h"

/* ---- an OOM in the middle of a step --------------------------------------------------- */

static void test_oom_mid_step_same_result(void **state)
{
    (void)state;
    size_t limit = half_limit();
    job_config j;
    train_result res;
    make_job(&j, &oom_shape, "undisturbed", 0, 16);
    j.mem_limit = limit;
    j.margin = 0.05; /* covers what allocated bytes do not show: mapping granularity */
    /* Both runs at the fitted size: tuning picks by timing, which may
     * differ between the runs, and this compares the sizes step by step. */
    j.tune = false;
    pressure calm = {0};
    train_hooks hc = {.on_step = watch, .user = &calm};
    if (run(&j, &hc, &res) != TRAIN_DONE)
        fail_msg("%s", res.message);
    uint32_t m0 = res.micro;
    assert_true(m0 < oom_shape.batch);
    assert_int_equal(res.oom_recoveries, 0);

    make_job(&j, &oom_shape, "oom10", 0, 16);
    j.mem_limit = limit;
    j.margin = 0.05;
    j.tune = false;
    pressure x = {.at = 10};
    train_hooks h = {.on_step = watch, .should_stop = press, .user = &x};
    train_outcome o = run(&j, &h, &res);
    dev_cpu_set_external(fx_dev, 0);
    if (o != TRAIN_DONE)
        fail_msg("%s", res.message);
    assert_true(x.injected);
    /* The shrink is visible where status and metrics read it... */
    assert_true(res.oom_recoveries >= 1);
    assert_int_equal(x.micro[9], m0);
    assert_true(x.micro[10] < m0);
    assert_true(x.last.oom_recoveries >= 1);
    assert_string_equal(x.last.change_reason, "oom");
    assert_int_equal(x.last.change_step, 9);
    assert_true(metrics_has(j.out_dir, "\"reason\":\"oom\""));
    /* ...and the parameters are the undisturbed run's, up to reassociation. */
    char ref[128];
    snprintf(ref, sizeof ref, "%s/undisturbed", fx_dir);
    double worst = fx_worst_tensor_diff(j.out_dir, ref, NULL, 0);
    printf("oom at step 10: micro %u -> %u, worst tensor difference %.3g\n", m0, x.micro[10], worst);
    assert_true(worst <= 1e-5);
}

/* ---- pressure that leaves ------------------------------------------------------------- */

static void test_grows_back(void **state)
{
    (void)state;
    size_t limit = half_limit();
    job_config j;
    train_result res;
    make_job(&j, &oom_shape, "grow", 0, 20);
    j.mem_limit = limit;
    j.margin = 0.05;
    j.grow_after = 3;
    j.tune = false; /* the fitted size, from the first step (test_tune_* cover the tuned one) */
    pressure x = {.at = 5, .release = 8};
    train_hooks h = {.on_step = watch, .should_stop = press, .user = &x};
    train_outcome o = run(&j, &h, &res);
    dev_cpu_set_external(fx_dev, 0);
    if (o != TRAIN_DONE)
        fail_msg("%s", res.message);
    uint32_t m0 = x.micro[4];
    printf("micro by step:");
    for (int s = 1; s <= 20; s++)
        printf(" %u", x.micro[s]);
    printf("\n");
    assert_true(x.micro[5] < m0);
    /* Released after step 8; 3 steps of headroom later it is back. */
    assert_int_equal(x.micro[11], m0);
    assert_int_equal(x.micro[20], m0);
    assert_string_equal(x.last.change_reason, "grow");
    assert_true(metrics_has(j.out_dir, "\"reason\":\"grow\""));
}

/* ---- micro-batch 1 and still out of memory --------------------------------------------- */

static void test_micro1_fails_with_report(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    make_job(&j, &oom_shape, "nofit", 0, 12);
    j.mem_limit = half_limit();
    j.checkpoint_every = 3;
    /* At step 5 the job's limit drops under what its parameters and
     * optimizer alone take. */
    pressure x = {.at = 5, .limit_to = 64 << 10};
    train_hooks h = {.on_step = watch, .should_stop = press, .user = &x};
    assert_int_equal(run(&j, &h, &res), TRAIN_FAILED);
    printf("%s\n", res.message);
    const char *want[] = {"micro-batch 1", "requested", "params", "device free", "To fix: raise [memory] limit",
                          "checkpoint"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(res.message, want[i]))
            fail_msg("the report lacks '%s': %s", want[i], res.message);
    /* The last checkpoint (step 3) survives. */
    char step[32];
    assert_string_equal(fx_resume_meta(j.out_dir, "step", step, sizeof step), "3");
}

/* ---- the host's memory short ------------------------------------------------------------
 * A micro-batch's host memory (the model's losses buffer, the staging of a
 * device that is not host memory) that cannot be had is an OOM like the
 * pool's: the controller shrinks to a size whose host memory is there, and
 * where not even micro-batch 1's is, the job fails saying so. */
static void test_host_short(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    make_job(&j, &oom_shape, "hostshort", 8, 6);
    train_hooks h = {.test_host_short_from = 3};
    if (run(&j, &h, &res) != TRAIN_DONE)
        fail_msg("%s", res.message);
    printf("micro-batch 8 asked, host memory short from 3: trained at %u\n", res.micro);
    assert_true(res.micro > 0 && res.micro < 3);
    assert_true(res.oom_recoveries >= 1);
    assert_true(metrics_has(j.out_dir, "\"reason\":\"oom\""));

    make_job(&j, &oom_shape, "hostnone", 8, 6);
    h.test_host_short_from = 1;
    assert_int_equal(run(&j, &h, &res), TRAIN_FAILED);
    printf("%s\n", res.message);
    assert_non_null(strstr(res.message, "micro-batch 1"));
    assert_non_null(strstr(res.message, "the host ran out of memory for a micro-batch of 1"));
}

/* ---- a device failure is not an OOM ------------------------------------------------- */

/* The workspace kernels, except that the first sync of step flt_at
 * reports flt_code, as the CUDA backend reports a faulting kernel
 * (KERN_ERR_DEVICE) or memory a library could not get outside the pool
 * (KERN_ERR_OOM). */
static kern_ops flt_ops;
static uint64_t flt_at, flt_done;
static int flt_code;

static int flt_sync(kern_ctx *k)
{
    int e = kops->sync(k);
    if (e == KERN_OK && flt_code && flt_done + 1 == flt_at) {
        e = flt_code;
        flt_code = 0;
    }
    return e;
}

static const char *flt_error(const kern_ctx *k)
{
    (void)k;
    return "attention_fused_backward16: an illegal memory access was encountered";
}

static void flt_watch(void *user, const train_progress *pr)
{
    watch(user, pr);
    flt_done = pr->step;
}

static const kern_ops *fault_at(uint64_t step, int code)
{
    flt_ops = *kops;
    flt_ops.sync = flt_sync;
    flt_ops.error = flt_error;
    flt_at = step;
    flt_done = 0;
    flt_code = code;
    return &flt_ops;
}

static void test_device_fault_is_not_an_oom(void **state)
{
    (void)state;
    job_config j;
    train_result res;
    /* A faulting kernel fails the job with the kernel's message at once:
     * no smaller micro-batch cures it, and shrinking to 1 would end as a
     * misleading "does not fit".  The last checkpoint stays. */
    make_job(&j, &oom_shape, "fault", 4, 6);
    j.checkpoint_every = 2;
    pressure x = {0};
    train_hooks h = {.on_step = flt_watch, .user = &x};
    const kern_ops *k = fault_at(3, KERN_ERR_DEVICE);
    assert_int_equal(train_run(&j, fx_pool, k, 1, &h, &res), TRAIN_FAILED);
    pool_job_forget(fx_pool, 1);
    assert_string_equal(res.message, "the device failed in step 3: attention_fused_backward16: an illegal memory "
                                     "access was encountered");
    assert_int_equal(res.oom_recoveries, 0);
    char step[32];
    assert_string_equal(fx_resume_meta(j.out_dir, "step", step, sizeof step), "2");

    /* Memory a library could not get is an OOM: the step is redone smaller
     * and the run goes on. */
    make_job(&j, &oom_shape, "libfull", 8, 6);
    x = (pressure){0};
    k = fault_at(3, KERN_ERR_OOM);
    train_outcome o = train_run(&j, fx_pool, k, 1, &h, &res);
    pool_job_forget(fx_pool, 1);
    if (o != TRAIN_DONE)
        fail_msg("%s", res.message);
    assert_int_equal(res.oom_recoveries, 1);
    assert_int_equal(x.micro[2], 8);
    assert_true(x.micro[3] < 8);
    assert_true(metrics_has(j.out_dir, "\"reason\":\"oom\""));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_oom_mid_step_same_result),
        cmocka_unit_test(test_grows_back),
        cmocka_unit_test(test_micro1_fails_with_report),
        cmocka_unit_test(test_device_fault_is_not_an_oom),
        cmocka_unit_test(test_host_short),
    };
    return cmocka_run_group_tests(tests, batch_fx_setup, batch_fx_teardown);
}
