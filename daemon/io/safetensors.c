/* safetensors.c — the safetensors reader: st_open validates a file, its
 * header parsed by jansson, then tensors are looked up, read or mapped.
 * See safetensors.h for the format and the contracts.
 *
 * One concern, past 1,000 lines: jansson alone decides what a header is,
 * but it keeps no byte positions, and a person with a bad checkpoint needs
 * "header byte N, tensor T, field F" to find the fault.  The walks over the
 * text below (positions, and what jansson refused) only place an error
 * that jansson or the checks have already found; they accept nothing. */
#include "safetensors.h"

#include "errmsg.h"
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
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

/* ---- reader: the header through jansson ---------------------------------- */

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

/* jansson decides what the header holds: one json_loadb of the whole text,
 * duplicate keys refused at every level.  Its values carry no positions,
 * though, and every message names the byte of the header at fault, so the
 * positions are found again in the text when something is wrong: in a
 * header jansson took, by counting members (jansson skips each value; see
 * "positions"), and in one it refused, by walking the text up to the token
 * it stopped at (see "jansson's refusals").  Neither walk decides anything
 * about what is accepted. */
typedef struct {
    const char *s; /* the header text, n bytes, not NUL-terminated */
    size_t n;
    const char *path;
    char *err;
    size_t len;
    /* The one "-0" in shape or data_offsets that jansson's values hide:
     * element nz_elem of field nz_field of member nz_member, at byte nz_at
     * (see find_negative_zero). */
    bool nz;
    size_t nz_member, nz_field, nz_elem, nz_at;
} htext;

/* Where a message points: a tensor (or, with meta, a metadata key), and a
 * field of the tensor.  All may be NULL. */
typedef struct {
    const char *tensor;
    bool meta;
    const char *field;
} hctx;

static const char *const fields[] = {"dtype", "shape", "data_offsets"};

static int field_index(const char *key)
{
    for (int i = 0; i < 3; i++)
        if (strcmp(key, fields[i]) == 0)
            return i;
    return -1;
}

__attribute__((format(printf, 4, 5))) static int hfail(const htext *h, hctx c, size_t at,
                                                       const char *fmt, ...)
{
    char msg[384], q[200], ctx[512] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t o = 0;
    if (c.tensor)
        o += (size_t)snprintf(ctx + o, sizeof ctx - o, "%s '%s': ",
                              c.meta ? "metadata" : "tensor", st_quote(q, sizeof q, c.tensor));
    else if (c.meta)
        o += (size_t)snprintf(ctx + o, sizeof ctx - o, "__metadata__: ");
    if (c.field && o < sizeof ctx)
        snprintf(ctx + o, sizeof ctx - o, "field '%s': ", c.field);
    errmsg_set(h->err, h->len, "%s: %sheader byte %zu: %s", h->path, ctx, at, msg);
    return -1;
}

/* What stands at byte i, for "expected X, found Y". */
static const char *found(const htext *h, size_t i, char buf[24])
{
    if (i >= h->n)
        return "the end of the header";
    unsigned char c = (unsigned char)h->s[i];
    if (c >= 0x21 && c < 0x7f)
        snprintf(buf, 24, "'%c'", c);
    else
        snprintf(buf, 24, "byte 0x%02x", c);
    return buf;
}

static size_t ws(const htext *h, size_t i)
{
    while (i < h->n && (h->s[i] == ' ' || h->s[i] == '\t' || h->s[i] == '\n' || h->s[i] == '\r'))
        i++;
    return i;
}

/* One JSON value at byte i, by jansson; *end is where it stops.  NULL with
 * the error in *e (positions relative to i) if there is none. */
static json_t *value_at(const htext *h, size_t i, size_t *end, json_error_t *e)
{
    json_t *v = json_loadb(h->s + i, h->n - i, JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK, e);
    *end = i + (v ? (size_t)e->position : 0);
    return v;
}

/* ---- positions in a header jansson took ----------------------------------- */

static size_t skip(const htext *h, size_t i)
{
    json_error_t e;
    size_t end;
    json_t *v = value_at(h, i, &end, &e);
    json_decref(v);
    return v ? end : h->n;
}

/* Steps through the members of the object (or the elements of the array)
 * whose value starts at i, to member k or to the one holding byte `at`
 * (SIZE_MAX for the one not asked for).  Returns its index, with *v where
 * its value starts and, in an object, *key_end where its key ends; SIZE_MAX
 * if there is none.  The text is valid JSON here: only whitespace and
 * punctuation are stepped over by hand. */
static size_t member(const htext *h, size_t i, size_t k, size_t at, size_t *v, size_t *key_end)
{
    if (i >= h->n || (h->s[i] != '{' && h->s[i] != '['))
        return SIZE_MAX;
    bool obj = h->s[i] == '{';
    i = ws(h, i + 1);
    for (size_t j = 0; i < h->n && h->s[i] != '}' && h->s[i] != ']'; j++) {
        if (obj) {
            i = skip(h, i);
            if (key_end)
                *key_end = i;
            i = ws(h, ws(h, i) + 1); /* the ':' */
        }
        size_t end = j == k ? i : skip(h, i);
        if (j == k || (at >= i && at < end)) {
            *v = i;
            return j;
        }
        i = ws(h, end);
        if (i >= h->n || h->s[i] != ',')
            break;
        i = ws(h, i + 1);
    }
    return SIZE_MAX;
}

/* Where the value of member k starts. */
static size_t nth(const htext *h, size_t i, size_t k, size_t *key_end)
{
    size_t v = h->n;
    member(h, i, k, SIZE_MAX, &v, key_end);
    return v;
}

/* jansson reads "-0" as the integer 0, which the format refuses like any
 * negative number (as the safetensors package does).  In a header jansson
 * took, a '-' outside strings can only start a number, and every number
 * other than a "-0" in shape or data_offsets is refused by the checks on
 * the values themselves, at or before the first '-'.  So only the first
 * '-' is looked at, and only a "-0" there is located, once. */
static void find_negative_zero(htext *h)
{
    h->nz = false;
    if (!memchr(h->s, '-', h->n))
        return;
    size_t at = h->n;
    bool in_string = false;
    for (size_t i = 0; i < h->n && at == h->n; i++) {
        if (in_string) {
            if (h->s[i] == '\\')
                i++;
            else if (h->s[i] == '"')
                in_string = false;
        } else if (h->s[i] == '"') {
            in_string = true;
        } else if (h->s[i] == '-') {
            at = i;
        }
    }
    /* "-0." and "-0e" start a real, refused as one. */
    if (at + 1 >= h->n || h->s[at + 1] != '0' ||
        (at + 2 < h->n && (h->s[at + 2] == '.' || h->s[at + 2] == 'e' || h->s[at + 2] == 'E')))
        return;
    size_t v1 = 0, v2 = 0, v3 = 0;
    size_t k = member(h, ws(h, 0), SIZE_MAX, at, &v1, NULL);
    size_t j = k == SIZE_MAX ? SIZE_MAX : member(h, v1, SIZE_MAX, at, &v2, NULL);
    size_t e = j == SIZE_MAX ? SIZE_MAX : member(h, v2, SIZE_MAX, at, &v3, NULL);
    if (e == SIZE_MAX || v3 != at)
        return;
    h->nz = true;
    h->nz_member = k;
    h->nz_field = j;
    h->nz_elem = e;
    h->nz_at = at;
}

/* ---- the members of a header jansson took --------------------------------- */

static int add_meta(st_file *f, const htext *h, const char *key, const char *value)
{
    if (f->nm == f->capm) {
        size_t cap = f->capm ? 2 * f->capm : 8;
        char **a = realloc(f->mkey, cap * sizeof *a);
        if (a)
            f->mkey = a;
        char **b = realloc(f->mval, cap * sizeof *b);
        if (b)
            f->mval = b;
        if (!a || !b)
            return errmsg_set(h->err, h->len, "%s: out of memory", h->path);
        f->capm = cap;
    }
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return errmsg_set(h->err, h->len, "%s: out of memory", h->path);
    }
    f->mkey[f->nm] = k;
    f->mval[f->nm] = v;
    f->nm++;
    return 0;
}

/* A value in a header jansson took: member `member` of the header, and
 * (field >= 0) member `field` of that.  Its byte is only looked for when a
 * message needs it. */
typedef struct {
    size_t member;
    long field;
} hpath;

static size_t pos(const htext *h, hpath p, size_t *key_end)
{
    size_t at = nth(h, ws(h, 0), p.member, key_end);
    return p.field < 0 ? at : nth(h, at, (size_t)p.field, key_end);
}

/* __metadata__: an object of strings. */
static int take_meta(st_file *f, const htext *h, hpath p, json_t *v)
{
    char fb[24];
    hctx c = {.meta = true};
    if (!json_is_object(v)) {
        size_t at = pos(h, p, NULL);
        return hfail(h, c, at, "expected an object of strings, found %s", found(h, at, fb));
    }
    hpath mp = {p.member, 0};
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val) {
        c.tensor = key;
        if (!json_is_string(val))
            return hfail(h, c, pos(h, mp, NULL), "value is not a string");
        if (add_meta(f, h, key, json_string_value(val)) != 0)
            return -1;
        mp.field++;
    }
    return 0;
}

/* An element of shape or data_offsets, at byte `at`, refused: say why. */
static int bad_uint(const htext *h, hctx c, json_t *v, size_t at)
{
    char fb[24];
    if (!json_is_number(v))
        return hfail(h, c, at, "expected an integer, found %s", found(h, at, fb));
    if (h->s[at] == '-')
        return hfail(h, c, at, "negative number");
    size_t i = at;
    while (i < h->n && h->s[i] >= '0' && h->s[i] <= '9')
        i++;
    return hfail(h, c, i, "not an integer");
}

/* shape or data_offsets: an array of at most max non-negative integers. */
static int take_uints(const htext *h, hctx c, hpath p, json_t *v, uint64_t *out, int max,
                      int *count)
{
    char fb[24];
    if (!json_is_array(v)) {
        size_t at = pos(h, p, NULL);
        return hfail(h, c, at, "expected '[', found %s", found(h, at, fb));
    }
    size_t n = json_array_size(v);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(v, i);
        if (i == (size_t)max)
            return hfail(h, c, nth(h, pos(h, p, NULL), i, NULL), "more than %d entries", max);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return bad_uint(h, c, x, nth(h, pos(h, p, NULL), i, NULL));
        if (h->nz && h->nz_member == p.member && h->nz_field == (size_t)p.field && h->nz_elem == i)
            return hfail(h, c, h->nz_at, "negative number");
        out[i] = (uint64_t)json_integer_value(x);
    }
    *count = (int)n;
    return 0;
}

/* A tensor's entry; its name is owned by *t already. */
static int take_tensor(const htext *h, hpath p, json_t *v, st_tensor *t)
{
    char fb[24], q[200];
    hctx c = {.tensor = t->name};
    if (!json_is_object(v)) {
        size_t at = pos(h, p, NULL);
        return hfail(h, c, at, "expected an object, found %s", found(h, at, fb));
    }
    bool have[3] = {false, false, false};
    hpath fp = {p.member, 0};
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val) {
        int which = field_index(key);
        size_t key_end = 0;
        if (which < 0) {
            pos(h, fp, &key_end);
            return hfail(h, c, key_end, "unknown field '%s'", st_quote(q, sizeof q, key));
        }
        c.field = fields[which];
        have[which] = true;
        if (which == 0) {
            const char *d = json_string_value(val);
            if (!d) {
                size_t at = pos(h, fp, NULL);
                return hfail(h, c, at, "expected a string, found %s", found(h, at, fb));
            }
            if (st_dtype_from_name(d, &t->dtype) != 0)
                return hfail(h, c, pos(h, fp, NULL), "unknown dtype '%s'",
                             st_quote(q, sizeof q, d));
        } else if (which == 1) {
            if (take_uints(h, c, fp, val, t->shape, ST_MAX_DIMS, &t->ndim) != 0)
                return -1;
        } else {
            uint64_t o[2];
            int n = 0;
            if (take_uints(h, c, fp, val, o, 2, &n) != 0)
                return -1;
            if (n != 2)
                return hfail(h, c, skip(h, pos(h, fp, NULL)), "has %d entries, not 2", n);
            t->begin = o[0];
            t->end = o[1];
        }
        c.field = NULL;
        fp.field++;
    }
    for (int i = 0; i < 3; i++)
        if (!have[i]) {
            c.field = fields[i];
            return hfail(h, c, skip(h, pos(h, p, NULL)), "missing");
        }
    return 0;
}

static int take_members(st_file *f, const htext *h, json_t *root)
{
    size_t k = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        hpath p = {k, -1};
        if (strcmp(key, "__metadata__") == 0) {
            if (take_meta(f, h, p, v) != 0)
                return -1;
        } else {
            if (!*key)
                return hfail(h, (hctx){0}, pos(h, p, NULL), "empty tensor name");
            if (f->nt == f->capt) {
                size_t cap = f->capt ? 2 * f->capt : 16;
                st_tensor *t = realloc(f->t, cap * sizeof *t);
                if (!t)
                    return errmsg_set(h->err, h->len, "%s: out of memory", h->path);
                f->t = t;
                f->capt = cap;
            }
            st_tensor *t = &f->t[f->nt];
            memset(t, 0, sizeof *t);
            if (!(t->name = strdup(key)))
                return errmsg_set(h->err, h->len, "%s: out of memory", h->path);
            f->nt++;
            if (take_tensor(h, p, v, t) != 0)
                return -1;
        }
        k++;
    }
    return 0;
}

/* ---- jansson's refusals ----------------------------------------------------- */

/* jansson says where it stopped and, in its own words, why; the message
 * says what was expected there and what was found, in which tensor and
 * field.  This walk follows the text up to that point: braces, brackets,
 * ':' and ',' by hand, every string, number and literal read by jansson,
 * which refuses it just as it did within the whole header, so the walk
 * stops at the same token; what the walk adds is where that token is. */
typedef struct {
    const htext *h;
    const json_error_t *je; /* jansson's refusal of the whole header */
    char *member;           /* key of the header member being read, decoded */
    char *inner;            /* key of that member's member being read */
} xw;

static hctx xctx(const xw *x)
{
    hctx c = {0};
    if (!x->member)
        return c;
    if (strcmp(x->member, "__metadata__") == 0) {
        c.meta = true;
        c.tensor = x->inner;
    } else {
        c.tensor = x->member;
        if (x->inner && field_index(x->inner) >= 0)
            c.field = x->inner;
    }
    return c;
}

static bool hex4(const htext *h, size_t i, uint32_t *out)
{
    uint32_t v = 0;
    for (size_t k = 0; k < 4; k++) {
        char c = i + k < h->n ? h->s[i + k] : 0;
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return false;
        v = v << 4 | (uint32_t)d;
    }
    *out = v;
    return true;
}

/* jansson refused the string at byte t for an escape (or a \u0000 in it):
 * find the first bad one. */
static int bad_escape(const xw *x, size_t t, size_t at)
{
    const htext *h = x->h;
    hctx c = xctx(x);
    for (size_t j = t + 1; j < h->n && h->s[j] != '"'; j++) {
        if (h->s[j] != '\\')
            continue;
        unsigned char e = j + 1 < h->n ? (unsigned char)h->s[j + 1] : 0;
        uint32_t cp, lo;
        if (e != 'u') {
            if (e && strchr("\"\\/bfnrt", e)) {
                j++;
                continue;
            }
            if (e >= 0x21 && e < 0x7f)
                return hfail(h, c, j + 1, "invalid escape '\\%c'", e);
            return hfail(h, c, j + 1, "invalid escape '\\' then byte 0x%02x", e);
        }
        if (!hex4(h, j + 2, &cp))
            return hfail(h, c, j + 2, "bad hex digit in \\u escape");
        if (cp >= 0xDC00 && cp <= 0xDFFF)
            return hfail(h, c, j, "lone low surrogate \\u%04x", cp);
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (j + 7 >= h->n || h->s[j + 6] != '\\' || h->s[j + 7] != 'u' ||
                !hex4(h, j + 8, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                return hfail(h, c, j, "high surrogate \\u%04x not followed by a low one", cp);
            j += 6;
        }
        if (cp == 0)
            return hfail(h, c, j, "NUL character (\\u0000) in string");
        j += 5;
    }
    return hfail(h, c, at, "%s", x->je->text);
}

static int bad_string(const xw *x, size_t t, const json_error_t *e)
{
    const htext *h = x->h;
    hctx c = xctx(x);
    size_t at = t + (size_t)e->position;
    switch (json_error_code(e)) {
    case json_error_invalid_utf8:
        return hfail(h, c, at, "invalid UTF-8 in string");
    case json_error_premature_end_of_input:
        return hfail(h, c, at, "unterminated string");
    case json_error_null_character:
    case json_error_null_byte_in_key:
        return bad_escape(x, t, at);
    default:
        break;
    }
    /* jansson stops in front of a control character. */
    if (at < h->n && (unsigned char)h->s[at] < 0x20)
        return hfail(h, c, at, "control character 0x%02x in string", (unsigned char)h->s[at]);
    return bad_escape(x, t, at);
}

static int bad_number(const xw *x, size_t t, const json_error_t *e)
{
    const htext *h = x->h;
    hctx c = xctx(x);
    if (h->s[t] == '-')
        return hfail(h, c, t, "negative number");
    size_t d = t;
    while (d < h->n && h->s[d] >= '0' && h->s[d] <= '9')
        d++;
    if (h->s[t] == '0' && d > t + 1)
        return hfail(h, c, t, "integer with a leading zero");
    if (d < h->n && (h->s[d] == '.' || h->s[d] == 'e' || h->s[d] == 'E'))
        return hfail(h, c, d, "not an integer");
    if (json_error_code(e) == json_error_numeric_overflow)
        return hfail(h, c, t, "integer does not fit in 64 bits (the largest allowed is %lld)",
                     (long long)INT64_MAX);
    return hfail(h, c, t, "%s", e->text);
}

/* A string, number or literal at byte t; *end is past it, and *str (if
 * not NULL) a copy of the string. */
static int x_scalar(const xw *x, size_t t, const char *what, size_t *end, char **str)
{
    json_error_t e;
    json_t *v = value_at(x->h, t, end, &e);
    if (!v) {
        char c = x->h->s[t], fb[24];
        if (c == '"')
            return bad_string(x, t, &e);
        if (c == '-' || (c >= '0' && c <= '9'))
            return bad_number(x, t, &e);
        return hfail(x->h, xctx(x), t, "expected %s, found %s", what, found(x->h, t, fb));
    }
    if (str && !(*str = strdup(json_string_value(v) ? json_string_value(v) : "")))
        return errmsg_set(x->h->err, x->h->len, "%s: out of memory", x->h->path);
    json_decref(v);
    return 0;
}

static int x_value(xw *x, size_t *i, int depth, const char *what);

/* The duplicate key jansson refused, member of an object at `depth`. */
static int x_dup(const xw *x, int depth, const char *key, size_t end)
{
    const htext *h = x->h;
    char q[200];
    if (depth == 0 && strcmp(key, "__metadata__") == 0) {
        size_t at = ws(h, end);
        return hfail(h, (hctx){.meta = true}, at + (at < h->n && h->s[at] == ':'),
                     "appears twice");
    }
    if (depth == 0)
        return errmsg_set(h->err, h->len, "%s: tensor '%s': appears twice in the header",
                          h->path, st_quote(q, sizeof q, key));
    if (depth == 1 && strcmp(x->member, "__metadata__") == 0)
        return errmsg_set(h->err, h->len, "%s: metadata '%s': appears twice in the header",
                          h->path, st_quote(q, sizeof q, key));
    if (depth == 1 && field_index(key) >= 0)
        return hfail(h, (hctx){.tensor = x->member, .field = key}, end, "appears twice");
    return hfail(h, xctx(x), end, "key '%s' appears twice", st_quote(q, sizeof q, key));
}

/* The object at byte *i, `depth` objects or arrays deep. */
static int x_object(xw *x, size_t *i, int depth)
{
    const htext *h = x->h;
    char fb[24];
    size_t t = ws(h, *i + 1);
    if (t < h->n && h->s[t] == '}') {
        *i = t + 1;
        return 0;
    }
    for (;;) {
        if (t >= h->n || h->s[t] != '"')
            return hfail(h, xctx(x), t, "expected a string, found %s", found(h, t, fb));
        size_t end;
        char *key = NULL;
        if (x_scalar(x, t, "a string", &end, &key) != 0)
            return -1;
        if (json_error_code(x->je) == json_error_duplicate_key &&
            end == (size_t)x->je->position) {
            x_dup(x, depth, key, end);
            free(key);
            return -1;
        }
        t = ws(h, end);
        if (t >= h->n || h->s[t] != ':') {
            free(key);
            return hfail(h, xctx(x), t, "expected ':', found %s", found(h, t, fb));
        }
        char **slot = depth == 0 ? &x->member : depth == 1 ? &x->inner : NULL;
        if (slot)
            *slot = key;
        else
            free(key);
        size_t v = t + 1;
        int rc = x_value(x, &v, depth + 1, "a value");
        if (slot) {
            free(*slot);
            *slot = NULL;
        }
        if (rc != 0)
            return -1;
        t = ws(h, v);
        if (t < h->n && h->s[t] == ',') {
            t = ws(h, t + 1);
            continue;
        }
        if (t < h->n && h->s[t] == '}') {
            *i = t + 1;
            return 0;
        }
        return hfail(h, xctx(x), t, "expected ',' or '}', found %s", found(h, t, fb));
    }
}

/* The header's arrays hold integers only, hence what is asked for. */
static int x_array(xw *x, size_t *i, int depth)
{
    const htext *h = x->h;
    char fb[24];
    size_t t = ws(h, *i + 1);
    if (t < h->n && h->s[t] == ']') {
        *i = t + 1;
        return 0;
    }
    for (;;) {
        if (x_value(x, &t, depth + 1, "an integer") != 0)
            return -1;
        t = ws(h, t);
        if (t < h->n && h->s[t] == ',') {
            t++;
            continue;
        }
        if (t < h->n && h->s[t] == ']') {
            *i = t + 1;
            return 0;
        }
        return hfail(h, xctx(x), t, "expected ',' or ']', found %s", found(h, t, fb));
    }
}

static int x_value(xw *x, size_t *i, int depth, const char *what)
{
    const htext *h = x->h;
    char fb[24];
    size_t t = ws(h, *i);
    /* jansson refuses deeper nesting first (see explain). */
    if (depth > JSON_PARSER_MAX_DEPTH)
        return hfail(h, xctx(x), t, "%s", x->je->text);
    if (t >= h->n || strchr("}]:,", h->s[t]))
        return hfail(h, xctx(x), t, "expected %s, found %s", what, found(h, t, fb));
    *i = t;
    if (h->s[t] == '{')
        return x_object(x, i, depth);
    if (h->s[t] == '[')
        return x_array(x, i, depth);
    return x_scalar(x, t, what, i, NULL);
}

static int explain(const htext *h, const json_error_t *je)
{
    switch (json_error_code(je)) {
    case json_error_out_of_memory:
        return errmsg_set(h->err, h->len, "%s: out of memory reading the header", h->path);
    case json_error_stack_overflow:
        return hfail(h, (hctx){0}, (size_t)je->position, "objects or arrays nested too deeply");
    default:
        break;
    }
    xw x = {.h = h, .je = je};
    size_t i = ws(h, 0);
    int rc = x_object(&x, &i, 0);
    free(x.member);
    free(x.inner);
    if (rc != 0)
        return -1;
    /* The walk found the text sound where jansson did not: say what it said. */
    return hfail(h, (hctx){0}, (size_t)je->position, "%s", je->text);
}

static int parse_header(st_file *f, htext *h)
{
    char fb[24];
    size_t i = ws(h, 0);
    if (i >= h->n || h->s[i] != '{')
        return hfail(h, (hctx){0}, i, "expected '{', found %s", found(h, i, fb));
    json_error_t je;
    json_t *root = json_loadb(h->s, h->n, JSON_REJECT_DUPLICATES | JSON_DISABLE_EOF_CHECK, &je);
    if (!root)
        return explain(h, &je);
    size_t end = ws(h, (size_t)je.position);
    int rc = -1;
    if (end != h->n) {
        hfail(h, (hctx){0}, end, "unexpected data after the JSON object");
    } else {
        find_negative_zero(h);
        rc = take_members(f, h, root);
    }
    json_decref(root);
    return rc;
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

/* What the JSON cannot say: sizes and offsets. */
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

    /* Names are unique: jansson refused duplicate keys. */
    int rc = -1;
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
    f->fd = fileio_open_regular(path, O_RDONLY, 0, err, err_len);
    if (f->fd < 0)
        goto fail;
    struct stat sb;
    if (fstat(f->fd, &sb) != 0) {
        errmsg_set(err, err_len, "%s: stat: %s", path, strerror(errno));
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
    htext h = {.s = (const char *)hdr, .n = (size_t)n, .path = path, .err = err, .len = err_len};
    r = parse_header(f, &h);
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
