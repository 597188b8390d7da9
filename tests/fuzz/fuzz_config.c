/* fuzz_config.c — libFuzzer harness for daemon/base/config.c (gradd.conf through
 * libinih).
 *
 * The input is written to a memfd and config_load reads it back through
 * /proc/self/fd/N, so no file is left on disk.
 * Properties (abort() on violation):
 *   - on failure err is non-empty and starts with "PATH:" (the file name,
 *     so every message points at where it came from);
 *   - on failure *out is left untouched;
 *   - on success the strings are NUL-terminated inside their fields, source
 *     names the path, noverrides is within CONFIG_MAX_OVERRIDES and every
 *     override names a cpuN/cudaN device.
 *   - every numeric option lies within the bounds config.c's table
 *     documents ("unlimited" is accepted by max_split_size alone).
 *
 * pool_config_default lives in daemon/pool/pool.c, which drags in the whole
 * pool and device layer.  config.c only needs it to fill defaults before its
 * own table overwrites every pool field, so this file defines it; build
 * with -DFUZZ_USE_REAL_POOL (and link pool.c and its dependencies) to use
 * the real one instead.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/config.h"

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "fuzz_config: property failed at %s:%d: %s\n", __FILE__,   \
                    __LINE__, #cond);                                                    \
            abort();                                                                     \
        }                                                                                \
    } while (0)

#ifndef FUZZ_USE_REAL_POOL
void pool_config_default(pool_config *c)
{
    memset(c, 0, sizeof *c);
    c->memory_fraction = 1.0;
    c->max_split_size = SIZE_MAX;
    c->expandable_segments = false;
    c->gc_threshold = 0;
    c->low_watermark = 0;
    c->trim_every_steps = 0;
    c->trim_every_ms = 0;
    c->timeline_capacity = 65536;
}
#endif

static int memfd = -1;
static char path[64];

static int terminated(const char *field, size_t size)
{
    return memchr(field, '\0', size) != NULL;
}

static int device_ok(const char *id)
{
    const char *d = strncmp(id, "cpu", 3) == 0 ? id + 3 : strncmp(id, "cuda", 4) == 0 ? id + 4 : NULL;
    if (!d || !*d)
        return 0;
    for (; *d; d++)
        if (*d < '0' || *d > '9')
            return 0;
    return 1;
}

static void check_pool_bounds(const pool_config *p)
{
    CHECK(p->memory_fraction >= 0.01 && p->memory_fraction <= 1);
    CHECK(p->max_split_size == SIZE_MAX || p->max_split_size >= (1u << 20));
    CHECK(p->gc_threshold >= 0 && p->gc_threshold <= 1);
    CHECK(p->low_watermark <= (size_t)1.8e19);
    CHECK(p->trim_every_steps <= 1000000000000ull);
    CHECK(p->trim_every_ms <= 86400000ull);
    CHECK(p->timeline_capacity <= (1u << 24));
}

static void check_config(const gradd_config *c)
{
    CHECK(terminated(c->source, sizeof c->source));
    CHECK(strcmp(c->source, path) == 0);
    CHECK(terminated(c->socket_path, sizeof c->socket_path));
    CHECK(terminated(c->state_dir, sizeof c->state_dir));
    CHECK(terminated(c->admin_group, sizeof c->admin_group));
    CHECK(terminated(c->socket_group, sizeof c->socket_group));
    CHECK(c->log_level >= 0 && c->log_level <= 3);
    CHECK(terminated(c->cuda_module_dir, sizeof c->cuda_module_dir));
    CHECK(c->noverrides >= 0 && c->noverrides <= CONFIG_MAX_OVERRIDES);
    for (int i = 0; i < c->noverrides; i++) {
        CHECK(terminated(c->overrides[i].device, sizeof c->overrides[i].device));
        CHECK(device_ok(c->overrides[i].device));
        CHECK(c->overrides[i].line > 0);
        pool_config pc;
        config_pool_for(c, c->overrides[i].device, &pc);
        check_pool_bounds(&pc);
    }
    CHECK(c->max_frame >= 64 && c->max_frame <= (1u << 30));
    CHECK(c->client_timeout_ms >= 1 && c->client_timeout_ms <= 86400000ull);
    CHECK(c->max_clients >= 1 && c->max_clients <= 65536);
    CHECK(c->cpu_capacity >= (1u << 20));
    CHECK(c->cpu_devices <= 16);
    check_pool_bounds(&c->pool);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (memfd < 0) {
        memfd = memfd_create("fuzz-config", MFD_CLOEXEC);
        CHECK(memfd >= 0);
        snprintf(path, sizeof path, "/proc/self/fd/%d", memfd);
    }
    CHECK(ftruncate(memfd, 0) == 0);
    size_t off = 0;
    while (off < size) {
        ssize_t n = pwrite(memfd, data + off, size - off, (off_t)off);
        CHECK(n > 0);
        off += (size_t)n;
    }

    static gradd_config cfg; /* ~20 KB: keep it off the stack */
    static gradd_config before;
    memset(&cfg, 0xa5, sizeof cfg);
    memcpy(&before, &cfg, sizeof cfg);

    char err[1024];
    memset(err, 0, sizeof err);
    if (config_load(path, &cfg, err, sizeof err) != 0) {
        size_t pl = strlen(path);
        if (err[0] == '\0' || strncmp(err, path, pl) != 0 || err[pl] != ':') {
            fprintf(stderr, "fuzz_config: bad error message: \"%s\"\n", err);
            abort();
        }
        CHECK(memcmp(&cfg, &before, sizeof cfg) == 0);
    } else {
        check_config(&cfg);
    }
    return 0;
}
