/* log.h — the daemon's log: plain lines on stderr in the foreground, and
 * journald entries with structured fields under systemd.
 *
 * Every line carries its priority and where it was logged (CODE_FILE,
 * CODE_LINE, CODE_FUNC); lines about a job or a device say so with the
 * log_job / log_dev variants, which become GRADD_JOB_ID= and GRADD_DEVICE=
 * in the journal (`journalctl -u gradd GRADD_JOB_ID=7`).
 *
 * Where lines go is one process-wide choice made at start-up, before any
 * thread logs: stderr (the default), or a journal sink (svc.c provides the
 * real one, sd_journal_sendv; tests install their own).  A sink that fails
 * makes that line go to stderr instead, so nothing is lost.
 */
#ifndef GRADD_LOG_H
#define GRADD_LOG_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

typedef enum { LOG_ERR = 3, LOG_WARN = 4, LOG_INFO = 6, LOG_DEBUG = 7 } log_level;

void log_set_level(log_level l);
log_level log_get_level(void);

/* A journal sink: one entry as "KEY=value" fields (MESSAGE, PRIORITY,
 * SYSLOG_IDENTIFIER, CODE_FILE, CODE_LINE, CODE_FUNC, and GRADD_JOB_ID /
 * GRADD_DEVICE when set).  Returns 0, or <0 to have the line written to
 * stderr instead.  Called from any thread, so it must be thread-safe. */
typedef int (*log_sink_fn)(void *user, const struct iovec *fields, int n);

/* Send lines to `sink` (NULL: back to stderr).  Call before threads start,
 * or from a test between log calls. */
void log_set_sink(log_sink_fn sink, void *user);

/* systemd's way of saying "your stderr is the journal": JOURNAL_STREAM
 * holds "DEV:INO" of the stream it connected, and it is ours only if fd 2
 * still is that stream (a child that redirected stderr must not switch). */
bool log_stderr_is_journal(void);

/* job: 0 for none; dev: NULL or "" for none. */
void log_emit(log_level l, uint32_t job, const char *dev, const char *file, int line, const char *func,
              const char *fmt, ...) __attribute__((format(printf, 7, 8)));

#define log_msg(l, ...) log_emit(l, 0, NULL, __FILE__, __LINE__, __func__, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

/* A line about job `job` (and the device it runs on, when known). */
#define log_job(l, job, dev, ...) log_emit(l, job, dev, __FILE__, __LINE__, __func__, __VA_ARGS__)
/* A line about a device only. */
#define log_dev(l, dev, ...) log_emit(l, 0, dev, __FILE__, __LINE__, __func__, __VA_ARGS__)

#endif
