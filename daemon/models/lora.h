/* lora.h — low-rank adapters (LoRA) on a frozen base, and the base's GEMMs.
 *
 * With [finetune] method = lora a model trains adapters only: each targeted
 * linear layer y = x·Wᵀ becomes y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ, s = alpha / rank,
 * with A (rank,in) and B (out,rank) in fp32, trained by AdamW.  A starts
 * as PEFT's (Kaiming-uniform with a = √5, i.e. U(-1/√in, 1/√in)) and B at
 * zero, so the first forward is the base model's.
 *
 * The base is frozen: no gradient and no optimizer state, and it is held
 * once, in the precision its kernels read.  In an fp32 context that is
 * m->params.  In a bf16/fp16 context it is m->params16 alone (m->params
 * NULL), the 16-bit buffer laid out as the full table (the GEMM weights are
 * where the full model has them), and the few tensors the model's kernels
 * read in fp32 (norm weights, biases, a position embedding: what the model
 * names with lora_keep32) also widened once into the adapters' `base32`.
 * The pool tags the base `frozen`.
 *
 * A kind that offers LoRA names its layers (model_kind.lora_targets); its
 * create calls lora_create after its own tensor table, lora_site for each
 * linear layer (and lora_keep32 for each fp32-read tensor), then
 * lora_finish.  Its forward and backward run every GEMM of a base weight
 * through lora_linear_forward / lora_linear_backward, which also add the
 * adapters of that GEMM's sites: several sites may share one GEMM (llama's
 * q, k and v projections are one GEMM over the three weights), each adding
 * into its own columns of the output rows.  The same calls serve full
 * fine-tuning (m->lora NULL): the plain matmul ops, unchanged.
 *
 * With [finetune] dropout p, a training pass (model.dropout.on) feeds each
 * site's adapters its input after inverted dropout, y = x·Wᵀ + s·(D(x)·Aᵀ)·Bᵀ
 * with a mask of its own per site, as PEFT's lora_dropout.  The mask is
 * drawn, not stored: the backward draws it again (kern_ops.dropout).  Site
 * s's stream is model_rand_u64(model.dropout.seed, s.key), and its input's
 * element (row, c) of a micro-batch is number
 * (model.dropout.first·T + row)·in + c in it: the mask is the same
 * whatever the micro-batch, the rank, or recompute.
 *
 * The adapters' tensors carry PEFT's names ("base_model.model." + the
 * Hugging Face module + ".lora_A.weight"), so adapter_model.safetensors is
 * written from the table as it is.
 */
#ifndef GRADD_LORA_H
#define GRADD_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

#define LORA_MAX_SITES 1024
#define LORA_MAX_KEEP32 1024

typedef struct {
    char module[96]; /* the Hugging Face module: "model.layers.3.self_attn.q_proj" */
    int target;      /* its short name's index in the kind's lora_targets */
    int in, out;     /* the weight (out,in) */
    int ld, col;     /* its output: columns col..col+out of rows of ld floats in the GEMM */
    size_t w;        /* its weight's offset (floats) in the full table, for merging */
    size_t a, b;     /* A's and B's offsets (floats) in the adapters */
    uint64_t key;    /* its dropout stream within a step's: FNV-1a 64 of `module` */
} lora_site_t;

struct lora {
    uint32_t rank;
    float alpha, scale; /* scale = alpha / rank */
    double dropout;     /* training drops each site's input elements at this rate (model.dropout) */
    unsigned targets;   /* bit t: the kind's lora_targets[t] gets adapters */
    bool base16;        /* the base is held in 16 bits: the job's precision is bf16 or fp16 */
    bool bf16;          /* ... and which of the two */
    int nsites;         /* the targeted layers */
    lora_site_t site[LORA_MAX_SITES];
    /* The adapters' table: for each site A then B, offsets in floats. */
    int ntensors;
    model_tensor tensors[2 * LORA_MAX_SITES];
    size_t num_params;
    float *params, *grads; /* device memory, num_params floats each (the trainer's) */
    /* The fp32-read base tensors (lora_keep32) when the base is 16-bit:
     * their offsets in the full table and in base32, n32 floats in all. */
    int nkeep;
    size_t keep_off[LORA_MAX_KEEP32], keep_at[LORA_MAX_KEEP32], keep_n[LORA_MAX_KEEP32];
    size_t n32;
    float *base32; /* device memory, n32 floats (the trainer's, tagged frozen); NULL for an fp32 base */
    /* Scratch inside the activations (lora_bind), for GEMMs of up to `rows` rows. */
    size_t rows;
    float *u, *g, *t; /* (rows,rank) ×2, (rows,max of in and out) */
    uint16_t *x16;    /* (rows,max in): a GEMM input rounded, for a 16-bit base */
    float *xd;        /* (rows,max in): a site's input after dropout; NULL without dropout */
};

/* [finetune] targets (empty: the kind's lora_default) as a bit set of the
 * kind's lora_targets: comma-separated names, blanks around them ignored,
 * each named once.  0, or -1 with why ("'x' is not one of a, b", "'a' is
 * named twice").  The one reading of the key: submit's check and the
 * model's adapters. */
int lora_parse_targets(const model_kind *kd, const char *list, unsigned *bits, char *why, size_t why_len);
/* m->lora for the job: left NULL for full fine-tuning, else the adapters'
 * settings ([finetune] rank, alpha, targets or the kind's lora_default)
 * and the precision the base is held in.  After the kind's own tensor
 * table.  0, or -1 with err. */
int lora_create(model *m, const job_config *j, char *err, size_t err_len);
/* A linear layer: its Hugging Face module name, its short name (one of the
 * kind's lora_targets), its weight (out,in), and where its output lies in
 * the GEMM that computes it (columns col..col+out of rows of ld).  The site
 * (>= 0) when the job's targets name it, -1 when not or without LoRA. */
int lora_site(model *m, const char *module, const char *target, int in, int out, int ld, int col);
/* A base tensor the model's kernels read in fp32 (offset in floats into
 * the full table, numel floats); nothing without LoRA. */
void lora_keep32(model *m, size_t offset, size_t numel);
/* After the sites: the adapters' table.  0, or -1 with err (a target that
 * names no layer of the model, a rank above a targeted layer's smaller
 * side). */
int lora_finish(model *m, char *err, size_t err_len);
void lora_destroy(model *m);

/* An fp32 base tensor at offset off, as the kernels read it: m->params +
 * off, or its widened copy for a 16-bit base. */
const float *lora_base32(const model *m, size_t off);

/* Scratch bytes for GEMMs of up to `rows` rows (in the model's activations;
 * 0 without LoRA), and where it is. */
size_t lora_scratch_bytes(const model *m, size_t rows);
void lora_bind(model *m, void *mem, size_t rows);

/* No bias, for lora_linear_*'s b. */
#define LORA_NO_BIAS ((size_t)-1)
/* out (N,OC) = inp (N,C)·Wᵀ + bias for the base weight W (OC,C) at offset
 * w and the bias (OC) at offset b (floats, into the full table; b may be
 * LORA_NO_BIAS), from whichever form the base is held in (a bias is read
 * through lora_base32: the model keeps it), plus the adapters of `sites`
 * (n of them; -1 entries skipped). */
void lora_linear_forward(model *m, float *out, const float *inp, size_t w, size_t b, const int *sites, int n, int N,
                         int C, int OC);
/* Its backward: dinp (N,C) = dout·W + the adapters' share (overwritten;
 * NULL: not needed), W's and the bias's gradients (m->grads + w, + b) +=
 * when the base trains, each site's dA and dB +=. */
void lora_linear_backward(model *m, float *dinp, const float *dout, const float *inp, size_t w, size_t b,
                          const int *sites, int n, int N, int C, int OC);

/* The adapters' starting values into host memory (num_params floats):
 * A as PEFT draws it, from the seed; B zero. */
void lora_init(const model *m, float *adapters, uint64_t seed);
/* The merged model, on the host: params (the full table, m->num_params
 * floats) W += scale·B·A at each site. */
void lora_merge(const model *m, float *params, const float *adapters);
/* "lora r=8 alpha=16 targets=q_proj,v_proj", for the model's describe
 * line (a resume must find the same adapters) and the levers. */
void lora_describe(const model *m, char *buf, size_t len);
/* PEFT's adapter_config.json for m as a new jansson reference (void, as
 * model.h's hf_config); base: base_model_name_or_path (the [model] from
 * directory, or ""). NULL when out of memory. */
void *lora_peft_config(const model *m, const char *base);

#endif
