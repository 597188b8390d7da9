/* data_npy.c — NumPy .npy files: the preamble and header dict, the
 * generic array loader, and the shape and dtype checks that make an array
 * a token stream, a set of images or a set of labels. */
#include "data_internal.h"

#include "errmsg.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *descr;
    data_dtype dtype;
    unsigned size;
} npy_types[] = {
    {"<f4", DATA_F32, 4},
    {"<i4", DATA_I32, 4},
    {"<u2", DATA_U16, 2},
    {"|u1", DATA_U8, 1},
};

unsigned data_dtype_size(data_dtype t)
{
    for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++)
        if (npy_types[i].dtype == t)
            return npy_types[i].size;
    return 0;
}

const char *data_dtype_name(data_dtype t)
{
    for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++)
        if (npy_types[i].dtype == t)
            return npy_types[i].descr;
    return "?";
}

typedef struct {
    const char *p, *end;
} cur;

static void skip_ws(cur *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static bool eat(cur *c, char ch)
{
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return true;
    }
    return false;
}

/* A quoted Python string without escapes into out (NUL-terminated). */
static bool parse_str(cur *c, char *out, size_t out_len)
{
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
        return false;
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || (unsigned char)*c->p < 0x20 || n + 1 >= out_len)
            return false;
        out[n++] = *c->p++;
    }
    if (c->p >= c->end)
        return false;
    c->p++;
    out[n] = '\0';
    return true;
}

static bool parse_word(cur *c, const char *w)
{
    skip_ws(c);
    size_t l = strlen(w);
    if ((size_t)(c->end - c->p) >= l && memcmp(c->p, w, l) == 0) {
        c->p += l;
        return true;
    }
    return false;
}

/* Parse the header dict.  Returns NULL or a description of what is wrong. */
static const char *npy_parse_header(cur *c, data_npy *a, char *descr, size_t descr_len,
                                    bool *fortran)
{
    bool have_descr = false, have_fortran = false, have_shape = false;
    if (!eat(c, '{'))
        return "header is not a Python dict literal";
    for (;;) {
        if (eat(c, '}'))
            break;
        char key[32];
        if (!parse_str(c, key, sizeof key))
            return "expected a quoted key";
        if (!eat(c, ':'))
            return "expected ':' after a key";
        if (strcmp(key, "descr") == 0) {
            if (have_descr)
                return "key 'descr' given twice";
            if (!parse_str(c, descr, descr_len))
                return "'descr' is not a simple dtype string";
            have_descr = true;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (have_fortran)
                return "key 'fortran_order' given twice";
            if (parse_word(c, "True"))
                *fortran = true;
            else if (parse_word(c, "False"))
                *fortran = false;
            else
                return "'fortran_order' is not True or False";
            have_fortran = true;
        } else if (strcmp(key, "shape") == 0) {
            if (have_shape)
                return "key 'shape' given twice";
            if (!eat(c, '('))
                return "'shape' is not a tuple";
            a->ndim = 0;
            bool comma = false;
            for (;;) {
                if (eat(c, ')'))
                    break;
                if (a->ndim > 0 && !comma)
                    return "'shape': expected ',' or ')'";
                skip_ws(c);
                if (c->p >= c->end || *c->p < '0' || *c->p > '9')
                    return "'shape' holds something other than non-negative integers";
                if (a->ndim == DATA_NPY_MAX_DIMS)
                    return "'shape' has more than 8 dimensions";
                uint64_t v = 0;
                while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
                    if (v > (UINT64_MAX - 9) / 10)
                        return "'shape' has a dimension too large";
                    v = v * 10 + (uint64_t)(*c->p++ - '0');
                }
                a->shape[a->ndim++] = v;
                comma = eat(c, ',');
            }
            if (a->ndim == 1 && !comma)
                return "'shape': a 1-d shape needs a trailing comma, as in (3,)";
            have_shape = true;
        } else {
            return "unknown key in the header dict (expected only 'descr', 'fortran_order', "
                   "'shape')";
        }
        if (eat(c, ','))
            continue;
        if (eat(c, '}'))
            break;
        return "expected ',' or '}' in the header dict";
    }
    skip_ws(c);
    if (c->p != c->end)
        return "junk after the header dict";
    if (!have_descr)
        return "header lacks 'descr'";
    if (!have_fortran)
        return "header lacks 'fortran_order'";
    if (!have_shape)
        return "header lacks 'shape'";
    return NULL;
}

/* Open the file and read its preamble and header into *a (all but data),
 * checking the file's size against the shape: s is left at the first data
 * byte.  On failure s is closed and *a zeroed. */
static int npy_open(data_src *s, data_npy *a, const char *path, char *err, size_t err_len)
{
    memset(a, 0, sizeof *a);
    if (data_src_open(s, path, false, err, err_len) != 0)
        return -1;
    int rc = 0;
    char *hdr = NULL;
    unsigned char pre[12];
    ssize_t r = data_src_read(s, pre, 10, err, err_len);
    if (r < 0) {
        rc = -1;
        goto out;
    }
    if (r < 6 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        rc = errmsg_set(err, err_len, "%s: not a .npy file (no \\x93NUMPY magic at offset 0)", path);
        goto out;
    }
    if (r < 10) {
        rc = errmsg_set(err, err_len, "%s: truncated .npy preamble (%zd bytes)", path, r);
        goto out;
    }
    unsigned major = pre[6], minor = pre[7];
    if ((major != 1 && major != 2 && major != 3) || minor != 0) {
        rc = errmsg_set(err, err_len,
                        "%s: unsupported .npy format version %u.%u (expected 1.0, 2.0 or 3.0)", path,
                        major, minor);
        goto out;
    }
    uint64_t hlen, hstart;
    if (major == 1) {
        hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8;
        hstart = 10;
    } else {
        if (data_src_read(s, pre + 10, 2, err, err_len) != 2) {
            rc = errmsg_set(err, err_len, "%s: truncated .npy preamble", path);
            goto out;
        }
        hlen = data_le32(pre + 8);
        hstart = 12;
    }
    if (hlen > 65536) {
        rc = errmsg_set(err, err_len,
                        "%s: .npy header length %llu at offset 8 is too large (limit 65536)", path,
                        (ull)hlen);
        goto out;
    }
    hdr = malloc(hlen + 1);
    if (!hdr) {
        rc = data_oom(path, err, err_len);
        goto out;
    }
    r = data_src_read(s, hdr, (size_t)hlen, err, err_len);
    if (r < 0) {
        rc = -1;
        goto out;
    }
    if ((uint64_t)r < hlen) {
        rc = errmsg_set(err, err_len, "%s: truncated .npy header: %llu bytes announced, %zd present",
                        path, (ull)hlen, r);
        goto out;
    }
    hdr[hlen] = '\0';
    if (hlen == 0 || hdr[hlen - 1] != '\n') {
        rc = errmsg_set(err, err_len, "%s: .npy header does not end with a newline", path);
        goto out;
    }
    for (uint64_t i = 0; i < hlen; i++)
        if (hdr[i] == '\0') {
            rc = errmsg_set(err, err_len, "%s: .npy header holds a NUL byte at offset %llu", path,
                            (ull)(hstart + i));
            goto out;
        }
    char descr[32] = "";
    bool fortran = false;
    cur c = {hdr, hdr + hlen};
    const char *why = npy_parse_header(&c, a, descr, sizeof descr, &fortran);
    if (why) {
        rc = errmsg_set(err, err_len, "%s: bad .npy header at offset %llu: %s", path,
                        (ull)(hstart + (uint64_t)(c.p - hdr)), why);
        goto out;
    }
    unsigned esize = 0;
    for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++)
        if (strcmp(descr, npy_types[i].descr) == 0) {
            a->dtype = npy_types[i].dtype;
            esize = npy_types[i].size;
        }
    if (!esize) {
        rc = errmsg_set(err, err_len,
                        "%s: unsupported .npy dtype '%s' (supported: '<f4', '<i4', '<u2', '|u1')", path,
                        descr);
        goto out;
    }
    if (fortran && a->ndim > 1) {
        rc = errmsg_set(err, err_len, "%s: Fortran-order .npy arrays are not supported (save in C order)",
                        path);
        goto out;
    }
    uint64_t count = 1;
    for (int i = 0; i < a->ndim; i++)
        if (__builtin_mul_overflow(count, a->shape[i], &count) || count > UINT64_MAX / 8) {
            rc = errmsg_set(err, err_len, "%s: .npy shape is too large (element count overflows)", path);
            goto out;
        }
    a->count = count;
    a->data_offset = hstart + hlen;
    uint64_t want = count * esize;
    uint64_t have = s->size > a->data_offset ? s->size - a->data_offset : 0;
    if (have != want) {
        char shape[200];
        size_t o = 0;
        o += (size_t)snprintf(shape + o, sizeof shape - o, "(");
        for (int i = 0; i < a->ndim && o < sizeof shape; i++)
            o += (size_t)snprintf(shape + o, sizeof shape - o, "%s%llu", i ? ", " : "",
                                  (ull)a->shape[i]);
        if (o < sizeof shape)
            snprintf(shape + o, sizeof shape - o, "%s)", a->ndim == 1 ? "," : "");
        rc = errmsg_set(err, err_len,
                        "%s: %s: shape %s of %s needs %llu data bytes after the %llu-byte header, "
                        "but the file has %llu",
                        path, have < want ? "truncated data" : "trailing bytes", shape, descr,
                        (ull)want, (ull)a->data_offset, (ull)have);
        goto out;
    }
out:
    free(hdr);
    if (rc != 0) {
        data_src_close(s);
        memset(a, 0, sizeof *a);
        return rc;
    }
    return 0;
}

/* Little-endian elements of esize bytes into host order. */
static void npy_to_host(unsigned char *p, uint64_t count, unsigned esize)
{
    if (data_host_le() || esize < 2)
        return;
    for (uint64_t i = 0; i < count; i++) {
        unsigned char *e = p + i * esize;
        for (unsigned k = 0; k < esize / 2; k++) {
            unsigned char x = e[k];
            e[k] = e[esize - 1 - k];
            e[esize - 1 - k] = x;
        }
    }
}

/* The file ends where the shape says: nothing was appended meanwhile. */
static int npy_check_end(data_src *s, const char *path, uint64_t got, uint64_t want, char *err,
                         size_t err_len)
{
    uint64_t rest = 0;
    if (got != want || data_src_drain_some(s, &rest, err, err_len) != 0 || rest)
        return errmsg_set(err, err_len, "%s: the file changed size while being read", path);
    return 0;
}

/* The rest of an opened file, in host order, into a->data, charged to b.
 * Closes s; on failure *a is zeroed. */
static int npy_read_data(data_src *s, data_npy *a, const char *path, data_budget *b, char *err,
                         size_t err_len)
{
    unsigned esize = data_dtype_size(a->dtype);
    uint64_t want = a->count * esize, got = 0;
    unsigned char *body = NULL;
    if (data_budget_take(b, want, path, err, err_len) != 0) {
        data_src_close(s);
        memset(a, 0, sizeof *a);
        return -1;
    }
    int rc = data_src_read_body(s, want, want, &body, &got, err, err_len);
    if (rc == 0)
        rc = npy_check_end(s, path, got, want, err, err_len);
    data_src_close(s);
    if (rc != 0) {
        data_budget_give(b, want);
        free(body);
        memset(a, 0, sizeof *a);
        return -1;
    }
    npy_to_host(body, a->count, esize);
    a->data = body;
    return 0;
}

int data_npy_load(data_npy *a, const char *path, data_budget *b, char *err, size_t err_len)
{
    data_src s;
    if (npy_open(&s, a, path, err, err_len) != 0)
        return -1;
    return npy_read_data(&s, a, path, b, err, err_len);
}

void data_npy_free(data_npy *a)
{
    if (!a)
        return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

/* '<i4' tokens into uint16, a chunk at a time: the file's four bytes a
 * token are never all held at once.  s is at the first data byte. */
static int npy_i4_tokens(data_src *s, const data_npy *a, uint16_t *tok, const char *path,
                         char *err, size_t err_len)
{
    int32_t *buf = malloc(DATA_CHUNK);
    if (!buf)
        return data_oom(path, err, err_len);
    const size_t per = DATA_CHUNK / sizeof *buf;
    int rc = 0;
    uint64_t i = 0;
    while (rc == 0 && i < a->count) {
        size_t n = a->count - i < per ? (size_t)(a->count - i) : per;
        ssize_t r = data_src_read(s, buf, n * sizeof *buf, err, err_len);
        if (r < 0) {
            rc = -1;
            break;
        }
        if ((size_t)r < n * sizeof *buf) {
            rc = errmsg_set(err, err_len, "%s: the file changed size while being read", path);
            break;
        }
        npy_to_host((unsigned char *)buf, n, sizeof *buf);
        for (size_t k = 0; k < n; k++, i++) {
            if (buf[k] < 0 || buf[k] > UINT16_MAX) {
                rc = errmsg_set(err, err_len,
                                "%s: token %lld at index %llu (byte offset %llu) does not fit uint16 "
                                "token storage (0..65535)",
                                path, (long long)buf[k], (ull)i, (ull)(a->data_offset + i * 4));
                break;
            }
            tok[i] = (uint16_t)buf[k];
        }
    }
    free(buf);
    if (rc == 0)
        rc = npy_check_end(s, path, a->count * 4, a->count * 4, err, err_len);
    return rc;
}

int data_npy_tokens_load(data_tokens *t, const char *path, data_budget *b, char *err,
                         size_t err_len)
{
    data_npy a;
    data_src s;
    if (npy_open(&s, &a, path, err, err_len) != 0)
        return -1;
    int rc = 0;
    if (a.ndim != 1 || a.dtype == DATA_F32)
        rc = errmsg_set(err, err_len,
                        "%s: a token .npy must be 1-d '<u2', '<i4' or '|u1', not %d-d '%s'", path,
                        a.ndim, data_dtype_name(a.dtype));
    else if (a.count == 0)
        rc = errmsg_set(err, err_len, "%s: empty array (no tokens)", path);
    if (rc != 0) {
        data_src_close(&s);
        return rc;
    }
    if (a.dtype != DATA_I32) {
        /* '<u2' and '|u1' are held as the file has them. */
        if (npy_read_data(&s, &a, path, b, err, err_len) != 0)
            return -1;
        if (a.dtype == DATA_U16)
            t->tok = a.data;
        else
            t->u8 = a.data;
    } else {
        uint64_t held = a.count * sizeof *t->tok;
        if (data_budget_take(b, held, path, err, err_len) != 0) {
            data_src_close(&s);
            return -1;
        }
        t->tok = malloc((size_t)held);
        rc = t->tok ? npy_i4_tokens(&s, &a, t->tok, path, err, err_len) : data_oom(path, err, err_len);
        data_src_close(&s);
        if (rc != 0) {
            data_budget_give(b, held);
            free(t->tok);
            t->tok = NULL;
            return -1;
        }
    }
    t->n = (size_t)a.count;
    t->data_offset = a.data_offset;
    t->elem_size = data_dtype_size(a.dtype);
    return 0;
}

/* (N, rows, cols) or (N, D), '|u1' or finite '<f4'. */
int data_npy_images_load(data_images *d, const char *path, uint64_t limit, uint64_t *total,
                         data_budget *b, char *err, size_t err_len)
{
    data_npy a;
    data_src s;
    if (npy_open(&s, &a, path, err, err_len) != 0)
        return -1;
    int rc = 0;
    uint64_t rows = a.ndim == 3 ? a.shape[1] : 1, cols = a.ndim ? a.shape[a.ndim - 1] : 0;
    if ((a.ndim != 2 && a.ndim != 3) || (a.dtype != DATA_U8 && a.dtype != DATA_F32))
        rc = errmsg_set(err, err_len,
                        "%s: an image .npy must be (N, rows, cols) or (N, D) of '|u1' or '<f4', not "
                        "%d-d '%s'",
                        path, a.ndim, data_dtype_name(a.dtype));
    else if (a.shape[0] == 0 || rows == 0 || cols == 0)
        rc = errmsg_set(err, err_len, "%s: image .npy has a zero dimension", path);
    if (rc != 0) {
        data_src_close(&s);
        return rc;
    }
    if (npy_read_data(&s, &a, path, b, err, err_len) != 0)
        return -1;
    uint64_t dim = rows * cols, held = a.count * data_dtype_size(a.dtype);
    if (a.dtype == DATA_F32) {
        const float *x = a.data;
        for (uint64_t i = 0; i < a.count; i++)
            if (!isfinite(x[i])) {
                rc = errmsg_set(err, err_len,
                                "%s: pixel value %g at index %llu (image %llu, byte offset %llu) is not "
                                "finite",
                                path, (double)x[i], (ull)i, (ull)(i / dim),
                                (ull)(a.data_offset + 4 * i));
                data_budget_give(b, held);
                data_npy_free(&a);
                return rc;
            }
    }
    *total = a.shape[0];
    d->n = (size_t)(limit && limit < a.shape[0] ? limit : a.shape[0]);
    d->rows = (size_t)rows;
    d->cols = (size_t)cols;
    if (d->n < a.shape[0]) { /* give back what the subset does not need */
        uint64_t keep = d->n * dim * data_dtype_size(a.dtype);
        void *np = realloc(a.data, (size_t)keep);
        if (np) {
            a.data = np;
            data_budget_give(b, held - keep);
        }
    }
    if (a.dtype == DATA_F32)
        d->f32 = a.data;
    else
        d->u8 = a.data;
    return 0;
}

int data_npy_labels_load(data_npy *a, const char *path, data_budget *b, char *err,
                         size_t err_len)
{
    data_src s;
    if (npy_open(&s, a, path, err, err_len) != 0)
        return -1;
    if (a->ndim != 1 || a->dtype == DATA_F32) {
        int rc = errmsg_set(err, err_len,
                            "%s: a label .npy must be 1-d '|u1', '<u2' or '<i4', not %d-d '%s'", path,
                            a->ndim, data_dtype_name(a->dtype));
        data_src_close(&s);
        memset(a, 0, sizeof *a);
        return rc;
    }
    return npy_read_data(&s, a, path, b, err, err_len);
}
