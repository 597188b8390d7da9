/* cmd_rm.c — gradctl rm: forget a finished job (its job file, state and
 * log in the daemon's state dir); its outputs stay where they are. */
#include <stdio.h>

#include "ctl.h"
#include "jobfmt.h"

static int run(ctl *c, int argc, char **argv)
{
    Gradd__Response *resp;
    int rc = jobfmt_id_call(c, argc, argv, GRADD__REQUEST__BODY_REMOVE, NULL, &resp);
    if (rc != CTL_OK)
        return rc;
    rc = jobfmt_done(c, resp->remove->id, resp->remove->name, "removed");
    ctl_free(resp);
    return rc;
}

const ctl_cmd cmd_rm = {
    .name = "rm",
    .args = "ID",
    .summary = "forget a finished job (its outputs stay)",
    .run = run,
};
