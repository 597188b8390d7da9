/* procs.c — who uses a device, for status: the processes NVML lists on a
 * CUDA device, each named as gradd's jobs where it runs them, else by pid,
 * user and command; on a simulated device, the daemon alone.
 *
 * Only what cannot block is read about another process: the owner of
 * /proc/PID and its comm.  Its cmdline is not read: that takes the
 * process's memory lock, which a process can hold for as long as it likes,
 * and status runs on the event loop.
 */
#include "rpc_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jobs/queue.h"
#include "utf8.h"

/* The most processes listed per device: bounds one status answer. */
#define PROCS_MAX 64
/* GpuProcess.uid where the process's owner cannot be seen. */
#define PROCS_UID_UNKNOWN UINT32_MAX

struct rpc_procs {
    Gradd__GpuProcess msg[PROCS_MAX];
    Gradd__GpuProcess *ptr[PROCS_MAX];
    char user[PROCS_MAX][64];
    char command[PROCS_MAX][64];
    rpc_job_pid *jobs; /* the running jobs on the device, by pid then id */
    uint32_t *ids;     /* their ids in the same order: each process's slice */
    size_t njobs;
    char note[256];
};

/* What a process is matched to a running job by.  Engine jobs run on the
 * daemon's own threads: its pid.  A program job's processes are in the
 * session its runner made (runner_program.c: setsid), whose id is the
 * group id the job records; the process on the device may be a child of
 * the command (a shell's python), so any process of that session is the
 * job's. */
static pid_t job_pid(const job *j)
{
    return j->cfg.type == JOBCFG_PROGRAM && j->pgid ? (pid_t)j->pgid : getpid();
}

/* The key job_pid gives for the process pid: the daemon's pid for the
 * daemon, else its session id (0 where /proc does not say). */
static pid_t proc_key(pid_t pid)
{
    if (pid == getpid())
        return pid;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    /* The comm may hold spaces and parentheses: the fields follow the last ')'. */
    const char *rp = strrchr(buf, ')');
    int session = 0;
    if (!rp || sscanf(rp + 1, " %*c %*d %*d %d", &session) != 1)
        return 0;
    return (pid_t)session;
}

static int by_pid_then_id(const void *a, const void *b)
{
    const rpc_job_pid *x = a, *y = b;
    if (x->pid != y->pid)
        return x->pid < y->pid ? -1 : 1;
    return x->job < y->job ? -1 : x->job > y->job;
}

/* The running jobs on device `id` into p->jobs; -1 if out of memory. */
static int running_jobs(gradd_ctx *ctx, const char *id, rpc_procs *p)
{
    if (!ctx->q)
        return 0;
    pthread_mutex_lock(&ctx->q->lock);
    size_t n = 0;
    for (size_t i = 0; i < ctx->q->n; i++)
        n += ctx->q->jobs[i]->state == JOB_RUNNING && job_on_device(ctx->q->jobs[i], id);
    if (n) {
        p->jobs = malloc(n * sizeof *p->jobs);
        p->ids = malloc(n * sizeof *p->ids);
    }
    if (n && (!p->jobs || !p->ids)) {
        pthread_mutex_unlock(&ctx->q->lock);
        return -1;
    }
    for (size_t i = 0; i < ctx->q->n && p->njobs < n; i++) {
        const job *j = ctx->q->jobs[i];
        if (j->state == JOB_RUNNING && job_on_device(j, id))
            p->jobs[p->njobs++] = (rpc_job_pid){.job = j->id, .pid = job_pid(j)};
    }
    pthread_mutex_unlock(&ctx->q->lock);
    return 0;
}

void rpc_procs_match(rpc_job_pid *jobs, size_t njobs, rpc_proc_jobs *out, size_t nprocs)
{
    if (njobs > 1)
        qsort(jobs, njobs, sizeof *jobs, by_pid_then_id);
    for (size_t k = 0; k < nprocs; k++) {
        size_t i = 0;
        while (i < njobs && jobs[i].pid < out[k].pid)
            i++;
        out[k].first = i;
        while (i < njobs && jobs[i].pid == out[k].pid)
            i++;
        out[k].n = i - out[k].first;
    }
}

void rpc_user_name(uid_t uid, char *buf, size_t len)
{
    struct passwd pw, *res = NULL;
    char tmp[4096];
    if (getpwuid_r(uid, &pw, tmp, sizeof tmp, &res) == 0 && res)
        snprintf(buf, len, "%s", pw.pw_name);
    else
        snprintf(buf, len, "%u", (unsigned)uid);
}

/* Owner and comm of another process.  A process that has gone, or that
 * the daemon may not see (hidepid, ProtectProc=invisible), is "(hidden)". */
static void describe(pid_t pid, Gradd__GpuProcess *m, char *user, char *command, size_t len)
{
    char path[64];
    struct stat st;
    snprintf(path, sizeof path, "/proc/%d", (int)pid);
    m->uid = PROCS_UID_UNKNOWN;
    user[0] = '\0';
    snprintf(command, len, "(hidden)");
    if (stat(path, &st) != 0)
        return;
    m->uid = (uint32_t)st.st_uid;
    rpc_user_name(st.st_uid, user, len);
    snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return;
    char raw[64];
    ssize_t n = read(fd, raw, sizeof raw - 1);
    close(fd);
    if (n <= 0)
        return;
    raw[n] = '\0';
    raw[strcspn(raw, "\n")] = '\0';
    /* The comm is the owner's to choose: sent as text the client escapes
     * again, but made valid UTF-8 here so the message is well formed. */
    utf8_safe(raw, 0, command, len);
}

rpc_procs *rpc_procs_fill(gradd_ctx *ctx, int i, uint64_t pool_reserved, Gradd__Device *g)
{
    rpc_procs *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    dev *d = ctx->devs[i];
    if (running_jobs(ctx, d->id, p) != 0) {
        rpc_procs_free(p);
        return NULL;
    }
    dev_nvml_proc found[PROCS_MAX];
    int n = 0;
    if (d->kind != DEV_KIND_CUDA) {
        /* A simulated device is the daemon's and its program jobs': the
         * pages say what each program holds. */
        if (pool_reserved || p->njobs)
            found[n++] = (dev_nvml_proc){.pid = (uint32_t)getpid(), .used_bytes = pool_reserved};
        size_t nv;
        pool_peer_view *views = pool_peers_read(ctx->peers[i], &nv);
        for (size_t v = 0; v < nv && n < PROCS_MAX; v++)
            if (views[v].live && views[v].pid && views[v].pid < INT32_MAX)
                found[n++] = (dev_nvml_proc){.pid = (uint32_t)views[v].pid,
                                             .used_bytes = (uint64_t)views[v].stats.reserved_bytes[POOL_ALL].current};
        free(views);
    } else if (!ctx->nvml) {
        snprintf(p->note, sizeof p->note, "%s", ctx->nvml_note);
    } else {
        n = dev_nvml_procs(ctx->nvml, d, found, PROCS_MAX, p->note, sizeof p->note);
        if (n < 0)
            n = 0;
        else if (n == PROCS_MAX)
            snprintf(p->note, sizeof p->note, "only the first %d processes are listed", PROCS_MAX);
    }
    rpc_proc_jobs slice[PROCS_MAX];
    for (int k = 0; k < n; k++)
        slice[k].pid = proc_key((pid_t)found[k].pid);
    rpc_procs_match(p->jobs, p->njobs, slice, (size_t)n);
    for (size_t k = 0; k < p->njobs; k++)
        p->ids[k] = p->jobs[k].job;
    pid_t self = getpid();
    for (int k = 0; k < n; k++) {
        Gradd__GpuProcess *m = &p->msg[k];
        gradd__gpu_process__init(m);
        m->pid = found[k].pid;
        m->used_bytes = found[k].used_bytes;
        if ((pid_t)found[k].pid == self) {
            m->uid = (uint32_t)geteuid();
            rpc_user_name(geteuid(), p->user[k], sizeof p->user[k]);
            snprintf(p->command[k], sizeof p->command[k], "gradd");
        } else {
            describe((pid_t)found[k].pid, m, p->user[k], p->command[k], sizeof p->command[k]);
        }
        m->user = p->user[k];
        m->command = p->command[k];
        m->n_jobs = slice[k].n;
        m->jobs = slice[k].n ? p->ids + slice[k].first : NULL;
        p->ptr[k] = m;
    }
    g->n_processes = (size_t)n;
    g->processes = n ? p->ptr : NULL;
    g->process_note = p->note;
    return p;
}

void rpc_procs_free(rpc_procs *p)
{
    if (!p)
        return;
    free(p->jobs);
    free(p->ids);
    free(p);
}
