/* errmsg.c — formatting a failure's reason for the caller. */
#include "errmsg.h"

#include <stdarg.h>
#include <stdio.h>

int errmsg_set(char *err, size_t len, const char *fmt, ...)
{
    if (err && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, len, fmt, ap);
        va_end(ap);
    }
    return -1;
}
