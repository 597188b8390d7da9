/* cmd_rm.c — gradctl rm: forget a finished job (its job file, state and
 * log in the daemon's state dir); its outputs stay where they are. */
#include <stdio.h>

#include "ctl.h"
#include "jobfmt.h"

static int run(ctl *c, int argc, char **argv);

const ctl_cmd cmd_rm = {
    .name = "rm",
    .args = "ID",
    .summary = "forget a finished job (its outputs stay)",
    .run = run,
};

static int run(ctl *c, int argc, char **argv)
{
    Gradd__Response *resp;
    int rc = jobfmt_id_call(c, &cmd_rm, argc, argv, GRADD__REQUEST__BODY_REMOVE, NULL, &resp);
    if (rc != CTL_OK)
        return rc;
    if (c->json) {
        json_writer w;
        json_init(&w, stdout);
        json_begin_object(&w);
        json_key(&w, "id");
        json_uint(&w, resp->remove->id);
        json_key(&w, "name");
        json_string(&w, resp->remove->name);
        json_end_object(&w);
        json_end(&w);
    } else {
        printf("job %u removed (", resp->remove->id);
        table_puts(stdout, resp->remove->name);
        printf(")\n");
    }
    ctl_free(resp);
    return CTL_OK;
}
