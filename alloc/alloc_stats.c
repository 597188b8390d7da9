/* alloc_stats.c — what the shim serves torch.cuda's memory functions from:
 * the pool's figures under PyTorch's names (memory_stats' keys, the byte
 * getters, peak reset) and empty_cache.
 */
#include "alloc_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* The device's statistics; false (and zeros) for a device never used or
 * in a fork child, where the pool may have been copied mid-update. */
static bool read_stats(int device, pool_stats *s)
{
    memset(s, 0, sizeof *s);
    if (atomic_load(&alloc_g.forked) || device < 0 || device >= ALLOC_MAX_DEVICES)
        return false;
    pool *p = atomic_load(&alloc_g.pools[device]);
    if (!p)
        return false;
    pool_stats_read(p, s);
    return true;
}

static uint64_t pos(int64_t v) { return v > 0 ? (uint64_t)v : 0; }

static uint64_t figure(int device, size_t offset, bool peak)
{
    pool_stats s;
    if (!read_stats(device, &s))
        return 0;
    const pool_stat *st = (const pool_stat *)((const char *)&s + offset);
    return pos(peak ? st[POOL_ALL].peak : st[POOL_ALL].current);
}

uint64_t gradd_memory_allocated(int device)
{
    return figure(device, offsetof(pool_stats, allocated_bytes), false);
}

uint64_t gradd_memory_reserved(int device)
{
    return figure(device, offsetof(pool_stats, reserved_bytes), false);
}

uint64_t gradd_max_memory_allocated(int device)
{
    return figure(device, offsetof(pool_stats, allocated_bytes), true);
}

uint64_t gradd_max_memory_reserved(int device)
{
    return figure(device, offsetof(pool_stats, reserved_bytes), true);
}

void gradd_reset_peak_memory_stats(int device)
{
    if (atomic_load(&alloc_g.forked) || device < 0 || device >= ALLOC_MAX_DEVICES)
        return;
    pool *p = atomic_load(&alloc_g.pools[device]);
    if (p) {
        pool_stats_reset_peaks(p);
        atomic_store(&alloc_g.dirty, 1);
    }
}

void gradd_empty_cache(void)
{
    if (atomic_load(&alloc_g.forked))
        return;
    for (int i = 0; i < ALLOC_MAX_DEVICES; i++) {
        pool *p = atomic_load(&alloc_g.pools[i]);
        if (p)
            pool_trim(p, POOL_TRIM_REQUEST, 0);
    }
    atomic_store(&alloc_g.dirty, 1);
}

/* ==== memory_stats as JSON =================================================== */

typedef struct {
    char *buf;
    size_t len, used; /* used may pass len: the length the whole text needs */
} out;

static void put(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = o->used < o->len ? o->len - o->used : 0;
    int n = vsnprintf(room ? o->buf + o->used : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        o->used += (size_t)n;
}

static void put_stat(out *o, const char *name, const pool_stat *st)
{
    static const char *const pools[3] = {"small_pool", "large_pool", "all"};
    for (int i = 0; i < 3; i++)
        put(o, ",\"%s.%s.current\":%llu,\"%s.%s.peak\":%llu,\"%s.%s.allocated\":%llu,\"%s.%s.freed\":%llu",
            name, pools[i], (unsigned long long)pos(st[i].current), name, pools[i],
            (unsigned long long)pos(st[i].peak), name, pools[i], (unsigned long long)st[i].allocated,
            name, pools[i], (unsigned long long)st[i].freed);
}

size_t gradd_memory_stats_json(int device, char *buf, size_t len)
{
    pool_stats s;
    read_stats(device, &s);
    out o = {.buf = buf, .len = len};
    if (len)
        buf[0] = 0;
    put(&o, "{\"num_alloc_retries\":%llu,\"num_ooms\":%llu", (unsigned long long)s.alloc_retries,
        (unsigned long long)s.ooms);
    put_stat(&o, "allocation", s.allocations);
    put_stat(&o, "segment", s.segments);
    put_stat(&o, "active", s.active_blocks);
    put_stat(&o, "inactive_split", s.inactive_split_blocks);
    put_stat(&o, "allocated_bytes", s.allocated_bytes);
    put_stat(&o, "reserved_bytes", s.reserved_bytes);
    put_stat(&o, "active_bytes", s.active_bytes);
    put_stat(&o, "inactive_split_bytes", s.inactive_split_bytes);
    put_stat(&o, "requested_bytes", s.requested_bytes);
    /* max_split_size is -1 in PyTorch when unlimited. */
    long long msz = s.max_split_size == SIZE_MAX || s.max_split_size == 0 ? -1 : (long long)s.max_split_size;
    put(&o,
        ",\"num_device_alloc\":%llu,\"num_device_free\":%llu,\"num_sync_all_streams\":0,"
        "\"max_split_size\":%lld",
        (unsigned long long)s.device_allocs, (unsigned long long)s.device_frees, msz);
    put(&o,
        ",\"gradd.cache_hits\":%llu,\"gradd.trims\":%llu,\"gradd.trimmed_bytes\":%llu,"
        "\"gradd.invalid_frees\":%llu,\"gradd.largest_free_block\":%llu,"
        "\"gradd.fragmentation_ppm\":%llu,\"gradd.cap\":%llu}",
        (unsigned long long)s.cache_hits, (unsigned long long)s.trims,
        (unsigned long long)s.trimmed_bytes, (unsigned long long)s.invalid_frees,
        (unsigned long long)s.largest_free_block, (unsigned long long)(s.fragmentation * 1e6 + 0.5),
        (unsigned long long)s.cap);
    return o.used;
}
