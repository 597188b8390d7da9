/* fuzz_argsplit.c — libFuzzer harness for common/argsplit.c.
 *
 * The input (NUL-terminated copy, cut at its first NUL) is split.
 * Properties (abort() on violation):
 *   - a failure explains itself, and a too-small output buffer fails
 *     rather than writes past it (each buffer its own allocation, so ASan
 *     sees the bound);
 *   - the words fit in strlen(input) + 1 bytes, as argsplit.h promises;
 *   - quoting each word again (single quotes, ' as '\'') and joining them
 *     with spaces splits back to exactly the same words.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "argsplit.h"

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "fuzz_argsplit: property failed at %s:%d: %s\n", __FILE__, \
                    __LINE__, #cond);                                                    \
            abort();                                                                     \
        }                                                                                \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *in = malloc(size + 1);
    CHECK(in != NULL);
    memcpy(in, data, size);
    in[size] = '\0';
    size_t len = strlen(in);
    char *out = malloc(len + 1);
    CHECK(out != NULL);
    char why[128] = "";
    int n = argsplit(in, out, len + 1, why, sizeof why);
    if (n < 0) {
        CHECK(why[0] != '\0');
    } else {
        /* A buffer one byte short, when there is output at all, fails. */
        if (len > 0) {
            char *small = malloc(len);
            CHECK(small != NULL);
            CHECK(argsplit(in, small, len, why, sizeof why) == -1);
            free(small);
        }
        /* Re-quote and split again. */
        size_t qcap = 4 * len + 3 * (size_t)n + 1, q = 0;
        char *quoted = malloc(qcap);
        CHECK(quoted != NULL);
        const char *w = out;
        for (int i = 0; i < n; i++, w = argsplit_next(w)) {
            CHECK((size_t)(w - out) <= len);
            quoted[q++] = '\'';
            for (const char *c = w; *c; c++) {
                if (*c == '\'') {
                    memcpy(quoted + q, "'\\''", 4);
                    q += 4;
                } else {
                    quoted[q++] = *c;
                }
            }
            quoted[q++] = '\'';
            quoted[q++] = ' ';
        }
        quoted[q] = '\0';
        CHECK(q < qcap);
        char *again = malloc(q + 1);
        CHECK(again != NULL);
        CHECK(argsplit(quoted, again, q + 1, why, sizeof why) == n);
        const char *a = out, *b = again;
        for (int i = 0; i < n; i++, a = argsplit_next(a), b = argsplit_next(b))
            CHECK(strcmp(a, b) == 0);
        free(again);
        free(quoted);
    }
    free(out);
    free(in);
    return 0;
}
