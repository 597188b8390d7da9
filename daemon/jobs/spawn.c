/* spawn.c — a process started as a job's owner (spawn.h). */
#include "spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <poll.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "access.h"
#include "runner.h"

/* ---- the environment ------------------------------------------------------------- */

int spawn_env_init(spawn_env *e, size_t cap)
{
    e->n = 0;
    e->cap = cap + 1;
    e->envp = calloc(e->cap, sizeof *e->envp);
    return e->envp ? 0 : -1;
}

void spawn_env_free(spawn_env *e)
{
    for (size_t i = 0; e->envp && i < e->n; i++)
        free(e->envp[i]);
    free(e->envp);
    e->envp = NULL;
    e->n = 0;
}

int spawn_env_set(spawn_env *e, const char *name_value)
{
    size_t nl = strcspn(name_value, "=") + 1;
    char *copy = strdup(name_value);
    if (!copy)
        return -1;
    for (size_t i = 0; i < e->n; i++)
        if (!strncmp(e->envp[i], name_value, nl)) {
            free(e->envp[i]);
            e->envp[i] = copy;
            return 0;
        }
    if (e->n + 1 >= e->cap) {
        free(copy);
        return -1;
    }
    e->envp[e->n++] = copy;
    e->envp[e->n] = NULL;
    return 0;
}

int spawn_env_setf(spawn_env *e, const char *name, const char *value)
{
    char buf[PATH_MAX * 2 + 64];
    if ((size_t)snprintf(buf, sizeof buf, "%s=%s", name, value) >= sizeof buf)
        return -1;
    return spawn_env_set(e, buf);
}

int spawn_env_base(spawn_env *e, uid_t uid)
{
    struct passwd pw, *res = NULL;
    char pwbuf[4096], user[32];
    bool known = getpwuid_r(uid, &pw, pwbuf, sizeof pwbuf, &res) == 0 && res;
    snprintf(user, sizeof user, "%u", (unsigned)uid);
    int rc = spawn_env_setf(e, "PATH", ACCESS_DEFAULT_PATH);
    rc |= spawn_env_setf(e, "HOME", known ? pw.pw_dir : "/");
    rc |= spawn_env_setf(e, "USER", known ? pw.pw_name : user);
    rc |= spawn_env_setf(e, "LOGNAME", known ? pw.pw_name : user);
    rc |= spawn_env_setf(e, "LANG", "C.UTF-8");
    return rc;
}

/* ---- starting it ------------------------------------------------------------------- */

/* What the child reports before execve: which step failed, and errno. */
enum { STAGE_IDS = 1, STAGE_CAPS, STAGE_FDS, STAGE_WORKDIR, STAGE_EXEC };

/* In the child: async-signal-safe calls only.  Never returns. */
static void child(const spawn_req *p, int report_fd)
{
    int report[2] = {0, 0};
    /* Handlers and ignored signals are the daemon's, not the program's
     * (an ignored SIGPIPE would survive execve). */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++)
        sigaction(sig, &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setsid();
    if (dup2(p->in_fd, 0) < 0 || dup2(p->out_fd, 1) < 0 || dup2(p->out_fd, 2) < 0) {
        report[0] = STAGE_FDS;
        goto fail;
    }
    if (p->switch_ids) {
        /* Raw system calls: glibc's wrappers would signal the daemon's
         * other threads, which do not exist in this child. */
        report[0] = STAGE_IDS;
        if (syscall(SYS_setgroups, (size_t)p->ngroups, p->groups) != 0 ||
            syscall(SYS_setresgid, p->gid, p->gid, p->gid) != 0 || syscall(SYS_setresuid, p->uid, p->uid, p->uid) != 0)
            goto fail;
    }
    /* A service user keeps CAP_SETUID and CAP_SETGID across setresuid
     * (no uid was 0), and an ambient capability passes to the program:
     * clear every set, then check. */
    report[0] = STAGE_CAPS;
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct caps[2];
    memset(caps, 0, sizeof caps);
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL)
        goto fail;
    if (p->uid != 0 && syscall(SYS_capset, &hdr, caps) != 0)
        goto fail;
    if (p->uid != 0 && (syscall(SYS_capget, &hdr, caps) != 0 || caps[0].effective || caps[0].permitted ||
                        caps[0].inheritable || caps[1].effective || caps[1].permitted || caps[1].inheritable)) {
        errno = EPERM;
        goto fail;
    }
    report[0] = STAGE_FDS;
    if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0)
        goto fail;
    /* Both are above 4, so these make fresh fds without close-on-exec. */
    if (p->fd3 >= 0 && (dup2(p->fd3, 3) != 3 || dup2(p->fd4, 4) != 4))
        goto fail;
    report[0] = STAGE_WORKDIR;
    if (chdir(p->workdir) != 0)
        goto fail;
    report[0] = STAGE_EXEC;
    execve(p->exe, p->argv, p->envp);
fail:
    report[1] = errno;
    ssize_t w = write(report_fd, report, sizeof report);
    (void)w;
    _exit(127);
}

pid_t spawn_start(const spawn_req *r, char *err, size_t err_len)
{
    int report[2];
    if (pipe2(report, O_CLOEXEC) != 0) {
        snprintf(err, err_len, "cannot start %s: pipe: %s", r->exe, strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, err_len, "cannot start %s: fork: %s", r->exe, strerror(errno));
        close(report[0]);
        close(report[1]);
        return -1;
    }
    if (pid == 0)
        child(r, report[1]);
    close(report[1]);
    /* Until execve (the report pipe closes) or a report: then the child
     * has its own process group, so that kill(-pid) reaches it. */
    int got_report[2];
    ssize_t got;
    do
        got = read(report[0], got_report, sizeof got_report);
    while (got < 0 && errno == EINTR);
    close(report[0]);
    if (got != (ssize_t)sizeof got_report)
        return pid;
    static const char *const what[] = {"", "cannot take the owner's uid, gid and groups", "cannot drop capabilities",
                                       "cannot set up stdin, stdout and stderr", "cannot enter the workdir",
                                       "cannot execute"};
    int stage = got_report[0] >= 1 && got_report[0] <= STAGE_EXEC ? got_report[0] : 0;
    const char *arg = stage == STAGE_WORKDIR ? r->workdir : stage == STAGE_EXEC ? r->exe : "";
    snprintf(err, err_len, "%s%s%s: %s", what[stage], arg[0] ? " " : "", arg, strerror(got_report[1]));
    waitpid(pid, NULL, 0);
    return -1;
}

int spawn_wait(pid_t pid, int fd, int poll_ms, siginfo_t *si)
{
    int got = 0;
    struct pollfd pfd = {fd, POLLIN, 0};
    if (poll(&pfd, 1, poll_ms) > 0 && fd >= 0)
        got |= SPAWN_READABLE;
    memset(si, 0, sizeof *si);
    int w = waitid(P_PID, (id_t)pid, si, WEXITED | WNOHANG | WNOWAIT);
    if ((w == 0 && si->si_pid == pid) || (w != 0 && errno != EINTR))
        got |= SPAWN_EXITED;
    return got;
}

void spawn_reap(pid_t pid, uid_t owner)
{
    runner_signal_group((uint32_t)pid, SIGKILL, owner);
    waitpid(pid, NULL, 0);
}

void spawn_describe_exit(const siginfo_t *si, char *buf, size_t len)
{
    if (si->si_code == CLD_EXITED) {
        snprintf(buf, len, "exited with status %d", si->si_status);
        return;
    }
    const char *abbrev = sigabbrev_np(si->si_status);
    snprintf(buf, len, "killed by signal %s%s%s", abbrev ? "SIG" : "", abbrev ? abbrev : "",
             si->si_code == CLD_DUMPED ? " (core dumped)" : "");
    if (!abbrev)
        snprintf(buf, len, "killed by signal %d", si->si_status);
}
