/* cmd_history.c — gradctl history: finished jobs' accounting records, like
 * sacct: newest first, filtered by user, state and end time, or summed
 * per user (--summary).  They outlive `gradctl rm` and restarts. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strptime */
#endif
#include <getopt.h>
#include <math.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl.h"
#include "jobfmt.h"
#include "table.h"
#include "units.h"

/* A --since/--until argument as unix seconds: an ISO date or date and
 * time in local time ("2024-05-01", "2024-05-01T13:00", "2024-05-01
 * 13:00:05"), or a duration before now ("2h", "3d", "90m").  0, or -1. */
static int parse_when(const char *text, double now, double *out)
{
    static const char *const forms[] = {"%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M",
                                        "%Y-%m-%d %H:%M", "%Y-%m-%d"};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        struct tm tm;
        memset(&tm, 0, sizeof tm);
        const char *end = strptime(text, forms[i], &tm);
        if (!end || *end)
            continue;
        tm.tm_isdst = -1;
        time_t t = mktime(&tm);
        if (t == (time_t)-1)
            return -1;
        *out = (double)t;
        return 0;
    }
    uint64_t ms;
    char err[128];
    if (units_parse_duration_ms(text, &ms, err, sizeof err) != 0 || (double)ms / 1e3 > now)
        return -1;
    *out = now - (double)ms / 1e3;
    return 0;
}

static json_t *time_json(double t)
{
    return jout_real(t > 0 ? t : NAN);
}

static json_t *record_json(const Gradd__AccountRecord *r)
{
    json_t *tags = json_object();
    for (size_t i = 0; i < r->n_mem_tags; i++)
        jout_set(tags, r->mem_tags[i]->tag, jout_uint(r->mem_tags[i]->peak));
    json_t *o = json_object();
    json_object_set_new(o, "id", jout_uint(r->id));
    json_object_set_new(o, "name", jout_str(r->name));
    json_object_set_new(o, "user", jout_str(r->user));
    json_object_set_new(o, "uid", jout_uint(r->uid));
    json_object_set_new(o, "type", jout_str(r->type));
    json_object_set_new(o, "state", jout_str(r->state));
    json_object_set_new(o, "reason", jout_str(r->reason));
    json_object_set_new(o, "device", jout_str(r->device));
    json_object_set_new(o, "devices", jout_uint(r->devices));
    json_object_set_new(o, "submitted_at", time_json(r->submitted_at));
    json_object_set_new(o, "started_at", time_json(r->started_at));
    json_object_set_new(o, "finished_at", time_json(r->finished_at));
    json_object_set_new(o, "elapsed_s", jout_real(r->elapsed_s));
    json_object_set_new(o, "device_hours", jout_real(r->device_hours));
    json_object_set_new(o, "steps_done", jout_uint(r->steps_done));
    json_object_set_new(o, "steps", jout_uint(r->steps));
    json_object_set_new(o, "resumes", jout_uint(r->resumes));
    json_object_set_new(o, "oom_recoveries", jout_uint(r->oom_recoveries));
    json_object_set_new(o, "mem_peak", jout_uint(r->mem_peak));
    json_object_set_new(o, "mem_peak_tags", tags);
    return o;
}

static json_t *user_json(const Gradd__UserSummary *u)
{
    return json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "uid", jout_uint(u->uid), "user", jout_str(u->user),
                     "jobs", jout_uint(u->jobs), "completed", jout_uint(u->completed), "failed",
                     jout_uint(u->failed), "cancelled", jout_uint(u->cancelled), "device_hours",
                     jout_real(u->device_hours), "elapsed_s", jout_real(u->elapsed_s));
}

static const char *const rec_head[] = {"JOB", "USER", "NAME", "TYPE", "STATE", "DEVICE", "ENDED",
                                       ">ELAPSED", ">DEV-H", ">PEAK", ">STEPS", ">RESUMES", ">OOMS", "REASON"};
static const char *const user_head[] = {"USER", ">UID", ">JOBS", ">COMPLETED", ">FAILED", ">CANCELLED",
                                        ">DEV-H", ">ELAPSED"};

/* The human form: one table (made by run, with the columns asked for),
 * records or users. */
static void print_table(table *tp, bool summary, Gradd__AccountRecord **recs, size_t n,
                        Gradd__UserSummary **users, size_t nusers)
{
    char a[64], b[32];
    table t = *tp;
    if (summary) {
        for (size_t i = 0; i < nusers; i++) {
            const Gradd__UserSummary *u = users[i];
            table_cell(&t, "%s", u->user && *u->user ? u->user : "?");
            table_cell(&t, "%u", u->uid);
            table_cell(&t, "%llu", (unsigned long long)u->jobs);
            table_cell(&t, "%llu", (unsigned long long)u->completed);
            table_cell(&t, "%llu", (unsigned long long)u->failed);
            table_cell(&t, "%llu", (unsigned long long)u->cancelled);
            table_cell(&t, "%.3f", u->device_hours);
            table_cell(&t, "%s", units_format_duration(u->elapsed_s, b, sizeof b));
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            const Gradd__AccountRecord *r = recs[i];
            time_t end = (time_t)r->finished_at;
            struct tm tm;
            if (!(r->finished_at > 0) || !localtime_r(&end, &tm) || !strftime(a, sizeof a, "%Y-%m-%d %H:%M", &tm))
                snprintf(a, sizeof a, "-");
            table_cell(&t, "%u", r->id);
            table_cell(&t, "%s", r->user);
            table_cell(&t, "%s", r->name);
            table_cell(&t, "%s", r->type);
            table_cell(&t, "%s", r->state);
            table_cell(&t, "%s", r->device && *r->device ? r->device : "-");
            table_cell(&t, "%s", a);
            table_cell(&t, "%s", units_format_duration(r->elapsed_s, b, sizeof b));
            table_cell(&t, "%.3f", r->device_hours);
            table_cell(&t, "%s", r->mem_peak ? units_format_size(r->mem_peak, b, sizeof b) : "-");
            table_cell(&t, "%llu", (unsigned long long)r->steps_done);
            table_cell(&t, "%u", r->resumes);
            table_cell(&t, "%llu", (unsigned long long)r->oom_recoveries);
            table_cell(&t, "%s", r->reason && *r->reason ? r->reason : "-");
        }
    }
    table_print(&t, stdout);
    *tp = t;
}

static int run(ctl *c, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"user", required_argument, NULL, 'u'},   {"state", required_argument, NULL, 'S'},
        {"since", required_argument, NULL, 's'},  {"until", required_argument, NULL, 'U'},
        {"limit", required_argument, NULL, 'n'},  {"summary", no_argument, NULL, 'm'},
        {"columns", required_argument, NULL, 'o'}, {"noheadings", no_argument, NULL, 'H'},
        {NULL, 0, NULL, 0},
    };
    Gradd__HistoryRequest hr = GRADD__HISTORY_REQUEST__INIT;
    double now = jobfmt_now();
    const char *columns = NULL;
    bool noheadings = false;
    int ch;
    while ((ch = ctl_getopt(c, argc, argv, "u:n:o:", longopts)) != -1) {
        switch (ch) {
        case 'u':
            if (!*optarg)
                return ctl_usage(c, "--user needs a user name or uid");
            hr.user = optarg;
            break;
        case 'S':
            if (!jobfmt_state_valid(optarg) || !jobfmt_state_final(optarg))
                return ctl_usage(c, "unknown state '%s' (completed, failed or cancelled)", optarg);
            hr.state = optarg;
            break;
        case 's':
        case 'U':
            if (parse_when(optarg, now, ch == 's' ? &hr.since : &hr.until) != 0)
                return ctl_usage(c, "%s: '%s' is not a time (2024-05-01, 2024-05-01T13:00, or 2h, 3d before now)",
                                 ch == 's' ? "--since" : "--until", optarg);
            break;
        case 'n': {
            char *end;
            unsigned long v = strtoul(optarg, &end, 10);
            if (*end || end == optarg || optarg[0] == '-' || v < 1 || v > 500)
                return ctl_usage(c, "--limit: '%s' is not a number from 1 to 500", optarg);
            hr.limit = (uint32_t)v;
            break;
        }
        case 'm': hr.summary = true; break;
        case 'o': columns = optarg; break;
        case 'H': noheadings = true; break;
        default: return CTL_ERR_USAGE; /* ctl_getopt said why */
        }
    }
    if (optind < argc)
        return ctl_usage(c, "unexpected argument '%s'", argv[optind]);
    /* The table first: a bad column is a usage error before anything is
     * asked of the daemon. */
    table t;
    if (hr.summary)
        table_init(&t, 8, user_head);
    else
        table_init(&t, 14, rec_head);
    char err[512];
    if (columns && table_select(&t, columns, err, sizeof err) != 0) {
        table_free(&t);
        return ctl_usage(c, "-o: %s", err);
    }
    if (noheadings)
        table_noheadings(&t);

    Gradd__Response *resp;
    int rc = ctl_call(c, "history", GRADD__REQUEST__BODY_HISTORY, &hr, &resp);
    Gradd__Response **frames = NULL;
    size_t nframes = 0, n = 0;
    Gradd__AccountRecord **recs = NULL;
    uint64_t skipped = 0;
    for (bool more = true; rc == CTL_OK && more;) {
        Gradd__Response **nf = realloc(frames, (nframes + 1) * sizeof *nf);
        Gradd__AccountRecord **nr = realloc(recs, (n + resp->history->n_records + 1) * sizeof *nr);
        if (nf)
            frames = nf;
        if (nr)
            recs = nr;
        if (!nf || !nr) {
            ctl_error(c, CTL_ERR_DAEMON, "internal", NULL, "out of memory");
            ctl_free(resp);
            rc = CTL_ERR_DAEMON;
            break;
        }
        frames[nframes++] = resp;
        for (size_t i = 0; i < resp->history->n_records; i++)
            recs[n++] = resp->history->records[i];
        skipped = resp->history->skipped;
        more = resp->history->more;
        if (more)
            rc = ctl_next(c, &resp);
    }
    /* A name that is no user here and that no record has: a typo, as list
     * says, rather than an empty answer.  (A user since removed still has
     * their records, found by name.) */
    if (rc == CTL_OK && hr.user && !n && !frames[0]->history->n_users && hr.user[strspn(hr.user, "0123456789")] &&
        !getpwnam(hr.user))
        rc = ctl_error(c, CTL_ERR_USAGE, "usage", NULL, "no user %s, and no records of one", hr.user);
    if (rc == CTL_OK) {
        Gradd__HistoryResponse *h = frames[0]->history;
        if (skipped)
            fprintf(stderr, "gradctl history: %llu damaged accounting line%s skipped (gradd's log names them)\n",
                    (unsigned long long)skipped, skipped == 1 ? "" : "s");
        if (c->json) {
            json_t *list = json_array();
            if (hr.summary)
                for (size_t i = 0; i < h->n_users; i++)
                    json_array_append_new(list, user_json(h->users[i]));
            else
                for (size_t i = 0; i < n; i++)
                    json_array_append_new(list, record_json(recs[i]));
            rc = jout_print(json_pack("{s:o, s:o}", hr.summary ? "users" : "records", list, "skipped",
                                      jout_uint(skipped)));
        } else {
            print_table(&t, hr.summary, recs, n, h->users, h->n_users);
        }
    }
    table_free(&t);
    for (size_t i = 0; i < nframes; i++)
        ctl_free(frames[i]);
    free(frames);
    free(recs);
    return rc;
}

const ctl_cmd cmd_history = {
    .name = "history",
    .args = "[--user USER] [--state completed|failed|cancelled] [--since WHEN] [--until WHEN] [-n N] [--summary] "
            "[-o COL,...] [--noheadings]",
    .summary = "finished jobs' accounting, newest first: times, device-hours, peak memory; or per-user totals",
    .run = run,
};
