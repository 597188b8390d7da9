/* json.h — a small streaming JSON writer for gradctl --json output. */
#ifndef GRADCTL_JSON_H
#define GRADCTL_JSON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define JSON_MAX_DEPTH 32

typedef struct {
    FILE *f;
    int depth;
    bool need_comma[JSON_MAX_DEPTH];
    bool after_key;
} json_writer;

void json_init(json_writer *w, FILE *f);
void json_begin_object(json_writer *w);
void json_end_object(json_writer *w);
void json_begin_array(json_writer *w);
void json_end_array(json_writer *w);
void json_key(json_writer *w, const char *key);
void json_string(json_writer *w, const char *s);
void json_int(json_writer *w, int64_t v);
void json_uint(json_writer *w, uint64_t v);
void json_double(json_writer *w, double v);
void json_bool(json_writer *w, bool v);
/* Finish the document with a newline. */
void json_end(json_writer *w);

#endif
