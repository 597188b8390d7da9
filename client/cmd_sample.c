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

/* "1,2,3" into a new array: 0, or -1 on anything but whole numbers that
 * fit 32 bits separated by single commas. */
static int parse_ids(const char *s, uint32_t **out, size_t *n)
{
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    uint32_t *ids = malloc(cap * sizeof *ids);
    if (!ids)
        return -1;
    size_t k = 0;
    for (const char *p = s;; p++) {
        uint64_t v;
        char num[24];
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof num)
            break;
        memcpy(num, p, len);
        num[len] = '\0';
        if (num[0] < '0' || num[0] > '9' || parse_u64(num, &v) != 0 || v > UINT32_MAX)
            break;
        ids[k++] = (uint32_t)v;
        p += len;
        if (!*p) {
            *out = ids;
            *n = k;
            return 0;
        }
    }
    free(ids);
    return -1;
}

static int run(ctl *c, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"prompt", required_argument, NULL, 'p'},
        {"tokens", required_argument, NULL, 'n'},
        {"temperature", required_argument, NULL, 't'},
        {"seed", required_argument, NULL, 's'},
        {"prompt-ids", required_argument, NULL, 'i'},
        {NULL, 0, NULL, 0},
    };
    Gradd__SampleRequest sr = GRADD__SAMPLE_REQUEST__INIT;
    const char *prompt = "";
    const char *ids_text = NULL; /* --prompt-ids */
    uint32_t *ids = NULL;
    size_t nids = 0;
    int ch;
    while ((ch = ctl_getopt(c, argc, argv, "p:n:t:s:", longopts)) != -1) {
        uint64_t v;
        char *end;
        switch (ch) {
        case 'p':
            prompt = optarg;
            break;
        case 'i':
            ids_text = optarg;
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
    if (ids_text && *prompt)
        return ctl_usage(c, "--prompt and --prompt-ids: give the prompt one way");
    if (ids_text && parse_ids(ids_text, &ids, &nids) != 0)
        return ctl_usage(c, "--prompt-ids: '%s' is not token ids (whole numbers from 0 to %u, separated by commas)",
                         ids_text, UINT32_MAX);
    sr.prompt_ids = ids;
    sr.n_prompt_ids = nids;
    /* What precedes the text on stdout: the prompt, or a byte model's
     * prompt given by ids as those bytes. */
    char *shown = malloc(nids + 1);
    if (!shown) {
        free(ids);
        return ctl_usage(c, "out of memory");
    }
    for (size_t i = 0; i < nids; i++)
        shown[i] = ids[i] && ids[i] < 256 ? (char)ids[i] : '?';
    shown[nids] = '\0';
    if (nids)
        prompt = shown;

    Gradd__Response *resp;
    int rc = ctl_call(c, "sample", GRADD__REQUEST__BODY_SAMPLE, &sr, &resp);
    if (rc != CTL_OK) {
        free(ids);
        free(shown);
        return rc;
    }
    const Gradd__SampleResponse *s = resp->sample;
    /* Valid UTF-8 for the terminal and JSON alike. */
    char *text = jout_utf8(s->text.data, s->text.len);
    if (c->json) {
        json_t *tids = json_array();
        for (size_t i = 0; i < s->n_token_ids; i++)
            json_array_append_new(tids, jout_uint(s->token_ids[i]));
        json_t *pids = json_array();
        for (size_t i = 0; i < nids; i++)
            json_array_append_new(pids, jout_uint(ids[i]));
        rc = jout_print(json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "id", jout_uint(sr.id),
                                  "model_path", jout_str(s->model_path), "step", jout_uint(s->step), "vocab",
                                  jout_uint(s->vocab), "seed", jout_uint(s->seed), "elapsed_s",
                                  jout_real(s->elapsed_s), "prompt", jout_str(nids ? "" : prompt), "prompt_ids", pids,
                                  "text", jout_str(text), "token_ids", tids));
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
            /* Not bytes: the ids, for the user's own tokenizer, as
             * --prompt-ids takes them. */
            for (size_t i = 0; i < s->n_token_ids; i++)
                printf("%s%u", i ? "," : "", s->token_ids[i]);
            putchar('\n');
        }
    }
    free(ids);
    free(shown);
    free(text);
    ctl_free(resp);
    fflush(stdout);
    return rc;
}

const ctl_cmd cmd_sample = {
    .name = "sample",
    .args = "ID [--prompt TEXT | --prompt-ids I,J,...] [--tokens N] [--temperature T] [--seed S]",
    .summary = "generate text from a GPT job's model (or its latest checkpoint)",
    .run = run,
};
