/* fuzz_hf.c — libFuzzer harness for daemon/io/hf.c's JSON readers and the
 * model kinds' config.json conversion (model_kind.hf_read).
 *
 * The first byte picks the reader, the rest is the file:
 *   even: config.json (hf_config_parse), then every kind with an hf_read
 *         converts it into a default job's [model] keys;
 *   odd:  model.safetensors.index.json (hf_index_parse).
 * Properties (abort() on violation):
 *   - a failed parse leaves *out NULL (config) or empty (index), and its
 *     message starts with the path;
 *   - a parsed config is a JSON object; a kind that accepts it leaves
 *     [model] keys that jobcfg's ranges allow (layers 1..JOBCFG_MAX_LAYERS,
 *     heads >= 1 dividing width, vocab 2..JOBCFG_MAX_VOCAB, context >= 2),
 *     and one that refuses it says "config.json: KEY: why";
 *   - a parsed index has, for every entry, a non-empty tensor name and a
 *     shard name that is a plain file name (no '/', not "." or ".."), and no
 *     tensor twice.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/hf.h"
#include "models/model.h"

#define CHECK(cond)                                                                                 \
    do {                                                                                            \
        if (!(cond)) {                                                                              \
            fprintf(stderr, "fuzz_hf: property failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                                \
        }                                                                                           \
    } while (0)

static void config(const char *text, size_t len)
{
    json_t *cfg = (json_t *)1;
    char err[512];
    if (hf_config_parse(text, len, "D/config.json", &cfg, err, sizeof err) != 0) {
        CHECK(cfg == (json_t *)1 || cfg == NULL);
        CHECK(strncmp(err, "D/config.json", 13) == 0);
        return;
    }
    CHECK(json_is_object(cfg));
    size_t n;
    const model_kind *const *kinds = model_kinds(&n);
    for (size_t i = 0; i < n; i++) {
        if (!kinds[i]->hf_read)
            continue;
        static job_config j;
        jobcfg_defaults(&j);
        if (kinds[i]->hf_read(cfg, &j, err, sizeof err) != 0) {
            CHECK(strncmp(err, "config.json: ", 13) == 0);
            continue;
        }
        CHECK(j.layers >= 1 && j.layers <= JOBCFG_MAX_LAYERS);
        CHECK(j.heads >= 1 && j.width % j.heads == 0);
        CHECK(j.vocab >= 2 && j.vocab <= JOBCFG_MAX_VOCAB);
        CHECK(j.context >= 2 && j.positions >= j.context);
        CHECK(model_kind_hf(kinds[i]->hf_type) == kinds[i]);
    }
    json_decref(cfg);
}

static void index_file(const char *text, size_t len)
{
    hf_index ix;
    char err[512];
    if (hf_index_parse(text, len, "D/model.safetensors.index.json", &ix, err, sizeof err) != 0) {
        CHECK(ix.n == 0 && ix.tensor == NULL && ix.shard == NULL);
        CHECK(strncmp(err, "D/model.safetensors.index.json", 30) == 0);
        return;
    }
    for (size_t i = 0; i < ix.n; i++) {
        CHECK(ix.tensor[i][0] != '\0');
        CHECK(ix.shard[i][0] != '\0' && !strchr(ix.shard[i], '/'));
        CHECK(strcmp(ix.shard[i], ".") && strcmp(ix.shard[i], ".."));
        for (size_t k = 0; k < i; k++)
            CHECK(strcmp(ix.tensor[i], ix.tensor[k]) != 0);
    }
    hf_index_free(&ix);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const char *text = (const char *)data + 1;
    if (data[0] & 1)
        index_file(text, size - 1);
    else
        config(text, size - 1);
    return 0;
}
