/* fuzz_utf8.c — libFuzzer harness for common/utf8.c's safe form.
 *
 * The input, as bytes, is turned into its safe form with each flag set, and
 * in pieces split where the input's first byte says (as `gradctl logs`
 * does with the chunks it receives, holding back a cut sequence).
 * Properties (abort() on violation):
 *   - each step consumes 1 to 4 bytes, no more than remain, and writes at
 *     most UTF8_SAFE_MAX bytes and at most 4 per byte consumed;
 *   - the form is valid UTF-8 and holds no code point that utf8_unsafe_cp
 *     names, except \n and \t with UTF8_SAFE_LINES;
 *   - valid UTF-8 input free of unsafe code points and backslashes comes
 *     out unchanged;
 *   - the form of the input in two pieces, with a cut sequence carried over,
 *     equals the form of the whole;
 *   - utf8_valid agrees with utf8_decode stepping over the input.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz_utf8: property failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* The safe form of s[0..n) appended to out (room for 4*n bytes); with
 * `more`, a sequence cut at the end is left.  Returns the bytes consumed. */
static size_t form(const unsigned char *s, size_t n, unsigned flags, int more, char *out, size_t *o)
{
    size_t i = 0;
    while (i < n) {
        if (more && utf8_cut_short(s + i, n - i))
            break;
        char step[UTF8_SAFE_MAX];
        size_t len = 0;
        size_t k = utf8_safe_step(s + i, n - i, flags, step, &len);
        CHECK(k >= 1 && k <= 4 && k <= n - i);
        CHECK(len >= 1 && len <= UTF8_SAFE_MAX && len <= 4 * k);
        memcpy(out + *o, step, len);
        *o += len;
        i += k;
    }
    return i;
}

static void check_clean(const char *out, size_t o, unsigned flags)
{
    for (size_t i = 0; i < o;) {
        uint32_t cp;
        size_t k = utf8_decode((const unsigned char *)out + i, o - i, &cp);
        CHECK(k > 0);
        CHECK(!utf8_unsafe_cp(cp) || ((flags & UTF8_SAFE_LINES) && (cp == '\n' || cp == '\t')));
        i += k;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *out = malloc(4 * size + 1), *whole = malloc(4 * size + 1);
    CHECK(out && whole);
    bool plain = true, decodes = true;
    for (size_t i = 0; i < size;) {
        uint32_t cp;
        size_t k = utf8_decode(data + i, size - i, &cp);
        if (k == 0 || cp == 0)
            decodes = false;
        if (k == 0 || utf8_unsafe_cp(cp) || cp == '\\')
            plain = false;
        i += k ? k : 1;
    }
    static const unsigned flag_sets[] = {0, UTF8_SAFE_LINES, UTF8_SAFE_BACKSLASH, UTF8_SAFE_LINES | UTF8_SAFE_BACKSLASH};
    for (size_t f = 0; f < sizeof flag_sets / sizeof flag_sets[0]; f++) {
        size_t o = 0;
        CHECK(form(data, size, flag_sets[f], 0, whole, &o) == size);
        check_clean(whole, o, flag_sets[f]);
        if (plain)
            CHECK(o == size && memcmp(whole, data, size) == 0);
        /* In two pieces, the first's cut sequence carried to the second. */
        size_t cut = size ? data[0] % (size + 1) : 0, o2 = 0;
        size_t done = form(data, cut, flag_sets[f], 1, out, &o2);
        CHECK(cut - done <= 3);
        CHECK(form(data + done, size - done, flag_sets[f], 0, out, &o2) == size - done);
        CHECK(o2 == o && memcmp(out, whole, o) == 0);
    }
    /* utf8_valid reads a C string: only for input without NUL. */
    if (!memchr(data, 0, size)) {
        char *s = malloc(size + 1);
        CHECK(s);
        memcpy(s, data, size);
        s[size] = '\0';
        CHECK(utf8_valid(s) == decodes);
        free(s);
    }
    free(out);
    free(whole);
    return 0;
}
