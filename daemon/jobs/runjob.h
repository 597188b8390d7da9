/* runjob.h — `gradd run JOB.cfg`: train one job in the foreground on this
 * machine's devices and exit, without the socket or the queue. */
#ifndef GRADD_RUNJOB_H
#define GRADD_RUNJOB_H

#include "base/ctx.h"

/* Train the job in `path` on ctx's devices, which it opens (ctx_open) after
 * reading the job file, and closes.  Prints progress to stderr and a
 * summary to stdout.  Returns the process exit status: 0 done, 1 failed,
 * 2 bad job file, 130 interrupted (SIGINT/SIGTERM/SIGHUP, after a
 * checkpoint, or before training began). */
int runjob_main(gradd_ctx *ctx, const char *path, bool quiet);

#endif
