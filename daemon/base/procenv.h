/* procenv.h — the environment a gradd process runs with.
 *
 * libgomp's GOMP_SPINCOUNT and OpenBLAS's OPENBLAS_CORETYPE are read once,
 * as each library is loaded, so a process that needs a value the user's
 * environment lacks sets it and runs itself again.  Called first thing in
 * main by gradd and by the benchmarks that stand for it, so that both run
 * on the same settings. */
#ifndef GRADD_PROCENV_H
#define GRADD_PROCENV_H

/* Sets what the environment lacks (procenv.c says what and why) and
 * execs this program again with `argv`; returns when nothing was missing,
 * or when the exec failed (then the process goes on as loaded). */
void procenv_settle(char **argv);

#endif
