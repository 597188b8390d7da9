/* svc.c — sd_notify and sd_listen_fds, when built with libsystemd. */
#include "svc.h"

#include "gradd-config.h"

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
