/* opts.c — option tables and the INI file reader behind them. */
#include "opts.h"

#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "units.h"
#include "utf8.h"

/* ---- one value ------------------------------------------------------------------ */

static int parse_bool(const char *v, bool *out)
{
    static const char *yes[] = {"true", "yes", "on", "1"}, *no[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(v, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return -1;
}

static void store_uint(void *field, size_t size, uint64_t u)
{
    switch (size) {
    case 8: *(uint64_t *)field = u; break;
    case 4: *(uint32_t *)field = (uint32_t)u; break;
    case 2: *(uint16_t *)field = (uint16_t)u; break;
    default: *(uint8_t *)field = (uint8_t)u; break;
    }
}

/* The index of `value` in "a|b|c", or -1. */
static int choice_index(const char *choices, const char *value)
{
    int i = 0;
    size_t vl = strlen(value);
    for (const char *c = choices; c && *c; i++) {
        const char *bar = strchr(c, '|');
        size_t l = bar ? (size_t)(bar - c) : strlen(c);
        if (l == vl && strncmp(c, value, l) == 0)
            return i;
        if (!bar)
            break;
        c = bar + 1;
    }
    return -1;
}

int opts_set(const opts_def *o, void *base, const char *value, char *err, size_t err_len)
{
    char *field = (char *)base + o->offset;
    uint64_t u;
    double d;
    char *end;
    switch (o->type) {
    case OPTS_SIZE:
        if (o->unlimited_ok && strcasecmp(value, "unlimited") == 0) {
            u = UINT64_MAX;
        } else {
            if (units_parse_size(value, &u, err, err_len) != 0)
                return -1;
            if ((double)u < o->min || (double)u > o->max) {
                char lo[16], hi[16];
                units_format_size((uint64_t)o->min, lo, sizeof lo);
                units_format_size((uint64_t)o->max, hi, sizeof hi);
                snprintf(err, err_len, "'%s' is out of range (%s to %s)", value, lo, hi);
                return -1;
            }
        }
        store_uint(field, o->size, u);
        return 0;
    case OPTS_DURATION:
        if (units_parse_duration_ms(value, &u, err, err_len) != 0)
            return -1;
        if ((double)u < o->min || (double)u > o->max) {
            snprintf(err, err_len, "'%s' is out of range (%.0fms to %.0fms)", value, o->min, o->max);
            return -1;
        }
        store_uint(field, o->size, u);
        return 0;
    case OPTS_DOUBLE:
        d = strtod(value, &end);
        if (end == value || *end || !(d >= o->min && d <= o->max)) {
            snprintf(err, err_len, "'%s' is not a number from %g to %g", value, o->min, o->max);
            return -1;
        }
        *(double *)field = d;
        return 0;
    case OPTS_BOOL:
        if (parse_bool(value, (bool *)field) != 0) {
            snprintf(err, err_len, "'%s' is not a boolean (true/false, yes/no, on/off)", value);
            return -1;
        }
        return 0;
    case OPTS_COUNT:
        if (value[0] < '0' || value[0] > '9') {
            snprintf(err, err_len, "'%s' is not a whole number", value);
            return -1;
        }
        u = strtoull(value, &end, 10);
        if (*end || (double)u < o->min || (double)u > o->max) {
            snprintf(err, err_len, "'%s' is not a whole number from %.0f to %.0f", value, o->min, o->max);
            return -1;
        }
        store_uint(field, o->size, u);
        return 0;
    case OPTS_STRING:
        if (strlen(value) >= o->size) {
            snprintf(err, err_len, "value is longer than %zu characters", o->size - 1);
            return -1;
        }
        memcpy(field, value, strlen(value) + 1);
        return 0;
    case OPTS_CHOICE: {
        int i = choice_index(o->choices, value);
        if (i < 0) {
            snprintf(err, err_len, "'%s' is not one of %s", value, o->choices);
            return -1;
        }
        *(int *)field = i;
        return 0;
    }
    }
    return -1;
}

const opts_def *opts_find(const opts_def *defs, size_t n, const char *section, const char *key)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(defs[i].section, section) == 0 && strcmp(defs[i].key, key) == 0)
            return &defs[i];
    return NULL;
}

bool opts_section_known(const opts_def *defs, size_t n, const char *section)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(defs[i].section, section) == 0)
            return true;
    return false;
}

void opts_defaults(const opts_def *defs, size_t n, const char *section, void *base)
{
    char err[128];
    for (size_t i = 0; i < n; i++)
        if (!section || strcmp(defs[i].section, section) == 0)
            opts_set(&defs[i], base, defs[i].def, err, sizeof err);
}

void opts_print(const opts_def *defs, size_t n, FILE *f)
{
    const char *cur = "";
    for (size_t i = 0; i < n; i++) {
        if (strcmp(cur, defs[i].section) != 0) {
            cur = defs[i].section;
            fprintf(f, "%s[%s]\n", i ? "\n" : "", cur);
        }
        fprintf(f, "# %s\n#%s = %s\n", defs[i].help, defs[i].key, defs[i].def);
    }
}

/* ---- files ------------------------------------------------------------------------ */

typedef struct seen_key {
    char *name; /* "section\nkey" */
    int line;
    struct seen_key *next;
} seen_key;

/* A [section] line, and whether a key came under it: libinih tells the
 * handler of keys only, so an empty section is checked after the file. */
typedef struct {
    char name[64];
    int line;
    bool keys;
} section_head;

typedef struct {
    const char *path;
    FILE *f;
    int line; /* lines read so far = the line being parsed */
    opts_entry_fn fn;
    void *user;
    seen_key *seen;
    section_head *heads;
    size_t nheads, cap_heads;
    char err[768];
    int failed;
    int fail_line;
} parse_ctx;

static void fail(parse_ctx *p, int line, const char *section, const char *key, const char *why)
{
    if (p->failed)
        return;
    if (key)
        snprintf(p->err, sizeof p->err, "%s:%d: [%s] %s: %s", p->path, line, section, key, why);
    else if (section && *section)
        snprintf(p->err, sizeof p->err, "%s:%d: [%s]: %s", p->path, line, section, why);
    else
        snprintf(p->err, sizeof p->err, "%s:%d: %s", p->path, line, why);
    p->failed = 1;
    p->fail_line = line;
}

/* The line of an earlier `key` in `section`, or 0 after remembering it. */
static int seen_before(parse_ctx *p, const char *section, const char *key, int line)
{
    char *name = NULL;
    if (asprintf(&name, "%s\n%s", section, key) < 0)
        return 0;
    for (seen_key *s = p->seen; s; s = s->next) {
        if (strcmp(s->name, name) == 0) {
            free(name);
            return s->line;
        }
    }
    seen_key *s = malloc(sizeof *s);
    if (!s) {
        free(name);
        return 0;
    }
    s->name = name;
    s->line = line;
    s->next = p->seen;
    p->seen = s;
    return 0;
}

static int on_entry(void *user, const char *section, const char *key, const char *value)
{
    parse_ctx *p = user;
    int line = p->line;
    if (p->nheads)
        p->heads[p->nheads - 1].keys = true;
    if (p->failed)
        return 0;
    if (section[0] == '\0') {
        fail(p, line, "", key, "key outside any section");
        return 0;
    }
    int first = seen_before(p, section, key, line);
    if (first) {
        char why[64];
        snprintf(why, sizeof why, "given twice (first on line %d)", first);
        fail(p, line, section, key, why);
        return 0;
    }
    char why[512] = "";
    bool name_key = true;
    if (p->fn(p->user, section, key, value, line, why, sizeof why, &name_key) != 0) {
        fail(p, line, section, name_key ? key : NULL, why);
        return 0;
    }
    return 1;
}

/* libinih's reader callback: counts lines, and refuses what fgets would
 * pass over silently: a NUL byte (anywhere, the last line's too), a line
 * longer than libinih's buffer (instead of splitting it), and a read
 * error (which would otherwise read as the end of a valid file). */
static char *read_line(char *str, int num, void *stream)
{
    parse_ctx *p = stream;
    int n = 0, c = EOF;
    bool nul = false;
    while (n < num - 1 && (c = getc(p->f)) != EOF) {
        nul |= c == '\0';
        str[n++] = (char)c;
        if (c == '\n')
            break;
    }
    if (ferror(p->f)) {
        char why[128];
        snprintf(why, sizeof why, "cannot read: %s", strerror(errno));
        fail(p, p->line + 1, "", NULL, why);
        return NULL;
    }
    if (n == 0)
        return NULL;
    str[n] = '\0';
    p->line++;
    /* "[name]": remembered, for the empty section's check. */
    const char *h = str + strspn(str, " \t");
    const char *close = *h == '[' ? strchr(h, ']') : NULL;
    if (close && (size_t)(close - h - 1) < sizeof p->heads[0].name) {
        if (p->nheads == p->cap_heads) {
            size_t cap = p->cap_heads ? 2 * p->cap_heads : 16;
            section_head *grown = realloc(p->heads, cap * sizeof *grown);
            if (!grown) {
                fail(p, p->line, "", NULL, "out of memory");
                return NULL;
            }
            p->heads = grown;
            p->cap_heads = cap;
        }
        section_head *s = &p->heads[p->nheads++];
        /* As libinih takes it: the name between the brackets, as it is. */
        size_t len = (size_t)(close - h - 1);
        memcpy(s->name, h + 1, len);
        s->name[len] = '\0';
        s->line = p->line;
        s->keys = false;
    }
    if (nul)
        fail(p, p->line, "", NULL, "line contains a NUL byte (is this a text file?)");
    if (n == num - 1 && str[n - 1] != '\n' && (c = getc(p->f)) != EOF && c != '\n') {
        char why[64];
        snprintf(why, sizeof why, "line is longer than %d characters", num - 2);
        fail(p, p->line, "", NULL, why);
        while ((c = getc(p->f)) != EOF && c != '\n')
            ;
    }
    return str;
}

/* Not with a plain fopen: a FIFO would block the open, and /dev/zero
 * would never end. */
FILE *opts_open_file(const char *path, char *err, size_t err_len)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        snprintf(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, err_len, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, "r");
    if (!f) {
        snprintf(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

int opts_parse_file(const char *path, opts_entry_fn fn, void *user, char *err, size_t err_len)
{
    FILE *f = opts_open_file(path, err, err_len);
    if (!f)
        return -1;
    int rc = opts_parse_stream(f, path, fn, user, err, err_len);
    fclose(f);
    return rc;
}

int opts_parse_stream(FILE *f, const char *name, opts_entry_fn fn, void *user, char *err, size_t err_len)
{
    const char *path = name;
    parse_ctx p = {.path = path, .fn = fn, .user = user, .f = f};
    /* Continuation lines would turn an indented "key = value" into part of
     * the previous value; our files have no multi-line values. */
    ini_allow_multiline = false;
    int rc = ini_parse_stream(read_line, &p, on_entry, &p);
    /* A section with no key is asked about once, so that an unknown one
     * is refused as it would be with keys. */
    for (size_t i = 0; i < p.nheads && !p.failed; i++) {
        if (p.heads[i].keys)
            continue;
        char why[512] = "";
        bool name_key = false;
        if (p.fn(p.user, p.heads[i].name, NULL, NULL, p.heads[i].line, why, sizeof why, &name_key) != 0)
            fail(&p, p.heads[i].line, p.heads[i].name, NULL, why);
    }
    free(p.heads);
    while (p.seen) {
        seen_key *next = p.seen->next;
        free(p.seen->name);
        free(p.seen);
        p.seen = next;
    }
    /* libinih reports the first syntax error's line; keep whichever of that
     * and our own first complaint comes first in the file. */
    if (rc > 0 && (!p.failed || rc < p.fail_line)) {
        snprintf(p.err, sizeof p.err, "%s:%d: syntax error (expected [section] or key = value)", path, rc);
        p.failed = 1;
    } else if (rc < 0 && !p.failed) {
        snprintf(p.err, sizeof p.err, "%s: cannot read", path);
        p.failed = 1;
    }
    if (p.failed) {
        /* The file's own bytes (a value, a name) are in it: shown safely,
         * whoever prints it (invalid UTF-8 and controls escaped). */
        utf8_safe(p.err, 0, err, err_len);
        return -1;
    }
    return 0;
}

int opts_simple_entry(void *user, const char *section, const char *key, const char *value, int line, char *why,
                      size_t why_len, bool *name_key)
{
    (void)line;
    opts_simple *s = user;
    if (!opts_section_known(s->defs, s->n, section)) {
        int n = snprintf(why, why_len, "unknown section (known:");
        const char *last = "";
        for (size_t i = 0; i < s->n && n > 0 && (size_t)n < why_len; i++) {
            if (strcmp(last, s->defs[i].section) == 0)
                continue;
            last = s->defs[i].section;
            n += snprintf(why + n, why_len - (size_t)n, "%s %s", i ? "," : "", last);
        }
        if (n > 0 && (size_t)n < why_len)
            snprintf(why + n, why_len - (size_t)n, ")");
        *name_key = false;
        return -1;
    }
    if (!key)
        return 0; /* a known section without keys */
    const opts_def *o = opts_find(s->defs, s->n, section, key);
    if (!o) {
        snprintf(why, why_len, "unknown key");
        return -1;
    }
    return opts_set(o, s->base, value, why, why_len);
}
