/* cmd_list.c — gradctl list: every job, one line each, like squeue. */
#include <getopt.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>

#include "ctl.h"
#include "jobfmt.h"
#include "table.h"

static int run(ctl *c, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"user", required_argument, NULL, 'u'},
        {"state", required_argument, NULL, 'S'},
        {"columns", required_argument, NULL, 'o'},
        {"noheadings", no_argument, NULL, 'H'},
        {NULL, 0, NULL, 0},
    };
    Gradd__ListRequest lr = GRADD__LIST_REQUEST__INIT;
    /* Made first, so that a bad column is a usage error before anything
     * is asked of the daemon. */
    table t;
    table_init(&t, JOBFMT_COLS, jobfmt_head);
    char err[512];
    int ch;
    while ((ch = ctl_getopt(c, argc, argv, "u:o:", longopts)) != -1) {
        switch (ch) {
        case 'u':
            if (!*optarg)
                return ctl_usage(c, "--user needs a user name or uid");
            /* A name that is nobody's would list nothing, which reads as
             * "no jobs"; a uid may be a user since removed. */
            if (optarg[strspn(optarg, "0123456789")] && !getpwnam(optarg))
                return ctl_error(c, CTL_ERR_USAGE, "usage", NULL, "no user %s", optarg);
            lr.user = optarg;
            break;
        case 'S':
            if (!jobfmt_state_valid(optarg))
                return ctl_usage(c, "unknown state '%s' (queued, running, completed, failed or cancelled)",
                                 optarg);
            lr.state = optarg;
            break;
        case 'o':
            if (table_select(&t, optarg, err, sizeof err) != 0)
                return ctl_usage(c, "-o: %s", err);
            break;
        case 'H': table_noheadings(&t); break;
        default: return CTL_ERR_USAGE; /* ctl_getopt said why */
        }
    }
    if (optind < argc)
        return ctl_usage(c, "unexpected argument '%s'", argv[optind]);

    jobfmt_list l;
    int rc = jobfmt_list_fetch(c, lr.user, lr.state, &l);
    if (rc != CTL_OK) {
        table_free(&t);
        return rc;
    }
    if (c->json) {
        json_t *jobs = json_array();
        for (size_t i = 0; i < l.n; i++)
            json_array_append_new(jobs, jobfmt_json(l.jobs[i]));
        rc = jout_print(json_pack("{s:o}", "jobs", jobs));
    } else {
        double now = jobfmt_now();
        for (size_t i = 0; i < l.n; i++)
            jobfmt_row(&t, l.jobs[i], now);
        table_print(&t, stdout);
    }
    table_free(&t);
    jobfmt_list_free(&l);
    return rc;
}

const ctl_cmd cmd_list = {
    .name = "list",
    .args = "[--user USER] [--state queued|running|completed|failed|cancelled] [-o COL,...] [--noheadings]",
    .summary = "list jobs: state, progress, loss, speed and memory",
    .run = run,
};
