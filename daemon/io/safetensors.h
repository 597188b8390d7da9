/* safetensors.h — reading and writing the safetensors format.
 *
 * Layout of a file:
 *   8 bytes   N, the header length, unsigned little-endian
 *   N bytes   JSON header, UTF-8:
 *               {"__metadata__": {"key": "value", ...},
 *                "name": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]},
 *                ...}
 *             padded with spaces so that 8 + N is a multiple of 8
 *   the rest  raw little-endian tensor data; data_offsets are relative to
 *             the first byte after the header
 *
 * The same format carries model.safetensors (GPT-2-style names) and the
 * resume checkpoint (parameters, optimizer moments, and metadata strings for
 * step, RNG state and data position).
 *
 * The header's JSON is read and written by jansson; its integers are signed
 * 64-bit, so no dimension or offset exceeds 2^63 - 1.
 *
 * Writer (st_write.c): collect tensors (host pointers, not copied: they must
 * stay valid until st_write_atomic returns) and metadata, then
 * st_write_atomic writes PATH.tmp.PID, fsyncs it, renames it over PATH and
 * fsyncs the directory, so PATH always holds either the old file or the
 * complete new one.  Tensors are laid out contiguously in header order; the
 * writer orders them by element size, largest first (stable otherwise), so
 * that every tensor's data is aligned to its element size in the file and
 * in a mapping of it.
 *
 * Reader (safetensors.c): st_open validates the whole header strictly before
 * returning: header length within limits and within the file, strict JSON
 * (RFC 8259, as jansson reads it) with an object at the top, valid UTF-8, no
 * duplicate keys at any level, no NUL in strings, no unknown fields, shapes
 * and offsets of integers from 0 to 2^63 - 1, known dtypes, shape × element
 * size == data_offsets length, offsets in order, contiguous from 0 to the
 * end of the file with no gap or overlap, and nothing but whitespace after
 * the JSON.  Every message names the file and, where one is involved, the
 * tensor and the field, e.g.
 *   ckpt/resume.safetensors: tensor 'h.0.attn.c_attn.weight': data_offsets
 *   [0,100] do not match shape [3,4] of F32 (48 bytes)
 *
 * st_dtype.c holds what both share: dtypes, shape arithmetic, and names and
 * shapes in messages.
 *
 * Errors are reported through (err, err_len): a NUL-terminated message,
 * truncated to fit.  err may be NULL when err_len is 0.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8
/* Largest header accepted or written, in bytes. */
#define ST_MAX_HEADER (100u << 20)

typedef enum {
    ST_BOOL,
    ST_U8,
    ST_I8,
    ST_F8_E5M2,
    ST_F8_E4M3,
    ST_U16,
    ST_I16,
    ST_F16,
    ST_BF16,
    ST_U32,
    ST_I32,
    ST_F32,
    ST_U64,
    ST_I64,
    ST_F64,
    ST_DTYPE_COUNT
} st_dtype;

/* "F32", "BF16", ...; NULL for an out-of-range value. */
const char *st_dtype_name(st_dtype d);
/* Bytes per element; 0 for an out-of-range value. */
size_t st_dtype_size(st_dtype d);
/* Parse a dtype name (exact, case-sensitive); -1 if unknown. */
int st_dtype_from_name(const char *name, st_dtype *out);

/* For messages about tensors, shared by the reader and the writer: NAME made
 * safe to quote (control bytes, quotes, backslashes and, in invalid UTF-8,
 * high bytes become \xNN; long names are cut at a character boundary and
 * end in "...") into buf, which is returned; a shape as "[3,4]". */
const char *st_quote(char *buf, size_t cap, const char *name);
void st_shape_str(char *buf, size_t cap, int ndim, const uint64_t *shape);
/* Elements and bytes of a tensor of that shape and element size; false
 * (nothing set) when either overflows 64 bits. */
bool st_shape_bytes(int ndim, const uint64_t *shape, size_t elem, uint64_t *nelem,
                    uint64_t *bytes);

/* ---- writer -------------------------------------------------------------- */

typedef struct st_writer st_writer;

/* NULL only when out of memory. */
st_writer *st_writer_new(void);
void st_writer_free(st_writer *w);

/* Add a tensor.  name: non-empty UTF-8 without NUL, not "__metadata__",
 * unique in the file.  ndim 0..ST_MAX_DIMS (0 is a scalar of one element);
 * a dimension may be 0 (an empty tensor).  bytes must equal the product of
 * shape times st_dtype_size(dtype); data may be NULL only when bytes is 0.
 * The data is read by st_write_atomic, not now.
 * Returns 0, or -1 with a message in err; the first such error is also kept
 * by the writer, which then refuses to write (so callers may check once, at
 * st_write_atomic). */
int st_writer_add(st_writer *w, const char *name, st_dtype dtype, int ndim,
                  const uint64_t *shape, const void *data, size_t bytes, char *err,
                  size_t err_len);

/* Add a metadata entry (both UTF-8, key unique).  Same error contract. */
int st_writer_meta(st_writer *w, const char *key, const char *value, char *err,
                   size_t err_len);

/* Write the file atomically (see above).  On any error PATH is untouched,
 * the temporary file is removed, and err names the file.  One exception is
 * documented in the message: if only the final directory fsync fails, the
 * new file is in place but its durability is not guaranteed.
 * The writer can be written again (e.g. to a second path). */
int st_write_atomic(st_writer *w, const char *path, char *err, size_t err_len);

/* Remove the PATH.tmp.PID files that writers killed before their rename
 * left behind (st_write_atomic removes its own on every error it sees).
 * Only for a caller that knows no writer of PATH is running, e.g. one that
 * holds the lock of PATH's directory.  Returns how many were removed. */
int st_clear_temps(const char *path);

/* Write the file's bytes to an open descriptor at its current offset,
 * without any fsync or rename (st_write_atomic uses it; tests and the fuzzer
 * use it with a memfd).  name is only used in messages. */
int st_write_fd(st_writer *w, int fd, const char *name, char *err, size_t err_len);

/* Test hook: make the next st_write_atomic calls on THIS writer fail at the
 * given stage with errno = errnum, as if the system call had failed.  The
 * state belongs to the writer only (no global state); ST_STAGE_NONE clears
 * it.  ST_STAGE_WRITE fails after the header has been written, leaving a
 * partial temporary file behind for the cleanup path to remove. */
typedef enum {
    ST_STAGE_NONE,
    ST_STAGE_OPEN,
    ST_STAGE_WRITE,
    ST_STAGE_FSYNC,
    ST_STAGE_CLOSE,
    ST_STAGE_RENAME,
    ST_STAGE_DIRSYNC
} st_stage;
void st_writer_fail_at(st_writer *w, st_stage stage, int errnum);

/* ---- reader -------------------------------------------------------------- */

typedef struct st_file st_file;

typedef struct {
    const char *name;          /* owned by the st_file */
    st_dtype dtype;
    int ndim;
    uint64_t shape[ST_MAX_DIMS];
    uint64_t nelem;            /* product of shape (1 for a scalar) */
    uint64_t begin, end;       /* data_offsets, relative to the data region */
    uint64_t bytes;            /* end - begin */
} st_tensor;

/* Open and validate PATH.  On success *out is set and 0 returned; on
 * failure -1, *out is NULL, and err names the file. */
int st_open(const char *path, st_file **out, char *err, size_t err_len);
void st_close(st_file *f);

const char *st_path(const st_file *f);
/* Byte offset of the data region in the file (8 + header length). */
uint64_t st_data_offset(const st_file *f);

/* Tensors in header order. */
size_t st_count(const st_file *f);
const st_tensor *st_tensor_at(const st_file *f, size_t i);
/* NULL if there is no tensor of that name. */
const st_tensor *st_find(const st_file *f, const char *name);

/* Find NAME and check it has the expected dtype and shape; NULL with a
 * message naming the file and tensor otherwise (missing, other dtype, other
 * shape).  For loading a checkpoint into existing buffers. */
const st_tensor *st_expect(const st_file *f, const char *name, st_dtype dtype, int ndim,
                           const uint64_t *shape, char *err, size_t err_len);

/* Copy tensor NAME into dst, which holds exactly `bytes` bytes (must equal
 * the tensor's byte length).  -1 with a message on a missing tensor, a size
 * mismatch or an I/O error (e.g. the file shrank after st_open). */
int st_read(st_file *f, const char *name, void *dst, size_t bytes, char *err,
            size_t err_len);
int st_read_tensor(st_file *f, const st_tensor *t, void *dst, size_t bytes, char *err,
                   size_t err_len);

/* Pointer to the tensor's bytes in a read-only mapping of the file (made on
 * first use, valid until st_close).  NULL with a message if mapping fails.
 * Files written by st_writer have every tensor aligned to its element size;
 * for others the pointer may be unaligned.  A file truncated by someone else
 * while mapped raises SIGBUS on access; use st_read where that matters. */
const void *st_data(st_file *f, const st_tensor *t, char *err, size_t err_len);

/* Metadata: value for KEY or NULL; and in header order. */
const char *st_meta(const st_file *f, const char *key);
size_t st_meta_count(const st_file *f);
void st_meta_at(const st_file *f, size_t i, const char **key, const char **value);
