/* cmd_test_hang.c — gradctl test-hang: make a device's job threads hang at
 * their next poll between layers (or release them).  Only a daemon started with
 * --test-hooks accepts it; it exists so that a test can see the systemd
 * watchdog pings stop when a job thread stops making progress. */
#include <getopt.h>
#include <stdio.h>

#include "ctl.h"

static int run(ctl *c, int argc, char **argv)
{
    static const struct option longopts[] = {{"release", no_argument, NULL, 'r'}, {NULL, 0, NULL, 0}};
    Gradd__TestHangRequest th = GRADD__TEST_HANG_REQUEST__INIT;
    int ch;
    while ((ch = ctl_getopt(c, argc, argv, "", longopts)) != -1) {
        if (ch != 'r')
            return CTL_ERR_USAGE; /* ctl_getopt said why */
        th.release = true;
    }
    if (optind != argc - 1)
        return ctl_usage(c, "expected one device id, e.g. cpu0");
    th.device = argv[optind];
    Gradd__Response *resp;
    int rc = ctl_call(c, "test-hang", GRADD__REQUEST__BODY_TEST_HANG, &th, &resp);
    if (rc != CTL_OK)
        return rc;
    const Gradd__TestHangResponse *r = resp->test_hang;
    printf("%s: %u job thread%s %s (%u busy)\n", th.device, r->workers, r->workers == 1 ? "" : "s",
           th.release ? "released" : "will hang", r->busy);
    ctl_free(resp);
    return CTL_OK;
}

const ctl_cmd cmd_test_hang = {
    .name = "test-hang",
    .args = "[--release] DEV",
    .summary = "(tests) hang DEV's job threads at their next poll, or release them",
    .run = run,
    .hidden = true,
};
