/* hf.h — Hugging Face model directories: config.json, and the weights in
 * model.safetensors or in the shards that model.safetensors.index.json
 * lists.
 *
 * This layer knows files, not models: the caller (models/model_hf.c) says
 * which tensors it wants, under which names and shapes, and which of the
 * rest it may ignore.  Opening checks every header against that list
 * without reading any data, so a job can be refused at submit; reading
 * then converts one tensor at a time into the caller's fp32 buffer, so
 * memory stays bounded by the largest tensor beyond the parameters.
 *
 * Every message names the file (DIR/FILE) and, where one is involved, the
 * tensor or the JSON key.
 */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HF_CONFIG "config.json"
#define HF_WEIGHTS "model.safetensors"
#define HF_INDEX "model.safetensors.index.json"
/* Largest config.json or index accepted, in bytes. */
#define HF_MAX_JSON (16u << 20)
/* Most shards an index may name. */
#define HF_MAX_SHARDS 4096
#define HF_MAX_DIMS 4

/* config.json of dir, as a JSON object: 0 with *out a new reference, or
 * -1 with "DIR/config.json: why" in err. */
int hf_config_read(const char *dir, json_t **out, char *err, size_t err_len);
/* The same for text already read; path names it in messages. */
int hf_config_parse(const char *text, size_t len, const char *path, json_t **out, char *err, size_t err_len);

/* An index's weight_map: tensor name -> shard file name, in file order. */
typedef struct {
    size_t n;
    char **tensor, **shard;
} hf_index;

/* Parse model.safetensors.index.json's text (path names it in messages):
 * an object with a "weight_map" object of strings, each a plain file name
 * in the same directory (no '/', not "." or ".."), no tensor twice.  0, or
 * -1 with err. */
int hf_index_parse(const char *text, size_t len, const char *path, hf_index *out, char *err, size_t err_len);
void hf_index_free(hf_index *ix);

/* One tensor the caller wants, with its shape as stored in the files.
 * transpose: the file holds a 2-D matrix that the caller keeps the other
 * way round (GPT-2's Conv1D); the shape here is the file's. */
typedef struct {
    const char *name;
    int ndim;
    uint64_t shape[HF_MAX_DIMS];
    bool transpose;
} hf_want;

typedef struct hf_weights hf_weights;

/* Open dir's weights and match them to want[0..n): each is found by its
 * name, else by prefix (may be NULL) + name; its dtype must be F32, BF16 or
 * F16 and its shape want's.  Every other tensor in the files must be one
 * that ignore(user, name) excuses (asked with the name as stored, and
 * again without the prefix when it has one; ignore may be NULL).  An index
 * must name existing shards, each tensor must be in the shard it names,
 * and no tensor may be in two files.  `expect` says where the expected
 * shapes come from, for messages ("config.json").  0 with *out, or -1 with
 * err naming the file and tensor. */
int hf_weights_open(const char *dir, const hf_want *want, size_t n, const char *prefix,
                    bool (*ignore)(void *user, const char *name), void *user, const char *expect, hf_weights **out,
                    char *err, size_t err_len);
/* want[i]'s data as fp32 (exact for every accepted dtype) into dst, which
 * holds its element count: transposed where want[i] says.  0, or -1 with
 * err (an I/O error, a file changed since it was opened). */
int hf_weights_read(hf_weights *w, size_t i, float *dst, char *err, size_t err_len);
void hf_weights_close(hf_weights *w);

/* Write obj to path as indented JSON, atomically: a temporary file beside
 * it, fsync, rename over path, fsync of the directory.  0, or -1 with
 * "PATH: why" in err and path untouched. */
int hf_write_json(const char *path, const json_t *obj, char *err, size_t err_len);

/* IEEE half and bfloat16 bit patterns to float, exactly. */
float hf_f16_to_f32(uint16_t h);
float hf_bf16_to_f32(uint16_t b);
