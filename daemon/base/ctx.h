/* ctx.h — what one running gradd owns: its configuration, its devices and
 * one memory pool per device, and the queue and workers that use them.  The
 * event loop, the RPC handlers and the workers reach the devices through
 * this. */
#ifndef GRADD_CTX_H
#define GRADD_CTX_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "pool/dev.h"
#include "pool/pool.h"
#include "pool/pool_peers.h"

#define CTX_MAX_DEVICES 32

typedef struct {
    void **ptrs;
    size_t n, cap;
} ctx_held;

struct queue;

typedef struct gradd_ctx {
    gradd_config cfg;
    int ndev;
    dev *devs[CTX_MAX_DEVICES];
    pool *pools[CTX_MAX_DEVICES];
    pool_peers *peers[CTX_MAX_DEVICES]; /* the program jobs' own pools on each device */
    char cuda_note[256]; /* why there are no CUDA devices, when there are none */
    dev_nvml *nvml;      /* lists the processes on CUDA devices; NULL without */
    char nvml_note[256]; /* why nvml is NULL while there are CUDA devices */
    /* What a program job's PyTorch allocates through: libgradd-alloc and
     * the folder with the shim and the gradd package ("" and a note when
     * not found; program jobs then run on their own allocator). */
    char alloc_lib[PATH_MAX];
    char python_dir[PATH_MAX];
    char alloc_note[PATH_MAX + 128];
    uint64_t start_ns;   /* CLOCK_MONOTONIC at start */
    bool test_hooks;     /* --test-hooks: simulated device pressure over the socket */
    ctx_held test_held[CTX_MAX_DEVICES]; /* blocks held by the test_alloc hook */
    struct queue *q;     /* the job queue (NULL in `gradd run`) */
    struct workers *ws;  /* the job threads (NULL in `gradd run`) */
} gradd_ctx;

/* Open the cpu devices and probe CUDA, creating a pool on each.  Returns 0,
 * or -1 with the reason in err (nothing is left open on failure). */
int ctx_open(gradd_ctx *c, char *err, size_t err_len);
void ctx_close(gradd_ctx *c);

/* Index of the device with this id ("cpu0"), or -1. */
int ctx_find_device(const gradd_ctx *c, const char *id);
/* The cores this process may run on (its affinity mask). */
int ctx_cores(void);

uint64_t ctx_now_ns(void);

#endif
