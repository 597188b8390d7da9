/* train.h — the training engine: one job, start to finish, on one device.
 *
 * The same entry point serves `gradd run job.cfg` in the foreground and the
 * daemon's workers.  Every tensor comes from the device's memory pool with
 * its tag (params, grads, optimizer, activations, data, workspace) and the
 * job's id, so the pool's breakdowns show where a running job's memory is.
 *
 * One optimizer step = `batch` samples, split into micro-batches of at most
 * `micro` samples (the last may be smaller).  Gradients accumulate across
 * the micro-batches with each unit's loss weighted by 1/(units in the step),
 * so any split yields the same update up to floating-point reassociation.
 *
 * The split is the batch controller's (batch.h): micro_batch = auto probes
 * for the largest micro-batch that fits the job's budget, then (with
 * [memory] tune = on) times the first steps at a few sizes at or below it
 * and keeps the fastest; an OOM inside a step redoes the whole step at a
 * smaller micro-batch; at step boundaries the micro-batch shrinks when
 * memory runs short and grows back after [memory] grow_after steps of
 * headroom.  A resumed job starts from what its checkpoint says probing and
 * tuning found, when the device and the budget are the same (memory.c).
 */
#ifndef GRADD_TRAIN_H
#define GRADD_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jobcfg.h"
#include "kernels.h"
#include "pool/pool.h"

struct st_writer;
struct dist;

/* What a run reports after every optimizer step (and after validations). */
typedef struct {
    uint64_t step, steps;       /* step just finished (1-based), total */
    double loss;                /* mean training loss of the step */
    double lr, grad_norm;
    double units_per_s;         /* tokens/s (gpt) or samples/s (mlp) over the step */
    double elapsed_s;
    uint32_t micro, accum;      /* micro-batch size and micro-batches per step */
    double val_loss;            /* latest validation (NaN until the first) */
    double val_accuracy;        /* mlp only (NaN otherwise) */
    size_t allocated, reserved; /* the pool's, after the step */
    bool resumed;               /* this run started from a checkpoint */
    bool trained;               /* a step this run trained ends here; false where a resume starts */
    /* The batch controller (batch.h): micro and accum above are what the
     * next step runs. */
    uint32_t micro_max;         /* the largest micro-batch the budget now allows, as predicted */
    uint32_t micro_fit;         /* the largest found to fit; growth stops there */
    uint64_t oom_recoveries;    /* steps redone smaller after an OOM */
    uint64_t batch_changes;
    uint32_t change_from, change_to; /* the last change (valid when batch_changes > 0) */
    uint64_t change_step;
    char change_reason[16];     /* "fit", "tuning", "tuned", "oom", "pressure", "grow", "recompute", "lora" */
    bool recompute;             /* activation recomputation is on ([memory] recompute) */
    bool lora;                  /* it trains LoRA adapters ([finetune] method lora, or auto's choice) */
    char levers[320];           /* the memory levers on and why: "recompute (on in the job file)"; "": none */
    double loss_scale;          /* fp16's dynamic loss scale (1 otherwise) */
    uint64_t data_bytes;        /* host memory the job's data holds (io/data.h's budget) */
} train_progress;

typedef struct {
    /* After every step; may be NULL. */
    void (*on_step)(void *user, const train_progress *p);
    /* Polled between micro-batches; true stops the run cleanly (final
     * checkpoint written, result cancelled).  May be NULL. */
    bool (*should_stop)(void *user);
    /* Polled between the layers of every forward and backward (of steps,
     * probes and evaluations): a sign of life for a daemon's watchdog in a
     * micro-batch that takes minutes.  True stops the run as should_stop
     * does, without waiting for the micro-batch's end: the step is not
     * applied (a stopped evaluation is not reported; a probe goes on to
     * its end).  May be NULL. */
    bool (*poll)(void *user);
    /* Called with each checkpoint's writer before it is written, at `step`;
     * tests inject write failures here (st_writer_fail_at).  May be NULL. */
    void (*on_checkpoint)(void *user, struct st_writer *w, uint64_t step);
    void *user;
    /* Tests only: accept [train] precision = bf16 or fp16 on a cpu device,
     * which gradd refuses.  The cpu kernels compute in fp32 whatever the
     * precision (kernels.h), so this runs fp16's loss-scaling schedule —
     * the scale, the skipped steps, the resume state — without a GPU, not
     * 16-bit arithmetic; a test drives overflows through the kern_ops it
     * passes (the engine takes an overflow from a non-finite sumsq). */
    bool cpu_mixed_precision;
    /* Tests only: the time a step that ran at `micro` (with recompute on
     * or off) took, in place of `measured`, for the batch controller's
     * tuning and recompute's timing: a test chooses which size is faster.
     * May be NULL. */
    double (*step_seconds)(void *user, uint32_t micro, bool recompute, double measured);
    /* The host memory the job's training and validation data may hold
     * (0: no bound), and how a refusal names that bound for the person
     * who can change it, e.g. "[daemon] max_job_data"; may be NULL. */
    uint64_t data_limit;
    const char *data_limit_key;
    /* Tests only: the first attempt of this step (1-based) runs out of
     * memory after its first micro-batch, as a failed allocation inside it
     * would; 0: never. */
    uint64_t test_oom_step;
    /* Tests only: the host memory of a micro-batch of this many samples or
     * more cannot be had, as a failed malloc would say; 0: never. */
    uint32_t test_host_short_from;
    /* The job runs as several ranks (`gradd run` under mpirun or srun),
     * this process one of them (dist/dist.h); NULL: alone. */
    struct dist *dist;
} train_hooks;

/* fp16 dynamic loss scaling: the scale starts high, halves on a step whose
 * gradients overflowed (that step is skipped: the data is consumed and the
 * step counts for the schedule and the outputs, but the parameters, the
 * optimizer state and AdamW's count of applied updates, its t, are not
 * touched), and doubles after this many good steps in a row — the schedule
 * of apex and torch.cuda.amp.  A step redone after an OOM at a smaller
 * micro-batch counts once; the scale, the count of good steps and the count
 * of updates are kept in the resume state.  A job resumed in fp16 from
 * another precision's checkpoint starts at the initial scale. */
#define TRAIN_LOSS_SCALE_INIT 65536.0
#define TRAIN_LOSS_SCALE_GROW_EVERY 2000
#define TRAIN_LOSS_SCALE_MAX 16777216.0

/* The "format" metadata of resume.safetensors (checkpoint.c writes it;
 * sample.c reads a checkpoint as well as a finished model). */
#define TRAIN_RESUME_FORMAT "gradd-resume-1"

typedef enum { TRAIN_DONE = 0, TRAIN_STOPPED = 1, TRAIN_FAILED = 2 } train_outcome;

typedef struct {
    train_outcome outcome;
    uint64_t steps_done;
    double final_loss, val_loss, val_accuracy;
    uint32_t micro;                   /* at the end */
    uint32_t micro_fit;               /* the largest found to fit */
    uint32_t probes;                  /* micro-batches spent finding it */
    uint64_t oom_recoveries, batch_changes;
    double oom_lost_s;                /* wall time of the abandoned attempts and their shrinks */
    size_t act_fixed, act_per_sample; /* the model's activation estimate */
    size_t persistent_bytes;          /* params + grads + optimizer in the pool */
    double peak_fixed, peak_per_sample; /* the controller's fitted peak(n) = fixed + per_sample × n */
    bool lora;                        /* it trained LoRA adapters ([finetune] method lora, or auto's choice) */
    char message[1024];               /* why it failed, a person can act on it */
    /* Set by a runner whose job's memory is in a pool of its own (a
     * program's), read before that pool goes: its peak, in all and by
     * tag.  Otherwise the worker reads the device's pool. */
    bool mem_own;
    uint64_t mem_peak, mem_tag_peak[POOL_TAG_COUNT];
} train_result;

/* Run the job on the device behind `p` with kernels `k`.  Returns the
 * outcome (also in res->outcome); on TRAIN_FAILED res->message says why. */
train_outcome train_run(const job_config *j, pool *p, const kern_ops *k, uint32_t job_id, const train_hooks *h,
                        train_result *res);

/* The learning rate at 0-based step `step`: linear warmup, then cosine decay
 * from lr to min_lr. */
double train_lr(const job_config *j, uint64_t step);

#endif
