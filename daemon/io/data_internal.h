/* data_internal.h — what the data readers share, for the io/data*.c files
 * only; everything else uses data.h.
 *
 * Layout of the data module:
 *   data.c       the sequential file reader (data_src), format detection,
 *                token and image datasets, sample streams, evaluation
 *   data_text.c  text: one token per byte, a file or a directory
 *   data_llmc.c  llm.c token files
 *   data_npy.c   .npy arrays, and their checks as tokens, images, labels
 *   data_idx.c   IDX images and labels, gzip'd or not
 *   data_jsonl.c fine-tuning samples (JSON Lines), their shift and rows
 */
#ifndef GRADD_DATA_INTERNAL_H
#define GRADD_DATA_INTERNAL_H

#include "data.h"

#include <string.h>
#include <sys/types.h>
#include <zlib.h>

#define DATA_CHUNK (64u << 10) /* read and buffer growth unit */

typedef unsigned long long ull;

/* "PATH: out of memory" into err; returns -1. */
int data_oom(const char *path, char *err, size_t err_len);

/* Charge bytes to b (NULL: nothing to do) before allocating them; -1 with
 * err naming path, the size and the bound when it would pass b->limit. */
int data_budget_take(data_budget *b, uint64_t bytes, const char *path, char *err, size_t err_len);
void data_budget_give(data_budget *b, uint64_t bytes);
/* What b still allows (UINT64_MAX: no bound). */
uint64_t data_budget_room(const data_budget *b);

static inline uint32_t data_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline bool data_host_le(void)
{
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/* ---- a file, read sequentially, gunzipped where it is gzip (data.c) ------ */

typedef struct {
    const char *path;
    int fd;
    uint64_t size;     /* st_size */
    bool gz;
    bool zinit;
    bool member_done;  /* the last gzip member ended; more input must be a new member */
    bool fd_eof;
    z_stream z;
    unsigned char *in;
    uint64_t raw_used; /* compressed bytes consumed by inflate before z.next_in */
    uint64_t out;      /* bytes delivered so far (after gunzip) */
    bool failed;       /* data_src_read reported an error */
} data_src;

/* A regular file; gz_ok: gunzip it when it starts with the gzip magic. */
int data_src_open(data_src *s, const char *path, bool gz_ok, char *err, size_t err_len);
void data_src_close(data_src *s);
/* Up to n bytes; fewer only at the end of the data.  -1 on error. */
ssize_t data_src_read(data_src *s, void *buf, size_t n, char *err, size_t err_len);
/* Read and discard the rest; *rest = how many bytes there were. */
int data_src_drain(data_src *s, uint64_t *rest, char *err, size_t err_len);
/* As data_src_drain, but reads no more than DATA_CHUNK bytes, so that a
 * gzip stream that goes on past its declared size is not inflated to its
 * end: *rest = the bytes found, or DATA_CHUNK + 1 when there were more. */
int data_src_drain_some(data_src *s, uint64_t *rest, char *err, size_t err_len);
/* After an error in the content of a gzip'd file: if the gzip stream itself
 * is damaged further on, that is the real cause, so report it instead. */
void data_src_blame_gzip(data_src *s, char *err, size_t err_len);
/* Read `total` bytes, keeping the first `keep` (≤ total) in a new buffer;
 * *got = bytes that were there (< total: the data ended early). */
int data_src_read_body(data_src *s, uint64_t total, uint64_t keep, unsigned char **out,
                       uint64_t *got, char *err, size_t err_len);

/* The next sample's number within the data; moves the position on (data.c). */
uint64_t data_stream_take(data_stream *s);

/* ---- the formats ------------------------------------------------------------ */

/* Each loader fills *t (tok or u8, n, data_offset, elem_size) or fails with
 * *t's fields unset; data_tokens_load does the rest.  Each charges b with
 * what it keeps, and gives everything back when it fails. */
int data_text_load(data_tokens *t, const char *path, bool is_dir, data_budget *b, char *err,
                   size_t err_len);
int data_llmc_load(data_tokens *t, const char *path, data_budget *b, char *err, size_t err_len);
int data_npy_tokens_load(data_tokens *t, const char *path, data_budget *b, char *err,
                         size_t err_len);

/* Images into d (n, rows, cols, and u8 or f32): the first `limit` (0: all)
 * of the *total the file holds. */
int data_npy_images_load(data_images *d, const char *path, uint64_t limit, uint64_t *total,
                         data_budget *b, char *err, size_t err_len);
int data_idx_images_load(data_images *d, const char *path, uint64_t limit, uint64_t *total,
                         data_budget *b, char *err, size_t err_len);
/* All of a file's labels as a 1-d integer array (IDX: '|u1'); on failure
 * *a is zeroed. */
int data_npy_labels_load(data_npy *a, const char *path, data_budget *b, char *err,
                         size_t err_len);
int data_idx_labels_load(data_npy *a, const char *path, data_budget *b, char *err,
                         size_t err_len);

/* ---- .npy dtypes (data_npy.c) ------------------------------------------------ */

unsigned data_dtype_size(data_dtype t);
const char *data_dtype_name(data_dtype t); /* the descr: "<f4", ... */

/* Element i of an integer array; -1 for a float one. */
static inline int64_t data_npy_int(const data_npy *a, uint64_t i)
{
    switch (a->dtype) {
    case DATA_U8:
        return ((const uint8_t *)a->data)[i];
    case DATA_U16:
        return ((const uint16_t *)a->data)[i];
    case DATA_I32:
        return ((const int32_t *)a->data)[i];
    default:
        return -1;
    }
}

#endif
