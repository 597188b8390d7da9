/* pool_fx.h — what the memory pool's unit tests (test_pool_alloc,
 * test_pool_trim, test_pool_stats) share: a simulated cpu device with a
 * pool on it, opened and closed per test, pool_check after each step that
 * matters, and small readers of the pool's statistics and timeline. */
#ifndef GRADD_TEST_POOL_FX_H
#define GRADD_TEST_POOL_FX_H

#include <stddef.h>
#include <stdint.h>

#include "pool/dev.h"
#include "pool/pool.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

typedef struct {
    dev *d;
    pool *p;
} fx;

/* pool_check, or a cmocka failure with what it found. */
#define CHECK(p)                                                  \
    do {                                                          \
        char err_[256];                                           \
        if (pool_check((p), err_, sizeof err_) != 0)              \
            fail_msg("pool_check: %s", err_);                     \
    } while (0)

/* A simulated cpu device of `capacity` bytes and a pool on it with config c. */
void fx_open(fx *f, size_t capacity, const pool_config *c);
/* Destroying the pool must hand every byte back to the device. */
void fx_close(fx *f);

pool_config cfg_default(void);
/* The pool's statistics, read into one static buffer (tests are
 * single-threaded): valid until the next call. */
pool_stats *stats(pool *p);
/* The device's free bytes. */
size_t device_free(dev *d);
/* Count timeline events of a kind (and trim reason, when >= 0). */
size_t count_events(pool *p, pool_event_kind kind, int reason);

/* splitmix64: reproducible streams for the placement and random tests. */
typedef struct {
    uint64_t s;
} rng;

uint64_t rnd(rng *r);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t mono_ns(void);

#endif
