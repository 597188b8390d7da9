/* cmd_list.c — gradctl list: every job, one line each, like squeue. */
#include <getopt.h>
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
        {NULL, 0, NULL, 0},
    };
    Gradd__ListRequest lr = GRADD__LIST_REQUEST__INIT;
    int ch;
    while ((ch = getopt_long(argc, argv, "u:", longopts, NULL)) != -1) {
        switch (ch) {
        case 'u':
            if (!*optarg)
                return ctl_usage(c, "--user needs a user name or uid");
            lr.user = optarg;
            break;
        case 'S':
            if (!jobfmt_state_valid(optarg))
                return ctl_usage(c, "unknown state '%s' (queued, running, completed, failed or cancelled)",
                                 optarg);
            lr.state = optarg;
            break;
        default: return ctl_usage(c, "bad option");
        }
    }
    if (optind < argc)
        return ctl_usage(c, "unexpected argument '%s'", argv[optind]);

    jobfmt_list l;
    int rc = jobfmt_list_fetch(c, lr.user, lr.state, &l);
    if (rc != CTL_OK)
        return rc;
    if (c->json) {
        json_t *jobs = json_array();
        for (size_t i = 0; i < l.n; i++)
            json_array_append_new(jobs, jobfmt_json(l.jobs[i]));
        rc = jout_print(json_pack("{s:o}", "jobs", jobs));
    } else {
        double now = jobfmt_now();
        table t;
        table_init(&t, JOBFMT_COLS, jobfmt_head);
        for (size_t i = 0; i < l.n; i++)
            jobfmt_row(&t, l.jobs[i], now);
        table_print(&t, stdout);
        table_free(&t);
    }
    jobfmt_list_free(&l);
    return rc;
}

const ctl_cmd cmd_list = {
    .name = "list",
    .args = "[--user USER] [--state queued|running|completed|failed|cancelled]",
    .summary = "list jobs: state, progress, loss, speed and memory",
    .run = run,
};
