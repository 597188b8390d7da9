/* main.c — gradd: argument parsing and start-up order.
 *
 * Order matters: config first (a bad file changes nothing), then devices and
 * pools, then the socket, so that a client that can connect always finds a
 * daemon that is ready to answer.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/ctx.h"
#include "base/procenv.h"
#include "kernels.h"
#include "gradd-config.h"
#include "base/log.h"
#include "paths.h"
#include "jobs/acct.h"
#include "jobs/queue.h"
#include "jobs/worker.h"
#include "jobs/runjob.h"
#include "server.h"
#include "svc.h"
#include "wire.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: gradd [-c FILE] [-s PATH] [--state-dir DIR] [options]\n"
            "       gradd [-c FILE] run JOB.cfg\n"
            "\n"
            "Resident training daemon: owns the devices and their memory pools and\n"
            "serves gradctl over a Unix socket.  Runs in the foreground.\n"
            "`gradd run JOB.cfg` trains one job in the foreground and exits (no socket);\n"
            "run it again after an interruption to resume from the job's checkpoint.\n"
            "\n"
            "  -c, --config FILE     gradd.conf to read (default: %s/gradd/gradd.conf if it exists)\n"
            "  -s, --socket PATH     control socket (overrides [daemon] socket)\n"
            "      --state-dir DIR   queue and job state (overrides [daemon] state_dir)\n"
            "      --check-config    parse the configuration, print the result and exit\n"
            "      --print-defaults  print every option with its default and exit\n"
            "      --test-hooks      allow simulated device pressure over the socket (tests only)\n"
            "  -v, --verbose         log at debug level\n"
            "  -V, --version         print the version and exit\n"
            "  -h, --help            this help\n",
            GRADD_SYSCONFDIR);
}

/* Under systemd, StateDirectory= (passed as $STATE_DIRECTORY, a
 * colon-separated list: the first) comes before the per-user choices: the
 * service runs as the gradd user, whose home is no place for the queue, and
 * a unit that passed --state-dir would override [daemon] state_dir. */
static void default_state_dir(char *buf, size_t len)
{
    const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME"), *sd = getenv("STATE_DIRECTORY");
    if (sd && *sd == '/')
        snprintf(buf, len, "%.*s", (int)strcspn(sd, ":"), sd);
    else if (geteuid() == 0)
        snprintf(buf, len, "/var/lib/gradd");
    else if (xdg && *xdg == '/')
        snprintf(buf, len, "%s/gradd", xdg);
    else if (home && *home == '/')
        snprintf(buf, len, "%s/.local/state/gradd", home);
    else
        buf[0] = '\0'; /* not a shared path such as /tmp, where another user could make it first */
}

static void default_socket(char *buf, size_t len)
{
    paths_default_socket(buf, len);
}

/* The command line's path, else gradd.conf's, else the default. */
static void choose_path(char *buf, size_t len, const char *arg, const char *conf, void (*dflt)(char *, size_t))
{
    if (arg)
        snprintf(buf, len, "%s", arg);
    else if (conf[0])
        snprintf(buf, len, "%s", conf);
    else
        dflt(buf, len);
}

/* 500 clients at once need 500 descriptors: take what the hard limit allows. */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max > 65536 ? 65536 : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* The kernels of the cpu device's GEMMs (procenv.h), as --version and the
 * log say it; bench/common/blas_core.sh reads it. */
static const char *blas_line(char *buf, size_t len)
{
    snprintf(buf, len, "cpu GEMMs: OpenBLAS's %s kernels%s", kern_cpu_blas_core(),
             getenv("OPENBLAS_CORETYPE") ? " (OPENBLAS_CORETYPE)" : "");
    return buf;
}

int main(int argc, char **argv)
{
    procenv_settle(argv);
    enum { OPT_STATE_DIR = 256, OPT_CHECK, OPT_DEFAULTS, OPT_TEST_HOOKS };
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"socket", required_argument, NULL, 's'},
        {"state-dir", required_argument, NULL, OPT_STATE_DIR},
        {"check-config", no_argument, NULL, OPT_CHECK},
        {"print-defaults", no_argument, NULL, OPT_DEFAULTS},
        {"test-hooks", no_argument, NULL, OPT_TEST_HOOKS},
        {"verbose", no_argument, NULL, 'v'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *config_path = NULL, *socket_arg = NULL, *state_arg = NULL;
    bool check_only = false, test_hooks = false, verbose = false;
    char blas[128];
    int ch;
    while ((ch = getopt_long(argc, argv, "c:s:vVh", longopts, NULL)) != -1) {
        switch (ch) {
        case 'c': config_path = optarg; break;
        case 's': socket_arg = optarg; break;
        case OPT_STATE_DIR: state_arg = optarg; break;
        case OPT_CHECK: check_only = true; break;
        case OPT_DEFAULTS: config_print_defaults(stdout); return 0;
        case OPT_TEST_HOOKS: test_hooks = true; break;
        case 'v': verbose = true; break;
        case 'V':
            printf("gradd %s (protocol %u)\n%s\n", GRADD_VERSION, WIRE_PROTOCOL_VERSION, blas_line(blas, sizeof blas));
            return 0;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    const char *run_job = NULL;
    if (optind < argc && strcmp(argv[optind], "run") == 0) {
        if (optind + 2 != argc) {
            fprintf(stderr, "gradd run: expected one job file\n");
            usage(stderr);
            return 2;
        }
        run_job = argv[optind + 1];
    } else if (optind < argc) {
        fprintf(stderr, "gradd: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }

    /* ---- configuration ---- */
    static gradd_ctx ctx; /* large; lives for the whole process */
    char err[1024];
    char default_conf[PATH_MAX];
    snprintf(default_conf, sizeof default_conf, "%s/gradd/gradd.conf", GRADD_SYSCONFDIR);
    if (!config_path && access(default_conf, F_OK) == 0)
        config_path = default_conf;
    if (config_path) {
        if (config_load(config_path, &ctx.cfg, err, sizeof err) != 0) {
            fprintf(stderr, "gradd: %s\n", err);
            return 2;
        }
    } else {
        config_defaults(&ctx.cfg);
    }
    static const log_level levels[] = {LOG_ERR, LOG_WARN, LOG_INFO, LOG_DEBUG};
    log_set_level(verbose ? LOG_DEBUG : levels[ctx.cfg.log_level]);
    /* Under systemd the journal gets structured entries (job id, device);
     * in a terminal or a pipe, plain lines. */
    if (ctx.cfg.log_target == CONFIG_LOG_JOURNAL ||
        (ctx.cfg.log_target == CONFIG_LOG_AUTO && log_stderr_is_journal())) {
        if (svc_journal_available())
            log_set_sink(svc_journal_sink, NULL);
        else if (ctx.cfg.log_target == CONFIG_LOG_JOURNAL)
            log_warn("[daemon] log_target = journal, but journald is not listening "
                     "(/run/systemd/journal/socket); logging to stderr");
    }

    char socket_path[PATH_MAX], state_dir[PATH_MAX];
    choose_path(socket_path, sizeof socket_path, socket_arg, ctx.cfg.socket_path, default_socket);
    /* Program jobs are told where it is (GRADD_SOCKET). */
    snprintf(ctx.cfg.socket_path, sizeof ctx.cfg.socket_path, "%s", socket_path);
    choose_path(state_dir, sizeof state_dir, state_arg, ctx.cfg.state_dir, default_state_dir);

    if (check_only) {
        printf("config %s: ok\nsocket %s\nstate_dir %s\n", ctx.cfg.source,
               socket_path[0] ? socket_path : "(none: set [daemon] socket or XDG_RUNTIME_DIR)",
               state_dir[0] ? state_dir : "(none: set [daemon] state_dir, HOME or XDG_STATE_HOME)");
        return 0;
    }

    ctx.test_hooks = test_hooks;
    if (run_job)
        return runjob_main(&ctx, run_job, false);

    /* ---- devices, then the socket ---- */
    signal(SIGPIPE, SIG_IGN);
    raise_fd_limit();
    if (!state_dir[0]) {
        log_error("no state directory: HOME and XDG_STATE_HOME are unset; set [daemon] state_dir in gradd.conf "
                  "or pass --state-dir DIR");
        return 1;
    }
    if (queue_prepare_dir(state_dir, err, sizeof err) != 0) {
        log_error("%s", err);
        return 1;
    }
    if (test_hooks)
        log_warn("test hooks enabled: clients may simulate device pressure on cpu devices");
    if (ctx_open(&ctx, err, sizeof err) != 0) {
        log_error("%s", err);
        return 1;
    }
    static queue q;
    static workers ws;
    if (queue_open(&q, state_dir, err, sizeof err) != 0) {
        log_error("%s", err);
        ctx_close(&ctx);
        return 1;
    }
    ctx.q = &q;
    queue_set_limits(&q, ctx.cfg.max_records_per_user, ctx.cfg.max_bytes_per_user);
    static acct_log acct;
    acct_init(&acct, state_dir, ctx.cfg.max_accounting);
    queue_set_acct(&q, &acct);
    static server srv;
    if (server_init(&srv, &ctx, socket_path, err, sizeof err) != 0) {
        log_error("%s", err);
        queue_close(&q);
        ctx_close(&ctx);
        return 1;
    }
    if (workers_start(&ws, &ctx, &q, (int)ctx.cfg.max_jobs_per_device, err, sizeof err) != 0) {
        log_error("%s", err);
        server_free(&srv);
        queue_close(&q);
        ctx_close(&ctx);
        return 1;
    }
    ctx.ws = &ws;
    srv.wd.beats = calloc((size_t)ws.n + 1, sizeof *srv.wd.beats);
    srv.wd.since_ns = calloc((size_t)ws.n + 1, sizeof *srv.wd.since_ns);
    if (!srv.wd.beats || !srv.wd.since_ns)
        srv.wd.usec = 0;
    log_info("gradd %s started (config %s, state %s)", GRADD_VERSION, ctx.cfg.source, state_dir);
    log_info("%s", blas_line(err, sizeof err));
    char ready[PATH_MAX + 64];
    snprintf(ready, sizeof ready, "serving on %s; %d device%s", srv.path, ctx.ndev, ctx.ndev == 1 ? "" : "s");
    svc_ready(ready);
    server_run(&srv);
    /* Running jobs checkpoint and go back to the queue before we exit;
     * tell systemd that may take a while. */
    svc_extend_timeout((ctx.cfg.stop_timeout_ms + 5000) * 1000);
    int stuck = workers_stop(&ws, ctx.cfg.stop_timeout_ms);
    if (stuck) {
        /* Waiting longer could be for ever (a hung device call), and under
         * systemd ends in SIGKILL anyway.  The stuck threads may still use
         * the queue, the pools and the loop, so nothing is freed: save
         * what the queue has not, and go.  Their jobs are still recorded
         * as running, so they resume at the next start. */
        queue_save_unsaved(&q);
        log_error("exiting with status 3: %d job thread%s did not stop within [daemon] stop_timeout (%llums); "
                  "see above",
                  stuck, stuck == 1 ? "" : "s", (unsigned long long)ctx.cfg.stop_timeout_ms);
        _exit(3);
    }
    ctx.ws = NULL;
    server_free(&srv);
    queue_close(&q);
    ctx_close(&ctx);
    log_info("stopped");
    return 0;
}
