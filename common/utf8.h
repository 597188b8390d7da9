/* utf8.h — strict UTF-8 validation, for the text that file formats require
 * to be UTF-8 (safetensors' JSON header, TensorBoard's tags). */
#ifndef GRADD_UTF8_H
#define GRADD_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/* Length of the valid UTF-8 sequence starting at s (at most n bytes
 * available), or 0 if it is not one.  Rejects overlong forms, surrogates and
 * code points above U+10FFFF. */
size_t utf8_seq(const unsigned char *s, size_t n);

/* Whether the NUL-terminated str is valid UTF-8 throughout. */
bool utf8_valid(const char *str);

#endif
