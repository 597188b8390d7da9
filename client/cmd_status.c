/* cmd_status.c — gradctl status: the daemon and its devices, or with a job
 * id, everything about that job. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "ctl.h"
#include "jobfmt.h"
#include "table.h"
#include "units.h"

static int run(ctl *c, int argc, char **argv);

const ctl_cmd cmd_status = {
    .name = "status",
    .args = "[ID]",
    .summary = "show the daemon, its devices and active jobs, or one job in detail",
    .run = run,
};

static void print_json(const Gradd__StatusResponse *st)
{
    json_writer w;
    json_init(&w, stdout);
    json_begin_object(&w);
    json_key(&w, "daemon_version");
    json_string(&w, st->daemon_version);
    json_key(&w, "protocol_version");
    json_uint(&w, st->protocol_version);
    json_key(&w, "pid");
    json_int(&w, st->pid);
    json_key(&w, "uptime_s");
    json_double(&w, st->uptime_s);
    json_key(&w, "peer_uid");
    json_uint(&w, st->peer_uid);
    json_key(&w, "cuda_note");
    json_string(&w, st->cuda_note);
    json_key(&w, "devices");
    json_begin_array(&w);
    for (size_t i = 0; i < st->n_devices; i++) {
        const Gradd__Device *d = st->devices[i];
        json_begin_object(&w);
        json_key(&w, "id");
        json_string(&w, d->id);
        json_key(&w, "name");
        json_string(&w, d->name);
        json_key(&w, "kind");
        json_string(&w, d->kind);
        json_key(&w, "mem_total");
        json_uint(&w, d->mem_total);
        json_key(&w, "mem_free");
        json_uint(&w, d->mem_free);
        json_key(&w, "pool_reserved");
        json_uint(&w, d->pool_reserved);
        json_key(&w, "pool_allocated");
        json_uint(&w, d->pool_allocated);
        json_key(&w, "fragmentation");
        json_double(&w, d->fragmentation);
        json_end_object(&w);
    }
    json_end_array(&w);
    json_end_object(&w);
    json_end(&w);
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
            running += active[0].jobs[k]->device && strcmp(active[0].jobs[k]->device, d->id) == 0;
        table_cell(&t, "%zu", running);
    }
    table_print(&t, stdout);
    table_free(&t);
    if (st->cuda_note && *st->cuda_note)
        printf("\n%s\n", st->cuda_note);
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
    int rc = jobfmt_id_call(c, &cmd_status, argc, argv, GRADD__REQUEST__BODY_JOB, NULL, &resp);
    if (rc != CTL_OK)
        return rc;
    if (c->json) {
        json_writer w;
        json_init(&w, stdout);
        jobfmt_json(&w, resp->job);
        json_end(&w);
    } else {
        jobfmt_detail(stdout, resp->job, jobfmt_now());
    }
    ctl_free(resp);
    return CTL_OK;
}

static int run(ctl *c, int argc, char **argv)
{
    if (argc > 1)
        return job_status(c, argc, argv);
    Gradd__StatusRequest sr = GRADD__STATUS_REQUEST__INIT;
    Gradd__Response *resp;
    int rc = ctl_call(c, "status", GRADD__REQUEST__BODY_STATUS, &sr, &resp);
    if (rc != CTL_OK)
        return rc;
    if (c->json)
        print_json(resp->status);
    else
        print_text(c, resp->status);
    ctl_free(resp);
    return CTL_OK;
}
