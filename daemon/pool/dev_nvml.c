/* dev_nvml.c — which processes use a CUDA device, from the driver's NVML.
 *
 * libnvidia-ml ships with the driver, not the toolkit, so it is opened with
 * dlopen at run time and never linked: where there is no driver, gradd
 * starts anyway and says why there is no process list.  Only the few
 * functions used are resolved, with their types written out here, so the
 * build needs no nvml.h either.
 */
#include "dev.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the NVML ABI used ------------------------------------------------------ */

typedef int nvml_return;
typedef void *nvml_device;

enum {
    NVML_OK = 0,
    NVML_INSUFFICIENT_SIZE = 7,
};

/* nvmlProcessInfo_t as the _v2 and _v3 process queries fill it; the _v1
 * query's layout has only the first two fields, so it is not used. */
typedef struct {
    unsigned int pid;
    unsigned long long used_gpu_memory;
    unsigned int gpu_instance_id;
    unsigned int compute_instance_id;
} nvml_process_info;

/* NVML's NVML_VALUE_NOT_AVAILABLE: the driver does not know (containers,
 * some virtualised GPUs). */
#define NVML_NOT_AVAILABLE (~0ull)

typedef nvml_return (*fn_init)(void);
typedef nvml_return (*fn_shutdown)(void);
typedef const char *(*fn_error_string)(nvml_return);
typedef nvml_return (*fn_by_bus_id)(const char *, nvml_device *);
typedef nvml_return (*fn_procs)(nvml_device, unsigned int *, nvml_process_info *);

struct dev_nvml {
    void *lib;
    fn_shutdown shutdown;
    fn_error_string error_string;
    fn_by_bus_id by_bus_id;
    fn_procs procs;
};

/* The most processes asked for on one device: bounds what one status
 * request costs whatever the machine runs. */
#define NVML_MAX_PROCS 1024

static const char *err_text(const dev_nvml *n, nvml_return r)
{
    const char *s = n->error_string ? n->error_string(r) : NULL;
    return s ? s : "unknown NVML error";
}

/* ---- open and close ---------------------------------------------------------- */

dev_nvml *dev_nvml_open(const char *library, char *why, size_t why_len)
{
    const char *path = library ? library : DEV_NVML_LIBRARY;
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(why, why_len, "NVML not available: %s", e ? e : path);
        return NULL;
    }
    dev_nvml *n = calloc(1, sizeof *n);
    if (!n) {
        dlclose(lib);
        snprintf(why, why_len, "NVML not available: out of memory");
        return NULL;
    }
    n->lib = lib;
    fn_init init = (fn_init)dlsym(lib, "nvmlInit_v2");
    n->shutdown = (fn_shutdown)dlsym(lib, "nvmlShutdown");
    n->error_string = (fn_error_string)dlsym(lib, "nvmlErrorString");
    n->by_bus_id = (fn_by_bus_id)dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    /* _v3 where the driver has it (R510 on); _v2 takes the same layout. */
    n->procs = (fn_procs)dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (!n->procs)
        n->procs = (fn_procs)dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v2");
    if (!init || !n->shutdown || !n->by_bus_id || !n->procs) {
        snprintf(why, why_len, "NVML not available: %s lacks the functions gradd uses (driver too old)", path);
        dlclose(lib);
        free(n);
        return NULL;
    }
    nvml_return r = init();
    if (r != NVML_OK) {
        snprintf(why, why_len, "NVML not available: nvmlInit: %s", err_text(n, r));
        dlclose(lib);
        free(n);
        return NULL;
    }
    return n;
}

void dev_nvml_close(dev_nvml *n)
{
    if (!n)
        return;
    n->shutdown();
    dlclose(n->lib);
    free(n);
}

/* ---- processes ---------------------------------------------------------------- */

int dev_nvml_procs(dev_nvml *n, const dev *d, dev_nvml_proc *out, int max, char *why, size_t why_len)
{
    if (!d->pci_bus_id[0]) {
        snprintf(why, why_len, "%s has no PCI bus id to find it in NVML", d->id);
        return -1;
    }
    nvml_device h;
    nvml_return r = n->by_bus_id(d->pci_bus_id, &h);
    if (r != NVML_OK) {
        snprintf(why, why_len, "NVML has no device at %s: %s", d->pci_bus_id, err_text(n, r));
        return -1;
    }
    unsigned int cap = 64;
    nvml_process_info *info = NULL;
    for (;;) {
        nvml_process_info *grown = realloc(info, cap * sizeof *info);
        if (!grown) {
            free(info);
            snprintf(why, why_len, "out of memory listing the processes on %s", d->id);
            return -1;
        }
        info = grown;
        unsigned int count = cap;
        r = n->procs(h, &count, info);
        if (r == NVML_INSUFFICIENT_SIZE && cap < NVML_MAX_PROCS) {
            /* count says how many there are now; more may start before the
             * next call, so leave room, within the bound. */
            cap = count + 16 > NVML_MAX_PROCS ? NVML_MAX_PROCS : count + 16;
            continue;
        }
        if (r != NVML_OK) {
            free(info);
            snprintf(why, why_len, "NVML cannot list the processes on %s: %s", d->id, err_text(n, r));
            return -1;
        }
        int k = 0;
        for (unsigned int i = 0; i < count && i < cap && k < max; i++) {
            out[k].pid = info[i].pid;
            out[k].used_bytes = info[i].used_gpu_memory == NVML_NOT_AVAILABLE ? 0 : info[i].used_gpu_memory;
            k++;
        }
        free(info);
        return k;
    }
}
