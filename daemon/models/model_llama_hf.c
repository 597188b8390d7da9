/* model_llama_hf.c — the llama kind's Hugging Face hooks (model.h):
 * config.json of a LlamaForCausalLM into the job's [model] keys, the
 * model's own config.json for an export, and the tensors a checkpoint may
 * hold that the model does not use.  Errors name config.json's key.
 * model_llama.c declares the three where its kind table points at them. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

static int cfg_error(char *err, size_t err_len, const char *key, const char *why)
{
    snprintf(err, err_len, "config.json: %s: %s", key, why);
    return -1;
}

/* An integer key in [lo,hi]; absent (or null): def, or an error when def < 0. */
static int cfg_uint(const json_t *o, const char *key, long long def, long long lo, long long hi, uint32_t *out,
                    char *err, size_t err_len)
{
    const json_t *v = json_object_get(o, key);
    char why[96];
    if (!v || json_is_null(v)) {
        if (def < 0)
            return cfg_error(err, err_len, key, "is missing");
        *out = (uint32_t)def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        snprintf(why, sizeof why, "expected an integer from %lld to %lld", lo, hi);
        return cfg_error(err, err_len, key, why);
    }
    *out = (uint32_t)json_integer_value(v);
    return 0;
}

static int cfg_double(const json_t *o, const char *key, double def, double lo, double hi, double *out, char *err,
                      size_t err_len)
{
    const json_t *v = json_object_get(o, key);
    char why[96];
    if (!v || json_is_null(v)) {
        if (isnan(def))
            return cfg_error(err, err_len, key, "is missing");
        *out = def;
        return 0;
    }
    if (!json_is_number(v) || !(json_number_value(v) >= lo && json_number_value(v) <= hi)) {
        snprintf(why, sizeof why, "expected a number from %g to %g", lo, hi);
        return cfg_error(err, err_len, key, why);
    }
    *out = json_number_value(v);
    return 0;
}

/* A key that must be false where it is set (a feature gradd's llama lacks). */
static int cfg_false(const json_t *o, const char *key, char *err, size_t err_len)
{
    const json_t *v = json_object_get(o, key);
    if (v && !json_is_null(v) && !json_is_false(v))
        return cfg_error(err, err_len, key, "must be false: gradd's llama has no biases");
    return 0;
}

static int cfg_rope_scaling(const json_t *o, job_config *j, char *err, size_t err_len)
{
    const json_t *rs = json_object_get(o, "rope_scaling");
    j->rope_scaling = JOBCFG_ROPE_NONE;
    if (!rs || json_is_null(rs))
        return 0;
    if (!json_is_object(rs))
        return cfg_error(err, err_len, "rope_scaling", "expected an object or null");
    const json_t *type = json_object_get(rs, "rope_type");
    if (!type)
        type = json_object_get(rs, "type");
    if (!json_is_string(type))
        return cfg_error(err, err_len, "rope_scaling.rope_type", "is missing");
    if (strcmp(json_string_value(type), "default") == 0)
        return 0;
    if (strcmp(json_string_value(type), "llama3") != 0) {
        char why[160];
        snprintf(why, sizeof why, "'%.64s' is not supported (only llama3)", json_string_value(type));
        return cfg_error(err, err_len, "rope_scaling.rope_type", why);
    }
    j->rope_scaling = JOBCFG_ROPE_LLAMA3;
    char e[256];
    int rc = 0;
    if (cfg_double(rs, "factor", NAN, 1, 1e6, &j->rope_factor, e, sizeof e) ||
        cfg_double(rs, "low_freq_factor", NAN, 1e-6, 1e6, &j->rope_low_freq, e, sizeof e) ||
        cfg_double(rs, "high_freq_factor", NAN, 1e-6, 1e6, &j->rope_high_freq, e, sizeof e) ||
        cfg_uint(rs, "original_max_position_embeddings", -1, 1, 1 << 24, &j->rope_context, e, sizeof e))
        rc = -1;
    else if (!(j->rope_high_freq > j->rope_low_freq))
        rc = -1, snprintf(e, sizeof e, "config.json: high_freq_factor: must be above low_freq_factor");
    if (rc) /* "config.json: KEY: why" -> "config.json: rope_scaling.KEY: why" */
        snprintf(err, err_len, "config.json: rope_scaling.%s", e + strlen("config.json: "));
    return rc;
}

int model_llama_hf_read(const void *config, job_config *j, char *err, size_t err_len)
{
    const json_t *o = config;
    if (!json_is_object(o))
        return cfg_error(err, err_len, "(top)", "expected a JSON object");
    const json_t *act = json_object_get(o, "hidden_act");
    if (act && !json_is_null(act) && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return cfg_error(err, err_len, "hidden_act", "must be silu (SwiGLU): gradd's llama has no other");
    if (cfg_false(o, "attention_bias", err, err_len) || cfg_false(o, "mlp_bias", err, err_len))
        return -1;
    job_config t = *j;
    uint32_t max_pos;
    if (cfg_uint(o, "hidden_size", -1, 1, 16384, &t.width, err, err_len) ||
        cfg_uint(o, "num_hidden_layers", -1, 1, JOBCFG_MAX_LAYERS, &t.layers, err, err_len) ||
        cfg_uint(o, "num_attention_heads", -1, 1, 128, &t.heads, err, err_len) ||
        cfg_uint(o, "num_key_value_heads", t.heads, 1, 128, &t.kv_heads, err, err_len) ||
        cfg_uint(o, "intermediate_size", -1, 1, 1 << 18, &t.mlp_width, err, err_len) ||
        cfg_uint(o, "vocab_size", -1, 2, JOBCFG_MAX_VOCAB, &t.vocab, err, err_len) ||
        cfg_uint(o, "max_position_embeddings", 2048, 2, 1ll << 31, &max_pos, err, err_len) ||
        cfg_double(o, "rms_norm_eps", 1e-6, 1e-12, 1, &t.norm_eps, err, err_len) ||
        cfg_double(o, "rope_theta", 10000, 1, 1e12, &t.rope_theta, err, err_len) ||
        cfg_rope_scaling(o, &t, err, err_len))
        return -1;
    /* The context is what the job trains at: the model's own, unless the
     * job file asks for fewer positions (rotary embeddings have no table);
     * at most what [model] context allows. */
    t.context = max_pos < 65536 ? max_pos : 65536;
    t.positions = max_pos;
    const json_t *tie = json_object_get(o, "tie_word_embeddings");
    if (tie && !json_is_null(tie) && !json_is_boolean(tie))
        return cfg_error(err, err_len, "tie_word_embeddings", "expected true or false");
    t.tie_embeddings = tie && json_is_true(tie); /* LlamaConfig's default: false */
    if (t.width % t.heads)
        return cfg_error(err, err_len, "num_attention_heads", "must divide hidden_size");
    if (t.heads % t.kv_heads)
        return cfg_error(err, err_len, "num_key_value_heads", "must divide num_attention_heads");
    if ((t.width / t.heads) % 2)
        return cfg_error(err, err_len, "hidden_size", "a head (hidden_size / num_attention_heads) must be even");
    const json_t *hd = json_object_get(o, "head_dim");
    if (hd && !json_is_null(hd) && (!json_is_integer(hd) || json_integer_value(hd) != t.width / t.heads))
        return cfg_error(err, err_len, "head_dim", "must be hidden_size / num_attention_heads (gradd's llama has "
                         "no other head size)");
    *j = t;
    return 0;
}

/* A config.json for transformers' LlamaForCausalLM, from the model's
 * describe line, which carries every key (model_llama.c).  Llama 3 scaling
 * is written as transformers 4.43 and later read it (rope_type llama3). */
void *model_llama_hf_config(const model *m)
{
    static const job_config zero;
    job_config *j = malloc(sizeof *j);
    char line[256], err[512];
    model_describe(m, line, sizeof line);
    if (!j)
        return NULL;
    *j = zero;
    if (m->kind->parse(line, j, err, sizeof err) != 0) { /* a line describe wrote: cannot happen */
        free(j);
        return NULL;
    }
    json_t *o = json_object(), *arch = json_array(), *rope = json_null();
    if (j->rope_scaling == JOBCFG_ROPE_LLAMA3)
        rope = json_pack("{s:s, s:f, s:f, s:f, s:I}", "rope_type", "llama3", "factor", j->rope_factor,
                         "low_freq_factor", j->rope_low_freq, "high_freq_factor", j->rope_high_freq,
                         "original_max_position_embeddings", (json_int_t)j->rope_context);
    int bad = !o || !rope || !arch || json_array_append_new(arch, json_string("LlamaForCausalLM"));
    if (bad) {
        json_decref(arch);
        json_decref(rope);
    } else {
        bad |= json_object_set_new(o, "architectures", arch);
        bad |= json_object_set_new(o, "model_type", json_string("llama"));
        bad |= json_object_set_new(o, "hidden_size", json_integer(j->width));
        bad |= json_object_set_new(o, "intermediate_size", json_integer(j->mlp_width));
        bad |= json_object_set_new(o, "num_hidden_layers", json_integer(j->layers));
        bad |= json_object_set_new(o, "num_attention_heads", json_integer(j->heads));
        bad |= json_object_set_new(o, "num_key_value_heads", json_integer(j->kv_heads));
        bad |= json_object_set_new(o, "max_position_embeddings",
                                   json_integer(j->positions > j->context ? j->positions : j->context));
        bad |= json_object_set_new(o, "vocab_size", json_integer(j->vocab));
        bad |= json_object_set_new(o, "rms_norm_eps", json_real(j->norm_eps));
        bad |= json_object_set_new(o, "rope_theta", json_real(j->rope_theta));
        bad |= json_object_set_new(o, "rope_scaling", rope);
        bad |= json_object_set_new(o, "tie_word_embeddings", json_boolean(j->tie_embeddings));
        bad |= json_object_set_new(o, "hidden_act", json_string("silu"));
        bad |= json_object_set_new(o, "attention_bias", json_false());
        bad |= json_object_set_new(o, "torch_dtype", json_string("float32"));
    }
    free(j);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Buffers a checkpoint may hold: the rotary frequencies older transformers
 * saved per layer, and a tied head stored under its own name. */
bool model_llama_hf_ignore(const model *m, const char *name)
{
    if (strcmp(name, "lm_head.weight") == 0) { /* tied: the model has no tensor of that name */
        for (int i = 0; i < m->ntensors; i++)
            if (strcmp(m->tensors[i].name, name) == 0)
                return false;
        return true;
    }
    const char *p = name;
    if (strncmp(p, "model.layers.", 13) != 0)
        return false;
    p += 13;
    size_t digits = strspn(p, "0123456789");
    return digits > 0 && strcmp(p + digits, ".self_attn.rotary_emb.inv_freq") == 0;
}
