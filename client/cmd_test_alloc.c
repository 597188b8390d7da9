/* cmd_test_alloc.c — gradctl test-alloc: allocate from a device's pool by
 * hand and hold the block, or free all such blocks.  Only a daemon started
 * with --test-hooks accepts it; integration tests use it to put real blocks
 * in the pool before there are jobs. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"

static int run(ctl *c, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"device", required_argument, NULL, 'd'},
        {"tag", required_argument, NULL, 't'},
        {"job", required_argument, NULL, 'j'},
        {"free-all", no_argument, NULL, 'F'},
        {NULL, 0, NULL, 0},
    };
    Gradd__TestAllocRequest ta = GRADD__TEST_ALLOC_REQUEST__INIT;
    ta.device = "cpu0";
    int ch;
    while ((ch = ctl_getopt(c, argc, argv, "d:", longopts)) != -1) {
        switch (ch) {
        case 'd': ta.device = optarg; break;
        case 't': ta.tag = optarg; break;
        case 'j': ta.job = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'F': ta.free_all = true; break;
        default: return CTL_ERR_USAGE; /* ctl_getopt said why */
        }
    }
    if (ta.free_all && optind != argc)
        return ctl_usage(c, "--free-all takes no SIZE");
    int rc = ta.free_all ? CTL_OK : ctl_size_arg(c, argc, argv, &ta.bytes);
    if (rc != CTL_OK)
        return rc;
    Gradd__Response *resp;
    rc = ctl_call(c, "test-alloc", GRADD__REQUEST__BODY_TEST_ALLOC, &ta, &resp);
    if (rc != CTL_OK)
        return rc;
    const Gradd__TestAllocResponse *r = resp->test_alloc;
    if (r->oom && *r->oom) {
        rc = ctl_error(c, CTL_ERR_DAEMON, "oom", NULL, "%s", r->oom);
    } else {
        printf("%s: %u block%s held\n", ta.device, r->held, r->held == 1 ? "" : "s");
    }
    ctl_free(resp);
    return rc;
}

const ctl_cmd cmd_test_alloc = {
    .name = "test-alloc",
    .args = "-d DEV [--tag TAG] [--job N] (SIZE | --free-all)",
    .summary = "(tests) allocate SIZE from a pool and hold it, or free what is held",
    .run = run,
    .hidden = true,
};
