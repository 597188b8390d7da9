/* bench_train.c — gradd's CPU training step time, through the real engine.
 *
 * For each configuration a job file is written to a temporary directory,
 * loaded with jobcfg_load (so it is validated exactly like `gradd run`'s),
 * and trained by train_run on a simulated cpu device with the pool gradd
 * itself would create (config_defaults + config_pool_for).  An on_step hook
 * records the wall time at the end of every optimizer step; the step time
 * is the interval between consecutive hooks, i.e. everything one step of
 * the training loop costs: data staging, zeroing the gradients, forward,
 * backward, the global gradient norm and clip, AdamW over every tensor,
 * and the engine's per-step bookkeeping (metrics line, TensorBoard scalars,
 * pool statistics).  The final checkpoint and model export come after the
 * last hook and are not timed; validation is off (no val file, val_fraction
 * 0) and checkpoints are written only at the end.
 *
 * The figure is the median over --steps steps after --warmup steps.  The
 * engine's own step time (train_step's dt, recovered from units_per_s; it
 * leaves out the metrics/TensorBoard bookkeeping) is printed alongside.
 *
 * Configurations (issue 4):
 *   gpt_tiny   L=2 C=64  H=4 T=64  B=4 V=256
 *   gpt_small  L=6 C=384 H=6 T=256 B=8 V=256
 *   llama_small L=6 C=384 H=6 KVH=2 F=1024 T=256 B=8 V=256, RoPE theta
 *              10000, RMSNorm eps 1e-5, SwiGLU, tied embeddings, no biases
 *   mlp        784-512-256-10, ReLU, batch 128 (Fashion-MNIST, as etc/jobs/fashion-mlp.cfg)
 * All fp32, AdamW (decay on matrices only), grad clip 1.0, micro-batch = batch.
 *
 * Output: one JSON object per configuration on stdout,
 *   {"bench":"train_gpt_tiny","metric":"step_ms","value":…,"unit":"ms","impl":"gradd",
 *    "threads":2,"warmup":…,"steps":…,"engine_ms":…,"min_ms":…,"max_ms":…,
 *    "final_loss":…,"blas_core":"SkylakeX"}
 * without a peer: bench/train/run.sh runs peer_torch.py in the same run and
 * joins the two into the bench/ convention's lines.  Progress on stderr.
 *
 * Usage: bench_train [--threads N] [--only gpt_tiny,gpt_small,llama_small,mlp]
 *                    [--warmup W] [--steps K] [--corpus PATH]
 *                    [--mnist-images PATH --mnist-labels PATH] [--profile]
 * --profile wraps every op of the cpu kern_ops table in a timer and prints,
 * per configuration, the wall time per step spent in each op (and in each
 * GEMM shape) to stderr; the step figures then include the timers' cost.
 * --warmup/--steps override every configuration's defaults.  --corpus is the
 * GPT's text (default /usr/share/games/fortunes, or random bytes when that is
 * missing); the MLP falls back to random images when Fashion-MNIST is missing.
 * It starts as gradd does (procenv_settle: OpenMP's spin, OpenBLAS's
 * kernels); "blas_core" names the OpenBLAS kernels it ran.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/config.h"
#include "base/procenv.h"
#include "pool/dev.h"
#include "jobcfg.h"
#include "kernels.h"
#include "pool/pool.h"
#include "engine/train.h"

#define DEFAULT_CORPUS "/usr/share/games/fortunes"
#define DEFAULT_IMAGES "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
#define DEFAULT_LABELS "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz"

typedef enum { CFG_GPT, CFG_LLAMA, CFG_MLP } cfg_kind;

typedef struct {
    const char *name; /* bench name without "train_" */
    cfg_kind kind;
    unsigned L, C, H, T, V; /* gpt, llama */
    unsigned KVH, F;        /* llama */
    const char *hidden;     /* mlp */
    unsigned batch;
    unsigned warmup, steps; /* defaults */
} bench_cfg;

static const bench_cfg configs[] = {
    {"gpt_tiny", CFG_GPT, 2, 64, 4, 64, 256, 0, 0, NULL, 4, 20, 200},
    {"gpt_small", CFG_GPT, 6, 384, 6, 256, 256, 0, 0, NULL, 8, 3, 15},
    {"llama_small", CFG_LLAMA, 6, 384, 6, 256, 256, 2, 1024, NULL, 8, 3, 15},
    {"mlp", CFG_MLP, 0, 0, 0, 0, 0, 0, 0, "512,256", 128, 20, 300},
};
#define NCONFIGS (sizeof configs / sizeof configs[0])

typedef struct {
    double *t;   /* wall time at the end of each step (index step-1) */
    double *eng; /* engine's own step time */
    uint64_t n, cap;
    double units; /* per step */
    uint64_t first, last; /* measured steps (1-based): profile snapshots */
} recorder;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- --profile: per-op wall time through a wrapped kern_ops table --------------------
 * The cpu table copied with every op wrapped by a timer: the same kernels,
 * called by the same engine; only the clock reads are added.  GEMMs are
 * also broken down by shape (N, C, OC), which tells the layers apart. */

enum {
    OP_ZERO, OP_H2D, OP_D2H, OP_SCALE, OP_ENC_F, OP_ENC_B, OP_LN_F, OP_LN_B, OP_MM_F, OP_MM_B, OP_ATT_F, OP_ATT_B,
    OP_GELU_F, OP_GELU_B, OP_RELU_F, OP_RELU_B, OP_RESID, OP_ACC, OP_CE_F, OP_CE_B, OP_SUMSQ, OP_ADAMW,
    OP_RMS_F, OP_RMS_B, OP_ROPE_F, OP_ROPE_B, OP_SWIGLU_F, OP_SWIGLU_B, OP_GQA_F, OP_GQA_B, NOPS
};
static const char *const op_names[NOPS] = {
    "zero", "copy_h2d", "copy_d2h", "scale", "encoder_fwd", "encoder_bwd", "layernorm_fwd", "layernorm_bwd",
    "matmul_fwd", "matmul_bwd", "attention_fwd", "attention_bwd", "gelu_fwd", "gelu_bwd", "relu_fwd",
    "relu_bwd", "residual_fwd", "accumulate", "crossent_fwd", "crossent_bwd", "sumsq", "adamw",
    "rmsnorm_fwd", "rmsnorm_bwd", "rope_fwd", "rope_bwd", "swiglu_fwd", "swiglu_bwd", "gqa_fwd", "gqa_bwd"};

#define MAX_SHAPES 32
typedef struct {
    int fwd, N, C, OC;
    double s;
    uint64_t calls;
} shape_stat;

static struct {
    bool on;
    const kern_ops *base;
    double s[NOPS];
    uint64_t calls[NOPS];
    shape_stat shapes[MAX_SHAPES];
    int nshapes;
    /* snapshots at the first and the last measured step */
    double s0[NOPS], s1[NOPS];
    shape_stat sh0[MAX_SHAPES], sh1[MAX_SHAPES];
    double t_first, t_last;
} prof;

static void prof_shape(int fwd, int N, int C, int OC, double dt)
{
    for (int i = 0; i < prof.nshapes; i++) {
        shape_stat *x = &prof.shapes[i];
        if (x->fwd == fwd && x->N == N && x->C == C && x->OC == OC) {
            x->s += dt;
            x->calls++;
            return;
        }
    }
    if (prof.nshapes < MAX_SHAPES)
        prof.shapes[prof.nshapes++] = (shape_stat){fwd, N, C, OC, dt, 1};
}

#define TIMED(op, call)                          \
    do {                                         \
        double t0_ = now_s();                    \
        call;                                    \
        prof.s[op] += now_s() - t0_;             \
        prof.calls[op]++;                        \
    } while (0)

static void w_zero(kern_ctx *k, float *p, size_t n) { TIMED(OP_ZERO, prof.base->zero(k, p, n)); }
static void w_h2d(kern_ctx *k, void *d, const void *s, size_t b) { TIMED(OP_H2D, prof.base->copy_h2d(k, d, s, b)); }
static void w_d2h(kern_ctx *k, void *d, const void *s, size_t b) { TIMED(OP_D2H, prof.base->copy_d2h(k, d, s, b)); }
static void w_scale(kern_ctx *k, float *p, size_t n, float f) { TIMED(OP_SCALE, prof.base->scale(k, p, n, f)); }
static void w_enc_f(kern_ctx *k, float *out, const int32_t *inp, const float *wte, const float *wpe, int B, int T,
                    int C)
{
    TIMED(OP_ENC_F, prof.base->encoder_forward(k, out, inp, wte, wpe, B, T, C));
}
static void w_enc_b(kern_ctx *k, float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B, int T,
                    int C)
{
    TIMED(OP_ENC_B, prof.base->encoder_backward(k, dwte, dwpe, dout, inp, B, T, C));
}
static void w_ln_f(kern_ctx *k, float *out, float *mean, float *rstd, const float *inp, const float *w,
                   const float *b, int N, int C)
{
    TIMED(OP_LN_F, prof.base->layernorm_forward(k, out, mean, rstd, inp, w, b, N, C));
}
static void w_ln_b(kern_ctx *k, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                   const float *w, const float *mean, const float *rstd, int N, int C)
{
    TIMED(OP_LN_B, prof.base->layernorm_backward(k, dinp, dw, db, dout, inp, w, mean, rstd, N, C));
}
static void w_mm_f(kern_ctx *k, float *out, const float *inp, const float *w, const float *b, int N, int C, int OC)
{
    double t0 = now_s();
    prof.base->matmul_forward(k, out, inp, w, b, N, C, OC);
    double dt = now_s() - t0;
    prof.s[OP_MM_F] += dt;
    prof.calls[OP_MM_F]++;
    prof_shape(1, N, C, OC, dt);
}
static void w_mm_b(kern_ctx *k, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                   const float *w, int N, int C, int OC)
{
    double t0 = now_s();
    prof.base->matmul_backward(k, dinp, dw, db, dout, inp, w, N, C, OC);
    double dt = now_s() - t0;
    prof.s[OP_MM_B] += dt;
    prof.calls[OP_MM_B]++;
    prof_shape(0, N, C, OC, dt);
}
static void w_att_f(kern_ctx *k, float *out, float *pre, float *att, const float *inp, int B, int T, int C, int NH)
{
    TIMED(OP_ATT_F, prof.base->attention_forward(k, out, pre, att, inp, B, T, C, NH));
}
static void w_att_b(kern_ctx *k, float *dinp, float *dpre, float *datt, const float *dout, const float *inp,
                    const float *att, int B, int T, int C, int NH)
{
    TIMED(OP_ATT_B, prof.base->attention_backward(k, dinp, dpre, datt, dout, inp, att, B, T, C, NH));
}
static void w_gelu_f(kern_ctx *k, float *out, const float *inp, size_t N)
{
    TIMED(OP_GELU_F, prof.base->gelu_forward(k, out, inp, N));
}
static void w_gelu_b(kern_ctx *k, float *dinp, const float *inp, const float *dout, size_t N)
{
    TIMED(OP_GELU_B, prof.base->gelu_backward(k, dinp, inp, dout, N));
}
static void w_relu_f(kern_ctx *k, float *out, const float *inp, size_t N)
{
    TIMED(OP_RELU_F, prof.base->relu_forward(k, out, inp, N));
}
static void w_relu_b(kern_ctx *k, float *dinp, const float *inp, const float *dout, size_t N)
{
    TIMED(OP_RELU_B, prof.base->relu_backward(k, dinp, inp, dout, N));
}
static void w_resid(kern_ctx *k, float *out, const float *a, const float *b, size_t N)
{
    TIMED(OP_RESID, prof.base->residual_forward(k, out, a, b, N));
}
static void w_acc(kern_ctx *k, float *d, const float *s, size_t N) { TIMED(OP_ACC, prof.base->accumulate(k, d, s, N)); }
static void w_ce_f(kern_ctx *k, float *losses, float *lse, const float *logits, const int32_t *t, int N, int V,
                   int Vp)
{
    TIMED(OP_CE_F, prof.base->crossentropy_forward(k, losses, lse, logits, t, N, V, Vp));
}
static void w_ce_b(kern_ctx *k, float *dlogits, const float *logits, const float *lse, const int32_t *t,
                   const float *dloss, int N, int V, int Vp)
{
    TIMED(OP_CE_B, prof.base->crossentropy_backward(k, dlogits, logits, lse, t, dloss, N, V, Vp));
}
static void w_sumsq(kern_ctx *k, double *out, const float *g, size_t n) { TIMED(OP_SUMSQ, prof.base->sumsq(k, out, g, n)); }
static void w_adamw(kern_ctx *k, float *p, uint16_t *p16, const float *g, float *m, float *v,
                    const kern_segment *segs, int nsegs, float lr, float b1, float b2, float eps, float wd, float gs,
                    int t)
{
    TIMED(OP_ADAMW, prof.base->adamw_multi(k, p, p16, g, m, v, segs, nsegs, lr, b1, b2, eps, wd, gs, t));
}
static void w_rms_f(kern_ctx *k, float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps)
{
    TIMED(OP_RMS_F, prof.base->rmsnorm_forward(k, out, rstd, inp, w, N, C, eps));
}
static void w_rms_b(kern_ctx *k, float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                    const float *rstd, int N, int C)
{
    TIMED(OP_RMS_B, prof.base->rmsnorm_backward(k, dinp, dw, dout, inp, w, rstd, N, C));
}
static void w_rope_f(kern_ctx *k, float *x, const float *inv, const int32_t *pos, int N, int T, int NHR, int HS,
                     int stride)
{
    TIMED(OP_ROPE_F, prof.base->rope_forward(k, x, inv, pos, N, T, NHR, HS, stride));
}
static void w_rope_b(kern_ctx *k, float *dx, const float *inv, const int32_t *pos, int N, int T, int NHR, int HS,
                     int stride)
{
    TIMED(OP_ROPE_B, prof.base->rope_backward(k, dx, inv, pos, N, T, NHR, HS, stride));
}
static void w_swiglu_f(kern_ctx *k, float *out, const float *gu, int N, int F)
{
    TIMED(OP_SWIGLU_F, prof.base->swiglu_forward(k, out, gu, N, F));
}
static void w_swiglu_b(kern_ctx *k, float *dgu, const float *gu, const float *dout, int N, int F)
{
    TIMED(OP_SWIGLU_B, prof.base->swiglu_backward(k, dgu, gu, dout, N, F));
}
static void w_gqa_f(kern_ctx *k, float *out, float *lse, const float *qkv, const int32_t *start, int B, int T, int NH,
                    int KVH, int HS)
{
    TIMED(OP_GQA_F, prof.base->attention_gqa_forward(k, out, lse, qkv, start, B, T, NH, KVH, HS));
}
static void w_gqa_b(kern_ctx *k, float *dqkv, const float *dout, const float *out, const float *lse, const float *qkv,
                    const int32_t *start, int B, int T, int NH, int KVH, int HS)
{
    TIMED(OP_GQA_B, prof.base->attention_gqa_backward(k, dqkv, dout, out, lse, qkv, start, B, T, NH, KVH, HS));
}

static const kern_ops *profiled_ops(const kern_ops *base)
{
    static kern_ops o;
    o = *base;
    prof.base = base;
    o.zero = w_zero;
    o.copy_h2d = w_h2d;
    o.copy_d2h = w_d2h;
    o.scale = w_scale;
    o.encoder_forward = w_enc_f;
    o.encoder_backward = w_enc_b;
    o.layernorm_forward = w_ln_f;
    o.layernorm_backward = w_ln_b;
    o.matmul_forward = w_mm_f;
    o.matmul_backward = w_mm_b;
    o.attention_forward = w_att_f;
    o.attention_backward = w_att_b;
    o.gelu_forward = w_gelu_f;
    o.gelu_backward = w_gelu_b;
    o.relu_forward = w_relu_f;
    o.relu_backward = w_relu_b;
    o.residual_forward = w_resid;
    o.accumulate = w_acc;
    o.crossentropy_forward = w_ce_f;
    o.crossentropy_backward = w_ce_b;
    o.sumsq = w_sumsq;
    o.adamw_multi = w_adamw;
    o.rmsnorm_forward = w_rms_f;
    o.rmsnorm_backward = w_rms_b;
    o.rope_forward = w_rope_f;
    o.rope_backward = w_rope_b;
    o.swiglu_forward = w_swiglu_f;
    o.swiglu_backward = w_swiglu_b;
    o.attention_gqa_forward = w_gqa_f;
    o.attention_gqa_backward = w_gqa_b;
    return &o;
}

static void prof_snapshot(double *s, shape_stat *sh)
{
    memcpy(s, prof.s, sizeof prof.s);
    memcpy(sh, prof.shapes, sizeof prof.shapes);
}

static void prof_report(const char *name, unsigned steps, FILE *f)
{
    double wall = (prof.t_last - prof.t_first) * 1e3 / steps, sum = 0;
    fprintf(f, "profile %s: per step over %u steps, wall %.3f ms\n", name, steps, wall);
    for (int i = 0; i < NOPS; i++) {
        double ms = (prof.s1[i] - prof.s0[i]) * 1e3 / steps;
        sum += ms;
        if (ms > 0.0005)
            fprintf(f, "  %-16s %10.3f ms %6.1f%%\n", op_names[i], ms, 100 * ms / wall);
    }
    fprintf(f, "  %-16s %10.3f ms %6.1f%%\n", "(outside ops)", wall - sum, 100 * (wall - sum) / wall);
    for (int i = 0; i < prof.nshapes; i++) {
        const shape_stat *a = &prof.sh1[i], *b = &prof.sh0[i];
        double ms = (a->s - (i < MAX_SHAPES && b->calls ? b->s : 0)) * 1e3 / steps;
        double flop = (a->fwd ? 2.0 : 4.0) * a->N * a->C * a->OC;
        uint64_t calls = a->calls - (b->calls ? b->calls : 0);
        double per = calls ? ms / ((double)calls / steps) : 0;
        fprintf(f, "    matmul_%s N=%-5d C=%-5d OC=%-5d %9.3f ms %6.1f%%  %6.1f GFLOP/s\n", a->fwd ? "fwd" : "bwd",
                a->N, a->C, a->OC, ms, 100 * ms / wall, per > 0 ? flop / (per * 1e-3) / 1e9 : 0);
    }
}

static void on_step(void *user, const train_progress *p)
{
    recorder *r = user;
    double t = now_s();
    if (r->n < r->cap) {
        r->t[r->n] = t;
        r->eng[r->n] = p->units_per_s > 0 ? r->units / p->units_per_s : 0;
        r->n++;
    }
    if (prof.on && p->step == r->first) {
        prof_snapshot(prof.s0, prof.sh0);
        prof.t_first = t;
    }
    if (prof.on && p->step == r->last) {
        prof_snapshot(prof.s1, prof.sh1);
        prof.t_last = t;
    }
}


static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fputs(text, f);
    return fclose(f);
}

/* A file of random bytes (a stand-in corpus) or random IDX images/labels. */
static int write_random(const char *path, size_t n, uint64_t seed)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    uint64_t x = seed | 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        fputc((int)(x >> 24) & 0xff, f);
    }
    return fclose(f);
}

static void be32(unsigned char *b, uint32_t v)
{
    b[0] = (unsigned char)(v >> 24);
    b[1] = (unsigned char)(v >> 16);
    b[2] = (unsigned char)(v >> 8);
    b[3] = (unsigned char)v;
}

static int write_idx(const char *images, const char *labels, uint32_t n)
{
    unsigned char h[16];
    FILE *f = fopen(images, "wb");
    if (!f)
        return -1;
    be32(h, 0x803);
    be32(h + 4, n);
    be32(h + 8, 28);
    be32(h + 12, 28);
    fwrite(h, 1, 16, f);
    uint64_t x = 12345;
    for (size_t i = 0; i < (size_t)n * 784; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        fputc((int)(x >> 56), f);
    }
    if (fclose(f) != 0)
        return -1;
    f = fopen(labels, "wb");
    if (!f)
        return -1;
    be32(h, 0x801);
    be32(h + 4, n);
    fwrite(h, 1, 8, f);
    for (uint32_t i = 0; i < n; i++)
        fputc((int)(i % 10), f);
    return fclose(f);
}

static void rm_rf(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_train: could not remove %s\n", dir);
}

static bool in_list(const char *list, const char *name)
{
    if (!list)
        return true;
    size_t n = strlen(name);
    for (const char *s = list; *s;) {
        size_t len = strcspn(s, ",");
        if (len == n && strncmp(s, name, n) == 0)
            return true;
        s += len;
        if (*s == ',')
            s++;
    }
    return false;
}

static int run_one(const bench_cfg *c, pool *p, const kern_ops *k, const char *tmp, unsigned threads,
                   unsigned warmup, unsigned steps, const char *corpus, const char *images, const char *labels)
{
    char cfg_path[4200], out_dir[4200], text[16384];
    snprintf(cfg_path, sizeof cfg_path, "%s/%s.cfg", tmp, c->name);
    snprintf(out_dir, sizeof out_dir, "%s/out-%s", tmp, c->name);
    unsigned total = warmup + steps + 1; /* +1: the first interval needs a step before it */
    int len = snprintf(text, sizeof text, "[job]\nname = bench-%s\ndevice = cpu\n[model]\n", c->name);
    if (c->kind == CFG_GPT)
        len += snprintf(text + len, sizeof text - len,
                        "type = gpt\nlayers = %u\nheads = %u\nwidth = %u\ncontext = %u\nvocab = %u\n"
                        "[data]\nformat = text\ntrain = %s\nval_fraction = 0\n",
                        c->L, c->H, c->C, c->T, c->V, corpus);
    else if (c->kind == CFG_LLAMA)
        len += snprintf(text + len, sizeof text - len,
                        "type = llama\nlayers = %u\nheads = %u\nkv_heads = %u\nwidth = %u\nmlp_width = %u\n"
                        "context = %u\nvocab = %u\nrope_theta = 10000\nnorm_eps = 1e-5\ntie_embeddings = on\n"
                        "[data]\nformat = text\ntrain = %s\nval_fraction = 0\n",
                        c->L, c->H, c->KVH, c->C, c->F, c->T, c->V, corpus);
    else
        len += snprintf(text + len, sizeof text - len,
                        "type = mlp\nhidden = %s\n[data]\nformat = idx\ntrain = %s\ntrain_labels = %s\n"
                        "val_fraction = 0\n",
                        c->hidden, images, labels);
    snprintf(text + len, sizeof text - len,
             "[train]\nsteps = %u\nbatch = %u\nmicro_batch = %u\nlr = 3e-4\nmin_lr = 3e-5\nwarmup = 0\n"
             "weight_decay = 0.1\ngrad_clip = 1.0\nbeta1 = 0.9\nbeta2 = 0.95\neps = 1e-8\nseed = 1337\n"
             "precision = fp32\neval_every = 0\nthreads = %u\n"
             "[output]\ndir = %s\ncheckpoint_every = 0\nlog_every = 1000000\n",
             total, c->batch, c->batch, threads, out_dir);
    if (write_file(cfg_path, text) != 0) {
        fprintf(stderr, "bench_train: cannot write %s: %s\n", cfg_path, strerror(errno));
        return -1;
    }
    static job_config j;
    char err[1024];
    if (jobcfg_load(cfg_path, &j, err, sizeof err) != 0) {
        fprintf(stderr, "bench_train: %s\n", err);
        return -1;
    }
    recorder rec = {calloc(total, sizeof(double)), calloc(total, sizeof(double)), 0, total,
                    (double)c->batch * (c->kind == CFG_MLP ? 1 : c->T), warmup + 1, total};
    memset(prof.s, 0, sizeof prof.s);
    memset(prof.shapes, 0, sizeof prof.shapes);
    prof.nshapes = 0;
    double *iv = calloc(total, sizeof(double)), *ev = calloc(total, sizeof(double));
    if (!rec.t || !rec.eng || !iv || !ev) {
        fprintf(stderr, "bench_train: out of memory\n");
        return -1;
    }
    train_hooks h = {.on_step = on_step, .user = &rec};
    static train_result res;
    train_outcome o = train_run(&j, p, k, 1, &h, &res);
    int rc = 0;
    if (o != TRAIN_DONE) {
        fprintf(stderr, "bench_train: %s: training failed: %s\n", c->name, res.message);
        rc = -1;
    } else if (rec.n != total) {
        fprintf(stderr, "bench_train: %s: %llu steps reported, expected %u\n", c->name, (unsigned long long)rec.n,
                total);
        rc = -1;
    } else {
        size_t n = 0;
        for (uint64_t s = warmup + 1; s < total; s++, n++) {
            iv[n] = (rec.t[s] - rec.t[s - 1]) * 1e3;
            ev[n] = rec.eng[s] * 1e3;
        }
        double med = median(iv, n), lo = iv[0], hi = iv[n - 1], emed = median(ev, n);
        fprintf(stderr, "bench_train: %-10s gradd %9.3f ms/step (engine %9.3f, min %9.3f, max %9.3f), loss %.4f, micro %u\n",
                c->name, med, emed, lo, hi, res.final_loss, res.micro);
        printf("{\"bench\":\"train_%s\",\"metric\":\"step_ms\",\"value\":%.4f,\"unit\":\"ms\",\"impl\":\"gradd\","
               "\"threads\":%u,\"warmup\":%u,\"steps\":%u,\"engine_ms\":%.4f,\"min_ms\":%.4f,\"max_ms\":%.4f,"
               "\"final_loss\":%.6f,\"blas_core\":\"%s\"}\n",
               c->name, med, threads, warmup, steps, emed, lo, hi, res.final_loss, kern_cpu_blas_core());
        fflush(stdout);
        if (prof.on)
            prof_report(c->name, steps, stderr);
    }
    free(rec.t);
    free(rec.eng);
    free(iv);
    free(ev);
    rm_rf(out_dir);
    return rc;
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_train [--threads N] [--only gpt_tiny,gpt_small,llama_small,mlp] [--warmup W] [--steps K]\n"
                    "                   [--corpus PATH] [--mnist-images PATH --mnist-labels PATH] [--profile]\n");
}

int main(int argc, char **argv)
{
    procenv_settle(argv);
    unsigned threads = 2;
    long warmup = -1, steps = -1;
    const char *only = NULL, *corpus = NULL, *images = NULL, *labels = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v && strcmp(a, "--profile") != 0) {
            usage();
            return 2;
        }
        if (strcmp(a, "--threads") == 0)
            threads = (unsigned)strtoul(v, NULL, 10);
        else if (strcmp(a, "--profile") == 0) {
            prof.on = true;
            continue;
        } else if (strcmp(a, "--only") == 0)
            only = v;
        else if (strcmp(a, "--warmup") == 0)
            warmup = strtol(v, NULL, 10);
        else if (strcmp(a, "--steps") == 0)
            steps = strtol(v, NULL, 10);
        else if (strcmp(a, "--corpus") == 0)
            corpus = v;
        else if (strcmp(a, "--mnist-images") == 0)
            images = v;
        else if (strcmp(a, "--mnist-labels") == 0)
            labels = v;
        else {
            usage();
            return 2;
        }
        i++;
    }
    if (threads < 1 || steps == 0 || warmup < -1) {
        usage();
        return 2;
    }

    char tmp[] = "/tmp/bench_train.XXXXXX";
    if (!mkdtemp(tmp)) {
        fprintf(stderr, "bench_train: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    char path_corpus[4200], path_images[4200], path_labels[4200];
    if (!corpus) {
        if (access(DEFAULT_CORPUS, R_OK) == 0) {
            corpus = DEFAULT_CORPUS;
        } else {
            snprintf(path_corpus, sizeof path_corpus, "%s/corpus.txt", tmp);
            if (write_random(path_corpus, 4u << 20, 42) != 0) {
                fprintf(stderr, "bench_train: cannot write %s\n", path_corpus);
                return 1;
            }
            corpus = path_corpus;
        }
    }
    if (!images || !labels) {
        if (access(DEFAULT_IMAGES, R_OK) == 0 && access(DEFAULT_LABELS, R_OK) == 0) {
            images = DEFAULT_IMAGES;
            labels = DEFAULT_LABELS;
        } else {
            snprintf(path_images, sizeof path_images, "%s/images-idx3-ubyte", tmp);
            snprintf(path_labels, sizeof path_labels, "%s/labels-idx1-ubyte", tmp);
            if (write_idx(path_images, path_labels, 10000) != 0) {
                fprintf(stderr, "bench_train: cannot write random images\n");
                return 1;
            }
            images = path_images;
            labels = path_labels;
        }
    }

    /* The device and pool `gradd run` would use (its default configuration). */
    static gradd_config gc;
    config_defaults(&gc);
    dev *d = NULL;
    if (dev_cpu_create(gc.cpu_capacity, 0, &d) != DEV_OK) {
        fprintf(stderr, "bench_train: cannot create the cpu device\n");
        return 1;
    }
    pool_config pc;
    config_pool_for(&gc, d->id, &pc);
    pool *p = NULL;
    if (pool_create(d, &pc, &p) != 0) {
        fprintf(stderr, "bench_train: cannot create the pool\n");
        dev_destroy(d);
        return 1;
    }
    const kern_ops *k = prof.on ? profiled_ops(kern_cpu_ops()) : kern_cpu_ops();

    int rc = 0;
    for (size_t i = 0; i < NCONFIGS; i++) {
        const bench_cfg *c = &configs[i];
        if (!in_list(only, c->name))
            continue;
        unsigned w = warmup >= 0 ? (unsigned)warmup : c->warmup;
        unsigned s = steps > 0 ? (unsigned)steps : c->steps;
        if (run_one(c, p, k, tmp, threads, w, s, corpus, images, labels) != 0)
            rc = 1;
    }
    pool_destroy(p);
    dev_destroy(d);
    rm_rf(tmp);
    return rc;
}
