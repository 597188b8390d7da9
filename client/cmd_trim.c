/* cmd_trim.c — gradctl trim: return cached free memory to the device now. */
#include <getopt.h>
#include <stdio.h>

#include "ctl.h"
#include "jout.h"
#include "table.h"
#include "units.h"

static int run(ctl *c, int argc, char **argv)
{
    static const struct option longopts[] = {{"device", required_argument, NULL, 'd'}, {NULL, 0, NULL, 0}};
    Gradd__TrimRequest tr = GRADD__TRIM_REQUEST__INIT;
    int ch;
    while ((ch = ctl_getopt(c, argc, argv, "d:", longopts)) != -1) {
        if (ch != 'd')
            return CTL_ERR_USAGE; /* ctl_getopt said why */
        tr.device = optarg;
    }
    if (optind < argc)
        return ctl_usage(c, "unexpected argument '%s'", argv[optind]);
    Gradd__Response *resp;
    int rc = ctl_call(c, "trim", GRADD__REQUEST__BODY_TRIM, &tr, &resp);
    if (rc != CTL_OK)
        return rc;
    const Gradd__TrimResponse *r = resp->trim;
    if (c->json) {
        json_t *results = json_array();
        for (size_t i = 0; i < r->n_results; i++) {
            const Gradd__TrimResult *t = r->results[i];
            json_array_append_new(results,
                                  json_pack("{s:o, s:o, s:o, s:o, s:o}", "device", jout_str(t->device), "bytes",
                                            jout_uint(t->bytes), "segments", jout_uint(t->segments), "ns",
                                            jout_uint(t->ns), "reserved_after", jout_uint(t->reserved_after)));
        }
        rc = jout_print(json_pack("{s:o}", "results", results));
    } else {
        for (size_t i = 0; i < r->n_results; i++) {
            char a[16], b[16];
            table_puts(stdout, r->results[i]->device);
            printf(": released %s in %llu segment%s (%.3f ms); reserved now %s\n",
                   units_format_size(r->results[i]->bytes, a, sizeof a),
                   (unsigned long long)r->results[i]->segments, r->results[i]->segments == 1 ? "" : "s",
                   (double)r->results[i]->ns / 1e6, units_format_size(r->results[i]->reserved_after, b, sizeof b));
        }
    }
    ctl_free(resp);
    return rc;
}

const ctl_cmd cmd_trim = {
    .name = "trim",
    .args = "[-d DEV]",
    .summary = "release the pool's cached free memory to the device now",
    .run = run,
};
