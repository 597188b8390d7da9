/* pool_fx.c — see pool_fx.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* for clock_gettime etc. under -std=c11 */
#endif
#include "pool_fx.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include <cmocka.h>

void fx_open(fx *f, size_t capacity, const pool_config *c)
{
    assert_int_equal(dev_cpu_create(capacity, 0, &f->d), DEV_OK);
    assert_int_equal(pool_create(f->d, c, &f->p), 0);
    CHECK(f->p);
}

void fx_close(fx *f)
{
    CHECK(f->p);
    pool_destroy(f->p);
    size_t fr = 0, total = 0;
    dev_mem_info(f->d, &fr, &total);
    assert_int_equal(fr + dev_cpu_external(f->d), total);
    dev_destroy(f->d);
}

pool_config cfg_default(void)
{
    pool_config c;
    pool_config_default(&c);
    return c;
}

pool_stats *stats(pool *p)
{
    static pool_stats s; /* tests are single-threaded */
    pool_stats_read(p, &s);
    return &s;
}

size_t device_free(dev *d)
{
    size_t fr = 0, total = 0;
    dev_mem_info(d, &fr, &total);
    return fr;
}

size_t count_events(pool *p, pool_event_kind kind, int reason)
{
    pool_event *ev = calloc(65536, sizeof *ev);
    assert_non_null(ev);
    size_t n = pool_timeline_snapshot(p, ev, 65536), k = 0;
    for (size_t i = 0; i < n; i++)
        if (ev[i].kind == kind && (reason < 0 || ev[i].aux == (uint64_t)reason))
            k++;
    free(ev);
    return k;
}

uint64_t rnd(rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
