/* server.c — the process around the control plane: the loop, signals, the
 * once-a-second tick, and the wake-up that workers send when a job
 * changes.  Connections are conn.c's, the socket file sockfile.c's, and
 * what systemd hears svc.c's. */
#include "server_internal.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "jobs/queue.h"
#include "svc.h"
#include "wire.h"

/* ---- job changes ------------------------------------------------------------ */

static void on_notify(uv_async_t *a)
{
    server *s = a->data;
    if (s->ctx->q)
        queue_save_unsaved(s->ctx->q);
    server_push_streams(s);
}

/* Called by workers from their threads. */
static void notify_loop(void *user)
{
    server *s = user;
    uv_async_send(&s->notify);
}

/* ---- signals, timers, run ------------------------------------------------ */

static void on_signal(uv_signal_t *h, int signum)
{
    server *s = h->data;
    svc_stopping();
    log_info("%s: shutting down", strsignal(signum));
    server_stop(s);
}

static void on_tick(uv_timer_t *t)
{
    server *s = t->data;
    /* Time-based pool policies (periodic trim, low watermark, gc threshold)
     * also run on idle devices, where no worker calls pool_tick. */
    for (int i = 0; i < s->ctx->ndev; i++)
        pool_tick(s->ctx->pools[i], 0);
    if (s->ctx->q && s->ctx->cfg.keep_finished_ms) {
        pthread_mutex_lock(&s->ctx->q->lock);
        size_t gone = queue_prune(s->ctx->q, (double)time(NULL), (double)s->ctx->cfg.keep_finished_ms / 1e3);
        pthread_mutex_unlock(&s->ctx->q->lock);
        if (gone)
            queue_notify(s->ctx->q);
    }
    /* Streams that wait on what no job change announces (a log being
     * followed that a program writes to) look again once a second. */
    server_push_streams(s);
    if (s->ctx->q) {
        /* What a full state dir kept from disk, again once a second. */
        queue_save_unsaved(s->ctx->q);
        svc_report(s->ctx, &s->wd);
    }
}

int server_init(server *s, gradd_ctx *ctx, const char *path, char *err, size_t err_len)
{
    memset(s, 0, sizeof *s);
    s->ctx = ctx;
    int rc = uv_loop_init(&s->loop);
    if (rc != 0) {
        snprintf(err, err_len, "uv_loop_init: %s", uv_strerror(rc));
        return -1;
    }
    /* Signals first: once the socket accepts, a client may already be
     * telling us to stop, and SIGTERM must then mean a clean shutdown. */
    uv_signal_init(&s->loop, &s->sig_term);
    uv_signal_init(&s->loop, &s->sig_int);
    uv_signal_init(&s->loop, &s->sig_hup);
    s->sig_term.data = s->sig_int.data = s->sig_hup.data = s;
    uv_signal_start(&s->sig_term, on_signal, SIGTERM);
    uv_signal_start(&s->sig_int, on_signal, SIGINT);
    /* The terminal gradd ran in went away: stop as cleanly as on SIGTERM
     * (running jobs checkpoint), rather than die on the default action.
     * Not when it is ignored: `nohup gradd` asks to outlive the terminal. */
    struct sigaction hup;
    if (sigaction(SIGHUP, NULL, &hup) == 0 && hup.sa_handler != SIG_IGN)
        uv_signal_start(&s->sig_hup, on_signal, SIGHUP);
    uv_timer_init(&s->loop, &s->tick);
    s->tick.data = s;
    uv_async_init(&s->loop, &s->notify, on_notify);
    s->notify.data = s;
    if (server_bind(s, path, err, err_len) != 0) {
        uv_close((uv_handle_t *)&s->sig_term, NULL);
        uv_close((uv_handle_t *)&s->sig_int, NULL);
        uv_close((uv_handle_t *)&s->sig_hup, NULL);
        uv_close((uv_handle_t *)&s->tick, NULL);
        uv_close((uv_handle_t *)&s->notify, NULL);
        uv_run(&s->loop, UV_RUN_DEFAULT);
        uv_loop_close(&s->loop);
        return -1;
    }
    s->wd.usec = svc_watchdog_usec();
    uint64_t every = 1000;
    if (s->wd.usec && s->wd.usec / 2000 < every)
        every = s->wd.usec / 2000 ? s->wd.usec / 2000 : 1;
    uv_timer_start(&s->tick, on_tick, every, every);
    if (ctx->q) {
        pthread_mutex_lock(&ctx->q->lock);
        ctx->q->notify = notify_loop;
        ctx->q->notify_user = s;
        pthread_mutex_unlock(&ctx->q->lock);
    }
    return 0;
}

int server_run(server *s)
{
    log_info("listening on %s (protocol %u, pid %d)", s->path, WIRE_PROTOCOL_VERSION, (int)getpid());
    uv_run(&s->loop, UV_RUN_DEFAULT);
    return 0;
}

void server_stop(server *s)
{
    if (s->stopping)
        return;
    s->stopping = true;
    /* Unlink first so that a new daemon can bind as soon as we stop
     * accepting, and never removes a socket that is not ours. */
    server_unlink(s);
    uv_close((uv_handle_t *)&s->listener, NULL);
    uv_close((uv_handle_t *)&s->sig_term, NULL);
    uv_close((uv_handle_t *)&s->sig_int, NULL);
    uv_close((uv_handle_t *)&s->sig_hup, NULL);
    uv_close((uv_handle_t *)&s->tick, NULL);
    /* Workers may still report while they checkpoint: stop them from
     * touching the loop before its handle goes away. */
    if (s->ctx->q) {
        pthread_mutex_lock(&s->ctx->q->lock);
        s->ctx->q->notify = NULL;
        pthread_mutex_unlock(&s->ctx->q->lock);
    }
    uv_close((uv_handle_t *)&s->notify, NULL);
    server_close_conns(s);
}

void server_free(server *s)
{
    if (!s->stopping)
        server_stop(s);
    uv_run(&s->loop, UV_RUN_DEFAULT); /* let the close callbacks run */
    if (uv_loop_close(&s->loop) != 0)
        log_warn("event loop closed with handles still open");
    free(s->wd.beats);
    free(s->wd.since_ns);
    free(s->per_uid);
}
