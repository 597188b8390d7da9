/* cmd_submit.c — gradctl submit: check a job file here, then queue it.
 *
 * The file is read once and those bytes are both validated and sent, so the
 * daemon queues exactly what passed the check here (it checks again). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctl.h"
#include "jobcfg.h"
#include "jobfmt.h"
#include "jout.h"
#include "units.h"

/* The most gradctl reads: the largest [daemon] max_job_file any gradd can
 * be given.  The daemon's own limit decides, and says so. */
#define SUBMIT_MAX_FILE ((size_t)64 << 20)

/* A job file that cannot be read: "bad_job", naming the file (standard
 * input is "(stdin)").  -1. */
__attribute__((format(printf, 3, 4))) static int bad_file(const ctl *c, const char *path, const char *fmt, ...)
{
    const char *name = strcmp(path, "-") == 0 ? "(stdin)" : path;
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    ctl_error(c, CTL_ERR_USAGE, "bad_job", json_pack("{s:o}", "file", jout_str(name)), "%s: %s", name, why);
    return -1;
}

/* Read the whole file into a malloc'd buffer, refusing more than the cap.
 * 0, or -1 after reporting why. */
static int read_job_file(const ctl *c, const char *path, uint8_t **out, size_t *out_len)
{
    /* "-": standard input (a script's generated job), read to its end. */
    bool in = strcmp(path, "-") == 0;
    int fd = in ? dup(STDIN_FILENO) : open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return bad_file(c, path, "cannot open: %s", strerror(errno));
    struct stat st;
    if (!in && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        return bad_file(c, path, "not a regular file");
    }
    char lim[16];
    units_format_size(SUBMIT_MAX_FILE, lim, sizeof lim);
    /* One byte more than the cap tells "too big" from "exactly the cap". */
    uint8_t *buf = malloc(SUBMIT_MAX_FILE + 1);
    if (!buf) {
        close(fd);
        ctl_error(c, CTL_ERR_DAEMON, "internal", NULL, "out of memory");
        return -1;
    }
    size_t len = 0;
    while (len < SUBMIT_MAX_FILE + 1) {
        ssize_t n = read(fd, buf + len, SUBMIT_MAX_FILE + 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return bad_file(c, path, "cannot read: %s", strerror(e));
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    if (len > SUBMIT_MAX_FILE) {
        free(buf);
        return bad_file(c, path, "larger than %s, the most a job file may be", lim);
    }
    *out = buf;
    *out_len = len;
    return 0;
}

static int parse_priority(const char *text, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end || errno || v < 0 || v > JOBCFG_PRIORITY_MAX)
        return -1;
    *out = v;
    return 0;
}

/* The daemon's rule for names (jobcfg_name_problem), checked here first. */
static int check_name(const char *name)
{
    return jobcfg_name_problem(name) || strlen(name) >= sizeof ((job_config *)0)->name ? -1 : 0;
}

/* The most jobs one job may wait for: the daemon's bound, which it checks. */
#define SUBMIT_AFTER_MAX 16

/* --after ID[,ID...], given once or more: the ids appended to after[*n]. */
static int parse_after(const ctl *c, char *text, uint32_t *after, size_t *n)
{
    size_t before = *n;
    for (char *save = NULL, *tok = strtok_r(text, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (*n == SUBMIT_AFTER_MAX)
            return ctl_usage(c, "--after: at most %d jobs", SUBMIT_AFTER_MAX);
        if (jobfmt_parse_id(tok, &after[*n]) != 0)
            return ctl_usage(c, "--after: '%s' is not a job id", tok);
        (*n)++;
    }
    if (*n == before)
        return ctl_usage(c, "--after needs a job id, or several separated by commas");
    return CTL_OK;
}

static int run(ctl *c, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"name", required_argument, NULL, 'n'},
        {"priority", required_argument, NULL, 'p'},
        {"after", required_argument, NULL, 'a'},
        {"hold", no_argument, NULL, 'H'},
        {NULL, 0, NULL, 0},
    };
    Gradd__SubmitRequest sr = GRADD__SUBMIT_REQUEST__INIT;
    uint32_t after[SUBMIT_AFTER_MAX];
    size_t nafter = 0;
    int ch;
    while ((ch = ctl_getopt(c, argc, argv, "n:p:", longopts)) != -1) {
        switch (ch) {
        case 'a':
            if (parse_after(c, optarg, after, &nafter) != CTL_OK)
                return CTL_ERR_USAGE;
            sr.after = after;
            sr.n_after = nafter;
            break;
        case 'H': sr.hold = true; break;
        case 'n':
            if (check_name(optarg) != 0)
                return ctl_usage(c, "--name must be 1 to %zu printable bytes",
                                 sizeof ((job_config *)0)->name - 1);
            sr.name = optarg;
            break;
        case 'p':
            if (parse_priority(optarg, &sr.priority) != 0)
                return ctl_usage(c, "--priority must be a whole number from %d to %d (higher runs first)",
                                 0, JOBCFG_PRIORITY_MAX);
            sr.has_priority = true;
            break;
        default: return CTL_ERR_USAGE; /* ctl_getopt said why */
        }
    }
    if (optind >= argc)
        return ctl_usage(c, "a job file is required (see etc/jobs/ for examples)");
    if (optind + 1 < argc)
        return ctl_usage(c, "unexpected argument '%s'", argv[optind + 1]);
    const char *path = argv[optind];

    uint8_t *contents = NULL;
    size_t len = 0;
    if (read_job_file(c, path, &contents, &len) != 0)
        return CTL_ERR_USAGE;
    /* Where the job came from: it anchors relative paths, and the daemon's
     * messages name it.  From standard input that is "(stdin)" in the
     * current directory, so relative paths mean what they do in the shell
     * that piped it; messages call it "(stdin)". */
    char abs[PATH_MAX + 16];
    bool in = strcmp(path, "-") == 0;
    if (in) {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd)) {
            free(contents);
            return ctl_error(c, CTL_ERR_USAGE, "bad_job", NULL, "the current directory: %s", strerror(errno));
        }
        snprintf(abs, sizeof abs, "%s/(stdin)", strcmp(cwd, "/") == 0 ? "" : cwd);
        c->job_stdin = true;
    } else if (!realpath(path, abs)) {
        int e = errno;
        free(contents);
        return bad_file(c, path, "%s", strerror(e)), CTL_ERR_USAGE;
    }
    /* The message names FILE:LINE: [section] key, as the user wrote FILE. */
    char err[PATH_MAX + 512];
    const char *name = in ? "(stdin)" : path;
    job_config *cfg = malloc(sizeof *cfg);
    if (!cfg) {
        free(contents);
        return ctl_error(c, CTL_ERR_DAEMON, "internal", NULL, "out of memory");
    }
    /* After other jobs: what they make may not be there yet (the daemon
     * checks it again when the job starts). */
    int lrc = nafter ? jobcfg_load_later(contents, len, name, cfg, err, sizeof err)
                     : jobcfg_load_mem(contents, len, name, cfg, err, sizeof err);
    if (lrc != 0) {
        free(cfg);
        free(contents);
        return ctl_error(c, CTL_ERR_USAGE, "bad_job", ctl_where_fields(err, name), "%s", err);
    }
    free(cfg);
    sr.path = abs;
    c->job_path = abs;
    sr.contents.data = contents;
    sr.contents.len = len;
    /* The job's outputs are created as this shell would create them: its
     * umask (read by setting it, so set it back). */
    mode_t mask = umask(022);
    umask(mask);
    sr.umask = (uint32_t)mask;
    sr.has_umask = true;

    Gradd__Response *resp;
    int rc = ctl_call(c, "submit", GRADD__REQUEST__BODY_SUBMIT, &sr, &resp);
    free(contents);
    if (rc != CTL_OK)
        return rc;
    rc = jobfmt_done(c, resp->submit->id, resp->submit->name, "queued");
    ctl_free(resp);
    return rc;
}

const ctl_cmd cmd_submit = {
    .name = "submit",
    .args = "FILE|- [--name NAME] [--priority P] [--after ID[,ID...]] [--hold]",
    .summary = "check a job file and queue it",
    .run = run,
};
