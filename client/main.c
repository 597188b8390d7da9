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
               "  -h, --help         this help; `gradctl help COMMAND` for a command's\n"
               "\nexit status: 0 ok, 1 the daemon reported an error, 2 usage error, 3 daemon not reachable\n");
}

/* Edit distance between two short words, for "did you mean": inserts,
 * deletes, changes and swaps of two neighbours (the commonest typo,
 * "stauts") count one each; names longer than the table count as far
 * apart. */
static size_t distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 31 || lb > 31)
        return SIZE_MAX;
    size_t d[32][32];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            size_t best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    }
    return d[la][lb];
}

static const ctl_cmd *find_command(const char *name)
{
    for (const ctl_cmd *const *cmd = ctl_commands; *cmd; cmd++)
        if (strcmp((*cmd)->name, name) == 0)
            return *cmd;
    return NULL;
}

/* An unknown command: the nearest visible one, when it is near enough to
 * be a typo (two edits at most, and fewer than the word has letters); of
 * two as near, the one as long as the word. */
static int unknown_command(const ctl *c, const char *name)
{
    const ctl_cmd *best = NULL;
    size_t bd = SIZE_MAX;
    for (const ctl_cmd *const *cmd = ctl_commands; *cmd; cmd++) {
        size_t d = distance(name, (*cmd)->name);
        bool tie_won = d == bd && best && strlen((*cmd)->name) == strlen(name) && strlen(best->name) != strlen(name);
        if (!(*cmd)->hidden && (d < bd || tie_won)) {
            best = *cmd;
            bd = d;
        }
    }
    char line[512];
    ctl_usage_line(c, line, sizeof line);
    if (best && bd <= 2 && bd < strlen(name))
        ctl_error(c, CTL_ERR_USAGE, "usage", json_pack("{s:s, s:o}", "suggestion", best->name, "usage", jout_str(line)),
                  "unknown command '%s'; did you mean \"%s\"?", name, best->name);
    else
        ctl_error(c, CTL_ERR_USAGE, "usage", json_pack("{s:o}", "usage", jout_str(line)), "unknown command '%s'",
                  name);
    /* One line, not the whole help, which `gradctl help` gives. */
    fprintf(stderr, "usage: %s (`gradctl help` lists the commands)\n", line);
    return CTL_ERR_USAGE;
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
    /* "+": stop at the command name, so that everything after it is the
     * command's, parsed by its own getopt (ctl_getopt).  ':' and opterr 0:
     * errors are reported here, naming gradctl rather than its path. */
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "+:s:Vh", longopts, NULL)) != -1) {
        switch (ch) {
        case 's': snprintf(c.socket_path, sizeof c.socket_path, "%s", optarg); break;
        case 'j': c.json = true; break;
        case 'V': printf("gradctl %s (protocol %u)\n", GRADD_VERSION, WIRE_PROTOCOL_VERSION); return 0;
        case 'h': usage(stdout); return 0;
        case ':': return ctl_usage(&c, "%s needs a value", argv[optind - 1]);
        default:
            if (optopt)
                return ctl_usage(&c, "unknown option '-%c'", optopt);
            return ctl_usage(&c, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc) {
        if (c.json)
            return ctl_usage(&c, "a command is required");
        usage(stderr);
        return CTL_ERR_USAGE;
    }
    const char *name = argv[optind];
    if (strcmp(name, "help") == 0) {
        /* `gradctl help CMD`: that command's help, as `gradctl CMD -h`. */
        if (optind + 1 < argc) {
            c.cmd = find_command(argv[optind + 1]);
            if (!c.cmd)
                return unknown_command(&c, argv[optind + 1]);
            char line[512];
            printf("usage: %s\n  %s\n", ctl_usage_line(&c, line, sizeof line), c.cmd->summary);
            return 0;
        }
        usage(stdout);
        return 0;
    }
    c.cmd = find_command(name);
    if (!c.cmd)
        return unknown_command(&c, name);
    int sub_argc = argc - optind;
    char **sub_argv = argv + optind;
    optind = 0; /* glibc: full reinitialisation for the command's getopt */
    int rc = c.cmd->run(&c, sub_argc, sub_argv);
    ctl_close(&c);
    return rc;
}
