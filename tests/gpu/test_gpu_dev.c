/* test_gpu_dev.c — the cuda backend and the pool on a real GPU.
 *
 * Exit 0: passed.  Exit 77: no usable GPU here (meson reports "skipped").
 * Anything else: failed, with the reason on stderr.  Takes the directory of
 * gradd-cuda.so (or the module's path) as its argument, so it exercises the
 * very module gradd loads.
 */
#include <cuda_runtime_api.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool/dev.h"
#include "kernels.h"
#include "pool/pool.h"

#define MiB ((size_t)1 << 20)

static int failures;
#define CHECK(cond, ...)                                                              \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);          \
            fprintf(stderr, __VA_ARGS__);                                             \
            fputc('\n', stderr);                                                      \
            failures++;                                                               \
        }                                                                             \
    } while (0)

/* Fill n words on the device with the kernel, copy back, compare with the
 * CPU reference.  Returns mismatching words. */
static size_t fill_and_check(void *dptr, size_t n, uint32_t seed)
{
    uint32_t *host = malloc(n * sizeof *host);
    if (!host)
        return n;
    int e = kern_cuda_fill_pattern(dptr, n, seed, NULL);
    if (e == 0)
        e = (int)cudaDeviceSynchronize();
    if (e == 0)
        e = (int)cudaMemcpy(host, dptr, n * sizeof *host, cudaMemcpyDeviceToHost);
    size_t bad = e ? n : kern_cpu_check_pattern(host, n, seed);
    if (e)
        fprintf(stderr, "cuda error %d: %s\n", e, cudaGetErrorString((cudaError_t)e));
    free(host);
    return bad;
}

static void test_raw(dev *d)
{
    size_t f0, t0, f1, t1;
    CHECK(dev_mem_info(d, &f0, &t0) == DEV_OK, "%s", dev_last_error(d));
    void *p = NULL;
    CHECK(dev_alloc(d, 256 * MiB, &p) == DEV_OK, "%s", dev_last_error(d));
    if (!p)
        return;
    dev_mem_info(d, &f1, &t1);
    CHECK(t1 == t0, "total changed");
    CHECK(f0 - f1 >= 256 * MiB, "free fell by only %zu", f0 - f1);
    CHECK(fill_and_check(p, 256 * MiB / 4, 11) == 0, "raw pattern mismatch");
    dev_free(d, p, 256 * MiB);
    /* Asking for more than the whole device is an OOM, not a crash. */
    void *q = NULL;
    CHECK(dev_alloc(d, t0 * 2, &q) == DEV_ERR_OOM, "over-size alloc did not OOM");
}

static void test_vmm(dev *d)
{
    size_t g = dev_va_granularity(d);
    if (g == 0) {
        printf("  %s: driver has no virtual memory management; expandable segments off\n", d->id);
        return;
    }
    void *base = NULL;
    size_t span = 64 * g;
    CHECK(dev_va_reserve(d, span, &base) == DEV_OK, "%s", dev_last_error(d));
    if (!base)
        return;
    size_t f0, f1, f2, t;
    dev_mem_info(d, &f0, &t);
    CHECK(dev_va_map(d, base, 8 * g) == DEV_OK, "%s", dev_last_error(d));
    dev_mem_info(d, &f1, &t);
    CHECK(f0 - f1 >= 8 * g, "mapping 8 chunks took only %zu bytes", f0 - f1);
    CHECK(fill_and_check(base, 8 * g / 4, 5) == 0, "mapped pattern mismatch");
    /* Unmap the middle, map it again: pattern on the neighbours survives. */
    dev_va_unmap(d, (char *)base + 2 * g, 2 * g);
    CHECK(dev_va_map(d, (char *)base + 2 * g, 2 * g) == DEV_OK, "%s", dev_last_error(d));
    CHECK(fill_and_check((char *)base + 2 * g, 2 * g / 4, 6) == 0, "remapped pattern mismatch");
    dev_va_unmap(d, base, 8 * g);
    dev_mem_info(d, &f2, &t);
    CHECK(f2 + g >= f0, "unmapping gave back only %zu of %zu", f2 - f1, f0 - f1);
    dev_va_release(d, base, span);
    printf("  %s: vmm granularity %zu KiB ok\n", d->id, g >> 10);
}

/* A pool on d with the defaults; NULL after a failed check. */
static pool *new_pool(dev *d, bool expandable)
{
    pool_config pc;
    pool_config_default(&pc);
    pc.expandable_segments = expandable;
    pool *p = NULL;
    CHECK(pool_create(d, &pc, &p) == 0, "pool_create");
    return p;
}

static void test_pool(dev *d, bool expandable)
{
    pool *p = new_pool(d, expandable);
    if (!p)
        return;
    enum { N = 64 };
    void *blocks[N];
    size_t sizes[N];
    for (int i = 0; i < N; i++) {
        sizes[i] = (size_t)(i % 7 + 1) * (i % 3 ? 300 * 1024 : 5 * MiB);
        blocks[i] = pool_alloc(p, sizes[i], POOL_TAG_ACTIVATIONS, 1, NULL);
        CHECK(blocks[i] != NULL, "pool_alloc %zu", sizes[i]);
        if (blocks[i])
            CHECK(fill_and_check(blocks[i], sizes[i] / 4, (uint32_t)i) == 0, "block %d mismatch", i);
    }
    char err[256];
    CHECK(pool_check(p, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < N; i += 2)
        pool_free(p, blocks[i]);
    /* Blocks still live keep their data through frees of their neighbours. */
    uint32_t *host = malloc(sizes[1]);
    cudaMemcpy(host, blocks[1], sizes[1], cudaMemcpyDeviceToHost);
    CHECK(kern_cpu_check_pattern(host, sizes[1] / 4, 1) == 0, "neighbour data lost");
    free(host);
    for (int i = 1; i < N; i += 2)
        pool_free(p, blocks[i]);
    pool_trim_result r = pool_trim(p, POOL_TRIM_REQUEST, 0);
    CHECK(r.reserved_after == 0, "reserved %zu after a full trim", r.reserved_after);
    CHECK(pool_check(p, err, sizeof err) == 0, "%s", err);
    pool_destroy(p);
    printf("  %s: pool (expandable %s) ok, trim released %zu MiB\n", d->id, expandable ? "on" : "off",
           r.bytes >> 20);
}

/* A trim right after a free, with the freed block's work still queued: the
 * unmap must wait for that work, not pull the memory from under it (an
 * illegal address, sticky for the context, so this runs last). */
static void test_trim_waits_for_queued_work(dev *d)
{
    if (dev_va_granularity(d) == 0)
        return;
    pool *p = new_pool(d, true);
    if (!p)
        return;
    size_t bytes = 256 * MiB;
    uint32_t *b = pool_alloc(p, bytes, POOL_TAG_ACTIVATIONS, 1, NULL);
    CHECK(b != NULL, "pool_alloc %zu", bytes);
    if (b) {
        /* About 50 GB of writes: tens of milliseconds still queued when the
         * trim below unmaps the segment. */
        for (uint32_t i = 0; i < 200; i++)
            kern_cuda_fill_pattern(b, bytes / 4, i, NULL);
        pool_free(p, b);
        pool_trim_result r = pool_trim(p, POOL_TRIM_REQUEST, 0);
        CHECK(r.reserved_after == 0, "reserved %zu after a full trim", r.reserved_after);
        cudaError_t e = cudaDeviceSynchronize();
        CHECK(e == cudaSuccess, "work queued before the trim: %s", cudaGetErrorString(e));
    }
    pool_destroy(p);
    printf("  %s: a trim waits for the work queued on what it unmaps\n", d->id);
}

int main(int argc, char **argv)
{
    char dir[4096] = "";
    if (argc > 1) {
        snprintf(dir, sizeof dir, "%s", argv[1]);
        if (strstr(dir, ".so"))
            snprintf(dir, sizeof dir, "%s", dirname(argv[1]));
    }
    dev *devs[16];
    char why[256] = "";
    int n = dev_cuda_probe(dir[0] ? dir : NULL, devs, 16, why, sizeof why);
    if (n == 0) {
        printf("SKIP: %s\n", why);
        return 77;
    }
    for (int i = 0; i < n; i++) {
        printf("%s: %s\n", devs[i]->id, devs[i]->name);
        cudaSetDevice(devs[i]->index);
        test_raw(devs[i]);
        test_vmm(devs[i]);
        test_pool(devs[i], false);
        test_pool(devs[i], true);
        test_trim_waits_for_queued_work(devs[i]);
        dev_destroy(devs[i]);
    }
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
