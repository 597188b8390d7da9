/* cmd_test_hang.c — gradctl test-hang: make a device's job threads hang at
 * their next poll between layers (or release them).  Only a daemon started with
 * --test-hooks accepts it; it exists so that a test can see the systemd
 * watchdog pings stop when a job thread stops making progress. */
#include <getopt.h>
#include <stdio.h>

#include "ctl.h"

static int run(ctl *c, int argc, char **argv);

const ctl_cmd cmd_test_hang = {
    .name = "test-hang",
    .args = "[--release] DEV",
    .summary = "(tests) hang DEV's job threads at their next poll, or release them",
    .run = run,
    .hidden = true,
};

static int run(ctl *c, int argc, char **argv)
{
    static const struct option longopts[] = {{"release", no_argument, NULL, 'r'}, {NULL, 0, NULL, 0}};
    Gradd__TestHangRequest th;
    gradd__test_hang_request__init(&th);
    int ch;
    while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (ch != 'r')
            return ctl_usage(&cmd_test_hang, "bad option");
        th.release = true;
    }
    if (optind != argc - 1)
        return ctl_usage(&cmd_test_hang, "expected one device id, e.g. cpu0");
    th.device = argv[optind];
    Gradd__Request req;
    gradd__request__init(&req);
    req.body_case = GRADD__REQUEST__BODY_TEST_HANG;
    req.test_hang = &th;
    Gradd__Response *resp;
    int rc = ctl_call(c, &req, &resp);
    if (rc != CTL_OK)
        return rc;
    if (resp->body_case == GRADD__RESPONSE__BODY_TEST_HANG)
        printf("%s: %u job thread%s %s (%u busy)\n", th.device, resp->test_hang->workers,
               resp->test_hang->workers == 1 ? "" : "s", th.release ? "released" : "will hang", resp->test_hang->busy);
    gradd__response__free_unpacked(resp, NULL);
    return CTL_OK;
}
