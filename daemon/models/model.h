/* model.h — the models gradd trains, behind one small table of functions,
 * and the registry of model kinds (registry.c).
 *
 * A model kind is one file here (model_gpt.c, model_mlp.c) that defines a
 * model_kind: its name in job files, what it trains on, what it reports,
 * its own checks of a job file, and its constructor.  registry.c lists the
 * kinds; everything outside models/ asks the registry, never a kind's name.
 *
 * A model owns no memory: the trainer asks it for sizes, allocates
 * parameters, gradients, optimizer state and activations from the memory
 * pool (each with its tag), and hands the buffers in.  Parameters and
 * activations are each one contiguous buffer carved into named tensors by a
 * table of sizes, so they are easy to count, checkpoint and report.
 */
#ifndef GRADD_MODEL_H
#define GRADD_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jobcfg.h"
#include "kernels.h"

#define MODEL_MAX_DIMS 4
#define MODEL_MAX_TENSORS 1280

/* One parameter tensor: a view into the parameter buffer (and, at the same
 * offset, into the gradient and optimizer buffers). */
typedef struct {
    char name[96];          /* GPT-2 style: "h.3.attn.c_attn.weight"; LoRA's PEFT names are longer */
    size_t offset, numel;   /* in floats */
    int ndim;
    size_t shape[MODEL_MAX_DIMS];
    bool decay;             /* AdamW weight decay applies (matrices only) */
    bool transpose_export;  /* stored (out,in), exported (in,out) like GPT-2's Conv1D */
} model_tensor;

/* One micro-batch of samples.  x: gpt int32 tokens (n,T); mlp float pixels
 * (n,D).  y: gpt int32 targets (n,T); mlp int32 labels (n).  A negative
 * target is ignored: no loss and no gradient (Hugging Face's -100: a
 * prompt token, or padding).
 *
 * Token sequences may carry more than one sample each (jsonl data, packed):
 * pos (n,T) is each token's position within its own sample (what RoPE or a
 * position embedding sees) and start (n,T) the index in the sequence where
 * its sample begins, so that token t attends to tokens start[t]..t only.
 * Both NULL: one sample per sequence, positions 0..T-1.  Only a kind that
 * `packs` is given them; the others get one sample per sequence, padded. */
typedef struct {
    const void *x;
    const int32_t *y;
    uint32_t n;
    const int32_t *pos;
    const int32_t *start;
} model_batch;

typedef struct model model;
typedef struct model_kind model_kind;
typedef struct lora lora; /* lora.h */

typedef struct model_ops {
    /* Samples are sequences (gpt) or images (mlp); units per sample for
     * throughput and loss averaging: T tokens, or 1 image. */
    uint32_t (*units_per_sample)(const model *m);
    /* Bytes of activations (and their gradients) for a micro-batch of n:
     * fixed + per_sample × n.  Exact: bind_activations uses no more. */
    void (*activation_bytes)(const model *m, size_t *fixed, size_t *per_sample);
    /* Point the model at an activation buffer sized for up to n samples.
     * 0, or -1 when the host memory the model keeps beside it for n
     * samples (the losses' staging) cannot be had; binding again with
     * another n starts over. */
    int (*bind_activations)(model *m, void *mem, uint32_t n);
    /* Fill host memory params (num_params floats) from the seed. */
    void (*init_params)(const model *m, float *params, uint64_t seed);
    /* Forward a micro-batch; returns Σ per-unit losses (double on host) and
     * counts correct top-1 predictions in *correct (may be NULL). */
    double (*forward)(model *m, const model_batch *b, uint64_t *correct);
    /* Backward of the last forward; accumulates into the gradient buffer
     * with each unit's loss weighted by `dloss` (1 / units in the whole
     * optimizer step, so any split into micro-batches gives the same step). */
    void (*backward)(model *m, const model_batch *b, float dloss);
    /* forward (without *correct) then backward in one call, for training:
     * the same result, and a model may fuse across the two (gpt: the loss
     * and its gradient in one pass over the logits).  NULL: the trainer
     * calls the two. */
    double (*forward_backward)(model *m, const model_batch *b, float dloss);
    void (*destroy)(model *m);
    /* Sampling: forward n sequences of len tokens each (tokens (n,len)
     * int32 in device memory, 1 <= len <= context, n <= the bound batch)
     * and copy the logits of each sequence's last position to host memory
     * out (n,V).  No loss, no backward state kept.  0, or -1 on bad sizes.
     * NULL for models without a token distribution (mlp). */
    int (*forward_logits)(model *m, const int32_t *tokens, uint32_t n, uint32_t len, float *out);
    /* Sampling, incrementally, with a key/value cache (all three NULL for
     * models without one).  forward_logits over a prefix of len tokens
     * costs len token-forwards, so generating n tokens that way costs
     * O(n²); a decode step runs one position and attends over the cached
     * keys and values of the earlier ones.
     * decode_bytes: the cache for n sequences, in bytes (on top of
     * activation_bytes: the caller allocates it where it allocates the
     * activations, 64-byte aligned).  decode_start points the model at such
     * a buffer for n sequences (n <= the bound batch) and empties it.
     * decode_step runs position pos of each sequence, tokens (n) int32 in
     * device memory, through every layer, appends its keys and values to
     * the cache, and copies the logits to host memory out (n,V): what
     * forward_logits gives for the pos+1 tokens, to rounding.  pos < the
     * context, and at most the number of positions cached (less rewinds:
     * the later ones are forgotten).  It uses the bound activations as
     * scratch; a forward in between leaves the cache as it was.  Both 0,
     * or -1 on bad sizes, a backend without attention_decode, or 16-bit
     * activations (sampling builds an fp32 model). */
    size_t (*decode_bytes)(const model *m, uint32_t n);
    int (*decode_start)(model *m, void *mem, uint32_t n);
    int (*decode_step)(model *m, const int32_t *tokens, uint32_t pos, float *out);
} model_ops;

struct model {
    const model_kind *kind;
    const model_ops *ops;
    const kern_ops *k;
    kern_ctx *kc;
    size_t num_params;
    int ntensors;
    model_tensor tensors[MODEL_MAX_TENSORS];
    float *params, *grads; /* device memory, num_params floats each */
    /* A model whose 16-bit GEMMs read their weights in 16 bits (gpt with
     * 16-bit activations) sets needs_params16 when it is created; whoever
     * owns params then provides params16 (device memory, num_params values
     * at the tensors' offsets) and keeps it equal to params rounded to the
     * context's 16-bit type: cast after writing params, and refreshed by
     * adamw's p16 after every update.  One copy made where the parameters
     * change, not one per GEMM call. */
    uint16_t *params16;
    bool needs_params16;
    uint32_t max_n;        /* activations bound for this many samples */
    /* Activation recomputation, for a kind that `recomputes`: set before
     * activation_bytes and bind_activations, which then keep only each
     * transformer block's input (and what the loss reads) and one block's
     * worth of the rest, and the backward runs each block's forward again
     * into that one block's buffers right before its own backward.  The
     * same kernels in the same order: the step is bitwise the same, for
     * the memory of L - 1 blocks' activations and one more forward. */
    bool recompute;
    /* [finetune] method = lora (lora.h); NULL: full fine-tuning.  Then the
     * base is frozen: grads is NULL, no base gradient is computed, and the
     * base is held once, in the precision its GEMMs read: params (fp32
     * contexts), or params16 alone (bf16/fp16: params NULL, the tensors
     * the kernels read in fp32 widened by lora_base32).  The trainer
     * trains the adapters' own table, parameters and gradients. */
    lora *lora;
    /* A training pass, for what trains differently from how it evaluates
     * (LoRA's dropout): the trainer sets `on` around a step's passes, with
     * the step's random stream and the index among the step's samples (over
     * every rank) of the micro-batch's first one.  Evaluation, sampling and
     * decoding run with it off. */
    struct {
        bool on;
        uint64_t seed, first;
    } dropout;
    /* Signs of life from inside a forward or backward: the models call
     * model_poll between layers, which calls poll(poll_user) (poll may be
     * NULL).  When `stoppable` and poll returns true, `stopped` is set and
     * the model skips the rest of the pass; what it computed is then
     * meaningless, and the caller throws it away and clears `stopped`.
     * A micro-batch of a big model on a CPU, or an evaluation of a big
     * set, takes minutes: a daemon's watchdog must see the job thread alive
     * through it, and a cancel should not wait for its end. */
    bool (*poll)(void *user);
    void *poll_user;
    bool stoppable, stopped;
    /* Gradients that are final: a backward calls model_grads_final(m,
     * from) once grads[from, num_params) get nothing more from it, `from`
     * decreasing call by call, so that they can be summed over the ranks
     * while it goes on with the layers below (grads_final NULL: nobody
     * asks).  A kind that never calls it has them all summed after. */
    void (*grads_final)(void *user, size_t from);
    void *grads_user;
    void *impl;
};

/* ---- model kinds ----------------------------------------------------------------- */

/* What a kind trains on: token sequences (x and y int32 (n,T)) or images
 * with labels (x float (n,D), y int32 (n)).  It decides how the engine
 * reads the job's data. */
typedef enum { MODEL_DATA_TOKENS, MODEL_DATA_IMAGES } model_data;

struct model_kind {
    const char *name;   /* [model] type, and the first word of its describe line */
    const char *a_name; /* the name with its article, for messages: "a gpt", "an mlp" */
    const char *unit;   /* throughput's unit in status and log lines: "tok", "samples" */
    const char *units;  /* what the loss averages over, in metrics.jsonl keys
                         * ("tokens": tokens_per_s, val_tokens) */
    model_data data;
    bool classifies; /* forward counts correct top-1 predictions: validation reports accuracy */
    bool packs;      /* honours model_batch pos and start: several samples to a sequence */
    bool generates;  /* a token distribution to sample (gradctl sample); parse is then set */
    bool recomputes; /* honours model.recompute ([memory] recompute) */
    /* The kind's checks of a job file that jobcfg parsed (its keys, the data
     * it needs): 0, or -1 with "FILE:LINE: [section] key: why" in err
     * (model_job_error). */
    int (*check_job)(const job_config *j, char *err, size_t err_len);
    /* Fill m's ops, impl and tensor table for the job (shapes only; no
     * device memory).  input_dim and classes come from image data. */
    int (*create)(const job_config *j, uint32_t input_dim, uint32_t classes, model *m, char *err, size_t err_len);
    /* The line that changes whenever the parameter layout would: a
     * checkpoint's "model" and model.safetensors' "gradd_model". */
    void (*describe)(const model *m, char *buf, size_t len);
    /* The line back into the job's [model] keys, for sampling a file (set
     * for kinds that generate).  0, or -1 with err. */
    int (*parse)(const char *line, job_config *j, char *err, size_t err_len);

    /* Hugging Face interchange (daemon/io/hf.c), for kinds with a
     * counterpart in transformers; hf_type NULL for the others.
     * hf_type: config.json's model_type ("gpt2", "llama").
     * hf_prefix: what a model class with a head puts before the kind's
     * tensor names in its files ("transformer." for GPT2LMHeadModel), tried
     * when a name is missing; may be NULL.  The model's own tensor names
     * are the ones it exports.
     * hf_read: config.json (a parsed JSON object, jansson's json_t, passed
     * as void so this header needs no JSON) into j's [model] keys, every
     * shape key set whether the file had it or not, and positions (the
     * positions the model is made for, context or more): 0, or -1 with
     * "config.json: key: why" in err.
     * hf_config: the model's config.json as a new json_t reference (void),
     * NULL when out of memory.
     * hf_ignore: a tensor a checkpoint may hold that the model does not
     * use (buffers such as attn.bias, a tied head stored twice); may be
     * NULL: none. */
    const char *hf_type;
    const char *hf_prefix;
    int (*hf_read)(const void *config, job_config *j, char *err, size_t err_len);
    void *(*hf_config)(const model *m);
    bool (*hf_ignore)(const model *m, const char *name);

    /* LoRA (lora.h), for kinds that offer it; lora_targets NULL for the
     * others.  lora_targets: the short Hugging Face names of the kind's
     * linear layers that may get adapters ([finetune] targets), NULL
     * ended; lora_default: PEFT's default for the model type, as a
     * targets value ("q_proj,v_proj"); lora_fan_in_fan_out: the Hugging
     * Face layers are Conv1D, stored (in,out) (PEFT's fan_in_fan_out). */
    const char *const *lora_targets;
    const char *lora_default;
    bool lora_fan_in_fan_out;
};

/* The kinds, in the registry's order; *n set to their number. */
const model_kind *const *model_kinds(size_t *n);
/* The kind a job asks for ([model] type); NULL when gradd has none by
 * that name. */
const model_kind *model_kind_of(const job_config *j);
/* The job's kind, or NULL with "FILE:LINE: [model] type: 'x' is not one
 * of ..." in err. */
const model_kind *model_kind_need(const job_config *j, char *err, size_t err_len);
/* Throughput's unit for the job; "samples" when its kind is unknown (a job
 * whose file could not be read at restart has none). */
const char *model_unit(const job_config *j);
/* Whether the job's model generates text (false when its kind is unknown). */
bool model_generates(const job_config *j);
/* Why a job that does not generate text cannot be sampled, for a message
 * that goes on "job N (NAME) ": "trains an mlp classifier; only gpt jobs
 * generate text". */
const char *model_why_no_text(const job_config *j, char *buf, size_t len);

/* The job file's checks that depend on its model: a kind gradd has, then
 * that kind's own.  Called right after jobcfg parses a file that is to be
 * run (submit, `gradd run`): jobcfg, shared with gradctl, does not know
 * which models this gradd has.  A job with [model] from first gets the
 * keys its file left out from the directory's config.json, and its
 * weights' headers are checked against the model (model_hf_fill,
 * model_hf_check).  0, or -1 with err. */
int model_check_job(job_config *j, char *err, size_t err_len);
/* "FILE:LINE: [section] key: why" into err; -1.  For check_job. */
int model_job_error(const job_config *j, const char *section, const char *key, const char *why, char *err,
                    size_t err_len);

/* A describe line (checkpoint metadata) back into j's [model] keys, for
 * sampling: 0, or -1 with err (a kind that does not generate, or a line
 * that names no model gradd can build). */
int model_parse_line(const char *line, job_config *j, char *err, size_t err_len);
/* m's describe line. */
void model_describe(const model *m, char *buf, size_t len);

/* ---- Hugging Face directories (model_hf.c) ------------------------------------------- */

/* The kind whose hf_type is config.json's model_type; NULL for none. */
const model_kind *model_kind_hf(const char *hf_type);
/* [model] from: the model's kind and the [model] keys the file left out
 * from DIR/config.json (read as the caller: the job's owner); a key the
 * file sets must agree ("FILE:LINE: [model] width: 768 but DIR/config.json
 * hidden_size is 1024").  Nothing to do without from.  Filling a job again
 * changes nothing, so the engine repeats it at run start.  0, or -1 with
 * err and j partly filled. */
int model_hf_fill(job_config *j, char *err, size_t err_len);
/* Whether [model] from is left for the job's start: the job runs after
 * others (inputs_later) and DIR/config.json does not exist yet; then it
 * sets inputs_missing, and model_check_job leaves the model for the job's
 * start. */
bool model_hf_later(job_config *j);
/* The directory's weights against the model j (filled) describes: every
 * tensor there with its shape and a dtype gradd reads, none left over;
 * headers only.  0, or -1 with err naming the file and tensor. */
int model_hf_check(const job_config *j, char *err, size_t err_len);
/* m's parameters from dir's weights into host memory params
 * (m->num_params floats), one tensor at a time.  0, or -1 with err. */
int model_hf_load(const model *m, const char *dir, float *params, char *err, size_t err_len);
/* m's config.json (its kind's hf_config) written atomically to path;
 * nothing for a kind without one.  0, or -1 with err. */
int model_hf_export_config(const model *m, const char *path, char *err, size_t err_len);

/* ---- models ----------------------------------------------------------------------- */

/* Create the model the job describes (shapes only; no device memory).
 * input_dim and classes come from the data (image kinds; ignored by the
 * others).  -1 with a message in err on an unknown kind or a bad shape. */
int model_create(const job_config *j, uint32_t input_dim, uint32_t classes, const kern_ops *k, kern_ctx *kc,
                 model **out, char *err, size_t err_len);
void model_destroy(model *m);

/* Between layers: poll, and true when the pass is to be abandoned. */
bool model_poll(model *m);
/* From a backward: grads[from, num_params) are final (see grads_final).
 * Nothing under LoRA, whose gradients are the adapters'. */
void model_grads_final(model *m, size_t from);

/* For the token models' activation_bytes: *fixed and *per_sample from the
 * bytes their carving takes for one sample and for two, where each of its
 * `buffers` buffers is rounded up to `align` bytes (affine in n but for
 * that rounding, which the fixed part bounds). */
void model_activation_split(size_t one, size_t two, size_t buffers, size_t align, size_t *fixed, size_t *per_sample);
/* A token model's loss over its logits, the cross-entropy's buffers:
 * the logits (logits16 on a 16-bit path), and for n tokens the losses,
 * the log-sum-exps, the weights of the losses' gradient (dlosses, device
 * memory) and their staging on the host. */
typedef struct {
    bool lp16;
    float *logits;
    uint16_t *logits16;
    float *lse, *losses, *dlosses, *host;
    int V;
} model_loss;
/* After the forward to the logits: the losses of n tokens with targets y,
 * their sum. */
double model_loss_forward(model *m, const model_loss *lo, const int32_t *y, size_t n);
/* The backward's start: every token's loss weighted by dloss, the logits
 * overwritten by their gradient (their last reader). */
void model_loss_backward(model *m, const model_loss *lo, const int32_t *y, size_t n, float dloss);
/* Training's forward and backward for a token model: `body` runs the
 * forward to the logits, `back` the backward from their gradient.  With
 * 16-bit logits and a fused cross-entropy, the loss and its gradient in one
 * pass over the logits, the losses read back only after the whole backward
 * is queued (the device does not wait for the host between the halves);
 * otherwise the model's forward and backward.  The sum of the losses; 0
 * when the pass was stopped. */
double model_forward_backward(model *m, const model_batch *b, float dloss, const model_loss *lo,
                              void (*body)(model *m, const model_batch *b),
                              void (*back)(model *m, const model_batch *b));
/* Σ of n per-token losses (device memory), on the host in a fixed order
 * through `host` (n floats): the same sum whatever the backend. */
double model_sum_losses(const model *m, const float *losses, float *host, size_t n);

/* Whether a token model stores its activations in 16 bits (kernels.h's
 * 16-bit activation ops): a bf16/fp16 job, not LoRA (whose GEMMs go through
 * lora.h in fp32 activations), on kernels whose 16-bit ops pay
 * (act16_native) and that have the GEMM and cross-entropy ones, unless
 * the environment says GRADD_ACT16=0 (a diagnostic switch, to compare the
 * two paths or to rule the 16-bit one out).  A model checks its own
 * layers' 16-bit ops besides. */
bool model_act16(const job_config *j, const kern_ops *k);
/* Its kernels' part, for a context in 16 bits (the op benchmarks' too). */
bool model_act16_kernels(const kern_ops *k);

/* Add a tensor to m's table (constructors use this). */
void model_add_tensor(model *m, const char *name, int ndim, const size_t *shape, bool decay, bool transpose_export);

/* A counter-based generator: deterministic, seekable, identical on every
 * machine (init must not depend on thread count or backend). */
uint64_t model_rand_u64(uint64_t seed, uint64_t i);
float model_rand_normal(uint64_t seed, uint64_t i);

#endif
