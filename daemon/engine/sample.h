/* sample.h — text from a trained GPT.
 *
 * Loads a GPT's weights into a CPU model and generates autoregressively
 * with the CPU kernels, one token at a time from the logits of the last
 * position: incrementally with a key/value cache (model_ops.decode_step)
 * while the sequence fits the context, then over the sliding window
 * (model_ops.forward_logits; see sample_generate in sample.c).  The
 * weights come from either file a job leaves in its output directory:
 *   model.safetensors   at the end: GPT-2 names, Conv1D matrices (in,out),
 *                       metadata gradd_model = "gpt layers=.. heads=.. ...";
 *   resume.safetensors  every checkpoint: one flat "params" tensor in the
 *                       model's own layout, metadata model = the same line;
 * so a running or cancelled job can be sampled from its last checkpoint.
 * The shape comes from that metadata line, read back by the model's kind
 * (model_parse_line; GPT-2 files do not record the number of heads); a
 * file without it, a model that does not generate, or weights of another shape
 * are refused with a message naming the file and the tensor or key.
 *
 * Memory is host memory (malloc), not a device pool: sampling is a short
 * CPU computation beside the pools' training jobs.  Everything is per
 * model, so several samplers may run at once on different threads.
 */
#ifndef GRADD_SAMPLE_H
#define GRADD_SAMPLE_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The most tokens one request may generate. */
#define SAMPLE_MAX_TOKENS 4096
#define SAMPLE_DEFAULT_TOKENS 200
#define SAMPLE_DEFAULT_TEMPERATURE 0.8

typedef struct sample_model sample_model;

typedef struct {
    const uint8_t *prompt; /* bytes; byte-level (vocab 256) models only */
    size_t prompt_len;
    uint32_t tokens;       /* to generate, 1..SAMPLE_MAX_TOKENS */
    double temperature;    /* >= 0; 0 always takes the most likely token */
    uint64_t seed;         /* with the same weights, the same seed gives the same tokens */
    int threads;           /* CPU threads for the kernels; 0: all cores */
    bool no_cache;         /* tests and timings only: no key/value cache, every token a
                            * forward_logits over the whole window (the same tokens, O(n²)) */
    /* Asked before each token (NULL: never): why to stop now (a time limit,
     * a client that left), or NULL to go on.  A generation holds a thread
     * and a core that other users' samples wait for. */
    const char *(*stop)(void *user);
    void *stop_user;
    const uint32_t *prompt_ids; /* or the prompt as token ids (any vocabulary), not with prompt */
    size_t prompt_ids_len;
} sample_opts;

typedef struct {
    uint32_t *ids;  /* the generated tokens (malloc'd), n of them */
    size_t n;
    uint8_t *text;  /* the same as bytes when vocab is 256, else NULL (malloc'd) */
} sample_output;

/* Load PATH (model.safetensors or resume.safetensors; told apart by their
 * metadata).  0, or -1 with err naming the file and what is wrong. */
int sample_load(const char *path, int threads, sample_model **out, char *err, size_t err_len);
/* The file a job's output directory offers: model.safetensors if it
 * exists, else resume.safetensors.  0 with the path in buf, or -1 with err
 * saying neither exists (checked with the caller's file access). */
int sample_pick_file(const char *out_dir, char *buf, size_t len, char *err, size_t err_len);
void sample_free(sample_model *m);

uint32_t sample_vocab(const sample_model *m);
uint32_t sample_context(const sample_model *m);
/* The training step of the weights (metadata "step"; 0 if absent). */
uint64_t sample_step(const sample_model *m);

/* Generate.  0, or -1 with err naming the bad option (e.g. a prompt for a
 * model that does not read bytes) or saying why o->stop stopped it, after
 * how many tokens.  Free out with sample_output_free. */
int sample_generate(sample_model *m, const sample_opts *o, sample_output *out, char *err, size_t err_len);
void sample_output_free(sample_output *out);

#endif
