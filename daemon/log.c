/* log.c — leveled logging to stderr. */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* The one piece of process-wide state: the threshold, settable (and so
 * resettable by tests) through log_set_level. */
static _Atomic int threshold = LOG_INFO;

int log_level_parse(const char *s)
{
    if (strcmp(s, "error") == 0) return LOG_ERR;
    if (strcmp(s, "warning") == 0 || strcmp(s, "warn") == 0) return LOG_WARN;
    if (strcmp(s, "info") == 0) return LOG_INFO;
    if (strcmp(s, "debug") == 0) return LOG_DEBUG;
    return -1;
}

void log_set_level(log_level l) { atomic_store(&threshold, (int)l); }
log_level log_get_level(void) { return (log_level)atomic_load(&threshold); }

void log_msg(log_level l, const char *fmt, ...)
{
    if ((int)l > atomic_load(&threshold))
        return;
    static const char *names[8] = {"", "", "", "error", "warning", "", "info", "debug"};
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    /* One fprintf per line keeps lines from different threads whole. */
    fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ gradd %s: %s\n", tm.tm_year + 1900,
            tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
            names[l], msg);
}
