/* utf8.c — strict UTF-8 validation and the safe form of shown text (see
 * utf8.h). */
#include "utf8.h"

#include <string.h>

size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *cp_out)
{
    unsigned c = s[0];
    if (c < 0x80) {
        *cp_out = c;
        return 1;
    }
    size_t k;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
        k = 1;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        k = 2;
        cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        k = 3;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (n <= k)
        return 0;
    for (size_t j = 1; j <= k; j++) {
        if ((s[j] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[j] & 0x3F);
    }
    if (k == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF)))
        return 0;
    if (k == 3 && (cp < 0x10000 || cp > 0x10FFFF))
        return 0;
    *cp_out = cp;
    return k + 1;
}

size_t utf8_seq(const unsigned char *s, size_t n)
{
    uint32_t cp;
    return utf8_decode(s, n, &cp);
}

bool utf8_valid(const char *str)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t n = strlen(str);
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(s + i, n - i);
        if (k == 0)
            return false;
        i += k;
    }
    return true;
}

/* ---- the safe form ---------------------------------------------------------- */

bool utf8_unsafe_cp(uint32_t cp)
{
    return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || cp == 0x061C || cp == 0x200E || cp == 0x200F ||
           (cp >= 0x2028 && cp <= 0x2029) || (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
}

static const char hex[] = "0123456789abcdef";

size_t utf8_safe_step(const unsigned char *s, size_t n, unsigned flags, char out[UTF8_SAFE_MAX],
                      size_t *out_len)
{
    uint32_t cp;
    size_t k = utf8_decode(s, n, &cp);
    if (k == 0 || (k == 1 && utf8_unsafe_cp(cp) && !((flags & UTF8_SAFE_LINES) && (cp == '\n' || cp == '\t')))) {
        /* A stray byte or an ASCII control: \xNN, one byte consumed. */
        out[0] = '\\';
        out[1] = 'x';
        out[2] = hex[s[0] >> 4];
        out[3] = hex[s[0] & 15];
        *out_len = 4;
        return 1;
    }
    if (k > 1 && utf8_unsafe_cp(cp)) {
        /* Every unsafe code point above ASCII is below U+10000. */
        out[0] = '\\';
        out[1] = 'u';
        for (int i = 0; i < 4; i++)
            out[2 + i] = hex[(cp >> (12 - 4 * i)) & 15];
        *out_len = 6;
        return k;
    }
    if (cp == '\\' && (flags & UTF8_SAFE_BACKSLASH)) {
        out[0] = out[1] = '\\';
        *out_len = 2;
        return 1;
    }
    memcpy(out, s, k);
    *out_len = k;
    return k;
}

char *utf8_safe(const char *s, unsigned flags, char *buf, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s), o = 0;
    for (size_t i = 0; i < n;) {
        char step[UTF8_SAFE_MAX];
        size_t step_len;
        size_t k = utf8_safe_step(p + i, n - i, flags, step, &step_len);
        if (o + step_len >= len)
            break;
        memcpy(buf + o, step, step_len);
        o += step_len;
        i += k;
    }
    buf[o] = '\0';
    return buf;
}

bool utf8_cut_short(const unsigned char *s, size_t n)
{
    size_t need = s[0] >= 0xC2 && s[0] <= 0xDF ? 2 : s[0] >= 0xE0 && s[0] <= 0xEF ? 3
                : s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : 0;
    if (n >= need)
        return false;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80)
            return false;
    return true;
}
