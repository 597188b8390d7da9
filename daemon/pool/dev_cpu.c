/* dev_cpu.c — the simulated device: host memory with a fixed capacity.
 *
 * CI has no GPU, so every memory path of gradd (OOM, trim, batch changes,
 * another process growing) is exercised here.  The capacity is enforced on
 * what the device has handed out: raw allocations, committed pages of
 * virtual ranges, and the bytes held by the simulated "other process".
 * Memory comes from mmap so that an untouched 4 GiB device costs nothing.
 */
#include "dev.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Same granularity as CUDA's usual cuMemCreate minimum, so expandable
 * segments behave alike on both backends. */
#define CPU_VA_GRANULARITY ((size_t)2 << 20)

typedef struct {
    pthread_mutex_t lock;
    size_t capacity;
    size_t used;     /* raw + committed + external + shared; only shared may
                        take it past capacity */
    size_t external; /* the simulated other process */
    size_t shared;   /* what gradd's other processes hold (dev_cpu_set_shared) */
} cpu_dev;

static cpu_dev *impl(dev *d) { return (cpu_dev *)d->impl; }

/* Reserve `bytes` of capacity, or fail without changing anything. */
static dev_status charge(cpu_dev *c, size_t bytes)
{
    dev_status st = DEV_OK;
    pthread_mutex_lock(&c->lock);
    if (c->used > c->capacity || bytes > c->capacity - c->used)
        st = DEV_ERR_OOM;
    else
        c->used += bytes;
    pthread_mutex_unlock(&c->lock);
    return st;
}

static void refund(cpu_dev *c, size_t bytes)
{
    pthread_mutex_lock(&c->lock);
    c->used -= bytes;
    pthread_mutex_unlock(&c->lock);
}

static dev_status cpu_alloc(dev *d, size_t bytes, void **ptr)
{
    if (bytes == 0 || !ptr)
        return DEV_ERR_INVALID;
    if (charge(impl(d), bytes) != DEV_OK) {
        snprintf(d->last_error, sizeof d->last_error,
                 "out of memory allocating %zu bytes on %s", bytes, d->id);
        return DEV_ERR_OOM;
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        refund(impl(d), bytes);
        snprintf(d->last_error, sizeof d->last_error, "host mmap of %zu bytes failed", bytes);
        return DEV_ERR_OOM;
    }
    *ptr = p;
    return DEV_OK;
}

static void cpu_free(dev *d, void *ptr, size_t bytes)
{
    if (!ptr)
        return;
    munmap(ptr, bytes);
    refund(impl(d), bytes);
}

static dev_status cpu_mem_info(dev *d, size_t *free_bytes, size_t *total_bytes)
{
    cpu_dev *c = impl(d);
    pthread_mutex_lock(&c->lock);
    if (free_bytes)
        *free_bytes = c->used < c->capacity ? c->capacity - c->used : 0;
    if (total_bytes)
        *total_bytes = c->capacity;
    pthread_mutex_unlock(&c->lock);
    return DEV_OK;
}

/* Host memory is coherent: there is no queued work to wait for. */
static dev_status cpu_sync(dev *d)
{
    (void)d;
    return DEV_OK;
}

static size_t cpu_va_granularity(dev *d)
{
    (void)d;
    return CPU_VA_GRANULARITY;
}

static dev_status cpu_va_reserve(dev *d, size_t bytes, void **base)
{
    if (bytes == 0 || bytes % CPU_VA_GRANULARITY)
        return DEV_ERR_INVALID;
    /* Address space only: PROT_NONE + NORESERVE commits nothing. */
    void *p = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        snprintf(d->last_error, sizeof d->last_error, "reserving %zu bytes of address space failed", bytes);
        return DEV_ERR_BACKEND;
    }
    *base = p;
    return DEV_OK;
}

static void cpu_va_release(dev *d, void *base, size_t bytes)
{
    (void)d;
    munmap(base, bytes);
}

static dev_status cpu_va_map(dev *d, void *addr, size_t bytes)
{
    if (bytes == 0 || bytes % CPU_VA_GRANULARITY || (uintptr_t)addr % CPU_VA_GRANULARITY)
        return DEV_ERR_INVALID;
    if (charge(impl(d), bytes) != DEV_OK) {
        snprintf(d->last_error, sizeof d->last_error,
                 "out of memory mapping %zu bytes on %s", bytes, d->id);
        return DEV_ERR_OOM;
    }
    if (mprotect(addr, bytes, PROT_READ | PROT_WRITE) != 0) {
        refund(impl(d), bytes);
        snprintf(d->last_error, sizeof d->last_error, "committing %zu bytes failed", bytes);
        return DEV_ERR_BACKEND;
    }
    return DEV_OK;
}

static void cpu_va_unmap(dev *d, void *addr, size_t bytes)
{
    /* Drop the pages first so the host really gets them back, then make
     * the range inaccessible so a use-after-trim faults loudly. */
    madvise(addr, bytes, MADV_DONTNEED);
    mprotect(addr, bytes, PROT_NONE);
    refund(impl(d), bytes);
}

static void cpu_destroy(dev *d)
{
    pthread_mutex_destroy(&impl(d)->lock);
    free(d->impl);
    free(d);
}

static const dev_ops cpu_ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .mem_info = cpu_mem_info,
    .sync = cpu_sync,
    .va_granularity = cpu_va_granularity,
    .va_reserve = cpu_va_reserve,
    .va_release = cpu_va_release,
    .va_map = cpu_va_map,
    .va_unmap = cpu_va_unmap,
    .destroy = cpu_destroy,
};

dev_status dev_cpu_create(size_t capacity, int index, dev **out)
{
    if (capacity == 0 || !out)
        return DEV_ERR_INVALID;
    dev *d = calloc(1, sizeof *d);
    cpu_dev *c = calloc(1, sizeof *c);
    if (!d || !c) {
        free(d);
        free(c);
        return DEV_ERR_OOM;
    }
    pthread_mutex_init(&c->lock, NULL);
    c->capacity = capacity;
    d->ops = &cpu_ops;
    d->kind = DEV_KIND_CPU;
    d->index = index;
    d->impl = c;
    snprintf(d->name, sizeof d->name, "cpu (sim)");
    snprintf(d->id, sizeof d->id, "cpu%d", index);
    *out = d;
    return DEV_OK;
}

dev_status dev_cpu_set_external(dev *d, size_t bytes)
{
    if (!d || d->kind != DEV_KIND_CPU)
        return DEV_ERR_UNSUPPORTED;
    cpu_dev *c = impl(d);
    dev_status st = DEV_OK;
    pthread_mutex_lock(&c->lock);
    size_t others = c->used - c->external;
    if (others > c->capacity || bytes > c->capacity - others)
        st = DEV_ERR_OOM;
    else {
        c->used = others + bytes;
        c->external = bytes;
    }
    pthread_mutex_unlock(&c->lock);
    return st;
}

void dev_cpu_set_shared(dev *d, size_t bytes)
{
    if (!d || d->kind != DEV_KIND_CPU)
        return;
    cpu_dev *c = impl(d);
    pthread_mutex_lock(&c->lock);
    c->used = c->used - c->shared + bytes;
    c->shared = bytes;
    pthread_mutex_unlock(&c->lock);
}

size_t dev_cpu_external(const dev *d)
{
    if (!d || d->kind != DEV_KIND_CPU)
        return 0;
    cpu_dev *c = (cpu_dev *)d->impl;
    pthread_mutex_lock(&c->lock);
    size_t v = c->external;
    pthread_mutex_unlock(&c->lock);
    return v;
}
