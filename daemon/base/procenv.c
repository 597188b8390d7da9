/* procenv.c — the environment a gradd process runs with: settings that
 * libraries read once, as they are loaded. */
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/procenv.h"
#include "kernels.h"

/* Two settings are read once, as a library is loaded, so gradd sets them
 * and runs itself again: the same process (pid, fds, systemd's sockets),
 * before anything starts.  The user's own choice of either stands.
 *
 * libgomp's GOMP_SPINCOUNT: by default a thread waiting at a barrier spins
 * up to 300,000 rounds before it sleeps.  Alone on its cores that saves a
 * wakeup.  Beside another busy process (a second gradd run, a user's data
 * loader: the shared server gradd is for) each spinning thread holds a
 * core the other's threads need, at every barrier.  Measured on 2 cores:
 * two tiny GPT runs took 148 s together, 0.6 s each alone; with 1000
 * rounds (what libgomp uses by itself when it knows it has more threads
 * than cores) 2.2 s together, for 0.5 ms more on a 1.3 ms step alone and
 * nothing measurable on a larger model.
 *
 * OpenBLAS's OPENBLAS_CORETYPE, where OpenBLAS fell back to its generic
 * kernels on a CPU it does not know (kern_cpu_blas_better): the CPU
 * device's GEMMs run 5x faster on the CPU's own. */
void procenv_settle(char **argv)
{
    bool again = false;
    if (!getenv("GOMP_SPINCOUNT") && !getenv("OMP_WAIT_POLICY"))
        again |= setenv("GOMP_SPINCOUNT", "1000", 1) == 0;
    const char *core = getenv("OPENBLAS_CORETYPE") ? NULL : kern_cpu_blas_better();
    if (core)
        again |= setenv("OPENBLAS_CORETYPE", core, 1) == 0;
    if (!again)
        return;
    /* The file /proc/self/exe points to, not the link itself: the process
     * is named after the path it runs (ps -C gradd, pidof). */
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0 || (size_t)n >= sizeof self - 1)
        return;
    self[n] = '\0';
    execv(self, argv);
    /* No /proc, or the file is gone: go on as loaded.  A program job's
     * environment is built afresh, so what was set here does not leak. */
}
