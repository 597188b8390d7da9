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
    Gradd__RemoveRequest rr;
    gradd__remove_request__init(&rr);
    int rc = jobfmt_id_arg(&cmd_rm, argc, argv, &rr.id);
    if (rc != CTL_OK)
        return rc;
    Gradd__Request req;
    gradd__request__init(&req);
    req.body_case = GRADD__REQUEST__BODY_REMOVE;
    req.remove = &rr;
    Gradd__Response *resp;
    rc = ctl_call(c, &req, &resp);
    if (rc != CTL_OK)
        return rc;
    if (resp->body_case != GRADD__RESPONSE__BODY_REMOVE || !resp->remove) {
        fprintf(stderr, "gradctl: unexpected reply to rm\n");
        gradd__response__free_unpacked(resp, NULL);
        return CTL_ERR_DAEMON;
    }
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
    gradd__response__free_unpacked(resp, NULL);
    return CTL_OK;
}
