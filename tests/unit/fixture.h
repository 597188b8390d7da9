/* fixture.h — what the engine's unit tests (test_train, test_batch,
 * test_sample) set up alike: a temporary directory holding a small text
 * corpus, a simulated cpu device with a memory pool on it, and job
 * configurations over them.
 *
 * One fixture per test process (cmocka group setup / teardown), so its
 * state is three globals that the tests read directly.
 */
#ifndef GRADD_TEST_FIXTURE_H
#define GRADD_TEST_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "pool/dev.h"
#include "jobcfg.h"
#include "models/model.h"
#include "pool/pool.h"
#include "engine/train.h"

extern char fx_dir[64]; /* /tmp/gradd-TAG-XXXXXX */
extern dev *fx_dev;     /* the simulated cpu device */
extern pool *fx_pool;   /* and the pool on it */

/* Make fx_dir (/tmp/gradd-TAG-XXXXXX), a simulated cpu device of `capacity`
 * bytes and a pool on it configured with `pc` (NULL: the pool's defaults).
 * 0, or -1 on any failure: a cmocka group setup's return. */
int fx_setup(const char *tag, size_t capacity, const pool_config *pc);
/* Destroy the pool and the device, remove fx_dir and all in it.  0 or -1,
 * for a cmocka group teardown. */
int fx_teardown(void);

/* fx_dir/corpus.txt: 400 lines of pangrams numbered 0..16, about 33 KB —
 * enough windows for a tiny GPT's batches and a held-out tenth. */
int fx_write_corpus(void);
/* fx_dir/corpus.txt: `text` written `times` times over. */
int fx_write_corpus_repeat(const char *text, int times);

/* A job writing to fx_dir/OUT, named OUT: the defaults, then a tenth of the
 * data held out for validation and 2 warmup steps.  The model and the rest
 * are the caller's. */
void fx_job(job_config *j, const char *out);
/* Make j a byte-level GPT of that shape over fx_dir/corpus.txt. */
void fx_gpt(job_config *j, uint32_t layers, uint32_t heads, uint32_t width, uint32_t context);

/* The tensor NAME (f32) of DIR/resume.safetensors, malloc'd, with its
 * element count in *n; a cmocka failure when there is none. */
float *fx_read_resume(const char *dir, const char *name, size_t *n);
/* The metadata value KEY of DIR/resume.safetensors into buf[len]; a cmocka
 * failure when there is none.  Returns buf. */
const char *fx_resume_meta(const char *dir, const char *key, char *buf, size_t len);

/* Rewrite DIR/resume.safetensors with the metadata KEY set to VALUE, or
 * without it when VALUE is NULL (as a checkpoint written before the engine
 * kept it would be); a cmocka failure when there is no such key (the test
 * would prove nothing) or the file cannot be rewritten. */
void fx_resume_set_meta(const char *dir, const char *key, const char *value);
/* Overwrite element I of the f32 tensor NAME of DIR/resume.safetensors in
 * place, as a damaged file would hold it. */
void fx_resume_poke(const char *dir, const char *name, size_t i, float v);

/* The largest per-tensor relative difference ||a - b|| / ||b|| between the
 * tensors of DIR_A/model.safetensors and DIR_B/model.safetensors, which must
 * hold the same tensors (a cmocka failure otherwise); the tensor's name into
 * which[which_len] when which is not NULL. */
double fx_worst_tensor_diff(const char *dir_a, const char *dir_b, char *which, size_t which_len);

/* Train hooks for a run that is stopped and resumed: fx_record (on_step)
 * keeps each step's loss and whether the run resumed; fx_stop_now
 * (should_stop) asks to stop once stop_after steps are done (0: never). */
typedef struct {
    uint64_t stop_after, seen;
    bool resumed;
    double losses[64];
} fx_stopper;
void fx_record(void *user, const train_progress *pr);
bool fx_stop_now(void *user);

/* A model of job j on the cpu kernels in fp32, its activations bound for
 * one sequence and its parameters initialised from seed, for tests that
 * call a model directly; fx_model_close frees all of it. */
typedef struct {
    model *m;
    kern_ctx *kc;
    void *acts;
} fx_model;
void fx_model_open(fx_model *fm, const job_config *j, uint64_t seed);
void fx_model_close(fx_model *fm);
/* A token's loss from its position's V logits, in double: -log softmax[target]. */
double fx_token_loss(const float *logits, int V, int32_t target);

#endif
