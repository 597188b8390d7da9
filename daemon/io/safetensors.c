/* safetensors.c — the safetensors reader: st_open validates a file, its
 * header parsed strictly, then tensors are looked up, read or mapped.
 * See safetensors.h for the format and the contracts. */
#include "safetensors.h"

#include "errmsg.h"
#include "utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- reading the file ------------------------------------------------------ */

/* 0 on success, -1 with errno on error, 1 if the file ended early. */
static int pread_all(int fd, void *buf, size_t n, uint64_t off)
{
    char *p = buf;
    while (n > 0) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : n;
        ssize_t r = pread(fd, p, chunk, (off_t)off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (r == 0)
            return 1;
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

/* ---- reader: strict JSON for the safetensors header ---------------------- */

struct st_file {
    char *path;
    int fd;
    uint64_t file_size, header_len, data_off, data_len;
    st_tensor *t;
    size_t nt, capt;
    size_t *by_name; /* indices of t sorted by name */
    char **mkey, **mval;
    size_t nm, capm;
    size_t *meta_by_key;
    void *map;
    size_t map_len;
};

typedef struct {
    const unsigned char *s;
    size_t n, i;
    const char *path;
    const char *tensor; /* context for messages, or NULL */
    const char *field;
    bool in_meta;
    char *err;
    size_t len;
} jp;

__attribute__((format(printf, 2, 3))) static int jfail(jp *p, const char *fmt, ...)
{
    char msg[384], q[200], ctx[512] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t o = 0;
    if (p->tensor)
        o += (size_t)snprintf(ctx + o, sizeof ctx - o, "%s '%s': ",
                              p->in_meta ? "metadata" : "tensor",
                              st_quote(q, sizeof q, p->tensor));
    else if (p->in_meta)
        o += (size_t)snprintf(ctx + o, sizeof ctx - o, "__metadata__: ");
    if (p->field && o < sizeof ctx)
        snprintf(ctx + o, sizeof ctx - o, "field '%s': ", p->field);
    errmsg_set(p->err, p->len, "%s: %sheader byte %zu: %s", p->path, ctx, p->i, msg);
    return -1;
}

static void ws(jp *p)
{
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' ||
                           p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static int peek(jp *p)
{
    return p->i < p->n ? p->s[p->i] : -1;
}

static int expect(jp *p, char c, const char *what)
{
    ws(p);
    if (peek(p) != c) {
        int f = peek(p);
        if (f < 0)
            return jfail(p, "expected %s, found the end of the header", what);
        if (f >= 0x21 && f < 0x7f)
            return jfail(p, "expected %s, found '%c'", what, f);
        return jfail(p, "expected %s, found byte 0x%02x", what, f);
    }
    p->i++;
    return 0;
}

/* After a member or an element: 1 on ',' (another follows), 0 on `close`
 * (consumed: the object or array ends), -1 with an error otherwise. */
static int jnext(jp *p, char close)
{
    ws(p);
    int c = peek(p);
    if (c == ',' || c == close) {
        p->i++;
        return c == ',';
    }
    return expect(p, close, close == '}' ? "',' or '}'" : "',' or ']'");
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int hex4(jp *p, uint32_t *out)
{
    if (p->n - p->i < 4)
        return jfail(p, "truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(p->s[p->i + (size_t)k]);
        if (h < 0)
            return jfail(p, "bad hex digit in \\u escape");
        v = v << 4 | (uint32_t)h;
    }
    p->i += 4;
    *out = v;
    return 0;
}

/* Parse a JSON string into a new NUL-terminated UTF-8 string. */
static int jstring(jp *p, char **out)
{
    *out = NULL;
    if (expect(p, '"', "a string") != 0)
        return -1;
    /* The decoded form is never longer than the source. */
    size_t start = p->i;
    char *s = malloc(p->n - start + 1);
    if (!s)
        return jfail(p, "out of memory");
    size_t o = 0;
    for (;;) {
        if (p->i >= p->n) {
            free(s);
            return jfail(p, "unterminated string");
        }
        unsigned c = p->s[p->i];
        if (c == '"') {
            p->i++;
            break;
        }
        if (c < 0x20) {
            free(s);
            return jfail(p, "control character 0x%02x in string", c);
        }
        if (c == '\\') {
            p->i++;
            if (p->i >= p->n) {
                free(s);
                return jfail(p, "unterminated string");
            }
            unsigned e = p->s[p->i++];
            uint32_t cp;
            switch (e) {
            case '"': s[o++] = '"'; continue;
            case '\\': s[o++] = '\\'; continue;
            case '/': s[o++] = '/'; continue;
            case 'b': s[o++] = '\b'; continue;
            case 'f': s[o++] = '\f'; continue;
            case 'n': s[o++] = '\n'; continue;
            case 'r': s[o++] = '\r'; continue;
            case 't': s[o++] = '\t'; continue;
            case 'u':
                if (hex4(p, &cp) != 0) {
                    free(s);
                    return -1;
                }
                if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    free(s);
                    return jfail(p, "lone low surrogate \\u%04x", cp);
                }
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    uint32_t lo;
                    if (p->n - p->i < 2 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') {
                        free(s);
                        return jfail(p, "high surrogate \\u%04x not followed by a low one",
                                     cp);
                    }
                    p->i += 2;
                    if (hex4(p, &lo) != 0) {
                        free(s);
                        return -1;
                    }
                    if (lo < 0xDC00 || lo > 0xDFFF) {
                        free(s);
                        return jfail(p, "high surrogate \\u%04x not followed by a low one",
                                     cp);
                    }
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                if (cp == 0) {
                    free(s);
                    return jfail(p, "NUL character (\\u0000) in string");
                }
                /* Encoded length ≤ escape length (6 or 12 source bytes). */
                if (cp < 0x80) {
                    s[o++] = (char)cp;
                } else if (cp < 0x800) {
                    s[o++] = (char)(0xC0 | cp >> 6);
                    s[o++] = (char)(0x80 | (cp & 0x3F));
                } else if (cp < 0x10000) {
                    s[o++] = (char)(0xE0 | cp >> 12);
                    s[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    s[o++] = (char)(0x80 | (cp & 0x3F));
                } else {
                    s[o++] = (char)(0xF0 | cp >> 18);
                    s[o++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                    s[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    s[o++] = (char)(0x80 | (cp & 0x3F));
                }
                continue;
            default:
                p->i--;
                free(s);
                if (e >= 0x21 && e < 0x7f)
                    return jfail(p, "invalid escape '\\%c'", e);
                return jfail(p, "invalid escape '\\' then byte 0x%02x", e);
            }
        }
        size_t k = utf8_seq(p->s + p->i, p->n - p->i);
        if (k == 0) {
            free(s);
            return jfail(p, "invalid UTF-8 in string");
        }
        memcpy(s + o, p->s + p->i, k);
        o += k;
        p->i += k;
    }
    s[o] = 0;
    *out = s;
    return 0;
}

static int juint(jp *p, uint64_t *out)
{
    ws(p);
    int c = peek(p);
    if (c == '-')
        return jfail(p, "negative number");
    if (c < '0' || c > '9') {
        if (c < 0)
            return jfail(p, "expected an integer, found end of header");
        if (c >= 0x21 && c < 0x7f)
            return jfail(p, "expected an integer, found '%c'", c);
        return jfail(p, "expected an integer, found byte 0x%02x", c);
    }
    size_t start = p->i;
    uint64_t v = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        if (__builtin_mul_overflow(v, 10, &v) ||
            __builtin_add_overflow(v, (uint64_t)(p->s[p->i] - '0'), &v)) {
            p->i = start;
            return jfail(p, "integer does not fit in 64 bits");
        }
        p->i++;
    }
    if (p->s[start] == '0' && p->i - start > 1) {
        p->i = start;
        return jfail(p, "integer with a leading zero");
    }
    c = peek(p);
    if (c == '.' || c == 'e' || c == 'E')
        return jfail(p, "not an integer");
    *out = v;
    return 0;
}

/* [a, b, ...] of at most max integers. */
static int juint_array(jp *p, uint64_t *v, int max, int *count)
{
    if (expect(p, '[', "'['") != 0)
        return -1;
    int n = 0;
    ws(p);
    if (peek(p) == ']') {
        p->i++;
        *count = 0;
        return 0;
    }
    for (;;) {
        if (n == max)
            return jfail(p, "more than %d entries", max);
        if (juint(p, &v[n]) != 0)
            return -1;
        n++;
        int more = jnext(p, ']');
        if (more < 0)
            return -1;
        if (!more)
            break;
    }
    *count = n;
    return 0;
}

static int add_meta(st_file *f, jp *p, char *k, char *v)
{
    if (f->nm == f->capm) {
        size_t cap = f->capm ? 2 * f->capm : 8;
        char **a = realloc(f->mkey, cap * sizeof *a);
        if (a)
            f->mkey = a;
        char **b = realloc(f->mval, cap * sizeof *b);
        if (b)
            f->mval = b;
        if (!a || !b) {
            free(k);
            free(v);
            return jfail(p, "out of memory");
        }
        f->capm = cap;
    }
    f->mkey[f->nm] = k;
    f->mval[f->nm] = v;
    f->nm++;
    return 0;
}

static int parse_meta(st_file *f, jp *p)
{
    p->in_meta = true;
    if (expect(p, '{', "an object of strings") != 0)
        return -1;
    ws(p);
    if (peek(p) == '}') {
        p->i++;
        p->in_meta = false;
        return 0;
    }
    for (;;) {
        char *k, *v;
        if (jstring(p, &k) != 0)
            return -1;
        p->tensor = k;
        if (expect(p, ':', "':'") != 0) {
            free(k);
            return -1;
        }
        ws(p);
        if (peek(p) != '"') {
            jfail(p, "value is not a string");
            p->tensor = NULL;
            free(k);
            return -1;
        }
        if (jstring(p, &v) != 0) {
            p->tensor = NULL;
            free(k);
            return -1;
        }
        p->tensor = NULL;
        if (add_meta(f, p, k, v) != 0)
            return -1;
        int more = jnext(p, '}');
        if (more < 0)
            return -1;
        if (!more)
            break;
    }
    p->in_meta = false;
    return 0;
}

/* The tensor's entry; name is owned by *t already. */
static int parse_tensor(jp *p, st_tensor *t)
{
    p->tensor = t->name;
    if (expect(p, '{', "an object") != 0)
        return -1;
    bool have_dtype = false, have_shape = false, have_off = false;
    ws(p);
    if (peek(p) != '}') {
        for (;;) {
            char *key;
            if (jstring(p, &key) != 0)
                return -1;
            int which = strcmp(key, "dtype") == 0          ? 0
                        : strcmp(key, "shape") == 0        ? 1
                        : strcmp(key, "data_offsets") == 0 ? 2
                                                           : -1;
            if (which < 0) {
                char q[200];
                st_quote(q, sizeof q, key);
                free(key);
                return jfail(p, "unknown field '%s'", q);
            }
            free(key);
            static const char *const fields[] = {"dtype", "shape", "data_offsets"};
            p->field = fields[which];
            bool *seen = which == 0 ? &have_dtype : which == 1 ? &have_shape : &have_off;
            if (*seen)
                return jfail(p, "appears twice");
            *seen = true;
            if (expect(p, ':', "':'") != 0)
                return -1;
            if (which == 0) {
                char *d;
                ws(p);
                size_t at = p->i;
                if (jstring(p, &d) != 0)
                    return -1;
                if (st_dtype_from_name(d, &t->dtype) != 0) {
                    char q[200];
                    st_quote(q, sizeof q, d);
                    free(d);
                    p->i = at;
                    return jfail(p, "unknown dtype '%s'", q);
                }
                free(d);
            } else if (which == 1) {
                if (juint_array(p, t->shape, ST_MAX_DIMS, &t->ndim) != 0)
                    return -1;
            } else {
                uint64_t v[2];
                int n = 0;
                if (juint_array(p, v, 2, &n) != 0)
                    return -1;
                if (n != 2)
                    return jfail(p, "has %d entries, not 2", n);
                t->begin = v[0];
                t->end = v[1];
            }
            p->field = NULL;
            int more = jnext(p, '}');
            if (more < 0)
                return -1;
            if (!more)
                break;
        }
    } else {
        p->i++; /* the '}' of an empty object */
    }
    p->field = !have_dtype ? "dtype" : !have_shape ? "shape" : !have_off ? "data_offsets" : NULL;
    if (p->field)
        return jfail(p, "missing");
    p->tensor = NULL;
    return 0;
}

static int parse_header(st_file *f, jp *p)
{
    if (expect(p, '{', "'{'") != 0)
        return -1;
    bool have_meta = false;
    ws(p);
    if (peek(p) == '}') {
        p->i++;
    } else {
        for (;;) {
            char *key;
            if (jstring(p, &key) != 0)
                return -1;
            if (expect(p, ':', "':'") != 0) {
                free(key);
                return -1;
            }
            if (strcmp(key, "__metadata__") == 0) {
                free(key);
                if (have_meta) {
                    p->in_meta = true;
                    return jfail(p, "appears twice");
                }
                have_meta = true;
                if (parse_meta(f, p) != 0)
                    return -1;
            } else {
                if (!*key) {
                    free(key);
                    return jfail(p, "empty tensor name");
                }
                if (f->nt == f->capt) {
                    size_t cap = f->capt ? 2 * f->capt : 16;
                    st_tensor *t = realloc(f->t, cap * sizeof *t);
                    if (!t) {
                        free(key);
                        return jfail(p, "out of memory");
                    }
                    f->t = t;
                    f->capt = cap;
                }
                st_tensor *t = &f->t[f->nt++];
                memset(t, 0, sizeof *t);
                t->name = key;
                if (parse_tensor(p, t) != 0)
                    return -1;
            }
            int more = jnext(p, '}');
            if (more < 0)
                return -1;
            if (!more)
                break;
        }
    }
    ws(p);
    if (p->i != p->n)
        return jfail(p, "unexpected data after the JSON object");
    return 0;
}

/* Index sorts (glibc qsort_r: no shared state, so st_open is thread-safe). */
static int cmp_by_name(const void *a, const void *b, void *arg)
{
    const st_tensor *t = arg;
    return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

static int cmp_by_offset(const void *a, const void *b, void *arg)
{
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    const st_tensor *x = (const st_tensor *)arg + i, *y = (const st_tensor *)arg + j;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return i < j ? -1 : i > j ? 1 : 0;
}

static int cmp_by_key(const void *a, const void *b, void *arg)
{
    char *const *k = arg;
    return strcmp(k[*(const size_t *)a], k[*(const size_t *)b]);
}

/* Everything that is not syntax: sizes, offsets, duplicates. */
static int check_tensors(st_file *f, char *err, size_t len)
{
    char q[200], q2[200], sh[200];
    const char *path = f->path;
    for (size_t i = 0; i < f->nt; i++) {
        st_tensor *t = &f->t[i];
        st_quote(q, sizeof q, t->name);
        st_shape_str(sh, sizeof sh, t->ndim, t->shape);
        if (!st_shape_bytes(t->ndim, t->shape, st_dtype_size(t->dtype), &t->nelem, &t->bytes)) {
            errmsg_set(err, len, "%s: tensor '%s': shape %s of %s overflows 64 bits", path, q, sh,
                       st_dtype_name(t->dtype));
            return -1;
        }
        if (t->end < t->begin) {
            errmsg_set(err, len, "%s: tensor '%s': data_offsets [%llu,%llu] end before they begin",
                       path, q, (unsigned long long)t->begin, (unsigned long long)t->end);
            return -1;
        }
        if (t->end - t->begin != t->bytes) {
            errmsg_set(err, len,
                       "%s: tensor '%s': data_offsets [%llu,%llu] do not match shape %s of %s "
                       "(%llu bytes)",
                       path, q, (unsigned long long)t->begin, (unsigned long long)t->end, sh,
                       st_dtype_name(t->dtype), (unsigned long long)t->bytes);
            return -1;
        }
        if (t->end > f->data_len) {
            errmsg_set(err, len,
                       "%s: tensor '%s': data_offsets [%llu,%llu] lie beyond the end of the data "
                       "(%llu bytes after the header)",
                       path, q, (unsigned long long)t->begin, (unsigned long long)t->end,
                       (unsigned long long)f->data_len);
            return -1;
        }
    }

    size_t n = f->nt;
    f->by_name = malloc((n ? n : 1) * sizeof *f->by_name);
    size_t *by_off = malloc((n ? n : 1) * sizeof *by_off);
    f->meta_by_key = malloc((f->nm ? f->nm : 1) * sizeof *f->meta_by_key);
    if (!f->by_name || !by_off || !f->meta_by_key) {
        free(by_off);
        errmsg_set(err, len, "%s: out of memory", path);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        f->by_name[i] = by_off[i] = i;
    for (size_t i = 0; i < f->nm; i++)
        f->meta_by_key[i] = i;
    qsort_r(f->by_name, n, sizeof(size_t), cmp_by_name, f->t);
    qsort_r(by_off, n, sizeof(size_t), cmp_by_offset, f->t);
    qsort_r(f->meta_by_key, f->nm, sizeof(size_t), cmp_by_key, f->mkey);

    int rc = -1;
    for (size_t i = 1; i < n; i++)
        if (strcmp(f->t[f->by_name[i - 1]].name, f->t[f->by_name[i]].name) == 0) {
            errmsg_set(err, len, "%s: tensor '%s': appears twice in the header", path,
                       st_quote(q, sizeof q, f->t[f->by_name[i]].name));
            goto out;
        }
    for (size_t i = 1; i < f->nm; i++)
        if (strcmp(f->mkey[f->meta_by_key[i - 1]], f->mkey[f->meta_by_key[i]]) == 0) {
            errmsg_set(err, len, "%s: metadata '%s': appears twice in the header", path,
                       st_quote(q, sizeof q, f->mkey[f->meta_by_key[i]]));
            goto out;
        }
    uint64_t pos = 0;
    const st_tensor *prev = NULL;
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = &f->t[by_off[i]];
        if (t->begin < pos) {
            errmsg_set(err, len,
                       "%s: tensor '%s': data_offsets [%llu,%llu] overlap tensor '%s' [%llu,%llu]",
                       path, st_quote(q, sizeof q, t->name), (unsigned long long)t->begin,
                       (unsigned long long)t->end, st_quote(q2, sizeof q2, prev->name),
                       (unsigned long long)prev->begin, (unsigned long long)prev->end);
            goto out;
        }
        if (t->begin > pos) {
            if (prev)
                errmsg_set(err, len,
                           "%s: tensor '%s': data_offsets [%llu,%llu] leave a gap after tensor "
                           "'%s', which ends at %llu",
                           path, st_quote(q, sizeof q, t->name), (unsigned long long)t->begin,
                           (unsigned long long)t->end, st_quote(q2, sizeof q2, prev->name),
                           (unsigned long long)pos);
            else
                errmsg_set(err, len,
                           "%s: tensor '%s': data_offsets [%llu,%llu] leave a gap: the first "
                           "tensor must start at 0",
                           path, st_quote(q, sizeof q, t->name), (unsigned long long)t->begin,
                           (unsigned long long)t->end);
            goto out;
        }
        pos = t->end;
        prev = t;
    }
    if (pos != f->data_len) {
        errmsg_set(err, len,
                   "%s: the file has %llu data bytes after the header but its tensors cover %llu",
                   path, (unsigned long long)f->data_len, (unsigned long long)pos);
        goto out;
    }
    rc = 0;
out:
    free(by_off);
    return rc;
}

void st_close(st_file *f)
{
    if (!f)
        return;
    if (f->map)
        munmap(f->map, f->map_len);
    if (f->fd >= 0)
        close(f->fd);
    for (size_t i = 0; i < f->nt; i++)
        free((char *)f->t[i].name);
    for (size_t i = 0; i < f->nm; i++) {
        free(f->mkey[i]);
        free(f->mval[i]);
    }
    free(f->t);
    free(f->mkey);
    free(f->mval);
    free(f->by_name);
    free(f->meta_by_key);
    free(f->path);
    free(f);
}

int st_open(const char *path, st_file **out, char *err, size_t err_len)
{
    *out = NULL;
    st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        errmsg_set(err, err_len, "%s: out of memory", path);
        return -1;
    }
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        errmsg_set(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    struct stat sb;
    if (fstat(f->fd, &sb) != 0) {
        errmsg_set(err, err_len, "%s: stat: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        errmsg_set(err, err_len, "%s: not a regular file", path);
        goto fail;
    }
    f->file_size = (uint64_t)sb.st_size;
    if (f->file_size < 8) {
        errmsg_set(err, err_len,
                   "%s: file is %llu bytes, too short for the 8-byte header length", path,
                   (unsigned long long)f->file_size);
        goto fail;
    }
    unsigned char lenb[8];
    int r = pread_all(f->fd, lenb, 8, 0);
    if (r != 0) {
        errmsg_set(err, err_len, "%s: read: %s", path, r < 0 ? strerror(errno) : "file shrank");
        goto fail;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | lenb[i];
    if (n == 0) {
        errmsg_set(err, err_len, "%s: header length is 0", path);
        goto fail;
    }
    if (n > ST_MAX_HEADER) {
        errmsg_set(err, err_len, "%s: header length %llu exceeds the limit of %u bytes", path,
                   (unsigned long long)n, ST_MAX_HEADER);
        goto fail;
    }
    if (n > f->file_size - 8) {
        errmsg_set(err, err_len, "%s: header length %llu exceeds the file size (%llu bytes)", path,
                   (unsigned long long)n, (unsigned long long)f->file_size);
        goto fail;
    }
    f->header_len = n;
    f->data_off = 8 + n;
    f->data_len = f->file_size - f->data_off;
    unsigned char *hdr = malloc((size_t)n);
    if (!hdr) {
        errmsg_set(err, err_len, "%s: out of memory for a %llu-byte header", path,
                   (unsigned long long)n);
        goto fail;
    }
    r = pread_all(f->fd, hdr, (size_t)n, 8);
    if (r != 0) {
        errmsg_set(err, err_len, "%s: read: %s", path, r < 0 ? strerror(errno) : "file shrank");
        free(hdr);
        goto fail;
    }
    jp p = {.s = hdr, .n = (size_t)n, .path = path, .err = err, .len = err_len};
    r = parse_header(f, &p);
    free(hdr);
    if (r != 0 || check_tensors(f, err, err_len) != 0)
        goto fail;
    *out = f;
    return 0;
fail:
    st_close(f);
    return -1;
}

const char *st_path(const st_file *f)
{
    return f->path;
}

uint64_t st_data_offset(const st_file *f)
{
    return f->data_off;
}

size_t st_count(const st_file *f)
{
    return f->nt;
}

const st_tensor *st_tensor_at(const st_file *f, size_t i)
{
    return i < f->nt ? &f->t[i] : NULL;
}

const st_tensor *st_find(const st_file *f, const char *name)
{
    size_t lo = 0, hi = f->nt;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, f->t[f->by_name[mid]].name);
        if (c == 0)
            return &f->t[f->by_name[mid]];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

const st_tensor *st_expect(const st_file *f, const char *name, st_dtype dtype, int ndim,
                           const uint64_t *shape, char *err, size_t err_len)
{
    char q[200], a[200], b[200];
    const st_tensor *t = st_find(f, name);
    if (!t) {
        errmsg_set(err, err_len, "%s: no tensor '%s'", f->path, st_quote(q, sizeof q, name));
        return NULL;
    }
    bool same = t->dtype == dtype && t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = t->shape[i] == shape[i];
    if (!same) {
        st_shape_str(a, sizeof a, ndim < 0 ? 0 : ndim > ST_MAX_DIMS ? ST_MAX_DIMS : ndim, shape);
        st_shape_str(b, sizeof b, t->ndim, t->shape);
        errmsg_set(err, err_len, "%s: tensor '%s': expected %s %s, the file has %s %s", f->path,
                   st_quote(q, sizeof q, name), st_dtype_name(dtype) ? st_dtype_name(dtype) : "?",
                   a, st_dtype_name(t->dtype), b);
        return NULL;
    }
    return t;
}

static bool owns(const st_file *f, const st_tensor *t)
{
    return f->nt > 0 && t >= f->t && t < f->t + f->nt;
}

int st_read_tensor(st_file *f, const st_tensor *t, void *dst, size_t bytes, char *err,
                   size_t err_len)
{
    char q[200];
    if (!owns(f, t)) {
        errmsg_set(err, err_len, "%s: tensor is not from this file", f->path);
        return -1;
    }
    if ((uint64_t)bytes != t->bytes) {
        errmsg_set(err, err_len, "%s: tensor '%s': has %llu bytes, the buffer %zu", f->path,
                   st_quote(q, sizeof q, t->name), (unsigned long long)t->bytes, bytes);
        return -1;
    }
    if (bytes == 0)
        return 0;
    int r = pread_all(f->fd, dst, bytes, f->data_off + t->begin);
    if (r != 0) {
        errmsg_set(err, err_len, "%s: tensor '%s': read: %s", f->path, st_quote(q, sizeof q, t->name),
                   r < 0 ? strerror(errno) : "the file ends before its data (it shrank)");
        return -1;
    }
    return 0;
}

int st_read(st_file *f, const char *name, void *dst, size_t bytes, char *err, size_t err_len)
{
    char q[200];
    const st_tensor *t = st_find(f, name);
    if (!t) {
        errmsg_set(err, err_len, "%s: no tensor '%s'", f->path, st_quote(q, sizeof q, name));
        return -1;
    }
    return st_read_tensor(f, t, dst, bytes, err, err_len);
}

const void *st_data(st_file *f, const st_tensor *t, char *err, size_t err_len)
{
    if (!owns(f, t)) {
        errmsg_set(err, err_len, "%s: tensor is not from this file", f->path);
        return NULL;
    }
    if (!f->map) {
        void *m = mmap(NULL, (size_t)f->file_size, PROT_READ, MAP_PRIVATE, f->fd, 0);
        if (m == MAP_FAILED) {
            errmsg_set(err, err_len, "%s: mmap: %s", f->path, strerror(errno));
            return NULL;
        }
        f->map = m;
        f->map_len = (size_t)f->file_size;
    }
    return (const char *)f->map + f->data_off + t->begin;
}

const char *st_meta(const st_file *f, const char *key)
{
    size_t lo = 0, hi = f->nm;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        size_t k = f->meta_by_key[mid];
        int c = strcmp(key, f->mkey[k]);
        if (c == 0)
            return f->mval[k];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

size_t st_meta_count(const st_file *f)
{
    return f->nm;
}

void st_meta_at(const st_file *f, size_t i, const char **key, const char **value)
{
    if (i >= f->nm) {
        *key = *value = NULL;
        return;
    }
    *key = f->mkey[i];
    *value = f->mval[i];
}
