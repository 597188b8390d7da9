/* cmd_metrics.c — gradctl metrics: the daemon's, devices', pools' and jobs'
 * figures in Prometheus text format, for node_exporter's textfile
 * collector (gradctl metrics > DIR/gradd.prom.$$ && mv ... DIR/gradd.prom). */
#include <stdio.h>
#include <string.h>

#include "ctl.h"
#include "jout.h"
#include "promtext.h"

static int run(ctl *c, int argc, char **argv)
{
    if (ctl_getopt(c, argc, argv, "", NULL) != -1)
        return CTL_ERR_USAGE; /* ctl_getopt said why */
    if (optind < argc)
        return ctl_usage(c, "unexpected argument '%s'", argv[optind]);
    Gradd__MetricsRequest mr = GRADD__METRICS_REQUEST__INIT;
    Gradd__Response *resp;
    int rc = ctl_call(c, "metrics", GRADD__REQUEST__BODY_METRICS, &mr, &resp);
    if (rc != CTL_OK)
        return rc;
    const char *text = resp->metrics->text ? resp->metrics->text : "";
    if (c->json)
        /* The figures as fields, for a script that has no Prometheus
         * parser. */
        rc = jout_print(promtext_json(text));
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
