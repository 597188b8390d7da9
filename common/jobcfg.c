/* jobcfg.c — the job file's option table, parsing and validation. */
#include "jobcfg.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "argsplit.h"
#include "opts.h"
#include "utf8.h"

/* ---- the option table ---------------------------------------------------- */

#define J(field) OPTS_FIELD(job_config, field)
#define PATHS 0, 0, false

static const opts_def opts[] = {
    {"job", "name", OPTS_STRING, J(name), 0, 0, false, "", "shown in gradctl list (default: the file's name up to its first dot)", NULL},
    {"job", "device", OPTS_STRING, J(device), 0, 0, false, "auto", "auto, cpu, cpuN or cuda:N", NULL},
    {"job", "devices", OPTS_STRING, J(devices), 0, 0, false, "",
     "one job over several devices, data-parallel: cpuN or cuda:N, comma-separated (in place of device)", NULL},
    {"job", "priority", OPTS_COUNT, J(priority), 0, JOBCFG_PRIORITY_MAX, false, "0", "higher runs first", NULL},
    {"job", "type", OPTS_CHOICE, J(type), 0, 0, false, "engine",
     "engine: gradd trains the model below; program: run [program] command", "engine|program"},
    {"job", "time_limit", OPTS_DURATION, J(time_limit_ms), 0, 1e15, false, "0",
     "stop the job once it has run this long (0: none, or gradd.conf's default_time_limit)", NULL},
    {"job", "rank_timeout", OPTS_DURATION, J(rank_timeout_ms), 1000, 1e9, false, "5m",
     "run as several ranks (mpirun, srun): how long a rank waits for the others before the job fails", NULL},
    {"job", "allreduce_bucket", OPTS_SIZE, J(allreduce_bucket), 0, 1.8e19, false, "25M",
     "several ranks: gradients summed in buckets of this size while the backward goes on (0: all after it)", NULL},
    {"job", "on_end", OPTS_STRING, J(on_end), 0, 0, false, "",
     "once the job has ended: run this command as its owner, quoted as in sh, without a shell", NULL},

    {"model", "type", OPTS_STRING, J(model), 0, 0, false, "gpt", "the model: mlp, gpt or llama (gradd checks it)",
     NULL},
    {"model", "layers", OPTS_COUNT, J(layers), 1, JOBCFG_MAX_LAYERS, false, "2", "gpt: transformer blocks", NULL},
    {"model", "heads", OPTS_COUNT, J(heads), 1, 128, false, "4", "gpt: attention heads (divide width)", NULL},
    {"model", "width", OPTS_COUNT, J(width), 1, 16384, false, "64", "gpt: channels", NULL},
    {"model", "context", OPTS_COUNT, J(context), 2, 65536, false, "64", "gpt: tokens per sequence", NULL},
    {"model", "vocab", OPTS_COUNT, J(vocab), 2, JOBCFG_MAX_VOCAB, false, "256", "gpt: vocabulary (256 for raw bytes)",
     NULL},
    {"model", "hidden", OPTS_STRING, J(hidden_text), 0, 0, false, "256", "mlp: hidden sizes, e.g. 256,128", NULL},
    {"model", "from", OPTS_STRING, J(from), PATHS, "",
     "a Hugging Face model directory (config.json, *.safetensors) to start from; its shape keys may be left out", NULL},
    {"model", "kv_heads", OPTS_COUNT, J(kv_heads), 0, 128, false, "0",
     "llama: key/value heads of grouped-query attention (divide heads; 0: heads)", NULL},
    {"model", "mlp_width", OPTS_COUNT, J(mlp_width), 0, 1 << 18, false, "0",
     "llama: the MLP's hidden width (0: the model's default)", NULL},
    {"model", "rope_theta", OPTS_DOUBLE, J(rope_theta), 1, 1e12, false, "10000", "llama: rotary embedding base", NULL},
    {"model", "rope_scaling", OPTS_CHOICE, J(rope_scaling), 0, 0, false, "none",
     "llama: none, or llama3's frequency scaling (the rope_factor, rope_*_freq and rope_context keys)",
     "none|llama3"},
    {"model", "rope_factor", OPTS_DOUBLE, J(rope_factor), 1, 1e6, false, "8", "llama3 scaling: factor", NULL},
    {"model", "rope_low_freq", OPTS_DOUBLE, J(rope_low_freq), 1e-6, 1e6, false, "1",
     "llama3 scaling: low_freq_factor", NULL},
    {"model", "rope_high_freq", OPTS_DOUBLE, J(rope_high_freq), 1e-6, 1e6, false, "4",
     "llama3 scaling: high_freq_factor", NULL},
    {"model", "rope_context", OPTS_COUNT, J(rope_context), 1, 1 << 24, false, "8192",
     "llama3 scaling: original_max_position_embeddings", NULL},
    {"model", "norm_eps", OPTS_DOUBLE, J(norm_eps), 1e-12, 1, false, "1e-5", "llama: RMSNorm epsilon", NULL},
    {"model", "tie_embeddings", OPTS_BOOL, J(tie_embeddings), 0, 1, false, "off",
     "llama: the output layer is the token embedding (gpt always ties)", NULL},

    {"data", "format", OPTS_CHOICE, J(format), 0, 0, false, "auto",
     "auto, text, tokens (llm.c .bin), idx, npy, or jsonl (fine-tuning samples: input_ids, labels)",
     "auto|text|tokens|idx|npy|jsonl"},
    {"data", "train", OPTS_STRING, J(train), PATHS, "", "training data: a file or a directory of text files", NULL},
    {"data", "train_labels", OPTS_STRING, J(train_labels), PATHS, "", "idx/npy: labels of the training images", NULL},
    {"data", "val", OPTS_STRING, J(val), PATHS, "", "validation data (empty: hold out val_fraction of train)", NULL},
    {"data", "val_labels", OPTS_STRING, J(val_labels), PATHS, "", "idx/npy: labels of the validation images", NULL},
    {"data", "val_fraction", OPTS_DOUBLE, J(val_fraction), 0, 0.5, false, "0.05", "held out when val is empty", NULL},
    {"data", "overlong", OPTS_CHOICE, J(overlong), 0, 0, false, "refuse",
     "jsonl: a sample longer than [model] context is refused (naming its line) or truncated", "refuse|truncate"},
    {"data", "packing", OPTS_BOOL, J(packing), 0, 1, false, "on",
     "jsonl: pack several samples into one sequence where the model can keep them apart; off: one per sequence",
     NULL},
    {"data", "subset", OPTS_COUNT, J(subset), 0, 1e12, false, "0", "mlp: use only the first N training images (0: all)", NULL},
    {"data", "val_subset", OPTS_COUNT, J(val_subset), 0, 1e12, false, "0", "mlp: likewise for the validation images", NULL},

    {"train", "steps", OPTS_COUNT, J(steps), 1, 1e12, false, "100", "optimizer steps", NULL},
    {"train", "batch", OPTS_COUNT, J(batch), 1, 1 << 20, false, "16", "effective batch: samples per optimizer step", NULL},
    {"train", "micro_batch", OPTS_STRING, J(micro_text), 0, 0, false, "auto", "auto, or samples per forward/backward", NULL},
    {"train", "lr", OPTS_DOUBLE, J(lr), 0, 10, false, "1e-3", "peak learning rate", NULL},
    {"train", "min_lr", OPTS_DOUBLE, J(min_lr), 0, 10, false, "0", "learning rate at the end of the cosine decay", NULL},
    {"train", "warmup", OPTS_COUNT, J(warmup), 0, 1e12, false, "0", "linear warmup steps", NULL},
    {"train", "weight_decay", OPTS_DOUBLE, J(weight_decay), 0, 10, false, "0.0", "AdamW decay (matrices only)", NULL},
    {"train", "grad_clip", OPTS_DOUBLE, J(grad_clip), 0, 1e9, false, "1.0", "global gradient norm clip (0: off)", NULL},
    {"train", "beta1", OPTS_DOUBLE, J(beta1), 0, 0.999999, false, "0.9", "AdamW beta1", NULL},
    {"train", "beta2", OPTS_DOUBLE, J(beta2), 0, 0.999999, false, "0.95", "AdamW beta2", NULL},
    {"train", "eps", OPTS_DOUBLE, J(eps), 1e-12, 1, false, "1e-8", "AdamW epsilon", NULL},
    {"train", "seed", OPTS_COUNT, J(seed), 0, 1.8e19, false, "1337", "fixes initialisation and data order", NULL},
    {"train", "precision", OPTS_CHOICE, J(precision), 0, 0, false, "fp32", "fp32; on GPU also bf16 or fp16",
     "fp32|bf16|fp16"},
    {"train", "eval_every", OPTS_COUNT, J(eval_every), 0, 1e12, false, "0", "validate every N steps (0: at the end)", NULL},
    {"train", "eval_batches", OPTS_COUNT, J(eval_batches), 0, 1 << 20, false, "20",
     "batches of [train] batch samples per validation (0: the whole validation set)", NULL},
    {"train", "threads", OPTS_COUNT, J(threads), 0, 1024, false, "0", "cpu threads (0: all cores)", NULL},

    {"memory", "limit", OPTS_SIZE, J(mem_limit), 0, 1.8e19, false, "0", "the job's memory budget on its device (0: none)", NULL},
    {"memory", "margin", OPTS_DOUBLE, J(margin), 0, 0.9, false, "0.05", "headroom kept free inside the budget", NULL},
    {"memory", "grow_after", OPTS_COUNT, J(grow_after), 0, 1e12, false, "50",
     "steps of stable headroom before a shrunk micro-batch grows back (0: never)", NULL},
    {"memory", "tune", OPTS_BOOL, J(tune), 0, 1, false, "on",
     "micro_batch = auto: time sizes up to the largest that fits, keep the fastest", NULL},
    {"memory", "shard_optimizer", OPTS_BOOL, J(shard_optimizer), 0, 1, false, "off",
     "several ranks: each holds the optimizer state of its share of the parameters (ZeRO stage 1)", NULL},
    {"memory", "recompute", OPTS_CHOICE, J(recompute), 0, 0, false, "auto",
     "activation recomputation (gpt, llama): auto turns it on when micro-batch 1 does not fit without it",
     "auto|off|on"},

    {"finetune", "method", OPTS_CHOICE, J(ft_method), 0, 0, false, "full",
     "full: train every weight; lora: train low-rank adapters on a frozen base, stored once in the precision the GEMMs "
     "read (16 bits under bf16/fp16); auto: full when micro-batch 1 of it fits the job's memory (with recompute "
     "unless off), else lora", "full|lora|auto"},
    {"finetune", "rank", OPTS_COUNT, J(lora_rank), 1, 4096, false, "8", "lora: the adapters' rank r", NULL},
    {"finetune", "alpha", OPTS_DOUBLE, J(lora_alpha), 1e-6, 1e6, false, "16",
     "lora: the adapters' output is scaled by alpha / rank (PEFT's lora_alpha)", NULL},
    {"finetune", "dropout", OPTS_DOUBLE, J(lora_dropout), 0, 0.9, false, "0",
     "lora: the rate at which each adapter's input elements are dropped in training (PEFT's lora_dropout)", NULL},
    {"finetune", "targets", OPTS_STRING, J(lora_targets), 0, 0, false, "",
     "lora: the linear layers that get adapters, by their Hugging Face names (llama: q_proj, k_proj, v_proj, "
     "o_proj, gate_proj, up_proj, down_proj; gpt: c_attn, c_proj (both projections), c_fc); empty: PEFT's default for "
     "the model (llama: q_proj,v_proj; gpt: c_attn)", NULL},
    {"finetune", "merged", OPTS_BOOL, J(lora_merged), 0, 1, false, "off",
     "lora: also export model.safetensors with the adapters merged into the base", NULL},

    {"output", "dir", OPTS_STRING, J(out_dir), PATHS, "", "where model.safetensors, metrics and checkpoints go", NULL},
    {"output", "checkpoint_every", OPTS_COUNT, J(checkpoint_every), 0, 1e12, false, "0",
     "write the resume state every N steps (0: only at the end)", NULL},
    {"output", "log_every", OPTS_COUNT, J(log_every), 1, 1e12, false, "1", "metrics.jsonl line every N steps", NULL},
    {"output", "resume", OPTS_CHOICE, J(resume), 0, 0, false, "auto",
     "auto: continue an unfinished run's checkpoint there, refuse a finished run; never: refuse a dir with gradd's "
     "outputs; require: refuse one without a checkpoint to continue", "auto|never|require"},

    {"program", "command", OPTS_STRING, J(command), 0, 0, false, "",
     "type = program: the program and its arguments, quoted as in sh, run without a shell", NULL},
    {"program", "workdir", OPTS_STRING, J(workdir), PATHS, "", "its working directory (default: the job file's)", NULL},
    {"program", "env", OPTS_STRING, J(env), 0, 0, false, "", "KEY=VALUE words added to its environment", NULL},
    {"program", "grace", OPTS_DURATION, J(grace_ms), 0, 1e15, false, "30s",
     "on cancel: SIGTERM, then SIGKILL after this", NULL},
    {"program", "restart", OPTS_CHOICE, J(restart), 0, 0, false, "no",
     "on-failure: queue it again when a daemon restart cut it short", "no|on-failure"},
    {"program", "allocator", OPTS_CHOICE, J(allocator), 0, 0, false, "gradd",
     "gradd: its PyTorch allocates from a gradd pool (live stats, budget, reclaim); pytorch: its own", "gradd|pytorch"},
};
#define NOPTS (sizeof opts / sizeof opts[0])

void jobcfg_defaults(job_config *j)
{
    memset(j, 0, sizeof *j);
    opts_defaults(opts, NOPTS, NULL, j);
}

void jobcfg_print_defaults(FILE *f)
{
    opts_print(opts, NOPTS, f);
}

/* ---- parsing ------------------------------------------------------------------ */

_Static_assert(NOPTS <= JOBCFG_MAX_KEYS, "job_config.key_line must have a slot for every key");

typedef struct {
    job_config *j;
    bool check_data; /* the data files must be readable now */
} parse_ctx;

static int on_entry(void *user, const char *section, const char *key, const char *value, int line, char *why,
                    size_t why_len, bool *name_key)
{
    parse_ctx *p = user;
    opts_simple s = {opts, NOPTS, p->j};
    if (opts_simple_entry(&s, section, key, value, line, why, why_len, name_key) != 0)
        return -1;
    if (!key)
        return 0; /* an empty section, known */
    p->j->key_line[opts_find(opts, NOPTS, section, key) - opts] = line;
    return 0;
}

/* ---- validation after parsing ------------------------------------------------ */

const char *jobcfg_where(const job_config *j, const char *section, const char *key, char *buf, size_t len)
{
    const opts_def *o = opts_find(opts, NOPTS, section, key);
    int line = o ? j->key_line[o - opts] : 0;
    if (line)
        snprintf(buf, len, "%s:%d: [%s] %s", j->source, line, section, key);
    else
        snprintf(buf, len, "%s: [%s] %s", j->source, section, key);
    return buf;
}

int jobcfg_line(const job_config *j, const char *section, const char *key)
{
    const opts_def *o = opts_find(opts, NOPTS, section, key);
    return o ? j->key_line[o - opts] : 0;
}

/* "FILE:LINE: [section] key: why", or "FILE: [section] key: why" when the
 * key was not in the file (a missing required key). */
static int complain(const parse_ctx *p, const char *section, const char *key, char *err, size_t err_len,
                    const char *why)
{
    char where[PATH_MAX + 64];
    snprintf(err, err_len, "%s: %s", jobcfg_where(p->j, section, key, where, sizeof where), why);
    return -1;
}

const char *jobcfg_name_problem(const char *name)
{
    if (!name[0])
        return "is empty";
    if (!utf8_valid(name))
        return "is not valid UTF-8";
    /* C0 and C1 controls and DEL: terminals act on them; bidi controls make
     * what follows read in another order (utf8_unsafe_cp). */
    const unsigned char *s = (const unsigned char *)name;
    for (size_t i = 0, n = strlen(name); i < n;) {
        uint32_t cp;
        size_t k = utf8_decode(s + i, n - i, &cp);
        if (utf8_unsafe_cp(cp))
            return cp <= 0x9f ? "contains a control character" : "contains a bidi control or line separator";
        i += k;
    }
    return NULL;
}

/* Drop "." and "name/.." components, so that paths shown to people read
 * like paths ("/srv/runs/x", not "/srv/jobs/../runs/./x").  Lexical only:
 * symlinks are left to the kernel. */
static void normalize(char *path)
{
    char *out = path;
    bool abs = *path == '/';
    char *stack[PATH_MAX / 2];
    int depth = 0;
    char buf[PATH_MAX];
    size_t n = 0;
    snprintf(buf, sizeof buf, "%s", path);
    for (char *save = NULL, *c = strtok_r(buf, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
        if (strcmp(c, ".") == 0)
            continue;
        if (strcmp(c, "..") == 0 && depth > 0 && strcmp(stack[depth - 1], "..") != 0) {
            depth--;
            continue;
        }
        if (strcmp(c, "..") == 0 && depth == 0 && abs)
            continue; /* "/.." is "/" */
        stack[depth++] = c;
    }
    if (abs)
        out[n++] = '/';
    for (int i = 0; i < depth; i++) {
        size_t l = strlen(stack[i]);
        memcpy(out + n, stack[i], l);
        n += l;
        if (i + 1 < depth)
            out[n++] = '/';
    }
    if (n == 0)
        out[n++] = '.';
    out[n] = '\0';
}

/* Make a relative path absolute against the job file's directory. */
static int resolve(char *path, size_t len, const char *base_dir)
{
    if (!path[0])
        return 0;
    if (path[0] != '/') {
        char tmp[PATH_MAX];
        if ((size_t)snprintf(tmp, sizeof tmp, "%s/%s", base_dir, path) >= sizeof tmp || strlen(tmp) >= len)
            return -1;
        memcpy(path, tmp, strlen(tmp) + 1);
    }
    normalize(path);
    return 0;
}

static int parse_hidden(job_config *j)
{
    j->nhidden = 0;
    const char *s = j->hidden_text;
    if (!*s)
        return -1;
    while (*s) {
        char *end;
        errno = 0;
        unsigned long v = strtoul(s, &end, 10);
        if (end == s || errno || v == 0 || v > 65536 || j->nhidden == JOBCFG_MAX_HIDDEN)
            return -1;
        j->hidden[j->nhidden++] = (uint32_t)v;
        while (*end == ' ')
            end++;
        if (*end == ',')
            end++;
        else if (*end)
            return -1;
        while (*end == ' ')
            end++;
        s = end;
    }
    return 0;
}

/* open(2), not access(2): access checks the real uid, and the daemon checks
 * with its filesystem identity switched to the job's owner (access.h); as
 * the service user, access() would ask whether *gradd* may read the file. */
static int check_readable(const parse_ctx *p, const char *key, const char *file, char *err, size_t err_len)
{
    if (!file[0])
        return 0;
    int fd = open(file, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd >= 0) {
        close(fd);
        return 0;
    }
    if (errno == ENOENT && p->j->inputs_later) {
        p->j->inputs_missing = true;
        return 0;
    }
    char why[PATH_MAX + 64];
    snprintf(why, sizeof why, "cannot read %s: %s", file, strerror(errno));
    return complain(p, "data", key, err, err_len, why);
}

/* ---- program jobs ------------------------------------------------------------- */

/* Keys that only gradd's engine reads: a program job may not set them,
 * and their defaults must not describe it (steps, a model type). */
static bool engine_only(const opts_def *o)
{
    static const char *const keys[] = {"memory.margin", "memory.grow_after", "memory.tune", "memory.recompute",
                                       "output.checkpoint_every", "output.log_every", "output.resume"};
    if (!strcmp(o->section, "model") || !strcmp(o->section, "data") || !strcmp(o->section, "train") ||
        !strcmp(o->section, "finetune"))
        return true;
    char full[64];
    snprintf(full, sizeof full, "%s.%s", o->section, o->key);
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!strcmp(full, keys[i]))
            return true;
    return false;
}

/* Each kind of job refuses the keys of the other, naming the first one
 * set (by line). */
static int check_kind_keys(parse_ctx *p, char *err, size_t err_len)
{
    job_config *j = p->j;
    bool program = j->type == JOBCFG_PROGRAM;
    const opts_def *first = NULL;
    int first_line = 0;
    for (size_t i = 0; i < NOPTS; i++) {
        int line = j->key_line[i];
        bool foreign = program ? engine_only(&opts[i]) : !strcmp(opts[i].section, "program");
        if (line && foreign && (!first || line < first_line)) {
            first = &opts[i];
            first_line = line;
        }
    }
    if (!first)
        return 0;
    char why[160];
    if (program)
        snprintf(why, sizeof why, "is for gradd's own training; a job with [job] type = program may not set it");
    else
        snprintf(why, sizeof why, "is for [job] type = program, and this job's type is engine");
    return complain(p, first->section, first->key, err, err_len, why);
}

/* The characters of an environment variable's name, as sh accepts them. */
static bool env_name_ok(const char *s, size_t n)
{
    if (n == 0 || (s[0] >= '0' && s[0] <= '9'))
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
            return false;
    }
    return true;
}

int jobcfg_check_env(const char *env, char *why, size_t why_len)
{
    static const char *const reserved[] = {"CUDA_VISIBLE_DEVICES",     "GRADD_JOB_ID",        "GRADD_SOCKET",
                                           "GRADD_POOL_FD",            "GRADD_POOL_EVENTFD",  "GRADD_ALLOC_LIB",
                                           "GRADD_ALLOC_BACKEND",      "GRADD_ALLOC_CPU_CAPACITY",
                                           "GRADD_ALLOC_CPU_EXTERNAL", "GRADD_ALLOC_LIMIT"};
    char words[JOBCFG_COMMAND_MAX];
    int n = argsplit(env, words, sizeof words, why, why_len);
    if (n < 0)
        return -1;
    const char *w = words;
    for (int i = 0; i < n; i++, w = argsplit_next(w)) {
        const char *eq = strchr(w, '=');
        if (!eq || !env_name_ok(w, (size_t)(eq - w))) {
            snprintf(why, why_len, "'%.64s' is not NAME=VALUE with a NAME of letters, digits and _", w);
            return -1;
        }
        for (size_t r = 0; r < sizeof reserved / sizeof reserved[0]; r++)
            if (strlen(reserved[r]) == (size_t)(eq - w) && !strncmp(w, reserved[r], (size_t)(eq - w))) {
                snprintf(why, why_len, "%s is set by gradd for every program job", reserved[r]);
                return -1;
            }
    }
    return 0;
}

static int validate_program(parse_ctx *p, const char *dir, char *err, size_t err_len)
{
    job_config *j = p->j;
    for (size_t i = 0; i < NOPTS; i++)
        if (engine_only(&opts[i]))
            memset((char *)j + opts[i].offset, 0, opts[i].size);
    char words[JOBCFG_COMMAND_MAX], why[192];
    int n = argsplit(j->command, words, sizeof words, why, sizeof why);
    if (n < 0)
        return complain(p, "program", "command", err, err_len, why);
    if (n == 0)
        return complain(p, "program", "command", err, err_len, "is required for [job] type = program");
    if (jobcfg_check_env(j->env, why, sizeof why) != 0)
        return complain(p, "program", "env", err, err_len, why);
    if (!j->workdir[0])
        snprintf(j->workdir, sizeof j->workdir, "%s", dir);
    if (resolve(j->workdir, sizeof j->workdir, dir) != 0)
        return complain(p, "program", "workdir", err, err_len, "path is too long");
    if (resolve(j->out_dir, sizeof j->out_dir, dir) != 0)
        return complain(p, "output", "dir", err, err_len, "path is too long");
    return 0;
}

/* ---- the whole file ------------------------------------------------------------- */

/* [job] devices: "cpu0,cpu1" or "cuda:0, cuda:1": each once, at least
 * two, of one kind (a rank's kernels are its device's); device then names
 * the first. */
static int parse_devices(parse_ctx *p, char *err, size_t err_len)
{
    job_config *j = p->j;
    j->ndevices = 0;
    if (!j->devices[0])
        return 0;
    if (jobcfg_line(j, "job", "device"))
        return complain(p, "job", "devices", err, err_len, "give [job] device or devices, not both");
    if (j->type == JOBCFG_PROGRAM)
        return complain(p, "job", "devices", err, err_len,
                        "a program job runs on one device ([job] device); its own program may use more");
    char why[160];
    const char *s = j->devices;
    while (*s) {
        s += strspn(s, " \t");
        size_t len = strcspn(s, ",");
        while (len && (s[len - 1] == ' ' || s[len - 1] == '\t'))
            len--;
        char item[32];
        snprintf(item, sizeof item, "%.*s", (int)(len < 31 ? len : 31), s);
        const char *digits = strncmp(item, "cuda:", 5) == 0 ? item + 5 : strncmp(item, "cpu", 3) == 0 ? item + 3 : NULL;
        if (!digits || !*digits || strspn(digits, "0123456789") != strlen(digits) || strlen(digits) > 3 || len > 31) {
            snprintf(why, sizeof why, "'%s' is not a device: expected cpuN or cuda:N, comma-separated", item);
            return complain(p, "job", "devices", err, err_len, why);
        }
        if (j->ndevices == JOBCFG_MAX_DEVICES) {
            snprintf(why, sizeof why, "more than %d devices", JOBCFG_MAX_DEVICES);
            return complain(p, "job", "devices", err, err_len, why);
        }
        char id[16];
        snprintf(id, sizeof id, "%s%s", item[1] == 'u' ? "cuda" : "cpu", digits);
        for (int k = 0; k < j->ndevices; k++)
            if (!strcmp(j->device_ids[k], id)) {
                snprintf(why, sizeof why, "%s is named twice: a device takes one rank", item);
                return complain(p, "job", "devices", err, err_len, why);
            }
        if (j->ndevices && strncmp(j->device_ids[0], id, 3)) {
            snprintf(why, sizeof why, "%s and %s are of two kinds: the ranks of a job run on one kind", j->device_ids[0],
                     id);
            return complain(p, "job", "devices", err, err_len, why);
        }
        snprintf(j->device_ids[j->ndevices++], sizeof j->device_ids[0], "%s", id);
        if (j->ndevices == 1)
            snprintf(j->device, sizeof j->device, "%s", item);
        s += strcspn(s, ",");
        if (*s == ',')
            s++;
    }
    if (j->ndevices < 2) {
        snprintf(why, sizeof why, "%s", j->ndevices ? "one device: use [job] device" : "no device named");
        return complain(p, "job", "devices", err, err_len, why);
    }
    return 0;
}

static int validate(parse_ctx *p, const char *path, char *err, size_t err_len)
{
    job_config *j = p->j;
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    else
        snprintf(dir, sizeof dir, ".");

    bool named = j->name[0];
    if (!named) {
        const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        snprintf(j->name, sizeof j->name, "%.*s", (int)strcspn(base, "."), base);
        /* A long name cut inside a character: end it before that one. */
        size_t n = strlen(j->name);
        for (size_t k = 0; k < 3 && n && !utf8_valid(j->name) && ((unsigned char)j->name[n - 1] & 0x80); k++)
            j->name[--n] = '\0';
    }
    const char *bad = jobcfg_name_problem(j->name);
    if (bad) {
        char why[160];
        snprintf(why, sizeof why, "%s%s", bad, named ? "" : " (it is the file's name, as no name is set)");
        return complain(p, "job", "name", err, err_len, why);
    }
    const char *d = j->device;
    if (strcmp(d, "auto") && strncmp(d, "cpu", 3) && strncmp(d, "cuda:", 5))
        return complain(p, "job", "device", err, err_len, "expected auto, cpu, cpuN or cuda:N");
    if (parse_devices(p, err, err_len) != 0)
        return -1;
    if (check_kind_keys(p, err, err_len) != 0)
        return -1;
    char words[JOBCFG_COMMAND_MAX], why[192];
    if (argsplit(j->on_end, words, sizeof words, why, sizeof why) < 0)
        return complain(p, "job", "on_end", err, err_len, why);
    if (j->type == JOBCFG_PROGRAM)
        return validate_program(p, dir, err, err_len);

    if (strcmp(j->micro_text, "auto") == 0) {
        j->micro_batch = 0;
    } else {
        char *end;
        unsigned long v = strtoul(j->micro_text, &end, 10);
        if (end == j->micro_text || *end || v == 0 || v > j->batch)
            return complain(p, "train", "micro_batch", err, err_len,
                            "expected auto or a whole number from 1 to [train] batch");
        j->micro_batch = (uint32_t)v;
    }
    if (j->min_lr > j->lr)
        return complain(p, "train", "min_lr", err, err_len, "is above [train] lr");
    if (j->warmup > j->steps)
        return complain(p, "train", "warmup", err, err_len, "is longer than [train] steps");
    if (j->ft_method == JOBCFG_FT_FULL) {
        static const char *const lora_keys[] = {"rank", "alpha", "dropout", "targets", "merged"};
        for (size_t i = 0; i < sizeof lora_keys / sizeof lora_keys[0]; i++)
            if (jobcfg_line(j, "finetune", lora_keys[i]))
                return complain(p, "finetune", lora_keys[i], err, err_len, "is for method = lora or auto");
    }

    /* Whatever the model: which kinds use hidden, and so must have it
     * parse, is for gradd's models to say. */
    if (parse_hidden(j) != 0)
        j->nhidden = 0;

    if (!j->train[0])
        return complain(p, "data", "train", err, err_len, "is required");
    if (!j->out_dir[0])
        return complain(p, "output", "dir", err, err_len, "is required");
    static const char *const path_keys[] = {"train", "train_labels", "val", "val_labels"};
    char *paths[] = {j->train, j->train_labels, j->val, j->val_labels};
    if (resolve(j->from, sizeof j->from, dir) != 0)
        return complain(p, "model", "from", err, err_len, "path is too long");
    if (j->kv_heads && j->heads % j->kv_heads)
        return complain(p, "model", "kv_heads", err, err_len, "must divide [model] heads");
    for (size_t i = 0; i < 4; i++) {
        if (resolve(paths[i], PATH_MAX, dir) != 0)
            return complain(p, "data", path_keys[i], err, err_len, "path is too long");
        if (p->check_data && check_readable(p, path_keys[i], paths[i], err, err_len) != 0)
            return -1;
    }
    if (resolve(j->out_dir, sizeof j->out_dir, dir) != 0)
        return complain(p, "output", "dir", err, err_len, "path is too long");
    if (j->val_labels[0] && !j->val[0])
        return complain(p, "data", "val_labels", err, err_len, "needs [data] val, the images it labels");
    return 0;
}

/* Parse the stream f (standing for `path`) and validate. */
static int load_stream(FILE *f, const char *path, bool check_data, bool later, job_config *out, char *err,
                       size_t err_len)
{
    parse_ctx *p = calloc(1, sizeof *p);
    job_config *j = malloc(sizeof *j);
    if (!p || !j) {
        free(p);
        free(j);
        snprintf(err, err_len, "%s: out of memory", path);
        return -1;
    }
    jobcfg_defaults(j);
    snprintf(j->source, sizeof j->source, "%s", path);
    p->j = j;
    p->check_data = check_data;
    j->inputs_later = later;
    int rc = opts_parse_stream(f, path, on_entry, p, err, err_len);
    if (rc == 0)
        rc = validate(p, path, err, err_len);
    if (rc == 0)
        *out = *j;
    free(p);
    free(j);
    return rc;
}

int jobcfg_load(const char *path, job_config *out, char *err, size_t err_len)
{
    FILE *f = opts_open_file(path, err, err_len);
    if (!f)
        return -1;
    int rc = load_stream(f, path, true, false, out, err, err_len);
    fclose(f);
    return rc;
}

static int load_mem(const void *contents, size_t len, const char *path, bool check_data, bool later,
                    job_config *out, char *err, size_t err_len)
{
    FILE *f = fmemopen((void *)contents, len ? len : 1, "r");
    if (!f) {
        snprintf(err, err_len, "%s: cannot read: %s", path, strerror(errno));
        return -1;
    }
    if (len == 0)
        fgetc(f); /* fmemopen needs a size of at least 1: consume it, parse nothing */
    int rc = load_stream(f, path, check_data, later, out, err, err_len);
    fclose(f);
    return rc;
}

int jobcfg_load_mem(const void *contents, size_t len, const char *path, job_config *out, char *err,
                    size_t err_len)
{
    return load_mem(contents, len, path, true, false, out, err, err_len);
}

int jobcfg_load_later(const void *contents, size_t len, const char *path, job_config *out, char *err,
                      size_t err_len)
{
    return load_mem(contents, len, path, true, true, out, err, err_len);
}

int jobcfg_load_record(const void *contents, size_t len, const char *path, job_config *out, char *err,
                       size_t err_len)
{
    return load_mem(contents, len, path, false, false, out, err, err_len);
}
