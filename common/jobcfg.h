/* jobcfg.h — job.cfg: what to train, on what data, how, and where the
 * results go.  An INI file (sections [job] [model] [data] [train] [memory]
 * [output], or for a user's own program [job] [program] [memory]
 * [output]); every error names FILE:LINE: [section] key, and a bad file
 * yields nothing.  Relative paths resolve against the file's directory. */
#ifndef GRADD_JOBCFG_H
#define GRADD_JOBCFG_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define JOBCFG_MAX_HIDDEN 8
#define JOBCFG_PRIORITY_MAX 1000 /* [job] priority is 0 to this */
#define JOBCFG_MAX_LAYERS 96     /* [model] layers is 1 to this */
#define JOBCFG_MAX_VOCAB (1 << 20) /* [model] vocab is 2 to this */
#define JOBCFG_MAX_KEYS 96 /* at least the number of keys a job file may set */

typedef enum { JOBCFG_DATA_AUTO = 0, JOBCFG_DATA_TEXT, JOBCFG_DATA_TOKENS, JOBCFG_DATA_IDX, JOBCFG_DATA_NPY,
               JOBCFG_DATA_JSONL } jobcfg_format;
typedef enum { JOBCFG_ROPE_NONE = 0, JOBCFG_ROPE_LLAMA3 = 1 } jobcfg_rope_scaling;
typedef enum { JOBCFG_OVERLONG_REFUSE = 0, JOBCFG_OVERLONG_TRUNCATE = 1 } jobcfg_overlong;
typedef enum { JOBCFG_FP32 = 0, JOBCFG_BF16 = 1, JOBCFG_FP16 = 2 } jobcfg_precision;
/* [job] type: gradd's own engine, or a program of the user's (runner.h). */
typedef enum { JOBCFG_ENGINE = 0, JOBCFG_PROGRAM = 1 } jobcfg_type;
typedef enum { JOBCFG_RESTART_NO = 0, JOBCFG_RESTART_ON_FAILURE = 1 } jobcfg_restart;
typedef enum { JOBCFG_ALLOC_GRADD = 0, JOBCFG_ALLOC_PYTORCH = 1 } jobcfg_allocator;
/* [output] resume: what an engine job may find in its directory (daemon/jobs/outdir.h). */
typedef enum { JOBCFG_RESUME_AUTO = 0, JOBCFG_RESUME_NEVER = 1, JOBCFG_RESUME_REQUIRE = 2 } jobcfg_resume;
/* [memory] recompute: keep only each block's input for the backward and
 * run the block's forward again there (less memory, more compute). */
typedef enum { JOBCFG_RECOMPUTE_AUTO = 0, JOBCFG_RECOMPUTE_OFF = 1, JOBCFG_RECOMPUTE_ON = 2 } jobcfg_recompute;
/* [finetune] method: train every weight, or low-rank adapters on a frozen
 * base (daemon/models/lora.h), or let the engine choose at the start: the
 * whole model when micro-batch 1 of it fits, else adapters. */
typedef enum { JOBCFG_FT_FULL = 0, JOBCFG_FT_LORA = 1, JOBCFG_FT_AUTO = 2 } jobcfg_ft_method;
#define JOBCFG_COMMAND_MAX 4096 /* [program] command and env, as written */

/* [job] devices: at most this many. */
#define JOBCFG_MAX_DEVICES 16

typedef struct job_config {
    char source[PATH_MAX]; /* the file, as given */

    /* [job] */
    char name[64];
    char device[16]; /* auto | cpu | cpuN | cuda:N; with devices, the first of them */
    /* [job] devices: one job data-parallel over these, a rank on each
     * (as written; parsed into device_ids, the daemon's ids: cpu0, cuda1).
     * ndevices 0: one device, [job] device. */
    char devices[256];
    char device_ids[JOBCFG_MAX_DEVICES][16];
    int ndevices;
    int64_t priority;
    int type; /* jobcfg_type */
    uint64_t time_limit_ms; /* of running, over all its runs; 0: none asked */
    uint64_t rank_timeout_ms; /* several ranks: the longest wait at a collective */
    uint64_t allreduce_bucket; /* several ranks: bytes of gradients per all-reduce; 0: one after the backward */
    char on_end[JOBCFG_COMMAND_MAX]; /* run as the owner once it has ended; as written */

    /* [model] */
    /* The kind of model, as the file names it.  gradd checks it, and the
     * keys that matter to that kind, against its models
     * (daemon/models/model.h: model_check_job): this parser, shared with
     * gradctl, does not know which models a daemon has. */
    char model[32];
    uint32_t layers, heads, width, context, vocab;
    char hidden_text[128]; /* "256,128" */
    int nhidden;           /* 0: hidden_text is not a list of sizes */
    uint32_t hidden[JOBCFG_MAX_HIDDEN];
    /* A Hugging Face model directory to start from (absolute; empty: none).
     * Its config.json gives the shape keys the file leaves out; one that
     * the file sets must agree (daemon/models: model_check_job). */
    char from[PATH_MAX];
    /* The positions the model is made for, where it trains at fewer
     * (context): config.json's n_positions or max_position_embeddings
     * under [model] from, or a checkpoint's; 0: context.  A gpt keeps
     * that many rows of its position table, and an export says it. */
    uint32_t positions;
    /* llama (model_llama.c); the other kinds refuse them when set. */
    uint32_t kv_heads;  /* 0: heads (plain multi-head attention) */
    uint32_t mlp_width; /* 0: the kind's default */
    double rope_theta;
    int rope_scaling; /* jobcfg_rope_scaling */
    double rope_factor, rope_low_freq, rope_high_freq;
    uint32_t rope_context;
    double norm_eps;
    bool tie_embeddings;

    /* [data] */
    int format; /* jobcfg_format; auto: by model and file contents */
    char train[PATH_MAX], train_labels[PATH_MAX];
    char val[PATH_MAX], val_labels[PATH_MAX];
    double val_fraction;  /* held out from train when val is empty */
    uint64_t subset;      /* use only the first N training samples (0: all) */
    uint64_t val_subset;  /* likewise for validation */
    int overlong;         /* jobcfg_overlong: jsonl samples longer than context */
    bool packing;         /* jsonl: several samples to a sequence where the model keeps them apart */

    /* [train] */
    uint64_t steps;
    uint32_t batch;          /* effective: samples per optimizer step; never changes */
    char micro_text[16];     /* "auto" or N */
    uint32_t micro_batch;    /* 0: auto */
    double lr, min_lr;
    uint64_t warmup;
    double weight_decay, grad_clip, beta1, beta2, eps;
    uint64_t seed;
    int precision; /* jobcfg_precision */
    uint64_t eval_every;
    uint32_t eval_batches;
    uint32_t threads; /* cpu threads; 0: all cores */

    /* [memory] */
    uint64_t mem_limit; /* the job's pool budget; 0: none */
    double margin;
    uint64_t grow_after; /* steps of stable headroom before the micro-batch grows back; 0: never */
    bool tune;           /* micro_batch = auto: time sizes up to the fit and keep the fastest */
    bool shard_optimizer; /* several ranks: each holds its share of the optimizer state */
    int recompute;       /* jobcfg_recompute */

    /* [finetune] */
    int ft_method;        /* jobcfg_ft_method */
    uint32_t lora_rank;
    double lora_alpha;    /* the adapters' output is scaled by alpha / rank, as PEFT's */
    double lora_dropout;  /* training drops the adapters' input elements at this rate (PEFT's lora_dropout) */
    char lora_targets[256]; /* comma-separated Hugging Face module names; empty: the kind's default */
    bool lora_merged;     /* also export the base with the adapters merged in */

    /* [output] */
    char out_dir[PATH_MAX];
    uint64_t checkpoint_every; /* 0: only at the end */
    uint64_t log_every;
    int resume; /* jobcfg_resume */

    /* [program]: only for type = program, whose file may set no [model],
     * [data] or [train] key (and whose engine fields are all zero). */
    char command[JOBCFG_COMMAND_MAX]; /* as written; argsplit.h reads it */
    char workdir[PATH_MAX];           /* absolute; default: the job file's directory */
    char env[JOBCFG_COMMAND_MAX];     /* KEY=VALUE words, as written */
    uint64_t grace_ms;                /* SIGTERM, then this long, then SIGKILL */
    int restart;                      /* jobcfg_restart */
    int allocator;                    /* jobcfg_allocator: whose pool PyTorch allocates from */

    /* The line each key was set on (0: left at its default), so that errors
     * found later, by the daemon, still name it: see jobcfg_where. */
    int key_line[JOBCFG_MAX_KEYS];

    /* A job that runs after others (gradctl submit --after) may read what
     * they make: inputs_later lets its data files and [model] from not
     * exist yet, and inputs_missing says that some did not, so that the
     * job reads its model's keys and checks them when it starts. */
    bool inputs_later;
    bool inputs_missing;
} job_config;

void jobcfg_defaults(job_config *j);
/* Parse and validate.  0, or -1 with "FILE:LINE: [section] key: why" in err
 * (and *out untouched). */
int jobcfg_load(const char *path, job_config *out, char *err, size_t err_len);
/* The same for a job file's contents; `path` is where they came from: it
 * names the file in errors and anchors relative paths. */
int jobcfg_load_mem(const void *contents, size_t len, const char *path, job_config *out, char *err,
                    size_t err_len);
/* jobcfg_load_mem without the check that the data files are readable: for
 * the record of a job that has finished, whose data may since be gone
 * while its settings (model, output directory) still describe its results. */
int jobcfg_load_record(const void *contents, size_t len, const char *path, job_config *out, char *err,
                       size_t err_len);
/* jobcfg_load_mem for a job that runs after others: a data file that does
 * not exist (yet) sets inputs_missing instead of being an error. */
int jobcfg_load_later(const void *contents, size_t len, const char *path, job_config *out, char *err,
                      size_t err_len);
/* "SOURCE:LINE: [section] key" (or "SOURCE: [section] key" for a key the
 * file did not set) into buf, for errors found after the file was read: the
 * device it names is missing, its data cannot be read as its owner. */
const char *jobcfg_where(const job_config *j, const char *section, const char *key, char *buf, size_t len);
/* The line the file set [section] key on; 0 where it left the key at its
 * default (or there is no such key). */
int jobcfg_line(const job_config *j, const char *section, const char *key);
/* NULL if `name` may name a job, else why not: it is shown in every user's
 * terminal and JSON, so it must be valid UTF-8 without control characters
 * or bidi controls. */
const char *jobcfg_name_problem(const char *name);
/* 0 if `env` ([program] env) is NAME=VALUE words that gradd does not set
 * itself, else -1 with why. */
int jobcfg_check_env(const char *env, char *why, size_t why_len);
/* Every key with its default, as a commented job file. */
void jobcfg_print_defaults(FILE *f);

#endif
