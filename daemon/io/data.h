/* data.h — training data: token streams for `gpt`, images for `mlp`.
 *
 * Formats (every reader validates its whole file; errors are values):
 *   text   any file, one token per byte (vocab 256).  A directory is read as
 *          the concatenation, in strcmp order of the names, of its regular
 *          files (symlinks followed), skipping dotfiles and the names ending
 *          in ".dat" or ".u8" (the fortune(6) index files and the .u8 links
 *          to the text files), so /usr/share/games/fortunes works as is.
 *          Subdirectories are not entered.
 *   llmc   llm.c token file: 256 little-endian int32 (magic 20240520,
 *          version 1, token count), then count little-endian uint16 tokens;
 *          the file size must be exactly 1024 + 2 × count.
 *   npy    NumPy .npy v1.0/2.0/3.0, C order, little-endian; dtypes '<f4',
 *          '<i4', '<u2', '|u1'.  Tokens: 1-d '<u2', '<i4' or '|u1'.
 *          Images: (N, rows, cols) or (N, D), '|u1' or '<f4' (finite);
 *          labels: (N,), '|u1', '<u2' or '<i4'.
 *   idx    MNIST-style IDX, big-endian: images magic 0x00000803 (N, rows,
 *          cols) ubyte, labels magic 0x00000801 (N) ubyte; gzip'd or not
 *          (detected from the 1f 8b magic; trailing data after the gzip
 *          stream is an error, concatenated gzip members are read on).
 *
 * Tokens are held as uint16 (vocab ≤ 65536, as llm.c's format implies), or
 * as bytes where the file holds bytes (text, '|u1' npy): one copy of the
 * file's tokens, never a wider one.
 * Images are exposed as float32: ubyte pixels scaled by 1/255 into [0, 1];
 * '<f4' npy pixels are passed through unchanged.
 *
 * Sampling: a data_stream is an endless stream of samples.  Each epoch is a
 * permutation of the samples drawn from (seed, epoch) alone, so the stream
 * is a pure function of the seed, and its position is two integers (epoch,
 * index) that data_stream_state / data_stream_set_state save and restore
 * exactly.  A call to data_stream_next_* takes the next n samples, so a
 * batch of 16 and micro-batches of 5+5+5+1 see the same samples in the
 * same order.  Token samples are windows of T+1 tokens (inputs = the first
 * T, targets = the last T) at stride T, all shifted each epoch by one
 * pseudo-random offset in [0, T) so that windows do not always start at the
 * same places (to make room, an epoch has one window fewer than (n-1)/T
 * when the remainder is under T-1 tokens); image samples are single images.
 * A data_eval walks a validation/test set once, in order, unshuffled
 * (token windows at stride T from the start), and can be reset.
 *
 * Memory: loaded data lives in host memory owned by the structs here; the
 * batch functions write into caller-provided buffers and never allocate.
 * Files are read, not mapped: a mapping of a file its owner can truncate
 * or rewrite would let that user fault the daemon (SIGBUS) or slip tokens
 * past the vocab check.  A data_budget bounds a job's share: each load,
 * split and stream charges what it will hold before allocating it, and a
 * gzip'd file is held to the size its header declares.
 * Errors: functions returning int give 0, or -1 with a message in err that
 * starts with the file's path and names the offset/record/field involved.
 * Nothing here is thread-safe; one stream per thread.
 */
#ifndef GRADD_DATA_H
#define GRADD_DATA_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DATA_LLMC_MAGIC 20240520
#define DATA_LLMC_VERSION 1
#define DATA_LLMC_HEADER_BYTES 1024
#define DATA_IDX_IMAGES_MAGIC 0x00000803u
#define DATA_IDX_LABELS_MAGIC 0x00000801u
#define DATA_NPY_MAX_DIMS 8
#define DATA_SOURCE_MAX (PATH_MAX + 64)

/* ---- a job's host memory for data ----------------------------------------- */

typedef struct data_budget {
    uint64_t limit;  /* bytes the job's data may hold; 0: no bound */
    const char *key; /* how a refusal names the bound ("[daemon] max_job_data"); may be NULL */
    /* Bytes held now: every array the loads below keep (tokens, pixels,
     * labels, a stream's sample order), charged before it is allocated.
     * A load gives back what it held only for a while, and everything on
     * failure; the _free functions do not, so a budget serves one job's
     * data for its whole life. */
    uint64_t used;
    uint64_t peak; /* the most `used` reached, transient buffers included */
} data_budget;

/* ---- token streams -------------------------------------------------------- */

typedef enum {
    DATA_FMT_AUTO, /* a directory: text; llm.c or .npy magic: that; else by name:
                      *.bin llmc, *.npy npy, anything else text */
    DATA_FMT_TEXT,
    DATA_FMT_LLMC,
    DATA_FMT_NPY,
} data_format;

/* "auto", "text", "llmc", "npy" → *out; -1 for anything else. */
int data_format_parse(const char *name, data_format *out);

typedef struct data_tokens {
    uint16_t *tok; /* n tokens, or NULL when they are bytes ... */
    uint8_t *u8;   /* ... here (text, '|u1' npy): exactly one of the two is set */
    size_t n;
    uint32_t max_token;               /* the largest token present */
    char source[DATA_SOURCE_MAX];     /* the path, for messages */
    /* where token i lies in the file, for messages: data_offset + i × elem_size */
    uint64_t data_offset;
    unsigned elem_size;
} data_tokens;

static inline uint32_t data_token(const data_tokens *t, size_t i)
{
    return t->u8 ? t->u8[i] : t->tok[i];
}

/* Load a token stream.  vocab > 0 also checks every token < vocab.
 * An empty stream is an error.  On failure *t is left zeroed.  budget
 * (may be NULL: no bound, no count) is charged with what *t holds. */
int data_tokens_load(data_tokens *t, const char *path, data_format fmt, uint32_t vocab,
                     data_budget *budget, char *err, size_t err_len);
/* Every token < vocab, or an error naming the first that is not. */
int data_tokens_check_vocab(const data_tokens *t, uint32_t vocab, char *err, size_t err_len);
/* Hold out the last `fraction` (0 < fraction < 1) of *train as *val (a copy);
 * *train keeps the rest and gives back the memory of the tail.  Both must
 * end up non-empty. */
int data_tokens_split(data_tokens *train, data_tokens *val, double fraction, data_budget *budget,
                      char *err, size_t err_len);
void data_tokens_free(data_tokens *t);

/* ---- images --------------------------------------------------------------- */

typedef struct data_images {
    size_t n, rows, cols, dim;  /* dim = rows × cols floats per image; (N, D) npy: rows 1 */
    uint32_t classes;           /* as given, or max label + 1 */
    int32_t *labels;            /* n */
    uint8_t *u8;                /* n × dim pixels, or NULL ... */
    float *f32;                 /* ... n × dim floats (from '<f4' npy) */
    char source[DATA_SOURCE_MAX]; /* the images path */
} data_images;

/* Load images and labels; each file is IDX (gzip'd or not) or .npy, told
 * apart by its magic.  classes > 0 checks every label < classes (else
 * classes = max label + 1).  limit > 0 keeps only the first `limit` samples
 * (both files are still read and validated in full).  budget as for
 * data_tokens_load. */
int data_images_load(data_images *d, const char *images_path, const char *labels_path,
                     uint32_t classes, size_t limit, data_budget *budget, char *err, size_t err_len);
/* Image i as dim floats. */
void data_images_get(const data_images *d, size_t i, float *out);
void data_images_free(data_images *d);

/* ---- generic .npy --------------------------------------------------------- */

typedef enum { DATA_U8, DATA_U16, DATA_I32, DATA_F32 } data_dtype; /* |u1 <u2 <i4 <f4 */

typedef struct data_npy {
    data_dtype dtype;
    int ndim;
    uint64_t shape[DATA_NPY_MAX_DIMS];
    uint64_t count;       /* product of shape (1 for a 0-d array) */
    uint64_t data_offset; /* where the data starts in the file */
    void *data;           /* count elements, host byte order */
} data_npy;

int data_npy_load(data_npy *a, const char *path, data_budget *budget, char *err, size_t err_len);
void data_npy_free(data_npy *a);

/* ---- the shuffled training stream ---------------------------------------- */

typedef struct data_stream {
    /* private: use the functions */
    const data_tokens *tokens;
    const data_images *images;
    size_t T;
    uint64_t seed;
    uint64_t epoch, index;
    uint64_t size;       /* samples per epoch */
    uint64_t max_offset; /* token windows: per-epoch shift in [0, max_offset] */
    uint64_t offset;
    uint64_t *order;     /* size entries: this epoch's permutation */
} data_stream;

/* Windows of T+1 tokens; needs t->n >= T + 1.  t must outlive the stream.
 * The sample order (8 bytes a sample) is charged to budget (may be NULL). */
int data_stream_tokens(data_stream *s, const data_tokens *t, size_t T, uint64_t seed,
                       data_budget *budget, char *err, size_t err_len);
/* Single images; d must outlive the stream. */
int data_stream_images(data_stream *s, const data_images *d, uint64_t seed, data_budget *budget,
                       char *err, size_t err_len);
uint64_t data_stream_epoch_size(const data_stream *s);
/* The position of the next sample: sample `index` of epoch `epoch`. */
void data_stream_state(const data_stream *s, uint64_t *epoch, uint64_t *index);
/* Restore a saved position; index must be < the epoch size. */
int data_stream_set_state(data_stream *s, uint64_t epoch, uint64_t index, char *err,
                          size_t err_len);
/* The next n samples: inputs and targets are n × T int32 each. */
void data_stream_next_tokens(data_stream *s, size_t n, int32_t *inputs, int32_t *targets);
/* The next n samples: x is n × dim floats, y n labels. */
void data_stream_next_images(data_stream *s, size_t n, float *x, int32_t *y);
void data_stream_free(data_stream *s);

/* ---- sequential evaluation ----------------------------------------------- */

typedef struct data_eval {
    const data_tokens *tokens;
    const data_images *images;
    size_t T;
    uint64_t pos;  /* next sample */
    uint64_t size; /* samples in one pass: (n - 1) / T windows, or n images */
} data_eval;

int data_eval_tokens(data_eval *e, const data_tokens *t, size_t T, char *err, size_t err_len);
void data_eval_images(data_eval *e, const data_images *d);
/* Up to max samples; returns how many were written, 0 once the pass is done. */
size_t data_eval_next_tokens(data_eval *e, size_t max, int32_t *inputs, int32_t *targets);
size_t data_eval_next_images(data_eval *e, size_t max, float *x, int32_t *y);
void data_eval_reset(data_eval *e);

#endif
