/* fuzz_sample.c — libFuzzer harness for daemon/engine/sample.c: the model files
 * `gradctl sample` reads.
 *
 * The input is a whole file (model.safetensors or resume.safetensors, as a
 * job's output directory holds), written to a memfd and loaded through
 * /proc/self/fd/N with sample_load.  Properties (abort() on violation):
 *   - on failure the model pointer stays NULL and err starts with the path;
 *   - on success the model reports a vocabulary and context within the
 *     limits model_parse_line enforces, and generating two tokens
 *     from it yields two ids below its vocabulary (byte text for vocab 256),
 *     both with the key/value cache (decode steps) and without it
 *     (forward_logits over the window, which the cache otherwise leaves
 *     unused until the context is full).  Not that both give the same ids:
 *     crafted weights can amplify the paths' different rounding into a
 *     different draw;
 *   - the metadata line parser, fed the first line of the input too, either
 *     fails with a message or returns dimensions inside its limits.
 * A file's metadata can describe any model: the loader must refuse shapes
 * the file does not hold before it allocates anything their size (the
 * harness runs under ASan, whose allocator aborts on absurd requests).
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/sample.h"
#include "models/model.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz_sample: property failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static int memfd = -1;
static char path[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (memfd < 0) {
        memfd = memfd_create("fuzz_sample", 0);
        CHECK(memfd >= 0);
        snprintf(path, sizeof path, "/proc/self/fd/%d", memfd);
    }
    CHECK(ftruncate(memfd, 0) == 0);
    CHECK(lseek(memfd, 0, SEEK_SET) == 0);
    for (size_t off = 0; off < size;) {
        ssize_t n = write(memfd, data + off, size - off);
        CHECK(n > 0);
        off += (size_t)n;
    }

    /* The metadata line parser alone, on the input's first line. */
    char line[256];
    size_t len = 0;
    while (len < size && len < sizeof line - 1 && data[len] != '\n' && data[len] != '\0')
        len++;
    memcpy(line, data, len);
    line[len] = '\0';
    static job_config jc;
    char err[1024] = "";
    jobcfg_defaults(&jc);
    if (model_parse_line(line, &jc, err, sizeof err) == 0)
        CHECK(jc.layers >= 1 && jc.layers <= 1000 && jc.heads >= 1 && jc.width % jc.heads == 0 &&
              jc.width <= (1u << 16) && jc.context >= 1 && jc.context <= (1u << 16) && jc.vocab >= 2 &&
              jc.vocab <= (1u << 20) && (jc.positions == 0 || jc.positions > jc.context));
    else
        CHECK(err[0] != '\0');

    sample_model *m = NULL;
    err[0] = '\0';
    if (sample_load(path, 1, &m, err, sizeof err) != 0) {
        CHECK(m == NULL);
        CHECK(strncmp(err, path, strlen(path)) == 0);
        return 0;
    }
    CHECK(m != NULL);
    uint32_t vocab = sample_vocab(m), ctx = sample_context(m);
    CHECK(vocab >= 2 && vocab <= (1u << 20) && ctx >= 1 && ctx <= (1u << 16));
    for (int no_cache = 0; no_cache <= 1; no_cache++) {
        sample_opts o = {.prompt = NULL, .prompt_len = 0, .tokens = 2, .temperature = 1.0, .seed = 7, .threads = 1,
                         .no_cache = no_cache};
        sample_output out;
        memset(&out, 0, sizeof out);
        if (sample_generate(m, &o, &out, err, sizeof err) == 0) {
            CHECK(out.n == 2);
            for (size_t i = 0; i < out.n; i++)
                CHECK(out.ids[i] < vocab);
            CHECK((vocab == 256) == (out.text != NULL));
            sample_output_free(&out);
        }
    }
    sample_free(m);
    return 0;
}
