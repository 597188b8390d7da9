/* log.h — the daemon's log: plain lines on stderr in the foreground, and
 * (issue 7) journald with structured fields under systemd. */
#ifndef GRADD_LOG_H
#define GRADD_LOG_H

typedef enum { LOG_ERR = 3, LOG_WARN = 4, LOG_INFO = 6, LOG_DEBUG = 7 } log_level;

/* Parse "error", "warning", "info", "debug"; -1 if unknown. */
int log_level_parse(const char *s);
void log_set_level(log_level l);
log_level log_get_level(void);

void log_msg(log_level l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) log_msg(LOG_ERR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

#endif
