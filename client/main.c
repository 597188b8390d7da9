/* main.c — gradctl: global options, then one command from the table. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "gradd-config.h"
#include "jout.h"
#include "paths.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: gradctl [-s PATH] [--json] COMMAND [ARGS]\n\n"
               "Talks to gradd over its control socket ($GRADD_SOCKET, or the default).\n\n"
               "commands:\n");
    for (const ctl_cmd *const *c = ctl_commands; *c; c++)
        if (!(*c)->hidden)
            fprintf(f, "  %-10s %s\n", (*c)->name, (*c)->summary);
    fprintf(f, "\noptions:\n"
               "  -s, --socket PATH  daemon socket (default: $GRADD_SOCKET, then the system default)\n"
               "      --json         machine-readable output\n"
               "  -V, --version      print the version\n"
               "  -h, --help         this help; `gradctl COMMAND -h` for a command's\n"
               "\nexit status: 0 ok, 1 the daemon reported an error, 2 usage error, 3 daemon not reachable\n");
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"socket", required_argument, NULL, 's'},
        {"json", no_argument, NULL, 'j'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    jout_init();
    ctl c = {.fd = -1};
    paths_client_socket(c.socket_path, sizeof c.socket_path);
    int ch;
    /* "+": stop at the command name so its own options reach it. */
    while ((ch = getopt_long(argc, argv, "+s:Vh", longopts, NULL)) != -1) {
        switch (ch) {
        case 's': snprintf(c.socket_path, sizeof c.socket_path, "%s", optarg); break;
        case 'j': c.json = true; break;
        case 'V': printf("gradctl %s (protocol %u)\n", GRADD_VERSION, WIRE_PROTOCOL_VERSION); return 0;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return CTL_ERR_USAGE;
        }
    }
    if (optind >= argc) {
        usage(stderr);
        return CTL_ERR_USAGE;
    }
    const char *name = argv[optind];
    if (strcmp(name, "help") == 0) {
        usage(stdout);
        return 0;
    }
    for (const ctl_cmd *const *cmd = ctl_commands; *cmd; cmd++) {
        if (strcmp((*cmd)->name, name) != 0)
            continue;
        int sub_argc = argc - optind;
        char **sub_argv = argv + optind;
        /* Let every command accept --json after its name too, and -h. */
        for (int i = 1; i < sub_argc; i++) {
            if (strcmp(sub_argv[i], "--") == 0)
                break;
            if (strcmp(sub_argv[i], "-h") == 0 || strcmp(sub_argv[i], "--help") == 0) {
                printf("usage: gradctl [-s PATH] [--json] %s %s\n  %s\n", (*cmd)->name, (*cmd)->args,
                       (*cmd)->summary);
                return 0;
            }
            if (strcmp(sub_argv[i], "--json") == 0) {
                c.json = true;
                memmove(sub_argv + i, sub_argv + i + 1, (size_t)(sub_argc - i - 1) * sizeof *sub_argv);
                sub_argc--;
                i--;
            }
        }
        optind = 0; /* glibc: full reinitialisation for the command's getopt */
        c.cmd = *cmd;
        int rc = (*cmd)->run(&c, sub_argc, sub_argv);
        ctl_close(&c);
        return rc;
    }
    fprintf(stderr, "gradctl: unknown command '%s'\n", name);
    usage(stderr);
    return CTL_ERR_USAGE;
}
