/* run.h — one training run's state, and what the engine's files call of
 * one another (internal to engine/; train.h is the engine's face).
 *
 * train.c owns the run: its data, the loop and the step.  memory.c owns its
 * device memory and the batch controller's decisions, checkpoint.c the
 * resume state and the exported model, outputs.c the output directory,
 * metrics.jsonl, TensorBoard and the progress report.  Each part of the
 * struct below says its owner, which sets it up and releases it; the other
 * files go through the owner's functions for anything that allocates or
 * writes a file, and use plain state directly (the step clears mem.oom, a
 * resume restores progress and the data position).
 */
#ifndef GRADD_RUN_H
#define GRADD_RUN_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "batch.h"
#include "dist/dist.h"
#include "io/data.h"
#include "models/model.h"
#include "pool/pool.h"
#include "tboard.h"
#include "train.h"

/* The training data and how a sample is laid out in memory (train.c). */
typedef struct {
    data_tokens tok_train, tok_val;
    data_images img_train, img_val;
    data_images img_val_view; /* a held-out tail of img_train (not owned) */
    data_sft sft_train, sft_val; /* fine-tuning samples (jsonl) */
    bool sft;                    /* the data is sft_*: rows of samples, padded or packed */
    bool pack;                   /* several samples to a row: pos and start staged with them */
    const data_images *val_images;
    bool have_val;
    data_stream stream;
    data_eval eval;
    data_budget budget; /* what all of the above holds, against the hooks' data_limit */
    uint32_t input_dim, classes;
    size_t x_bytes, y_bytes; /* one sample's input and target */
    size_t aux_bytes;        /* one row's pos and start when packing, else 0 */
} run_data;

/* recompute = auto's second lever (memory.c): once tuning has chosen the
 * fastest size without recompute, time the larger size that recompute lets
 * fit, and keep recompute only if it is faster. */
typedef enum {
    RUN_TRIAL_NONE = 0, /* not begun */
    RUN_TRIAL_TIMING,   /* steps run at `on` with recompute */
    RUN_TRIAL_DONE,     /* decided, or not worth trying: never again in this run */
} run_trial_state;

typedef struct {
    run_trial_state state;
    batch_ctl off;     /* the controller as tuning left it, to go back to */
    double rate_off;   /* samples/s of its tuned size */
    uint32_t on;       /* the size timed with recompute */
    uint32_t seen;     /* steps timed there */
    double fastest;    /* the fastest of them, seconds */
} run_recompute_trial;

/* What the optimizer trains: the model's table under full fine-tuning,
 * the adapters' under LoRA (lora.h), so that zeroing, the norm and AdamW
 * run one code path over either. */
typedef struct {
    float *params, *grads, *opt; /* count floats each; opt = Adam's m then v, 2·count */
    uint16_t *params16;          /* params rounded, refreshed by AdamW (a model's needs_params16); NULL: none */
    kern_segment *segs;          /* its tensors, for adamw_multi (host memory) */
    int nsegs;
    size_t count;
    /* The elements whose optimizer state this rank holds and updates:
     * all of them, or under [memory] shard_optimizer its dist_shard part
     * (opt then holds opt_count of m, then of v), with segs cut to it. */
    size_t opt_first, opt_count;
    kern_segment *opt_segs;
    int opt_nsegs;
} run_trained;

/* Device memory, all from the pool, and what the batch controller is fed
 * (memory.c).  Full fine-tuning: params, grads and opt hold the model's P
 * floats (params16 its rounded copy where the model needs one).  LoRA: the
 * base is frozen and held once, as params (fp32) or params16 and base32
 * (16 bits), and adapters, adapter_grads and opt are what trains. */
typedef struct {
    float *params, *grads, *opt; /* the model's P floats each (grads: full fine-tuning); opt 2·trained.count */
    uint16_t *params16;          /* the model's needs_params16, or a 16-bit frozen base; else NULL */
    float *base32;               /* a 16-bit base's fp32-read tensors (lora.h's n32 floats); else NULL */
    float *adapters, *adapter_grads; /* LoRA's num_params floats each; else NULL */
    run_trained trained;
    char lora_lever[256];      /* "lora (r=8 ...; base frozen in bf16)" for the levers; "": full fine-tuning */
    char method_why[128];      /* [finetune] method = auto's choice of LoRA, why; "": not auto's, or full */
    void *acts, *x, *y;
    int32_t *aux;              /* micro rows of pos, then as many of start (packing only) */
    size_t act_bytes;
    uint32_t micro;            /* what acts/x/y are sized for (0: nothing held) */
    size_t act_fixed, act_per; /* the model's activation estimate */
    size_t persistent;         /* params + grads + optimizer, as the pool holds them */
    void *x_host, *y_host;     /* staging when device memory is not host memory */
    int32_t *aux_host;
    size_t low_watermark;      /* the pool's: device memory kept free for others */
    bool oom;                  /* an allocation inside the step failed */
    bool fitting;              /* inside pool_fit_begin (a fit may start another: recompute) */
    char recompute_why[64];    /* why recompute is on, for the levers and the checkpoint */
    run_recompute_trial trial; /* recompute = auto timing a larger micro-batch with it */
    pool_oom_report last_oom;  /* the first such failure's report */
    bool last_oom_host;        /* it was the host's malloc, not the device's memory */
    /* An OOM as the controller takes it, from every rank (memory.c's
     * oom_agree): what the job held plus asked for, a bound its peak
     * exceeds; and the largest micro-batch whose activations the pool had
     * a block for (UINT32_MAX: not known). */
    size_t oom_bound;
    uint32_t oom_largest;
    bool test_oom_done; /* the hooks' test_oom_step has fired */
} run_memory;

/* What the run that wrote the checkpoint found with micro_batch = auto
 * (fit 0: nothing), for choosing the first micro-batch. */
typedef struct {
    uint32_t fit, tuned;
    size_t budget;
    double fixed, per_sample;
    char device[96];
} run_found;

/* checkpoint.c */
typedef struct {
    char path_resume[4096], path_model[4096], path_adapters[4096];
    run_found found;
    bool recompute; /* the run that wrote it ran with recompute (auto's choice kept) */
    char recompute_why[64]; /* and why it turned it on */
} run_checkpoints;

/* Where the training stands: what a checkpoint keeps besides the tensors
 * (train.c). */
typedef struct {
    uint64_t step;
    /* Updates the optimizer applied: AdamW's t, for its bias correction
     * 1 - beta^t.  It is `step` less fp16's skipped steps, which consume
     * their data and count for the schedule, logging and checkpoint_every,
     * but leave the moments untouched, so counting them would correct
     * moments that hold fewer updates than t says (PyTorch's GradScaler
     * skips optimizer.step() on overflow alike). */
    uint64_t opt_steps;
    double loss_scale;
    uint64_t good_steps; /* fp16: steps since the loss scale last changed */
    double step_s;       /* the last step's forward, backward and optimizer time, for tuning */
} run_progress;

/* outputs.c */
typedef struct {
    int lock_fd; /* out_dir/.lock, flock'd for the run; -1: none */
    FILE *metrics;
    tb_writer *tb;
    char path_metrics[4096];
    char err[1024]; /* the first failed metrics or TensorBoard write; "": none */
} run_outputs;

typedef struct run {
    const job_config *j;
    /* [finetune] method = auto: the job as it runs, with the method it was
     * given (memory_choose_method); j then points here.  NULL otherwise. */
    job_config *chosen;
    const model_kind *kind; /* the job's model, from the registry */
    pool *p;
    const kern_ops *k;
    kern_ctx *kc;
    uint32_t job;
    bool host_visible; /* device memory is host memory (the cpu backend) */
    model *m;
    /* Several ranks (train_hooks' dist; NULL: this process alone): every
     * step's batch is split among them in rank order, this rank training
     * rank_samples of it from rank_first.  rank_batch is the largest
     * share, the batch each rank's controller splits into micro-batches,
     * alike on every rank.  Only the writer (rank 0) writes the outputs. */
    struct dist *dist;
    uint32_t rank_batch, rank_samples, rank_first;
    bool writer;
    jmp_buf unwind; /* train_run's: a failed collective leaves the run from here */
    /* The step's gradients summed over the ranks in buckets of [job]
     * allreduce_bucket (train.c's gradsum_*): the first `next` floats are
     * not started yet; `bucket` floats each, 0: one sum after the backward. */
    struct {
        size_t bucket, next;
        bool failed;
        char err[1024];
        /* The last step's, for metrics.jsonl: the share of the gradients
         * whose sum started while the backward ran, and how long the
         * finish then waited for the sums. */
        double early, wait_s;
    } gsum;

    run_data data;
    run_memory mem;
    batch_ctl ctl; /* the batch controller (memory.c) */
    run_progress progress;
    run_checkpoints ckpt;
    run_outputs out;

    train_progress prog; /* the report: outputs.c publishes it, each file fills in its figures */
    train_result *res;
    const train_hooks *hooks;
} run;

/* ---- train.c ---------------------------------------------------------------------- */

/* Fail the run with a message a person can act on (res->message). */
train_outcome run_fail(run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Stage n samples from the stream (or the eval set) into device memory
 * as the micro-batch *mb (fine-tuning samples: at most n rows); the number
 * of samples staged, and in *units (may be NULL) the targets their loss
 * sums over. */
size_t run_next_batch(run *r, size_t n, bool eval, model_batch *mb, uint64_t *units);
/* A micro-batch's forward and backward; the sum of its losses. */
double run_forward_backward(run *r, const model_batch *mb, float dloss);
/* In place, the element-wise op over the ranks (nothing alone).  A
 * collective that fails (a rank died or hangs) ends every rank's process:
 * the job cannot go on with fewer, and resumes from its checkpoint. */
void run_agree(run *r, double *v, size_t n, dist_op op, const char *what);

/* ---- memory.c ---------------------------------------------------------------------- */

/* The kernels' workspace, from the pool, for the run's kernel context. */
kern_scratch memory_scratch(run *r);
/* The state that lives as long as the job: parameters, gradients, Adam. */
train_outcome memory_alloc(run *r);
void memory_free(run *r);
/* The trained params16 = params rounded, after anything but the optimizer
 * wrote params. */
void memory_refresh_params16(run *r);
/* The model's starting weights from host memory (P floats): into params,
 * or under LoRA with a 16-bit base cast into params16 a chunk at a time
 * (and the fp32-read tensors copied into base32).  0, or -1 with err. */
int memory_base_from_host(run *r, const float *host, char *err, size_t err_len);
/* The model's weights as fp32 into host memory (P floats): a 16-bit base
 * widened, its fp32-read tensors as base32 holds them.  0, or -1 with
 * err. */
int memory_base_to_host(run *r, float *host, char *err, size_t err_len);
/* Wait for the queued device work: 0; 1 when it ran out of memory; -1
 * when the device failed otherwise (the run failed). */
int memory_device_check(run *r, const char *during);
/* [finetune] method = auto, before memory_alloc: keep the whole model r->m
 * when micro-batch 1 of it fits the job's budget (by the model's own
 * estimate, recompute counted unless off), or a resumed checkpoint holds
 * it; else build the model again with LoRA's adapters.  Nothing for other
 * methods. */
train_outcome memory_choose_method(run *r);
/* The first micro-batch, allocated. */
train_outcome memory_choose_micro(run *r);
/* At a step boundary: shrink before an OOM, grow back, or tune. */
train_outcome memory_adapt(run *r);
/* After an OOM inside a step: shrink until the micro-batch fits again. */
train_outcome memory_after_oom(run *r);
/* Whether this rank (local, its report in mem.last_oom) or any other ran
 * out of memory; then mem.oom_bound and oom_largest are set, alike on
 * every rank, for memory_after_oom.  A collective when there are ranks. */
bool memory_oom_agree(run *r, bool local);

/* ---- checkpoint.c ------------------------------------------------------------------ */

/* Name the checkpoint files and remove what a run killed mid-write left. */
void checkpoint_paths(run *r);
/* Load out_dir/resume.safetensors if present: 1 when resumed, 0 when there
 * is none, -1 (the run failed) when it is unusable. */
int checkpoint_load(run *r);
/* Write the resume state at data position (epoch, index). */
train_outcome checkpoint_save(run *r, uint64_t epoch, uint64_t index);
/* Write model.safetensors, or a LoRA job's adapter_model.safetensors and
 * adapter_config.json (and its merged model.safetensors with [finetune]
 * merged): 0, or -1 with err. */
int checkpoint_export(run *r, char *err, size_t err_len);
/* Whether a resume state exists, seen as the job's owner. */
bool checkpoint_exists(const run *r);
/* Whether the resume state holds LoRA adapters (1) or a whole model's
 * state (0); -1 when there is none, or none that opens (checkpoint_load
 * then says why). */
int checkpoint_holds_adapters(const run *r);
/* The device the run is on, as a checkpoint records where a micro-batch
 * was found. */
void checkpoint_device_signature(const run *r, char *buf, size_t len);

/* ---- outputs.c --------------------------------------------------------------------- */

/* Create and lock the output directory for the run. */
train_outcome outputs_claim_dir(run *r);
/* Open metrics.jsonl (trimmed to the checkpoint when resumed) and the
 * TensorBoard writer. */
train_outcome outputs_open(run *r, bool resumed);
/* Flush what was logged; false when a log write failed (r->out.err). */
bool outputs_flush(run *r);
/* A step's report; skipped: an fp16 step whose gradients overflowed. */
void outputs_step(run *r, double loss, double lr, double norm, double ups, double dt, bool skipped);
/* A validation's report over `units` (r->prog.val_loss and val_accuracy
 * set). */
void outputs_eval(run *r, uint64_t units);
/* Publish the batch controller's state in the progress report. */
void outputs_sync(run *r);
/* A change of micro-batch: metrics.jsonl, the pool's timeline, the report. */
void outputs_batch_change(run *r);
/* Close the logs; o, or TRAIN_FAILED when o was TRAIN_DONE and closing failed. */
train_outcome outputs_close(run *r, train_outcome o);
/* Let another run take the output directory. */
void outputs_release(run *r);

#endif
