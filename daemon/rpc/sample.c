/* sample.c — the sample request: text from the model a gpt job wrote.
 *
 * Loading the model and generating take seconds, so the request is
 * deferred work: rpc_sample checks it on the loop and fills in the inputs,
 * sample_run loads and generates in a thread of the server's pool, and
 * sample_done answers on the loop. */
#include "rpc_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/log.h"
#include "engine/sample.h"
#include "jobs/access.h"
#include "jobs/queue.h"
#include "models/model.h"
#include "units.h"

typedef struct {
    rpc_work base; /* first: the server holds &base */
    /* in, filled in by rpc_sample on the loop */
    uint32_t job;
    uid_t uid;
    gid_t gid;
    char out_dir[PATH_MAX];
    uint8_t *prompt;
    uint32_t *prompt_ids;
    sample_opts opts;
    uint64_t timeout_ms; /* [daemon] sample_timeout */
    uint64_t deadline_ns;
    char why_stop[160];
    /* out, filled in by sample_run */
    Gradd__Error__Code code; /* 0: ok */
    char err[1536];
    char path[PATH_MAX + 32];
    sample_output out;
    uint32_t vocab;
    uint64_t step;
    double elapsed_s;
} sample_op;

/* sample_opts.stop: a client that left (Ctrl-C in gradctl sample) or a
 * daemon that stops frees the slot within a token; so does the time limit,
 * counted from the start of the load. */
static const char *sample_stop(void *user)
{
    sample_op *op = user;
    if (atomic_load(&op->base.cancelled))
        return "cancelled: the client left or gradd is stopping";
    if (ctx_now_ns() < op->deadline_ns)
        return NULL;
    char limit[32];
    if (op->timeout_ms % 1000 == 0)
        units_format_duration((double)op->timeout_ms / 1e3, limit, sizeof limit);
    else
        snprintf(limit, sizeof limit, "%llums", (unsigned long long)op->timeout_ms);
    snprintf(op->why_stop, sizeof op->why_stop,
             "it ran longer than the daemon allows ([daemon] sample_timeout = %s); ask for fewer tokens", limit);
    return op->why_stop;
}

static void sample_run(rpc_work *w)
{
    sample_op *op = (sample_op *)w;
    uint64_t t0 = ctx_now_ns();
    op->deadline_ns = t0 + op->timeout_ms * 1000000ull;
    op->opts.stop = sample_stop;
    op->opts.stop_user = op;
    access_saved saved;
    char err[1024];
    /* The file is read as the user who asked (who is usually the owner):
     * the daemon reads nothing for a user that the user could not. */
    if (access_become(op->uid, op->gid, &saved, err, sizeof err) != 0) {
        op->code = GRADD__ERROR__CODE__PERMISSION_DENIED;
        snprintf(op->err, sizeof op->err, "%s", err);
        return;
    }
    sample_model *m = NULL;
    if (sample_pick_file(op->out_dir, op->path, sizeof op->path, err, sizeof err) != 0) {
        op->code = strstr(err, "ermission denied") ? GRADD__ERROR__CODE__PERMISSION_DENIED
                                                   : GRADD__ERROR__CODE__NOT_FOUND;
        snprintf(op->err, sizeof op->err, "job %u: %s", op->job, err);
    } else if (sample_load(op->path, op->opts.threads, &m, err, sizeof err) != 0) {
        op->code = GRADD__ERROR__CODE__BAD_REQUEST;
        snprintf(op->err, sizeof op->err, "job %u: %s", op->job, err);
    }
    access_restore(&saved);
    if (!m)
        return;
    op->vocab = sample_vocab(m);
    op->step = sample_step(m);
    if (sample_generate(m, &op->opts, &op->out, err, sizeof err) != 0) {
        op->code = GRADD__ERROR__CODE__BAD_REQUEST;
        snprintf(op->err, sizeof op->err, "sample: %s", err);
    }
    sample_free(m);
    op->elapsed_s = (double)(ctx_now_ns() - t0) / 1e9;
}

static void sample_op_free(sample_op *op)
{
    sample_output_free(&op->out);
    free(op->prompt);
    free(op->prompt_ids);
    free(op);
}

static void sample_done(rpc_work *w, const rpc_call *c, rpc_work_status status)
{
    sample_op *op = (sample_op *)w;
    if (status == RPC_WORK_UNSTARTED) {
        if (c)
            rpc_error(c, GRADD__ERROR__CODE__INTERNAL, "cannot start sampling");
        sample_op_free(op);
        return;
    }
    if (c) {
        if (status != RPC_WORK_RAN || op->code) {
            rpc_error(c, op->code ? op->code : GRADD__ERROR__CODE__INTERNAL,
                      op->code ? op->err : "sampling was cancelled");
        } else {
            Gradd__SampleResponse sr;
            gradd__sample_response__init(&sr);
            sr.text.data = op->out.text;
            sr.text.len = op->out.text ? op->out.n : 0;
            sr.n_token_ids = op->out.n;
            sr.token_ids = op->out.ids;
            sr.model_path = op->path;
            sr.step = op->step;
            sr.vocab = op->vocab;
            sr.seed = op->opts.seed;
            sr.elapsed_s = op->elapsed_s;
            RPC_SEND(c, SAMPLE, sample, &sr);
        }
    }
    log_job(LOG_INFO, op->job, NULL, "job %u: sampled %zu tokens for uid %u in %.2fs%s%s%s", op->job, op->out.n,
            (unsigned)op->uid, op->elapsed_s, op->code ? ": " : "", op->code ? op->err : "",
            c ? "" : " (the client left)");
    sample_op_free(op);
}

rpc_work *rpc_sample(const rpc_call *c, const Gradd__Request *req)
{
    const Gradd__SampleRequest *rq = req->sample;
    gradd_ctx *ctx = c->ctx;
    char msg[PATH_MAX + 256];
    Gradd__Error__Code code = GRADD__ERROR__CODE__BAD_REQUEST;
    msg[0] = '\0';
    double temp = rq->has_temperature ? rq->temperature : SAMPLE_DEFAULT_TEMPERATURE;
    /* Samples generated at once are the server's work slots: each holds a
     * thread and a CPU core for a few seconds.  More are refused, not
     * queued. */
    if (rq->tokens > SAMPLE_MAX_TOKENS)
        snprintf(msg, sizeof msg, "sample: tokens: %u is more than %d", rq->tokens, SAMPLE_MAX_TOKENS);
    else if (!(temp >= 0) || temp > 100)
        snprintf(msg, sizeof msg, "sample: temperature: %g is not between 0 and 100", temp);
    else if (c->work_pending)
        snprintf(msg, sizeof msg, "sample: this connection is already waiting for one"), code = GRADD__ERROR__CODE__UNAVAILABLE;
    else if (c->work_running >= c->work_slots)
        snprintf(msg, sizeof msg, "sample: %d samples are being generated; try again shortly", c->work_slots),
            code = GRADD__ERROR__CODE__UNAVAILABLE;
    else if (!ctx->q)
        snprintf(msg, sizeof msg, "this gradd has no job queue"), code = GRADD__ERROR__CODE__UNAVAILABLE;
    sample_op *op = msg[0] ? NULL : calloc(1, sizeof *op);
    if (!msg[0] && (!op || !(op->prompt = malloc(rq->prompt.len ? rq->prompt.len : 1)) ||
                    !(op->prompt_ids = malloc(rq->n_prompt_ids ? rq->n_prompt_ids * sizeof(uint32_t) : 1)))) {
        snprintf(msg, sizeof msg, "out of memory");
        code = GRADD__ERROR__CODE__INTERNAL;
    }
    if (!msg[0]) {
        pthread_mutex_lock(&ctx->q->lock);
        job *j = queue_find(ctx->q, rq->id);
        if (!j) {
            snprintf(msg, sizeof msg, "no job %u", rq->id);
            code = GRADD__ERROR__CODE__NOT_FOUND;
        } else if (j->cfg_unread) {
            snprintf(msg, sizeof msg,
                     "job %u (%s): its job file could not be read when gradd started (the log says why), so "
                     "its model is unknown",
                     j->id, j->name);
        } else if (!model_generates(&j->cfg)) {
            char why[160];
            snprintf(msg, sizeof msg, "job %u (%s) %s", j->id, j->name, model_why_no_text(&j->cfg, why, sizeof why));
        } else {
            snprintf(op->out_dir, sizeof op->out_dir, "%s", j->cfg.out_dir);
        }
        pthread_mutex_unlock(&ctx->q->lock);
    }
    if (msg[0]) {
        if (op) {
            free(op->prompt);
            free(op->prompt_ids);
        }
        free(op);
        rpc_error(c, code, msg);
        return NULL;
    }
    op->base.run = sample_run;
    op->base.done = sample_done;
    op->job = rq->id;
    op->uid = c->peer->uid;
    op->gid = c->peer->gid;
    if (rq->prompt.len)
        memcpy(op->prompt, rq->prompt.data, rq->prompt.len);
    op->opts.prompt = op->prompt;
    op->opts.prompt_len = rq->prompt.len;
    if (rq->n_prompt_ids)
        memcpy(op->prompt_ids, rq->prompt_ids, rq->n_prompt_ids * sizeof(uint32_t));
    op->opts.prompt_ids = op->prompt_ids;
    op->opts.prompt_ids_len = rq->n_prompt_ids;
    op->opts.tokens = rq->tokens ? rq->tokens : SAMPLE_DEFAULT_TOKENS;
    op->opts.temperature = temp;
    op->opts.seed = rq->seed;
    /* Without a seed, a fresh one, reported back so the text can be had again. */
    if (!rq->has_seed && getrandom(&op->opts.seed, sizeof op->opts.seed, GRND_NONBLOCK) != sizeof op->opts.seed)
        op->opts.seed = ctx_now_ns() ^ ((uint64_t)c->peer->pid << 32);
    /* One core: training jobs keep the rest. */
    op->opts.threads = 1;
    op->timeout_ms = ctx->cfg.sample_timeout_ms;
    return &op->base;
}
