/* fuzz_llama_config.c — libFuzzer harness for the llama kind's Hugging Face
 * hooks (daemon/models/model_llama_hf.c): config.json as an import reads it.
 *
 * The input is config.json's text.  Properties (abort() on violation):
 *   - hf_read either fails with "config.json: KEY: why" and leaves the job
 *     as it was, or sets keys from which the model builds (model_create on
 *     the cpu kernels' shapes; no parameters are allocated);
 *   - the built model's own config.json (hf_config), read back, describes
 *     the same model (describe lines equal);
 *   - hf_ignore answers for any tensor name without reading past it (the
 *     input's first 64 bytes as a name). */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "models/model.h"

#define CHECK(cond)                                                                                      \
    do {                                                                                                 \
        if (!(cond)) {                                                                                   \
            fprintf(stderr, "fuzz_llama_config: property failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                                     \
        }                                                                                                \
    } while (0)

static const model_kind *llama(void)
{
    size_t n;
    const model_kind *const *kinds = model_kinds(&n);
    for (size_t i = 0; i < n; i++)
        if (strcmp(kinds[i]->name, "llama") == 0)
            return kinds[i];
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const model_kind *kind = llama();
    json_t *o = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    if (!o)
        return 0;
    static job_config j, before, back;
    char err[512] = "", line[256], again[256];
    jobcfg_defaults(&j);
    snprintf(j.model, sizeof j.model, "llama");
    before = j;
    if (kind->hf_read(o, &j, err, sizeof err) != 0) {
        json_decref(o);
        CHECK(strncmp(err, "config.json: ", 13) == 0 && strlen(err) > 13);
        CHECK(memcmp(&j, &before, sizeof j) == 0);
        return 0;
    }
    json_decref(o);
    model *m = NULL;
    CHECK(model_create(&j, 0, 0, kern_cpu_ops(), NULL, &m, err, sizeof err) == 0);
    model_describe(m, line, sizeof line);
    json_t *out = kind->hf_config(m);
    CHECK(out != NULL);
    back = before;
    CHECK(kind->hf_read(out, &back, err, sizeof err) == 0);
    json_decref(out);
    model *m2 = NULL;
    CHECK(model_create(&back, 0, 0, kern_cpu_ops(), NULL, &m2, err, sizeof err) == 0);
    model_describe(m2, again, sizeof again);
    CHECK(strcmp(line, again) == 0);
    char name[65];
    size_t len = size < 64 ? size : 64;
    memcpy(name, data, len);
    name[len] = '\0';
    (void)kind->hf_ignore(m, name);
    model_destroy(m2);
    model_destroy(m);
    return 0;
}
