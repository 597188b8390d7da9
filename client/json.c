/* json.c — streaming JSON writer. */
#include "json.h"

#include <math.h>
#include <string.h>

#include "utf8.h"

void json_init(json_writer *w, FILE *f)
{
    w->f = f;
    w->depth = 0;
    w->need_comma[0] = false;
    w->after_key = false;
}

/* Emit the separator a new value needs in the current container. */
static void value_prefix(json_writer *w)
{
    if (w->after_key) {
        w->after_key = false;
        return;
    }
    if (w->need_comma[w->depth])
        fputc(',', w->f);
    w->need_comma[w->depth] = true;
}

static void open_container(json_writer *w, char c)
{
    value_prefix(w);
    fputc(c, w->f);
    if (w->depth < JSON_MAX_DEPTH - 1)
        w->depth++;
    w->need_comma[w->depth] = false;
}

static void close_container(json_writer *w, char c)
{
    if (w->depth > 0)
        w->depth--;
    fputc(c, w->f);
}

void json_begin_object(json_writer *w) { open_container(w, '{'); }
void json_end_object(json_writer *w) { close_container(w, '}'); }
void json_begin_array(json_writer *w) { open_container(w, '['); }
void json_end_array(json_writer *w) { close_container(w, ']'); }

/* JSON text must be UTF-8: a byte that does not start a valid sequence
 * (a path from an old job, a name in another encoding) is written as
 * U+FFFD, one per byte, so that the document always parses.  Controls and
 * DEL are \u-escaped, so that the output is also safe on a terminal. */
static void put_escaped(FILE *f, const char *s)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    size_t n = strlen((const char *)p);
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        size_t k = p[i] < 0x80 ? 1 : utf8_seq(p + i, n - i);
        if (k == 0) {
            fputs("\\ufffd", f);
            i++;
            continue;
        }
        if (k > 1) {
            fwrite(p + i, 1, k, f);
            i += k;
            continue;
        }
        switch (p[i]) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (p[i] < 0x20 || p[i] == 0x7f)
                fprintf(f, "\\u%04x", p[i]);
            else
                fputc(p[i], f);
        }
        i++;
    }
    fputc('"', f);
}

void json_key(json_writer *w, const char *key)
{
    value_prefix(w);
    put_escaped(w->f, key);
    fputc(':', w->f);
    w->after_key = true;
}

void json_string(json_writer *w, const char *s)
{
    value_prefix(w);
    put_escaped(w->f, s);
}

void json_int(json_writer *w, int64_t v)
{
    value_prefix(w);
    fprintf(w->f, "%lld", (long long)v);
}

void json_uint(json_writer *w, uint64_t v)
{
    value_prefix(w);
    fprintf(w->f, "%llu", (unsigned long long)v);
}

void json_double(json_writer *w, double v)
{
    value_prefix(w);
    if (isfinite(v))
        fprintf(w->f, "%.17g", v);
    else
        fputs("null", w->f); /* JSON has no inf/nan */
}

void json_bool(json_writer *w, bool v)
{
    value_prefix(w);
    fputs(v ? "true" : "false", w->f);
}

void json_end(json_writer *w)
{
    fputc('\n', w->f);
    fflush(w->f);
}
