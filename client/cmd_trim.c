/* cmd_trim.c — gradctl trim: return cached free memory to the device now. */
#include <getopt.h>
#include <stdio.h>

#include "ctl.h"
#include "units.h"

static int run(ctl *c, int argc, char **argv);

const ctl_cmd cmd_trim = {
    .name = "trim",
    .args = "[-d DEV]",
    .summary = "release the pool's cached free memory to the device now",
    .run = run,
};

static int run(ctl *c, int argc, char **argv)
{
    static const struct option longopts[] = {{"device", required_argument, NULL, 'd'}, {NULL, 0, NULL, 0}};
    Gradd__TrimRequest tr = GRADD__TRIM_REQUEST__INIT;
    int ch;
    while ((ch = getopt_long(argc, argv, "d:", longopts, NULL)) != -1) {
        if (ch != 'd')
            return ctl_usage(&cmd_trim, "bad option");
        tr.device = optarg;
    }
    if (optind < argc)
        return ctl_usage(&cmd_trim, "unexpected argument '%s'", argv[optind]);
    Gradd__Response *resp;
    int rc = ctl_call(c, "trim", GRADD__REQUEST__BODY_TRIM, &tr, &resp);
    if (rc != CTL_OK)
        return rc;
    const Gradd__TrimResponse *r = resp->trim;
    if (c->json) {
        json_writer w;
        json_init(&w, stdout);
        json_begin_object(&w);
        json_key(&w, "results");
        json_begin_array(&w);
        for (size_t i = 0; i < r->n_results; i++) {
            json_begin_object(&w);
            json_key(&w, "device");
            json_string(&w, r->results[i]->device);
            json_key(&w, "bytes");
            json_uint(&w, r->results[i]->bytes);
            json_key(&w, "segments");
            json_uint(&w, r->results[i]->segments);
            json_key(&w, "ns");
            json_uint(&w, r->results[i]->ns);
            json_key(&w, "reserved_after");
            json_uint(&w, r->results[i]->reserved_after);
            json_end_object(&w);
        }
        json_end_array(&w);
        json_end_object(&w);
        json_end(&w);
    } else {
        for (size_t i = 0; i < r->n_results; i++) {
            char a[16], b[16];
            printf("%s: released %s in %llu segment%s (%.3f ms); reserved now %s\n", r->results[i]->device,
                   units_format_size(r->results[i]->bytes, a, sizeof a),
                   (unsigned long long)r->results[i]->segments, r->results[i]->segments == 1 ? "" : "s",
                   (double)r->results[i]->ns / 1e6, units_format_size(r->results[i]->reserved_after, b, sizeof b));
        }
    }
    ctl_free(resp);
    return CTL_OK;
}
