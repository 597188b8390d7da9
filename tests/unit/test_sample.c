/* test_sample.c — sampling from a trained GPT: a model trained on a
 * repeated string continues it, a seed fixes the text, the checkpoint and
 * the exported model give the same tokens, forward_logits agrees with the
 * training forward, the key/value cache's decode steps agree with
 * forward_logits and give the same text as generating without them, and
 * bad files and options are refused by name. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "pool/dev.h"
#include "fixture.h"
#include "jobcfg.h"
#include "kernels.h"
#include "models/model.h"
#include "pool/pool.h"
#include "io/safetensors.h"
#include "engine/sample.h"
#include "engine/train.h"

static char out_dir[128];

/* Train once for the whole file: a tiny GPT on "abcdefg" over and over (a
 * period prime to the context, so windows start at every phase and the
 * model must read the text rather than count positions). */
static int setup(void **state)
{
    (void)state;
    if (fx_setup("sample", (size_t)1 << 30, NULL) != 0 || fx_write_corpus_repeat("abcdefg", 600) != 0)
        return -1;
    job_config j;
    fx_job(&j, "out");
    fx_gpt(&j, 1, 2, 32, 16);
    j.steps = 60;
    j.batch = 8;
    j.micro_batch = 8;
    j.lr = 1e-2;
    j.threads = 1;
    j.eval_every = 0;
    j.eval_batches = 1;
    snprintf(out_dir, sizeof out_dir, "%s", j.out_dir);
    snprintf(j.name, sizeof j.name, "abc");
    train_result res;
    if (train_run(&j, fx_pool, kern_cpu_ops(), 1, NULL, &res) != TRAIN_DONE) {
        fprintf(stderr, "train_run: %s\n", res.message);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return fx_teardown();
}

static sample_model *load(const char *name)
{
    char path[256], err[1024];
    snprintf(path, sizeof path, "%s/%s", out_dir, name);
    sample_model *m;
    if (sample_load(path, 1, &m, err, sizeof err) != 0)
        fail_msg("%s", err);
    return m;
}

static void gen_with(sample_model *m, const char *prompt, uint32_t n, double temp, uint64_t seed, bool no_cache,
                     sample_output *o)
{
    sample_opts so = {(const uint8_t *)prompt, strlen(prompt), n, temp, seed, 1, no_cache, NULL, NULL, NULL, 0};
    char err[512];
    if (sample_generate(m, &so, o, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(o->n, n);
}

static void gen(sample_model *m, const char *prompt, uint32_t n, double temp, uint64_t seed, sample_output *o)
{
    gen_with(m, prompt, n, temp, seed, false, o);
}

/* A job that is only a GPT's shape: all model_create needs to build one
 * without training it. */
static void gpt_shape(job_config *j, uint32_t layers, uint32_t heads, uint32_t width, uint32_t context,
                      uint32_t vocab)
{
    jobcfg_defaults(j);
    snprintf(j->model, sizeof j->model, "gpt");
    j->layers = layers;
    j->heads = heads;
    j->width = width;
    j->context = context;
    j->vocab = vocab;
}

static void test_continues_the_pattern(void **state)
{
    (void)state;
    sample_model *m = load("model.safetensors");
    assert_int_equal(sample_vocab(m), 256);
    assert_int_equal(sample_context(m), 16);
    assert_int_equal(sample_step(m), 60);
    sample_output o;
    /* Longer than the context: the window slides. */
    gen(m, "abc", 40, 0, 0, &o);
    for (size_t i = 0; i < 40; i++)
        if (o.text[i] != 'a' + (3 + i) % 7)
            fail_msg("token %zu: '%c' after \"abc%.*s\"", i, o.text[i], (int)i, (const char *)o.text);
    sample_output_free(&o);
    sample_free(m);
}

static void test_seed_fixes_the_text(void **state)
{
    (void)state;
    sample_model *m = load("model.safetensors");
    sample_output a, b, c;
    gen(m, "", 64, 1.5, 42, &a);
    gen(m, "", 64, 1.5, 42, &b);
    gen(m, "", 64, 1.5, 43, &c);
    assert_memory_equal(a.ids, b.ids, 64 * sizeof *a.ids);
    assert_memory_equal(a.text, b.text, 64);
    /* A hot temperature and another seed: another text. */
    assert_memory_not_equal(a.ids, c.ids, 64 * sizeof *a.ids);
    sample_output_free(&a);
    sample_output_free(&b);
    sample_output_free(&c);
    sample_free(m);
}

/* The checkpoint keeps the model's own layout, the export GPT-2's: both
 * load to the same parameters, so the same tokens come out. */
static void test_checkpoint_equals_export(void **state)
{
    (void)state;
    sample_model *a = load("model.safetensors"), *b = load("resume.safetensors");
    assert_int_equal(sample_step(b), 60);
    sample_output x, y;
    gen(a, "ab", 48, 1.0, 7, &x);
    gen(b, "ab", 48, 1.0, 7, &y);
    assert_memory_equal(x.ids, y.ids, 48 * sizeof *x.ids);
    sample_output_free(&x);
    sample_output_free(&y);
    sample_free(a);
    sample_free(b);
}

/* forward_logits over t+1 tokens (the packed, shorter layout) gives the
 * logits the training forward scores position t with. */
static void test_forward_logits_matches_forward(void **state)
{
    (void)state;
    job_config j;
    gpt_shape(&j, 2, 2, 16, 8, 256);
    fx_model fm;
    fx_model_open(&fm, &j, 5);
    model *m = fm.m;
    int32_t x[8] = {104, 101, 108, 108, 111, 32, 119, 111}, y[8] = {101, 108, 108, 111, 32, 119, 111, 114};
    model_batch b = {.x = x, .y = y, .n = 1};
    double loss = m->ops->forward(m, &b, NULL), sum = 0;
    float logits[256];
    for (uint32_t t = 0; t < 8; t++) {
        assert_int_equal(m->ops->forward_logits(m, x, 1, t + 1, logits), 0);
        sum += fx_token_loss(logits, 256, y[t]);
    }
    assert_true(fabs(sum - loss) < 1e-4 * fabs(loss));
    /* Out of range: refused, not read past the buffers. */
    assert_int_equal(m->ops->forward_logits(m, x, 1, 9, logits), -1);
    assert_int_equal(m->ops->forward_logits(m, x, 2, 4, logits), -1);
    fx_model_close(&fm);
}

/* A GPT on the CPU with its activations for n sequences and its decode
 * cache for as many, in one buffer as sample.c lays them out. */
typedef struct {
    const kern_ops *k;
    kern_ctx *kc;
    model *m;
    void *mem;
} small_gpt;

static void small_gpt_make(small_gpt *s, const kern_ops *k, uint32_t layers, uint32_t heads, uint32_t width,
                           uint32_t context, uint32_t vocab, jobcfg_precision prec, uint32_t n)
{
    job_config j;
    gpt_shape(&j, layers, heads, width, context, vocab);
    j.precision = prec;
    s->k = k;
    s->kc = k->ctx_create(1, 0, KERN_FP32, NULL);
    char err[256];
    assert_int_equal(model_create(&j, 0, 0, k, s->kc, &s->m, err, sizeof err), 0);
    size_t fixed, per, cache = s->m->ops->decode_bytes(s->m, n);
    s->m->ops->activation_bytes(s->m, &fixed, &per);
    size_t acts = (fixed + per * n + 63) / 64 * 64;
    assert_int_equal(posix_memalign(&s->mem, 64, acts + cache), 0);
    s->m->ops->bind_activations(s->m, s->mem, n);
    s->m->params = malloc(s->m->num_params * sizeof(float));
    s->m->ops->init_params(s->m, s->m->params, 5);
    assert_int_equal(s->m->ops->decode_start(s->m, (char *)s->mem + acts, n), 0);
}

static void small_gpt_free(small_gpt *s)
{
    free(s->m->params);
    model_destroy(s->m);
    free(s->mem);
    s->k->ctx_destroy(s->kc);
}

/* max_v |got - want| <= 1e-5 · max_v |want|: relative to the row's scale,
 * as logits near zero have no relative precision of their own. */
static void assert_logits_close(const float *got, const float *want, size_t V, uint32_t pos)
{
    double mx = 0, err = 0;
    for (size_t v = 0; v < V; v++) {
        mx = fmax(mx, fabs(want[v]));
        err = fmax(err, fabs((double)got[v] - want[v]));
    }
    if (!(err <= 1e-5 * mx))
        fail_msg("position %u: decode_step's logits differ from forward_logits' by %.3g (scale %.3g)", pos, err, mx);
}

/* decode_step at every position gives forward_logits' logits for the same
 * prefix: on n = 2 sequences at once, with a context past the 64-row
 * blocks of the full attention and a head size of 8 (heads 3); once with
 * GPT-2's initialisation (nearly uniform attention) and once with all
 * weights three times larger (sharper attention; measured 7e-7 at most.
 * At ten times, the network itself amplifies fp32 rounding to 2e-5).
 * forward_logits runs between the steps, so this also shows that a
 * forward leaves the cache alone. */
static void test_decode_matches_forward_logits(void **state)
{
    (void)state;
    enum { T = 70, V = 50, N = 2 };
    for (int sharp = 0; sharp <= 1; sharp++) {
        small_gpt s;
        small_gpt_make(&s, kern_cpu_ops(), 2, 3, 24, T, V, JOBCFG_FP32, N);
        model *m = s.m;
        if (sharp)
            for (size_t i = 0; i < m->num_params; i++)
                m->params[i] *= 3;
        int32_t x[N][T], packed[N * T];
        for (int b = 0; b < N; b++)
            for (int t = 0; t < T; t++)
                x[b][t] = (int32_t)(model_rand_u64(11, (uint64_t)b * T + t) % V);
        float got[N * V], want[N * V];
        for (uint32_t pos = 0; pos < T; pos++) {
            int32_t tok[N] = {x[0][pos], x[1][pos]};
            assert_int_equal(m->ops->decode_step(m, tok, pos, got), 0);
            for (int b = 0; b < N; b++)
                memcpy(packed + (size_t)b * (pos + 1), x[b], (pos + 1) * sizeof(int32_t));
            assert_int_equal(m->ops->forward_logits(m, packed, N, pos + 1, want), 0);
            for (int b = 0; b < N; b++)
                assert_logits_close(got + b * V, want + b * V, V, pos);
        }
        /* Past the context, and a gap in the cache: refused. */
        int32_t tok[N] = {1, 2};
        assert_int_equal(m->ops->decode_step(m, tok, T, got), -1);
        /* Rewinding: position 3 again with other tokens, then 4, is what a
         * forward over the changed prefix gives. */
        int32_t alt[N] = {7, 8};
        assert_int_equal(m->ops->decode_step(m, alt, 3, got), 0);
        assert_int_equal(m->ops->decode_step(m, tok, 5, got), -1);
        x[0][3] = alt[0], x[1][3] = alt[1], x[0][4] = tok[0], x[1][4] = tok[1];
        assert_int_equal(m->ops->decode_step(m, tok, 4, got), 0);
        for (int b = 0; b < N; b++)
            memcpy(packed + (size_t)b * 5, x[b], 5 * sizeof(int32_t));
        assert_int_equal(m->ops->forward_logits(m, packed, N, 5, want), 0);
        for (int b = 0; b < N; b++)
            assert_logits_close(got + b * V, want + b * V, V, 4);
        /* More sequences than the activations are bound for: refused, and
         * nothing is left bound to decode with. */
        assert_int_equal(m->ops->decode_start(m, (char *)s.mem, N + 1), -1);
        assert_int_equal(m->ops->decode_step(m, tok, 0, got), -1);
        small_gpt_free(&s);
    }
}

/* A model in the 16-bit activation mode has no fp32 scratch to decode
 * with: decode_start refuses it.  The cpu backend never picks that mode
 * (act16_native is false), so a copy of its table that claims to. */
static void test_decode_refuses_lp16(void **state)
{
    (void)state;
    kern_ops k16 = *kern_cpu_ops();
    k16.act16_native = true;
    job_config j;
    gpt_shape(&j, 1, 2, 8, 4, 16);
    j.precision = JOBCFG_BF16;
    model *m;
    char err[256];
    assert_int_equal(model_create(&j, 0, 0, &k16, NULL, &m, err, sizeof err), 0);
    size_t fixed, per, cache = m->ops->decode_bytes(m, 1);
    m->ops->activation_bytes(m, &fixed, &per);
    void *mem;
    assert_int_equal(posix_memalign(&mem, 64, fixed + per + cache), 0);
    m->ops->bind_activations(m, mem, 1);
    assert_int_equal(m->ops->decode_start(m, (char *)mem + fixed + per, 1), -1);
    float logits[16];
    int32_t tok = 1;
    assert_int_equal(m->ops->decode_step(m, &tok, 0, logits), -1);
    model_destroy(m);
    free(mem);
}

/* With the cache and without it, the same tokens: greedy and at a hot
 * temperature, from a prompt inside the context and 40 tokens on (the
 * window slides after 16: decode steps, then forward_logits), and from a
 * prompt longer than the context (no decode step at all). */
static void test_cache_gives_the_same_text(void **state)
{
    (void)state;
    sample_model *m = load("model.safetensors");
    static const char *const prompts[] = {"", "ab", "gabcdefgabcdefgabcd"};
    for (size_t p = 0; p < sizeof prompts / sizeof prompts[0]; p++)
        for (int hot = 0; hot <= 1; hot++) {
            sample_output a, b;
            gen_with(m, prompts[p], 40, hot ? 1.5 : 0, 99 + p, false, &a);
            gen_with(m, prompts[p], 40, hot ? 1.5 : 0, 99 + p, true, &b);
            assert_memory_equal(a.ids, b.ids, 40 * sizeof *a.ids);
            sample_output_free(&a);
            sample_output_free(&b);
        }
    sample_free(m);
}

/* A file of `floats` zeros under "params" with the given metadata. */
static void write_file(const char *path, const char *format, const char *key, const char *sig, size_t floats)
{
    st_writer *w = st_writer_new();
    float *z = calloc(floats ? floats : 1, sizeof *z);
    uint64_t shape[1] = {floats};
    char err[256];
    st_writer_add(w, "params", ST_F32, 1, shape, z, floats * sizeof *z, err, sizeof err);
    if (format)
        st_writer_meta(w, "format", format, err, sizeof err);
    if (key)
        st_writer_meta(w, key, sig, err, sizeof err);
    if (st_write_atomic(w, path, err, sizeof err) != 0)
        fail_msg("%s", err);
    st_writer_free(w);
    free(z);
}

static void expect_load_error(const char *path, const char *want)
{
    sample_model *m = (sample_model *)1;
    char err[1024];
    assert_int_equal(sample_load(path, 1, &m, err, sizeof err), -1);
    assert_null(m);
    if (!strstr(err, want))
        fail_msg("error '%s' does not contain '%s'", err, want);
}

static void test_bad_files(void **state)
{
    (void)state;
    char path[256];
    snprintf(path, sizeof path, "%s/bad.safetensors", fx_dir);
    write_file(path, "pt", NULL, NULL, 4);
    expect_load_error(path, "bad.safetensors: no 'gradd_model' metadata");
    write_file(path, "pt", "gradd_model", "mlp inputs=784 hidden=512 classes=10", 4);
    expect_load_error(path, "metadata gradd_model: an mlp");
    write_file(path, "pt", "gradd_model", "gpt layers=1 heads=3 width=32 context=16 vocab=256", 4);
    expect_load_error(path, "describes no model");
    /* The shape says one thing, the tensors another. */
    write_file(path, "pt", "gradd_model", "gpt layers=1 heads=2 width=32 context=16 vocab=256", 4);
    expect_load_error(path, "'wte.weight'");
    write_file(path, "gradd-resume-1", "model", "gpt layers=1 heads=2 width=32 context=16 vocab=256", 4);
    expect_load_error(path, "'params'");
    /* A position table of more rows than the context (an import trained
     * at a shorter one): the parameter count says it was read; fewer rows
     * than the context, or trailing words, are no gpt line. */
    write_file(path, "gradd-resume-1", "model", "gpt layers=1 heads=2 width=32 context=16 vocab=256 positions=64",
               4);
    expect_load_error(path, "expected F32 [23008]"); /* wte 8192 + wpe 64·32 + a block 12704 + lnf 64 */
    write_file(path, "gradd-resume-1", "model", "gpt layers=1 heads=2 width=32 context=16 vocab=256 positions=8", 4);
    expect_load_error(path, "describes no model");
    write_file(path, "gradd-resume-1", "model", "gpt layers=1 heads=2 width=32 context=16 vocab=256positions=64",
               4);
    expect_load_error(path, "is not a gpt model line");
    expect_load_error("/nonexistent/model.safetensors", "/nonexistent/model.safetensors");
    /* Weights that match in shape but not in sense: one NaN (found by
     * fuzz_sample; sampling ran the kernels on it). */
    {
        const char *sig = "gpt layers=1 heads=1 width=4 context=4 vocab=4";
        size_t P = 4 * 4 + 4 * 4 + (12 * 16 + 13 * 4) + 2 * 4;
        float *v = calloc(P, sizeof *v);
        v[7] = NAN;
        st_writer *w = st_writer_new();
        uint64_t shape[1] = {P};
        char werr[256];
        st_writer_add(w, "params", ST_F32, 1, shape, v, P * sizeof *v, werr, sizeof werr);
        st_writer_meta(w, "format", "gradd-resume-1", werr, sizeof werr);
        st_writer_meta(w, "model", sig, werr, sizeof werr);
        if (st_write_atomic(w, path, werr, sizeof werr) != 0)
            fail_msg("%s", werr);
        st_writer_free(w);
        free(v);
        expect_load_error(path, "1 of its 284 parameters are not finite");
    }
    /* A small file whose metadata line asks for a huge context × vocabulary:
     * refused before the activations are allocated. */
    {
        size_t P = (1u << 20) + (1u << 16) + (12 + 13) + 2;
        write_file(path, "gradd-resume-1", "model", "gpt layers=1 heads=1 width=1 context=65536 vocab=1048576", P);
        expect_load_error(path, "MiB allowed");
    }

    char dir[256], err[512], picked[512];
    snprintf(dir, sizeof dir, "%s/empty", fx_dir);
    mkdir(dir, 0700);
    assert_int_equal(sample_pick_file(dir, picked, sizeof picked, err, sizeof err), -1);
    assert_non_null(strstr(err, "has no model.safetensors"));
    assert_int_equal(sample_pick_file(out_dir, picked, sizeof picked, err, sizeof err), 0);
    assert_non_null(strstr(picked, "/model.safetensors"));
    /* A FIFO in its place is named and refused, not opened for a writer
     * that never comes, nor passed over for the other file. */
    char fifo[700], want[800];
    snprintf(fifo, sizeof fifo, "%s/model.safetensors", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(sample_pick_file(dir, picked, sizeof picked, err, sizeof err), -1);
    snprintf(want, sizeof want, "%s: not a regular file (a FIFO)", fifo);
    assert_string_equal(err, want);
    unlink(fifo);
}

/* sample_opts.stop: go on for three tokens, then stop. */
static const char *stop_on_fourth(void *user)
{
    int *calls = user;
    return ++*calls > 3 ? "enough" : NULL;
}

/* A model over other tokens than bytes: ids, no text, and no prompt. */
static void test_other_vocab(void **state)
{
    (void)state;
    job_config j;
    gpt_shape(&j, 1, 1, 8, 4, 300);
    model *shape;
    char err[512];
    assert_int_equal(model_create(&j, 0, 0, kern_cpu_ops(), NULL, &shape, err, sizeof err), 0);
    char path[256];
    snprintf(path, sizeof path, "%s/v300.safetensors", fx_dir);
    write_file(path, "gradd-resume-1", "model", "gpt layers=1 heads=1 width=8 context=4 vocab=300", shape->num_params);
    model_destroy(shape);
    sample_model *m;
    assert_int_equal(sample_load(path, 1, &m, err, sizeof err), 0);
    assert_int_equal(sample_vocab(m), 300);
    sample_opts so = {(const uint8_t *)"hi", 2, 5, 0.8, 1, 1, false, NULL, NULL, NULL, 0};
    sample_output o;
    assert_int_equal(sample_generate(m, &so, &o, err, sizeof err), -1);
    assert_non_null(strstr(err, "prompt: the model's vocabulary has 300 tokens"));
    so.prompt_len = 0;
    assert_int_equal(sample_generate(m, &so, &o, err, sizeof err), 0);
    assert_int_equal(o.n, 5);
    assert_null(o.text);
    for (size_t i = 0; i < o.n; i++)
        assert_true(o.ids[i] < 300);
    sample_output_free(&o);
    so.tokens = 0;
    assert_int_equal(sample_generate(m, &so, &o, err, sizeof err), -1);
    assert_non_null(strstr(err, "tokens: 0 is not between 1 and"));
    so.tokens = 3;
    so.temperature = -1;
    assert_int_equal(sample_generate(m, &so, &o, err, sizeof err), -1);
    assert_non_null(strstr(err, "temperature: -1"));
    /* A stop (the daemon's time limit, a client gone) ends it between
     * tokens, saying why and after how many; nothing is left to free. */
    int calls = 0;
    so.temperature = 0.8;
    so.tokens = 5;
    so.stop = stop_on_fourth;
    so.stop_user = &calls;
    assert_int_equal(sample_generate(m, &so, &o, err, sizeof err), -1);
    assert_string_equal(err, "stopped after 3 of 5 tokens: enough");
    assert_int_equal(calls, 4);
    assert_null(o.ids);
    assert_int_equal(o.n, 0);
    sample_free(m);
}

static void test_signature(void **state)
{
    (void)state;
    job_config j;
    char err[256];
    jobcfg_defaults(&j);
    assert_int_equal(model_parse_line("gpt layers=4 heads=4 width=128 context=128 vocab=256", &j, err, sizeof err), 0);
    assert_string_equal(j.model, "gpt");
    assert_int_equal(j.layers * 1000 + j.heads * 100 + j.width + j.context + j.vocab, 4000 + 400 + 128 + 128 + 256);
    assert_int_equal(model_parse_line("gpt layers=4 heads=4 width=128 context=128 vocab=256 extra", &j, err,
                                      sizeof err),
                     -1);
    assert_int_equal(model_parse_line("gpt layers=4", &j, err, sizeof err), -1);
    assert_non_null(strstr(err, "is not a gpt model line"));
    assert_int_equal(model_parse_line("mlp inputs=784 hidden=64 classes=10", &j, err, sizeof err), -1);
    assert_non_null(strstr(err, "an mlp ('mlp inputs=784 hidden=64 classes=10'); only gpt or llama models generate text"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_continues_the_pattern),
        cmocka_unit_test(test_seed_fixes_the_text),
        cmocka_unit_test(test_checkpoint_equals_export),
        cmocka_unit_test(test_forward_logits_matches_forward),
        cmocka_unit_test(test_decode_matches_forward_logits),
        cmocka_unit_test(test_decode_refuses_lp16),
        cmocka_unit_test(test_cache_gives_the_same_text),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_other_vocab),
        cmocka_unit_test(test_signature),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
