/* cmd_test_pressure.c — gradctl test-pressure: make a cpu device's simulated
 * "other process" hold memory.  Only a daemon started with --test-hooks
 * accepts it; it exists so integration tests can drive the shared-GPU paths
 * through the real client. */
#include <getopt.h>
#include <stdio.h>

#include "ctl.h"
#include "units.h"

static int run(ctl *c, int argc, char **argv)
{
    static const struct option longopts[] = {{"device", required_argument, NULL, 'd'}, {NULL, 0, NULL, 0}};
    Gradd__TestPressureRequest tp = GRADD__TEST_PRESSURE_REQUEST__INIT;
    tp.device = "cpu0";
    int ch;
    while ((ch = ctl_getopt(c, argc, argv, "d:", longopts)) != -1) {
        if (ch != 'd')
            return CTL_ERR_USAGE; /* ctl_getopt said why */
        tp.device = optarg;
    }
    int rc = ctl_size_arg(c, argc, argv, &tp.bytes);
    if (rc != CTL_OK)
        return rc;
    Gradd__Response *resp;
    rc = ctl_call(c, "test-pressure", GRADD__REQUEST__BODY_TEST_PRESSURE, &tp, &resp);
    if (rc != CTL_OK)
        return rc;
    char a[16], b[16];
    printf("%s: simulated process holds %s; device free %s\n", tp.device,
           units_format_size(resp->test_pressure->external, a, sizeof a),
           units_format_size(resp->test_pressure->device_free, b, sizeof b));
    ctl_free(resp);
    return CTL_OK;
}

const ctl_cmd cmd_test_pressure = {
    .name = "test-pressure",
    .args = "-d DEV SIZE",
    .summary = "(tests) simulate another process holding SIZE of a cpu device",
    .run = run,
    .hidden = true,
};
