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
 *   jsonl  fine-tuning samples, JSON Lines (gzip'd or not): each non-empty
 *          line an object {"input_ids": [...], "labels": [...]}, see the
 *          fine-tuning section below; *.jsonl when the format is auto.
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
    DATA_FMT_JSONL, /* samples (data_sft_load), not a token stream */
} data_format;

/* "auto", "text", "llmc", "npy", "jsonl" → *out; -1 for anything else. */
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

/* ---- fine-tuning samples (jsonl) ------------------------------------------ *
 *
 * One sample a line: {"input_ids": [int, ...], "labels": [int, ...]}.
 * labels may be left out (then labels = input_ids: every token is
 * learnt); a label is -100 (ignored, Hugging Face's convention: a prompt
 * token) or a token below vocab.  "attention_mask", when present, must be
 * all 1s: padding inside a sample has no meaning here (rows are padded by
 * the trainer).  Other keys are ignored.  Blank lines are skipped.
 *
 * The shift: a sample of n tokens is trained as inputs x[t] = input_ids[t]
 * (t < n) and targets y[t] = labels[t+1] (t < n-1), y[n-1] = -100: the
 * logits at t predict token t+1, as transformers shifts logits[:, :-1]
 * against labels[:, 1:].  labels[0] is never a target.  A sample so takes
 * n positions of a sequence, and fits one of [model] context T when
 * n <= T; a longer one is refused (its line named) or, with truncate,
 * cut to its first T tokens.  A sample with no labelled target after the
 * shift (and the cut) is refused, naming its line: it would train nothing,
 * and every step's loss then averages over at least one token.
 *
 * Held compactly: the tokens as int32 back to back, the labels as one bit
 * a token (labelled or -100), and int32 labels only when some label is
 * neither -100 nor its own token; 8 + 4 bytes a sample for where it starts
 * and how many targets it has.  The file is read a line at a time (the
 * longest line is held, charged to the budget while it is), never whole. */
typedef struct data_sft {
    int32_t *ids;      /* ntok tokens, sample i at off[i] .. off[i+1] */
    uint8_t *mask;     /* bit t (t's byte t/8, bit t%8): token t is labelled */
    int32_t *labels;   /* NULL: a labelled token's label is its id; else ntok labels */
    uint64_t *off;     /* n + 1 */
    uint32_t *targets; /* n: sample i's labelled targets after the shift */
    size_t n;
    uint64_t ntok, ntargets;
    bool view;           /* a tail of another's arrays (data_sft_split): free releases nothing */
    char source[DATA_SOURCE_MAX];
} data_sft;

/* Whether fmt, or for auto the path's name (*.jsonl), says jsonl. */
bool data_is_jsonl(data_format fmt, const char *path);
/* Load and check every line (errors "PATH:LINE: field: why"): ids and
 * labels below vocab, at most context tokens a sample unless truncate.
 * On failure *d is zeroed and budget (may be NULL) holds nothing more. */
int data_sft_load(data_sft *d, const char *path, uint32_t vocab, uint32_t context, bool truncate,
                  data_budget *budget, char *err, size_t err_len);
/* Hold out the last `fraction` (0 < fraction < 1) of the samples as *val,
 * a view of *train's arrays (no copy); both must end up non-empty. */
int data_sft_split(data_sft *train, data_sft *val, double fraction, char *err, size_t err_len);
/* Tokens of sample i. */
static inline uint32_t data_sft_len(const data_sft *d, size_t i)
{
    return (uint32_t)(d->off[i + 1] - d->off[i]);
}
/* The shift (above): sample i's inputs into x and targets into y,
 * data_sft_len(d, i) of each. */
void data_sft_shift(const data_sft *d, size_t i, int32_t *x, int32_t *y);
void data_sft_free(data_sft *d);

/* Samples laid into rows of T tokens, for one micro-batch: x and y (rows,
 * T) int32; with pack, pos and start (rows, T) too (model.h's
 * model_batch), and samples share a row: each goes into the last row when
 * it fits after what is there, else starts a new one.  Without pack, one
 * sample a row.  The rest of a row is padding: token 0, target -100,
 * position 0, its own start (it sees only itself; with causal attention
 * no real token sees it).  Buffers for as many rows as samples suffice. */
typedef struct data_rows {
    int32_t *x, *y, *pos, *start; /* pos, start: NULL without pack */
    size_t T;
    bool pack;
    uint32_t rows;     /* rows begun */
    size_t used;       /* tokens in the last row */
    uint64_t targets;  /* labelled targets of the samples laid */
    uint64_t tokens;   /* tokens of the samples laid (no padding) */
} data_rows;

void data_rows_begin(data_rows *r, int32_t *x, int32_t *y, int32_t *pos, int32_t *start, size_t T, bool pack);
/* Lay sample i (data_sft_len(d, i) <= T). */
void data_rows_add(data_rows *r, const data_sft *d, size_t i);
/* Pad the last row; the number of rows. */
uint32_t data_rows_end(data_rows *r);

/* ---- the shuffled training stream ---------------------------------------- */

typedef struct data_stream {
    /* private: use the functions */
    const data_tokens *tokens;
    const data_images *images;
    const data_sft *sft;
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
/* Fine-tuning samples, one at a time; d must outlive the stream. */
int data_stream_sft(data_stream *s, const data_sft *d, uint64_t seed, data_budget *budget, char *err,
                    size_t err_len);
uint64_t data_stream_epoch_size(const data_stream *s);
/* The position of the next sample: sample `index` of epoch `epoch`. */
void data_stream_state(const data_stream *s, uint64_t *epoch, uint64_t *index);
/* Restore a saved position; index must be < the epoch size. */
int data_stream_set_state(data_stream *s, uint64_t epoch, uint64_t index, char *err,
                          size_t err_len);
/* Pass over the next n samples, as taking them would (into later epochs
 * as need be): the samples of a step that other ranks train. */
void data_stream_skip(data_stream *s, uint64_t n);
/* The next n samples: inputs and targets are n × T int32 each. */
void data_stream_next_tokens(data_stream *s, size_t n, int32_t *inputs, int32_t *targets);
/* The next n samples: x is n × dim floats, y n labels. */
void data_stream_next_images(data_stream *s, size_t n, float *x, int32_t *y);
/* The next n samples into rows (begun by the caller, ended here): the
 * number of rows. */
uint32_t data_stream_next_sft(data_stream *s, size_t n, data_rows *r);
/* The labelled targets and the tokens of the next n samples, leaving the
 * position where it is: what a step's loss averages over, known before
 * its first micro-batch. */
void data_stream_sft_count(data_stream *s, size_t n, uint64_t *targets, uint64_t *tokens);
void data_stream_free(data_stream *s);

/* ---- sequential evaluation ----------------------------------------------- */

typedef struct data_eval {
    const data_tokens *tokens;
    const data_images *images;
    const data_sft *sft;
    size_t T;
    uint64_t pos;  /* next sample */
    uint64_t size; /* samples in one pass: (n - 1) / T windows, or n images */
} data_eval;

int data_eval_tokens(data_eval *e, const data_tokens *t, size_t T, char *err, size_t err_len);
void data_eval_images(data_eval *e, const data_images *d);
void data_eval_sft(data_eval *e, const data_sft *d);
/* Up to max samples; returns how many were written, 0 once the pass is done. */
size_t data_eval_next_tokens(data_eval *e, size_t max, int32_t *inputs, int32_t *targets);
size_t data_eval_next_images(data_eval *e, size_t max, float *x, int32_t *y);
/* Up to max samples into rows (begun by the caller, ended here); returns
 * how many samples, 0 once the pass is done. */
size_t data_eval_next_sft(data_eval *e, size_t max, data_rows *r);
void data_eval_reset(data_eval *e);
/* The pass from sample pos on (a rank's share of it); past the end: done. */
void data_eval_seek(data_eval *e, uint64_t pos);

#endif
