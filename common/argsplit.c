/* argsplit.c — shell-like quoting of a command line into words. */
#include "argsplit.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static bool is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

int argsplit(const char *s, char *out, size_t out_len, char *why, size_t why_len)
{
    size_t n = 0; /* bytes written to out */
    int words = 0;
    const char *p = s;
    /* Each input byte yields at most one output byte, and each word's NUL
     * stands for the blank or the end after it: strlen(s) + 1 is enough. */
    if (out_len < strlen(s) + 1) {
        snprintf(why, why_len, "no room for the words of a %zu-byte line", strlen(s));
        return -1;
    }
    for (;;) {
        while (is_blank(*p))
            p++;
        if (!*p)
            break;
        for (; *p && !is_blank(*p); p++) {
            if (*p == '\\') {
                if (!p[1]) {
                    snprintf(why, why_len, "ends with a backslash (column %zu)", (size_t)(p - s) + 1);
                    return -1;
                }
                out[n++] = *++p;
            } else if (*p == '\'') {
                const char *end = strchr(p + 1, '\'');
                if (!end) {
                    snprintf(why, why_len, "unterminated single quote starting at column %zu", (size_t)(p - s) + 1);
                    return -1;
                }
                memcpy(out + n, p + 1, (size_t)(end - p - 1));
                n += (size_t)(end - p - 1);
                p = end;
            } else if (*p == '"') {
                const char *start = p++;
                for (; *p && *p != '"'; p++) {
                    if (*p == '\\' && (p[1] == '"' || p[1] == '\\' || p[1] == '$'))
                        p++;
                    out[n++] = *p;
                }
                if (!*p) {
                    snprintf(why, why_len, "unterminated double quote starting at column %zu",
                             (size_t)(start - s) + 1);
                    return -1;
                }
            } else {
                out[n++] = *p;
            }
        }
        out[n++] = '\0';
        words++;
    }
    return words;
}

const char *argsplit_next(const char *word)
{
    return word + strlen(word) + 1;
}
