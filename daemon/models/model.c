/* model.c — model creation, the tensor table, deterministic random numbers. */
#include "model.h"
#include "lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int model_create(const job_config *j, uint32_t input_dim, uint32_t classes, const kern_ops *k, kern_ctx *kc,
                 model **out, char *err, size_t err_len)
{
    model *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    m->k = k;
    m->kc = kc;
    m->kind = model_kind_need(j, err, err_len);
    if (!m->kind || m->kind->create(j, input_dim, classes, m, err, err_len) != 0) {
        lora_destroy(m);
        free(m);
        return -1;
    }
    *out = m;
    return 0;
}

void model_destroy(model *m)
{
    if (!m)
        return;
    if (m->ops && m->ops->destroy)
        m->ops->destroy(m);
    lora_destroy(m);
    free(m);
}

void model_grads_final(model *m, size_t from)
{
    if (m->grads_final && !m->lora && !m->stopped)
        m->grads_final(m->grads_user, from);
}

bool model_poll(model *m)
{
    if (!m->stopped && m->poll && m->poll(m->poll_user) && m->stoppable)
        m->stopped = true;
    return m->stopped;
}

void model_activation_split(size_t one, size_t two, size_t buffers, size_t align, size_t *fixed, size_t *per_sample)
{
    *per_sample = two - one;
    *fixed = buffers * align;
    size_t slack = one > *per_sample ? one - *per_sample : 0;
    if (slack > *fixed)
        *fixed = slack;
}

/* Every token's loss weighted by dloss: the cross-entropy's dloss. */
static void fill_dloss(const model *m, const model_loss *lo, size_t n, float dloss)
{
    for (size_t i = 0; i < n; i++)
        lo->host[i] = dloss;
    m->k->copy_h2d(m->kc, lo->dlosses, lo->host, n * sizeof(float));
}

double model_loss_forward(model *m, const model_loss *lo, const int32_t *y, size_t n)
{
    if (lo->lp16)
        m->k->crossentropy_forward16(m->kc, lo->losses, lo->lse, lo->logits16, y, (int)n, lo->V, lo->V);
    else
        m->k->crossentropy_forward(m->kc, lo->losses, lo->lse, lo->logits, y, (int)n, lo->V, lo->V);
    return model_sum_losses(m, lo->losses, lo->host, n);
}

void model_loss_backward(model *m, const model_loss *lo, const int32_t *y, size_t n, float dloss)
{
    fill_dloss(m, lo, n, dloss);
    if (lo->lp16)
        m->k->crossentropy_backward16(m->kc, lo->logits16, lo->logits16, lo->lse, y, lo->dlosses, (int)n, lo->V,
                                      lo->V);
    else
        m->k->crossentropy_backward(m->kc, lo->logits, lo->logits, lo->lse, y, lo->dlosses, (int)n, lo->V, lo->V);
}

double model_forward_backward(model *m, const model_batch *b, float dloss, const model_loss *lo,
                              void (*body)(model *m, const model_batch *b),
                              void (*back)(model *m, const model_batch *b))
{
    if (!lo->lp16 || !m->k->crossentropy_fused16) {
        double sum = m->ops->forward(m, b, NULL);
        if (!m->stopped)
            m->ops->backward(m, b, dloss);
        return sum;
    }
    size_t n = (size_t)b->n * m->ops->units_per_sample(m);
    body(m, b);
    if (m->stopped)
        return 0;
    fill_dloss(m, lo, n, dloss);
    m->k->crossentropy_fused16(m->kc, lo->losses, lo->logits16, b->y, lo->dlosses, (int)n, lo->V, lo->V);
    back(m, b);
    return model_sum_losses(m, lo->losses, lo->host, n);
}

double model_sum_losses(const model *m, const float *losses, float *host, size_t n)
{
    m->k->copy_d2h(m->kc, host, losses, n * sizeof(float));
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += host[i];
    return sum;
}

bool model_act16_kernels(const kern_ops *k)
{
    const char *env = getenv("GRADD_ACT16");
    return k && k->act16_native && k->matmul_forward16 && k->matmul_forward16_residual && k->matmul_backward16 &&
           k->matmul_forward16_out16 && k->crossentropy_forward16 && k->crossentropy_backward16 &&
           !(env && !strcmp(env, "0"));
}

bool model_act16(const job_config *j, const kern_ops *k)
{
    return j->precision != JOBCFG_FP32 && j->ft_method != JOBCFG_FT_LORA && model_act16_kernels(k);
}

void model_add_tensor(model *m, const char *name, int ndim, const size_t *shape, bool decay, bool transpose_export)
{
    if (m->ntensors == MODEL_MAX_TENSORS)
        return; /* constructors size their tables well below this */
    model_tensor *t = &m->tensors[m->ntensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->numel *= shape[i];
    }
    t->offset = m->num_params;
    t->decay = decay;
    t->transpose_export = transpose_export;
    m->num_params += t->numel;
}

/* splitmix64 of (seed, index): stateless, so any element can be drawn
 * independently and in parallel with the same result. */
uint64_t model_rand_u64(uint64_t seed, uint64_t i)
{
    return kern_mix64(seed * 0x9E3779B97F4A7C15ull + i * 0xD1B54A32D192ED03ull + 0x94D049BB133111EBull);
}

/* Box-Muller over two counter draws. */
float model_rand_normal(uint64_t seed, uint64_t i)
{
    double u1 = ((double)(model_rand_u64(seed, 2 * i) >> 11) + 0.5) * 0x1.0p-53;
    double u2 = (double)(model_rand_u64(seed, 2 * i + 1) >> 11) * 0x1.0p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
