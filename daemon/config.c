/* config.c — the option table and the libinih handler for gradd.conf. */
#include "config.h"

#include <ini.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "units.h"

/* ---- the option table ---------------------------------------------------- */

typedef enum { OPT_SIZE, OPT_DURATION, OPT_FRACTION, OPT_BOOL, OPT_COUNT, OPT_STRING } opt_type;

typedef struct {
    const char *section; /* "daemon", "cpu", "cuda", or "pool" (also [pool.DEV]) */
    const char *key;
    opt_type type;
    size_t offset;  /* into gradd_config, or into pool_config for "pool" */
    size_t size;    /* field size, for strings */
    double min, max;
    bool unlimited_ok; /* sizes: accepts "unlimited" (SIZE_MAX) */
    const char *def;
    const char *help;
} opt_def;

#define D(field) offsetof(gradd_config, field), sizeof(((gradd_config *)0)->field)
#define P(field) offsetof(pool_config, field), sizeof(((pool_config *)0)->field)
#define SZ_MAX 1.8e19

static const opt_def opts[] = {
    {"daemon", "socket", OPT_STRING, D(socket_path), 0, 0, false, "",
     "control socket path (empty: /run/gradd/gradd.sock as root, else $XDG_RUNTIME_DIR/gradd.sock)"},
    {"daemon", "state_dir", OPT_STRING, D(state_dir), 0, 0, false, "",
     "queue and job state (empty: /var/lib/gradd as root, else ~/.local/state/gradd)"},
    {"daemon", "max_frame", OPT_SIZE, D(max_frame), 64, 1 << 30, false, "1M",
     "largest protocol frame accepted; bigger ones close the connection"},
    {"daemon", "client_timeout", OPT_DURATION, D(client_timeout_ms), 1, 86400e3, false, "60s",
     "close a connection that sends no complete request for this long"},
    {"daemon", "max_clients", OPT_COUNT, D(max_clients), 1, 65536, false, "1024",
     "connections served at once; more are closed on accept"},
    {"daemon", "admin_group", OPT_STRING, D(admin_group), 0, 0, false, "gradd",
     "members may act on every job; the socket's group"},
    {"daemon", "log_level", OPT_STRING, D(log_level), 0, 0, false, "info", "error, warning, info or debug"},

    {"cpu", "capacity", OPT_SIZE, D(cpu_capacity), 1 << 20, SZ_MAX, false, "4G",
     "memory of each simulated cpu device"},
    {"cpu", "devices", OPT_COUNT, D(cpu_devices), 0, 16, false, "1", "number of simulated cpu devices"},

    {"cuda", "enabled", OPT_BOOL, D(cuda_enabled), 0, 1, false, "true", "probe for CUDA devices at start"},
    {"cuda", "module_dir", OPT_STRING, D(cuda_module_dir), 0, 0, false, "",
     "where gradd-cuda.so lives (empty: beside gradd, then the install directory)"},

    {"pool", "memory_fraction", OPT_FRACTION, P(memory_fraction), 0.01, 1, false, "1.0",
     "the pool's cap as a fraction of device memory"},
    {"pool", "max_split_size", OPT_SIZE, P(max_split_size), 1 << 20, SZ_MAX, true, "unlimited",
     "cached blocks this large or larger are never split"},
    {"pool", "expandable_segments", OPT_BOOL, P(expandable_segments), 0, 1, false, "false",
     "grow one mapped address range instead of allocating separate segments"},
    {"pool", "gc_threshold", OPT_FRACTION, P(gc_threshold), 0, 1, false, "0",
     "trim least recently used cache when reserved exceeds this fraction of the cap (0: off)"},
    {"pool", "low_watermark", OPT_SIZE, P(low_watermark), 0, SZ_MAX, false, "0",
     "trim when the device's free memory falls below this (0: off)"},
    {"pool", "trim_every_steps", OPT_COUNT, P(trim_every_steps), 0, 1e12, false, "0",
     "trim the cache every N training steps (0: off)"},
    {"pool", "trim_interval", OPT_DURATION, P(trim_every_ms), 0, 86400e3, false, "0",
     "trim the cache this often (0: off)"},
    {"pool", "timeline_events", OPT_COUNT, P(timeline_capacity), 0, 1 << 24, false, "65536",
     "events kept in the memory timeline ring buffer (0: off)"},
};
#define NOPTS (sizeof opts / sizeof opts[0])

/* ---- parsing one value ---------------------------------------------------- */

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

/* Store `value` into the field described by `o` at `base`.  Returns 0, or -1
 * with the complaint (without location) in err. */
static int opt_set(const opt_def *o, void *base, const char *value, char *err, size_t err_len)
{
    char *field = (char *)base + o->offset;
    uint64_t u;
    double d;
    char *end;
    switch (o->type) {
    case OPT_SIZE:
        if (o->unlimited_ok && strcasecmp(value, "unlimited") == 0) {
            u = SIZE_MAX;
        } else {
            if (units_parse_size(value, &u, err, err_len) != 0)
                return -1;
            if ((double)u < o->min || (double)u > o->max) {
                snprintf(err, err_len, "'%s' is out of range (at least %.0f bytes)", value, o->min);
                return -1;
            }
        }
        if (o->size == sizeof(size_t))
            *(size_t *)field = (size_t)u;
        else
            *(uint64_t *)field = u;
        return 0;
    case OPT_DURATION:
        if (units_parse_duration_ms(value, &u, err, err_len) != 0)
            return -1;
        if ((double)u < o->min || (double)u > o->max) {
            snprintf(err, err_len, "'%s' is out of range (%.0fms to %.0fms)", value, o->min, o->max);
            return -1;
        }
        *(uint64_t *)field = u;
        return 0;
    case OPT_FRACTION:
        d = strtod(value, &end);
        if (end == value || *end || !(d >= o->min && d <= o->max)) {
            snprintf(err, err_len, "'%s' is not a number from %g to %g", value, o->min, o->max);
            return -1;
        }
        *(double *)field = d;
        return 0;
    case OPT_BOOL:
        if (parse_bool(value, (bool *)field) != 0) {
            snprintf(err, err_len, "'%s' is not a boolean (true/false, yes/no, on/off)", value);
            return -1;
        }
        return 0;
    case OPT_COUNT:
        if (value[0] < '0' || value[0] > '9') {
            snprintf(err, err_len, "'%s' is not a whole number", value);
            return -1;
        }
        u = strtoull(value, &end, 10);
        if (*end || (double)u < o->min || (double)u > o->max) {
            snprintf(err, err_len, "'%s' is not a whole number from %.0f to %.0f", value, o->min, o->max);
            return -1;
        }
        if (o->size == sizeof(size_t))
            *(size_t *)field = (size_t)u;
        else
            *(uint64_t *)field = u;
        return 0;
    case OPT_STRING:
        if (strlen(value) >= o->size) {
            snprintf(err, err_len, "value is longer than %zu characters", o->size - 1);
            return -1;
        }
        memcpy(field, value, strlen(value) + 1);
        return 0;
    }
    return -1;
}

static const opt_def *opt_find(const char *section, const char *key)
{
    for (size_t i = 0; i < NOPTS; i++)
        if (strcmp(opts[i].section, section) == 0 && strcmp(opts[i].key, key) == 0)
            return &opts[i];
    return NULL;
}

static bool section_known(const char *section)
{
    for (size_t i = 0; i < NOPTS; i++)
        if (strcmp(opts[i].section, section) == 0)
            return true;
    return false;
}

/* ---- defaults --------------------------------------------------------------- */

static void apply_defaults(void *base, const char *section)
{
    char err[128];
    for (size_t i = 0; i < NOPTS; i++)
        if (strcmp(opts[i].section, section) == 0)
            opt_set(&opts[i], base, opts[i].def, err, sizeof err);
}

void config_defaults(gradd_config *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->source, sizeof c->source, "(defaults)");
    apply_defaults(c, "daemon");
    apply_defaults(c, "cpu");
    apply_defaults(c, "cuda");
    pool_config_default(&c->pool);
    apply_defaults(&c->pool, "pool");
}

void config_print_defaults(FILE *f)
{
    const char *cur = "";
    for (size_t i = 0; i < NOPTS; i++) {
        if (strcmp(cur, opts[i].section) != 0) {
            cur = opts[i].section;
            fprintf(f, "%s[%s]\n", i ? "\n" : "", cur);
        }
        fprintf(f, "# %s\n#%s = %s\n", opts[i].help, opts[i].key, opts[i].def);
    }
}

/* ---- the ini handler -------------------------------------------------------- */

typedef struct {
    const char *path;
    FILE *f;
    int line;                       /* lines read so far = the line being parsed */
    gradd_config *cfg;
    int seen_line[NOPTS];           /* for duplicate keys in plain sections */
    char err[512];
    int failed;
    int fail_line;
} parse_ctx;

static int fail(parse_ctx *p, int line, const char *section, const char *key, const char *why)
{
    if (!p->failed) {
        if (key)
            snprintf(p->err, sizeof p->err, "%s:%d: [%s] %s: %s", p->path, line, section, key, why);
        else if (!*section)
            snprintf(p->err, sizeof p->err, "%s:%d: %s", p->path, line, why);
        else
            snprintf(p->err, sizeof p->err, "%s:%d: [%s]: %s", p->path, line, section, why);
        p->failed = 1;
        p->fail_line = line;
    }
    return 0;
}

/* A device id as users write it: cpuN or cudaN. */
static bool device_id_ok(const char *id)
{
    const char *digits = strncmp(id, "cpu", 3) == 0 ? id + 3 : strncmp(id, "cuda", 4) == 0 ? id + 4 : NULL;
    if (!digits || !*digits || strlen(id) >= 16)
        return false;
    for (const char *q = digits; *q; q++)
        if (*q < '0' || *q > '9')
            return false;
    return true;
}

static config_pool_override *override_for(parse_ctx *p, const char *dev, int line)
{
    gradd_config *c = p->cfg;
    for (int i = 0; i < c->noverrides; i++)
        if (strcmp(c->overrides[i].device, dev) == 0)
            return &c->overrides[i];
    if (c->noverrides == CONFIG_MAX_OVERRIDES)
        return NULL;
    config_pool_override *o = &c->overrides[c->noverrides++];
    memset(o, 0, sizeof *o);
    snprintf(o->device, sizeof o->device, "%s", dev);
    o->line = line;
    return o;
}

static int on_entry(void *user, const char *section, const char *key, const char *value)
{
    parse_ctx *p = user;
    int line = p->line;
    char why[256];
    if (p->failed)
        return 0;
    if (!key) /* a section header with no keys yet (INI_CALL_HANDLER_ON_NEW_SECTION) */
        return 1;
    if (section[0] == '\0')
        return fail(p, line, "", key, "key outside any section; put it under [daemon], [cpu], [cuda] or [pool]");

    if (strncmp(section, "pool.", 5) == 0) {
        const char *dev = section + 5;
        if (!device_id_ok(dev))
            return fail(p, line, section, NULL, "unknown section: per-device pool sections are [pool.cpuN] or [pool.cudaN]");
        const opt_def *o = opt_find("pool", key);
        if (!o)
            return fail(p, line, section, key, "unknown key");
        config_pool_override *ov = override_for(p, dev, line);
        if (!ov)
            return fail(p, line, section, NULL, "too many [pool.DEV] sections");
        uint64_t bit = 1ull << (o - opts);
        if (ov->set_mask & bit)
            return fail(p, line, section, key, "given twice in this section");
        if (opt_set(o, &ov->pool, value, why, sizeof why) != 0)
            return fail(p, line, section, key, why);
        ov->set_mask |= bit;
        return 1;
    }
    if (!section_known(section))
        return fail(p, line, section, NULL, "unknown section (known: daemon, cpu, cuda, pool, pool.DEV)");
    const opt_def *o = opt_find(section, key);
    if (!o)
        return fail(p, line, section, key, "unknown key");
    size_t idx = (size_t)(o - opts);
    if (p->seen_line[idx]) {
        snprintf(why, sizeof why, "given twice (first on line %d)", p->seen_line[idx]);
        return fail(p, line, section, key, why);
    }
    p->seen_line[idx] = line;
    void *base = strcmp(section, "pool") == 0 ? (void *)&p->cfg->pool : (void *)p->cfg;
    if (opt_set(o, base, value, why, sizeof why) != 0)
        return fail(p, line, section, key, why);
    return 1;
}

/* Per-device sections hold only the keys they set; the rest come from
 * [pool], which may appear anywhere in the file, so merge after parsing. */
static void merge_overrides(gradd_config *c)
{
    for (int i = 0; i < c->noverrides; i++) {
        config_pool_override *ov = &c->overrides[i];
        pool_config merged = c->pool;
        for (size_t k = 0; k < NOPTS; k++) {
            if (!(ov->set_mask & (1ull << k)))
                continue;
            memcpy((char *)&merged + opts[k].offset, (char *)&ov->pool + opts[k].offset, opts[k].size);
        }
        ov->pool = merged;
    }
}

/* libinih's reader callback, wrapped to count lines: Debian's libinih does
 * not pass line numbers to the handler, and errors must name the line. */
static char *read_line(char *str, int num, void *stream)
{
    parse_ctx *p = stream;
    char *r = fgets(str, num, p->f);
    if (!r)
        return NULL;
    p->line++;
    size_t n = strlen(r);
    if (n == (size_t)num - 1 && r[n - 1] != '\n' && !feof(p->f)) {
        char why[64];
        snprintf(why, sizeof why, "line is longer than %d characters", num - 2);
        fail(p, p->line, "", NULL, why);
        int c;
        while ((c = fgetc(p->f)) != EOF && c != '\n')
            ;
    }
    return r;
}

int config_load(const char *path, gradd_config *out, char *err, size_t err_len)
{
    gradd_config *tmp = malloc(sizeof *tmp);
    if (!tmp) {
        snprintf(err, err_len, "%s: out of memory", path);
        return -1;
    }
    config_defaults(tmp);
    snprintf(tmp->source, sizeof tmp->source, "%s", path);
    parse_ctx p = {.path = path, .cfg = tmp};

    FILE *f = fopen(path, "r");
    p.f = f;
    if (!f) {
        snprintf(err, err_len, "%s: cannot open: %m", path);
        free(tmp);
        return -1;
    }
    /* Continuation lines would turn an indented "key = value" into part of
     * the previous value; gradd.conf has no multi-line values. */
    ini_allow_multiline = false;
    int rc = ini_parse_stream(read_line, &p, on_entry, &p);
    fclose(f);
    /* libinih reports the first syntax error's line; keep whichever of
     * that and our own first complaint comes first in the file. */
    if (rc > 0 && (!p.failed || rc < p.fail_line)) {
        snprintf(p.err, sizeof p.err, "%s:%d: syntax error (expected [section] or key = value)", path, rc);
        p.failed = 1;
    } else if (rc < 0 && !p.failed) {
        snprintf(p.err, sizeof p.err, "%s: cannot read", path);
        p.failed = 1;
    }
    if (p.failed) {
        snprintf(err, err_len, "%s", p.err);
        free(tmp);
        return -1;
    }
    merge_overrides(tmp);
    *out = *tmp;
    free(tmp);
    return 0;
}

void config_pool_for(const gradd_config *c, const char *device_id, pool_config *out)
{
    *out = c->pool;
    for (int i = 0; i < c->noverrides; i++)
        if (strcmp(c->overrides[i].device, device_id) == 0)
            *out = c->overrides[i].pool;
}
