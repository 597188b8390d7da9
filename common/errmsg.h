/* errmsg.h — the message half of "errors are values": a function that
 * fails returns -1 and leaves the reason in a buffer its caller passed. */
#ifndef GRADD_ERRMSG_H
#define GRADD_ERRMSG_H

#include <stddef.h>

/* Format the reason into err[len] (nothing where err is NULL or len is 0)
 * and return -1, so that a failure path can end in
 * `return errmsg_set(err, len, ...)`. */
int errmsg_set(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
