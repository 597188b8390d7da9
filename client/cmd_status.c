/* cmd_status.c — gradctl status: the daemon and its devices, or with a job
 * id, everything about that job. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "ctl.h"
#include "jobfmt.h"
#include "table.h"
#include "units.h"

static int print_json(const Gradd__StatusResponse *st)
{
    json_t *devices = json_array();
    for (size_t i = 0; i < st->n_devices; i++) {
        const Gradd__Device *d = st->devices[i];
        json_t *procs = json_array();
        for (size_t k = 0; k < d->n_processes; k++) {
            const Gradd__GpuProcess *p = d->processes[k];
            json_t *jobs = json_array();
            for (size_t j = 0; j < p->n_jobs; j++)
                json_array_append_new(jobs, jout_uint(p->jobs[j]));
            json_array_append_new(procs, json_pack("{s:o, s:o, s:o, s:o, s:o, s:o}", "pid", jout_uint(p->pid), "uid",
                                                   jout_uint(p->uid), "user", jout_str(p->user), "command",
                                                   jout_str(p->command), "used_bytes", jout_uint(p->used_bytes),
                                                   "jobs", jobs));
        }
        json_array_append_new(devices, json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "id",
                                                 jout_str(d->id), "name", jout_str(d->name), "kind",
                                                 jout_str(d->kind), "mem_total", jout_uint(d->mem_total), "mem_free",
                                                 jout_uint(d->mem_free), "pool_reserved", jout_uint(d->pool_reserved),
                                                 "pool_allocated", jout_uint(d->pool_allocated), "fragmentation",
                                                 jout_real(d->fragmentation), "processes", procs, "process_note",
                                                 jout_str(d->process_note)));
    }
    return jout_print(json_pack("{s:o, s:o, s:I, s:o, s:o, s:o, s:o}", "daemon_version", jout_str(st->daemon_version),
                                "protocol_version", jout_uint(st->protocol_version), "pid", (json_int_t)st->pid,
                                "uptime_s", jout_real(st->uptime_s), "peer_uid", jout_uint(st->peer_uid), "cuda_note",
                                jout_str(st->cuda_note), "devices", devices));
}

/* Every process on each device, then each reason a list is missing, once
 * for all the devices it applies to. */
static void print_processes(const Gradd__StatusResponse *st)
{
    static const char *const head[] = {"DEVICE", ">PID", "USER", "COMMAND", ">MEM"};
    table t;
    table_init(&t, 5, head);
    for (size_t i = 0; i < st->n_devices; i++) {
        const Gradd__Device *d = st->devices[i];
        for (size_t k = 0; k < d->n_processes; k++) {
            const Gradd__GpuProcess *p = d->processes[k];
            char cmd[256], m[16];
            table_cell(&t, "%s", d->id);
            table_cell(&t, "%u", p->pid);
            table_cell(&t, "%s", p->user && *p->user ? p->user : "-");
            table_cell(&t, "%s", jobfmt_process(p, cmd, sizeof cmd));
            table_cell(&t, "%s", units_format_size(p->used_bytes, m, sizeof m));
        }
    }
    if (t.nrows) {
        printf("\n");
        table_print(&t, stdout);
    }
    table_free(&t);
    for (size_t i = 0; i < st->n_devices; i++) {
        const char *note = st->devices[i]->process_note;
        bool seen = !note || !*note;
        for (size_t k = 0; k < i && !seen; k++)
            seen = st->devices[k]->process_note && strcmp(st->devices[k]->process_note, note) == 0;
        if (seen)
            continue;
        printf("\n");
        for (size_t k = i, first = 1; k < st->n_devices; k++)
            if (st->devices[k]->process_note && strcmp(st->devices[k]->process_note, note) == 0) {
                printf("%s", first ? "" : ", ");
                table_puts(stdout, st->devices[k]->id);
                first = 0;
            }
        printf(": ");
        table_puts(stdout, note);
        printf("\n");
    }
}

/* Whether job j runs on device id: its device, or one of a job's several
 * ("cpu0,cpu1"). */
static bool runs_on(const Gradd__JobInfo *j, const char *id)
{
    const char *s = j->device ? j->device : "";
    size_t n = strlen(id);
    for (;;) {
        s += strspn(s, ", ");
        size_t w = strcspn(s, ",");
        size_t len = w;
        while (len && s[len - 1] == ' ')
            len--;
        if (!*s)
            return false;
        if (len == n && strncmp(s, id, n) == 0)
            return true;
        s += w;
    }
}

/* The overview: devices with their running jobs, then the running and
 * queued jobs as `gradctl list` shows them (finished ones are left to
 * list: on a long-lived daemon they are most of the table). */
static void print_text(ctl *c, const Gradd__StatusResponse *st)
{
    char up[32];
    printf("gradd %s  protocol %u  pid %d  up %s\n\n", st->daemon_version, st->protocol_version, st->pid,
           units_format_duration(st->uptime_s, up, sizeof up));
    /* Empty where the daemon would not list them (it said why on stderr). */
    jobfmt_list active[2];
    jobfmt_list_fetch(c, NULL, "running", &active[0]);
    jobfmt_list_fetch(c, NULL, "queued", &active[1]);
    static const char *const head[] = {"DEVICE", "NAME",  "KIND", ">MEM USED/TOTAL",
                                       ">FREE",  ">RESERVED", ">FRAG", ">JOBS"};
    table t;
    table_init(&t, 8, head);
    for (size_t i = 0; i < st->n_devices; i++) {
        const Gradd__Device *d = st->devices[i];
        char a[16], b[16], f[16], r[16];
        table_cell(&t, "%s", d->id);
        table_cell(&t, "%s", d->name);
        table_cell(&t, "%s", d->kind);
        table_cell(&t, "%s/%s", units_format_size(d->pool_allocated, a, sizeof a),
                   units_format_size(d->mem_total, b, sizeof b));
        table_cell(&t, "%s", units_format_size(d->mem_free, f, sizeof f));
        table_cell(&t, "%s", units_format_size(d->pool_reserved, r, sizeof r));
        table_cell(&t, "%.0f%%", d->fragmentation * 100);
        size_t running = 0;
        for (size_t k = 0; k < active[0].n; k++)
            running += runs_on(active[0].jobs[k], d->id);
        table_cell(&t, "%zu", running);
    }
    table_print(&t, stdout);
    table_free(&t);
    print_processes(st);
    if (st->cuda_note && *st->cuda_note) {
        printf("\n");
        table_puts(stdout, st->cuda_note);
        printf("\n");
    }
    size_t n = active[0].n + active[1].n;
    if (n) {
        double now = jobfmt_now();
        table_init(&t, JOBFMT_COLS, jobfmt_head);
        for (int s = 0; s < 2; s++)
            for (size_t k = 0; k < active[s].n; k++)
                jobfmt_row(&t, active[s].jobs[k], now);
        printf("\n");
        table_print(&t, stdout);
        table_free(&t);
    }
    for (int s = 0; s < 2; s++)
        jobfmt_list_free(&active[s]);
}

/* gradctl status ID: one job, in full. */
static int job_status(ctl *c, int argc, char **argv)
{
    Gradd__Response *resp;
    int rc = jobfmt_id_call(c, argc, argv, GRADD__REQUEST__BODY_JOB, NULL, &resp);
    if (rc != CTL_OK)
        return rc;
    if (c->json)
        rc = jout_print(jobfmt_json(resp->job));
    else
        jobfmt_detail(stdout, resp->job, jobfmt_now());
    ctl_free(resp);
    return rc;
}

static int run(ctl *c, int argc, char **argv)
{
    if (ctl_getopt(c, argc, argv, "", NULL) != -1)
        return CTL_ERR_USAGE; /* ctl_getopt said why */
    if (optind < argc) {
        optind = 0; /* job_status parses the words again, for the id */
        return job_status(c, argc, argv);
    }
    Gradd__StatusRequest sr = GRADD__STATUS_REQUEST__INIT;
    Gradd__Response *resp;
    int rc = ctl_call(c, "status", GRADD__REQUEST__BODY_STATUS, &sr, &resp);
    if (rc != CTL_OK)
        return rc;
    if (c->json)
        rc = print_json(resp->status);
    else
        print_text(c, resp->status);
    ctl_free(resp);
    return rc;
}

const ctl_cmd cmd_status = {
    .name = "status",
    .args = "[ID]",
    .summary = "show the daemon, its devices and active jobs, or one job in detail",
    .run = run,
};
