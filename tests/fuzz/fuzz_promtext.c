/* fuzz_promtext.c — libFuzzer harness for client/promtext.c, the reader
 * of the daemon's Prometheus text that `gradctl --json metrics` uses.
 *
 * The input (a NUL-terminated copy) is read as exposition text.
 * Properties (abort() on violation):
 *   - the result is {"metrics": [...]}, each entry an object with a string
 *     name, an object of string labels, a number or null value, and string
 *     type and help;
 *   - jansson writes the document (every string in it is valid UTF-8).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jout.h"
#include "promtext.h"

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "fuzz_promtext: property failed at %s:%d: %s\n", __FILE__, \
                    __LINE__, #cond);                                                    \
            abort();                                                                     \
        }                                                                                \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    json_t *doc = promtext_json(text);
    free(text);
    json_t *list = json_object_get(doc, "metrics");
    CHECK(json_is_array(list));
    size_t i;
    json_t *m;
    json_array_foreach(list, i, m) {
        CHECK(json_is_string(json_object_get(m, "name")));
        CHECK(json_string_length(json_object_get(m, "name")) > 0);
        json_t *labels = json_object_get(m, "labels");
        CHECK(json_is_object(labels));
        const char *k;
        json_t *v;
        json_object_foreach(labels, k, v) CHECK(json_is_string(v));
        json_t *value = json_object_get(m, "value");
        CHECK(json_is_number(value) || json_is_null(value));
        CHECK(json_is_string(json_object_get(m, "type")));
        CHECK(json_is_string(json_object_get(m, "help")));
    }
    char *out = json_dumps(doc, JSON_COMPACT);
    CHECK(out != NULL);
    free(out);
    json_decref(doc);
    return 0;
}
