/* data_jsonl.c — fine-tuning samples from JSON Lines: the reader (one line
 * at a time, a small JSON parser that knows the three fields it needs and
 * skips the rest), the label shift, and the laying of samples into rows,
 * packed or one to a row, for the stream and the evaluation pass.  The
 * format and its rules are in data.h. */
#include "data_internal.h"

#include "errmsg.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IGNORE_LABEL (-100)
#define SKIP_DEPTH 64 /* nesting a skipped value may have */

/* ---- growable buffers, charged to the budget ---------------------------------- */

typedef struct {
    void *p;
    size_t len, cap; /* bytes; cap is what the budget was charged */
} gbuf;

/* Room for `more` bytes after len: twice the buffer where the budget
 * allows, never refused for the doubling alone (as data_text.c grows). */
static int gbuf_reserve(gbuf *b, size_t more, data_budget *bud, const char *path, char *err, size_t err_len)
{
    if (more <= b->cap - b->len)
        return 0;
    if (more > SIZE_MAX / 4 - b->len)
        return data_oom(path, err, err_len);
    size_t want = b->len + more, ncap = b->cap * 2 > want ? b->cap * 2 : want;
    if (ncap < 4096)
        ncap = 4096;
    uint64_t room = data_budget_room(bud);
    if (ncap > want && ncap - b->cap > room)
        ncap = want > b->cap + room ? want : (size_t)(b->cap + room);
    if (data_budget_take(bud, ncap - b->cap, path, err, err_len) != 0)
        return -1;
    void *np = realloc(b->p, ncap);
    if (!np) {
        data_budget_give(bud, ncap - b->cap);
        return data_oom(path, err, err_len);
    }
    b->p = np;
    b->cap = ncap;
    return 0;
}

/* Give back what is not used (a buffer that is kept). */
static void gbuf_fit(gbuf *b, data_budget *bud)
{
    if (b->cap <= b->len)
        return;
    void *np = realloc(b->p, b->len ? b->len : 1);
    if (!np)
        return;
    data_budget_give(bud, b->cap - b->len);
    b->p = np;
    b->cap = b->len;
}

static void gbuf_drop(gbuf *b, data_budget *bud)
{
    data_budget_give(bud, b->cap);
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- one line's JSON ------------------------------------------------------------ */

/* An array of integers as read: values clamped to int64's near range
 * (anything that large is out of every range checked later). */
typedef struct {
    gbuf v; /* int64_t */
    bool seen;
} ints;

typedef struct {
    const char *p, *start, *end;
    const char *path;
    uint64_t line;
    data_budget *bud;
    char *err;
    size_t err_len;
} lexer;

static int bad(lexer *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(lexer *x, const char *fmt, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return errmsg_set(x->err, x->err_len, "%s:%llu: %s", x->path, (ull)x->line, why);
}

/* Not JSON: where, and what was there. */
static int syntax(lexer *x, const char *expected)
{
    if (x->p >= x->end)
        return bad(x, "not valid JSON: the line ends where %s was expected", expected);
    unsigned char c = (unsigned char)*x->p;
    return bad(x, c >= 0x20 && c < 0x7f ? "not valid JSON at column %zu: '%c' where %s was expected"
                                        : "not valid JSON at column %zu: byte 0x%02x where %s was expected",
               (size_t)(x->p - x->start) + 1, c, expected);
}

static void ws(lexer *x)
{
    while (x->p < x->end && (*x->p == ' ' || *x->p == '\t' || *x->p == '\r' || *x->p == '\n'))
        x->p++;
}

static bool eat(lexer *x, char c)
{
    ws(x);
    if (x->p < x->end && *x->p == c) {
        x->p++;
        return true;
    }
    return false;
}

static int hex4(lexer *x, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++, x->p++) {
        if (x->p >= x->end)
            return syntax(x, "4 hex digits after \\u");
        char c = *x->p;
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                            : 16;
        if (d == 16)
            return syntax(x, "4 hex digits after \\u");
        v = v * 16 + d;
    }
    *out = v;
    return 0;
}

/* A string at x->p ('"' next); its first out_len-1 characters into out
 * (NULL: none kept), ASCII escapes decoded and anything else as '?', which
 * is all a key needs to be compared with the three names. */
static int string(lexer *x, char *out, size_t out_len)
{
    size_t k = 0;
    if (x->p >= x->end || *x->p != '"')
        return syntax(x, "a string");
    x->p++;
    for (;;) {
        if (x->p >= x->end)
            return syntax(x, "the end of the string");
        unsigned char c = (unsigned char)*x->p++;
        if (c == '"')
            break;
        if (c < 0x20) {
            x->p--;
            return syntax(x, "a character of the string (control characters must be escaped)");
        }
        if (c == '\\') {
            if (x->p >= x->end)
                return syntax(x, "an escape");
            char e = *x->p++;
            static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
            const char *f = strchr(from, e);
            if (e == 'u') {
                unsigned u = 0;
                if (hex4(x, &u) != 0)
                    return -1;
                c = u < 0x80 ? (unsigned char)u : '?';
            } else if (e && f) {
                c = (unsigned char)to[f - from];
            } else {
                x->p--;
                return syntax(x, "an escape (one of \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
            }
        }
        if (out && k + 1 < out_len)
            out[k++] = (char)c;
    }
    if (out && out_len)
        out[k] = 0;
    return 0;
}

/* A JSON number's characters (checked as JSON has them); *integral: no
 * fraction or exponent. */
static int number(lexer *x, bool *integral)
{
    if (x->p < x->end && *x->p == '-')
        x->p++;
    if (x->p >= x->end || *x->p < '0' || *x->p > '9')
        return syntax(x, "a digit");
    if (*x->p == '0')
        x->p++;
    else
        while (x->p < x->end && *x->p >= '0' && *x->p <= '9')
            x->p++;
    *integral = true;
    if (x->p < x->end && *x->p == '.') {
        x->p++;
        *integral = false;
        if (x->p >= x->end || *x->p < '0' || *x->p > '9')
            return syntax(x, "a digit after '.'");
        while (x->p < x->end && *x->p >= '0' && *x->p <= '9')
            x->p++;
    }
    if (x->p < x->end && (*x->p == 'e' || *x->p == 'E')) {
        x->p++;
        *integral = false;
        if (x->p < x->end && (*x->p == '+' || *x->p == '-'))
            x->p++;
        if (x->p >= x->end || *x->p < '0' || *x->p > '9')
            return syntax(x, "a digit of the exponent");
        while (x->p < x->end && *x->p >= '0' && *x->p <= '9')
            x->p++;
    }
    return 0;
}

static int literal(lexer *x, const char *word)
{
    size_t l = strlen(word);
    if ((size_t)(x->end - x->p) < l || memcmp(x->p, word, l) != 0)
        return syntax(x, "a JSON value");
    x->p += l;
    return 0;
}

/* Any JSON value, checked and passed over (a key the samples do not use). */
static int skip_value(lexer *x, int depth)
{
    ws(x);
    if (x->p >= x->end)
        return syntax(x, "a value");
    char c = *x->p;
    if (c == '"')
        return string(x, NULL, 0);
    if (c == '-' || (c >= '0' && c <= '9')) {
        bool integral;
        return number(x, &integral);
    }
    if (c == 't')
        return literal(x, "true");
    if (c == 'f')
        return literal(x, "false");
    if (c == 'n')
        return literal(x, "null");
    if (c != '[' && c != '{')
        return syntax(x, "a value");
    if (depth >= SKIP_DEPTH)
        return bad(x, "a value nested deeper than %d at column %zu", SKIP_DEPTH, (size_t)(x->p - x->start) + 1);
    char close = c == '[' ? ']' : '}';
    x->p++;
    if (eat(x, close))
        return 0;
    for (;;) {
        if (close == '}') {
            ws(x);
            if (string(x, NULL, 0) != 0)
                return -1;
            if (!eat(x, ':'))
                return syntax(x, "':'");
        }
        if (skip_value(x, depth + 1) != 0)
            return -1;
        if (eat(x, close))
            return 0;
        if (!eat(x, ','))
            return syntax(x, close == ']' ? "',' or ']'" : "',' or '}'");
    }
}

/* An array of integers (the three fields the samples use). */
static int int_array(lexer *x, const char *key, ints *a)
{
    ws(x);
    if (x->p >= x->end || *x->p != '[')
        return bad(x, "%s: expected an array of integers", key);
    x->p++;
    a->v.len = 0;
    if (eat(x, ']'))
        return 0;
    for (size_t i = 0;; i++) {
        ws(x);
        const char *s = x->p;
        bool integral;
        if (x->p < x->end && *x->p != '-' && (*x->p < '0' || *x->p > '9'))
            return bad(x, "%s[%zu]: expected an integer", key, i);
        if (number(x, &integral) != 0)
            return -1;
        if (!integral)
            return bad(x, "%s[%zu]: %.*s is not an integer", key, i, (int)(x->p - s > 32 ? 32 : x->p - s), s);
        /* Clamped: a value past ±2^40 is out of every range all the same. */
        int64_t v = 0;
        for (const char *q = *s == '-' ? s + 1 : s; q < x->p; q++)
            if (v < ((int64_t)1 << 40))
                v = v * 10 + (*q - '0');
        if (*s == '-')
            v = -v;
        if (gbuf_reserve(&a->v, sizeof v, x->bud, x->path, x->err, x->err_len) != 0)
            return -1;
        memcpy((char *)a->v.p + a->v.len, &v, sizeof v);
        a->v.len += sizeof v;
        if (eat(x, ']'))
            return 0;
        if (!eat(x, ','))
            return syntax(x, "',' or ']'");
    }
}

/* One line's object into ids, labels and mask (each `seen` or not). */
static int parse_line(lexer *x, ints *ids, ints *labels, ints *mask)
{
    ids->seen = labels->seen = mask->seen = false;
    ws(x);
    if (x->p >= x->end || *x->p != '{')
        return bad(x, "not a JSON object (a sample is {\"input_ids\": [...], \"labels\": [...]})");
    x->p++;
    if (!eat(x, '}')) {
        for (;;) {
            char key[32];
            ws(x);
            if (string(x, key, sizeof key) != 0)
                return -1;
            if (!eat(x, ':'))
                return syntax(x, "':'");
            ints *a = strcmp(key, "input_ids") == 0 ? ids
                      : strcmp(key, "labels") == 0 ? labels
                      : strcmp(key, "attention_mask") == 0 ? mask
                                                           : NULL;
            if (a && a->seen)
                return bad(x, "%s: given twice", key);
            if (a) {
                a->seen = true;
                if (int_array(x, key, a) != 0)
                    return -1;
            } else if (skip_value(x, 0) != 0) {
                return -1;
            }
            if (eat(x, '}'))
                break;
            if (!eat(x, ','))
                return syntax(x, "',' or '}'");
        }
    }
    ws(x);
    if (x->p < x->end)
        return syntax(x, "the end of the line after the object");
    return 0;
}

/* ---- the samples ------------------------------------------------------------- */

typedef struct {
    gbuf ids, mask, labels, off, targets; /* int32, bits, int32, uint64, uint32 */
    uint64_t ntok;
    size_t n;
    bool have_labels; /* labels holds every token's label */
} store;

static int32_t *ids32(store *s)
{
    return s->ids.p;
}

/* Switch to explicit labels: every token so far gets its label (its id
 * where labelled, -100 where not), as the mask says. */
static int labels_begin(store *s, lexer *x)
{
    if (gbuf_reserve(&s->labels, s->ids.cap, x->bud, x->path, x->err, x->err_len) != 0)
        return -1;
    int32_t *l = s->labels.p;
    const uint8_t *m = s->mask.p;
    for (uint64_t t = 0; t < s->ntok; t++)
        l[t] = m[t / 8] >> (t % 8) & 1 ? ids32(s)[t] : IGNORE_LABEL;
    s->labels.len = (size_t)s->ntok * sizeof(int32_t);
    s->have_labels = true;
    return 0;
}

/* A parsed line, checked, into the store. */
static int add_sample(store *s, lexer *x, const ints *ids, const ints *labels, const ints *mask, uint32_t vocab,
                      uint32_t context, bool truncate)
{
    if (!ids->seen)
        return bad(x, "input_ids: missing (a sample is {\"input_ids\": [...], \"labels\": [...]})");
    const int64_t *id = ids->v.p, *lab = labels->seen ? labels->v.p : NULL, *am = mask->v.p;
    size_t n = ids->v.len / sizeof *id;
    if (n == 0)
        return bad(x, "input_ids: an empty sample");
    if (labels->seen && labels->v.len != ids->v.len)
        return bad(x, "labels: %zu of them for %zu input_ids (one label a token)", labels->v.len / sizeof *id, n);
    if (mask->seen && mask->v.len != ids->v.len)
        return bad(x, "attention_mask: %zu entries for %zu input_ids", mask->v.len / sizeof *id, n);
    for (size_t t = 0; t < n; t++) {
        if (id[t] < 0 || id[t] >= vocab)
            return bad(x, "input_ids[%zu]: %lld is out of range for vocab %u", t, (long long)id[t], vocab);
        if (lab && lab[t] != IGNORE_LABEL && (lab[t] < 0 || lab[t] >= vocab))
            return bad(x, "labels[%zu]: %lld is neither -100 (ignored) nor a token below vocab %u", t,
                       (long long)lab[t], vocab);
        if (mask->seen && am[t] != 1)
            return bad(x,
                       "attention_mask[%zu]: %lld; a sample's mask must be all 1s (padding inside a sample is "
                       "not supported: leave the padding out)",
                       t, (long long)am[t]);
    }
    if (n > context) {
        if (!truncate)
            return bad(x,
                       "the sample has %zu tokens, more than [model] context %u; shorten it, raise the context, "
                       "or set [data] overlong = truncate",
                       n, context);
        n = context;
    }
    uint32_t targets = 0;
    for (size_t t = 1; t < n; t++)
        targets += !lab || lab[t] != IGNORE_LABEL;
    if (targets == 0) {
        if (n == 1)
            return bad(x, "a sample of one token has no next token to learn");
        return bad(x,
                   "no labelled token to learn from%s: labels[1..%zu] are all -100 (labels[0] is never a target: "
                   "nothing predicts the first token)",
                   n < ids->v.len / sizeof *id ? " within the first [model] context tokens" : "", n - 1);
    }
    if (s->ntok + n > ((uint64_t)1 << 40))
        return bad(x, "more than 2^40 tokens in the file");
    if (gbuf_reserve(&s->ids, n * sizeof(int32_t), x->bud, x->path, x->err, x->err_len) != 0 ||
        gbuf_reserve(&s->mask, (size_t)((s->ntok + n + 7) / 8) - s->mask.len, x->bud, x->path, x->err,
                     x->err_len) != 0 ||
        gbuf_reserve(&s->off, sizeof(uint64_t), x->bud, x->path, x->err, x->err_len) != 0 ||
        gbuf_reserve(&s->targets, sizeof(uint32_t), x->bud, x->path, x->err, x->err_len) != 0)
        return -1;
    bool differs = false;
    for (size_t t = 0; t < n && lab; t++)
        differs |= lab[t] != IGNORE_LABEL && lab[t] != id[t];
    if (differs && !s->have_labels && labels_begin(s, x) != 0)
        return -1;
    if (s->have_labels && gbuf_reserve(&s->labels, n * sizeof(int32_t), x->bud, x->path, x->err, x->err_len) != 0)
        return -1;
    uint8_t *m = s->mask.p;
    memset(m + s->mask.len, 0, (size_t)((s->ntok + n + 7) / 8) - s->mask.len);
    s->mask.len = (size_t)((s->ntok + n + 7) / 8);
    for (size_t t = 0; t < n; t++) {
        uint64_t k = s->ntok + t;
        ids32(s)[k] = (int32_t)id[t];
        bool on = !lab || lab[t] != IGNORE_LABEL;
        m[k / 8] |= (uint8_t)(on << (k % 8));
        if (s->have_labels)
            ((int32_t *)s->labels.p)[k] = lab ? (int32_t)lab[t] : (int32_t)id[t];
    }
    ((uint64_t *)s->off.p)[s->n] = s->ntok;
    ((uint32_t *)s->targets.p)[s->n] = targets;
    s->off.len += sizeof(uint64_t);
    s->targets.len += sizeof(uint32_t);
    s->ids.len += n * sizeof(int32_t);
    if (s->have_labels)
        s->labels.len += n * sizeof(int32_t);
    s->ntok += n;
    s->n++;
    return 0;
}

bool data_is_jsonl(data_format fmt, const char *path)
{
    if (fmt == DATA_FMT_JSONL)
        return true;
    /* Gzip'd samples too (data_sft_load reads either). */
    size_t l = path ? strlen(path) : 0;
    return fmt == DATA_FMT_AUTO && ((l >= 6 && strcmp(path + l - 6, ".jsonl") == 0) ||
                                    (l >= 9 && strcmp(path + l - 9, ".jsonl.gz") == 0));
}

int data_sft_load(data_sft *d, const char *path, uint32_t vocab, uint32_t context, bool truncate,
                  data_budget *budget, char *err, size_t err_len)
{
    memset(d, 0, sizeof *d);
    data_src src;
    if (data_src_open(&src, path, true, err, err_len) != 0)
        return -1;
    store s = {0};
    ints ids = {0}, labels = {0}, mask = {0};
    gbuf line = {0};
    lexer x = {.path = path, .bud = budget, .err = err, .err_len = err_len};
    uint64_t lineno = 1;
    unsigned char *chunk = malloc(DATA_CHUNK);
    int rc = chunk ? 0 : data_oom(path, err, err_len);
    bool eof = false;
    while (rc == 0 && !eof) {
        ssize_t r = data_src_read(&src, chunk, DATA_CHUNK, err, err_len);
        if (r < 0) {
            rc = -1;
            break;
        }
        eof = (size_t)r < DATA_CHUNK;
        size_t i = 0;
        /* Each line is parsed where it ends (the last one also without a
         * newline); a line split over chunks is gathered first. */
        while (rc == 0 && (i < (size_t)r || (eof && line.len))) {
            const unsigned char *nl = i < (size_t)r ? memchr(chunk + i, '\n', (size_t)r - i) : NULL;
            size_t take = nl ? (size_t)(nl - (chunk + i)) : (size_t)r - i;
            if (!nl && !eof) {
                if ((rc = gbuf_reserve(&line, take, budget, path, err, err_len)) == 0) {
                    memcpy((char *)line.p + line.len, chunk + i, take);
                    line.len += take;
                }
                break;
            }
            const char *p = (const char *)chunk + i;
            if (line.len) {
                if ((rc = gbuf_reserve(&line, take, budget, path, err, err_len)) != 0)
                    break;
                memcpy((char *)line.p + line.len, chunk + i, take);
                line.len += take;
                p = line.p;
                take = line.len;
            }
            x.start = x.p = p;
            x.end = p + take;
            x.line = lineno;
            ws(&x);
            if (x.p < x.end) {
                rc = parse_line(&x, &ids, &labels, &mask);
                if (rc == 0)
                    rc = add_sample(&s, &x, &ids, &labels, &mask, vocab, context, truncate);
            }
            line.len = 0;
            lineno++;
            i += (nl ? (size_t)(nl - (chunk + i)) + 1 : (size_t)r - i);
        }
    }
    if (rc != 0)
        data_src_blame_gzip(&src, err, err_len);
    data_src_close(&src);
    free(chunk);
    gbuf_drop(&line, budget);
    gbuf_drop(&ids.v, budget);
    gbuf_drop(&labels.v, budget);
    gbuf_drop(&mask.v, budget);
    if (rc == 0 && s.n == 0)
        rc = errmsg_set(err, err_len, "%s: no samples (every line is empty)", path);
    if (rc == 0)
        rc = gbuf_reserve(&s.off, sizeof(uint64_t), budget, path, err, err_len);
    if (rc != 0) {
        gbuf *all[] = {&s.ids, &s.mask, &s.labels, &s.off, &s.targets};
        for (size_t k = 0; k < 5; k++)
            gbuf_drop(all[k], budget);
        return -1;
    }
    ((uint64_t *)s.off.p)[s.n] = s.ntok;
    s.off.len += sizeof(uint64_t);
    gbuf *all[] = {&s.ids, &s.mask, &s.labels, &s.off, &s.targets};
    for (size_t k = 0; k < 5; k++)
        gbuf_fit(all[k], budget);
    d->ids = s.ids.p;
    d->mask = s.mask.p;
    d->labels = s.have_labels ? s.labels.p : NULL;
    if (!s.have_labels)
        gbuf_drop(&s.labels, budget);
    d->off = s.off.p;
    d->targets = s.targets.p;
    d->n = s.n;
    d->ntok = s.ntok;
    for (size_t k = 0; k < s.n; k++)
        d->ntargets += d->targets[k];
    snprintf(d->source, sizeof d->source, "%s", path);
    return 0;
}

int data_sft_split(data_sft *train, data_sft *val, double fraction, char *err, size_t err_len)
{
    memset(val, 0, sizeof *val);
    if (!(fraction > 0 && fraction < 1))
        return errmsg_set(err, err_len, "%s: validation fraction %g is not between 0 and 1", train->source,
                          fraction);
    size_t nv = (size_t)((double)train->n * fraction);
    if (nv == 0 || nv >= train->n)
        return errmsg_set(err, err_len, "%s: %zu samples are too few to hold out a validation fraction of %g",
                          train->source, train->n, fraction);
    size_t nt = train->n - nv;
    *val = *train;
    val->view = true;
    val->off = train->off + nt;
    val->targets = train->targets + nt;
    val->n = nv;
    val->ntok = train->off[train->n] - train->off[nt];
    val->ntargets = 0;
    for (size_t k = 0; k < nv; k++)
        val->ntargets += val->targets[k];
    snprintf(val->source, sizeof val->source, "%.*s (validation: last %zu samples)", PATH_MAX, train->source, nv);
    train->n = nt;
    train->ntok -= val->ntok;
    train->ntargets -= val->ntargets;
    return 0;
}

/* ---- the shift ---------------------------------------------------------------- */

static int32_t label_of(const data_sft *d, uint64_t k)
{
    if (!(d->mask[k / 8] >> (k % 8) & 1))
        return IGNORE_LABEL;
    return d->labels ? d->labels[k] : d->ids[k];
}

void data_sft_shift(const data_sft *d, size_t i, int32_t *x, int32_t *y)
{
    uint64_t a = d->off[i];
    uint32_t n = data_sft_len(d, i);
    for (uint32_t t = 0; t < n; t++) {
        x[t] = d->ids[a + t];
        y[t] = t + 1 < n ? label_of(d, a + t + 1) : IGNORE_LABEL;
    }
}

void data_sft_free(data_sft *d)
{
    if (!d)
        return;
    if (!d->view) {
        free(d->ids);
        free(d->mask);
        free(d->labels);
        free(d->off);
        free(d->targets);
    }
    memset(d, 0, sizeof *d);
}

/* ---- rows ------------------------------------------------------------------------ */

void data_rows_begin(data_rows *r, int32_t *x, int32_t *y, int32_t *pos, int32_t *start, size_t T, bool pack)
{
    *r = (data_rows){.x = x, .y = y, .pos = pack ? pos : NULL, .start = pack ? start : NULL, .T = T, .pack = pack};
}

/* The last row's tail from `used` on: padding. */
static void pad_row(data_rows *r)
{
    if (!r->rows)
        return;
    size_t base = (size_t)(r->rows - 1) * r->T;
    for (size_t t = r->used; t < r->T; t++) {
        r->x[base + t] = 0;
        r->y[base + t] = IGNORE_LABEL;
        if (r->pos) {
            r->pos[base + t] = 0;
            r->start[base + t] = (int32_t)t;
        }
    }
    r->used = r->T;
}

void data_rows_add(data_rows *r, const data_sft *d, size_t i)
{
    size_t n = data_sft_len(d, i);
    if (!r->rows || !r->pack || r->used + n > r->T) {
        pad_row(r);
        r->rows++;
        r->used = 0;
    }
    size_t at = (size_t)(r->rows - 1) * r->T + r->used;
    data_sft_shift(d, i, r->x + at, r->y + at);
    if (r->pos)
        for (size_t t = 0; t < n; t++) {
            r->pos[at + t] = (int32_t)t;
            r->start[at + t] = (int32_t)r->used;
        }
    r->used += n;
    r->targets += d->targets[i];
    r->tokens += n;
}

uint32_t data_rows_end(data_rows *r)
{
    pad_row(r);
    return r->rows;
}

/* ---- the stream and the evaluation pass ------------------------------------------ */

uint32_t data_stream_next_sft(data_stream *s, size_t n, data_rows *r)
{
    for (size_t i = 0; i < n; i++)
        data_rows_add(r, s->sft, (size_t)data_stream_take(s));
    return data_rows_end(r);
}

void data_stream_sft_count(data_stream *s, size_t n, uint64_t *targets, uint64_t *tokens)
{
    uint64_t epoch = s->epoch, index = s->index;
    *targets = *tokens = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = (size_t)data_stream_take(s);
        *targets += s->sft->targets[k];
        *tokens += data_sft_len(s->sft, k);
    }
    /* Back where it was: index < size holds, so this cannot fail. */
    data_stream_set_state(s, epoch, index, NULL, 0);
}

size_t data_eval_next_sft(data_eval *e, size_t max, data_rows *r)
{
    size_t n = 0;
    for (; n < max && e->pos < e->size; n++, e->pos++)
        data_rows_add(r, e->sft, (size_t)e->pos);
    data_rows_end(r);
    return n;
}
