/* svc.c — sd_notify and sd_listen_fds, when built with libsystemd, and
 * what gradd tells systemd on every tick of the loop: its status line and,
 * while the job threads progress, the watchdog's ping. */
#include "svc.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/log.h"
#include "gradd-config.h"
#include "jobs/queue.h"
#include "jobs/worker.h"
#include "units.h"

#if GRADD_HAVE_SYSTEMD
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-journal.h>

int svc_listen_fd(void)
{
    int n = sd_listen_fds(1);
    if (n < 1)
        return -1;
    /* Only a listening Unix stream socket is ours to serve. */
    if (sd_is_socket_unix(SD_LISTEN_FDS_START, SOCK_STREAM, 1, NULL, 0) <= 0)
        return -1;
    return SD_LISTEN_FDS_START;
}

void svc_ready(const char *status)
{
    sd_notifyf(0, "READY=1\nSTATUS=%s", status);
}

void svc_status(const char *status)
{
    sd_notifyf(0, "STATUS=%s", status);
}

void svc_stopping(void)
{
    sd_notify(0, "STOPPING=1");
}

void svc_extend_timeout(uint64_t usec)
{
    sd_notifyf(0, "EXTEND_TIMEOUT_USEC=%llu", (unsigned long long)usec);
}

uint64_t svc_watchdog_usec(void)
{
    uint64_t usec = 0;
    return sd_watchdog_enabled(0, &usec) > 0 ? usec : 0;
}

void svc_watchdog(void)
{
    sd_notify(0, "WATCHDOG=1");
}

int svc_journal_sink(void *user, const struct iovec *fields, int n)
{
    (void)user;
    return sd_journal_sendv(fields, n);
}

bool svc_journal_available(void)
{
    struct stat st;
    return stat("/run/systemd/journal/socket", &st) == 0 && S_ISSOCK(st.st_mode);
}

#else

int svc_listen_fd(void) { return -1; }
void svc_ready(const char *status) { (void)status; }
void svc_status(const char *status) { (void)status; }
void svc_stopping(void) {}
void svc_extend_timeout(uint64_t usec) { (void)usec; }
uint64_t svc_watchdog_usec(void) { return 0; }
void svc_watchdog(void) {}
int svc_journal_sink(void *user, const struct iovec *fields, int n)
{
    (void)user;
    (void)fields;
    (void)n;
    return -1;
}
bool svc_journal_available(void) { return false; }

#endif

/* ---- the status line and the watchdog ------------------------------------ */

/* STATUS= for systemctl status, and the watchdog: ping only while every
 * busy worker has made progress within the watchdog interval, so a hung
 * job thread stops the pings and systemd restarts the daemon. */
void svc_report(gradd_ctx *ctx, svc_watchdog_state *wd)
{
    size_t running = 0, queued = 0;
    bool progressing = true;
    uint32_t stuck_job = 0;
    const char *stuck_dev = NULL;
    uint64_t now = ctx_now_ns();
    pthread_mutex_lock(&ctx->q->lock);
    for (size_t i = 0; i < ctx->q->n; i++) {
        running += ctx->q->jobs[i]->state == JOB_RUNNING;
        queued += ctx->q->jobs[i]->state == JOB_QUEUED;
    }
    if (wd->usec && ctx->ws) {
        for (int i = 0; i < ctx->ws->n; i++) {
            worker *w = &ctx->ws->w[i];
            if (!w->busy || w->beats != wd->beats[i]) {
                wd->beats[i] = w->beats;
                wd->since_ns[i] = now;
            } else if (now - wd->since_ns[i] > wd->usec * 1000) {
                progressing = false;
                stuck_job = w->job;
                stuck_dev = ctx->devs[w->dev]->id;
            }
        }
    }
    pthread_mutex_unlock(&ctx->q->lock);
    size_t alloc = 0;
    pool_stats *ps = malloc(sizeof *ps);
    for (int i = 0; ps && i < ctx->ndev; i++) {
        pool_stats_read(ctx->pools[i], ps);
        alloc += (size_t)ps->allocated_bytes[POOL_ALL].current;
    }
    free(ps);
    char line[160], a[16];
    snprintf(line, sizeof line, "%zu running, %zu queued; %s of device memory in use", running, queued,
             units_format_size(alloc, a, sizeof a));
    svc_status(line);
    if (!wd->usec)
        return;
    if (progressing) {
        svc_watchdog();
        wd->hung = false;
    } else if (!wd->hung) {
        wd->hung = true;
        log_job(LOG_ERR, stuck_job, stuck_dev,
                "job %u on %s has made no progress for %llums; watchdog pings stopped", stuck_job, stuck_dev,
                (unsigned long long)(wd->usec / 1000));
    }
}
