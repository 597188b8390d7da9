/* dev.h — the device backend interface.
 *
 * A device is a table of functions over one piece of memory-owning hardware:
 * raw allocation, memory information, synchronisation and (optionally)
 * virtual-memory reservation for expandable segments.  Two backends exist:
 *   cpu  — a simulated device in host memory with a fixed capacity; its raw
 *          allocations fail with DEV_ERR_OOM exactly where cudaMalloc would.
 *   cuda — loaded at run time from the gradd-cuda module (dev_cuda.c), so a
 *          binary built with CUDA still starts where there is no driver.
 * Nothing outside the dev_*.c files talks to device memory directly; the
 * memory pool (pool*.c) is the only caller of the raw functions below.
 */
#ifndef GRADD_DEV_H
#define GRADD_DEV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    DEV_OK = 0,
    DEV_ERR_OOM,         /* the device has no room for the request */
    DEV_ERR_INVALID,     /* bad argument (zero size, unknown pointer, ...) */
    DEV_ERR_UNSUPPORTED, /* the backend lacks this capability */
    DEV_ERR_BACKEND,     /* driver/runtime error; dev_last_error() says which */
} dev_status;

typedef enum { DEV_KIND_CPU = 0, DEV_KIND_CUDA = 1 } dev_kind;

typedef struct dev dev;

/* The backend's function table.  Every function may be called from any
 * thread; backends are internally synchronised where they keep state. */
typedef struct dev_ops {
    /* Raw allocation of `bytes` (> 0) of device memory. */
    dev_status (*alloc)(dev *d, size_t bytes, void **ptr);
    /* Release a pointer returned by alloc; `bytes` is the size asked for. */
    void (*free)(dev *d, void *ptr, size_t bytes);
    /* Free and total memory as the device reports them, other processes'
     * usage included (cudaMemGetInfo semantics). */
    dev_status (*mem_info)(dev *d, size_t *free_bytes, size_t *total_bytes);
    /* Wait for all work queued on the device. */
    dev_status (*sync)(dev *d);

    /* Virtual memory for expandable segments.  va_granularity is the mapping
     * granularity in bytes (0: the backend has no virtual-memory support and
     * the other four functions are NULL).  va_reserve takes address space
     * only; va_map commits physical memory for [addr, addr+bytes), counted
     * against capacity; va_unmap gives it back; va_release frees the range. */
    size_t (*va_granularity)(dev *d);
    dev_status (*va_reserve)(dev *d, size_t bytes, void **base);
    void (*va_release)(dev *d, void *base, size_t bytes);
    dev_status (*va_map)(dev *d, void *addr, size_t bytes);
    void (*va_unmap)(dev *d, void *addr, size_t bytes);

    void (*destroy)(dev *d);
} dev_ops;

struct dev {
    const dev_ops *ops;
    dev_kind kind;
    int index;         /* 0-based within its kind */
    char name[64];     /* "cpu (sim)", "NVIDIA H100 80GB HBM3" */
    char id[16];       /* "cpu0", "cuda0" — what users type after -d */
    void *impl;        /* backend state */
    char last_error[160];
    /* "0000:3b:00.0" for a CUDA device ("" otherwise): what NVML knows it
     * by, whatever order CUDA_DEVICE_ORDER gives the CUDA indices. */
    char pci_bus_id[32];
    /* A CUDA device's collectives between the ranks of a job: the NCCL of
     * its module (dist's table, opaque here), or NULL. */
    const void *collectives;
};

/* ---- thin wrappers (the pool calls these, never ops directly) ---------- */
static inline dev_status dev_alloc(dev *d, size_t bytes, void **ptr) { return d->ops->alloc(d, bytes, ptr); }
static inline void dev_free(dev *d, void *ptr, size_t bytes) { d->ops->free(d, ptr, bytes); }
static inline dev_status dev_mem_info(dev *d, size_t *f, size_t *t) { return d->ops->mem_info(d, f, t); }
static inline dev_status dev_sync(dev *d) { return d->ops->sync(d); }
static inline size_t dev_va_granularity(dev *d) { return d->ops->va_granularity ? d->ops->va_granularity(d) : 0; }
static inline dev_status dev_va_reserve(dev *d, size_t bytes, void **base) { return d->ops->va_reserve(d, bytes, base); }
static inline void dev_va_release(dev *d, void *base, size_t bytes) { d->ops->va_release(d, base, bytes); }
static inline dev_status dev_va_map(dev *d, void *addr, size_t bytes) { return d->ops->va_map(d, addr, bytes); }
static inline void dev_va_unmap(dev *d, void *addr, size_t bytes) { d->ops->va_unmap(d, addr, bytes); }
static inline const char *dev_last_error(const dev *d) { return d->last_error; }

void dev_destroy(dev *d);
const char *dev_status_str(dev_status s);
const char *dev_kind_str(dev_kind k);

/* ---- cpu backend (dev_cpu.c) ------------------------------------------ */
/* A simulated device of `capacity` bytes in host memory. */
dev_status dev_cpu_create(size_t capacity, int index, dev **out);

/* Simulate another process on the same device: it holds `bytes` of the
 * capacity until changed (0 releases it).  Fails with DEV_ERR_OOM, changing
 * nothing, when the device has less than that free.  Only test code and the
 * daemon's --test-hooks RPC call this; the cuda backend has no equivalent. */
dev_status dev_cpu_set_external(dev *d, size_t bytes);
size_t dev_cpu_external(const dev *d);
/* What gradd's other processes on the same simulated device hold (the
 * program jobs, each with its own pool over its own copy of the device;
 * in a program, the daemon and the other programs).  A fact, not a
 * request: it may take the device past its capacity, and then nothing
 * more fits until it drops. */
void dev_cpu_set_shared(dev *d, size_t bytes);

/* ---- cuda backend (dev_cuda.c, built into the gradd-cuda module) -------- */
/* The module exports one symbol of this type, named DEV_CUDA_ENTRY. */
#define DEV_CUDA_ENTRY "gradd_cuda_module_v1"
#define DEV_CUDA_ABI 2
typedef struct dev_cuda_module {
    int abi; /* DEV_CUDA_ABI */
    /* Number of CUDA devices, or -1 with `why` filled when none can be used
     * (no driver, driver too old, ...). */
    int (*count)(char *why, size_t why_len);
    dev_status (*create)(int index, dev **out);
} dev_cuda_module;

/* ---- discovery (dev.c) --------------------------------------------------- */
/* Loads the CUDA module from `module_dir` (NULL: next to the executable, then
 * the install directory) and creates every CUDA device it finds.  Never fails:
 * with no module, driver or GPU it returns 0 devices and says why in `why`. */
int dev_cuda_probe(const char *module_dir, dev **out, int max, char *why, size_t why_len);

/* The CUDA kernels (a `const kern_ops *`, see kernels.h) exported by the
 * module in `module_dir` (NULL: as dev_cuda_probe finds it).  dlopen hands
 * back the handle dev_cuda_probe already holds, so this is the same code the
 * devices run on.  NULL when there is no module. */
const void *dev_cuda_kern_ops(const char *module_dir);

/* ---- processes on a device, from NVML (dev_nvml.c) ----------------------- */
/* The driver's management library, loaded with dlopen like the CUDA module:
 * gradd never links it, so a machine without a driver still starts. */
typedef struct dev_nvml dev_nvml;

#define DEV_NVML_LIBRARY "libnvidia-ml.so.1"

typedef struct {
    uint32_t pid;
    uint64_t used_bytes; /* 0 where the driver does not say */
} dev_nvml_proc;

/* Load `library` (NULL: DEV_NVML_LIBRARY) and initialise NVML.  NULL with
 * `why` set ("NVML not available: ...") when it cannot be used. */
dev_nvml *dev_nvml_open(const char *library, char *why, size_t why_len);
void dev_nvml_close(dev_nvml *n);
/* The compute processes on CUDA device d (found by its PCI bus id) into
 * out: how many were written (at most max; any beyond are left out), or -1
 * with `why` set. */
int dev_nvml_procs(dev_nvml *n, const dev *d, dev_nvml_proc *out, int max, char *why, size_t why_len);

#endif
