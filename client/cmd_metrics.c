/* cmd_metrics.c — gradctl metrics: the daemon's, devices', pools' and jobs'
 * figures in Prometheus text format, for node_exporter's textfile
 * collector (gradctl metrics > DIR/gradd.prom.$$ && mv ... DIR/gradd.prom). */
#include <stdio.h>
#include <string.h>

#include "ctl.h"
#include "jout.h"

static int run(ctl *c, int argc, char **argv)
{
    if (argc > 1)
        return ctl_usage(c, "unexpected argument '%s'", argv[1]);
    Gradd__MetricsRequest mr = GRADD__METRICS_REQUEST__INIT;
    Gradd__Response *resp;
    int rc = ctl_call(c, "metrics", GRADD__REQUEST__BODY_METRICS, &mr, &resp);
    if (rc != CTL_OK)
        return rc;
    const char *text = resp->metrics->text ? resp->metrics->text : "";
    if (c->json)
        /* The exposition text as one string: scripts that want fields
         * parse it with a Prometheus parser. */
        rc = jout_print(json_pack("{s:o}", "text", jout_str(text)));
    else
        fputs(text, stdout);
    ctl_free(resp);
    return rc;
}

const ctl_cmd cmd_metrics = {
    .name = "metrics",
    .args = "",
    .summary = "print metrics in Prometheus text format",
    .run = run,
};
