/* test_jobcfg.c — job files: values, relative paths, and errors that name
 * file, line, section and key, as gradd reads them: jobcfg's parse, then
 * the checks of the job's model (model_check_job). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "jobcfg.h"
#include "models/model.h"

static char dir[64], path[128];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/gradd-jobcfg-XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    char data[128];
    snprintf(data, sizeof data, "%s/corpus.txt", dir);
    FILE *f = fopen(data, "w");
    fputs("hello world\n", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/job.cfg", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd);
}

static void write_job(const char *text)
{
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

/* A job file as `gradd run` and submit read it: parsed, then checked for
 * its model.  0 with *out set, or -1 with err (and *out untouched). */
static int load(const char *file, job_config *out, char *err, size_t err_len)
{
    static job_config j;
    if (jobcfg_load(file, &j, err, err_len) != 0 ||
        (j.type == JOBCFG_ENGINE && model_check_job(&j, err, err_len) != 0))
        return -1;
    *out = j;
    return 0;
}

static void expect_error(const char *text, const char *want)
{
    write_job(text);
    job_config j;
    memset(&j, 0x5A, sizeof j);
    char err[1024];
    assert_int_equal(load(path, &j, err, sizeof err), -1);
    char full[1200];
    snprintf(full, sizeof full, "%s%s", path, want);
    if (strncmp(err, full, strlen(full)) != 0)
        fail_msg("got '%s', want prefix '%s'", err, full);
    unsigned char *b = (unsigned char *)&j;
    for (size_t i = 0; i < sizeof j; i++)
        if (b[i] != 0x5A)
            fail_msg("job_config changed at byte %zu on a failed load", i);
}

#define GPT_HEAD "[model]\ntype = gpt\n[data]\ntrain = corpus.txt\n[output]\ndir = out\n"

static void test_values_and_relative_paths(void **state)
{
    (void)state;
    write_job("[job]\nname = tiny\npriority = 5\n"
              "[model]\ntype = gpt\nlayers = 3\nheads = 2\nwidth = 48\ncontext = 32\n"
              "[data]\nformat = text\ntrain = corpus.txt\nval_fraction = 0.1\n"
              "[train]\nsteps = 10\nbatch = 16\nmicro_batch = 5\nlr = 6e-4\nwarmup = 2\nprecision = fp32\n"
              "[memory]\nlimit = 512M\n"
              "[output]\ndir = ./x/../runs/tiny/\ncheckpoint_every = 5\n");
    job_config j;
    char err[1024];
    if (load(path, &j, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_string_equal(j.name, "tiny");
    assert_int_equal(j.priority, 5);
    assert_string_equal(j.model, "gpt");
    assert_int_equal(j.layers, 3);
    assert_int_equal(j.micro_batch, 5);
    assert_int_equal(j.mem_limit, 512u << 20);
    assert_true(j.lr == 6e-4);
    char want[256];
    snprintf(want, sizeof want, "%s/corpus.txt", dir);
    assert_string_equal(j.train, want);
    snprintf(want, sizeof want, "%s/runs/tiny", dir);
    assert_string_equal(j.out_dir, want);

    write_job("[model]\ntype = mlp\nhidden = 256, 128\n[data]\nformat = idx\ntrain = corpus.txt\n"
              "train_labels = corpus.txt\n[output]\ndir = /tmp/x\n");
    if (load(path, &j, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(j.nhidden, 2);
    assert_int_equal(j.hidden[0], 256);
    assert_int_equal(j.hidden[1], 128);
    assert_int_equal(j.micro_batch, 0); /* auto */
    assert_true(j.tune);                /* [memory] tune defaults to on */
    assert_string_equal(j.out_dir, "/tmp/x");

    write_job("[model]\ntype = mlp\n[data]\nformat = idx\ntrain = corpus.txt\ntrain_labels = corpus.txt\n"
              "[memory]\ntune = off\n[output]\ndir = /tmp/x\n");
    if (load(path, &j, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_false(j.tune);
    assert_string_equal(j.name, "job"); /* from the file name */
}

static void test_errors(void **state)
{
    (void)state;
    expect_error(GPT_HEAD "[train]\nsteps = 10\nlearning_rate = 1\n", ":9: [train] learning_rate: unknown key");
    expect_error(GPT_HEAD "[optimizer]\nlr = 1\n", ":8: [optimizer]: unknown section");
    expect_error(GPT_HEAD "[train]\nbatch = sixteen\n", ":8: [train] batch: 'sixteen' is not a whole number");
    expect_error(GPT_HEAD "[train]\nprecision = fp8\n", ":8: [train] precision: 'fp8' is not one of fp32|bf16|fp16");
    expect_error(GPT_HEAD "[train]\nbatch = 8\nmicro_batch = 9\n", ":9: [train] micro_batch: expected auto or");
    expect_error(GPT_HEAD "[memory]\ntune = fast\n", ":8: [memory] tune: 'fast' is not a boolean");
    expect_error(GPT_HEAD "[train]\nsteps = 10\nwarmup = 20\n", ":9: [train] warmup: is longer than");
    expect_error("[model]\ntype = gpt\nwidth = 64\nheads = 5\n[data]\ntrain = corpus.txt\n[output]\ndir = o\n",
                 ":4: [model] heads: must divide [model] width");
    expect_error("[model]\ntype = gpt\n[data]\ntrain = missing.txt\n[output]\ndir = o\n",
                 ":4: [data] train: cannot read");
    expect_error("[model]\ntype = gpt\n[output]\ndir = o\n", ": [data] train: is required");
    expect_error("[model]\ntype = gpt\n[data]\ntrain = corpus.txt\n", ": [output] dir: is required");
    expect_error("[model]\ntype = mlp\nhidden = 128,,64\n[data]\ntrain = corpus.txt\n[output]\ndir = o\n",
                 ":3: [model] hidden: expected up to 8");
    expect_error("[model]\ntype = mlp\n[data]\nformat = text\ntrain = corpus.txt\n[output]\ndir = o\n",
                 ":4: [data] format: an mlp trains on idx or npy images");
    expect_error("[model]\ntype = mlp\n[data]\ntrain = corpus.txt\n[output]\ndir = o\n",
                 ": [data] train_labels: is required for an mlp");
    expect_error("[model]\ntype = mlp\n[data]\nformat = idx\ntrain = corpus.txt\ntrain_labels = corpus.txt\n"
                 "val = corpus.txt\n[output]\ndir = o\n",
                 ": [data] val_labels: is required for an mlp when val is set");
    /* jobcfg takes any type (gradctl cannot know a daemon's models); the
     * model checks name the ones there are. */
    expect_error("[model]\ntype = rnn\n[data]\ntrain = corpus.txt\n[output]\ndir = o\n",
                 ":2: [model] type: 'rnn' is not one of mlp|gpt");
    expect_error("[job]\ndevice = gpu0\n" GPT_HEAD, ":2: [job] device: expected auto, cpu, cpuN or cuda:N");
    /* [job] devices: a list of at least two, each once, of one kind. */
    expect_error("[job]\ndevices = cpu0,gpu1\n" GPT_HEAD, ":2: [job] devices: 'gpu1' is not a device");
    expect_error("[job]\ndevices = cpu0, cpu0\n" GPT_HEAD, ":2: [job] devices: cpu0 is named twice");
    expect_error("[job]\ndevices = cuda:0,cpu1\n" GPT_HEAD, ":2: [job] devices: cuda0 and cpu1 are of two kinds");
    expect_error("[job]\ndevices = cuda:3\n" GPT_HEAD, ":2: [job] devices: one device: use [job] device");
    expect_error("[job]\ndevices = ,\n" GPT_HEAD, ":2: [job] devices: '' is not a device");
    expect_error("[job]\nallreduce_bucket = lots\n" GPT_HEAD, ":2: [job] allreduce_bucket");
    expect_error("[job]\ndevice = cpu0\ndevices = cpu0,cpu1\n" GPT_HEAD,
                 ":3: [job] devices: give [job] device or devices, not both");
    expect_error(GPT_HEAD "[train]\nlr = 1\nlr = 2\n", ":9: [train] lr: given twice (first on line 8)");
    /* A section is checked with no key in it too; a known one may be empty. */
    expect_error("[bogus]\n" GPT_HEAD, ":1: [bogus]: unknown section (known: job, model,");
    /* Two keys that go together: at the line of the one given. */
    expect_error("[model]\ntype = mlp\n[data]\nformat = idx\ntrain = corpus.txt\ntrain_labels = corpus.txt\n"
                 "val_labels = corpus.txt\n"
                 "[output]\ndir = o\n",
                 ":7: [data] val_labels: needs [data] val, the images it labels");
    {
        job_config j;
        char err[512];
        write_job(GPT_HEAD "[memory]\n[finetune]\n");
        assert_int_equal(load(path, &j, err, sizeof err), 0);
    }
    expect_error("[model]\ntype = gpt\nvocab = 1048577\n" "[data]\ntrain = corpus.txt\n[output]\ndir = o\n",
                 ":3: [model] vocab: ");
    expect_error("[model]\ntype = mlp\nhidden =\n[data]\ntrain = corpus.txt\n[output]\ndir = o\n",
                 ":3: [model] hidden: expected up to 8");
    /* Found by fuzzing: a NUL byte must not end the value early. */
    {
        FILE *f = fopen(path, "wb");
        fwrite("[model]\ntype = gpt\nlayers = 2\0junk\n", 1, 35, f);
        fclose(f);
        job_config j;
        char err[512];
        assert_int_equal(jobcfg_load(path, &j, err, sizeof err), -1);
        assert_non_null(strstr(err, ":3: line contains a NUL byte"));
        /* On the last line, with no newline after it, too. */
        f = fopen(path, "wb");
        fwrite("[model]\ntype = gpt\nlayers = 2\0", 1, 31, f);
        fclose(f);
        assert_int_equal(jobcfg_load(path, &j, err, sizeof err), -1);
        assert_non_null(strstr(err, ":3: line contains a NUL byte"));
    }
    /* Nothing that would block the open or never end. */
    {
        char fifo[] = "/tmp/gradd-jobcfg-fifo-XXXXXX";
        assert_non_null(mkdtemp(fifo));
        char fpath[64];
        snprintf(fpath, sizeof fpath, "%s/job.cfg", fifo);
        assert_int_equal(mkfifo(fpath, 0600), 0);
        job_config j;
        char err[512];
        const char *paths[] = {fpath, "/dev/zero", fifo};
        for (size_t i = 0; i < 3; i++) {
            assert_int_equal(jobcfg_load(paths[i], &j, err, sizeof err), -1);
            assert_non_null(strstr(err, ": not a regular file"));
        }
        unlink(fpath);
        rmdir(fifo);
    }
}

/* [finetune] method = lora: a kind without lora_targets is refused naming
 * the kinds that offer it (from the registry), and each targets word must
 * be one of the kind's layers, once.  The kinds are the registry's, not
 * named here but for llama, which offers LoRA. */
#define LLAMA_HEAD                                                                                  \
    "[model]\ntype = llama\nlayers = 1\nheads = 2\nwidth = 16\nmlp_width = 32\ncontext = 8\nvocab = 256\n" \
    "[data]\nformat = text\ntrain = corpus.txt\n[output]\ndir = out\n"
static void test_lora(void **state)
{
    (void)state;
    size_t n;
    const model_kind *const *kinds = model_kinds(&n);
    const model_kind *llama = NULL;
    char offering[128] = "";
    size_t at = 0, count = 0;
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(kinds[i]->name, "llama"))
            llama = kinds[i];
        if (kinds[i]->lora_targets) {
            at += (size_t)snprintf(offering + at, sizeof offering - at, "%s%s", at ? " or " : "", kinds[i]->name);
            count++;
        }
    }
    assert_non_null(llama);
    assert_non_null(llama->lora_targets);
    char want[512];
    for (size_t i = 0; i < n; i++) {
        if (kinds[i]->lora_targets)
            continue;
        char text[512];
        snprintf(text, sizeof text,
                 "[model]\ntype = %s\n[data]\ntrain = corpus.txt\n[output]\ndir = o\n[finetune]\nmethod = lora\n",
                 kinds[i]->name);
        snprintf(want, sizeof want, ":8: [finetune] method: %s models offer no LoRA; %s %s", kinds[i]->name,
                 offering, count == 1 ? "does" : "do");
        expect_error(text, want);
        snprintf(text, sizeof text,
                 "[model]\ntype = %s\n[data]\ntrain = corpus.txt\n[output]\ndir = o\n[finetune]\nmethod = auto\n",
                 kinds[i]->name);
        snprintf(want, sizeof want, ":8: [finetune] method: auto may choose LoRA, but %s models offer no LoRA",
                 kinds[i]->name);
        expect_error(text, want);
    }
    /* The list of a kind's layers, as the message gives it. */
    char list[256] = "";
    at = 0;
    for (size_t t = 0; llama->lora_targets[t]; t++)
        at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", t ? ", " : "", llama->lora_targets[t]);
    snprintf(want, sizeof want, ":16: [finetune] targets: 'q_prj' is not one of %s", list);
    expect_error(LLAMA_HEAD "[finetune]\nmethod = lora\ntargets = q_proj,q_prj\n", want);
    expect_error(LLAMA_HEAD "[finetune]\nmethod = lora\ntargets = v_proj, q_proj,v_proj\n",
                 ":16: [finetune] targets: 'v_proj' is named twice");
    expect_error(LLAMA_HEAD "[finetune]\nmethod = lora\ntargets = q_proj,,v_proj\n",
                 ":16: [finetune] targets: '' is not one of");
    /* Every layer the kind offers, in any order and with spaces, passes. */
    char text[1024];
    at = (size_t)snprintf(text, sizeof text, LLAMA_HEAD "[finetune]\nmethod = lora\nrank = 4\ntargets = ");
    for (size_t t = 0; llama->lora_targets[t]; t++)
        at += (size_t)snprintf(text + at, sizeof text - at, "%s %s", t ? "," : "", llama->lora_targets[t]);
    snprintf(text + at, sizeof text - at, "\n");
    write_job(text);
    job_config j;
    char err[1024];
    if (load(path, &j, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(j.ft_method, JOBCFG_FT_LORA);
    assert_int_equal(j.lora_rank, 4);
    /* The default targets: the kind's own. */
    write_job(LLAMA_HEAD "[finetune]\nmethod = lora\n");
    if (load(path, &j, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_true(j.lora_dropout == 0);
    /* Dropout: a rate below 1 (0.9 at most), and only for adapters. */
    write_job(LLAMA_HEAD "[finetune]\nmethod = lora\ndropout = 0.05\n");
    if (load(path, &j, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_true(j.lora_dropout == 0.05);
    expect_error(LLAMA_HEAD "[finetune]\nmethod = lora\ndropout = 1\n",
                 ":16: [finetune] dropout: '1' is not a number from 0 to 0.9");
    expect_error(LLAMA_HEAD "[finetune]\nmethod = lora\ndropout = -0.1\n",
                 ":16: [finetune] dropout: '-0.1' is not a number from 0 to 0.9");
    expect_error(LLAMA_HEAD "[finetune]\ndropout = 0.1\n", ":15: [finetune] dropout: is for method = lora or auto");
    /* auto takes LoRA's keys (for when it chooses adapters), checked alike. */
    write_job(LLAMA_HEAD "[finetune]\nmethod = auto\nrank = 4\ndropout = 0.1\ntargets = q_proj,o_proj\n");
    if (load(path, &j, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(j.ft_method, JOBCFG_FT_AUTO);
    expect_error(LLAMA_HEAD "[finetune]\nmethod = auto\ntargets = q_prj\n", ":16: [finetune] targets: 'q_prj'");
}

/* Every example in etc/jobs parses, and together they cover every model
 * and every precision (bf16 and fp16 on a GPU). */
static void test_program(void **state)
{
    (void)state;
    write_job("[job]\ntype = program\n[program]\ncommand = python3 'my train.py' --x\nworkdir = sub/..\n"
              "env = A=1 'B=two words'\ngrace = 2s\nrestart = on-failure\n[memory]\nlimit = 1G\n");
    job_config j;
    char err[1024];
    if (load(path, &j, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(j.type, JOBCFG_PROGRAM);
    assert_string_equal(j.command, "python3 'my train.py' --x");
    assert_string_equal(j.workdir, dir);
    assert_int_equal(j.grace_ms, 2000);
    assert_int_equal(j.restart, JOBCFG_RESTART_ON_FAILURE);
    assert_int_equal(j.mem_limit, 1u << 30);
    /* No engine default describes it. */
    assert_int_equal(j.steps, 0);
    assert_int_equal(j.batch, 0);
    assert_string_equal(j.model, "");
    assert_string_equal(j.out_dir, "");
    write_job("[job]\ntype = program\n[program]\ncommand = true\n");
    if (load(path, &j, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(j.grace_ms, 30000);
    assert_int_equal(j.restart, JOBCFG_RESTART_NO);
    expect_error("[job]\ntype = program\n", ": [program] command: is required");
    expect_error("[job]\ntype = program\n[program]\ncommand = \"x\n", ":4: [program] command: unterminated");
    expect_error("[job]\ntype = program\n[program]\ncommand = x\n[memory]\ntune = off\n",
                 ":6: [memory] tune: is for gradd's own training");
    expect_error("[job]\ntype = program\n[model]\nlayers = 3\n[program]\ncommand = x\n[data]\ntrain = a\n",
                 ":4: [model] layers: is for gradd's own training");
    expect_error(GPT_HEAD "[program]\ngrace = 1s\n", ":8: [program] grace: is for [job] type = program");
    expect_error("[job]\ntype = program\n[program]\ncommand = x\nenv = A\n", ":5: [program] env: 'A' is not");
    expect_error("[job]\ntype = program\n[program]\ncommand = x\nenv = CUDA_VISIBLE_DEVICES=1\n",
                 ":5: [program] env: CUDA_VISIBLE_DEVICES is set by gradd");
}

static void test_examples(void **state)
{
    (void)state;
    const char *root = getenv("GRADD_SOURCE_ROOT");
    char pattern[PATH_MAX];
    snprintf(pattern, sizeof pattern, "%s/etc/jobs/*.cfg", root ? root : ".");
    glob_t g;
    assert_int_equal(glob(pattern, 0, NULL, &g), 0);
    bool seen_mlp = false, seen_gpt = false, seen_llama = false, seen_lora = false, seen_prec[3] = {false, false, false};
    /* An example that starts from another's result ([model] from its
     * output dir, as the LoRA one does) is read as a record where that
     * result is not there yet, and must name some example's dir. */
    static char outs[64][PATH_MAX], froms[64][PATH_MAX];
    size_t nout = 0, nfrom = 0;
    assert_true(g.gl_pathc <= 64);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        static job_config j;
        char err[1024];
        if (load(g.gl_pathv[i], &j, err, sizeof err) != 0) {
            FILE *f = fopen(g.gl_pathv[i], "r");
            static char text[1 << 16];
            size_t n = f ? fread(text, 1, sizeof text, f) : 0;
            if (f)
                fclose(f);
            if (!strstr(err, "[model] from") || jobcfg_load_record(text, n, g.gl_pathv[i], &j, err, sizeof err) != 0)
                fail_msg("%s", err);
            snprintf(froms[nfrom++], PATH_MAX, "%s", j.from);
        }
        if (j.type == JOBCFG_PROGRAM)
            continue;
        snprintf(outs[nout++], PATH_MAX, "%s", j.out_dir);
        seen_lora |= j.ft_method == JOBCFG_FT_LORA;
        seen_mlp |= strcmp(j.model, "mlp") == 0;
        seen_gpt |= strcmp(j.model, "gpt") == 0;
        seen_llama |= strcmp(j.model, "llama") == 0;
        seen_prec[j.precision] = true;
        /* Mixed precision exists only on CUDA: such examples must say so. */
        if (j.precision != JOBCFG_FP32 && strncmp(j.device, "cuda", 4) != 0)
            fail_msg("%s: precision %d on device '%s'", g.gl_pathv[i], j.precision, j.device);
    }
    globfree(&g);
    for (size_t i = 0; i < nfrom; i++) {
        bool made = false;
        for (size_t k = 0; k < nout; k++)
            made |= strcmp(froms[i], outs[k]) == 0;
        if (!made)
            fail_msg("[model] from %s is no example's output dir", froms[i]);
    }
    assert_true(seen_mlp && seen_gpt && seen_llama && seen_lora);
    assert_true(seen_prec[JOBCFG_FP32] && seen_prec[JOBCFG_BF16] && seen_prec[JOBCFG_FP16]);
}

/* [job] devices as the daemon takes it: ids in its form, in order, and
 * device naming the first as written. */
static void test_devices_list(void **state)
{
    (void)state;
    write_job("[job]\ndevices = cuda:1 , cuda:0,cuda:12\n" GPT_HEAD);
    static job_config j;
    char err[1024];
    assert_int_equal(load(path, &j, err, sizeof err), 0);
    assert_int_equal(j.ndevices, 3);
    assert_string_equal(j.device_ids[0], "cuda1");
    assert_string_equal(j.device_ids[1], "cuda0");
    assert_string_equal(j.device_ids[2], "cuda12");
    assert_string_equal(j.device, "cuda:1");
    /* PyTorch DDP's bucket size unless told. */
    assert_int_equal(j.allreduce_bucket, 25 << 20);
    write_job("[job]\nallreduce_bucket = 0\n" GPT_HEAD);
    assert_int_equal(load(path, &j, err, sizeof err), 0);
    assert_int_equal(j.ndevices, 0);
    assert_int_equal(j.allreduce_bucket, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_devices_list),
        cmocka_unit_test(test_values_and_relative_paths),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_program),
        cmocka_unit_test(test_lora),
        cmocka_unit_test(test_examples),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
