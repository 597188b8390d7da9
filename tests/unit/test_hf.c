/* test_hf.c — io/hf.c: the 16-bit conversions against the CPU kernels'
 * casts for every bit pattern, the index's checks, and the weights' reader
 * on hand-written files (a transposed F16 matrix, a duplicate across
 * shards, a missing shard, an atomic config.json). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/hf.h"
#include "io/safetensors.h"
#include "kernels.h"
#include "tmpdir.h"

static int setup_dir(void **state)
{
    (void)state;
    return td_make("hf");
}

static int teardown_dir(void **state)
{
    (void)state;
    return td_remove();
}

static void same_float(float a, float b)
{
    if (isnan(a) || isnan(b)) {
        assert_true(isnan(a) && isnan(b));
        return;
    }
    assert_memory_equal(&a, &b, sizeof a);
}

/* Every F16 and BF16 pattern converts as the kernels' casts do (an
 * independent implementation: renormalising by float arithmetic). */
static void test_conversions_exact(void **state)
{
    (void)state;
    const kern_ops *k = kern_cpu_ops();
    kern_ctx *kc = k->ctx_create(1, 0, KERN_FP32, NULL);
    assert_non_null(kc);
    static uint16_t bits[65536];
    static float ref16[65536], refbf[65536];
    for (uint32_t i = 0; i < 65536; i++)
        bits[i] = (uint16_t)i;
    k->cast_f16_to_f32(kc, ref16, bits, 65536);
    k->cast_bf16_to_f32(kc, refbf, bits, 65536);
    for (uint32_t i = 0; i < 65536; i++) {
        same_float(hf_f16_to_f32((uint16_t)i), ref16[i]);
        same_float(hf_bf16_to_f32((uint16_t)i), refbf[i]);
    }
    k->ctx_destroy(kc);
}

static void test_index(void **state)
{
    (void)state;
    hf_index ix;
    char err[512];
    const char *ok = "{\"metadata\": {}, \"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s2.safetensors\"}}";
    assert_int_equal(hf_index_parse(ok, strlen(ok), "D/i.json", &ix, err, sizeof err), 0);
    assert_int_equal(ix.n, 2);
    assert_string_equal(ix.tensor[1], "b");
    assert_string_equal(ix.shard[1], "s2.safetensors");
    hf_index_free(&ix);
    static const struct {
        const char *text, *msg;
    } bad[] = {
        {"{\"weight_map\": {\"a\": \"../x\"}}", "D/i.json: weight_map: tensor 'a': expected the name of a file"},
        {"{\"weight_map\": {\"a\": \"..\"}}", "D/i.json: weight_map: tensor 'a': expected the name of a file"},
        {"{\"weight_map\": {\"a\": 3}}", "D/i.json: weight_map: tensor 'a': expected the name of a file"},
        {"{\"weight_map\": {\"a\": \"x\", \"a\": \"y\"}}", "D/i.json:1: not valid JSON: duplicate object key"},
        {"{\"weight_map\": []}", "D/i.json: weight_map: expected an object"},
        {"[]", "D/i.json: expected a JSON object at the top"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(hf_index_parse(bad[i].text, strlen(bad[i].text), "D/i.json", &ix, err, sizeof err), -1);
        if (strncmp(err, bad[i].msg, strlen(bad[i].msg)) != 0)
            fail_msg("'%s': got '%s'", bad[i].text, err);
        assert_int_equal(ix.n, 0);
    }
}

static void write_file(const char *name, const char *text)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", td_path, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* One safetensors file of the given tensors. */
static void write_st(const char *name, int n, const char *const *names, const st_dtype *dt, const uint64_t (*shape)[2],
                     const void *const *data, const size_t *bytes)
{
    char p[256], err[256];
    snprintf(p, sizeof p, "%s/%s", td_path, name);
    st_writer *w = st_writer_new();
    for (int i = 0; i < n; i++)
        assert_int_equal(st_writer_add(w, names[i], dt[i], 2, shape[i], data[i], bytes[i], err, sizeof err), 0);
    assert_int_equal(st_write_atomic(w, p, err, sizeof err), 0);
    st_writer_free(w);
}

static void test_weights(void **state)
{
    (void)state;
    /* m.w: (2,3) in the file as F16, kept (3,2); m.b: F32 (1,3). */
    static const uint16_t w16[6] = {0x3c00, 0xc000, 0x3800, 0x4200, 0x7bff, 0xb400};
    float wf[6] = {1, -2, 0.5f, 3, 65504, -0.25f}, b[3] = {7, 8, 9};
    const char *names[] = {"pre.m.w", "pre.m.b"};
    st_dtype dt[] = {ST_F16, ST_F32};
    uint64_t shape[2][2] = {{2, 3}, {1, 3}};
    const void *data[] = {w16, b};
    size_t bytes[] = {sizeof w16, sizeof b};
    write_st("model.safetensors", 2, names, dt, (const uint64_t(*)[2])shape, data, bytes);
    hf_want want[] = {{"m.w", 2, {2, 3}, true}, {"m.b", 2, {1, 3}, false}};
    hf_weights *h;
    char err[512];
    assert_int_equal(hf_weights_open(td_path, want, 2, "pre.", NULL, NULL, "config.json", &h, err, sizeof err), 0);
    float got[6], gb[3];
    assert_int_equal(hf_weights_read(h, 0, got, err, sizeof err), 0);
    assert_int_equal(hf_weights_read(h, 1, gb, err, sizeof err), 0);
    hf_weights_close(h);
    /* File (2,3) row-major -> kept (3,2): got[c*2 + r] = file[r][c]. */
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 3; c++)
            assert_true(got[c * 2 + r] == wf[r * 3 + c]);
    assert_memory_equal(gb, b, sizeof b);

    /* Wanted with another shape: the file, tensor and both shapes named. */
    hf_want wide[] = {{"m.w", 2, {2, 4}, true}, {"m.b", 2, {1, 3}, false}};
    assert_int_equal(hf_weights_open(td_path, wide, 2, "pre.", NULL, NULL, "config.json", &h, err, sizeof err), -1);
    assert_non_null(strstr(err, "/model.safetensors: tensor 'pre.m.w': shape [2,3] but the config (config.json) "
                                "says [2,4]"));
    /* A tensor nobody wants. */
    assert_int_equal(hf_weights_open(td_path, want, 1, "pre.", NULL, NULL, "config.json", &h, err, sizeof err), -1);
    assert_non_null(strstr(err, "tensor 'pre.m.b': the model (config.json) has no such tensor"));

    /* Sharded: the same tensor in two shards is refused; so is a shard
     * that is not there. */
    write_st("s1.safetensors", 2, names, dt, (const uint64_t(*)[2])shape, data, bytes);
    write_st("s2.safetensors", 1, names + 1, dt + 1, (const uint64_t(*)[2])shape + 1, data + 1, bytes + 1);
    write_file(HF_INDEX, "{\"weight_map\": {\"pre.m.w\": \"s1.safetensors\", \"pre.m.b\": \"s2.safetensors\"}}");
    assert_int_equal(hf_weights_open(td_path, want, 2, "pre.", NULL, NULL, "config.json", &h, err, sizeof err), -1);
    assert_non_null(strstr(err, "tensor 'pre.m.b' is in both s1.safetensors and s2.safetensors"));
    write_file(HF_INDEX, "{\"weight_map\": {\"pre.m.w\": \"s1.safetensors\", \"pre.m.b\": \"s3.safetensors\"}}");
    assert_int_equal(hf_weights_open(td_path, want, 2, "pre.", NULL, NULL, "config.json", &h, err, sizeof err), -1);
    assert_non_null(strstr(err, "/s3.safetensors: cannot open"));
    write_file(HF_INDEX, "{\"weight_map\": {\"pre.m.w\": \"s1.safetensors\", \"pre.m.b\": \"s1.safetensors\"}}");
    assert_int_equal(hf_weights_open(td_path, want, 2, "pre.", NULL, NULL, "config.json", &h, err, sizeof err), 0);
    hf_weights_close(h);
}

static void test_config_json(void **state)
{
    (void)state;
    char err[512], path[256];
    json_t *cfg;
    assert_int_equal(hf_config_read(td_path, &cfg, err, sizeof err), -1);
    assert_non_null(strstr(err, "/config.json: cannot open"));
    write_file("config.json", "{\"model_type\": \"gpt2\",}");
    assert_int_equal(hf_config_read(td_path, &cfg, err, sizeof err), -1);
    assert_non_null(strstr(err, "/config.json:1: not valid JSON"));
    json_t *obj = json_pack("{s:s,s:i}", "model_type", "gpt2", "n_embd", 16);
    snprintf(path, sizeof path, "%s/config.json", td_path);
    assert_int_equal(hf_write_json(path, obj, err, sizeof err), 0);
    json_decref(obj);
    assert_int_equal(hf_config_read(td_path, &cfg, err, sizeof err), 0);
    assert_int_equal(json_integer_value(json_object_get(cfg, "n_embd")), 16);
    json_decref(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conversions_exact),
        cmocka_unit_test(test_index),
        cmocka_unit_test_setup_teardown(test_weights, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_config_json, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
