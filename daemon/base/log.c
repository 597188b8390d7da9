/* log.c — leveled logging to stderr or to a journal sink. */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "utf8.h"

/* Process-wide state, all settable (and so resettable by tests): the
 * threshold, and the sink with its argument.  The sink is set before any
 * thread logs; atomics keep a test's reset well-defined anyway. */
static _Atomic int threshold = LOG_INFO;
static _Atomic(log_sink_fn) sink;
static void *_Atomic sink_user;

void log_set_level(log_level l) { atomic_store(&threshold, (int)l); }
log_level log_get_level(void) { return (log_level)atomic_load(&threshold); }

void log_set_sink(log_sink_fn fn, void *user)
{
    atomic_store(&sink_user, user);
    atomic_store(&sink, fn);
}

bool log_stderr_is_journal(void)
{
    const char *js = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    char tail;
    if (!js || sscanf(js, "%llu:%llu%c", &dev, &ino, &tail) != 2)
        return false;
    struct stat st;
    if (fstat(2, &st) != 0)
        return false;
    return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

/* Hand one entry to the sink; <0 when it could not take it. */
static int to_sink(log_sink_fn fn, log_level l, uint32_t job, const char *dev, const char *file, int line,
                   const char *func, const char *msg)
{
    /* Fields are small except MESSAGE, which is bounded by the caller's
     * buffer; journald splits nothing, newlines in MESSAGE included. */
    char f_msg[1100], f_prio[16], f_file[256], f_line[32], f_func[128], f_job[32], f_dev[64];
    struct iovec iov[9];
    int n = 0;
#define FIELD(buf, ...)                                                    \
    do {                                                                   \
        int len_ = snprintf(buf, sizeof buf, __VA_ARGS__);                 \
        iov[n].iov_base = buf;                                             \
        iov[n].iov_len = len_ < (int)sizeof buf ? (size_t)len_ : sizeof buf - 1; \
        n++;                                                               \
    } while (0)
    FIELD(f_msg, "MESSAGE=%s", msg);
    FIELD(f_prio, "PRIORITY=%d", (int)l);
    iov[n].iov_base = (void *)"SYSLOG_IDENTIFIER=gradd";
    iov[n].iov_len = strlen("SYSLOG_IDENTIFIER=gradd");
    n++;
    if (file)
        FIELD(f_file, "CODE_FILE=%s", file);
    if (line > 0)
        FIELD(f_line, "CODE_LINE=%d", line);
    if (func)
        FIELD(f_func, "CODE_FUNC=%s", func);
    if (job)
        FIELD(f_job, "GRADD_JOB_ID=%u", job);
    if (dev && *dev)
        FIELD(f_dev, "GRADD_DEVICE=%s", dev);
#undef FIELD
    return fn(atomic_load(&sink_user), iov, n);
}

void log_emit(log_level l, uint32_t job, const char *dev, const char *file, int line, const char *func,
              const char *fmt, ...)
{
    if ((int)l > atomic_load(&threshold))
        return;
    static const char *names[8] = {"", "", "", "error", "warning", "", "info", "debug"};
    char raw[1024], msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    /* Messages quote what users wrote (job names, paths, reasons).  A
     * newline in one would forge a line of its own, an escape sequence or a
     * bidi override would act on the terminal of whoever reads the log: the
     * message takes utf8_safe's form, and a backslash is written as \\ so
     * that the form reads back unambiguously. */
    utf8_safe(raw, UTF8_SAFE_BACKSLASH, msg, sizeof msg);
    log_sink_fn fn = atomic_load(&sink);
    if (fn && to_sink(fn, l, job, dev, file, line, func, msg) >= 0)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    /* One fprintf per line keeps lines from different threads whole. */
    fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ gradd %s: %s\n", tm.tm_year + 1900,
            tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
            names[(unsigned)l & 7], msg);
}
