/* fuzz_pool_shm.c — libFuzzer harness for daemon/pool/pool_shm.c, the
 * reader of the page an untrusted program writes.
 *
 * The input's first byte picks how the memfd is made (bit 0: keep the
 * input's own length instead of exactly one page; bit 1: leave it
 * unsealed); the rest is the page's contents.  Properties (abort() on
 * violation):
 *   - pool_shm_map succeeds only on a sealed memfd of POOL_SHM_SIZE bytes
 *     with this version's header, and otherwise explains itself;
 *   - pool_shm_read returns 0, or -1 with EPROTO or ETIMEDOUT, in bounded
 *     time, and a snapshot it returns has sane arithmetic: current =
 *     allocated - freed, peak >= current, fragmentation in [0, 1], the
 *     largest free block within what is cached, no job rows;
 *   - the control readers never fail.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pool/pool_shm.h"

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "fuzz_pool_shm: property failed at %s:%d: %s\n", __FILE__,     \
                    __LINE__, #cond);                                                      \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

static void check_stat(const pool_stat *x)
{
    CHECK(x->current == (int64_t)(x->allocated - x->freed));
    CHECK(x->peak >= x->current);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t mode = data[0];
    data++;
    size--;
    int fd = memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return 0;
    size_t len = (mode & 1) ? size : POOL_SHM_SIZE;
    if (ftruncate(fd, (off_t)len) != 0 ||
        pwrite(fd, data, size < len ? size : len, 0) < 0 ||
        (!(mode & 2) && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)) {
        close(fd);
        return 0;
    }
    char err[256] = "";
    pool_shm_page *pg = pool_shm_map(fd, err, sizeof err);
    bool sealed = !(mode & 2);
    if (!pg) {
        CHECK(err[0] != 0);
        CHECK(strstr(err, "pool page fd") == err);
    } else {
        CHECK(sealed && len == POOL_SHM_SIZE);
        pool_stats s;
        int rc = pool_shm_read(pg, &s, 1000000);
        if (rc == 0) {
            for (int i = 0; i < 3; i++) {
                check_stat(&s.allocated_bytes[i]);
                check_stat(&s.reserved_bytes[i]);
                check_stat(&s.active_bytes[i]);
                check_stat(&s.inactive_split_bytes[i]);
                check_stat(&s.requested_bytes[i]);
                check_stat(&s.allocations[i]);
                check_stat(&s.segments[i]);
            }
            CHECK(s.fragmentation >= 0 && s.fragmentation <= 1);
            int64_t res = s.reserved_bytes[POOL_ALL].current, all = s.allocated_bytes[POOL_ALL].current;
            uint64_t cached = res <= all ? 0 : (uint64_t)res - (uint64_t)all;
            CHECK(cached == 0 ? s.largest_free_block == 0 : s.largest_free_block <= cached);
            CHECK(s.njobs == 0);
        } else {
            CHECK(errno == EPROTO || errno == ETIMEDOUT);
        }
        uint64_t v = 0;
        pool_trim_reason why;
        if (pool_shm_trim_pending(pg, &v, &why))
            CHECK((unsigned)why < POOL_TRIM_REASONS);
        (void)pool_shm_shared(pg);
        (void)pool_shm_reclaim_pending(pg, &v);
        pool_shm_unmap(pg);
    }
    close(fd);
    return 0;
}
