/* acct_parse.c — an accounting line: written from a record, and read back
 * strictly, as untrusted input (the file may be damaged, cut by a crash,
 * or written by another gradd).  Kept apart from the writer so that the
 * fuzz harness (tests/fuzz/fuzz_acct.c) takes it alone. */
#include "acct.h"

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

/* The keys of mem_peak_tags, in pool_tag order: the file's own names, so
 * that renaming a tag in the pool does not change the format. */
static const char *const acct_tag_keys[POOL_TAG_COUNT] = {"params", "grads", "optimizer", "activations",
                                                          "workspace", "data", "other", "frozen"};
_Static_assert(POOL_TAG_COUNT == 8, "a new pool tag needs its key in the accounting file");

/* A time at or past this (the year 33658) is damage, not a date, as in a
 * job's state file. */
#define ACCT_TIME_MAX 1e12

/* ---- writing ------------------------------------------------------------------------- */

/* jansson takes only valid UTF-8; a name or reason that is not (a
 * program's output in the reason) is kept in its safe form. */
static json_t *text_json(const char *s)
{
    if (utf8_valid(s))
        return json_string(s);
    char buf[4 * 1024 + 1];
    return json_string(utf8_safe(s, 0, buf, sizeof buf));
}

/* JSON integers are signed: nothing we count comes near the top bit. */
static json_t *count_json(uint64_t v)
{
    return json_integer(v > INT64_MAX ? INT64_MAX : (json_int_t)v);
}

char *acct_format(const acct_record *r, size_t *len)
{
    json_t *tags = json_object();
    for (int t = 0; tags && t < POOL_TAG_COUNT; t++)
        if (r->tag_peak[t])
            json_object_set_new(tags, acct_tag_keys[t], count_json(r->tag_peak[t]));
    json_t *o = json_object();
    if (!o || !tags) {
        json_decref(o);
        json_decref(tags);
        return NULL;
    }
    json_object_set_new(o, "id", count_json(r->id));
    json_object_set_new(o, "name", text_json(r->name));
    json_object_set_new(o, "user", text_json(r->user));
    json_object_set_new(o, "uid", count_json(r->uid));
    json_object_set_new(o, "type", json_string(r->type));
    json_object_set_new(o, "state", json_string(r->state));
    json_object_set_new(o, "reason", text_json(r->reason));
    json_object_set_new(o, "device", text_json(r->device));
    json_object_set_new(o, "devices", count_json(r->devices));
    json_object_set_new(o, "submitted_at", json_real(r->submitted_at));
    json_object_set_new(o, "started_at", json_real(r->started_at));
    json_object_set_new(o, "finished_at", json_real(r->finished_at));
    json_object_set_new(o, "elapsed_s", json_real(r->elapsed_s));
    json_object_set_new(o, "device_hours", json_real(r->device_hours));
    json_object_set_new(o, "steps_done", count_json(r->steps_done));
    json_object_set_new(o, "steps", count_json(r->steps));
    json_object_set_new(o, "resumes", count_json(r->resumes));
    json_object_set_new(o, "oom_recoveries", count_json(r->oom_recoveries));
    json_object_set_new(o, "mem_peak", count_json(r->mem_peak));
    json_object_set_new(o, "mem_peak_tags", tags);
    char *text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!text)
        return NULL;
    size_t n = strlen(text);
    char *line = realloc(text, n + 2);
    if (!line) {
        free(text);
        return NULL;
    }
    line[n] = '\n';
    line[n + 1] = '\0';
    *len = n + 1;
    return line;
}

/* ---- reading ------------------------------------------------------------------------- */

int acct_next_line(FILE *f, char *buf, size_t cap, size_t *len, unsigned *lineno)
{
    size_t n = 0;
    bool over = false;
    int c;
    /* By character, not fgets: a NUL byte in a damaged line must not hide
     * the rest of it, or of the file. */
    while ((c = getc(f)) != EOF && c != '\n') {
        if (n + 1 < cap && n <= ACCT_LINE_MAX)
            buf[n++] = (char)c;
        else
            over = true;
    }
    if (c == EOF)
        return 0; /* the end; a last line without its newline is not all written yet */
    ++*lineno;
    buf[n] = '\0';
    *len = n;
    return over || n > ACCT_LINE_MAX ? -1 : 1;
}

static int bad(char *err, size_t err_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int bad(char *err, size_t err_len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
    return -1;
}

static int get_count(json_t *o, const char *key, uint64_t max, uint64_t *out, char *err, size_t err_len)
{
    json_t *v = json_object_get(o, key);
    if (!v)
        return bad(err, err_len, "%s: missing", key);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) > max)
        return bad(err, err_len, "%s: not a whole number from 0 to %llu", key, (unsigned long long)max);
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static int get_u32(json_t *o, const char *key, uint32_t *out, char *err, size_t err_len)
{
    uint64_t v;
    if (get_count(o, key, UINT32_MAX, &v, err, err_len) != 0)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

/* A duration or time in seconds: finite, from 0 to max. */
static int get_secs(json_t *o, const char *key, double max, double *out, char *err, size_t err_len)
{
    json_t *v = json_object_get(o, key);
    if (!v)
        return bad(err, err_len, "%s: missing", key);
    double x = json_number_value(v);
    if (!json_is_number(v) || !isfinite(x) || x < 0 || x >= max)
        return bad(err, err_len, "%s: not a number from 0 to %.0f", key, max);
    *out = x;
    return 0;
}

static int get_text(json_t *o, const char *key, char *out, size_t size, char *err, size_t err_len)
{
    json_t *v = json_object_get(o, key);
    if (!v)
        return bad(err, err_len, "%s: missing", key);
    if (!json_is_string(v))
        return bad(err, err_len, "%s: not a string", key);
    size_t n = json_string_length(v);
    if (n >= size)
        return bad(err, err_len, "%s: longer than %zu bytes", key, size - 1);
    memcpy(out, json_string_value(v), n + 1);
    return 0;
}

static int get_one_of(json_t *o, const char *key, const char *const *names, char *out, size_t size, char *err,
                      size_t err_len)
{
    if (get_text(o, key, out, size, err, err_len) != 0)
        return -1;
    for (size_t i = 0; names[i]; i++)
        if (strcmp(out, names[i]) == 0)
            return 0;
    return bad(err, err_len, "%s: not one of the values it takes", key);
}

static int parse_object(json_t *o, acct_record *r, char *err, size_t err_len)
{
    static const char *const states[] = {"completed", "failed", "cancelled", NULL};
    static const char *const types[] = {"engine", "program", NULL};
    if (!json_is_object(o))
        return bad(err, err_len, "not a JSON object");
    if (get_u32(o, "id", &r->id, err, err_len) || get_text(o, "name", r->name, sizeof r->name, err, err_len) ||
        get_text(o, "user", r->user, sizeof r->user, err, err_len) || get_u32(o, "uid", &r->uid, err, err_len) ||
        get_one_of(o, "type", types, r->type, sizeof r->type, err, err_len) ||
        get_one_of(o, "state", states, r->state, sizeof r->state, err, err_len) ||
        get_text(o, "reason", r->reason, sizeof r->reason, err, err_len) ||
        get_text(o, "device", r->device, sizeof r->device, err, err_len) ||
        get_u32(o, "devices", &r->devices, err, err_len) ||
        get_secs(o, "submitted_at", ACCT_TIME_MAX, &r->submitted_at, err, err_len) ||
        get_secs(o, "started_at", ACCT_TIME_MAX, &r->started_at, err, err_len) ||
        get_secs(o, "finished_at", ACCT_TIME_MAX, &r->finished_at, err, err_len) ||
        get_secs(o, "elapsed_s", ACCT_TIME_MAX, &r->elapsed_s, err, err_len) ||
        get_secs(o, "device_hours", ACCT_TIME_MAX, &r->device_hours, err, err_len) ||
        get_count(o, "steps_done", UINT64_MAX, &r->steps_done, err, err_len) ||
        get_count(o, "steps", UINT64_MAX, &r->steps, err, err_len) ||
        get_u32(o, "resumes", &r->resumes, err, err_len) ||
        get_count(o, "oom_recoveries", UINT64_MAX, &r->oom_recoveries, err, err_len) ||
        get_count(o, "mem_peak", UINT64_MAX, &r->mem_peak, err, err_len))
        return -1;
    if (r->id == 0)
        return bad(err, err_len, "id: 0 is not a job id");
    json_t *tags = json_object_get(o, "mem_peak_tags");
    if (!json_is_object(tags))
        return bad(err, err_len, "mem_peak_tags: %s", tags ? "not an object" : "missing");
    /* Tags this gradd does not know (a newer one's) are left out. */
    for (int t = 0; t < POOL_TAG_COUNT; t++)
        if (json_object_get(tags, acct_tag_keys[t]) &&
            get_count(tags, acct_tag_keys[t], UINT64_MAX, &r->tag_peak[t], err, err_len) != 0)
            return bad(err, err_len, "mem_peak_tags: %s: not a whole number of bytes", acct_tag_keys[t]);
    return 0;
}

int acct_parse_line(const char *buf, size_t len, acct_record *out, char *err, size_t err_len)
{
    if (len > ACCT_LINE_MAX)
        return bad(err, err_len, "longer than %zu bytes", ACCT_LINE_MAX);
    json_error_t jerr;
    json_t *o = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!o)
        return bad(err, err_len, "not JSON (%s at column %d)", jerr.text, jerr.column);
    acct_record *r = calloc(1, sizeof *r);
    int rc = r ? parse_object(o, r, err, err_len) : bad(err, err_len, "out of memory");
    json_decref(o);
    if (rc == 0)
        *out = *r;
    free(r);
    return rc;
}
