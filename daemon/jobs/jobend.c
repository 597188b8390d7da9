/* jobend.c — a job's [job] on_end command (jobend.h). */
#include "jobend.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "access.h"
#include "argsplit.h"
#include "base/ctx.h"
#include "runner.h"
#include "spawn.h"
#include "units.h"

#define HOOK_POLL_MS 100    /* how soon its end, its bound or a stop is seen */
#define HOOK_DRAIN_MS 1000  /* output read after it has ended, at most */
#define HOOK_LINE_MAX 4096  /* a longer line goes to the log in pieces */

void jobend_workdir(const job_config *j, char *out, size_t len)
{
    if (j->type == JOBCFG_PROGRAM && j->workdir[0]) {
        snprintf(out, len, "%s", j->workdir);
        return;
    }
    const char *slash = strrchr(j->source, '/');
    if (!slash)
        snprintf(out, len, ".");
    else if (slash == j->source)
        snprintf(out, len, "/");
    else
        snprintf(out, len, "%.*s", (int)(slash - j->source), j->source);
}

int jobend_check(const job_config *j, char *err, size_t err_len)
{
    if (!j->on_end[0])
        return 0;
    char words[JOBCFG_COMMAND_MAX], why[192], where[PATH_MAX + 64], workdir[PATH_MAX], exe[PATH_MAX];
    jobcfg_where(j, "job", "on_end", where, sizeof where);
    int n = argsplit(j->on_end, words, sizeof words, why, sizeof why);
    if (n < 1) {
        snprintf(err, err_len, "%s: %s", where, n < 0 ? why : "names no command");
        return -1;
    }
    jobend_workdir(j, workdir, sizeof workdir);
    return access_find_executable(where, ACCESS_DEFAULT_PATH, workdir, words, exe, sizeof exe, err, err_len);
}

/* ---- running it ------------------------------------------------------------------- */

typedef struct {
    const jobend_hooks *h;
    char line[HOOK_LINE_MAX + 2];
    size_t line_len;
    uint64_t kept, dropped; /* bytes of output logged, and past JOBEND_OUTPUT_MAX */
} hook_out;

static void say(const jobend_hooks *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const jobend_hooks *h, const char *fmt, ...)
{
    char line[HOOK_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    size_t end = n < 0 ? 0 : (size_t)n < sizeof line - 2 ? (size_t)n : sizeof line - 2;
    line[end] = '\n';
    line[end + 1] = '\0';
    if (h->output)
        h->output(h->user, line);
}

static void emit(hook_out *o)
{
    if (!o->line_len)
        return;
    if (o->line[o->line_len - 1] != '\n')
        o->line[o->line_len++] = '\n';
    o->line[o->line_len] = '\0';
    if (o->kept + o->line_len <= JOBEND_OUTPUT_MAX) {
        o->kept += o->line_len;
        if (o->h->output)
            o->h->output(o->h->user, o->line);
    } else {
        o->dropped += o->line_len;
    }
    o->line_len = 0;
}

/* Read what the pipe has.  false at its end. */
static bool drain(int fd, hook_out *o)
{
    char buf[8192];
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n == 0)
            return false;
        if (n < 0)
            return errno == EAGAIN || errno == EINTR;
        for (ssize_t i = 0; i < n; i++) {
            o->line[o->line_len++] = buf[i];
            if (buf[i] == '\n' || o->line_len == HOOK_LINE_MAX)
                emit(o);
        }
    }
}

static int build_env(spawn_env *e, const jobend_job *jj, const char *socket)
{
    char num[16];
    snprintf(num, sizeof num, "%u", jj->id);
    if (spawn_env_init(e, 16) != 0)
        return -1;
    int rc = spawn_env_base(e, jj->uid);
    rc |= spawn_env_setf(e, "GRADD_JOB_ID", num);
    rc |= spawn_env_setf(e, "GRADD_JOB_STATE", jj->state);
    rc |= spawn_env_setf(e, "GRADD_JOB_NAME", jj->name);
    rc |= spawn_env_setf(e, "GRADD_OUTPUT_DIR", jj->out_dir);
    rc |= spawn_env_setf(e, "GRADD_JOB_REASON", jj->reason);
    rc |= spawn_env_setf(e, "GRADD_SOCKET", socket);
    return rc;
}

/* Everything it needs, built before the fork (spawn.h). */
typedef struct {
    char words[JOBCFG_COMMAND_MAX];
    char *argv[JOBCFG_COMMAND_MAX / 2 + 2];
    char exe[PATH_MAX];
    spawn_env env;
    gid_t *groups;
    int ngroups;
    int devnull, out[2];
} hook;

static int prepare(hook *k, const jobend_job *jj, const char *socket, char *err, size_t err_len)
{
    char why[192];
    int n = argsplit(jj->command, k->words, sizeof k->words, why, sizeof why);
    if (n < 1) {
        snprintf(err, err_len, "%s: %s", jj->where, n < 0 ? why : "names no command");
        return -1;
    }
    const char *w = k->words;
    for (int i = 0; i < n; i++, w = argsplit_next(w))
        k->argv[i] = (char *)w;
    /* Found as the owner, as at submit. */
    access_saved saved;
    if (access_become(jj->uid, jj->gid, &saved, err, err_len) != 0)
        return -1;
    int rc = access_find_executable(jj->where, ACCESS_DEFAULT_PATH, jj->workdir, k->argv[0], k->exe, sizeof k->exe,
                                    err, err_len);
    access_restore(&saved);
    if (rc != 0)
        return -1;
    if (build_env(&k->env, jj, socket) != 0) {
        snprintf(err, err_len, "out of memory, or a variable longer than %d bytes", PATH_MAX);
        return -1;
    }
    bool switch_ids = jj->uid != geteuid() || jj->gid != getegid();
    if (switch_ids && access_groups(jj->uid, jj->gid, &k->groups, &k->ngroups, err, err_len) != 0)
        return -1;
    k->devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (k->devnull < 0 || pipe2(k->out, O_CLOEXEC) != 0) {
        snprintf(err, err_len, "cannot make its pipes: %s", strerror(errno));
        return -1;
    }
    fcntl(k->out[0], F_SETFL, O_NONBLOCK);
    return 0;
}

static void hook_free(hook *k)
{
    spawn_env_free(&k->env);
    free(k->groups);
    int *fds[] = {&k->devnull, &k->out[0], &k->out[1]};
    for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
        if (*fds[i] >= 0)
            close(*fds[i]);
}

void jobend_run(const jobend_job *jj, const char *socket, uint64_t timeout_ms, const jobend_hooks *h, char *result,
                size_t result_len)
{
    hook *k = calloc(1, sizeof *k);
    hook_out *o = calloc(1, sizeof *o);
    char err[1024];
    if (!k || !o) {
        snprintf(result, result_len, "not run: out of memory");
        say(h, "== on_end: %s", result);
        free(k);
        free(o);
        return;
    }
    k->devnull = k->out[0] = k->out[1] = -1;
    o->h = h;
    pid_t pid = -1;
    if (prepare(k, jj, socket, err, sizeof err) == 0) {
        spawn_req r = {.exe = k->exe, .argv = k->argv, .envp = k->env.envp,
                       .switch_ids = jj->uid != geteuid() || jj->gid != getegid(), .uid = jj->uid, .gid = jj->gid,
                       .groups = k->groups, .ngroups = k->ngroups, .workdir = jj->workdir, .in_fd = k->devnull,
                       .out_fd = k->out[1], .fd3 = -1, .fd4 = -1};
        pid = spawn_start(&r, err, sizeof err);
        close(k->out[1]);
        k->out[1] = -1;
    }
    if (pid < 0) {
        snprintf(result, result_len, "not run: %s", err);
        say(h, "== on_end: %s", result);
        hook_free(k);
        free(k);
        free(o);
        return;
    }
    say(h, "== on_end: started %s as pid %d", k->exe, (int)pid);
    uint64_t deadline = ctx_now_ns() + timeout_ms * 1000000u;
    bool open_pipe = true, timed_out = false, stopped = false;
    siginfo_t si;
    for (;;) {
        if (!timed_out && !stopped) {
            timed_out = ctx_now_ns() >= deadline;
            stopped = !timed_out && h->stopping && h->stopping(h->user);
            if (timed_out || stopped)
                runner_signal_group((uint32_t)pid, SIGKILL, jj->uid);
        }
        int got = spawn_wait(pid, open_pipe ? k->out[0] : -1, HOOK_POLL_MS, &si);
        if (got & SPAWN_READABLE)
            open_pipe = drain(k->out[0], o);
        if (got & SPAWN_EXITED)
            break;
    }
    /* What it left behind in its group ends with it. */
    spawn_reap(pid, jj->uid);
    for (uint64_t until = ctx_now_ns() + HOOK_DRAIN_MS * 1000000ull; open_pipe && ctx_now_ns() < until;) {
        struct pollfd pfd = {k->out[0], POLLIN, 0};
        if (poll(&pfd, 1, HOOK_POLL_MS) > 0)
            open_pipe = drain(k->out[0], o);
    }
    emit(o);
    if (o->dropped)
        say(h, "== on_end: %llu bytes of its output past the first %u were dropped", (unsigned long long)o->dropped,
            JOBEND_OUTPUT_MAX);
    char how[160];
    if (si.si_pid == pid)
        spawn_describe_exit(&si, how, sizeof how);
    else
        snprintf(how, sizeof how, "ended, its exit status unknown");
    char lim[32];
    if (timed_out)
        snprintf(result, result_len, "killed with SIGKILL after %s ([daemon] on_end_timeout)",
                 units_format_duration((double)timeout_ms / 1e3, lim, sizeof lim));
    else if (stopped)
        snprintf(result, result_len, "killed with SIGKILL: the daemon is stopping");
    else
        snprintf(result, result_len, "%s", how);
    say(h, "== on_end: %s", result);
    hook_free(k);
    free(k);
    free(o);
}
