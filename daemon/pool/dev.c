/* dev.c — backend-independent device helpers and CUDA discovery.
 *
 * The CUDA backend lives in a separate shared module (gradd-cuda.so) that
 * links the CUDA runtime.  gradd itself never links CUDA, so it starts on a
 * machine with no driver and simply reports "no CUDA devices" there.
 */
#include "dev.h"
#include "gradd-config.h"
#include "kernels.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* $prefix/$libdir/gradd, where meson installs the module (gradd-config.h).
 * No fallback: a guess here is what hid that this file did not include it. */
#ifndef GRADD_MODULE_DIR
#error "GRADD_MODULE_DIR is not defined (gradd-config.h)"
#endif

#define CUDA_MODULE_NAME "gradd-cuda.so"

void dev_destroy(dev *d)
{
    if (d)
        d->ops->destroy(d);
}

const char *dev_status_str(dev_status s)
{
    switch (s) {
    case DEV_OK: return "ok";
    case DEV_ERR_OOM: return "out of memory";
    case DEV_ERR_INVALID: return "invalid argument";
    case DEV_ERR_UNSUPPORTED: return "not supported by this device";
    case DEV_ERR_BACKEND: return "device backend error";
    }
    return "unknown device status";
}

const char *dev_kind_str(dev_kind k)
{
    return k == DEV_KIND_CUDA ? "cuda" : "cpu";
}

/* Try to dlopen the module from `dir`; NULL with dlerror() text in `why`. */
static void *open_module(const char *dir, char *why, size_t why_len)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, CUDA_MODULE_NAME);
    if (access(path, F_OK) != 0) {
        snprintf(why, why_len, "no CUDA module at %s", path);
        return NULL;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        snprintf(why, why_len, "cannot load %s: %s", path, dlerror());
    return h;
}

/* The directory holding the running executable (a build tree keeps the
 * module beside gradd; an install keeps it in GRADD_MODULE_DIR). */
static int exe_dir(char *buf, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", buf, len - 1);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *slash = strrchr(buf, '/');
    if (!slash)
        return -1;
    *slash = '\0';
    return 0;
}

/* The module from `module_dir`, or beside the executable, then the install
 * directory; NULL with the most useful reason in `why`. */
static void *load_module(const char *module_dir, char *why, size_t why_len)
{
    char dir[PATH_MAX];
    if (module_dir)
        return open_module(module_dir, why, why_len);
    void *h = NULL;
    if (exe_dir(dir, sizeof dir) == 0)
        h = open_module(dir, why, why_len);
    if (!h) {
        char first[256];
        snprintf(first, sizeof first, "%s", why);
        h = open_module(GRADD_MODULE_DIR, why, why_len);
        if (!h && strstr(first, "cannot load"))
            snprintf(why, why_len, "%s", first);
    }
    return h;
}

const void *dev_cuda_kern_ops(const char *module_dir)
{
    char why[256];
    void *h = load_module(module_dir, why, sizeof why);
    return h ? dlsym(h, KERN_CUDA_OPS_SYMBOL) : NULL;
}

int dev_cuda_probe(const char *module_dir, dev **out, int max, char *why, size_t why_len)
{
    void *h = load_module(module_dir, why, why_len);
    if (!h)
        return 0;

    const dev_cuda_module *m = dlsym(h, DEV_CUDA_ENTRY);
    if (!m || m->abi != DEV_CUDA_ABI) {
        snprintf(why, why_len, "CUDA module has no %s of ABI %d", DEV_CUDA_ENTRY, DEV_CUDA_ABI);
        dlclose(h);
        return 0;
    }
    int n = m->count(why, why_len);
    if (n <= 0) {
        if (n == 0)
            snprintf(why, why_len, "the CUDA driver reports no devices");
        /* Keep the module loaded: unloading a library that initialised the
         * CUDA runtime is not supported by it. */
        return 0;
    }
    /* dist_internal.h's DIST_NCCL_ENTRY; absent from a module built
     * without NCCL. */
    const void *nccl = dlsym(h, "gradd_dist_nccl_v1");
    int made = 0;
    for (int i = 0; i < n && made < max; i++) {
        dev *d = NULL;
        if (m->create(i, &d) == DEV_OK) {
            d->collectives = nccl;
            out[made++] = d;
        }
    }
    if (made == 0)
        snprintf(why, why_len, "%d CUDA device(s) found but none could be opened", n);
    else
        why[0] = '\0';
    return made;
}
