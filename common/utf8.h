/* utf8.h — strict UTF-8 validation, for the text that file formats require
 * to be UTF-8 (safetensors' JSON header, TensorBoard's tags); and the safe
 * form in which text from users (job names, paths, messages) is shown to
 * other users, on their terminals, in JSON and in the daemon's log. */
#ifndef GRADD_UTF8_H
#define GRADD_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Length of the valid UTF-8 sequence starting at s (at most n bytes
 * available), or 0 if it is not one.  Rejects overlong forms, surrogates and
 * code points above U+10FFFF. */
size_t utf8_seq(const unsigned char *s, size_t n);
/* utf8_seq, and the code point in *cp where the sequence is valid. */
size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

/* Whether the NUL-terminated str is valid UTF-8 throughout. */
bool utf8_valid(const char *str);

/* ---- the safe form ---------------------------------------------------------- */

/* Code points that act on whoever reads them instead of showing: C0 and C1
 * controls and DEL (a C1 CSI, U+009B, starts an escape sequence on many
 * terminals just as ESC [ does), the bidi controls that reorder the text
 * after them (U+061C, U+200E, U+200F, U+202A..U+202E, U+2066..U+2069: a path
 * can be made to read as another), and the line and paragraph separators
 * U+2028 and U+2029, which break a line where none shows. */
bool utf8_unsafe_cp(uint32_t cp);

enum {
    UTF8_SAFE_LINES = 1,     /* keep \n and \t (log text is multi-line) */
    UTF8_SAFE_BACKSLASH = 2, /* write \ as \\, so that the form reads back */
};
/* The most bytes one step writes: "\u202e". */
#define UTF8_SAFE_MAX 6

/* One step of the safe form of s[0..n), n > 0: returns the bytes consumed
 * and writes what they show as to out (*out_len bytes, not terminated).  A
 * valid sequence that is safe stays itself; C0 controls and DEL become
 * "\x1b", other unsafe code points "\u009b" or "\u202e", and each byte that
 * is not part of a valid UTF-8 sequence "\xff".  What comes out is valid
 * UTF-8 holding no unsafe code point (but \n and \t with UTF8_SAFE_LINES),
 * and at most 4 bytes for each byte consumed. */
size_t utf8_safe_step(const unsigned char *s, size_t n, unsigned flags, char out[UTF8_SAFE_MAX],
                      size_t *out_len);

/* The safe form of the NUL-terminated s into buf (len > 0; always
 * terminated, cut before a step that does not fit); returns buf. */
char *utf8_safe(const char *s, unsigned flags, char *buf, size_t len);

/* Whether s[0..n) is the start of a UTF-8 sequence that its end cuts short
 * (so that text arriving in pieces can hold it back for the next piece). */
bool utf8_cut_short(const unsigned char *s, size_t n);

#endif
