/* jobfmt.c — one job, shown the same way by every command. */
#include "jobfmt.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "units.h"

/* ---- the list -------------------------------------------------------------- */

int jobfmt_list_fetch(ctl *c, const char *user, const char *state, jobfmt_list *out)
{
    memset(out, 0, sizeof *out);
    Gradd__ListRequest lr = GRADD__LIST_REQUEST__INIT;
    lr.user = (char *)(user ? user : "");
    lr.state = (char *)(state ? state : "");
    Gradd__Response *resp;
    int rc = ctl_call(c, "list", GRADD__REQUEST__BODY_LIST, &lr, &resp);
    for (bool more = true; rc == CTL_OK && more;) {
        Gradd__Response **frames = realloc(out->frames, (out->nframes + 1) * sizeof *frames);
        const Gradd__JobInfo **jobs = realloc(out->jobs, (out->n + resp->list->n_jobs + 1) * sizeof *jobs);
        if (frames)
            out->frames = frames;
        if (jobs)
            out->jobs = jobs;
        if (!frames || !jobs) {
            ctl_free(resp);
            rc = ctl_error(c, CTL_ERR_DAEMON, "internal", NULL, "out of memory");
            break;
        }
        out->frames[out->nframes++] = resp;
        for (size_t i = 0; i < resp->list->n_jobs; i++)
            out->jobs[out->n++] = resp->list->jobs[i];
        more = resp->list->more;
        if (more)
            rc = ctl_next(c, &resp);
    }
    if (rc != CTL_OK)
        jobfmt_list_free(out);
    return rc;
}

void jobfmt_list_free(jobfmt_list *l)
{
    for (size_t i = 0; i < l->nframes; i++)
        ctl_free(l->frames[i]);
    free(l->frames);
    free(l->jobs);
    memset(l, 0, sizeof *l);
}

const char *const jobfmt_states[] = {"queued", "running", "completed", "failed", "cancelled", NULL};

bool jobfmt_state_valid(const char *state)
{
    for (const char *const *s = jobfmt_states; *s; s++)
        if (state && strcmp(state, *s) == 0)
            return true;
    return false;
}

bool jobfmt_state_final(const char *state)
{
    return state && (strcmp(state, "completed") == 0 || strcmp(state, "failed") == 0 ||
                     strcmp(state, "cancelled") == 0);
}

static bool is_state(const Gradd__JobInfo *j, const char *state)
{
    return j->state && strcmp(j->state, state) == 0;
}

bool jobfmt_is_program(const Gradd__JobInfo *j)
{
    return j->type && strcmp(j->type, "program") == 0;
}

double jobfmt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- arguments ------------------------------------------------------------ */

int jobfmt_parse_id(const char *text, uint32_t *id)
{
    if (!text || *text < '0' || *text > '9')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || *end || v == 0 || v > UINT32_MAX)
        return -1;
    *id = (uint32_t)v;
    return 0;
}

int jobfmt_id_arg(ctl *c, int argc, char **argv, uint32_t *id)
{
    if (optind >= argc)
        return ctl_usage(c, "a job id is required");
    if (optind + 1 < argc)
        return ctl_usage(c, "unexpected argument '%s'", argv[optind + 1]);
    if (jobfmt_parse_id(argv[optind], id) != 0)
        return ctl_usage(c, "'%s' is not a job id (a number, as `gradctl list` shows)", argv[optind]);
    return CTL_OK;
}

int jobfmt_id_call(ctl *c, int argc, char **argv, Gradd__Request__BodyCase body, uint32_t *id, Gradd__Response **out)
{
    *out = NULL;
    uint32_t v = 0;
    if (ctl_getopt(c, argc, argv, "", NULL) != -1)
        return CTL_ERR_USAGE; /* ctl_getopt said why */
    int rc = jobfmt_id_arg(c, argc, argv, &v);
    if (rc != CTL_OK)
        return rc;
    if (id)
        *id = v;
    /* JobRequest, CancelRequest, RemoveRequest, WatchRequest and
     * LogsRequest are each `uint32 id = 1` alone, so one piece of code makes
     * any of them from its descriptor: the message, then its one field. */
    const ProtobufCMessageDescriptor *d =
        protobuf_c_message_descriptor_get_field(&gradd__request__descriptor, (unsigned)body)->descriptor;
    Gradd__JobRequest m;
    assert(d->sizeof_message == sizeof m && d->n_fields == 1 && d->fields[0].type == PROTOBUF_C_TYPE_UINT32);
    protobuf_c_message_init(d, &m);
    memcpy((char *)&m + d->fields[0].offset, &v, sizeof v);
    return ctl_call(c, c->cmd->name, body, &m, out);
}

/* ---- pieces --------------------------------------------------------------- */

const char *jobfmt_loss(double loss, char *buf, size_t len)
{
    if (!isfinite(loss))
        snprintf(buf, len, "-");
    else
        snprintf(buf, len, "%.3f", loss);
    return buf;
}

/* The loss of the last step, or NaN before there was one: a daemon that
 * has not trained yet sends 0, which is not a loss. */
static double step_loss(const Gradd__JobInfo *j)
{
    return j->step > 0 ? j->loss : NAN;
}

const char *jobfmt_speed(const Gradd__JobInfo *j, char *buf, size_t len)
{
    double v = j->units_per_s;
    const char *unit = j->unit && *j->unit ? j->unit : "units";
    if (!isfinite(v) || v <= 0)
        snprintf(buf, len, "-");
    else if (v >= 1e9)
        snprintf(buf, len, "%.1fG %s/s", v / 1e9, unit);
    else if (v >= 1e6)
        snprintf(buf, len, "%.1fM %s/s", v / 1e6, unit);
    else if (v >= 1e3)
        snprintf(buf, len, "%.1fk %s/s", v / 1e3, unit);
    else if (v >= 10)
        snprintf(buf, len, "%.0f %s/s", v, unit);
    else
        snprintf(buf, len, "%.1f %s/s", v, unit);
    return buf;
}

const char *jobfmt_eta(const Gradd__JobInfo *j, char *buf, size_t len)
{
    if (j->steps > 0 && j->step >= j->steps)
        return units_format_duration(0, buf, len);
    if (j->step == 0 || !(j->elapsed_s > 0) || !isfinite(j->elapsed_s)) {
        snprintf(buf, len, "-");
        return buf;
    }
    double per_step = j->elapsed_s / (double)j->step;
    return units_format_duration(per_step * (double)(j->steps - j->step), buf, len);
}

const char *jobfmt_process(const Gradd__GpuProcess *p, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s", p->command && *p->command ? p->command : "?");
    for (size_t k = 0; k < p->n_jobs && n >= 0 && (size_t)n < len; k++)
        n += snprintf(buf + n, len - (size_t)n, "%s%u", k ? ", " : p->n_jobs > 1 ? " (jobs " : " (job ",
                      p->jobs[k]);
    if (p->n_jobs && n >= 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, ")");
    return buf;
}

const char *jobfmt_batch(const Gradd__JobInfo *j, char *buf, size_t len)
{
    char m[16], a[16];
    if (j->micro)
        snprintf(m, sizeof m, "%u", j->micro);
    else
        snprintf(m, sizeof m, "auto");
    if (j->accum)
        snprintf(a, sizeof a, "%u", j->accum);
    else
        snprintf(a, sizeof a, "-");
    snprintf(buf, len, "%s×%s", m, a);
    return buf;
}

static double percent(const Gradd__JobInfo *j)
{
    return j->steps ? 100.0 * (double)j->step / (double)j->steps : 0.0;
}

/* "2024-05-01 12:03:04" in local time, or "-" for a time not yet reached. */
static const char *local_time(double t, char *buf, size_t len)
{
    if (!(t > 0) || !isfinite(t)) {
        snprintf(buf, len, "-");
        return buf;
    }
    time_t s = (time_t)t;
    struct tm tm;
    if (!localtime_r(&s, &tm) || strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm) == 0)
        snprintf(buf, len, "%.0f", t);
    return buf;
}

/* ---- table row ------------------------------------------------------------ */

const char *const jobfmt_head[JOBFMT_COLS] = {
    ">ID", "USER", "NAME", "STATE", "DEVICE", ">STEP", ">LOSS", ">MICRO×ACC", ">SPEED", ">MEM", ">AGE",
    ">FIT", ">OOMS", "LAST CHANGE",
};

void jobfmt_row(table *t, const Gradd__JobInfo *j, double now)
{
    char loss[32], batch[48], speed[48], mem[16], age[32];
    table_cell(t, "%u", j->id);
    table_cell(t, "%s", j->user && *j->user ? j->user : "-");
    table_cell(t, "%s", j->name && *j->name ? j->name : "-");
    /* What keeps a queued job, where squeue puts its reason. */
    if (j->waiting && *j->waiting)
        table_cell(t, "%s (%s)", j->state, j->waiting);
    else
        table_cell(t, "%s", j->state && *j->state ? j->state : "-");
    table_cell(t, "%s", j->device && *j->device ? j->device : "-");
    /* A program's steps and batches are its own, unless it reports them. */
    bool program = jobfmt_is_program(j);
    if (program && j->micro)
        table_cell(t, "%llu", (unsigned long long)j->step);
    else if (program)
        table_cell(t, "-");
    else
        table_cell(t, "%llu/%llu", (unsigned long long)j->step, (unsigned long long)j->steps);
    table_cell(t, "%s", jobfmt_loss(step_loss(j), loss, sizeof loss));
    table_cell(t, "%s", program && !j->micro ? "-" : jobfmt_batch(j, batch, sizeof batch));
    table_cell(t, "%s", jobfmt_speed(j, speed, sizeof speed));
    table_cell(t, "%s", j->mem_allocated ? units_format_size(j->mem_allocated, mem, sizeof mem) : "-");
    if (j->submitted_at > 0)
        table_cell(t, "%s", units_format_duration(now - j->submitted_at, age, sizeof age));
    else
        table_cell(t, "-");
    /* The batch controller: FIT, the largest micro-batch found to fit
     * (micro_fit in JSON; where growth stops; status ID also shows
     * micro_max, what the budget now predicts),
     * OOMs survived, and the last change as "13->6 oom@9". */
    if (j->micro_fit)
        table_cell(t, "%u", j->micro_fit);
    else
        table_cell(t, "-");
    table_cell(t, "%llu", (unsigned long long)j->oom_recoveries);
    if (j->change_reason && *j->change_reason)
        table_cell(t, "%u->%u %s@%llu", j->change_from, j->change_to, j->change_reason,
                   (unsigned long long)j->change_step);
    else
        table_cell(t, "-");
}

/* ---- detail view ---------------------------------------------------------- */

#define LABEL "  %-11s "

/* "  LABEL       TEXT\n", TEXT made safe (it comes from the daemon). */
static void field(FILE *f, const char *label, const char *text)
{
    fprintf(f, LABEL, label);
    table_puts(f, text);
    fputc('\n', f);
}

/* Print text whose later lines (an OOM report, say) line up under the
 * first; each line made safe, the line breaks kept. */
static void indented(FILE *f, const char *label, const char *text)
{
    fprintf(f, LABEL, label);
    for (const char *p = text;;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        table_put_text(f, p, n, 0);
        fputc('\n', f);
        if (!nl || !nl[1])
            break;
        p = nl + 1;
        fprintf(f, LABEL, "");
    }
}

/* Its time limit, and while it may still run, what is left of it. */
static void time_limit(FILE *f, const Gradd__JobInfo *j)
{
    char a[64], b[64];
    if (!(j->time_limit_s > 0))
        return;
    units_format_duration(j->time_limit_s, a, sizeof a);
    if (is_state(j, "queued") || is_state(j, "running"))
        fprintf(f, LABEL "%s (%s left)\n", "time limit", a, units_format_duration(j->time_left_s, b, sizeof b));
    else
        fprintf(f, LABEL "%s\n", "time limit", a);
}

/* Its [job] on_end command, and how it went. */
static void on_end(FILE *f, const Gradd__JobInfo *j)
{
    if (!j->on_end || !*j->on_end)
        return;
    field(f, "on end", j->on_end);
    if (j->on_end_result && *j->on_end_result)
        field(f, "", j->on_end_result);
}

/* A program job's times: it has no steps, speed or batch of gradd's. */
/* The job's memory: held now and peak, then by tag.  A finished job holds
 * nothing; its peaks were kept when it ended. */
static void memory_lines(FILE *f, const Gradd__JobInfo *j)
{
    char a[64], b[64];
    if (j->mem_peak)
        fprintf(f, LABEL "%s (peak %s)\n", "memory", j->mem_allocated ? units_format_size(j->mem_allocated, a, sizeof a) : "-",
                units_format_size(j->mem_peak, b, sizeof b));
    else
        fprintf(f, LABEL "%s\n", "memory", j->mem_allocated ? units_format_size(j->mem_allocated, a, sizeof a) : "-");
    int w = 0;
    for (size_t i = 0; i < j->n_mem_tags; i++) {
        int l = j->mem_tags[i]->tag ? (int)strlen(j->mem_tags[i]->tag) : 0;
        if (l > w)
            w = l;
    }
    for (size_t i = 0; i < j->n_mem_tags; i++) {
        const Gradd__TagUsage *u = j->mem_tags[i];
        if (!u->allocated && !u->peak)
            continue;
        fprintf(f, LABEL "  %-*s %8s  (peak %s)\n", "", w, u->tag ? u->tag : "",
                units_format_size(u->allocated, a, sizeof a), units_format_size(u->peak, b, sizeof b));
    }
    /* Over several devices: the memory above is rank 0's; each one's part. */
    for (size_t i = 0; i < j->n_device_parts; i++) {
        const Gradd__DevicePart *u = j->device_parts[i];
        fprintf(f, LABEL "%-8s %8s  (peak %s)  rank %zu\n", i ? "" : "on each", u->device ? u->device : "",
                units_format_size(u->allocated, a, sizeof a), units_format_size(u->peak, b, sizeof b), i);
    }
}

static void program_times(FILE *f, const Gradd__JobInfo *j, double now)
{
    char a[64], b[64];
    if (j->submitted_at > 0)
        fprintf(f, LABEL "%s (%s ago)\n", "submitted", local_time(j->submitted_at, a, sizeof a),
                units_format_duration(now - j->submitted_at, b, sizeof b));
    fprintf(f, LABEL "%s\n", "started", local_time(j->started_at, a, sizeof a));
    fprintf(f, LABEL "%s\n", "finished", local_time(j->finished_at, a, sizeof a));
    time_limit(f, j);
    on_end(f, j);
    fprintf(f, LABEL "%u\n", "restarts", j->resumes);
    field(f, "out dir", j->out_dir && *j->out_dir ? j->out_dir : "-");
    fprintf(f, LABEL "%04o\n", "umask", (unsigned)j->umask);
    field(f, "job file", j->job_file && *j->job_file ? j->job_file : "-");
}

/* The micro-batch lines: the batch controller's, or what a program's own
 * micro-batching reported (python/gradd). */
static void batch_lines(FILE *f, const Gradd__JobInfo *j)
{
    char a[64];
    fprintf(f, LABEL "%s (micro-batch × accumulation)\n", "batch", jobfmt_batch(j, a, sizeof a));
    if (j->micro_max || j->micro_fit)
        fprintf(f, LABEL "predicted max %u, found to fit %u, oom recoveries %llu\n", "", j->micro_max,
                j->micro_fit, (unsigned long long)j->oom_recoveries);
    else if (j->oom_recoveries)
        fprintf(f, LABEL "oom recoveries %llu\n", "", (unsigned long long)j->oom_recoveries);
    if (j->change_reason && *j->change_reason) {
        fprintf(f, LABEL "%u → %u at step %llu (", "last change", j->change_from, j->change_to,
                (unsigned long long)j->change_step);
        table_puts(f, j->change_reason);
        fputs(")\n", f);
    }
    if (j->levers && *j->levers) {
        fprintf(f, LABEL, "levers");
        table_puts(f, j->levers);
        fputc('\n', f);
    }
}

void jobfmt_detail(FILE *f, const Gradd__JobInfo *j, double now)
{
    char a[64], b[64];
    fprintf(f, "job %u  ", j->id);
    table_puts(f, j->name && *j->name ? j->name : "(unnamed)");
    fprintf(f, "\n" LABEL, "user");
    table_puts(f, j->user && *j->user ? j->user : "?");
    fprintf(f, " (uid %u)\n", j->uid);
    field(f, "state", j->state && *j->state ? j->state : "?");
    if ((is_state(j, "failed") || is_state(j, "cancelled")) && j->reason && *j->reason)
        indented(f, "reason", j->reason);
    if (j->waiting && *j->waiting)
        field(f, "waiting", j->waiting);
    if (j->n_depends_on) {
        fprintf(f, LABEL, "after");
        for (size_t i = 0; i < j->n_depends_on; i++)
            fprintf(f, "%s%u", i ? ", " : "", j->depends_on[i]);
        fputc('\n', f);
    }
    field(f, "device", j->device && *j->device ? j->device : "-");
    fprintf(f, LABEL "%lld\n", "priority", (long long)j->priority);
    if (jobfmt_is_program(j)) {
        /* Its own program: steps and batches only as it reports them. */
        field(f, "type", "program");
        field(f, "command", j->command ? j->command : "");
        if (j->micro) {
            fprintf(f, LABEL "%llu steps\n", "progress", (unsigned long long)j->step);
            if (isfinite(step_loss(j)))
                fprintf(f, LABEL "%s\n", "loss", jobfmt_loss(j->loss, a, sizeof a));
            batch_lines(f, j);
        }
        memory_lines(f, j);
        program_times(f, j, now);
        return;
    }
    fprintf(f, LABEL "%llu/%llu steps (%.1f%%)\n", "progress", (unsigned long long)j->step,
            (unsigned long long)j->steps, percent(j));
    if (isfinite(step_loss(j)))
        fprintf(f, LABEL "%s\n", "loss", jobfmt_loss(j->loss, a, sizeof a));
    if (isfinite(j->val_loss))
        fprintf(f, LABEL "%s\n", "val loss", jobfmt_loss(j->val_loss, a, sizeof a));
    if (isfinite(j->val_accuracy))
        fprintf(f, LABEL "%.2f%%\n", "val acc", 100.0 * j->val_accuracy);
    batch_lines(f, j);
    field(f, "speed", jobfmt_speed(j, a, sizeof a));

    memory_lines(f, j);
    if (j->data_bytes)
        fprintf(f, LABEL "%s (%llu bytes)\n", "host data", units_format_size(j->data_bytes, a, sizeof a),
                (unsigned long long)j->data_bytes);

    if (j->submitted_at > 0)
        fprintf(f, LABEL "%s (%s ago)\n", "submitted", local_time(j->submitted_at, a, sizeof a),
                units_format_duration(now - j->submitted_at, b, sizeof b));
    else
        fprintf(f, LABEL "-\n", "submitted");
    fprintf(f, LABEL "%s\n", "started", local_time(j->started_at, a, sizeof a));
    fprintf(f, LABEL "%s\n", "finished", local_time(j->finished_at, a, sizeof a));
    fprintf(f, LABEL "%s\n", "elapsed", units_format_duration(j->elapsed_s, a, sizeof a));
    if (is_state(j, "running"))
        fprintf(f, LABEL "%s\n", "eta", jobfmt_eta(j, a, sizeof a));
    time_limit(f, j);
    on_end(f, j);
    if (j->continued)
        fprintf(f, LABEL "from step %llu of the run found in its out dir\n", "continued",
                (unsigned long long)j->resumed_from_step);
    fprintf(f, LABEL "%u\n", "resumes", j->resumes);
    field(f, "out dir", j->out_dir && *j->out_dir ? j->out_dir : "-");
    fprintf(f, LABEL "%04o\n", "umask", (unsigned)j->umask);
    field(f, "job file", j->job_file && *j->job_file ? j->job_file : "-");
}

/* ---- progress and final lines --------------------------------------------- */

/* How long a program has run: it has no step count to time by. */
static double program_seconds(const Gradd__JobInfo *j)
{
    if (!(j->started_at > 0))
        return 0;
    double end = j->finished_at > j->started_at ? j->finished_at : is_state(j, "running") ? jobfmt_now() : 0;
    return end > j->started_at ? end - j->started_at : 0;
}

/* "running 1m02s mem 1.40G", and what its own micro-batching reports
 * (python/gradd): "step 40 loss 2.130 batch 8×4".  A program has no
 * number of steps, so no percentage and no eta. */
static void program_progress(char *buf, size_t len, const Gradd__JobInfo *j)
{
    char d[32], mem[16], steps[96] = "";
    if (j->step > 0) {
        char loss[32], b[48];
        snprintf(steps, sizeof steps, " step %llu loss %s batch %s", (unsigned long long)j->step,
                 jobfmt_loss(step_loss(j), loss, sizeof loss), jobfmt_batch(j, b, sizeof b));
    }
    snprintf(buf, len, "%s %s%s mem %s", j->state && *j->state ? j->state : "?",
             units_format_duration(program_seconds(j), d, sizeof d), steps,
             units_format_size(j->mem_allocated, mem, sizeof mem));
}

void jobfmt_progress(char *buf, size_t len, const Gradd__JobInfo *j)
{
    if (is_state(j, "queued") && j->step == 0) {
        bool waits = j->waiting && *j->waiting;
        snprintf(buf, len, "queued for %s%s%s%s", j->device && *j->device ? j->device : "a device",
                 waits ? " (" : "", waits ? j->waiting : "", waits ? ")" : "");
        return;
    }
    if (jobfmt_is_program(j)) {
        program_progress(buf, len, j);
        return;
    }
    char loss[32], val[48] = "", speed[48] = "", eta[48] = "", mem[16];
    if (isfinite(j->val_loss))
        snprintf(val, sizeof val, " val %.3f", j->val_loss);
    char s[48];
    if (strcmp(jobfmt_speed(j, s, sizeof s), "-") != 0)
        snprintf(speed, sizeof speed, " %s", s);
    if (is_state(j, "running"))
        snprintf(eta, sizeof eta, " eta %s", jobfmt_eta(j, s, sizeof s));
    snprintf(buf, len, "step %llu/%llu loss %s%s%s%s mem %s", (unsigned long long)j->step,
             (unsigned long long)j->steps, jobfmt_loss(step_loss(j), loss, sizeof loss), val, speed, eta,
             units_format_size(j->mem_allocated, mem, sizeof mem));
}

void jobfmt_final(char *buf, size_t len, const Gradd__JobInfo *j)
{
    const char *state = j->state && *j->state ? j->state : "in an unknown state";
    if (jobfmt_is_program(j) && jobfmt_state_final(j->state)) {
        /* "job 7 completed after 2m03s, 40 steps, loss 2.130" or
         * "job 7 failed after 3s: exited with status 3 ...". */
        char d[32], loss[32], steps[96] = "";
        if (j->step > 0)
            snprintf(steps, sizeof steps, ", %llu steps, loss %s", (unsigned long long)j->step,
                     jobfmt_loss(step_loss(j), loss, sizeof loss));
        /* "cancelled: exited with status 0 after SIGTERM" already has its
         * state in front. */
        const char *why = !is_state(j, "completed") && j->reason ? j->reason : "";
        if (strncmp(why, state, strlen(state)) == 0)
            why += strspn(why + strlen(state), ": ") + strlen(state);
        if (j->started_at > 0)
            snprintf(buf, len, "job %u %s after %s%s%s%s", j->id, state,
                     units_format_duration(program_seconds(j), d, sizeof d), steps, *why ? ": " : "", why);
        else
            snprintf(buf, len, "job %u %s before it started%s%s", j->id, state, *why ? ": " : "", why);
        return;
    }
    if (is_state(j, "completed")) {
        char d[32], loss[32], val[48] = "";
        if (isfinite(j->val_loss))
            snprintf(val, sizeof val, ", val %.3f", j->val_loss);
        snprintf(buf, len, "job %u completed: %llu steps in %s, loss %s%s", j->id, (unsigned long long)j->step,
                 units_format_duration(j->elapsed_s, d, sizeof d), jobfmt_loss(step_loss(j), loss, sizeof loss),
                 val);
    } else if ((is_state(j, "failed") || is_state(j, "cancelled")) && j->reason &&
               strncmp(j->reason, state, strlen(state)) == 0) {
        /* A reason that starts with the state ("cancelled at step 40;
         * checkpoint in DIR") says it all: not "cancelled at step 40/100:
         * cancelled at step 40". */
        snprintf(buf, len, "job %u %s", j->id, j->reason);
    } else if (is_state(j, "failed") || is_state(j, "cancelled")) {
        snprintf(buf, len, "job %u %s at step %llu/%llu%s%s", j->id, state, (unsigned long long)j->step,
                 (unsigned long long)j->steps, j->reason && *j->reason ? ": " : "", j->reason ? j->reason : "");
    } else {
        snprintf(buf, len, "job %u %s", j->id, state);
    }
}

/* ---- what a command did ----------------------------------------------------- */

int jobfmt_done(const ctl *c, uint32_t id, const char *name, const char *done)
{
    if (c->json)
        return jout_print(json_pack("{s:o, s:o}", "id", jout_uint(id), "name", jout_str(name)));
    printf("job %u %s (", id, done);
    table_puts(stdout, name);
    printf(")\n");
    return CTL_OK;
}

/* ---- JSON ----------------------------------------------------------------- */

/* A time that has not happened (0) is null. */
static json_t *time_json(double t)
{
    return jout_real(t > 0 ? t : NAN);
}

void jobfmt_tags_json(json_t *obj, Gradd__TagUsage *const *tags, size_t n)
{
    for (size_t i = 0; i < n; i++)
        jout_set(obj, tags[i]->tag,
                 json_pack("{s:o, s:o}", "current", jout_uint(tags[i]->allocated), "peak", jout_uint(tags[i]->peak)));
}

json_t *jobfmt_json(const Gradd__JobInfo *j)
{
    json_t *change = json_null();
    if (j->change_reason && *j->change_reason)
        change = json_pack("{s:o, s:o, s:o, s:o}", "from", jout_uint(j->change_from), "to", jout_uint(j->change_to),
                           "step", jout_uint(j->change_step), "reason", jout_str(j->change_reason));
    json_t *tags = json_object();
    jobfmt_tags_json(tags, j->mem_tags, j->n_mem_tags);
    json_t *o = json_object();
    json_object_set_new(o, "id", jout_uint(j->id));
    json_object_set_new(o, "name", jout_str(j->name));
    json_object_set_new(o, "uid", jout_uint(j->uid));
    json_object_set_new(o, "user", jout_str(j->user));
    json_object_set_new(o, "state", jout_str(j->state));
    json_object_set_new(o, "device", jout_str(j->device));
    json_t *parts = json_array();
    for (size_t i = 0; i < j->n_device_parts; i++)
        json_array_append_new(parts, json_pack("{s:o, s:o, s:o}", "device", jout_str(j->device_parts[i]->device),
                                               "allocated", jout_uint(j->device_parts[i]->allocated), "peak",
                                               jout_uint(j->device_parts[i]->peak)));
    json_object_set_new(o, "device_parts", parts);
    json_object_set_new(o, "priority", json_integer(j->priority));
    json_object_set_new(o, "step", jout_uint(j->step));
    json_object_set_new(o, "steps", jout_uint(j->steps));
    json_object_set_new(o, "loss", jout_real(step_loss(j)));
    json_object_set_new(o, "val_loss", jout_real(j->val_loss));
    json_object_set_new(o, "val_accuracy", jout_real(j->val_accuracy));
    json_object_set_new(o, "micro", jout_uint(j->micro));
    json_object_set_new(o, "accum", jout_uint(j->accum));
    json_object_set_new(o, "micro_max", jout_uint(j->micro_max));
    json_object_set_new(o, "micro_fit", jout_uint(j->micro_fit));
    json_object_set_new(o, "oom_recoveries", jout_uint(j->oom_recoveries));
    json_object_set_new(o, "last_change", change);
    json_object_set_new(o, "levers", jout_str(j->levers));
    json_object_set_new(o, "units_per_s", jout_real(j->units_per_s));
    json_object_set_new(o, "unit", jout_str(j->unit));
    json_object_set_new(o, "mem_allocated", jout_uint(j->mem_allocated));
    json_object_set_new(o, "mem_peak", jout_uint(j->mem_peak));
    json_object_set_new(o, "mem_tags", tags);
    json_object_set_new(o, "data_bytes", jout_uint(j->data_bytes));
    json_object_set_new(o, "submitted_at", time_json(j->submitted_at));
    json_object_set_new(o, "started_at", time_json(j->started_at));
    json_object_set_new(o, "finished_at", time_json(j->finished_at));
    json_object_set_new(o, "elapsed_s", jout_real(j->elapsed_s));
    json_object_set_new(o, "reason", jout_str(j->reason));
    json_object_set_new(o, "out_dir", jout_str(j->out_dir));
    char mask[8];
    snprintf(mask, sizeof mask, "%04o", (unsigned)j->umask & 0777);
    json_object_set_new(o, "umask", jout_str(mask));
    json_object_set_new(o, "job_file", jout_str(j->job_file));
    json_object_set_new(o, "resumes", jout_uint(j->resumes));
    json_object_set_new(o, "type", jout_str(j->type && *j->type ? j->type : "engine"));
    json_object_set_new(o, "command", jout_str(j->command));
    json_t *deps = json_array();
    for (size_t i = 0; i < j->n_depends_on; i++)
        json_array_append_new(deps, jout_uint(j->depends_on[i]));
    json_object_set_new(o, "depends_on", deps);
    json_object_set_new(o, "held", json_boolean(j->held));
    json_object_set_new(o, "waiting", jout_str(j->waiting));
    json_object_set_new(o, "continued", json_boolean(j->continued));
    json_object_set_new(o, "resumed_from_step", jout_uint(j->resumed_from_step));
    json_object_set_new(o, "on_end", jout_str(j->on_end));
    json_object_set_new(o, "on_end_result", jout_str(j->on_end_result));
    json_object_set_new(o, "time_limit_s", jout_real(j->time_limit_s));
    json_object_set_new(o, "time_left_s", jout_real(j->time_left_s));
    return o;
}
