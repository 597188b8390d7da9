/* fuzz_units.c — libFuzzer harness for common/units.c.
 *
 * The input (NUL-terminated copy) is parsed as a size and as a duration.
 * Properties (abort() on violation):
 *   - a failed parse always explains itself in err;
 *   - on success, units_format_size of the value fits a 16-byte buffer, and
 *     formatting into every smaller buffer (1..15 bytes, each its own heap
 *     allocation so ASan sees the bound) never writes past it and always
 *     NUL-terminates;
 *   - for input made only of decimal digits: units_parse_size equals
 *     strtoull for every value a double holds exactly (<= 2^53), and so do
 *     the K/M/G-suffixed forms; units_parse_duration_ms equals value*1000
 *     up to its 1e15 ms limit and fails above it.  Whole numbers above 2^53
 *     must be exact too (units.c parses them as integers).
 *   - units_format_duration of any double (the input's first 8 bytes) fits
 *     its buffer, however large.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "units.h"

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "fuzz_units: property failed at %s:%d: %s\n", __FILE__,    \
                    __LINE__, #cond);                                                    \
            abort();                                                                     \
        }                                                                                \
    } while (0)

#define EXACT_LIMIT (1ull << 53)

static void check_format_size(uint64_t v)
{
    char big[16];
    memset(big, 'x', sizeof big);
    units_format_size(v, big, sizeof big);
    size_t full = strnlen(big, sizeof big);
    CHECK(full < sizeof big);
    CHECK(full > 0);
    for (size_t len = 1; len < sizeof big; len++) {
        char *b = malloc(len);
        CHECK(b != NULL);
        memset(b, 'x', len);
        const char *r = units_format_size(v, b, len);
        CHECK(r == b);
        size_t got = strnlen(b, len);
        CHECK(got < len);                       /* NUL-terminated inside */
        CHECK(got == (full < len ? full : len - 1)); /* a prefix of the full text */
        CHECK(memcmp(b, big, got) == 0);
        free(b);
    }
}

static void check_format_duration(double s)
{
    char big[32];
    units_format_duration(s, big, sizeof big);
    CHECK(strnlen(big, sizeof big) < sizeof big);
    char *b = malloc(6);
    CHECK(b != NULL);
    units_format_duration(s, b, 6);
    CHECK(strnlen(b, 6) < 6);
    free(b);
}

static int all_digits(const char *s)
{
    if (!*s)
        return 0;
    for (; *s; s++)
        if (*s < '0' || *s > '9')
            return 0;
    return 1;
}

static void check_digits(const char *text)
{
    errno = 0;
    char *end;
    unsigned long long want = strtoull(text, &end, 10);
    CHECK(*end == '\0');
    int range = errno == ERANGE;

    uint64_t got = 0;
    char err[256] = "";
    int rc = units_parse_size(text, &got, err, sizeof err);
    if (!range && want <= EXACT_LIMIT) {
        if (rc != 0) {
            fprintf(stderr, "fuzz_units: '%s' rejected: %s\n", text, err);
            abort();
        }
        if (got != want) {
            fprintf(stderr, "fuzz_units: '%s' parsed as %llu, strtoull says %llu\n", text,
                    (unsigned long long)got, want);
            abort();
        }
    }
    else if (!range && rc == 0 && got != want) {
        fprintf(stderr, "fuzz_units: '%s' parsed as %llu, strtoull says %llu\n", text,
                (unsigned long long)got, want);
        abort();
    }

    /* The same number with a binary suffix. */
    if (!range && want <= EXACT_LIMIT) {
        static const char sfx[] = "KMG";
        for (int i = 0; i < 3; i++) {
            uint64_t mult = 1ull << (10 * (i + 1));
            if (want > EXACT_LIMIT / mult)
                break;
            size_t n = strlen(text);
            char *t = malloc(n + 2);
            CHECK(t != NULL);
            memcpy(t, text, n);
            t[n] = sfx[i];
            t[n + 1] = '\0';
            got = 0;
            rc = units_parse_size(t, &got, err, sizeof err);
            if (rc != 0 || got != want * mult) {
                fprintf(stderr, "fuzz_units: '%s' gave rc %d value %llu, want %llu\n", t, rc,
                        (unsigned long long)got, (unsigned long long)(want * mult));
                abort();
            }
            free(t);
        }
    }

    /* A bare number is seconds. */
    uint64_t ms = 0;
    rc = units_parse_duration_ms(text, &ms, err, sizeof err);
    if (!range && want <= 1000000000000ull) {
        if (rc != 0 || ms != want * 1000) {
            fprintf(stderr, "fuzz_units: duration '%s' gave rc %d value %llu, want %llu\n", text,
                    rc, (unsigned long long)ms, want * 1000);
            abort();
        }
    } else if (want > 1000000000000ull + 1 || range) {
        /* Above the limit (with margin for strtod rounding at the edge). */
        CHECK(rc != 0);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size >= sizeof(double)) {
        double d;
        memcpy(&d, data, sizeof d);
        check_format_duration(d);
    }

    char *text = malloc(size + 1);
    CHECK(text != NULL);
    memcpy(text, data, size);
    text[size] = '\0';

    uint64_t v = 0;
    char err[256];
    err[0] = '\0';
    if (units_parse_size(text, &v, err, sizeof err) == 0)
        check_format_size(v);
    else
        CHECK(err[0] != '\0');

    /* A tiny err buffer must be truncated, not overrun. */
    char *small = malloc(8);
    CHECK(small != NULL);
    units_parse_size(text, &v, small, 8);
    units_parse_duration_ms(text, &v, small, 8);
    free(small);

    uint64_t ms = 0;
    err[0] = '\0';
    if (units_parse_duration_ms(text, &ms, err, sizeof err) == 0) {
        CHECK(ms <= 1000000000000000ull);
        check_format_duration((double)ms / 1000.0);
    } else {
        CHECK(err[0] != '\0');
    }

    if (all_digits(text))
        check_digits(text);

    free(text);
    return 0;
}
