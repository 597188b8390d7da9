/* opts.h — table-driven INI options, shared by gradd.conf (config.c) and
 * job files (jobcfg.c).
 *
 * A table row names a section and key, the field's type and place in a
 * struct, its bounds and default, and a line of help.  opts_parse_file runs
 * libinih over a file, counting lines itself (Debian's libinih does not pass
 * them), and turns the first complaint into "FILE:LINE: [section] key: why".
 */
#ifndef GRADD_OPTS_H
#define GRADD_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    OPTS_SIZE,     /* uint64_t or size_t: "512M", "4G" (and "unlimited" if allowed) */
    OPTS_DURATION, /* uint64_t milliseconds: "500ms", "30s", "5m" */
    OPTS_DOUBLE,   /* double within [min, max] */
    OPTS_BOOL,     /* bool: true/false, yes/no, on/off, 1/0 */
    OPTS_COUNT,    /* uint64_t, size_t, uint32_t or int (by field size): whole number in [min, max] */
    OPTS_STRING,   /* char[size] */
    OPTS_CHOICE,   /* int: index of the value in `choices` ("a|b|c") */
} opts_type;

typedef struct {
    const char *section;
    const char *key;
    opts_type type;
    size_t offset; /* of the field in the struct the table describes */
    size_t size;   /* of the field */
    double min, max;
    bool unlimited_ok; /* OPTS_SIZE: accepts "unlimited" (all ones) */
    const char *def;   /* default, as it would be written in the file */
    const char *help;
    const char *choices; /* OPTS_CHOICE: "fp32|bf16|fp16" */
} opts_def;

#define OPTS_FIELD(type, field) offsetof(type, field), sizeof(((type *)0)->field)

/* Store `value` into the field `o` describes inside `base`.  0, or -1 with
 * the complaint (without location) in err. */
int opts_set(const opts_def *o, void *base, const char *value, char *err, size_t err_len);

/* Apply the defaults of every row of `section` (NULL: all rows). */
void opts_defaults(const opts_def *defs, size_t n, const char *section, void *base);

const opts_def *opts_find(const opts_def *defs, size_t n, const char *section, const char *key);
bool opts_section_known(const opts_def *defs, size_t n, const char *section);

/* Print the rows as a commented INI file of defaults. */
void opts_print(const opts_def *defs, size_t n, FILE *f);

/* ---- parsing ------------------------------------------------------------------ */

/* Called for each key = value, and once with key and value NULL for a
 * [section] that holds no key (so that an unknown one is refused too).
 * Return 0, or -1 with `why` filled; set *name_key to false when the
 * complaint is about the section rather than the key. */
typedef int (*opts_entry_fn)(void *user, const char *section, const char *key, const char *value, int line,
                             char *why, size_t why_len, bool *name_key);

/* Parse `path` with `fn`.  Keys outside any section and a key given twice in
 * the same section are refused here.  0, or -1 with the first error (by
 * line) in err. */
int opts_parse_file(const char *path, opts_entry_fn fn, void *user, char *err, size_t err_len);
/* A configuration file opened for reading, refused (NULL, err set) when it
 * is not a regular file: a FIFO would block, a device never end. */
FILE *opts_open_file(const char *path, char *err, size_t err_len);
/* The same over an open stream; `name` stands for the file in messages. */
int opts_parse_stream(FILE *f, const char *name, opts_entry_fn fn, void *user, char *err, size_t err_len);

/* The table-driven entry handler most files need: `base` is the struct,
 * unknown sections and keys are errors listing what is known. */
typedef struct {
    const opts_def *defs;
    size_t n;
    void *base;
} opts_simple;
int opts_simple_entry(void *user, const char *section, const char *key, const char *value, int line, char *why,
                      size_t why_len, bool *name_key);

#endif
