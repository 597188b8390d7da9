/* runner_program.c — a user's own program as a job ([job] type = program).
 *
 * The job thread forks the program as the job's owner: their groups, gid
 * and uid, no capabilities left (the daemon may be root, or a service user
 * with CAP_SETUID and CAP_SETGID in its ambient set, which setresuid alone
 * would pass on), in a session and process group of its own, stdin at
 * /dev/null, stdout and stderr into a pipe that this thread copies into the
 * job's log line by line (the log bounds it), in its workdir, with a clean
 * environment.  The thread polls the pipe and the job's hooks every 100 ms,
 * so a cancel or a daemon shutdown is seen at once: SIGTERM to the group,
 * then SIGKILL to the group after [program] grace.
 *
 * With [program] allocator = gradd, the program gets a pool page and an
 * eventfd (pool_shm.h) as fds 3 and 4, which the device's pool_peers
 * watch while it runs: its allocator library publishes its statistics
 * there and asks for reclaims, and the daemon sets its budget ([memory]
 * limit) and asks for trims.
 *
 * The process is started as the owner by spawn.h, with everything it
 * needs built here beforehand; a failure before execve is the job's
 * reason.
 */
#include "runner.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "access.h"
#include "argsplit.h"
#include "pool/pool_shm.h"
#include "spawn.h"
#include "units.h"
#include "utf8.h"

#define PROG_LINE_MAX 4096  /* a longer line goes to the log in pieces */
#define PROG_TAIL_LINES 5   /* the last lines of output a failure shows */
#define PROG_TAIL_WIDTH 160 /* ... each cut to this many bytes */
#define PROG_POLL_MS 100    /* how soon a cancel or shutdown is seen */
#define PROG_CHANGED_MS 1000 /* how often watchers hear of its time and memory */
#define PROG_DRAIN_MS 1000  /* output read after the group is gone, at most */

typedef struct {
    /* Built before the fork. */
    char *words;      /* argsplit of [program] command */
    char **argv;
    spawn_env env;
    char exe[PATH_MAX];
    gid_t *groups;
    int ngroups;
    bool switch_ids;  /* the owner is not the daemon's own user */
    uid_t uid;
    gid_t gid;
    const char *workdir;
    int devnull, out[2];
    /* The pool page and its eventfd (pool_shm.h), when PyTorch allocates
     * from gradd's pool; the program gets them as fds 3 and 4. */
    int page_fd, event_fd;
    /* The output, line by line. */
    char line[PROG_LINE_MAX + 2];
    size_t line_len;
    char tail[PROG_TAIL_LINES][PROG_TAIL_WIDTH + 1];
    int tail_next, tail_n;
    bool pooled; /* added to the device's pool_peers */
} prog;

static uint64_t now_ms(void) { return ctx_now_ns() / 1000000u; }

/* ---- the environment ------------------------------------------------------------- */

/* What libgradd-alloc reads (alloc/gradd_alloc.h): the library, the page
 * and eventfd, the device, and the pool's policies from [pool]. */
static int pool_env(prog *p, const runner_env *env)
{
    const dev *d = env->ctx->devs[env->dev];
    pool_config pc;
    pool_get_config(env->ctx->pools[env->dev], &pc);
    char num[64];
    int rc = spawn_env_setf(&p->env, "GRADD_ALLOC_LIB", env->ctx->alloc_lib);
    rc |= spawn_env_setf(&p->env, "GRADD_POOL_FD", "3");
    rc |= spawn_env_setf(&p->env, "GRADD_POOL_EVENTFD", "4");
    rc |= spawn_env_setf(&p->env, "GRADD_ALLOC_BACKEND", d->kind == DEV_KIND_CUDA ? "cuda" : "cpu");
    if (d->kind != DEV_KIND_CUDA) {
        size_t f = 0, t = 0;
        dev_mem_info((dev *)d, &f, &t);
        snprintf(num, sizeof num, "%zu", t);
        rc |= spawn_env_setf(&p->env, "GRADD_ALLOC_CPU_CAPACITY", num);
    }
    if (pc.expandable_segments)
        rc |= spawn_env_setf(&p->env, "GRADD_ALLOC_EXPANDABLE", "1");
    if (pc.gc_threshold > 0) {
        snprintf(num, sizeof num, "%.6g", pc.gc_threshold);
        rc |= spawn_env_setf(&p->env, "GRADD_ALLOC_GC_THRESHOLD", num);
    }
    if (pc.low_watermark) {
        snprintf(num, sizeof num, "%zu", pc.low_watermark);
        rc |= spawn_env_setf(&p->env, "GRADD_ALLOC_LOW_WATERMARK", num);
    }
    if (pc.max_split_size && pc.max_split_size != SIZE_MAX) {
        snprintf(num, sizeof num, "%zu", pc.max_split_size);
        rc |= spawn_env_setf(&p->env, "GRADD_ALLOC_MAX_SPLIT", num);
    }
    if (pc.trim_every_ms) {
        snprintf(num, sizeof num, "%llu", (unsigned long long)pc.trim_every_ms);
        rc |= spawn_env_setf(&p->env, "GRADD_ALLOC_TRIM_EVERY_MS", num);
    }
    return rc;
}

/* A clean environment: what the program needs to find its way (PATH, who
 * and where it is), gradd's variables, then the job's own entries, which
 * may replace the first group but not gradd's (jobcfg_check_env). */
static int build_env(prog *p, const runner_env *env, const job_config *cfg, char *err, size_t err_len)
{
    char words[JOBCFG_COMMAND_MAX], why[128];
    int n = argsplit(cfg->env, words, sizeof words, why, sizeof why);
    if (n < 0) {
        snprintf(err, err_len, "[program] env: %s", why);
        return -1;
    }
    if (spawn_env_init(&p->env, (size_t)n + 32) != 0) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    char num[32];
    const dev *d = env->ctx->devs[env->dev];
    char cuda[16] = "";
    if (d->kind == DEV_KIND_CUDA)
        snprintf(cuda, sizeof cuda, "%d", d->index);
    snprintf(num, sizeof num, "%u", env->job_id);
    int rc = spawn_env_base(&p->env, env->uid);
    /* Python buffers a pipe in 8 KiB blocks: without this its prints
     * would reach `gradctl logs` and `watch` minutes late. */
    rc |= spawn_env_setf(&p->env, "PYTHONUNBUFFERED", "1");
    rc |= spawn_env_setf(&p->env, "CUDA_VISIBLE_DEVICES", cuda);
    rc |= spawn_env_setf(&p->env, "GRADD_JOB_ID", num);
    rc |= spawn_env_setf(&p->env, "GRADD_SOCKET", env->ctx->cfg.socket_path);
    if (p->page_fd >= 0)
        rc |= pool_env(p, env);
    const char *w = words;
    for (int i = 0; i < n; i++, w = argsplit_next(w))
        rc |= spawn_env_set(&p->env, w);
    /* gradd's folder first, so that its shim runs and `import gradd`
     * finds gradd's package; the job's own entries after it. */
    if (env->ctx->python_dir[0]) {
        const char *own = NULL;
        for (size_t i = 0; i < p->env.n; i++)
            if (!strncmp(p->env.envp[i], "PYTHONPATH=", 11))
                own = p->env.envp[i] + 11;
        char joined[PATH_MAX * 2];
        snprintf(joined, sizeof joined, "%s%s%s", env->ctx->python_dir, own && *own ? ":" : "", own ? own : "");
        rc |= spawn_env_setf(&p->env, "PYTHONPATH", joined);
    }
    if (rc) {
        snprintf(err, err_len, "out of memory, or a variable longer than %d bytes", PATH_MAX);
        return -1;
    }
    return 0;
}

/* ---- starting it ------------------------------------------------------------------- */

static void prog_free(prog *p)
{
    free(p->words);
    free(p->argv);
    spawn_env_free(&p->env);
    free(p->groups);
    int *fds[] = {&p->devnull, &p->out[0], &p->out[1], &p->page_fd, &p->event_fd};
    for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
        if (*fds[i] >= 0) {
            close(*fds[i]);
            *fds[i] = -1;
        }
}

static int prepare(prog *p, const runner_env *env, const job_config *cfg, char *err, size_t err_len)
{
    char why[128];
    size_t len = strlen(cfg->command) + 1;
    if (!(p->words = malloc(len)) || !(p->argv = calloc(len + 1, sizeof *p->argv))) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    int n = argsplit(cfg->command, p->words, len, why, sizeof why);
    if (n < 1) {
        snprintf(err, err_len, "[program] command: %s", n < 0 ? why : "is empty");
        return -1;
    }
    const char *w = p->words;
    for (int i = 0; i < n; i++, w = argsplit_next(w))
        p->argv[i] = (char *)w;
    /* Found as the owner (this thread's filesystem identity), as at submit. */
    if (access_find_command(cfg, p->argv[0], p->exe, sizeof p->exe, err, err_len) != 0)
        return -1;
    if (build_env(p, env, cfg, err, err_len) != 0)
        return -1;
    p->uid = env->uid;
    p->gid = env->gid;
    p->switch_ids = env->uid != geteuid() || env->gid != getegid();
    if (p->switch_ids && access_groups(env->uid, env->gid, &p->groups, &p->ngroups, err, err_len) != 0)
        return -1;
    p->workdir = cfg->workdir;
    p->devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (p->devnull < 0 || pipe2(p->out, O_CLOEXEC) != 0) {
        snprintf(err, err_len, "cannot make the program's pipes: %s", strerror(errno));
        return -1;
    }
    fcntl(p->out[0], F_SETFL, O_NONBLOCK);
    return 0;
}

/* Start it; its pid (its process group's id), or -1 with err. */
static pid_t start(prog *p, char *err, size_t err_len)
{
    spawn_req r = {.exe = p->exe, .argv = p->argv, .envp = p->env.envp, .switch_ids = p->switch_ids,
                   .uid = p->uid, .gid = p->gid, .groups = p->groups, .ngroups = p->ngroups,
                   .workdir = p->workdir, .in_fd = p->devnull, .out_fd = p->out[1],
                   .fd3 = p->page_fd, .fd4 = p->page_fd >= 0 ? p->event_fd : -1};
    pid_t pid = spawn_start(&r, err, err_len);
    close(p->out[1]);
    p->out[1] = -1;
    return pid;
}

/* ---- its output -------------------------------------------------------------------- */

static void emit_line(prog *p, const runner_env *env)
{
    if (!p->line_len)
        return;
    if (p->line[p->line_len - 1] != '\n')
        p->line[p->line_len++] = '\n';
    p->line[p->line_len] = '\0';
    if (env->output)
        env->output(env->note_user, p->line);
    size_t keep = p->line_len - 1 < PROG_TAIL_WIDTH ? p->line_len - 1 : PROG_TAIL_WIDTH;
    memcpy(p->tail[p->tail_next], p->line, keep);
    p->tail[p->tail_next][keep] = '\0';
    p->tail_next = (p->tail_next + 1) % PROG_TAIL_LINES;
    if (p->tail_n < PROG_TAIL_LINES)
        p->tail_n++;
    p->line_len = 0;
}

/* Read what the pipe has.  false at its end (every writer gone). */
static bool drain(prog *p, const runner_env *env)
{
    char buf[16384];
    for (;;) {
        ssize_t n = read(p->out[0], buf, sizeof buf);
        if (n == 0)
            return false;
        if (n < 0)
            return errno == EAGAIN || errno == EINTR;
        for (ssize_t i = 0; i < n; i++) {
            p->line[p->line_len++] = buf[i];
            if (buf[i] == '\n' || p->line_len == PROG_LINE_MAX)
                emit_line(p, env);
        }
    }
}

/* "\nlast lines of output:\n..." with each line made safe to show. */
static void append_tail(const prog *p, char *msg, size_t len)
{
    if (!p->tail_n)
        return;
    size_t n = strlen(msg);
    n += (size_t)snprintf(msg + n, n < len ? len - n : 0, "\nlast lines of output:");
    int first = (p->tail_next - p->tail_n + PROG_TAIL_LINES) % PROG_TAIL_LINES;
    for (int k = 0; k < p->tail_n && n + 4 < len; k++) {
        char safe[PROG_TAIL_WIDTH * 4 + 1];
        utf8_safe(p->tail[(first + k) % PROG_TAIL_LINES], 0, safe, sizeof safe);
        n += (size_t)snprintf(msg + n, len - n, "\n  %s", safe);
    }
}

/* ---- signals to its group --------------------------------------------------------- */

int runner_signal_group(uint32_t pgid, int sig, uid_t owner)
{
    if (kill(-(pid_t)pgid, sig) == 0 || errno != EPERM || geteuid() == 0)
        return errno == EPERM ? -1 : 0;
    /* A service user with CAP_SETUID but not CAP_KILL: signal as the
     * owner, from this thread alone (the raw call changes no other), and
     * back; its filesystem identity follows the euid, so it is put back
     * too. */
    uid_t euid = geteuid(), fsuid = (uid_t)setfsuid((uid_t)-1);
    if (syscall(SYS_setresuid, (uid_t)-1, owner, (uid_t)-1) != 0)
        return -1;
    int rc = kill(-(pid_t)pgid, sig), e = errno;
    syscall(SYS_setresuid, (uid_t)-1, euid, (uid_t)-1);
    setfsuid(fsuid);
    errno = e;
    return rc == 0 || e == ESRCH ? 0 : -1;
}

void runner_end_orphans(uint32_t pgid, uid_t owner)
{
    if (!pgid)
        return;
    /* The group is the program's if its session has the same id (it was
     * made by the program's setsid) and a member is the owner's: a pid
     * given since to someone else's process is left alone. */
    DIR *d = opendir("/proc");
    bool ours = false;
    for (struct dirent *e; d && !ours && (e = readdir(d));) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        char stat_path[300], buf[1024];
        snprintf(stat_path, sizeof stat_path, "/proc/%s/stat", e->d_name);
        struct stat st;
        FILE *f = fopen(stat_path, "re");
        if (!f)
            continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        bool owned = fstat(fileno(f), &st) == 0 && st.st_uid == owner;
        fclose(f);
        buf[n] = '\0';
        char *close_paren = strrchr(buf, ')');
        unsigned pgrp = 0, session = 0;
        if (owned && close_paren && sscanf(close_paren + 1, " %*c %*d %u %u", &pgrp, &session) == 2)
            ours = pgrp == pgid && session == pgid;
    }
    if (d)
        closedir(d);
    if (ours)
        runner_signal_group(pgid, SIGKILL, owner);
}

/* ---- the runner -------------------------------------------------------------------- */

static bool program_takes(const job_config *cfg)
{
    return cfg->type == JOBCFG_PROGRAM;
}

static train_outcome fail(train_result *res, const char *msg)
{
    snprintf(res->message, sizeof res->message, "%s", msg);
    res->outcome = TRAIN_FAILED;
    return TRAIN_FAILED;
}

/* The pool page and eventfd of a program whose PyTorch allocates from
 * gradd's pool, watched by the device's pool_peers; nothing (and a note)
 * when it uses its own allocator. */
static int pool_setup(prog *p, const runner_env *env, const job_config *cfg, char *err, size_t err_len)
{
    gradd_ctx *ctx = env->ctx;
    if (cfg->allocator == JOBCFG_ALLOC_PYTORCH) {
        runner_note(env, "allocator: the program's own ([program] allocator = pytorch)");
        return 0;
    }
    if (!ctx->alloc_lib[0]) {
        runner_note(env, "allocator: the program's own: %s", ctx->alloc_note);
        return 0;
    }
    int page = pool_shm_create(), efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    p->page_fd = page >= 0 ? fcntl(page, F_DUPFD_CLOEXEC, 5) : -1;
    p->event_fd = efd >= 0 ? fcntl(efd, F_DUPFD_CLOEXEC, 5) : -1;
    int e = errno;
    if (page >= 0)
        close(page);
    if (efd >= 0)
        close(efd);
    if (p->page_fd < 0 || p->event_fd < 0) {
        snprintf(err, err_len, "cannot make the program's pool page: %s", strerror(e));
        return -1;
    }
    if (pool_peers_add(ctx->peers[env->dev], env->job_id, p->page_fd, p->event_fd, cfg->mem_limit, err, err_len) != 0)
        return -1;
    p->pooled = true;
    char lim[16] = "none";
    if (cfg->mem_limit)
        units_format_size(cfg->mem_limit, lim, sizeof lim);
    runner_note(env, "allocator: gradd's pool on %s (%s), budget %s", ctx->devs[env->dev]->id, ctx->alloc_lib, lim);
    return 0;
}

/* The program's peak as its page shows it, before the page goes: only a
 * figure to show, as everything on the page. */
static void keep_peak(const runner_env *env, train_result *res)
{
    pool_peer_view *pv = malloc(sizeof *pv);
    if (pv && pool_peers_read_job(env->ctx->peers[env->dev], env->job_id, pv) && pv->live) {
        res->mem_own = true;
        int64_t peak = pv->stats.allocated_bytes[POOL_ALL].peak;
        res->mem_peak = peak > 0 ? (uint64_t)peak : 0;
        for (int t = 0; t < POOL_TAG_COUNT; t++)
            res->mem_tag_peak[t] = pv->stats.tag_peak[t] > 0 ? (uint64_t)pv->stats.tag_peak[t] : 0;
    }
    free(pv);
}

static train_outcome program_run(const runner_env *env, const job_config *cfg, train_result *res)
{
    prog *p = calloc(1, sizeof *p);
    if (!p)
        return fail(res, "out of memory");
    p->devnull = p->out[0] = p->out[1] = p->page_fd = p->event_fd = -1;
    char err[1024];
    pid_t pid = -1;
    if (pool_setup(p, env, cfg, err, sizeof err) != 0 || prepare(p, env, cfg, err, sizeof err) != 0 ||
        (pid = start(p, err, sizeof err)) < 0) {
        if (p->pooled)
            pool_peers_remove(env->ctx->peers[env->dev], env->job_id);
        prog_free(p);
        free(p);
        return fail(res, err);
    }
    if (env->started)
        env->started(env->note_user, (uint32_t)pid);
    runner_note(env, "started %s as pid %d in %s", p->exe, (int)pid, cfg->workdir);
    const train_hooks *h = &env->hooks;
    bool open_pipe = true, stopping = false, killed = false;
    uint64_t deadline = 0, grace = 0, changed_at = now_ms();
    siginfo_t si;
    for (;;) {
        if (env->changed && now_ms() - changed_at >= PROG_CHANGED_MS) {
            env->changed(env->note_user);
            changed_at = now_ms();
        }
        if (!stopping && h->should_stop && h->should_stop(h->user)) {
            stopping = true;
            grace = cfg->grace_ms;
            /* A daemon that stops must be done within its stop_timeout:
             * half of it, at most, for the program. */
            if (env->daemon_stopping && env->daemon_stopping(env->note_user) &&
                grace > env->ctx->cfg.stop_timeout_ms / 2)
                grace = env->ctx->cfg.stop_timeout_ms / 2;
            deadline = now_ms() + grace;
            runner_signal_group((uint32_t)pid, SIGTERM, env->uid);
            runner_note(env, "SIGTERM to process group %d; SIGKILL in %llums unless it has ended",
                        (int)pid, (unsigned long long)grace);
        }
        if (stopping && !killed && now_ms() >= deadline) {
            runner_signal_group((uint32_t)pid, SIGKILL, env->uid);
            killed = true;
        }
        int got = spawn_wait(pid, open_pipe ? p->out[0] : -1, PROG_POLL_MS, &si);
        if (got & SPAWN_READABLE)
            open_pipe = drain(p, env);
        if (got & SPAWN_EXITED)
            break;
    }
    /* What it left behind in its group ends with it. */
    spawn_reap(pid, env->uid);
    if (env->started)
        env->started(env->note_user, 0);
    for (uint64_t until = now_ms() + PROG_DRAIN_MS; open_pipe && now_ms() < until;) {
        struct pollfd pfd = {p->out[0], POLLIN, 0};
        if (poll(&pfd, 1, PROG_POLL_MS) > 0)
            open_pipe = drain(p, env);
    }
    emit_line(p, env);
    char how[128];
    if (si.si_pid == pid)
        spawn_describe_exit(&si, how, sizeof how);
    else
        snprintf(how, sizeof how, "ended, its exit status unknown (waitid: %s)", strerror(errno));
    train_outcome o;
    if (stopping) {
        if (killed)
            snprintf(res->message, sizeof res->message, "killed with SIGKILL after the %llums grace",
                     (unsigned long long)grace);
        else
            snprintf(res->message, sizeof res->message, "%s after SIGTERM", how);
        o = TRAIN_STOPPED;
    } else if (si.si_pid == pid && si.si_code == CLD_EXITED && si.si_status == 0) {
        o = TRAIN_DONE;
    } else {
        snprintf(res->message, sizeof res->message, "%s", how);
        append_tail(p, res->message, sizeof res->message);
        o = TRAIN_FAILED;
    }
    res->outcome = o;
    if (p->pooled)
        keep_peak(env, res);
    if (p->pooled)
        pool_peers_remove(env->ctx->peers[env->dev], env->job_id);
    prog_free(p);
    free(p);
    return o;
}

const runner runner_program = {"program", program_takes, program_run};
