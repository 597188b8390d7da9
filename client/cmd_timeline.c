/* cmd_timeline.c — gradctl timeline: save the pool's event timeline as
 * Chrome/Perfetto trace JSON (open it in ui.perfetto.dev). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ctl.h"
#include "jout.h"
#include "units.h"

static int run(ctl *c, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"device", required_argument, NULL, 'd'},
        {"output", required_argument, NULL, 'o'},
        {NULL, 0, NULL, 0},
    };
    Gradd__TimelineRequest tr = GRADD__TIMELINE_REQUEST__INIT;
    const char *out = NULL;
    int ch;
    while ((ch = ctl_getopt(c, argc, argv, "d:o:", longopts)) != -1) {
        switch (ch) {
        case 'd': tr.device = optarg; break;
        case 'o': out = optarg; break;
        default: return CTL_ERR_USAGE; /* ctl_getopt said why */
        }
    }
    if (optind < argc)
        return ctl_usage(c, "unexpected argument '%s'", argv[optind]);
    if (!out)
        return ctl_usage(c, "-o FILE is required (use -o - for standard output)");

    /* Write to a temporary name and rename at the end: an interrupted
     * transfer never leaves a truncated trace under the requested name. */
    char tmp[4096];
    FILE *f = stdout;
    bool to_stdout = strcmp(out, "-") == 0;
    if (!to_stdout) {
        snprintf(tmp, sizeof tmp, "%s.tmp.%d", out, (int)getpid());
        f = fopen(tmp, "w");
        if (!f)
            return ctl_error(c, CTL_ERR_USAGE, "io", NULL, "cannot write %s: %s", tmp, strerror(errno));
    }
    Gradd__Response *resp;
    int rc = ctl_call(c, "timeline", GRADD__REQUEST__BODY_TIMELINE, &tr, &resp);
    uint64_t events = 0, bytes = 0;
    char device[32] = "";
    while (rc == CTL_OK) {
        const Gradd__TimelineResponse *t = resp->timeline;
        fwrite(t->chunk.data, 1, t->chunk.len, f);
        bytes += t->chunk.len;
        events = t->events;
        snprintf(device, sizeof device, "%s", t->device);
        bool last = t->last;
        ctl_free(resp);
        if (last)
            break;
        rc = ctl_next(c, &resp);
    }
    if (to_stdout) {
        fflush(stdout);
        return rc;
    }
    if (fclose(f) != 0 && rc == CTL_OK) {
        rc = ctl_error(c, CTL_ERR_USAGE, "io", NULL, "writing %s failed: %s", tmp, strerror(errno));
    }
    if (rc != CTL_OK) {
        unlink(tmp);
        return rc;
    }
    if (rename(tmp, out) != 0) {
        rc = ctl_error(c, CTL_ERR_USAGE, "io", NULL, "cannot rename %s to %s: %s", tmp, out, strerror(errno));
        unlink(tmp);
        return rc;
    }
    char b[16];
    if (c->json)
        return jout_print(json_pack("{s:o, s:o, s:o, s:o}", "path", jout_str(out), "bytes", jout_uint(bytes), "events",
                                    jout_uint(events), "device", jout_str(device)));
    fprintf(stderr, "%s: wrote %llu events (%s) to %s; open it in ui.perfetto.dev\n", device,
                (unsigned long long)events, units_format_size(bytes, b, sizeof b), out);
    return CTL_OK;
}

const ctl_cmd cmd_timeline = {
    .name = "timeline",
    .args = "[-d DEV] -o FILE",
    .summary = "write the memory event timeline as Perfetto/Chrome trace JSON",
    .run = run,
};
