/* cmd_cancel.c — gradctl cancel: take a queued job off the queue, or stop a
 * running one: between two layers after a final checkpoint, or, for a
 * program job, with SIGTERM and then SIGKILL after its grace. */
#include <stdio.h>
#include <string.h>

#include "ctl.h"
#include "jobfmt.h"

static int run(ctl *c, int argc, char **argv)
{
    Gradd__Response *resp;
    int rc = jobfmt_id_call(c, argc, argv, GRADD__REQUEST__BODY_CANCEL, NULL, &resp);
    if (rc != CTL_OK)
        return rc;
    if (!resp->cancel->job)
        return ctl_unexpected(c, resp);
    /* The job as it is after the request: a queued job is cancelled at
     * once; a running one stays "running" until its worker stops it. */
    const Gradd__JobInfo *j = resp->cancel->job;
    if (c->json)
        rc = jout_print(jobfmt_json(j));
    else if (strcmp(j->state, "cancelled") == 0)
        printf("job %u cancelled\n", j->id);
    else if (strcmp(j->state, "running") == 0 && jobfmt_is_program(j))
        printf("job %u stopping (SIGTERM to the program; SIGKILL once its [program] grace is over)\n", j->id);
    else if (strcmp(j->state, "running") == 0)
        printf("job %u stopping (a final checkpoint is being written)\n", j->id);
    else
        printf("job %u is %s; nothing to cancel\n", j->id, j->state);
    ctl_free(resp);
    return rc;
}

const ctl_cmd cmd_cancel = {
    .name = "cancel",
    .args = "ID",
    .summary = "cancel a queued job, or stop a running one after a final checkpoint",
    .run = run,
};
