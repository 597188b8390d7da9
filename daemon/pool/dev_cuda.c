/* dev_cuda.c — the CUDA device backend, built into the gradd-cuda module.
 *
 * Raw memory is cudaMalloc/cudaFree; memory info is cudaMemGetInfo, which
 * sees other processes' usage, so the pool's low-watermark trimming reacts
 * to a neighbour growing.  Expandable segments use the driver's virtual
 * memory API.  The driver (libcuda) is never linked: it is only a stub on
 * build machines and absent on CPU servers, so its functions are fetched at
 * run time with cudaGetDriverEntryPointByVersion.
 */
#include "dev.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- driver entry points -------------------------------------------------- */

typedef CUresult (*pfn_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*pfn_addr_free)(CUdeviceptr, size_t);
typedef CUresult (*pfn_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*pfn_release)(CUmemGenericAllocationHandle);
typedef CUresult (*pfn_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*pfn_unmap)(CUdeviceptr, size_t);
typedef CUresult (*pfn_set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*pfn_granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);

static struct {
    pthread_once_t once;
    int ok;
    pfn_reserve reserve;
    pfn_addr_free addr_free;
    pfn_create create;
    pfn_release release;
    pfn_map map;
    pfn_unmap unmap;
    pfn_set_access set_access;
    pfn_granularity granularity;
} vmm = {.once = PTHREAD_ONCE_INIT};

static void *entry(const char *sym)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion(sym, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        return NULL;
    return fn;
}

static void vmm_load(void)
{
    vmm.reserve = (pfn_reserve)entry("cuMemAddressReserve");
    vmm.addr_free = (pfn_addr_free)entry("cuMemAddressFree");
    vmm.create = (pfn_create)entry("cuMemCreate");
    vmm.release = (pfn_release)entry("cuMemRelease");
    vmm.map = (pfn_map)entry("cuMemMap");
    vmm.unmap = (pfn_unmap)entry("cuMemUnmap");
    vmm.set_access = (pfn_set_access)entry("cuMemSetAccess");
    vmm.granularity = (pfn_granularity)entry("cuMemGetAllocationGranularity");
    vmm.ok = vmm.reserve && vmm.addr_free && vmm.create && vmm.release && vmm.map &&
             vmm.unmap && vmm.set_access && vmm.granularity;
}

/* ---- per-device state ------------------------------------------------------ */

/* Physical handles of mapped chunks, keyed by chunk address.  One handle per
 * granularity-sized chunk lets the pool unmap any aligned sub-range. */
typedef struct {
    CUdeviceptr addr;
    CUmemGenericAllocationHandle handle;
} chunk;

typedef struct {
    int ordinal;
    size_t granularity;
    pthread_mutex_t lock;
    chunk *chunks; /* open addressing, addr 0 = empty, tombstone = 1 */
    size_t cap, used;
} cuda_dev;

static cuda_dev *impl(dev *d) { return (cuda_dev *)d->impl; }

static void set_err(dev *d, const char *what, cudaError_t e)
{
    snprintf(d->last_error, sizeof d->last_error, "%s on %s: %s", what, d->id, cudaGetErrorString(e));
}

static void set_drv_err(dev *d, const char *what, CUresult r)
{
    snprintf(d->last_error, sizeof d->last_error, "%s on %s: CUresult %d", what, d->id, (int)r);
}

/* Make the device the calling thread's current one for one call, and put
 * back the one it had: in a program's process (libgradd-alloc) the current
 * device is the program's, and what it launches next must go where it
 * meant, whichever device the pool just served. */
static int enter_device(dev *d)
{
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess)
        prev = -1;
    if (prev != impl(d)->ordinal)
        cudaSetDevice(impl(d)->ordinal);
    return prev;
}

static void leave_device(dev *d, int prev)
{
    if (prev >= 0 && prev != impl(d)->ordinal)
        cudaSetDevice(prev);
}

static dev_status cuda_alloc(dev *d, size_t bytes, void **ptr)
{
    int prev = enter_device(d);
    cudaError_t e = cudaMalloc(ptr, bytes);
    leave_device(d, prev);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError(); /* clear the sticky-free error so the retry is clean */
        set_err(d, "cudaMalloc", e);
        return DEV_ERR_OOM;
    }
    if (e != cudaSuccess) {
        set_err(d, "cudaMalloc", e);
        return DEV_ERR_BACKEND;
    }
    return DEV_OK;
}

static void cuda_free(dev *d, void *ptr, size_t bytes)
{
    (void)bytes;
    int prev = enter_device(d);
    cudaFree(ptr);
    leave_device(d, prev);
}

static dev_status cuda_mem_info(dev *d, size_t *free_bytes, size_t *total_bytes)
{
    size_t f = 0, t = 0;
    int prev = enter_device(d);
    cudaError_t e = cudaMemGetInfo(&f, &t);
    leave_device(d, prev);
    /* Not recorded in last_error: that is the allocation paths', under the
     * pool lock, and status requests and workers ask this without it (a
     * failure here would garble an OOM report being written). */
    if (e != cudaSuccess)
        return DEV_ERR_BACKEND;
    if (free_bytes)
        *free_bytes = f;
    if (total_bytes)
        *total_bytes = t;
    return DEV_OK;
}

static dev_status cuda_sync(dev *d)
{
    int prev = enter_device(d);
    cudaError_t e = cudaDeviceSynchronize();
    leave_device(d, prev);
    if (e != cudaSuccess) {
        set_err(d, "cudaDeviceSynchronize", e);
        return DEV_ERR_BACKEND;
    }
    return DEV_OK;
}

/* ---- virtual memory -------------------------------------------------------- */

static size_t hash_slot(const cuda_dev *c, CUdeviceptr a)
{
    return (size_t)((a / c->granularity) * 0x9E3779B97F4A7C15ull) & (c->cap - 1);
}

static int chunks_grow(cuda_dev *c)
{
    size_t ncap = c->cap ? c->cap * 2 : 1024;
    chunk *n = calloc(ncap, sizeof *n);
    if (!n)
        return -1;
    chunk *old = c->chunks;
    size_t ocap = c->cap;
    c->chunks = n;
    c->cap = ncap;
    c->used = 0;
    for (size_t i = 0; i < ocap; i++) {
        if (old[i].addr > 1) {
            size_t s = hash_slot(c, old[i].addr);
            while (c->chunks[s].addr)
                s = (s + 1) & (c->cap - 1);
            c->chunks[s] = old[i];
            c->used++;
        }
    }
    free(old);
    return 0;
}

static int chunk_put(cuda_dev *c, CUdeviceptr a, CUmemGenericAllocationHandle h)
{
    if ((c->used + 1) * 2 > c->cap && chunks_grow(c) != 0)
        return -1;
    size_t s = hash_slot(c, a);
    while (c->chunks[s].addr > 1)
        s = (s + 1) & (c->cap - 1);
    c->chunks[s].addr = a;
    c->chunks[s].handle = h;
    c->used++;
    return 0;
}

static int chunk_take(cuda_dev *c, CUdeviceptr a, CUmemGenericAllocationHandle *h)
{
    if (!c->cap)
        return -1;
    size_t s = hash_slot(c, a);
    while (c->chunks[s].addr) {
        if (c->chunks[s].addr == a) {
            *h = c->chunks[s].handle;
            c->chunks[s].addr = 1; /* tombstone keeps probe chains intact */
            return 0;
        }
        s = (s + 1) & (c->cap - 1);
    }
    return -1;
}

static size_t cuda_va_granularity(dev *d)
{
    return impl(d)->granularity;
}

static dev_status cuda_va_reserve(dev *d, size_t bytes, void **base)
{
    CUdeviceptr p = 0;
    CUresult r = vmm.reserve(&p, bytes, impl(d)->granularity, 0, 0);
    if (r != CUDA_SUCCESS) {
        set_drv_err(d, "cuMemAddressReserve", r);
        return DEV_ERR_BACKEND;
    }
    *base = (void *)(uintptr_t)p;
    return DEV_OK;
}

static void cuda_va_release(dev *d, void *base, size_t bytes)
{
    (void)d;
    vmm.addr_free((CUdeviceptr)(uintptr_t)base, bytes);
}

static void unmap_range(dev *d, CUdeviceptr a, size_t bytes)
{
    cuda_dev *c = impl(d);
    for (size_t off = 0; off < bytes; off += c->granularity) {
        CUmemGenericAllocationHandle h;
        vmm.unmap(a + off, c->granularity);
        pthread_mutex_lock(&c->lock);
        int found = chunk_take(c, a + off, &h);
        pthread_mutex_unlock(&c->lock);
        if (found == 0)
            vmm.release(h);
    }
}

static dev_status cuda_va_map(dev *d, void *addr, size_t bytes)
{
    cuda_dev *c = impl(d);
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = c->ordinal;
    CUmemAccessDesc access = {0};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

    CUdeviceptr a = (CUdeviceptr)(uintptr_t)addr;
    for (size_t off = 0; off < bytes; off += c->granularity) {
        CUmemGenericAllocationHandle h;
        CUresult r = vmm.create(&h, c->granularity, &prop, 0);
        if (r == CUDA_SUCCESS) {
            r = vmm.map(a + off, c->granularity, 0, h, 0);
            if (r != CUDA_SUCCESS)
                vmm.release(h);
        }
        if (r == CUDA_SUCCESS)
            r = vmm.set_access(a + off, c->granularity, &access, 1);
        if (r == CUDA_SUCCESS) {
            pthread_mutex_lock(&c->lock);
            int put = chunk_put(c, a + off, h);
            pthread_mutex_unlock(&c->lock);
            if (put != 0) {
                vmm.unmap(a + off, c->granularity);
                vmm.release(h);
                r = CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
        if (r != CUDA_SUCCESS) {
            /* Leave nothing half-mapped: undo the chunks already done. */
            unmap_range(d, a, off);
            set_drv_err(d, "cuMemCreate/cuMemMap", r);
            return r == CUDA_ERROR_OUT_OF_MEMORY ? DEV_ERR_OOM : DEV_ERR_BACKEND;
        }
    }
    return DEV_OK;
}

/* cudaFree waits for the device's work before it frees; cuMemUnmap is not
 * documented to, and PyTorch waits on the stream before it unmaps its own
 * expandable segments.  A block freed on a stream may still be read by
 * kernels queued there before the free, so a trim that unmaps it must let
 * them finish first.  Trims are rare; the wait is the same one cudaFree
 * makes on the fixed-segment path. */
static void cuda_va_unmap(dev *d, void *addr, size_t bytes)
{
    int prev = enter_device(d);
    cudaDeviceSynchronize();
    leave_device(d, prev);
    unmap_range(d, (CUdeviceptr)(uintptr_t)addr, bytes);
}

static void cuda_destroy(dev *d)
{
    cuda_dev *c = impl(d);
    pthread_mutex_destroy(&c->lock);
    free(c->chunks);
    free(c);
    free(d);
}

static const dev_ops cuda_ops = {
    .alloc = cuda_alloc,
    .free = cuda_free,
    .mem_info = cuda_mem_info,
    .sync = cuda_sync,
    .va_granularity = cuda_va_granularity,
    .va_reserve = cuda_va_reserve,
    .va_release = cuda_va_release,
    .va_map = cuda_va_map,
    .va_unmap = cuda_va_unmap,
    .destroy = cuda_destroy,
};

/* The same table without virtual memory, for drivers that lack it. */
static const dev_ops cuda_ops_novmm = {
    .alloc = cuda_alloc,
    .free = cuda_free,
    .mem_info = cuda_mem_info,
    .sync = cuda_sync,
    .destroy = cuda_destroy,
};

/* ---- module entry ---------------------------------------------------------- */

static int module_count(char *why, size_t why_len)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(why, why_len, "no CUDA devices (%s)", cudaGetErrorString(e));
        return -1;
    }
    return n;
}

static dev_status module_create(int index, dev **out)
{
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, index) != cudaSuccess)
        return DEV_ERR_BACKEND;
    dev *d = calloc(1, sizeof *d);
    cuda_dev *c = calloc(1, sizeof *c);
    if (!d || !c) {
        free(d);
        free(c);
        return DEV_ERR_OOM;
    }
    c->ordinal = index;
    pthread_mutex_init(&c->lock, NULL);
    pthread_once(&vmm.once, vmm_load);

    const dev_ops *ops = &cuda_ops_novmm;
    if (vmm.ok) {
        CUmemAllocationProp ap = {0};
        ap.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        ap.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        ap.location.id = index;
        if (vmm.granularity(&c->granularity, &ap, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS &&
            c->granularity > 0)
            ops = &cuda_ops;
    }
    d->ops = ops;
    d->kind = DEV_KIND_CUDA;
    d->index = index;
    d->impl = c;
    snprintf(d->name, sizeof d->name, "%.63s", prop.name);
    snprintf(d->id, sizeof d->id, "cuda%d", index);
    /* Empty on failure: the device then has no process list, nothing worse. */
    if (cudaDeviceGetPCIBusId(d->pci_bus_id, (int)sizeof d->pci_bus_id, index) != cudaSuccess)
        d->pci_bus_id[0] = '\0';
    *out = d;
    return DEV_OK;
}

__attribute__((visibility("default"))) const dev_cuda_module gradd_cuda_module_v1 = {
    .abi = DEV_CUDA_ABI,
    .count = module_count,
    .create = module_create,
};
