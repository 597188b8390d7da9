/* data.c — the data module's common part: the sequential file reader
 * (gunzipping where the file is gzip) that every format reads through,
 * format detection, the token and image datasets, and the seeded sample
 * streams and evaluation passes over them.  The formats themselves live in
 * data_text.c, data_llmc.c, data_npy.c, data_idx.c and data_jsonl.c.  See
 * data.h. */
#include "data_internal.h"

#include "errmsg.h"
#include "fileio.h"
#include "units.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

int data_oom(const char *path, char *err, size_t err_len)
{
    return errmsg_set(err, err_len, "%s: out of memory", path);
}

/* ---- the budget ----------------------------------------------------------- */

int data_budget_take(data_budget *b, uint64_t bytes, const char *path, char *err, size_t err_len)
{
    if (!b)
        return 0;
    uint64_t total;
    if (__builtin_add_overflow(b->used, bytes, &total) || (b->limit && total > b->limit)) {
        char need[16], held[32] = "", lim[16];
        if (b->used)
            snprintf(held, sizeof held, " on top of %s", units_format_size(b->used, lim, sizeof lim));
        units_format_size(b->limit, lim, sizeof lim);
        return errmsg_set(err, err_len,
                          "%s: the job's data would need %s (%llu bytes) more host memory%s, past "
                          "what one job's data may hold (%s = %s)",
                          path, units_format_size(bytes, need, sizeof need), (ull)bytes, held,
                          b->key ? b->key : "limit", lim);
    }
    b->used = total;
    if (total > b->peak)
        b->peak = total;
    return 0;
}

void data_budget_give(data_budget *b, uint64_t bytes)
{
    if (b)
        b->used = bytes < b->used ? b->used - bytes : 0;
}

uint64_t data_budget_room(const data_budget *b)
{
    if (!b || !b->limit)
        return UINT64_MAX;
    return b->limit > b->used ? b->limit - b->used : 0;
}

/* ---- a file, read sequentially, gunzipped where it is gzip -------------- */

int data_src_open(data_src *s, const char *path, bool gz_ok, char *err, size_t err_len)
{
    memset(s, 0, sizeof *s);
    s->path = path;
    s->fd = fileio_open_regular(path, O_RDONLY, 0, err, err_len);
    if (s->fd < 0)
        return -1;
    struct stat st;
    if (fstat(s->fd, &st) != 0) {
        int e = errno;
        close(s->fd);
        s->fd = -1;
        return errmsg_set(err, err_len, "%s: cannot stat: %s", path, strerror(e));
    }
    s->size = (uint64_t)st.st_size;
    if (!gz_ok)
        return 0;
    unsigned char m[2];
    ssize_t r = pread(s->fd, m, 2, 0);
    if (r == 2 && m[0] == 0x1f && m[1] == 0x8b) {
        s->gz = true;
        s->in = malloc(DATA_CHUNK);
        if (!s->in) {
            close(s->fd);
            return data_oom(path, err, err_len);
        }
        if (inflateInit2(&s->z, 16 + MAX_WBITS) != Z_OK) {
            free(s->in);
            close(s->fd);
            return data_oom(path, err, err_len);
        }
        s->zinit = true;
    }
    return 0;
}

void data_src_close(data_src *s)
{
    if (s->zinit)
        inflateEnd(&s->z);
    free(s->in);
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    s->in = NULL;
    s->zinit = false;
}

/* read(2) until n bytes or end of file. */
static ssize_t read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* Move unread input to the front of the buffer and read more after it. */
static int data_src_refill(data_src *s, char *err, size_t err_len)
{
    if (s->fd_eof)
        return 0;
    size_t keep = s->z.avail_in;
    if (keep)
        memmove(s->in, s->z.next_in, keep);
    ssize_t r = read_full(s->fd, s->in + keep, DATA_CHUNK - keep);
    if (r < 0)
        return errmsg_set(err, err_len, "%s: read error: %s", s->path, strerror(errno));
    if ((size_t)r < DATA_CHUNK - keep)
        s->fd_eof = true;
    s->z.next_in = s->in;
    s->z.avail_in = (uInt)(keep + (size_t)r);
    return 0;
}

static uint64_t data_src_raw_pos(const data_src *s)
{
    return s->raw_used;
}

/* The reading itself is data_src_read_; the wrapper remembers a failure so
 * that data_src_blame_gzip never reads on past one. */
static ssize_t data_src_read_(data_src *s, void *buf, size_t n, char *err, size_t err_len);
ssize_t data_src_read(data_src *s, void *buf, size_t n, char *err, size_t err_len)
{
    ssize_t r = data_src_read_(s, buf, n, err, err_len);
    if (r < 0)
        s->failed = true;
    return r;
}

static ssize_t data_src_read_(data_src *s, void *buf, size_t n, char *err, size_t err_len)
{
    if (!s->gz) {
        ssize_t r = read_full(s->fd, buf, n);
        if (r < 0)
            return errmsg_set(err, err_len, "%s: read error: %s", s->path, strerror(errno));
        s->out += (uint64_t)r;
        return r;
    }
    size_t got = 0;
    while (got < n) {
        if (s->z.avail_in < 2 && data_src_refill(s, err, err_len) != 0)
            return -1;
        if (s->member_done) {
            if (s->z.avail_in == 0)
                break; /* clean end after the last member */
            if (s->z.avail_in < 2 || s->z.next_in[0] != 0x1f || s->z.next_in[1] != 0x8b) {
                uint64_t rest = s->size > data_src_raw_pos(s) ? s->size - data_src_raw_pos(s) : 0;
                return errmsg_set(err, err_len,
                                  "%s: %llu bytes of trailing garbage after the gzip stream "
                                  "(at file offset %llu)",
                                  s->path, (ull)rest, (ull)data_src_raw_pos(s));
            }
            inflateReset(&s->z);
            s->member_done = false;
        }
        if (s->z.avail_in == 0)
            return errmsg_set(err, err_len,
                              "%s: truncated gzip stream (ends after %llu compressed bytes, "
                              "%llu bytes decompressed)",
                              s->path, (ull)data_src_raw_pos(s), (ull)(s->out + got));
        size_t chunk = n - got > UINT_MAX ? UINT_MAX : n - got;
        s->z.next_out = (Bytef *)buf + got;
        s->z.avail_out = (uInt)chunk;
        uInt in_before = s->z.avail_in;
        int zr = inflate(&s->z, Z_NO_FLUSH);
        s->raw_used += in_before - s->z.avail_in;
        got += chunk - s->z.avail_out;
        if (zr == Z_STREAM_END) {
            s->member_done = true;
        } else if (zr == Z_BUF_ERROR) {
            /* no progress: inflate wants more input than there is */
            if (s->fd_eof && s->z.avail_in == in_before)
                return errmsg_set(err, err_len,
                                  "%s: truncated gzip stream (ends after %llu compressed bytes, "
                                  "%llu bytes decompressed)",
                                  s->path, (ull)data_src_raw_pos(s), (ull)(s->out + got));
            if (data_src_refill(s, err, err_len) != 0)
                return -1;
        } else if (zr == Z_MEM_ERROR) {
            return data_oom(s->path, err, err_len);
        } else if (zr != Z_OK) {
            return errmsg_set(err, err_len, "%s: corrupt gzip data near compressed offset %llu: %s",
                              s->path, (ull)data_src_raw_pos(s),
                              s->z.msg ? s->z.msg : "inflate failed");
        }
    }
    s->out += got;
    return (ssize_t)got;
}

int data_src_drain(data_src *s, uint64_t *rest, char *err, size_t err_len)
{
    unsigned char buf[4096];
    *rest = 0;
    for (;;) {
        ssize_t r = data_src_read(s, buf, sizeof buf, err, err_len);
        if (r < 0)
            return -1;
        *rest += (uint64_t)r;
        if ((size_t)r < sizeof buf)
            return 0;
    }
}

int data_src_drain_some(data_src *s, uint64_t *rest, char *err, size_t err_len)
{
    unsigned char buf[4096];
    *rest = 0;
    while (*rest <= DATA_CHUNK) {
        ssize_t r = data_src_read(s, buf, sizeof buf, err, err_len);
        if (r < 0)
            return -1;
        *rest += (uint64_t)r;
        if ((size_t)r < sizeof buf)
            return 0;
    }
    *rest = DATA_CHUNK + 1;
    return 0;
}

void data_src_blame_gzip(data_src *s, char *err, size_t err_len)
{
    if (!s->gz || s->failed)
        return;
    char zerr[512];
    uint64_t rest;
    if (data_src_drain(s, &rest, zerr, sizeof zerr) != 0 && err && err_len)
        snprintf(err, err_len, "%s", zerr);
}

/* The buffer grows as data arrives, so a header claiming more than the
 * file holds costs no more memory than the file. */
int data_src_read_body(data_src *s, uint64_t total, uint64_t keep, unsigned char **out,
                       uint64_t *got, char *err, size_t err_len)
{
    *out = NULL;
    *got = 0;
    if (keep > SIZE_MAX / 2)
        return data_oom(s->path, err, err_len);
    size_t cap = 0;
    unsigned char *buf = NULL;
    unsigned char scratch[4096];
    while (*got < total) {
        uint64_t want = total - *got;
        unsigned char *dst;
        if (*got < keep) {
            if (*got == cap) {
                size_t ncap = cap ? cap * 2 : (size_t)1 << 20;
                if (!s->gz && s->size > s->out && ncap < s->size - s->out + cap)
                    ncap = (size_t)(s->size - s->out + cap); /* the file says how much */
                if (ncap > keep)
                    ncap = (size_t)keep;
                unsigned char *nb = realloc(buf, ncap ? ncap : 1);
                if (!nb) {
                    free(buf);
                    return data_oom(s->path, err, err_len);
                }
                buf = nb;
                cap = ncap;
            }
            dst = buf + *got;
            if (want > cap - *got)
                want = cap - *got;
        } else {
            dst = scratch;
            if (want > sizeof scratch)
                want = sizeof scratch;
        }
        ssize_t r = data_src_read(s, dst, (size_t)want, err, err_len);
        if (r < 0) {
            free(buf);
            return -1;
        }
        *got += (uint64_t)r;
        if ((uint64_t)r < want)
            break;
    }
    if (!buf && keep == 0)
        buf = malloc(1);
    if (!buf)
        return data_oom(s->path, err, err_len);
    *out = buf;
    return 0;
}

/* ---- tokens ------------------------------------------------------------- */

int data_format_parse(const char *name, data_format *out)
{
    static const struct {
        const char *name;
        data_format f;
    } names[] = {{"auto", DATA_FMT_AUTO}, {"text", DATA_FMT_TEXT}, {"llmc", DATA_FMT_LLMC},
                 {"npy", DATA_FMT_NPY}, {"jsonl", DATA_FMT_JSONL}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (name && strcmp(name, names[i].name) == 0) {
            *out = names[i].f;
            return 0;
        }
    return -1;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static void set_source(char *dst, const char *path)
{
    snprintf(dst, DATA_SOURCE_MAX, "%s", path);
}

static void tokens_finish(data_tokens *t)
{
    uint32_t m = 0;
    for (size_t i = 0; i < t->n; i++)
        if (data_token(t, i) > m)
            m = data_token(t, i);
    t->max_token = m;
}

static size_t token_bytes(const data_tokens *t)
{
    return t->u8 ? 1 : sizeof *t->tok;
}

int data_tokens_load(data_tokens *t, const char *path, data_format fmt, uint32_t vocab,
                     data_budget *budget, char *err, size_t err_len)
{
    memset(t, 0, sizeof *t);
    struct stat st;
    if (stat(path, &st) != 0)
        return errmsg_set(err, err_len, "%s: cannot open: %s", path, strerror(errno));
    bool is_dir = S_ISDIR(st.st_mode);
    if (is_dir && fmt != DATA_FMT_AUTO && fmt != DATA_FMT_TEXT)
        return errmsg_set(err, err_len, "%s: is a directory (only text can be read from a directory)",
                          path);
    if (fmt == DATA_FMT_AUTO) {
        fmt = DATA_FMT_TEXT;
        if (!is_dir) {
            unsigned char m[6] = {0};
            ssize_t r = -1;
            /* Only a regular file is read; what else is there, the
             * format's loader refuses, naming it. */
            int fd = fileio_open_regular(path, O_RDONLY, 0, NULL, 0);
            if (fd >= 0) {
                r = read_full(fd, m, sizeof m);
                close(fd);
            }
            if (r >= 4 && data_le32(m) == DATA_LLMC_MAGIC)
                fmt = DATA_FMT_LLMC;
            else if (r == 6 && memcmp(m, "\x93NUMPY", 6) == 0)
                fmt = DATA_FMT_NPY;
            else if (ends_with(path, ".bin"))
                fmt = DATA_FMT_LLMC;
            else if (ends_with(path, ".npy"))
                fmt = DATA_FMT_NPY;
        }
    }
    int rc;
    switch (fmt) {
    case DATA_FMT_JSONL:
        return errmsg_set(err, err_len, "%s: jsonl holds fine-tuning samples, not a token stream", path);
    case DATA_FMT_LLMC:
        rc = data_llmc_load(t, path, budget, err, err_len);
        break;
    case DATA_FMT_NPY:
        rc = data_npy_tokens_load(t, path, budget, err, err_len);
        break;
    default:
        rc = data_text_load(t, path, is_dir, budget, err, err_len);
        break;
    }
    if (rc != 0) {
        memset(t, 0, sizeof *t);
        return -1;
    }
    set_source(t->source, path);
    tokens_finish(t);
    if (vocab && data_tokens_check_vocab(t, vocab, err, err_len) != 0) {
        data_budget_give(budget, (uint64_t)t->n * token_bytes(t));
        data_tokens_free(t);
        return -1;
    }
    return 0;
}

int data_tokens_check_vocab(const data_tokens *t, uint32_t vocab, char *err, size_t err_len)
{
    if (t->max_token < vocab)
        return 0;
    for (size_t i = 0; i < t->n; i++)
        if (data_token(t, i) >= vocab)
            return errmsg_set(err, err_len,
                              "%s: token %u at index %zu (byte offset %llu) is out of range for vocab %u",
                              t->source, data_token(t, i), i,
                              (ull)(t->data_offset + (uint64_t)i * t->elem_size), vocab);
    return 0;
}

int data_tokens_split(data_tokens *train, data_tokens *val, double fraction, data_budget *budget,
                      char *err, size_t err_len)
{
    memset(val, 0, sizeof *val);
    if (!(fraction > 0 && fraction < 1))
        return errmsg_set(err, err_len, "%s: validation fraction %g is not between 0 and 1",
                          train->source, fraction);
    size_t nv = (size_t)((double)train->n * fraction);
    if (nv == 0 || nv >= train->n)
        return errmsg_set(err, err_len,
                          "%s: %zu tokens are too few to hold out a validation fraction of %g",
                          train->source, train->n, fraction);
    size_t nt = train->n - nv, es = token_bytes(train);
    if (data_budget_take(budget, (uint64_t)nv * es, train->source, err, err_len) != 0)
        return -1;
    unsigned char *from = train->u8 ? train->u8 : (unsigned char *)train->tok;
    unsigned char *copy = malloc(nv * es);
    if (!copy) {
        data_budget_give(budget, (uint64_t)nv * es);
        return data_oom(train->source, err, err_len);
    }
    memcpy(copy, from + nt * es, nv * es);
    /* The tail now lives in *val: hand its memory back. */
    unsigned char *kept = realloc(from, nt * es);
    if (kept) {
        from = kept;
        data_budget_give(budget, (uint64_t)nv * es);
    }
    if (train->u8) {
        train->u8 = from;
        val->u8 = copy;
    } else {
        train->tok = (uint16_t *)from;
        val->tok = (uint16_t *)copy;
    }
    val->n = nv;
    val->elem_size = train->elem_size;
    val->data_offset = train->data_offset + (uint64_t)nt * train->elem_size;
    snprintf(val->source, sizeof val->source, "%.*s (validation: last %zu tokens)", PATH_MAX,
             train->source, nv);
    train->n = nt;
    tokens_finish(train);
    tokens_finish(val);
    return 0;
}

void data_tokens_free(data_tokens *t)
{
    if (!t)
        return;
    free(t->tok);
    free(t->u8);
    memset(t, 0, sizeof *t);
}

/* ---- images: IDX or .npy, by magic ---------------------------------------- */

static bool is_npy(const char *path)
{
    unsigned char m[6];
    int fd = fileio_open_regular(path, O_RDONLY, 0, NULL, 0);
    if (fd < 0)
        return false;
    ssize_t r = read_full(fd, m, sizeof m);
    close(fd);
    return r == 6 && memcmp(m, "\x93NUMPY", 6) == 0;
}

/* Images, told apart by the magic: .npy, or else IDX. */
static int load_image_part(data_images *d, const char *path, uint64_t limit, uint64_t *total,
                           data_budget *b, char *err, size_t err_len)
{
    if (is_npy(path))
        return data_npy_images_load(d, path, limit, total, b, err, err_len);
    return data_idx_images_load(d, path, limit, total, b, err, err_len);
}

static uint64_t images_bytes(const data_images *d)
{
    return (uint64_t)d->n * d->rows * d->cols * (d->f32 ? sizeof(float) : 1);
}

/* Labels: *n of them (all, for the count check), the first keep in *out
 * (keep × 4 bytes charged to b). */
static int load_label_part(const char *path, uint64_t limit, uint32_t classes, int32_t **out,
                           uint64_t *n, uint32_t *max_label, data_budget *b, char *err,
                           size_t err_len)
{
    *out = NULL;
    data_npy a;
    if ((is_npy(path) ? data_npy_labels_load(&a, path, b, err, err_len)
                      : data_idx_labels_load(&a, path, b, err, err_len)) != 0)
        return -1;
    uint64_t count = a.count;
    uint64_t raw = count * data_dtype_size(a.dtype);
    int rc = 0;
    if (count == 0) {
        rc = errmsg_set(err, err_len, "%s: no labels", path);
        goto out;
    }
    int64_t m = 0;
    for (uint64_t i = 0; i < count; i++) {
        int64_t v = data_npy_int(&a, i);
        if (v < 0 || (classes && v >= classes) || v > INT32_MAX - 1) {
            char range[48] = "";
            if (classes)
                snprintf(range, sizeof range, " for %u classes", classes);
            rc = errmsg_set(err, err_len,
                            "%s: label %lld at record %llu (byte offset %llu) is out of range%s", path,
                            (long long)v, (ull)i,
                            (ull)(a.data_offset + i * data_dtype_size(a.dtype)), range);
            goto out;
        }
        if (v > m)
            m = v;
    }
    /* Widen the first keep labels to int32 in the array itself, from the
     * back so that no label is overwritten before it is read: one array,
     * never a second full copy. */
    uint64_t keep = limit && limit < count ? limit : count;
    uint64_t need = keep * sizeof **out;
    if (need > raw) {
        if (data_budget_take(b, need - raw, path, err, err_len) != 0) {
            rc = -1;
            goto out;
        }
        void *grown = realloc(a.data, (size_t)need);
        if (!grown) {
            data_budget_give(b, need - raw);
            rc = data_oom(path, err, err_len);
            goto out;
        }
        a.data = grown;
        raw = need;
    }
    for (uint64_t i = keep; i-- > 0;) {
        int32_t v = (int32_t)data_npy_int(&a, i);
        ((int32_t *)a.data)[i] = v;
    }
    if (raw > need) {
        void *shrunk = realloc(a.data, need ? (size_t)need : 1);
        if (shrunk) {
            a.data = shrunk;
            data_budget_give(b, raw - need);
            raw = need;
        }
    }
    *out = a.data;
    a.data = NULL;
    *n = count;
    *max_label = (uint32_t)m;
out:
    if (rc != 0)
        data_budget_give(b, raw);
    data_npy_free(&a);
    return rc;
}

int data_images_load(data_images *d, const char *images_path, const char *labels_path,
                     uint32_t classes, size_t limit, data_budget *budget, char *err, size_t err_len)
{
    memset(d, 0, sizeof *d);
    uint64_t total = 0;
    if (load_image_part(d, images_path, limit, &total, budget, err, err_len) != 0)
        return -1;
    int32_t *labels = NULL;
    uint64_t nl = 0, held = 0;
    uint32_t max_label = 0;
    if (load_label_part(labels_path, limit, classes, &labels, &nl, &max_label, budget, err,
                        err_len) != 0)
        goto fail;
    /* What load_label_part kept, which is d->n only once the counts agree. */
    held = (limit && limit < nl ? limit : nl) * sizeof *labels;
    if (nl != total) {
        errmsg_set(err, err_len, "%s: %llu labels, but %s holds %llu images", labels_path, (ull)nl,
                   images_path, (ull)total);
        goto fail;
    }
    d->dim = d->rows * d->cols;
    d->labels = labels;
    d->classes = classes ? classes : max_label + 1;
    set_source(d->source, images_path);
    return 0;
fail:
    data_budget_give(budget, images_bytes(d) + held);
    free(labels);
    data_images_free(d);
    return -1;
}

/* v / 255, exactly.  Blocks of a fixed 16 let gcc -O2 vectorise the
 * division (its cheap cost model skips loops that need an epilogue): 4×
 * faster than the plain loop. */
static void scale_u8(const uint8_t *restrict p, float *restrict o, size_t n)
{
    size_t k = 0;
    for (; k + 16 <= n; k += 16)
        for (int j = 0; j < 16; j++)
            o[k + j] = (float)p[k + j] / 255.0f;
    for (; k < n; k++)
        o[k] = (float)p[k] / 255.0f;
}

void data_images_get(const data_images *d, size_t i, float *out)
{
    if (d->u8) {
        scale_u8(d->u8 + i * d->dim, out, d->dim);
    } else {
        memcpy(out, d->f32 + i * d->dim, d->dim * sizeof *out);
    }
}

void data_images_free(data_images *d)
{
    if (!d)
        return;
    free(d->u8);
    free(d->f32);
    free(d->labels);
    memset(d, 0, sizeof *d);
}

/* ---- the seeded stream -------------------------------------------------- */

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, bound), bound > 0, by rejection. */
static uint64_t below(uint64_t *x, uint64_t bound)
{
    uint64_t lim = UINT64_MAX - UINT64_MAX % bound;
    for (;;) {
        uint64_t r = splitmix(x);
        if (r < lim)
            return r % bound;
    }
}

static void stream_epoch(data_stream *s)
{
    uint64_t x = s->seed;
    uint64_t e = s->epoch;
    x = splitmix(&x) ^ splitmix(&e);
    s->offset = s->max_offset ? below(&x, s->max_offset + 1) : 0;
    for (uint64_t i = 0; i < s->size; i++)
        s->order[i] = i;
    for (uint64_t i = s->size; i > 1; i--) {
        uint64_t j = below(&x, i);
        uint64_t t = s->order[i - 1];
        s->order[i - 1] = s->order[j];
        s->order[j] = t;
    }
}

/* Whether t holds one sample of context T (T+1 tokens): 0, or -1 with the
 * reason.  Training windows and evaluation windows alike need one. */
static int tokens_fit(const data_tokens *t, size_t T, char *err, size_t err_len)
{
    if (T == 0)
        return errmsg_set(err, err_len, "%s: context length 0", t->source);
    if (t->n < 2 || t->n - 1 < T)
        return errmsg_set(err, err_len,
                          "%s: %zu tokens are too few for context %zu (a sample needs %zu)",
                          t->source, t->n, T, T + 1);
    return 0;
}

static int stream_init(data_stream *s, uint64_t size, const char *source, data_budget *b,
                       char *err, size_t err_len)
{
    if (size > SIZE_MAX / sizeof *s->order)
        return data_oom(source, err, err_len);
    if (data_budget_take(b, size * sizeof *s->order, source, err, err_len) != 0)
        return -1;
    s->size = size;
    s->order = malloc((size_t)size * sizeof *s->order);
    if (!s->order) {
        data_budget_give(b, size * sizeof *s->order);
        return data_oom(source, err, err_len);
    }
    stream_epoch(s);
    return 0;
}

int data_stream_tokens(data_stream *s, const data_tokens *t, size_t T, uint64_t seed,
                       data_budget *budget, char *err, size_t err_len)
{
    memset(s, 0, sizeof *s);
    if (tokens_fit(t, T, err, err_len) != 0)
        return -1;
    /* Windows of T+1 tokens at stride T; keep room to shift them by up to
     * T-1 per epoch, at the price of one window when the tail is short. */
    uint64_t w = (t->n - 1) / T, slack = (t->n - 1) - w * T;
    if (w >= 2 && slack < T - 1) {
        w--;
        slack += T;
    }
    s->tokens = t;
    s->T = T;
    s->seed = seed;
    s->max_offset = slack < T - 1 ? slack : T - 1;
    return stream_init(s, w, t->source, budget, err, err_len);
}

/* A stream of n samples taken one at a time (images, fine-tuning
 * samples); `what` names them when there are none. */
static int stream_items(data_stream *s, uint64_t n, const char *source, const char *what, uint64_t seed,
                        data_budget *b, char *err, size_t err_len)
{
    if (n == 0)
        return errmsg_set(err, err_len, "%s: no %s", source, what);
    s->seed = seed;
    return stream_init(s, n, source, b, err, err_len);
}

int data_stream_sft(data_stream *s, const data_sft *d, uint64_t seed, data_budget *budget, char *err,
                    size_t err_len)
{
    memset(s, 0, sizeof *s);
    s->sft = d;
    return stream_items(s, d->n, d->source, "samples", seed, budget, err, err_len);
}

int data_stream_images(data_stream *s, const data_images *d, uint64_t seed, data_budget *budget,
                       char *err, size_t err_len)
{
    memset(s, 0, sizeof *s);
    s->images = d;
    return stream_items(s, d->n, d->source, "images", seed, budget, err, err_len);
}

uint64_t data_stream_epoch_size(const data_stream *s)
{
    return s->size;
}

void data_stream_state(const data_stream *s, uint64_t *epoch, uint64_t *index)
{
    *epoch = s->epoch;
    *index = s->index;
}

int data_stream_set_state(data_stream *s, uint64_t epoch, uint64_t index, char *err,
                          size_t err_len)
{
    if (index >= s->size)
        return errmsg_set(err, err_len,
                          "%s: saved data position %llu is past the epoch's %llu samples (did the data "
                          "or the context change since the checkpoint?)",
                          s->tokens ? s->tokens->source : s->sft ? s->sft->source : s->images->source,
                          (ull)index, (ull)s->size);
    if (epoch != s->epoch) {
        s->epoch = epoch;
        stream_epoch(s);
    }
    s->index = index;
    return 0;
}

void data_stream_skip(data_stream *s, uint64_t n)
{
    uint64_t left = s->size - s->index;
    if (n < left) {
        s->index += n;
        return;
    }
    n -= left;
    s->epoch += 1 + n / s->size;
    s->index = n % s->size;
    stream_epoch(s);
}

uint64_t data_stream_take(data_stream *s)
{
    uint64_t k = s->order[s->index++];
    if (s->index == s->size) {
        s->epoch++;
        s->index = 0;
        stream_epoch(s);
    }
    return k;
}

static void copy_window(const data_tokens *t, size_t start, size_t T, int32_t *in, int32_t *tgt)
{
    if (t->u8) {
        const uint8_t *p = t->u8 + start;
        for (size_t j = 0; j < T; j++) {
            in[j] = p[j];
            tgt[j] = p[j + 1];
        }
        return;
    }
    const uint16_t *p = t->tok + start;
    for (size_t j = 0; j < T; j++) {
        in[j] = p[j];
        tgt[j] = p[j + 1];
    }
}

void data_stream_next_tokens(data_stream *s, size_t n, int32_t *inputs, int32_t *targets)
{
    size_t T = s->T;
    for (size_t i = 0; i < n; i++) {
        uint64_t off = s->offset; /* the epoch may turn inside stream_take */
        uint64_t k = data_stream_take(s);
        copy_window(s->tokens, (size_t)(off + k * T), T, inputs + i * T, targets + i * T);
    }
}

void data_stream_next_images(data_stream *s, size_t n, float *x, int32_t *y)
{
    const data_images *d = s->images;
    for (size_t i = 0; i < n; i++) {
        uint64_t k = data_stream_take(s);
        data_images_get(d, (size_t)k, x + i * d->dim);
        y[i] = d->labels[k];
    }
}

void data_stream_free(data_stream *s)
{
    if (!s)
        return;
    free(s->order);
    memset(s, 0, sizeof *s);
}

/* ---- evaluation --------------------------------------------------------- */

int data_eval_tokens(data_eval *e, const data_tokens *t, size_t T, char *err, size_t err_len)
{
    memset(e, 0, sizeof *e);
    if (tokens_fit(t, T, err, err_len) != 0)
        return -1;
    e->tokens = t;
    e->T = T;
    e->size = (t->n - 1) / T;
    return 0;
}

void data_eval_images(data_eval *e, const data_images *d)
{
    memset(e, 0, sizeof *e);
    e->images = d;
    e->size = d->n;
}

void data_eval_sft(data_eval *e, const data_sft *d)
{
    memset(e, 0, sizeof *e);
    e->sft = d;
    e->size = d->n;
}

size_t data_eval_next_tokens(data_eval *e, size_t max, int32_t *inputs, int32_t *targets)
{
    size_t n = 0;
    for (; n < max && e->pos < e->size; n++, e->pos++)
        copy_window(e->tokens, (size_t)(e->pos * e->T), e->T, inputs + n * e->T,
                    targets + n * e->T);
    return n;
}

size_t data_eval_next_images(data_eval *e, size_t max, float *x, int32_t *y)
{
    const data_images *d = e->images;
    size_t n = 0;
    for (; n < max && e->pos < e->size; n++, e->pos++) {
        data_images_get(d, (size_t)e->pos, x + n * d->dim);
        y[n] = d->labels[e->pos];
    }
    return n;
}

void data_eval_reset(data_eval *e)
{
    e->pos = 0;
}

void data_eval_seek(data_eval *e, uint64_t pos)
{
    e->pos = pos < e->size ? pos : e->size;
}
