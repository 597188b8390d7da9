/* units.c — parsing and printing of sizes and durations. */
#include "units.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Split "1.5G" into a non-negative decimal number and its suffix.  Only
 * digits and one '.' make the number: no sign, exponent, hex, inf or nan. */
static int number_and_suffix(const char *text, double *v, const char **suffix)
{
    if (!text)
        return -1;
    while (isspace((unsigned char)*text))
        text++;
    const char *p = text;
    int digits = 0, dots = 0;
    for (; isdigit((unsigned char)*p) || *p == '.'; p++) {
        digits += *p != '.';
        dots += *p == '.';
    }
    if (digits == 0 || dots > 1)
        return -1;
    /* strtod may read further than the scan ("1e3", "0x10"), but whatever
     * it reads past p is rejected below as an unknown unit. */
    errno = 0;
    *v = strtod(text, NULL);
    if (errno || !isfinite(*v))
        return -1;
    while (isspace((unsigned char)*p))
        p++;
    *suffix = p;
    return 0;
}

int units_parse_size(const char *text, uint64_t *out, char *err, size_t err_len)
{
    double v;
    const char *s;
    if (number_and_suffix(text, &v, &s) != 0) {
        snprintf(err, err_len, "'%s' is not a size (expected e.g. 4096, 512M, 4G)", text ? text : "");
        return -1;
    }
    /* Suffix: optional unit letter, then optional "B" (or "iB" after a unit). */
    static const char units[] = "KMGTP";
    int shift = 0;
    const char *u = (*s && !isspace((unsigned char)*s)) ? strchr(units, toupper((unsigned char)*s)) : NULL;
    const char *rest = s;
    if (u) {
        shift = 10 * (int)(u - units + 1);
        rest++;
    }
    size_t rn = strlen(rest);
    while (rn > 0 && isspace((unsigned char)rest[rn - 1]))
        rn--;
    int ok = rn == 0 || (rn == 1 && toupper((unsigned char)rest[0]) == 'B') ||
             (rn == 2 && u && strncasecmp(rest, "iB", 2) == 0);
    if (!ok) {
        snprintf(err, err_len, "'%s' has an unknown unit (use K, M, G, T or P)", text);
        return -1;
    }
    /* Whole numbers go through integers so that every byte count up to
     * 2^64-1 is exact; only fractions ("1.5G") need floating point. */
    const char *p = text;
    while (isspace((unsigned char)*p))
        p++;
    uint64_t bytes;
    if (strcspn(p, ".") >= (size_t)(s - p)) {
        errno = 0;
        unsigned long long n = strtoull(p, NULL, 10);
        if (errno == ERANGE || (shift && n > (UINT64_MAX >> shift))) {
            snprintf(err, err_len, "'%s' is too large", text);
            return -1;
        }
        bytes = (uint64_t)n << shift;
    } else {
        double b = ldexp(v, shift);
        if (b >= 18446744073709551616.0) {
            snprintf(err, err_len, "'%s' is too large", text);
            return -1;
        }
        if (b != floor(b)) {
            snprintf(err, err_len, "'%s' is not a whole number of bytes", text);
            return -1;
        }
        bytes = (uint64_t)b;
    }
    *out = bytes;
    return 0;
}

int units_parse_duration_ms(const char *text, uint64_t *out_ms, char *err, size_t err_len)
{
    double v;
    const char *s;
    if (number_and_suffix(text, &v, &s) != 0) {
        snprintf(err, err_len, "'%s' is not a duration (expected e.g. 500ms, 30s, 5m)", text ? text : "");
        return -1;
    }
    double mult;
    if (*s == '\0' || strcmp(s, "s") == 0)
        mult = 1000;
    else if (strcmp(s, "ms") == 0)
        mult = 1;
    else if (strcmp(s, "m") == 0 || strcmp(s, "min") == 0)
        mult = 60e3;
    else if (strcmp(s, "h") == 0)
        mult = 3600e3;
    else if (strcmp(s, "d") == 0)
        mult = 86400e3;
    else {
        snprintf(err, err_len, "'%s' has an unknown unit (use ms, s, m, h or d)", text);
        return -1;
    }
    double ms = v * mult;
    if (ms > 1e15) {
        snprintf(err, err_len, "'%s' is too long", text);
        return -1;
    }
    *out_ms = (uint64_t)llround(ms);
    return 0;
}

const char *units_format_size(uint64_t bytes, char *buf, size_t len)
{
    static const char units[] = "KMGTP";
    if (bytes < 1024) {
        snprintf(buf, len, "%llu", (unsigned long long)bytes);
        return buf;
    }
    double v = (double)bytes;
    int u = -1;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (v < 10)
        snprintf(buf, len, "%.2f%c", v, units[u]);
    else if (v < 100)
        snprintf(buf, len, "%.1f%c", v, units[u]);
    else
        snprintf(buf, len, "%.0f%c", v, units[u]);
    return buf;
}

const char *units_format_duration(double seconds, char *buf, size_t len)
{
    if (!(seconds >= 0) || !isfinite(seconds))
        seconds = 0;
    if (seconds > 1e15) /* ~31 million years; keeps the conversion defined */
        seconds = 1e15;
    unsigned long long s = (unsigned long long)seconds;
    if (s < 60)
        snprintf(buf, len, "%llus", s);
    else if (s < 3600)
        snprintf(buf, len, "%llum%02llus", s / 60, s % 60);
    else if (s < 86400)
        snprintf(buf, len, "%lluh%02llum", s / 3600, (s % 3600) / 60);
    else
        snprintf(buf, len, "%llud%02lluh", s / 86400, (s % 86400) / 3600);
    return buf;
}
