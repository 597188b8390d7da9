/* json.c — streaming JSON writer. */
#include "json.h"

#include <math.h>

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

static void put_escaped(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (*p < 0x20)
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
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
