/* batch_fx.h — what the engine-driven batch controller tests
 * (test_batch_fit, test_batch_oom, test_batch_fp16) set up alike: the
 * engine fixture (fixture.h) on expandable segments with a text corpus and
 * a small image set for an MLP, the kernels with a GEMM workspace taken
 * from the pool (kern_ws.h), jobs of a given shape, and a simulated other
 * process that takes the device's memory in the middle of a step.
 *
 * One fixture per test process: batch_fx_setup and batch_fx_teardown are
 * the cmocka group setup and teardown. */
#ifndef GRADD_TEST_BATCH_FX_H
#define GRADD_TEST_BATCH_FX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jobcfg.h"
#include "kernels.h"
#include "engine/train.h"

/* A workspace of 2 MiB + 2 × the output of each matmul: large-pool sized,
 * and growing with the micro-batch, like a GEMM's. */
#define WS_FIXED ((size_t)2 << 20)
#define WS_FACTOR 2

/* The workspace kernels (kern_ws_ops), set by batch_fx_setup. */
extern const kern_ops *kops;

/* The fixture of 256 MiB on expandable segments, fx_dir/corpus.txt, and
 * fx_dir/img.npy with fx_dir/lab.npy: 512 images of 64 floats, 10
 * classes.  0 or -1 (cmocka group setup / teardown). */
int batch_fx_setup(void **state);
int batch_fx_teardown(void **state);

typedef struct {
    const char *name;
    bool mlp;
    uint32_t layers, heads, width, context;
    uint32_t batch;
} shape;

/* A job of shape s writing to fx_dir/OUT (removed first), `micro` the
 * micro-batch (0: auto), `steps` steps; an MLP on the image data or a GPT
 * on the corpus. */
void make_job(job_config *j, const shape *s, const char *out, uint32_t micro, uint64_t steps);
/* As a worker runs a job: its pool row (limit, peak) goes with it. */
train_outcome run(const job_config *j, const train_hooks *h, train_result *res);

/* A simulated other process.  At step `at` (1-based), before the step's
 * second micro-batch, the cache goes back to the device and the process
 * takes everything free, so the next workspace allocation fails; at step
 * `release` it exits.  With stop_after the run is stopped (cleanly, as a
 * cancel stops it) once that step is done. */
typedef struct {
    uint64_t at, release, stop_after;
    uint64_t done;  /* steps finished */
    int calls;      /* should_stop calls in the step `at` */
    bool injected;
    uint32_t micro[64];
    train_progress last;
    size_t limit_to; /* instead of the process: lower the job's pool limit to this */
} pressure;

/* train_hooks.should_stop and .on_step over a pressure: press injects it
 * and stops the run, watch records each step and releases it. */
bool press(void *user);
void watch(void *user, const train_progress *pr);
/* Does DIR/metrics.jsonl have a batch_change line containing needle? */
bool metrics_has(const char *dir, const char *needle);

/* The GPT the OOM, fp16 and resume tests run. */
extern const shape oom_shape;
/* A limit that makes auto choose about half the batch, so steps have
 * several micro-batches. */
size_t half_limit(void);

/* The metadata KEY of DIR/resume.safetensors is WANT, or a cmocka failure. */
void expect_meta(const char *dir, const char *key, const char *want);

#endif
