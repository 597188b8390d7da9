/* queue_state.c — a job's state file: the text queue_persist writes, and the
 * strict parser that reads it back at start.
 *
 * The file is key=value lines, one per field, each ending in a newline;
 * string values escape backslash as \\ and newline as \n.  One table lists
 * the fields in the order they are written; the writer walks it, and the
 * parser requires each of them exactly once, so what is required is exactly
 * what is always written.
 *
 * Why strict: the worker takes the job owner's uid and gid for every file
 * access of the run (access.c), so a damaged uid line read leniently (as 0)
 * would run the job with root's access.  A file that is not exactly what we
 * write is reported with its line and key, and the job is skipped.
 */
#include "queue.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const state_names[JOB_STATE_COUNT] = {"queued", "running", "completed", "failed", "cancelled"};

const char *job_state_name(job_state s)
{
    return s < JOB_STATE_COUNT ? state_names[s] : "?";
}

int job_state_parse(const char *name, job_state *out)
{
    for (int i = 0; i < JOB_STATE_COUNT; i++)
        if (strcmp(name, state_names[i]) == 0) {
            *out = (job_state)i;
            return 0;
        }
    return -1;
}

/* ---- the fields ------------------------------------------------------------------- */

typedef enum {
    QS_STR,   /* a char array, escaped */
    QS_U32,   /* uint32_t */
    QS_UID,   /* uid_t */
    QS_GID,   /* gid_t */
    QS_I64,   /* int64_t */
    QS_U64,   /* uint64_t */
    QS_TIME,  /* double, unix seconds */
    QS_STATE, /* job_state, by name */
    QS_F64,   /* double: finite, or nan */
    QS_MODE,  /* mode_t permission bits, octal, 0 to 0777 */
    QS_IDS,   /* queue_ids: job ids, ascending, comma-separated; empty for none */
    QS_BOOL,  /* bool: 0 or 1 */
} qs_kind;

typedef struct {
    const char *key;
    qs_kind kind;
    size_t off;
    size_t size; /* of the field, for QS_STR the room including the NUL */
    bool optional; /* added after the first release: older files lack it */
} qs_field;

#define QS_FIELD(k, kind, member) {k, kind, offsetof(job, member), sizeof(((job *)0)->member), false}
/* The job's progress as it last reported it, so that a finished job's
 * results outlive the daemon.  Absent: 0, and nan for the doubles. */
#define QS_PROG(k, kind, member) {k, kind, offsetof(job, prog.member), sizeof(((job *)0)->prog.member), true}

#define QS_MEM(k, member) {k, QS_U64, offsetof(job, member), sizeof(uint64_t), true}
#define QS_MEM_TAG(k, t) {k, QS_U64, offsetof(job, mem_tag_peak) + (t) * sizeof(uint64_t), sizeof(uint64_t), true}

static const qs_field qs_fields[] = {
    QS_FIELD("id", QS_U32, id),
    QS_FIELD("name", QS_STR, name),
    QS_FIELD("uid", QS_UID, uid),
    QS_FIELD("gid", QS_GID, gid),
    QS_FIELD("user", QS_STR, user),
    QS_FIELD("state", QS_STATE, state),
    QS_FIELD("priority", QS_I64, priority),
    QS_FIELD("seq", QS_U64, seq),
    QS_FIELD("submitted_at", QS_TIME, submitted_at),
    QS_FIELD("started_at", QS_TIME, started_at),
    QS_FIELD("finished_at", QS_TIME, finished_at),
    QS_FIELD("device", QS_STR, device),
    QS_FIELD("reason", QS_STR, reason),
    QS_FIELD("source", QS_STR, source),
    QS_FIELD("resumes", QS_U32, resumes),
    /* Absent (a job queued before it was kept): 022, what gradd gave
     * every job's outputs until then. */
    {"umask", QS_MODE, offsetof(job, umask), sizeof(mode_t), true},
    /* Absent: 0, no process group (an engine job's, or one from before). */
    {"pgid", QS_U32, offsetof(job, pgid), sizeof(uint32_t), true},
    /* Absent: no limit, no earlier runs (a job from before limits). */
    {"time_limit_ms", QS_U64, offsetof(job, time_limit_ms), sizeof(uint64_t), true},
    {"ran_s", QS_F64, offsetof(job, ran_s), sizeof(double), true},
    {"out_dir_real", QS_STR, offsetof(job, out_real), sizeof(((job *)0)->out_real), true},
    {"continued_at", QS_U64, offsetof(job, continued_at), sizeof(uint64_t), true},
    {"on_end_result", QS_STR, offsetof(job, on_end_result), sizeof(((job *)0)->on_end_result), true},
    QS_PROG("step", QS_U64, step),
    QS_PROG("loss", QS_F64, loss),
    QS_PROG("val_loss", QS_F64, val_loss),
    QS_PROG("val_accuracy", QS_F64, val_accuracy),
    QS_PROG("units_per_s", QS_F64, units_per_s),
    QS_PROG("elapsed_s", QS_F64, elapsed_s),
    QS_PROG("micro", QS_U32, micro),
    QS_PROG("accum", QS_U32, accum),
    QS_PROG("micro_max", QS_U32, micro_max),
    QS_PROG("micro_fit", QS_U32, micro_fit),
    QS_PROG("oom_recoveries", QS_U64, oom_recoveries),
    QS_PROG("batch_changes", QS_U64, batch_changes),
    QS_PROG("change_from", QS_U32, change_from),
    QS_PROG("change_to", QS_U32, change_to),
    QS_PROG("change_step", QS_U64, change_step),
    QS_PROG("change_reason", QS_STR, change_reason),
    QS_PROG("levers", QS_STR, levers),
    /* Absent (a job from before they were kept): 0, nothing known. */
    QS_MEM("mem_peak", mem_peak),
    QS_MEM_TAG("mem_peak_params", POOL_TAG_PARAMS),
    QS_MEM_TAG("mem_peak_grads", POOL_TAG_GRADS),
    QS_MEM_TAG("mem_peak_optimizer", POOL_TAG_OPTIMIZER),
    QS_MEM_TAG("mem_peak_activations", POOL_TAG_ACTIVATIONS),
    QS_MEM_TAG("mem_peak_workspace", POOL_TAG_WORKSPACE),
    QS_MEM_TAG("mem_peak_data", POOL_TAG_DATA),
    QS_MEM_TAG("mem_peak_other", POOL_TAG_OTHER),
    QS_MEM_TAG("mem_peak_frozen", POOL_TAG_FROZEN),
    /* Absent: its finished_at (a job that ended before accounting was
     * kept is not accounted late). */
    {"accounted_at", QS_TIME, offsetof(job, accounted_at), sizeof(double), true},
    /* Absent: no dependencies, none forgotten, not held (a job from
     * before they were kept). */
    {"after", QS_IDS, offsetof(job, after), sizeof(queue_ids), true},
    {"after_done", QS_IDS, offsetof(job, after_done), sizeof(queue_ids), true},
    {"held", QS_BOOL, offsetof(job, held), sizeof(bool), true},
};
_Static_assert(POOL_TAG_COUNT == 8, "a new pool tag needs its mem_peak_ key in the state file");
#define QS_NFIELDS (sizeof qs_fields / sizeof qs_fields[0])

/* The uid and gid are written with %u and checked against UINT32_MAX. */
_Static_assert(sizeof(uid_t) == sizeof(uint32_t) && (uid_t)-1 > 0, "uid_t is a 32-bit unsigned type");
_Static_assert(sizeof(gid_t) == sizeof(uint32_t) && (gid_t)-1 > 0, "gid_t is a 32-bit unsigned type");

/* A unix time at or past this (the year 33658) is damage, not a date.  The
 * bound also keeps every accepted time's %.6f form inside the grammar the
 * parser accepts, so whatever parses survives persist -> parse unchanged. */
#define QS_TIME_MAX 1e12

/* The index of the field named key (which is one). */
static size_t qs_index(const char *key)
{
    size_t i = 0;
    while (i < QS_NFIELDS - 1 && strcmp(qs_fields[i].key, key) != 0)
        i++;
    return i;
}

static void *qs_at(job *j, const qs_field *f)
{
    return (char *)j + f->off;
}

static const void *qs_at_const(const job *j, const qs_field *f)
{
    return (const char *)j + f->off;
}

/* ---- writing ------------------------------------------------------------------------ */

/* Values are one line: escape backslashes and newlines. */
static void qs_put_escaped(FILE *f, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\')
            fputs("\\\\", f);
        else if (*v == '\n')
            fputs("\\n", f);
        else
            fputc(*v, f);
    }
}

char *queue_format_state(const job *j, size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f)
        return NULL;
    for (size_t i = 0; i < QS_NFIELDS; i++) {
        const qs_field *fd = &qs_fields[i];
        const void *p = qs_at_const(j, fd);
        fprintf(f, "%s=", fd->key);
        switch (fd->kind) {
        case QS_STR: qs_put_escaped(f, p); break;
        case QS_U32: fprintf(f, "%" PRIu32, *(const uint32_t *)p); break;
        case QS_UID: fprintf(f, "%u", (unsigned)*(const uid_t *)p); break;
        case QS_GID: fprintf(f, "%u", (unsigned)*(const gid_t *)p); break;
        case QS_I64: fprintf(f, "%" PRId64, *(const int64_t *)p); break;
        case QS_U64: fprintf(f, "%" PRIu64, *(const uint64_t *)p); break;
        case QS_TIME: fprintf(f, "%.6f", *(const double *)p); break;
        case QS_STATE: fputs(job_state_name(*(const job_state *)p), f); break;
        case QS_MODE: fprintf(f, "%04o", (unsigned)*(const mode_t *)p & 0777); break;
        case QS_BOOL: fputc(*(const bool *)p ? '1' : '0', f); break;
        case QS_IDS: {
            const queue_ids *s = p;
            for (uint32_t k = 0; k < s->n && k < QUEUE_AFTER_MAX; k++)
                fprintf(f, "%s%" PRIu32, k ? "," : "", s->id[k]);
            break;
        }
        case QS_F64: {
            double v = *(const double *)p;
            /* One spelling for every nan (%g may write -nan), and inf,
             * which progress never holds, as none. */
            if (isfinite(v))
                fprintf(f, "%.17g", v);
            else
                fputs("nan", f);
            break;
        }
        }
        fputc('\n', f);
    }
    /* open_memstream reports a failed allocation as an error on the stream. */
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/* ---- parsing ------------------------------------------------------------------------ */

/* Format "LINE: KEY: why" (or "LINE: why" without a key) into err; -1. */
static int qs_fail(char *err, size_t err_len, unsigned line, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int qs_fail(char *err, size_t err_len, unsigned line, const char *key, const char *fmt, ...)
{
    if (!err || !err_len)
        return -1;
    int n = key ? snprintf(err, err_len, "%u: %s: ", line, key) : snprintf(err, err_len, "%u: ", line);
    if (n >= 0 && (size_t)n < err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err + n, err_len - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* A bad value as it may appear in a log line: at most 40 bytes, anything
 * but printable ASCII shown as '?', "..." where it was cut. */
#define QS_SHOW_MAX 40
static const char *qs_show(char out[QS_SHOW_MAX + 4], const char *v, size_t n)
{
    size_t k = n < QS_SHOW_MAX ? n : QS_SHOW_MAX;
    for (size_t i = 0; i < k; i++)
        out[i] = v[i] >= 0x20 && v[i] < 0x7f ? v[i] : '?';
    strcpy(out + k, n > k ? "..." : "");
    return out;
}

/* Decimal digits only (no sign, space or base prefix, which strtoul would
 * take), at most max.  0, or -1 where it is not a number, -2 where it is
 * one out of range. */
static int qs_digits(const char *v, size_t n, uint64_t max, uint64_t *out)
{
    if (n == 0)
        return -1;
    uint64_t x = 0;
    int over = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9')
            return -1;
        unsigned d = (unsigned)(v[i] - '0');
        if (x > (max - d) / 10)
            over = 1; /* keep scanning: "99999999999x" is not a number at all */
        else
            x = x * 10 + d;
    }
    if (over)
        return -2;
    *out = x;
    return 0;
}

/* The error for qs_digits' rc (-1 or -2) on value v[0..n) of key; range
 * is what the field holds, as text. */
static int qs_number_fail(char *err, size_t err_len, unsigned line, const char *key, int rc, const char *v, size_t n,
                          const char *range)
{
    char shown[QS_SHOW_MAX + 4];
    if (rc == -1)
        return qs_fail(err, err_len, line, key, "'%s' is not a number", qs_show(shown, v, n));
    return qs_fail(err, err_len, line, key, "'%s' is out of range (%s)", qs_show(shown, v, n), range);
}

/* The value of line `line` for field f, into tmp.  0, or -1 with err. */
static int qs_value(const qs_field *f, const char *v, size_t n, uint32_t want_id, job *tmp, unsigned line,
                    char *err, size_t err_len)
{
    char shown[QS_SHOW_MAX + 4];
    void *p = qs_at(tmp, f);
    char range[64];
    uint64_t u;
    int rc;
    switch (f->kind) {
    case QS_STR: {
        char *o = p;
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            char c = v[i];
            if (c == '\\') {
                if (i + 1 == n)
                    return qs_fail(err, err_len, line, f->key, "a backslash at the end of the value");
                char e = v[++i];
                if (e == '\\')
                    c = '\\';
                else if (e == 'n')
                    c = '\n';
                else
                    return qs_fail(err, err_len, line, f->key, "unknown escape '\\%s' (only \\\\ and \\n)",
                                   qs_show(shown, &e, 1));
            }
            if (k + 1 >= f->size)
                return qs_fail(err, err_len, line, f->key, "longer than the %zu bytes this field holds",
                               f->size - 1);
            o[k++] = c;
        }
        o[k] = '\0';
        return 0;
    }
    case QS_U32:
    case QS_UID:
    case QS_GID: {
        /* (uid_t)-1 and (gid_t)-1 are "no id" to setfsuid/setfsgid and
         * chown, never the identity of a peer: not an owner. */
        uint64_t max = f->kind == QS_U32 ? UINT32_MAX : UINT32_MAX - 1;
        rc = qs_digits(v, n, max, &u);
        snprintf(range, sizeof range, "0 to %" PRIu64, max);
        if (rc != 0)
            return qs_number_fail(err, err_len, line, f->key, rc, v, n, range);
        if (f->kind == QS_UID)
            *(uid_t *)p = (uid_t)u;
        else if (f->kind == QS_GID)
            *(gid_t *)p = (gid_t)u;
        else
            *(uint32_t *)p = (uint32_t)u;
        if (f->off == offsetof(job, id) && u != want_id)
            return qs_fail(err, err_len, line, f->key, "%" PRIu64 " does not match the directory's id %" PRIu32,
                           u, want_id);
        return 0;
    }
    case QS_U64:
        rc = qs_digits(v, n, UINT64_MAX, &u);
        snprintf(range, sizeof range, "0 to %" PRIu64, UINT64_MAX);
        if (rc != 0)
            return qs_number_fail(err, err_len, line, f->key, rc, v, n, range);
        *(uint64_t *)p = u;
        return 0;
    case QS_I64: {
        bool neg = n > 0 && v[0] == '-';
        /* The magnitude of INT64_MIN is one more than INT64_MAX's. */
        uint64_t max = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
        rc = qs_digits(v + neg, n - neg, max, &u);
        snprintf(range, sizeof range, "%" PRId64 " to %" PRId64, INT64_MIN, INT64_MAX);
        if (rc != 0)
            return qs_number_fail(err, err_len, line, f->key, rc, v, n, range);
        /* -(u - 1) - 1: the negation of INT64_MIN's magnitude without an
         * overflow on the way. */
        *(int64_t *)p = neg && u ? -(int64_t)(u - 1) - 1 : (int64_t)u;
        return 0;
    }
    case QS_TIME: {
        /* Digits, optionally a point and at most six more: what %.6f writes
         * for a time in range.  No sign, exponent, hex, inf or nan, which
         * strtod would all take; more decimals than six would be lost by
         * the next persist. */
        size_t i = 0, point = n;
        while (i < n && v[i] >= '0' && v[i] <= '9')
            i++;
        if (i < n && v[i] == '.') {
            point = i++;
            while (i < n && v[i] >= '0' && v[i] <= '9')
                i++;
        }
        char num[32];
        if (point == 0 || i != n || (point < n && (n - point - 1 == 0 || n - point - 1 > 6)))
            return qs_fail(err, err_len, line, f->key, "'%s' is not a time (seconds, at most six decimals)",
                           qs_show(shown, v, n));
        double t = 0;
        if (n < sizeof num) {
            memcpy(num, v, n);
            num[n] = '\0';
            t = strtod(num, NULL);
        }
        if (n >= sizeof num || !(t < QS_TIME_MAX))
            return qs_fail(err, err_len, line, f->key, "'%s' is out of range (times are below %.0f)",
                           qs_show(shown, v, n), QS_TIME_MAX);
        *(double *)p = t;
        return 0;
    }
    case QS_F64: {
        /* What %.17g writes, or nan: no hex, inf, spaces or a leading +,
         * which strtod would also take. */
        char num[40];
        bool ok = n > 0 && n < sizeof num && v[0] != '+' && v[0] != 'e';
        for (size_t i = 0; ok && i < n; i++)
            ok = (v[i] >= '0' && v[i] <= '9') || v[i] == '.' || v[i] == '-' || v[i] == 'e' || v[i] == '+';
        double x = NAN;
        if (n == 3 && memcmp(v, "nan", 3) == 0) {
            ok = true;
        } else if (ok) {
            memcpy(num, v, n);
            num[n] = '\0';
            char *end;
            x = strtod(num, &end);
            ok = *end == '\0' && isfinite(x);
        }
        if (!ok)
            return qs_fail(err, err_len, line, f->key, "'%s' is not a number (or nan)", qs_show(shown, v, n));
        *(double *)p = x;
        return 0;
    }
    case QS_MODE: {
        /* Octal digits, as written: a umask with more bits (setuid, or
         * one from another gradd) is damage, not something to honour. */
        bool ok = n > 0 && n <= 4;
        unsigned m = 0;
        for (size_t i = 0; ok && i < n; i++) {
            ok = v[i] >= '0' && v[i] <= '7';
            m = m * 8 + (unsigned)(v[i] - '0');
        }
        if (!ok || m > 0777)
            return qs_fail(err, err_len, line, f->key, "'%s' is not a umask (octal, 0 to 0777)",
                           qs_show(shown, v, n));
        *(mode_t *)p = (mode_t)m;
        return 0;
    }
    case QS_BOOL:
        if (n != 1 || (v[0] != '0' && v[0] != '1'))
            return qs_fail(err, err_len, line, f->key, "'%s' is not 0 or 1", qs_show(shown, v, n));
        *(bool *)p = v[0] == '1';
        return 0;
    case QS_IDS: {
        /* Ascending ids below the job's own, as the writer leaves them: a
         * job waits only for earlier ones, so no cycle can be read in. */
        queue_ids *s = p;
        s->n = 0;
        for (size_t i = 0; i < n;) {
            const char *c = memchr(v + i, ',', n - i);
            size_t k = c ? (size_t)(c - (v + i)) : n - i;
            rc = qs_digits(v + i, k, UINT32_MAX, &u);
            if (rc != 0)
                return qs_number_fail(err, err_len, line, f->key, rc, v + i, k, "job ids, 1 to 4294967295");
            if (u == 0 || u >= want_id)
                return qs_fail(err, err_len, line, f->key, "job %" PRIu64 " is not one before job %" PRIu32, u,
                               want_id);
            if (s->n > 0 && u <= s->id[s->n - 1])
                return qs_fail(err, err_len, line, f->key, "job %" PRIu64 " is out of order (ascending, once each)",
                               u);
            if (s->n == QUEUE_AFTER_MAX)
                return qs_fail(err, err_len, line, f->key, "more than %d jobs", QUEUE_AFTER_MAX);
            s->id[s->n++] = (uint32_t)u;
            i += k + 1;
            if (c && i == n)
                return qs_fail(err, err_len, line, f->key, "a comma at the end");
        }
        return 0;
    }
    case QS_STATE: {
        char name[16] = "";
        job_state s;
        if (n < sizeof name)
            memcpy(name, v, n);
        if (n >= sizeof name || job_state_parse(name, &s) != 0)
            return qs_fail(err, err_len, line, f->key,
                           "'%s' is not a job state (queued, running, completed, failed, cancelled)",
                           qs_show(shown, v, n));
        *(job_state *)p = s;
        return 0;
    }
    }
    return qs_fail(err, err_len, line, f->key, "no parser for this field");
}

int queue_parse_state(const char *buf, size_t len, uint32_t want_id, job *out, char *err, size_t err_len)
{
    /* Parsed into a copy so that a bad file leaves *out as it was. */
    static const job zero;
    job tmp = zero;
    tmp.prog.loss = tmp.prog.val_loss = tmp.prog.val_accuracy = NAN;
    tmp.umask = 022;
    unsigned seen[QS_NFIELDS] = {0}; /* the line each key was on; 0: not yet */
    char shown[QS_SHOW_MAX + 4];
    unsigned line = 0;
    size_t pos = 0;
    while (pos < len) {
        line++;
        const char *s = buf + pos;
        const char *nl = memchr(s, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - s) : len - pos;
        pos += n + 1;
        const char *eq = memchr(s, '=', n);
        const char *nul = memchr(s, '\0', n);
        if (nul && (!eq || nul < eq))
            return qs_fail(err, err_len, line, NULL, "a NUL byte (the file is damaged)");
        if (n == 0)
            return qs_fail(err, err_len, line, NULL, "an empty line");
        if (!eq)
            return qs_fail(err, err_len, line, NULL, "'%s' is not key=value", qs_show(shown, s, n));
        size_t kn = (size_t)(eq - s);
        const qs_field *f = NULL;
        size_t fi = 0;
        for (; fi < QS_NFIELDS; fi++)
            if (strlen(qs_fields[fi].key) == kn && memcmp(qs_fields[fi].key, s, kn) == 0) {
                f = &qs_fields[fi];
                break;
            }
        /* Unknown keys are errors, not skipped: we wrote this file, so one
         * is damage or comes from a newer gradd, whose field this version
         * would drop on its next persist and whose meaning it cannot honour. */
        if (!f)
            return qs_fail(err, err_len, line, NULL, "'%s' is not a key of a job's state", qs_show(shown, s, kn));
        if (seen[fi])
            return qs_fail(err, err_len, line, f->key, "given twice (first on line %u)", seen[fi]);
        seen[fi] = line;
        if (nul)
            return qs_fail(err, err_len, line, f->key, "a NUL byte in the value (the file is damaged)");
        if (qs_value(f, eq + 1, n - kn - 1, want_id, &tmp, line, err, err_len) != 0)
            return -1;
        /* Every line is written with its newline, so one without was cut. */
        if (!nl)
            return qs_fail(err, err_len, line, f->key, "no newline at the end (the file is cut short)");
    }
    for (size_t i = 0; i < QS_NFIELDS; i++) {
        if (!seen[i] && !qs_fields[i].optional)
            return qs_fail(err, err_len, line + 1, qs_fields[i].key, "missing (the file ends before it)");
        if (!seen[i] && qs_fields[i].off == offsetof(job, accounted_at))
            tmp.accounted_at = tmp.finished_at;
    }
    /* Both lists are ascending: one walk finds an id of after_done that is
     * not in after. */
    for (uint32_t i = 0, k = 0; i < tmp.after_done.n; i++) {
        while (k < tmp.after.n && tmp.after.id[k] < tmp.after_done.id[i])
            k++;
        if (k == tmp.after.n || tmp.after.id[k] != tmp.after_done.id[i])
            return qs_fail(err, err_len, seen[qs_index("after_done")], "after_done",
                           "job %" PRIu32 " is not one of after", tmp.after_done.id[i]);
    }
    *out = tmp;
    return 0;
}

int queue_parse_next_id(const char *buf, size_t len, uint64_t *out, char *err, size_t err_len)
{
    char shown[QS_SHOW_MAX + 4];
    size_t n = len > 0 && buf[len - 1] == '\n' ? len - 1 : len;
    uint64_t u;
    int rc = qs_digits(buf, n, QUEUE_ID_END, &u);
    if (rc == -1 || (rc == 0 && u == 0))
        return qs_fail(err, err_len, 1, NULL, "'%s' is not a job id (1 to %" PRIu64 ")", qs_show(shown, buf, n),
                       QUEUE_ID_END);
    if (rc == -2)
        return qs_fail(err, err_len, 1, NULL, "'%s' is out of range (1 to %" PRIu64 ")", qs_show(shown, buf, n),
                       QUEUE_ID_END);
    if (n == len)
        return qs_fail(err, err_len, 1, NULL, "no newline at the end (the file is cut short)");
    *out = u;
    return 0;
}
