/* fuzz_jobcfg.c — libFuzzer harness for common/jobcfg.c: job files as
 * gradctl submit and the daemon parse them (jobcfg_load_mem), and the
 * daemon's model checks after it (model_check_job).
 * Properties (abort() on violation):
 *   - on failure err is non-empty and starts with the job file's path, and
 *     *out is untouched;
 *   - on success every path is absolute and normalised (no "." or ".."
 *     components, no "//"), the micro-batch is 0 (auto) or at most the
 *     batch, and the name is a terminated, non-empty string;
 *   - jobcfg_load_later (submit --after) fails, if at all, as
 *     jobcfg_load_mem does, and accepts what it accepts with the same
 *     settings; a file it accepts that jobcfg_load_mem refuses names data
 *     that is not there (inputs_missing);
 *   - what the model checks pass names a model gradd has: an mlp with 1..8
 *     hidden sizes, or a gpt or llama whose heads divide its width (and
 *     whose key/value heads divide its heads), with LoRA only on a kind
 *     that offers it and targets that read; what they refuse has err
 *     starting with the job file's path.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobcfg.h"
#include "models/lora.h"
#include "models/model.h"

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "fuzz_jobcfg: property failed at %s:%d: %s\n", __FILE__,   \
                    __LINE__, #cond);                                                    \
            abort();                                                                     \
        }                                                                                \
    } while (0)

static const char *const PATH = "/tmp/fuzz-jobs/job.cfg";

static int normalised(const char *p)
{
    if (!p[0])
        return 1; /* unset */
    if (p[0] != '/' || strstr(p, "//") || strstr(p, "/./") || strstr(p, "/../"))
        return 0;
    size_t n = strlen(p);
    if (n >= 2 && strcmp(p + n - 2, "/.") == 0)
        return 0;
    if (n >= 3 && strcmp(p + n - 3, "/..") == 0)
        return 0;
    return n == 1 || p[n - 1] != '/';
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static job_config j;
    static unsigned char canary[sizeof(job_config)];
    memset(&j, 0xA5, sizeof j);
    memset(canary, 0xA5, sizeof canary);
    char err[1024] = "";
    static job_config later;
    char lerr[1024] = "";
    int lrc = jobcfg_load_later(data, size, PATH, &later, lerr, sizeof lerr);
    if (lrc != 0)
        CHECK(lerr[0] != '\0' && strncmp(lerr, PATH, strlen(PATH)) == 0);
    if (jobcfg_load_mem(data, size, PATH, &j, err, sizeof err) != 0) {
        CHECK(lrc != 0 || later.inputs_missing);
        CHECK(err[0] != '\0');
        CHECK(strncmp(err, PATH, strlen(PATH)) == 0);
        CHECK(memcmp(&j, canary, sizeof j) == 0);
        return 0;
    }
    CHECK(memchr(j.name, '\0', sizeof j.name) != NULL && j.name[0]);
    CHECK(normalised(j.train) && normalised(j.train_labels) && normalised(j.val) && normalised(j.val_labels));
    CHECK(normalised(j.out_dir) && j.out_dir[0] == '/');
    CHECK(j.micro_batch <= j.batch);
    CHECK(lrc == 0 && !later.inputs_missing && strcmp(later.out_dir, j.out_dir) == 0 && later.steps == j.steps);
    /* A finished job's record (no data check) accepts whatever submit did,
     * with the same settings. */
    static job_config r;
    CHECK(jobcfg_load_record(data, size, PATH, &r, err, sizeof err) == 0);
    CHECK(strcmp(r.out_dir, j.out_dir) == 0 && strcmp(r.train, j.train) == 0 && r.steps == j.steps);
    if (model_check_job(&j, err, sizeof err) != 0) {
        CHECK(err[0] != '\0');
        CHECK(strncmp(err, PATH, strlen(PATH)) == 0);
        return 0;
    }
    CHECK(model_kind_of(&j) != NULL);
    if (strcmp(j.model, "mlp") == 0)
        CHECK(j.nhidden >= 1 && j.nhidden <= JOBCFG_MAX_HIDDEN);
    else
        CHECK((strcmp(j.model, "gpt") == 0 || strcmp(j.model, "llama") == 0) && j.heads > 0 &&
              j.width % j.heads == 0 && (!j.kv_heads || j.heads % j.kv_heads == 0));
    /* LoRA passed only where the kind offers it, with targets it has. */
    if (j.ft_method == JOBCFG_FT_LORA) {
        const model_kind *kd = model_kind_of(&j);
        unsigned bits;
        CHECK(kd->lora_targets && lora_parse_targets(kd, j.lora_targets, &bits, err, sizeof err) == 0 && bits);
    }
    return 0;
}
