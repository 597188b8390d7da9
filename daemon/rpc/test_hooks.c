/* test_hooks.c — requests that exist only for the tests: simulate another
 * process taking device memory, allocate from a pool by hand, hang a job
 * thread.  Each is refused unless gradd was started with --test-hooks, so
 * a production daemon never lets a client reach into its pools or workers. */
#include "rpc_internal.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/log.h"
#include "jobs/queue.h"
#include "jobs/worker.h"

/* Whether the hooks are on; if not, the client is told how to turn them on
 * for `what` it asked. */
static bool hooks_on(const rpc_call *c, const char *what)
{
    if (c->ctx->test_hooks)
        return true;
    char msg[160];
    snprintf(msg, sizeof msg, "test hooks are off; start gradd with --test-hooks to %s", what);
    rpc_error(c, GRADD__ERROR__CODE__PERMISSION_DENIED, msg);
    return false;
}

void rpc_test_pressure(const rpc_call *c, const Gradd__Request *req)
{
    gradd_ctx *ctx = c->ctx;
    const Gradd__TestPressureRequest *rq = req->test_pressure;
    if (!hooks_on(c, "simulate device pressure"))
        return;
    int i = ctx_find_device(ctx, rq->device ? rq->device : "");
    if (i < 0 || ctx->devs[i]->kind != DEV_KIND_CPU) {
        rpc_error(c, GRADD__ERROR__CODE__NOT_FOUND,
                   "simulated pressure needs a cpu device id, e.g. cpu0");
        return;
    }
    if (dev_cpu_set_external(ctx->devs[i], rq->bytes) != DEV_OK) {
        rpc_error(c, GRADD__ERROR__CODE__UNAVAILABLE,
                   "the device has less free memory than the simulated process asks for");
        return;
    }
    log_dev(LOG_INFO, ctx->devs[i]->id, "test hook: simulated external process now holds %llu bytes of %s",
             (unsigned long long)rq->bytes, ctx->devs[i]->id);
    Gradd__TestPressureResponse tp;
    gradd__test_pressure_response__init(&tp);
    size_t f = 0, t = 0;
    dev_mem_info(ctx->devs[i], &f, &t);
    tp.external = dev_cpu_external(ctx->devs[i]);
    tp.device_free = f;
    RPC_SEND(c, TEST_PRESSURE, test_pressure, &tp);
}

void rpc_test_alloc(const rpc_call *c, const Gradd__Request *req)
{
    gradd_ctx *ctx = c->ctx;
    const Gradd__TestAllocRequest *rq = req->test_alloc;
    if (!hooks_on(c, "allocate from a pool by hand"))
        return;
    int i = ctx_find_device(ctx, rq->device ? rq->device : "");
    if (i < 0) {
        rpc_error(c, GRADD__ERROR__CODE__NOT_FOUND, "no such device");
        return;
    }
    pool_tag tag = POOL_TAG_OTHER;
    if (rq->tag && *rq->tag && pool_tag_parse(rq->tag, &tag) != 0) {
        rpc_error(c, GRADD__ERROR__CODE__BAD_REQUEST, "unknown tag");
        return;
    }
    Gradd__TestAllocResponse ta;
    gradd__test_alloc_response__init(&ta);
    pool_oom_report oom;
    char oom_msg[sizeof oom.message] = "";
    ctx_held *h = &ctx->test_held[i];
    if (rq->free_all) {
        for (size_t k = 0; k < h->n; k++)
            pool_free(ctx->pools[i], h->ptrs[k]);
        h->n = 0;
    } else {
        if (h->n == h->cap) {
            size_t ncap = h->cap ? h->cap * 2 : 64;
            void **np = realloc(h->ptrs, ncap * sizeof *np);
            if (!np) {
                rpc_error(c, GRADD__ERROR__CODE__INTERNAL, "out of memory");
                return;
            }
            h->ptrs = np;
            h->cap = ncap;
        }
        void *ptr = pool_alloc(ctx->pools[i], rq->bytes, tag, rq->job, &oom);
        if (ptr)
            h->ptrs[h->n++] = ptr;
        else
            snprintf(oom_msg, sizeof oom_msg, "%s", oom.message);
    }
    ta.held = (uint32_t)h->n;
    ta.oom = oom_msg;
    RPC_SEND(c, TEST_ALLOC, test_alloc, &ta);
}

void rpc_test_hang(const rpc_call *c, const Gradd__Request *req)
{
    gradd_ctx *ctx = c->ctx;
    const Gradd__TestHangRequest *rq = req->test_hang;
    if (!hooks_on(c, "hang a job thread"))
        return;
    int i = ctx_find_device(ctx, rq->device ? rq->device : "");
    if (i < 0 || !ctx->ws || !ctx->q) {
        rpc_error(c, GRADD__ERROR__CODE__NOT_FOUND, "test-hang needs a device id with job threads, e.g. cpu0");
        return;
    }
    Gradd__TestHangResponse th;
    gradd__test_hang_response__init(&th);
    workers_set_hang(ctx->ws, i, !rq->release, &th.workers, &th.busy);
    log_dev(LOG_WARN, ctx->devs[i]->id, "test hook: %u job thread%s of %s %s", th.workers, th.workers == 1 ? "" : "s",
            ctx->devs[i]->id, rq->release ? "released" : "told to hang at the next poll");
    RPC_SEND(c, TEST_HANG, test_hang, &th);
}
