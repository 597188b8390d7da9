/* test_model_llama.c — the llama kind apart from its numbers (which
 * tests/python/test_llama_ref.py checks): its tensor table, the describe
 * line and its parse, job-file checks (and the other kinds refusing its
 * keys), and its Hugging Face hooks: config.json in and out, errors that
 * name the key, and the tensors an import may skip. */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "jobcfg.h"
#include "kernels.h"
#include "models/model.h"

static const model_kind *llama_kind(void)
{
    size_t n;
    const model_kind *const *kinds = model_kinds(&n);
    for (size_t i = 0; i < n; i++)
        if (strcmp(kinds[i]->name, "llama") == 0)
            return kinds[i];
    fail_msg("no llama kind");
    return NULL;
}

/* The job file's text, parsed and checked as `gradd run` does: 0, or -1
 * with err. */
static int load(const char *text, job_config *j, char *err, size_t err_len)
{
    if (jobcfg_load_record(text, strlen(text), "/tmp/job.cfg", j, err, err_len) != 0)
        return -1;
    return model_check_job(j, err, err_len);
}

#define HEAD "[model]\ntype = llama\nlayers = 2\nheads = 4\nwidth = 64\ncontext = 16\nvocab = 300\n"
#define TAIL "[data]\ntrain = corpus.txt\n[output]\ndir = out\n"

static model *create(const job_config *j)
{
    model *m;
    char err[256];
    if (model_create(j, 0, 0, kern_cpu_ops(), NULL, &m, err, sizeof err) != 0)
        fail_msg("model_create: %s", err);
    return m;
}

static const model_tensor *tensor(const model *m, const char *name)
{
    for (int i = 0; i < m->ntensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0)
            return &m->tensors[i];
    return NULL;
}

/* ---- tensors --------------------------------------------------------------------------- */

static void test_tensors(void **state)
{
    (void)state;
    static job_config j;
    char err[256];
    assert_int_equal(load(HEAD "kv_heads = 2\nmlp_width = 96\n" TAIL, &j, err, sizeof err), 0);
    model *m = create(&j);
    assert_int_equal(m->ntensors, 1 + 2 * 9 + 2);
    const model_tensor *q = tensor(m, "model.layers.1.self_attn.q_proj.weight"),
                       *k = tensor(m, "model.layers.1.self_attn.k_proj.weight"),
                       *v = tensor(m, "model.layers.1.self_attn.v_proj.weight"),
                       *g = tensor(m, "model.layers.1.mlp.gate_proj.weight"),
                       *u = tensor(m, "model.layers.1.mlp.up_proj.weight"), *h = tensor(m, "lm_head.weight");
    assert_non_null(q), assert_non_null(k), assert_non_null(v), assert_non_null(g), assert_non_null(u);
    assert_non_null(h);
    /* (out,in) like nn.Linear, q,k,v and gate,up adjacent: one GEMM each */
    assert_int_equal(q->shape[0], 64), assert_int_equal(q->shape[1], 64);
    assert_int_equal(k->shape[0], 32), assert_int_equal(v->shape[0], 32);
    assert_int_equal(k->offset, q->offset + q->numel);
    assert_int_equal(v->offset, k->offset + k->numel);
    assert_int_equal(g->shape[0], 96), assert_int_equal(g->shape[1], 64);
    assert_int_equal(u->offset, g->offset + g->numel);
    assert_true(q->decay && !tensor(m, "model.norm.weight")->decay);
    assert_false(q->transpose_export);
    size_t P = m->num_params;
    model_destroy(m);

    /* tied: no head of its own */
    assert_int_equal(load(HEAD "kv_heads = 2\nmlp_width = 96\ntie_embeddings = on\n" TAIL, &j, err, sizeof err), 0);
    m = create(&j);
    assert_null(tensor(m, "lm_head.weight"));
    assert_int_equal(m->num_params, P - 300 * 64);
    model_destroy(m);

    /* mlp_width 0: 8/3 of the width up to a multiple of 256 */
    assert_int_equal(load("[model]\ntype = llama\nlayers = 1\nheads = 32\nkv_heads = 8\nwidth = 4096\n"
                          "context = 16\nvocab = 300\n" TAIL, &j, err, sizeof err), 0);
    m = create(&j);
    assert_int_equal(tensor(m, "model.layers.0.mlp.gate_proj.weight")->shape[0], 11008);
    assert_int_equal(tensor(m, "model.layers.0.self_attn.k_proj.weight")->shape[0], 1024);
    model_destroy(m);
}

/* ---- the describe line ----------------------------------------------------------------- */

static void roundtrip(const char *text, const char *want)
{
    static job_config j, back;
    char err[256], line[256], again[256];
    assert_int_equal(load(text, &j, err, sizeof err), 0);
    model *m = create(&j);
    model_describe(m, line, sizeof line);
    model_destroy(m);
    if (want)
        assert_string_equal(line, want);
    jobcfg_defaults(&back);
    if (model_parse_line(line, &back, err, sizeof err) != 0)
        fail_msg("%s: %s", line, err);
    assert_string_equal(back.model, "llama");
    m = create(&back);
    model_describe(m, again, sizeof again);
    model_destroy(m);
    assert_string_equal(line, again);
}

static void test_describe(void **state)
{
    (void)state;
    roundtrip(HEAD TAIL, "llama layers=2 heads=4 kv_heads=4 width=64 mlp_width=256 context=16 vocab=300 "
                         "norm_eps=1e-05 rope_theta=10000 tie_embeddings=off");
    roundtrip(HEAD "kv_heads = 1\nmlp_width = 96\nrope_theta = 500000\nnorm_eps = 1.5e-6\nrope_scaling = llama3\n"
                   "rope_factor = 32\nrope_low_freq = 0.3\nrope_high_freq = 4.1\nrope_context = 8192\n"
                   "tie_embeddings = on\n" TAIL,
              "llama layers=2 heads=4 kv_heads=1 width=64 mlp_width=96 context=16 vocab=300 norm_eps=1.5e-06 "
              "rope_theta=500000 rope_llama3=32,0.3,4.1,8192 tie_embeddings=on");
    /* The largest shapes still fit a checkpoint's 256-byte signature. */
    roundtrip("[model]\ntype = llama\nlayers = 96\nheads = 128\nkv_heads = 128\nwidth = 16384\n"
              "mlp_width = 262144\ncontext = 65536\nvocab = 1048576\nrope_theta = 123456.789\n"
              "norm_eps = 1.23456789e-7\nrope_scaling = llama3\nrope_factor = 12.3456789\n"
              "rope_low_freq = 0.123456789\nrope_high_freq = 4.56789\nrope_context = 16777216\n" TAIL, NULL);

    /* A model made for more positions than it trains at (an import with
     * a shorter [model] context) says so, and its export keeps them. */
    {
        static job_config j;
        char err[256], again[256];
        const char *line = "llama layers=2 heads=4 kv_heads=4 width=64 mlp_width=256 context=16 vocab=300 "
                           "norm_eps=1e-05 rope_theta=10000 tie_embeddings=off positions=131072";
        jobcfg_defaults(&j);
        assert_int_equal(model_parse_line(line, &j, err, sizeof err), 0);
        assert_int_equal(j.context, 16), assert_int_equal(j.positions, 131072);
        model *m = create(&j);
        model_describe(m, again, sizeof again);
        assert_string_equal(line, again);
        json_t *o = llama_kind()->hf_config(m);
        assert_int_equal(json_integer_value(json_object_get(o, "max_position_embeddings")), 131072);
        json_decref(o);
        model_destroy(m);
    }

    static const char *const bad[] = {
        "llama layers=2",
        "llama layers=2 heads=4 kv_heads=4 width=64 mlp_width=256 context=16 vocab=300 norm_eps=1e-05 "
        "rope_theta=10000 tie_embeddings=off positions=16", /* positions not above context */
        "llama layers=2 heads=4 kv_heads=4 width=64 mlp_width=256 context=16 vocab=300 norm_eps=1e-05 "
        "rope_theta=10000 tie_embeddings=off positions=64 positions=64",
        "llama layers=2 heads=4 kv_heads=4 width=64 mlp_width=256 context=16 vocab=300 norm_eps=1e-05 "
        "rope_theta=10000 rope_llama3=8,1,4 tie_embeddings=off", /* llama3 short of a value */
        "llama layers=2 heads=4 kv_heads=4 width=64 mlp_width=256 context=16 vocab=300 norm_eps=1e-05 "
        "rope_theta=10000 rope_llama3=8,4,1,8192 tie_embeddings=off", /* high below low */
        "llama layers=2 heads=3 kv_heads=3 width=64 mlp_width=256 context=16 vocab=300 norm_eps=1e-05 "
        "rope_theta=10000 tie_embeddings=off", /* heads do not divide width */
        "llama layers=2 layers=2 heads=4 kv_heads=4 width=64 mlp_width=256 context=16 vocab=300 norm_eps=1e-05 "
        "rope_theta=10000 tie_embeddings=off",
        "llama layers=2 heads=4 kv_heads=4 width=64 mlp_width=256 context=16 vocab=300 norm_eps=1e-05 "
        "rope_theta=10000 tie_embeddings=maybe",
        "llama layers=2 heads=4 kv_heads=4 width=64 mlp_width=256 context=16 vocab=300 norm_eps=1e-05 "
        "rope_theta=10000 tie_embeddings=off extra=1",
        "llama layers=-2 heads=4 kv_heads=4 width=64 mlp_width=256 context=16 vocab=300 norm_eps=1e-05 "
        "rope_theta=10000 tie_embeddings=off",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        static job_config j;
        char err[512];
        jobcfg_defaults(&j);
        j.layers = 7;
        assert_int_equal(model_parse_line(bad[i], &j, err, sizeof err), -1);
        assert_non_null(strstr(err, "is not a llama model line"));
        assert_int_equal(j.layers, 7); /* untouched */
    }
}

/* ---- job files -------------------------------------------------------------------------- */

static void expect_error(const char *text, const char *want)
{
    static job_config j;
    char err[512];
    assert_int_equal(load(text, &j, err, sizeof err), -1);
    if (!strstr(err, want))
        fail_msg("error '%s' does not contain '%s'", err, want);
}

static void test_job_checks(void **state)
{
    (void)state;
    expect_error("[model]\ntype = llama\nheads = 3\nwidth = 64\n" TAIL, ":3: [model] heads: must divide [model] width");
    expect_error("[model]\ntype = llama\nheads = 4\nwidth = 12\n" TAIL,
                 ":4: [model] width: a head (width / heads) must have an even size");
    expect_error(HEAD "rope_scaling = llama3\nrope_low_freq = 4\nrope_high_freq = 2\n" TAIL,
                 ":10: [model] rope_high_freq: must be above [model] rope_low_freq");
    expect_error("[model]\ntype = gpt\nkv_heads = 2\n" TAIL, ":3: [model] kv_heads: is a llama key; a gpt has none");
    expect_error("[model]\ntype = gpt\nlayers = 2\ntie_embeddings = off\n" TAIL,
                 ":4: [model] tie_embeddings: is a llama key; a gpt has none");
    expect_error("[model]\ntype = mlp\nhidden = 8\nnorm_eps = 1e-6\n[data]\ntrain = x.idx\ntrain_labels = y.idx\n"
                 "[output]\ndir = out\n",
                 ":4: [model] norm_eps: is a llama key; an mlp has none");
    expect_error(HEAD "[data]\nformat = idx\ntrain = x\n[output]\ndir = o\n", "[data] format: idx images train an mlp");
    /* A key the kind has no use for is refused, not ignored. */
    expect_error("[model]\ntype = mlp\nhidden = 8\nlayers = 2\n[data]\ntrain = x.idx\ntrain_labels = y.idx\n"
                 "[output]\ndir = out\n",
                 ":4: [model] layers: is a gpt and llama key; an mlp has its layers in [model] hidden");
    expect_error("[model]\ntype = gpt\nhidden = 10\n[data]\ntrain = x\n[output]\ndir = out\n",
                 ":3: [model] hidden: is an mlp key; a gpt has [model] layers and width instead");
    expect_error(HEAD "rope_factor = 4\n[data]\ntrain = x\n[output]\ndir = o\n",
                 "[model] rope_factor: is for rope_scaling = llama3, and the model has none");
}

/* ---- Hugging Face ----------------------------------------------------------------------- */

#define LLAMA3_CONFIG                                                                                              \
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 2048, "            \
    "\"intermediate_size\": 8192, \"num_hidden_layers\": 16, \"num_attention_heads\": 32, "                      \
    "\"num_key_value_heads\": 8, \"max_position_embeddings\": 131072, \"vocab_size\": 128256, "                  \
    "\"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0, \"rope_scaling\": {\"factor\": 32.0, "                   \
    "\"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192, "          \
    "\"rope_type\": \"llama3\"}, \"tie_word_embeddings\": true, \"hidden_act\": \"silu\", "                      \
    "\"attention_bias\": false, \"mlp_bias\": false, \"head_dim\": 64, \"torch_dtype\": \"bfloat16\"}"

static int hf_read(const char *text, job_config *j, char *err, size_t err_len)
{
    json_error_t je;
    json_t *o = json_loads(text, 0, &je);
    if (!o)
        fail_msg("test JSON: %s", je.text);
    jobcfg_defaults(j);
    int rc = llama_kind()->hf_read(o, j, err, err_len);
    json_decref(o);
    return rc;
}

/* LLAMA3_CONFIG with `from` replaced by `to` (once). */
static void hf_error(const char *from, const char *to, const char *want)
{
    static char text[4096];
    static job_config j;
    const char *at = strstr(LLAMA3_CONFIG, from);
    assert_non_null(at);
    snprintf(text, sizeof text, "%.*s%s%s", (int)(at - LLAMA3_CONFIG), LLAMA3_CONFIG, to, at + strlen(from));
    char err[512];
    assert_int_equal(hf_read(text, &j, err, sizeof err), -1);
    if (strncmp(err, want, strlen(want)) != 0)
        fail_msg("error '%s' does not start '%s'", err, want);
}

static void test_hf_read(void **state)
{
    (void)state;
    static job_config j;
    char err[512];
    assert_int_equal(hf_read(LLAMA3_CONFIG, &j, err, sizeof err), 0);
    assert_int_equal(j.width, 2048), assert_int_equal(j.mlp_width, 8192), assert_int_equal(j.layers, 16);
    assert_int_equal(j.heads, 32), assert_int_equal(j.kv_heads, 8), assert_int_equal(j.vocab, 128256);
    assert_int_equal(j.context, 65536); /* max_position_embeddings, within [model] context's range */
    assert_int_equal(j.positions, 131072); /* all of it, for the export */
    assert_true(j.norm_eps == 1e-5 && j.rope_theta == 500000.0 && j.tie_embeddings);
    assert_int_equal(j.rope_scaling, JOBCFG_ROPE_LLAMA3);
    assert_true(j.rope_factor == 32 && j.rope_low_freq == 1 && j.rope_high_freq == 4);
    assert_int_equal(j.rope_context, 8192);

    /* transformers' defaults for what a config leaves out */
    assert_int_equal(hf_read("{\"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2, "
                             "\"num_attention_heads\": 4, \"vocab_size\": 300, \"max_position_embeddings\": 16}",
                             &j, err, sizeof err),
                     0);
    assert_int_equal(j.kv_heads, 4), assert_int_equal(j.context, 16);
    assert_true(j.norm_eps == 1e-6 && j.rope_theta == 10000 && !j.tie_embeddings);
    assert_int_equal(j.rope_scaling, JOBCFG_ROPE_NONE);

    hf_error("\"hidden_size\": 2048, ", "", "config.json: hidden_size: is missing");
    hf_error("\"silu\"", "\"gelu\"", "config.json: hidden_act: must be silu");
    hf_error("\"attention_bias\": false", "\"attention_bias\": true", "config.json: attention_bias: must be false");
    hf_error("\"mlp_bias\": false", "\"mlp_bias\": true", "config.json: mlp_bias: must be false");
    hf_error("\"head_dim\": 64", "\"head_dim\": 128", "config.json: head_dim: must be hidden_size / num_attention");
    hf_error("\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5",
             "config.json: num_key_value_heads: must divide num_attention_heads");
    hf_error("\"num_attention_heads\": 32", "\"num_attention_heads\": 30",
             "config.json: num_attention_heads: must divide hidden_size");
    hf_error("\"vocab_size\": 128256", "\"vocab_size\": 2000000", "config.json: vocab_size: expected an integer");
    hf_error("\"vocab_size\": 128256", "\"vocab_size\": \"many\"", "config.json: vocab_size: expected an integer");
    hf_error("\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": -1", "config.json: rms_norm_eps: expected a number");
    hf_error("\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\"",
             "config.json: rope_scaling.rope_type: 'yarn' is not supported");
    hf_error("\"factor\": 32.0, ", "", "config.json: rope_scaling.factor: is missing");
    hf_error("\"low_freq_factor\": 1.0", "\"low_freq_factor\": 5.0",
             "config.json: rope_scaling.high_freq_factor: must be above low_freq_factor");
    hf_error("\"tie_word_embeddings\": true", "\"tie_word_embeddings\": 1",
             "config.json: tie_word_embeddings: expected true or false");
}

/* hf_config, read back by hf_read, is the same model; hf_ignore. */
static void test_hf_config(void **state)
{
    (void)state;
    static job_config j, back;
    char err[512], line[256], again[256];
    assert_int_equal(load(HEAD "kv_heads = 2\nmlp_width = 96\nrope_scaling = llama3\nrope_factor = 8\n"
                               "rope_context = 64\ntie_embeddings = on\n" TAIL,
                          &j, err, sizeof err),
                     0);
    model *m = create(&j);
    model_describe(m, line, sizeof line);
    json_t *o = llama_kind()->hf_config(m);
    assert_non_null(o);
    assert_string_equal(json_string_value(json_array_get(json_object_get(o, "architectures"), 0)),
                        "LlamaForCausalLM");
    assert_string_equal(json_string_value(json_object_get(o, "torch_dtype")), "float32");
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "rope_scaling"), "rope_type")),
                        "llama3");
    jobcfg_defaults(&back);
    snprintf(back.model, sizeof back.model, "llama");
    assert_int_equal(llama_kind()->hf_read(o, &back, err, sizeof err), 0);
    json_decref(o);
    model *m2 = create(&back);
    model_describe(m2, again, sizeof again);
    assert_string_equal(line, again);

    const model_kind *k = llama_kind();
    assert_true(k->hf_ignore(m, "model.layers.12.self_attn.rotary_emb.inv_freq"));
    assert_false(k->hf_ignore(m, "model.layers..self_attn.rotary_emb.inv_freq"));
    assert_false(k->hf_ignore(m, "model.layers.1.self_attn.rotary_emb.inv_freq.x"));
    assert_false(k->hf_ignore(m, "model.norm.weight"));
    assert_true(k->hf_ignore(m, "lm_head.weight")); /* tied */
    model_destroy(m2);
    back.tie_embeddings = false;
    m2 = create(&back);
    assert_false(k->hf_ignore(m2, "lm_head.weight"));
    model_destroy(m2);
    model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tensors),    cmocka_unit_test(test_describe), cmocka_unit_test(test_job_checks),
        cmocka_unit_test(test_hf_read),    cmocka_unit_test(test_hf_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
