/* cmd_sample.c — gradctl sample: text from a GPT job's trained model.
 *
 * The daemon reads the job's model.safetensors (or, before the job ends,
 * its latest checkpoint) with the owner's file access and generates on the
 * CPU.  stdout gets the prompt and its continuation, nothing else, so the
 * text can be piped; which weights and seed were used goes to stderr.  A
 * byte model may write bytes that are not UTF-8 (half a character, early in
 * training): those print as U+FFFD, and --json has the exact token ids. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "jobfmt.h"
#include "table.h"

/* The daemon's limit (daemon/engine/sample.h), checked here too for a usage error
 * rather than a daemon error. */
#define SAMPLE_MAX_TOKENS 4096

static int parse_u64(const char *s, uint64_t *v)
{
    char *end;
    errno = 0;
    if (!*s || *s == '-')
        return -1;
    unsigned long long x = strtoull(s, &end, 10);
    if (*end || errno)
        return -1;
    *v = x;
    return 0;
}

static int run(ctl *c, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"prompt", required_argument, NULL, 'p'},
        {"tokens", required_argument, NULL, 'n'},
        {"temperature", required_argument, NULL, 't'},
        {"seed", required_argument, NULL, 's'},
        {NULL, 0, NULL, 0},
    };
    Gradd__SampleRequest sr = GRADD__SAMPLE_REQUEST__INIT;
    const char *prompt = "";
    int ch;
    while ((ch = ctl_getopt(c, argc, argv, "p:n:t:s:", longopts)) != -1) {
        uint64_t v;
        char *end;
        switch (ch) {
        case 'p':
            prompt = optarg;
            break;
        case 'n':
            if (parse_u64(optarg, &v) != 0 || v < 1 || v > SAMPLE_MAX_TOKENS)
                return ctl_usage(c, "--tokens: '%s' is not a whole number from 1 to %d", optarg,
                                 SAMPLE_MAX_TOKENS);
            sr.tokens = (uint32_t)v;
            break;
        case 't':
            errno = 0;
            sr.temperature = strtod(optarg, &end);
            if (!*optarg || *end || errno || !(sr.temperature >= 0) || sr.temperature > 100)
                return ctl_usage(c, "--temperature: '%s' is not a number from 0 to 100 (0: greedy)",
                                 optarg);
            sr.has_temperature = true;
            break;
        case 's':
            if (parse_u64(optarg, &v) != 0)
                return ctl_usage(c, "--seed: '%s' is not a whole number", optarg);
            sr.seed = v;
            sr.has_seed = true;
            break;
        default:
            return CTL_ERR_USAGE; /* ctl_getopt said why */
        }
    }
    if (optind != argc - 1)
        return ctl_usage(c, optind >= argc ? "a job id is required" : "expected one job id");
    if (jobfmt_parse_id(argv[optind], &sr.id) != 0)
        return ctl_usage(c, "'%s' is not a job id (a number, as `gradctl list` shows)", argv[optind]);
    sr.prompt.data = (uint8_t *)prompt;
    sr.prompt.len = strlen(prompt);

    Gradd__Response *resp;
    int rc = ctl_call(c, "sample", GRADD__REQUEST__BODY_SAMPLE, &sr, &resp);
    if (rc != CTL_OK)
        return rc;
    const Gradd__SampleResponse *s = resp->sample;
    /* Valid UTF-8 for the terminal and JSON alike. */
    char *text = jout_utf8(s->text.data, s->text.len);
    if (c->json) {
        json_t *ids = json_array();
        for (size_t i = 0; i < s->n_token_ids; i++)
            json_array_append_new(ids, jout_uint(s->token_ids[i]));
        rc = jout_print(json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "id", jout_uint(sr.id), "model_path",
                                  jout_str(s->model_path), "step", jout_uint(s->step), "vocab", jout_uint(s->vocab),
                                  "seed", jout_uint(s->seed), "elapsed_s", jout_real(s->elapsed_s), "prompt",
                                  jout_str(prompt), "text", jout_str(text), "token_ids", ids));
    } else {
        /* The model's path is the job's output dir: made safe to print. */
        fprintf(stderr, "# job %u: ", sr.id);
        table_puts(stderr, s->model_path);
        fprintf(stderr, " (step %" PRIu64 "), seed %" PRIu64 ", %zu tokens in %.2fs\n", s->step, s->seed,
                s->n_token_ids, s->elapsed_s);
        if (s->vocab == 256) {
            /* The model may have learnt escape sequences from its data. */
            table_put_text(stdout, prompt, strlen(prompt), TABLE_TEXT_LINES);
            table_put_text(stdout, text, strlen(text), TABLE_TEXT_LINES);
            if (!(s->text.len && s->text.data[s->text.len - 1] == '\n'))
                putchar('\n');
        } else {
            /* Not bytes: the ids, for the user's own tokenizer. */
            for (size_t i = 0; i < s->n_token_ids; i++)
                printf("%s%u", i ? " " : "", s->token_ids[i]);
            putchar('\n');
        }
    }
    free(text);
    ctl_free(resp);
    fflush(stdout);
    return rc;
}

const ctl_cmd cmd_sample = {
    .name = "sample",
    .args = "ID [--prompt TEXT] [--tokens N] [--temperature T] [--seed S]",
    .summary = "generate text from a GPT job's model (or its latest checkpoint)",
    .run = run,
};
