/* cmd_metrics.c — gradctl metrics: the daemon's, devices', pools' and jobs'
 * figures in Prometheus text format, for node_exporter's textfile
 * collector (gradctl metrics > DIR/gradd.prom.$$ && mv ... DIR/gradd.prom). */
#include <stdio.h>
#include <string.h>

#include "ctl.h"

static int run(ctl *c, int argc, char **argv);

const ctl_cmd cmd_metrics = {
    .name = "metrics",
    .args = "",
    .summary = "print metrics in Prometheus text format",
    .run = run,
};

static int run(ctl *c, int argc, char **argv)
{
    if (argc > 1)
        return ctl_usage(&cmd_metrics, "unexpected argument '%s'", argv[1]);
    Gradd__MetricsRequest mr = GRADD__METRICS_REQUEST__INIT;
    Gradd__Response *resp;
    int rc = ctl_call(c, "metrics", GRADD__REQUEST__BODY_METRICS, &mr, &resp);
    if (rc != CTL_OK)
        return rc;
    const char *text = resp->metrics->text ? resp->metrics->text : "";
    if (c->json) {
        /* The exposition text as one string: scripts that want fields
         * parse it with a Prometheus parser. */
        json_writer w;
        json_init(&w, stdout);
        json_begin_object(&w);
        json_key(&w, "text");
        json_string(&w, text);
        json_end_object(&w);
        json_end(&w);
    } else {
        fputs(text, stdout);
    }
    ctl_free(resp);
    return CTL_OK;
}
