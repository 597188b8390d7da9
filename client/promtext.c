/* promtext.c — Prometheus text format into JSON (see promtext.h). */
#include "promtext.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "jout.h"

/* The metric name at s (letters, digits, '_' and ':'); its length. */
static size_t name_len(const char *s, const char *end)
{
    size_t n = 0;
    while (s + n < end && (s[n] == '_' || s[n] == ':' || (s[n] >= 'a' && s[n] <= 'z') || (s[n] >= 'A' && s[n] <= 'Z') ||
                           (n && s[n] >= '0' && s[n] <= '9')))
        n++;
    return n;
}

/* s[0..n) with the format's escapes undone (\\, \n, and in label values
 * \"), as a JSON string. */
static json_t *unescaped(const char *s, size_t n)
{
    char *out = malloc(n + 1);
    if (!out)
        return jout_str("");
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\' && i + 1 < n) {
            i++;
            out[o++] = s[i] == 'n' ? '\n' : s[i];
        } else {
            out[o++] = s[i];
        }
    }
    out[o] = '\0';
    json_t *v = jout_str(out);
    free(out);
    return v;
}

/* The family's type or help, looked up by the sample's name and then by
 * the name less a histogram's or summary's suffix. */
static const char *family_get(json_t *fam, const char *name, const char *what)
{
    json_t *f = json_object_get(fam, name);
    static const char *const suffixes[] = {"_bucket", "_sum", "_count", "_total", "_created"};
    for (size_t i = 0; !f && i < sizeof suffixes / sizeof *suffixes; i++) {
        size_t n = strlen(name), k = strlen(suffixes[i]);
        if (n > k && strcmp(name + n - k, suffixes[i]) == 0) {
            char base[256];
            if (n - k < sizeof base) {
                memcpy(base, name, n - k);
                base[n - k] = '\0';
                f = json_object_get(fam, base);
            }
        }
    }
    return f ? json_string_value(json_object_get(f, what)) : NULL;
}

/* {"a": "1", ...} from the inside of the braces; NULL where the labels do
 * not parse. */
static json_t *labels(const char *s, const char *end)
{
    json_t *o = json_object();
    while (s < end) {
        while (s < end && (*s == ' ' || *s == ','))
            s++;
        if (s == end)
            break;
        size_t n = name_len(s, end);
        if (!n || s + n + 1 >= end || s[n] != '=' || s[n + 1] != '"')
            goto bad;
        const char *v = s + n + 2, *q = v;
        while (q < end && *q != '"')
            q += *q == '\\' && q + 1 < end ? 2 : 1;
        if (q >= end)
            goto bad;
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)n, s);
        jout_set(o, key, unescaped(v, (size_t)(q - v)));
        s = q + 1;
    }
    return o;
bad:
    json_decref(o);
    return NULL;
}

/* A whole number as an integer (counts and bytes read as such), anything
 * else as a real; not finite, null. */
static json_t *number(double v)
{
    if (v > -9007199254740992.0 && v < 9007199254740992.0 && v == (double)(long long)v)
        return json_integer((json_int_t)v);
    return jout_real(v);
}

json_t *promtext_json(const char *text)
{
    json_t *fam = json_object(), *list = json_array();
    for (const char *line = text ? text : ""; *line;) {
        const char *end = strchr(line, '\n');
        if (!end)
            end = line + strlen(line);
        const char *next = *end ? end + 1 : end;
        if (strncmp(line, "# HELP ", 7) == 0 || strncmp(line, "# TYPE ", 7) == 0) {
            bool help = line[2] == 'H';
            const char *s = line + 7;
            size_t n = name_len(s, end);
            if (n && s + n < end && s[n] == ' ') {
                char name[256];
                snprintf(name, sizeof name, "%.*s", (int)n, s);
                json_t *f = json_object_get(fam, name);
                if (!f)
                    json_object_set_new(fam, name, f = json_object());
                json_object_set_new(f, help ? "help" : "type", help ? unescaped(s + n + 1, (size_t)(end - s - n - 1))
                                                                    : jout_str(""));
                if (!help) {
                    char type[32];
                    snprintf(type, sizeof type, "%.*s", (int)(end - s - n - 1), s + n + 1);
                    json_object_set_new(f, "type", jout_str(type));
                }
            }
        } else if (*line != '#') {
            size_t n = name_len(line, end);
            const char *p = line + n;
            json_t *lab = NULL;
            if (n && p < end && *p == '{') {
                const char *close = p + 1;
                /* The closing brace is the first outside a quoted value. */
                for (bool quoted = false; close < end && (quoted || *close != '}'); close++) {
                    if (*close == '\\' && close + 1 < end)
                        close++;
                    else if (*close == '"')
                        quoted = !quoted;
                }
                lab = close < end ? labels(p + 1, close) : NULL;
                p = close + 1;
            } else if (n) {
                lab = json_object();
            }
            char num[64] = "", *e = num;
            double v = 0;
            if (lab && p < end && *p == ' ') {
                snprintf(num, sizeof num, "%.*s", (int)(end - p - 1), p + 1);
                num[strcspn(num, " ")] = '\0'; /* a timestamp may follow */
                v = strtod(num, &e);
            }
            if (lab && *num && !*e) {
                char name[256];
                snprintf(name, sizeof name, "%.*s", (int)n, line);
                const char *type = family_get(fam, name, "type"), *help = family_get(fam, name, "help");
                json_array_append_new(list, json_pack("{s:o, s:o, s:o, s:o, s:o}", "name", jout_str(name), "labels",
                                                      lab, "value", number(v), "type",
                                                      jout_str(type ? type : "untyped"), "help", jout_str(help)));
                lab = NULL;
            }
            json_decref(lab);
        }
        line = next;
    }
    json_decref(fam);
    return json_pack("{s:o}", "metrics", list);
}
