/* ctx.c — opening and closing the devices and their pools. */
#include "ctx.h"

#include <errno.h>
#include <sched.h>
#include <unistd.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gradd-config.h"
#include "log.h"

uint64_t ctx_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int add_device(gradd_ctx *c, dev *d, char *err, size_t err_len)
{
    pool_config pc;
    config_pool_for(&c->cfg, d->id, &pc);
    pool *p = NULL;
    if (pool_create(d, &pc, &p) != 0) {
        snprintf(err, err_len, "cannot create the memory pool on %s", d->id);
        dev_destroy(d);
        return -1;
    }
    pool_peers *pp = pool_peers_create(d, p, pc.idle_trim_ms);
    if (!pp) {
        snprintf(err, err_len, "out of memory for the program pools of %s", d->id);
        pool_destroy(p);
        dev_destroy(d);
        return -1;
    }
    /* An engine job's allocation that the device refuses asks the
     * programs on it for their caches before it fails. */
    pool_set_reclaim(p, pool_peers_reclaim_hook, pp);
    c->devs[c->ndev] = d;
    c->pools[c->ndev] = p;
    c->peers[c->ndev] = pp;
    c->ndev++;
    return 0;
}

/* A build tree keeps the library in alloc/ beside daemon/, and the
 * Python folder in the sources; an install (and the GPU bundle) keeps the
 * folder beside the library, in the module directory. */
static void find_alloc(gradd_ctx *c)
{
    char exe[PATH_MAX], lib[PATH_MAX + 32], py[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char *slash = n > 0 ? (exe[n] = '\0', strrchr(exe, '/')) : NULL;
    if (slash) {
        *slash = '\0';
        snprintf(lib, sizeof lib, "%s/../alloc/libgradd-alloc.so", exe);
        snprintf(py, sizeof py, "%s/python", GRADD_SOURCE_ROOT);
    }
    if (!slash || access(lib, R_OK) != 0) {
        snprintf(lib, sizeof lib, "%s/libgradd-alloc.so", GRADD_MODULE_DIR);
        snprintf(py, sizeof py, "%s/python", GRADD_MODULE_DIR);
    }
    c->alloc_lib[0] = c->python_dir[0] = '\0';
    /* Absolute and without "..": a program's view of the path is the
     * same wherever it runs. */
    if (access(lib, R_OK) != 0 || !realpath(lib, c->alloc_lib)) {
        c->alloc_lib[0] = '\0';
        snprintf(c->alloc_note, sizeof c->alloc_note,
                 "gradd's allocator for programs is not installed (%s: %s): program jobs use their own", lib,
                 strerror(errno));
        return;
    }
    char beside[PATH_MAX + 16];
    snprintf(beside, sizeof beside, "%s", c->alloc_lib);
    char *cut = strrchr(beside, '/');
    if (cut) {
        snprintf(cut, sizeof beside - (size_t)(cut - beside), "/python");
        if (access(beside, R_OK | X_OK) == 0)
            snprintf(py, sizeof py, "%s", beside);
    }
    /* Without the shim a program can still load the library itself. */
    if (access(py, R_OK | X_OK) != 0 || !realpath(py, c->python_dir)) {
        c->python_dir[0] = '\0';
        snprintf(c->alloc_note, sizeof c->alloc_note, "no Python shim for programs (%s: %s)", py, strerror(errno));
    }
}

int ctx_open(gradd_ctx *c, char *err, size_t err_len)
{
    c->ndev = 0;
    c->start_ns = ctx_now_ns();
    for (uint64_t i = 0; i < c->cfg.cpu_devices && c->ndev < CTX_MAX_DEVICES; i++) {
        dev *d = NULL;
        if (dev_cpu_create(c->cfg.cpu_capacity, (int)i, &d) != DEV_OK) {
            snprintf(err, err_len, "cannot create simulated device cpu%llu", (unsigned long long)i);
            ctx_close(c);
            return -1;
        }
        if (add_device(c, d, err, err_len) != 0) {
            ctx_close(c);
            return -1;
        }
    }

    if (!c->cfg.cuda_enabled) {
        snprintf(c->cuda_note, sizeof c->cuda_note, "no CUDA devices (disabled by [cuda] enabled = false)");
    } else {
        dev *found[CTX_MAX_DEVICES];
        char why[256] = "";
        int n = dev_cuda_probe(c->cfg.cuda_module_dir[0] ? c->cfg.cuda_module_dir : NULL, found,
                               CTX_MAX_DEVICES - c->ndev, why, sizeof why);
        if (n == 0)
            snprintf(c->cuda_note, sizeof c->cuda_note, "%s%s",
                     strncmp(why, "no CUDA devices", 15) == 0 ? "" : "no CUDA devices: ", why);
        for (int i = 0; i < n; i++) {
            if (add_device(c, found[i], err, err_len) != 0) {
                for (int j = i + 1; j < n; j++)
                    dev_destroy(found[j]);
                ctx_close(c);
                return -1;
            }
        }
    }
    for (int i = 0; i < c->ndev; i++) {
        size_t f = 0, t = 0;
        dev_mem_info(c->devs[i], &f, &t);
        log_dev(LOG_INFO, c->devs[i]->id, "device %s: %s, %zu MiB total, %zu MiB free", c->devs[i]->id, c->devs[i]->name,
                 t >> 20, f >> 20);
    }
    if (c->cuda_note[0])
        log_info("%s", c->cuda_note);
    find_alloc(c);
    if (c->alloc_note[0])
        log_info("%s", c->alloc_note);
    bool any_cuda = false;
    for (int i = 0; i < c->ndev; i++)
        any_cuda |= c->devs[i]->kind == DEV_KIND_CUDA;
    /* Only where there is a GPU: NVML says nothing about simulated devices. */
    if (any_cuda && !(c->nvml = dev_nvml_open(NULL, c->nvml_note, sizeof c->nvml_note)))
        log_info("%s", c->nvml_note);
    return 0;
}

void ctx_close(gradd_ctx *c)
{
    for (int i = c->ndev - 1; i >= 0; i--) {
        for (size_t k = 0; k < c->test_held[i].n; k++)
            pool_free(c->pools[i], c->test_held[i].ptrs[k]);
        free(c->test_held[i].ptrs);
        memset(&c->test_held[i], 0, sizeof c->test_held[i]);
        pool_peers_destroy(c->peers[i]);
        c->peers[i] = NULL;
        pool_destroy(c->pools[i]);
        dev_destroy(c->devs[i]);
        c->pools[i] = NULL;
        c->devs[i] = NULL;
    }
    c->ndev = 0;
    dev_nvml_close(c->nvml);
    c->nvml = NULL;
}

int ctx_find_device(const gradd_ctx *c, const char *id)
{
    for (int i = 0; i < c->ndev; i++)
        if (strcmp(c->devs[i]->id, id) == 0)
            return i;
    return -1;
}

int ctx_cores(void)
{
    cpu_set_t set;
    return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
}
