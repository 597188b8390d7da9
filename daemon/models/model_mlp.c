/* model_mlp.c — a multi-layer perceptron classifier: inputs (D) through
 * ReLU hidden layers to class logits (K), softmax cross-entropy.
 *
 * Parameters: layers.i.weight (out,in), layers.i.bias (out), i = 0..nh,
 * the last layer mapping to K classes.  Activations keep each layer's
 * pre-activation and ReLU output; the last pre-activation (the logits) is
 * overwritten by its own gradient in backward.  Below it, backward uses two
 * scratch buffers of the widest hidden layer: one for the gradient of a layer's
 * input, one for the gradient through the ReLU below it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

#define ALIGN 64
#define MLP_MAX_LAYERS (JOBCFG_MAX_HIDDEN + 1)

typedef struct {
    uint32_t D, K, nl;              /* inputs, classes, linear layers */
    uint32_t in[MLP_MAX_LAYERS], out[MLP_MAX_LAYERS];
    size_t w[MLP_MAX_LAYERS], b[MLP_MAX_LAYERS]; /* parameter offsets */
    uint32_t widest;

    uint32_t n;
    float *pre[MLP_MAX_LAYERS];     /* (B,out_i): linear outputs; the last is the logits, dlogits in backward */
    float *act[MLP_MAX_LAYERS];     /* (B,out_i): ReLU outputs of hidden layers */
    float *lse, *losses;            /* (B), (B) */
    float *d1, *d2;                 /* (B,widest hidden layer) backward scratch */
    float *dlosses;                 /* (B) */
    float *host;                    /* host copy of losses and logits, (B) + (B,K) */
    int32_t *pred;
} mlp;

static mlp *M(const model *m) { return (mlp *)m->impl; }

static size_t carve(mlp *g, char *base, uint32_t n)
{
    size_t off = 0;
#define TAKE(ptr, count)                                              \
    do {                                                              \
        if (base)                                                     \
            ptr = (float *)(base + off);                              \
        off += ((count) * sizeof(float) + ALIGN - 1) / ALIGN * ALIGN; \
    } while (0)
    for (uint32_t i = 0; i < g->nl; i++) {
        TAKE(g->pre[i], (size_t)n * g->out[i]);
        if (i + 1 < g->nl)
            TAKE(g->act[i], (size_t)n * g->out[i]);
    }
    TAKE(g->lse, (size_t)n);
    TAKE(g->losses, (size_t)n);
    TAKE(g->d1, (size_t)n * g->widest);
    TAKE(g->d2, (size_t)n * g->widest);
    TAKE(g->dlosses, (size_t)n);
#undef TAKE
    return off;
}

static uint32_t mlp_units(const model *m)
{
    (void)m;
    return 1;
}

static void mlp_activation_bytes(const model *m, size_t *fixed, size_t *per_sample)
{
    mlp *g = M(m);
    size_t one = carve(g, NULL, 1), two = carve(g, NULL, 2);
    *per_sample = two - one;
    *fixed = (2 * MLP_MAX_LAYERS + 5) * ALIGN;
}

static int mlp_bind(model *m, void *mem, uint32_t n)
{
    mlp *g = M(m);
    carve(g, mem, n);
    g->n = n;
    m->max_n = n;
    free(g->host);
    g->host = malloc((size_t)n * (g->K + 1) * sizeof(float));
    return g->host ? 0 : -1;
}

static void mlp_init(const model *m, float *params, uint64_t seed)
{
    const mlp *g = M(m);
    /* He initialisation for ReLU layers: N(0, 2/fan_in); zero biases. */
    for (uint32_t i = 0; i < g->nl; i++) {
        float std = sqrtf(2.0f / (float)g->in[i]);
        size_t nw = (size_t)g->in[i] * g->out[i];
        for (size_t e = 0; e < nw; e++)
            params[g->w[i] + e] = std * model_rand_normal(seed, g->w[i] + e);
        memset(params + g->b[i], 0, g->out[i] * sizeof(float));
    }
}

static double mlp_forward(model *m, const model_batch *b, uint64_t *correct)
{
    mlp *g = M(m);
    const kern_ops *k = m->k;
    kern_ctx *kc = m->kc;
    int B = (int)b->n;
    const float *x = b->x;
    const float *P = m->params;
    for (uint32_t i = 0; i < g->nl; i++) {
        if (model_poll(m))
            return 0;
        k->matmul_forward(kc, g->pre[i], x, P + g->w[i], P + g->b[i], B, (int)g->in[i], (int)g->out[i]);
        if (i + 1 < g->nl) {
            k->relu_forward(kc, g->act[i], g->pre[i], (size_t)B * g->out[i]);
            x = g->act[i];
        }
    }
    const float *logits = g->pre[g->nl - 1];
    k->crossentropy_forward(kc, g->losses, g->lse, logits, b->y, B, (int)g->K, (int)g->K);
    k->copy_d2h(kc, g->host, g->losses, (size_t)B * sizeof(float));
    double sum = 0;
    for (int i = 0; i < B; i++)
        sum += g->host[i];
    if (correct) {
        /* Top-1 from the logits: softmax is monotone, so the same argmax. */
        float *lg = g->host + B;
        k->copy_d2h(kc, lg, logits, (size_t)B * g->K * sizeof(float));
        int32_t *labels = malloc((size_t)B * sizeof *labels);
        uint64_t ok = 0;
        if (labels) {
            k->copy_d2h(kc, labels, b->y, (size_t)B * sizeof *labels);
            for (int i = 0; i < B; i++) {
                uint32_t best = 0;
                for (uint32_t c = 1; c < g->K; c++)
                    if (lg[(size_t)i * g->K + c] > lg[(size_t)i * g->K + best])
                        best = c;
                ok += (int32_t)best == labels[i];
            }
            free(labels);
        }
        *correct = ok;
    }
    return sum;
}

static void mlp_backward(model *m, const model_batch *b, float dloss)
{
    mlp *g = M(m);
    const kern_ops *k = m->k;
    kern_ctx *kc = m->kc;
    int B = (int)b->n;
    const float *P = m->params;
    float *D = m->grads;
    for (int i = 0; i < B; i++)
        g->host[i] = dloss;
    k->copy_h2d(kc, g->dlosses, g->host, (size_t)B * sizeof(float));

    /* dlogits overwrite the logits in place: nothing reads them after this. */
    float *dout = g->pre[g->nl - 1];
    k->crossentropy_backward(kc, dout, dout, g->lse, b->y, g->dlosses, B, (int)g->K, (int)g->K);
    for (int i = (int)g->nl - 1; i >= 0; i--) {
        if (model_poll(m))
            return;
        const float *x = i == 0 ? (const float *)b->x : g->act[i - 1];
        float *dx = NULL;
        if (i > 0)
            dx = g->d2; /* overwritten by matmul_backward */
        k->matmul_backward(kc, dx, D + g->w[i], D + g->b[i], dout, x, P + g->w[i], B, (int)g->in[i],
                           (int)g->out[i]);
        if (i > 0) {
            /* Through the ReLU of layer i-1, into d1: from here on dout
             * is a hidden layer's gradient, too wide for the logits buffer. */
            dout = g->d1;
            k->relu_backward(kc, dout, g->pre[i - 1], dx, (size_t)B * g->in[i]);
        }
    }
}

static void mlp_destroy(model *m)
{
    mlp *g = M(m);
    if (!g)
        return;
    free(g->host);
    free(g);
    m->impl = NULL;
}

static const model_ops mlp_ops = {
    .units_per_sample = mlp_units,
    .activation_bytes = mlp_activation_bytes,
    .bind_activations = mlp_bind,
    .init_params = mlp_init,
    .forward = mlp_forward,
    .backward = mlp_backward,
    .destroy = mlp_destroy,
};

static int mlp_create(const job_config *j, uint32_t input_dim, uint32_t classes, model *m, char *err,
                      size_t err_len)
{
    if (input_dim == 0 || classes < 2) {
        snprintf(err, err_len, "mlp: need inputs and at least 2 classes (got %u inputs, %u classes)", input_dim,
                 classes);
        return -1;
    }
    mlp *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    g->D = input_dim;
    g->K = classes;
    g->nl = (uint32_t)j->nhidden + 1;
    uint32_t prev = input_dim;
    /* The scratch holds gradients of hidden layers only: the logits' is
     * computed in place and the inputs' is never needed. */
    g->widest = 0;
    for (uint32_t i = 0; i < g->nl; i++) {
        g->in[i] = prev;
        g->out[i] = i + 1 < g->nl ? j->hidden[i] : classes;
        prev = g->out[i];
        if (i + 1 < g->nl && g->out[i] > g->widest)
            g->widest = g->out[i];
    }
    m->impl = g;
    m->ops = &mlp_ops;
    char name[64];
    for (uint32_t i = 0; i < g->nl; i++) {
        size_t ws[2] = {g->out[i], g->in[i]}, bs[1] = {g->out[i]};
        snprintf(name, sizeof name, "layers.%u.weight", i);
        g->w[i] = m->num_params;
        model_add_tensor(m, name, 2, ws, true, false);
        snprintf(name, sizeof name, "layers.%u.bias", i);
        g->b[i] = m->num_params;
        model_add_tensor(m, name, 1, bs, false, false);
    }
    return 0;
}

/* ---- the kind ----------------------------------------------------------------------- */

static int mlp_check_job(const job_config *j, char *err, size_t err_len)
{
    /* jobcfg parses hidden for every job and leaves nhidden 0 when the
     * text is not a list of sizes: only this kind has it to complain. */
    if (j->nhidden == 0)
        return model_job_error(j, "model", "hidden",
                               "expected up to 8 comma-separated sizes from 1 to 65536, e.g. 256,128", err, err_len);
    if (j->format == JOBCFG_DATA_TEXT || j->format == JOBCFG_DATA_TOKENS || j->format == JOBCFG_DATA_JSONL)
        return model_job_error(j, "data", "format", "an mlp trains on idx or npy images", err, err_len);
    if (!j->train_labels[0])
        return model_job_error(j, "data", "train_labels", "is required for an mlp", err, err_len);
    if (j->val[0] && !j->val_labels[0])
        return model_job_error(j, "data", "val_labels", "is required for an mlp when val is set", err, err_len);
    return 0;
}

/* From the sizes, not the job's text: "256, 128" is the same model as
 * "256,128" (which is what older checkpoints recorded). */
static void mlp_describe(const model *m, char *buf, size_t len)
{
    const mlp *g = M(m);
    char hidden[MLP_MAX_LAYERS * 12] = "";
    size_t at = 0;
    for (uint32_t i = 0; i + 1 < g->nl && at < sizeof hidden; i++)
        at += (size_t)snprintf(hidden + at, sizeof hidden - at, "%s%u", i ? "," : "", g->out[i]);
    snprintf(buf, len, "mlp inputs=%u hidden=%s classes=%u", g->D, hidden, g->K);
}

const model_kind model_kind_mlp = {
    .name = "mlp",
    .a_name = "an mlp",
    .unit = "samples",
    .units = "samples",
    .data = MODEL_DATA_IMAGES,
    .classifies = true,
    .check_job = mlp_check_job,
    .create = mlp_create,
    .describe = mlp_describe,
};
