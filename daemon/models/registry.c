/* registry.c — the model kinds gradd trains, and the questions the rest of
 * gradd asks about a job's model.
 *
 * A new kind is a file in models/ that defines its model_kind, and one
 * line in each of the two lists below.
 */
#include "model.h"
#include "lora.h"

#include <stdio.h>
#include <string.h>

extern const model_kind model_kind_mlp;
extern const model_kind model_kind_gpt;
extern const model_kind model_kind_llama;
/* model_llama.c: a file that sets a llama-only key for another kind is refused. */
int model_llama_keys_refuse(const job_config *j, const model_kind *kind, char *err, size_t err_len);

/* In this order in messages ("'x' is not one of mlp|gpt|llama"). */
static const model_kind *const kinds[] = {
    &model_kind_mlp,
    &model_kind_gpt,
    &model_kind_llama,
};
#define NKINDS (sizeof kinds / sizeof kinds[0])

const model_kind *const *model_kinds(size_t *n)
{
    *n = NKINDS;
    return kinds;
}

/* The kind whose name is the first len bytes of name. */
static const model_kind *find(const char *name, size_t len)
{
    for (size_t i = 0; i < NKINDS; i++)
        if (strlen(kinds[i]->name) == len && strncmp(kinds[i]->name, name, len) == 0)
            return kinds[i];
    return NULL;
}

/* The names of the kinds that generate (generating) or of all, joined by
 * sep. */
static const char *names(char *buf, size_t len, const char *sep, bool generating)
{
    size_t at = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < NKINDS && at < len; i++)
        if (!generating || kinds[i]->generates)
            at += (size_t)snprintf(buf + at, len - at, "%s%s", at ? sep : "", kinds[i]->name);
    return buf;
}

const model_kind *model_kind_of(const job_config *j)
{
    return find(j->model, strlen(j->model));
}

const model_kind *model_kind_need(const job_config *j, char *err, size_t err_len)
{
    const model_kind *kind = model_kind_of(j);
    if (!kind) {
        char why[160], all[96];
        snprintf(why, sizeof why, "'%s' is not one of %s", j->model, names(all, sizeof all, "|", false));
        model_job_error(j, "model", "type", why, err, err_len);
    }
    return kind;
}

const char *model_unit(const job_config *j)
{
    const model_kind *kind = model_kind_of(j);
    return kind ? kind->unit : "samples";
}

bool model_generates(const job_config *j)
{
    const model_kind *kind = model_kind_of(j);
    return kind && kind->generates;
}

int model_job_error(const job_config *j, const char *section, const char *key, const char *why, char *err,
                    size_t err_len)
{
    char where[PATH_MAX + 64];
    snprintf(err, err_len, "%s: %s", jobcfg_where(j, section, key, where, sizeof where), why);
    return -1;
}

const char *model_why_no_text(const job_config *j, char *buf, size_t len)
{
    const model_kind *kind = model_kind_of(j);
    char gen[96];
    names(gen, sizeof gen, " or ", true);
    /* A program job's model, if any, is the program's own. */
    if (j->type == JOBCFG_PROGRAM)
        snprintf(buf, len, "is a program job: its model is the program's, not one gradd trained; only %s jobs "
                 "generate text", gen);
    else
        snprintf(buf, len, "trains %s%s; only %s jobs generate text", kind ? kind->a_name : "a model of no known kind",
                 kind && kind->classifies ? " classifier" : "", gen);
    return buf;
}

/* [finetune] method = lora: a kind that offers it, and targets among its
 * layers, each named once. */
static int check_lora(const job_config *j, const model_kind *kind, char *err, size_t err_len)
{
    char why[512], list[256];
    size_t at = 0, offering = 0;
    list[0] = '\0';
    if (!kind->lora_targets) {
        for (size_t i = 0; i < NKINDS && at < sizeof list; i++)
            if (kinds[i]->lora_targets) {
                at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", at ? " or " : "", kinds[i]->name);
                offering++;
            }
        /* auto would fall back on what the kind does not have. */
        const char *as = j->ft_method == JOBCFG_FT_AUTO ? "auto may choose LoRA, but " : "";
        if (!offering)
            snprintf(why, sizeof why, "%s%s models offer no LoRA; no model of this gradd does", as, kind->name);
        else
            snprintf(why, sizeof why, "%s%s models offer no LoRA; %s %s", as, kind->name, list,
                     offering == 1 ? "does" : "do");
        return model_job_error(j, "finetune", "method", why, err, err_len);
    }
    unsigned bits;
    if (lora_parse_targets(kind, j->lora_targets, &bits, why, sizeof why) != 0)
        return model_job_error(j, "finetune", "targets", why, err, err_len);
    return 0;
}

/* Keys the kind has no use for: refused, rather than a model trained
 * other than the one the file describes. */
static int unused_keys_refuse(const job_config *j, const model_kind *kind, char *err, size_t err_len)
{
    static const char *const blocks[] = {"layers", "heads", "width", "context", "vocab"};
    char why[128];
    if (kind == &model_kind_mlp) {
        for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++)
            if (jobcfg_line(j, "model", blocks[i]))
                return model_job_error(j, "model", blocks[i],
                                       "is a gpt and llama key; an mlp has its layers in [model] hidden", err, err_len);
    } else if (jobcfg_line(j, "model", "hidden")) {
        snprintf(why, sizeof why, "is an mlp key; %s has [model] layers and width instead", kind->a_name);
        return model_job_error(j, "model", "hidden", why, err, err_len);
    }
    return 0;
}

int model_check_job(job_config *j, char *err, size_t err_len)
{
    /* A model that a job this one runs after will make: its keys are read
     * and checked when the job starts. */
    if (model_hf_later(j))
        return 0;
    if (model_hf_fill(j, err, err_len) != 0)
        return -1;
    const model_kind *kind = model_kind_need(j, err, err_len);
    if (!kind)
        return -1;
    if (kind != &model_kind_llama && model_llama_keys_refuse(j, kind, err, err_len) != 0)
        return -1;
    if (unused_keys_refuse(j, kind, err, err_len) != 0)
        return -1;
    if (j->ft_method != JOBCFG_FT_FULL && check_lora(j, kind, err, err_len) != 0)
        return -1;
    if (kind->check_job && kind->check_job(j, err, err_len) != 0)
        return -1;
    if (j->recompute == JOBCFG_RECOMPUTE_ON && !kind->recomputes) {
        char why[96];
        snprintf(why, sizeof why, "on, but %s has no transformer blocks to recompute", kind->a_name);
        return model_job_error(j, "memory", "recompute", why, err, err_len);
    }
    return model_hf_check(j, err, err_len);
}

int model_parse_line(const char *line, job_config *j, char *err, size_t err_len)
{
    const model_kind *kind = find(line, strcspn(line, " "));
    char gen[96];
    if (kind && !kind->generates) {
        snprintf(err, err_len, "%s ('%s'); only %s models generate text", kind->a_name, line,
                 names(gen, sizeof gen, " or ", true));
        return -1;
    }
    /* A line that names no kind: the first generating kind's parser says
     * what a line should look like. */
    for (size_t i = 0; !kind && i < NKINDS; i++)
        if (kinds[i]->generates)
            kind = kinds[i];
    if (!kind) {
        snprintf(err, err_len, "'%s': this gradd has no model that generates text", line);
        return -1;
    }
    snprintf(j->model, sizeof j->model, "%s", kind->name);
    return kind->parse(line, j, err, err_len);
}

void model_describe(const model *m, char *buf, size_t len)
{
    m->kind->describe(m, buf, len);
}
