/* train_trace.c — helper for test_reference.py: a job trained by gradd's
 * engine, with everything an independent reimplementation needs to redo
 * its optimizer steps.
 *
 *   train_trace JOB.cfg OUTDIR
 *
 * trains JOB.cfg (fp32, on a simulated cpu device, with a fixed
 * micro_batch) through train_run, exactly as `gradd run` does, and writes
 *   OUTDIR/init.safetensors  the parameters before the first step, in the
 *                            layout of the job's model.safetensors (the
 *                            final parameters, which train_run writes)
 *   OUTDIR/trace.json        {"steps": [{"step", "loss", "lr", "grad_norm",
 *                            "micro", "accum"}, ...], "batches": [...]}:
 *                            what train_run reported after every step, and
 *                            the samples of every step (gpt: {"x", "y"}
 *                            token windows; mlp: {"x" pixels, "y" labels})
 *
 * The batches come from the data API, not from the engine: a data_stream
 * over the same data with the job's seed, read `batch` samples per step.
 * That is the order data.h and gradd-job(5) promise training consumes, so
 * an engine that trained on other samples fails the test instead of
 * telling it what to expect.
 *
 * Exit status: 0, or 1 with the reason on stderr.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/data.h"
#include "pool/dev.h"
#include "jobcfg.h"
#include "kernels.h"
#include "models/model.h"
#include "pool/pool.h"
#include "io/safetensors.h"
#include "engine/train.h"

typedef struct {
    train_progress *steps; /* indexed by step - 1 */
    uint64_t nsteps, seen;
} recorder;

static void on_step(void *user, const train_progress *p)
{
    recorder *rec = user;
    /* A resumed run reports its starting point too (step 0 here: the
     * helper always starts fresh, and the test checks every step). */
    if (p->step == 0 || p->step > rec->nsteps)
        return;
    rec->steps[p->step - 1] = *p;
    rec->seen++;
}

/* The parameters the engine starts from: the model's own initialisation
 * from the job's seed (train_run calls the same), laid out as train_run's
 * model.safetensors, so one reader serves both files. */
static int write_init(const job_config *j, uint32_t input_dim, uint32_t classes, const char *path)
{
    char err[1024];
    model *m;
    /* No kernel context: shapes and initialisation need none (the cpu
     * kernels have no fused attention to ask about). */
    if (model_create(j, input_dim, classes, kern_cpu_ops(), NULL, &m, err, sizeof err) != 0) {
        fprintf(stderr, "model_create: %s\n", err);
        return -1;
    }
    float *p = malloc(m->num_params * sizeof(float));
    float *t = malloc(m->num_params * sizeof(float));
    st_writer *w = st_writer_new();
    int rc = -1;
    if (!p || !t || !w) {
        fprintf(stderr, "out of memory\n");
        goto out;
    }
    m->ops->init_params(m, p, j->seed);
    for (int i = 0; i < m->ntensors; i++) {
        const model_tensor *mt = &m->tensors[i];
        uint64_t shape[MODEL_MAX_DIMS];
        const float *src = p + mt->offset;
        for (int d = 0; d < mt->ndim; d++)
            shape[d] = mt->shape[d];
        if (mt->transpose_export && mt->ndim == 2) {
            /* GPT-2's Conv1D layout, (in, out): the transpose of gradd's. */
            float *dst = t + mt->offset;
            for (size_t a = 0; a < mt->shape[0]; a++)
                for (size_t b = 0; b < mt->shape[1]; b++)
                    dst[b * mt->shape[0] + a] = src[a * mt->shape[1] + b];
            shape[0] = mt->shape[1];
            shape[1] = mt->shape[0];
            src = dst;
        }
        if (st_writer_add(w, mt->name, ST_F32, mt->ndim, shape, src, mt->numel * sizeof(float), err, sizeof err) !=
            0) {
            fprintf(stderr, "%s\n", err);
            goto out;
        }
    }
    if (st_write_atomic(w, path, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        goto out;
    }
    rc = 0;
out:
    st_writer_free(w);
    free(t);
    free(p);
    model_destroy(m);
    return rc;
}

static void put_ints(FILE *f, const int32_t *v, size_t n)
{
    fputc('[', f);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s%" PRId32, i ? "," : "", v[i]);
    fputc(']', f);
}

/* %.9g: every float32 comes back exactly. */
static void put_floats(FILE *f, const float *v, size_t n)
{
    fputc('[', f);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s%.9g", i ? "," : "", (double)v[i]);
    fputc(']', f);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s JOB.cfg OUTDIR\n", argv[0]);
        return 2;
    }
    const char *out = argv[2];
    char err[1024], path[4096];
    static job_config j;
    if (jobcfg_load(argv[1], &j, err, sizeof err) != 0 || model_check_job(&j, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    bool tokens = model_kind_of(&j)->data == MODEL_DATA_TOKENS;
    /* What makes the trace complete: every step's samples are the stream's
     * next `batch` (a held-out tail would shorten the training data, which
     * this helper does not redo), the split is the configured one, and the
     * arithmetic is fp32. */
    if (j.precision != JOBCFG_FP32 || !j.micro_batch || (!j.val[0] && j.val_fraction > 0) ||
        (tokens && j.format != JOBCFG_DATA_TEXT)) {
        fprintf(stderr, "%s: needs precision = fp32, a fixed micro_batch, val_fraction = 0 or a val file, and "
                        "text data for token models\n", argv[1]);
        return 1;
    }

    /* The training data, loaded as train.c's load_data does. */
    data_tokens tok = {0};
    data_images img = {0};
    uint32_t input_dim = 0, classes = 0;
    if (tokens) {
        if (data_tokens_load(&tok, j.train, DATA_FMT_TEXT, j.vocab, NULL, err, sizeof err) != 0) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
    } else {
        if (data_images_load(&img, j.train, j.train_labels, 0, j.subset, NULL, err, sizeof err) != 0) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        input_dim = (uint32_t)img.dim;
        classes = img.classes;
    }
    snprintf(path, sizeof path, "%s/init.safetensors", out);
    if (write_init(&j, input_dim, classes, path) != 0)
        return 1;

    /* The run, on a device of its own. */
    dev *d;
    pool *p;
    pool_config pc;
    pool_config_default(&pc);
    if (dev_cpu_create((size_t)1 << 30, 0, &d) != DEV_OK || pool_create(d, &pc, &p) != 0) {
        fprintf(stderr, "cannot create the cpu device and its pool\n");
        return 1;
    }
    recorder rec = {calloc(j.steps, sizeof(train_progress)), j.steps, 0};
    train_hooks h = {.on_step = on_step, .user = &rec};
    train_result res;
    if (!rec.steps) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    if (train_run(&j, p, kern_cpu_ops(), 1, &h, &res) != TRAIN_DONE) {
        fprintf(stderr, "train_run: %s\n", res.message);
        return 1;
    }
    pool_destroy(p);
    dev_destroy(d);
    if (rec.seen != j.steps) {
        fprintf(stderr, "train_run reported %" PRIu64 " steps of %" PRIu64 "\n", rec.seen, j.steps);
        return 1;
    }

    snprintf(path, sizeof path, "%s/trace.json", out);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return 1;
    }
    fprintf(f, "{\"steps\": [");
    for (uint64_t s = 0; s < j.steps; s++) {
        const train_progress *pr = &rec.steps[s];
        fprintf(f, "%s\n {\"step\": %" PRIu64 ", \"loss\": %.17g, \"lr\": %.17g, \"grad_norm\": %.17g, "
                   "\"micro\": %u, \"accum\": %u}",
                s ? "," : "", pr->step, pr->loss, pr->lr, pr->grad_norm, pr->micro, pr->accum);
    }
    fprintf(f, "],\n\"batches\": [");
    /* The stream train_run read from, from the start again. */
    data_stream ds;
    int rc = tokens ? data_stream_tokens(&ds, &tok, j.context, j.seed, NULL, err, sizeof err)
                    : data_stream_images(&ds, &img, j.seed, NULL, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    size_t B = j.batch, xn = tokens ? B * j.context : B * input_dim;
    size_t yn = tokens ? B * j.context : B;
    void *x = malloc(xn * sizeof(float)); /* int32 or float: both 4 bytes */
    int32_t *y = malloc(yn * sizeof(int32_t));
    if (!x || !y) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (uint64_t s = 0; s < j.steps; s++) {
        fprintf(f, "%s\n {\"x\": ", s ? "," : "");
        if (tokens) {
            data_stream_next_tokens(&ds, B, x, y);
            put_ints(f, x, xn);
        } else {
            data_stream_next_images(&ds, B, x, y);
            put_floats(f, x, xn);
        }
        fprintf(f, ", \"y\": ");
        put_ints(f, y, yn);
        fputc('}', f);
    }
    fprintf(f, "]}\n");
    free(x);
    free(y);
    data_stream_free(&ds);
    data_tokens_free(&tok);
    data_images_free(&img);
    free(rec.steps);
    if (fclose(f) != 0) {
        perror(path);
        return 1;
    }
    return 0;
}
