/* jout.c — gradctl's --json output through jansson (see jout.h). */
#include "jout.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "utf8.h"

static void *must_malloc(size_t n)
{
    void *p = malloc(n);
    if (!p && n) {
        fputs("gradctl: out of memory\n", stderr);
        exit(CTL_ERR_DAEMON);
    }
    return p;
}

void jout_init(void)
{
    json_set_alloc_funcs(must_malloc, free);
}

char *jout_utf8(const void *s, size_t n)
{
    const unsigned char *p = s;
    char *out = must_malloc(n * 3 + 1), *o = out;
    for (size_t i = 0; i < n;) {
        size_t k = p[i] ? utf8_seq(p + i, n - i) : 0;
        if (k) {
            memcpy(o, p + i, k);
            o += k;
            i += k;
        } else {
            memcpy(o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    *o = '\0';
    return out;
}

json_t *jout_str(const char *s)
{
    s = s ? s : "";
    if (utf8_valid(s))
        return json_string_nocheck(s);
    char *t = jout_utf8(s, strlen(s));
    json_t *v = json_string_nocheck(t);
    free(t);
    return v;
}

/* jansson's integers are json_int_t, signed 64-bit: a figure above
 * INT64_MAX (max_split_size is SIZE_MAX when unlimited; a seed the daemon
 * picks is any 64-bit number) would print negative.  Such a value is held
 * as a string of its digits behind a NUL, and jout_print writes the digits
 * bare.  No other string in a document holds a NUL: they come from C
 * strings, and jout_utf8 replaces NUL. */
#define BIG_MARK "\"\\u0000"

json_t *jout_uint(uint64_t v)
{
    if (v <= INT64_MAX)
        return json_integer((json_int_t)v);
    char digits[24];
    int n = snprintf(digits, sizeof digits, "%c%" PRIu64, '\0', v);
    return json_stringn_nocheck(digits, (size_t)n);
}

json_t *jout_real(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

void jout_set(json_t *obj, const char *key, json_t *v)
{
    key = key ? key : "";
    if (utf8_valid(key)) {
        json_object_set_new_nocheck(obj, key, v);
        return;
    }
    char *k = jout_utf8(key, strlen(key));
    json_object_set_new_nocheck(obj, k, v);
    free(k);
}

/* Write JSON text with DEL, C1 and bidi controls as \uXXXX: jansson escapes
 * C0 controls only, and a reader who looks at the JSON in a terminal is
 * reached by the others.  Outside strings JSON text is printable ASCII, so
 * each of them is inside a string, where the escape means the same. */
static void put_json(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t from = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = utf8_decode(p + i, n - i, &cp);
        if (k == 0) {
            i++; /* not from jansson, which writes valid UTF-8 */
            continue;
        }
        if (utf8_unsafe_cp(cp)) {
            fwrite(p + from, 1, i - from, stdout);
            printf("\\u%04X", (unsigned)cp); /* as jansson writes C0 */
            from = i + k;
        }
        i += k;
    }
    fwrite(p + from, 1, n - from, stdout);
}

int jout_print(json_t *doc)
{
    char *text = json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(doc);
    if (!text) {
        /* A document jansson would not make (a json_pack format wrong). */
        fprintf(stderr, "gradctl: internal error: the JSON reply could not be written\n");
        return CTL_ERR_DAEMON;
    }
    /* Each marked string, "\u0000DIGITS", goes out as DIGITS. */
    const char *p = text;
    for (const char *m; (m = strstr(p, BIG_MARK));) {
        put_json(p, (size_t)(m - p));
        m += strlen(BIG_MARK);
        size_t n = strspn(m, "0123456789");
        fwrite(m, 1, n, stdout);
        p = m + n + 1; /* past the closing quote */
    }
    put_json(p, strlen(p));
    fputc('\n', stdout);
    fflush(stdout);
    free(text);
    return CTL_OK;
}
