/* svc.h — running as a systemd service: readiness and status, the
 * watchdog, and socket activation.  Every function is a no-op outside
 * systemd (no NOTIFY_SOCKET, no LISTEN_FDS) and in builds without
 * libsystemd, so gradd runs the same in the foreground. */
#ifndef GRADD_SVC_H
#define GRADD_SVC_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "base/ctx.h"

/* The listening socket systemd passed (gradd.socket), or -1. */
int svc_listen_fd(void);

/* READY=1 with a STATUS= line: the socket listens, devices are probed. */
void svc_ready(const char *status);
/* STATUS= one-line summary. */
void svc_status(const char *status);
/* STOPPING=1. */
void svc_stopping(void);
/* EXTEND_TIMEOUT_USEC= while long shutdown checkpoints are written. */
void svc_extend_timeout(uint64_t usec);
/* The watchdog interval systemd asked for (0: none). */
uint64_t svc_watchdog_usec(void);
/* WATCHDOG=1. */
void svc_watchdog(void);

/* What the watchdog remembers of the job threads between two reports. */
typedef struct {
    uint64_t usec;      /* systemd watchdog interval; 0: none */
    uint64_t *beats;    /* per worker: beats at the last change ... */
    uint64_t *since_ns; /* ... and when that change was seen */
    bool hung;          /* a worker stopped progressing: pings stopped */
} svc_watchdog_state;

/* STATUS= with the jobs and device memory in use, and WATCHDOG=1 while
 * every busy job thread progresses; called from the loop's tick. */
void svc_report(gradd_ctx *ctx, svc_watchdog_state *wd);

/* A log_sink_fn (log.h) that sends each entry to journald with
 * sd_journal_sendv; <0 when journald does not take it (or without
 * libsystemd), so the line goes to stderr instead. */
int svc_journal_sink(void *user, const struct iovec *fields, int n);
/* Whether journald listens here.  sd_journal_sendv drops entries silently
 * when it does not, so this is asked once, before choosing the sink. */
bool svc_journal_available(void);

#endif
