/* cmd_top.c — gradctl top: the devices, who holds their memory, the pools
 * and the jobs, redrawn every interval.
 *
 * On a terminal it takes the screen (the alternate one, cursor hidden),
 * reads keys unbuffered and quits on q; the terminal is given back as it
 * was on every way out: q, SIGINT, SIGTERM, SIGHUP, a lost daemon.
 * Otherwise it writes plain lines, one frame per interval (or one with
 * --once), with no escape sequences, so it can be piped and logged.
 * Everything the daemon sends is shown in table.h's safe form.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "jobfmt.h"
#include "table.h"
#include "units.h"

/* The bar's width in plain output, where there is no terminal to fill. */
#define PLAIN_BAR 50
#define BAR_MAX 400
/* Segments in one bar: a job each, then cached and others. */
#define BAR_SEGS 64
/* Job letters in a bar; jobs past the last share '*'. */
static const char bar_letters[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";

/* ---- one frame's data ------------------------------------------------------ */

typedef struct {
    Gradd__Response *status, *stats;
    jobfmt_list jobs[2]; /* running, queued */
} frame;

static void frame_free(frame *f)
{
    ctl_free(f->status);
    ctl_free(f->stats);
    for (int s = 0; s < 2; s++)
        jobfmt_list_free(&f->jobs[s]);
    memset(f, 0, sizeof *f);
}

/* Each frame on a connection of its own: a daemon restarted between frames
 * is picked up, and an idle connection is never held past client_timeout. */
static int frame_fetch(ctl *c, frame *f)
{
    memset(f, 0, sizeof *f);
    ctl_close(c);
    Gradd__StatusRequest sr = GRADD__STATUS_REQUEST__INIT;
    int rc = ctl_call(c, "status", GRADD__REQUEST__BODY_STATUS, &sr, &f->status);
    if (rc == CTL_OK) {
        Gradd__StatsRequest st = GRADD__STATS_REQUEST__INIT;
        rc = ctl_call(c, "stats", GRADD__REQUEST__BODY_STATS, &st, &f->stats);
    }
    if (rc == CTL_OK)
        rc = jobfmt_list_fetch(c, NULL, "running", &f->jobs[0]);
    if (rc == CTL_OK)
        rc = jobfmt_list_fetch(c, NULL, "queued", &f->jobs[1]);
    ctl_close(c);
    if (rc == CTL_OK && (!f->status->status || !f->stats->stats))
        rc = CTL_ERR_DAEMON;
    if (rc != CTL_OK)
        frame_free(f);
    return rc;
}

static const Gradd__PoolStats *pool_of(const frame *f, const char *id)
{
    for (size_t i = 0; i < f->stats->stats->n_pools; i++)
        if (strcmp(f->stats->stats->pools[i]->device, id) == 0)
            return f->stats->stats->pools[i];
    return NULL;
}

static const Gradd__JobInfo *job_of(const frame *f, uint32_t id)
{
    for (int s = 0; s < 2; s++)
        for (size_t k = 0; k < f->jobs[s].n; k++)
            if (f->jobs[s].jobs[k]->id == id)
                return f->jobs[s].jobs[k];
    return NULL;
}

/* ---- drawing ------------------------------------------------------------- */

/* The bar: segment k takes bytes[k] of `total` in cells of ch[k], in
 * order, and what is left is free ('.').  Each segment that holds any
 * bytes gets a cell at least, taken from the widest, so that a job using a
 * sliver of a large device is still there to see. */
static void bar_fill(char *bar, int width, uint64_t total, const uint64_t *bytes, const char *ch, int n)
{
    int cells[BAR_SEGS + 1], sum = 0;
    for (int k = 0; k < n; k++) {
        cells[k] = total ? (int)llround((double)bytes[k] * width / (double)total) : 0;
        if (bytes[k] && !cells[k])
            cells[k] = 1;
        sum += cells[k];
    }
    while (sum > width) {
        int wide = 0;
        for (int k = 1; k < n; k++)
            wide = cells[k] > cells[wide] ? k : wide;
        cells[wide]--;
        sum--;
    }
    int at = 0;
    for (int k = 0; k < n; k++) {
        memset(bar + at, ch[k], (size_t)cells[k]);
        at += cells[k];
    }
    memset(bar + at, '.', (size_t)(width - at));
    bar[width] = '\0';
}

/* A device: its memory as a bar (each job's bytes in the pool by letter,
 * what the pool caches '+', other processes 'o', free '.'), the legend,
 * the pool's figures and every process on it. */
static void draw_device(FILE *o, const frame *f, const Gradd__Device *d, int cols)
{
    const Gradd__PoolStats *p = pool_of(f, d->id);
    char a[16], b[16], c[16], e[16], text[256], name[256];
    uint64_t total = d->mem_total, freeb = d->mem_free < total ? d->mem_free : total;
    uint64_t used = total - freeb;
    uint64_t reserved = d->pool_reserved, allocated = d->pool_allocated < reserved ? d->pool_allocated : reserved;
    uint64_t others = used > reserved ? used - reserved : 0;

    fprintf(o, "%s  %s  used %s of %s, %s free\n", table_text(d->id, text, sizeof text),
            table_text(d->name, name, sizeof name), units_format_size(used, a, sizeof a),
            units_format_size(total, b, sizeof b), units_format_size(freeb, c, sizeof c));

    int width = cols - 4;
    width = width < 10 ? 10 : width > BAR_MAX ? BAR_MAX : width;
    char bar[BAR_MAX + 1], ch[BAR_SEGS];
    uint64_t seg[BAR_SEGS], jobs_sum = 0;
    int nseg = 0;
    size_t njobs = p ? p->n_jobs : 0;
    for (size_t k = 0; k < njobs && nseg < BAR_SEGS - 2; k++) {
        uint64_t n = p->jobs[k]->allocated;
        if (jobs_sum + n > allocated)
            n = allocated - jobs_sum;
        jobs_sum += n;
        seg[nseg] = n;
        ch[nseg++] = k < sizeof bar_letters - 1 ? bar_letters[k] : '*';
    }
    /* The pool's bytes that no job holds count as cached for the bar:
     * they are the pool's, not a job's. */
    seg[nseg] = reserved - jobs_sum;
    ch[nseg++] = '+';
    seg[nseg] = others;
    ch[nseg++] = 'o';
    bar_fill(bar, width, total, seg, ch, nseg);
    fprintf(o, "  [%s]\n", bar);

    fprintf(o, " ");
    for (size_t k = 0; k < njobs; k++) {
        const Gradd__JobInfo *j = job_of(f, p->jobs[k]->job);
        fprintf(o, " %c job %u %s %s ", k < sizeof bar_letters - 1 ? bar_letters[k] : '*', p->jobs[k]->job,
                j ? table_text(j->name, text, sizeof text) : "-", units_format_size(p->jobs[k]->allocated, a, sizeof a));
    }
    fprintf(o, " + cached %s  o others %s  . free %s\n", units_format_size(reserved - allocated, a, sizeof a),
            units_format_size(others, b, sizeof b), units_format_size(freeb, c, sizeof c));

    if (p)
        fprintf(o, "  pool: reserved %s  allocated %s  frag %.0f%%  largest free %s  OOMs %llu  trims %llu"
                   "  trimmed %s\n",
                units_format_size(reserved, a, sizeof a), units_format_size(allocated, b, sizeof b),
                d->fragmentation * 100, units_format_size(p->largest_free_block, c, sizeof c),
                (unsigned long long)p->ooms, (unsigned long long)p->trims,
                units_format_size(p->trimmed_bytes, e, sizeof e));

    for (size_t k = 0; k < d->n_processes; k++) {
        const Gradd__GpuProcess *q = d->processes[k];
        char cmd[256], user[128];
        jobfmt_process(q, cmd, sizeof cmd);
        fprintf(o, "  pid %u  %s  %s  %s\n", q->pid, q->user && *q->user ? table_text(q->user, user, sizeof user) : "-",
                table_text(cmd, text, sizeof text), units_format_size(q->used_bytes, a, sizeof a));
    }
    if (d->process_note && *d->process_note)
        fprintf(o, "  processes: %s\n", table_text(d->process_note, text, sizeof text));
}

static void draw_jobs(FILE *o, const frame *f)
{
    static const char *const head[] = {">ID",   "USER", "NAME",      "STATE", "DEVICE",
                                       ">STEP", ">LOSS", ">SPEED", ">MICRO×ACC", ">MEM"};
    table t;
    table_init(&t, 10, head);
    for (int s = 0; s < 2; s++)
        for (size_t k = 0; k < f->jobs[s].n; k++) {
            const Gradd__JobInfo *j = f->jobs[s].jobs[k];
            char loss[32], speed[48], batch[48], mem[16];
            table_cell(&t, "%u", j->id);
            table_cell(&t, "%s", j->user);
            table_cell(&t, "%s", j->name);
            table_cell(&t, "%s", j->state);
            table_cell(&t, "%s", j->device);
            table_cell(&t, "%llu/%llu", (unsigned long long)j->step, (unsigned long long)j->steps);
            table_cell(&t, "%s", jobfmt_loss(j->step ? j->loss : NAN, loss, sizeof loss));
            table_cell(&t, "%s", jobfmt_speed(j, speed, sizeof speed));
            table_cell(&t, "%s", jobfmt_batch(j, batch, sizeof batch));
            table_cell(&t, "%s", units_format_size(j->mem_allocated, mem, sizeof mem));
        }
    if (t.nrows)
        table_print(&t, o);
    else
        fprintf(o, "no running or queued jobs\n");
    table_free(&t);
}

/* The whole frame as text, lines cut to nothing: the caller fits them. */
static void draw(FILE *o, const frame *f, int cols, double interval)
{
    const Gradd__StatusResponse *st = f->status->status;
    char up[32], clock[16], ver[64];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(clock, sizeof clock, "%H:%M:%S", &tm);
    fprintf(o, "gradd %s  pid %d  up %s  %s  every %gs\n", table_text(st->daemon_version, ver, sizeof ver), st->pid,
            units_format_duration(st->uptime_s, up, sizeof up), clock, interval);
    for (size_t i = 0; i < st->n_devices; i++) {
        fprintf(o, "\n");
        draw_device(o, f, st->devices[i], cols);
    }
    if (st->cuda_note && *st->cuda_note) {
        char note[512];
        fprintf(o, "\n%s\n", table_text(st->cuda_note, note, sizeof note));
    }
    fprintf(o, "\n");
    draw_jobs(o, f);
}

/* ---- the terminal ------------------------------------------------------------ */

typedef struct {
    bool raw;
    struct termios saved;
    int pipe[2]; /* signals wake the loop through it */
} term;

static volatile sig_atomic_t got_quit, got_winch;
static int wake_fd = -1;

static void on_signal(int sig)
{
    int saved = errno;
    if (sig == SIGWINCH)
        got_winch = 1;
    else
        got_quit = 1;
    if (wake_fd >= 0) {
        ssize_t n = write(wake_fd, "", 1);
        (void)n;
    }
    errno = saved;
}

static void term_size(int *rows, int *cols)
{
    struct winsize ws;
    *rows = 24;
    *cols = 80;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0) {
        *rows = ws.ws_row;
        *cols = ws.ws_col;
    }
}

/* Keys unbuffered and unechoed (signals still from ^C), the alternate
 * screen, the cursor hidden. */
static int term_enter(term *t)
{
    if (pipe2(t->pipe, O_CLOEXEC | O_NONBLOCK) != 0)
        return -1;
    wake_fd = t->pipe[1];
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    for (int s = 0, sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGWINCH}; s < 4; s++)
        sigaction(sigs[s], &sa, NULL);
    if (isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &t->saved) == 0) {
        struct termios r = t->saved;
        r.c_lflag &= (tcflag_t) ~(ICANON | ECHO);
        r.c_cc[VMIN] = 1;
        r.c_cc[VTIME] = 0;
        t->raw = tcsetattr(STDIN_FILENO, TCSANOW, &r) == 0;
    }
    fputs("\033[?1049h\033[?25l", stdout);
    fflush(stdout);
    return 0;
}

/* What term_enter changed, undone; the cursor shown last, so the output
 * always ends with it. */
static void term_leave(term *t)
{
    fputs("\033[?1049l\033[?25h", stdout);
    fflush(stdout);
    if (t->raw)
        tcsetattr(STDIN_FILENO, TCSANOW, &t->saved);
    wake_fd = -1;
    close(t->pipe[0]);
    close(t->pipe[1]);
}

/* The frame at the top of the screen: each line cut to the width (the text
 * is already safe, so counting UTF-8 lead bytes counts columns) and to the
 * rows, the rest of each line and of the screen cleared. */
static void term_show(const char *text, int rows, int cols)
{
    fputs("\033[H", stdout);
    int row = 0;
    for (const char *s = text; *s && row < rows; row++) {
        const char *nl = strchr(s, '\n');
        size_t n = nl ? (size_t)(nl - s) : strlen(s);
        int col = 0;
        size_t k = 0;
        for (; k < n; k++) {
            if (((unsigned char)s[k] & 0xC0) != 0x80 && ++col > cols)
                break;
        }
        fwrite(s, 1, k, stdout);
        fputs("\033[K", stdout);
        if (row + 1 < rows)
            fputs("\n", stdout);
        s += nl ? n + 1 : n;
    }
    fputs("\033[J", stdout);
    fflush(stdout);
}

/* ---- the command ---------------------------------------------------------------- */

static int run(ctl *c, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"interval", required_argument, NULL, 'n'},
        {"once", no_argument, NULL, '1'},
        {NULL, 0, NULL, 0},
    };
    double interval = 1.0;
    bool once = false;
    int ch;
    while ((ch = ctl_getopt(c, argc, argv, "n:1", longopts)) != -1) {
        if (ch == 'n') {
            char *end;
            errno = 0;
            interval = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(interval >= 0.1 && interval <= 3600))
                return ctl_usage(c, "-n takes seconds from 0.1 to 3600, not '%s'", optarg);
        } else if (ch == '1') {
            once = true;
        } else {
            return CTL_ERR_USAGE; /* ctl_getopt said why */
        }
    }
    if (optind < argc)
        return ctl_usage(c, "unexpected argument '%s'", argv[optind]);
    if (c->json)
        return ctl_usage(c, "top has no --json: use status and stats");

    bool live = isatty(STDOUT_FILENO) && !once;
    term t = {.pipe = {-1, -1}};
    if (live && term_enter(&t) != 0) {
        perror("gradctl top: pipe");
        return CTL_ERR_DAEMON;
    }
    int rc = CTL_OK;
    bool keys = live; /* stdin may still give keys */
    got_quit = got_winch = 0;
    while (!got_quit) {
        int rows = 24, cols = PLAIN_BAR + 4;
        if (live)
            term_size(&rows, &cols);
        frame f;
        rc = frame_fetch(c, &f);
        if (rc != CTL_OK) {
            if (got_quit)
                rc = CTL_OK; /* a signal to stop cut the exchange short */
            break;
        }
        char *text = NULL;
        size_t len = 0;
        FILE *o = open_memstream(&text, &len);
        if (!o) {
            frame_free(&f);
            rc = CTL_ERR_DAEMON;
            break;
        }
        draw(o, &f, cols, interval);
        fclose(o);
        frame_free(&f);
        if (live) {
            term_show(text, rows, cols);
        } else {
            fputs(text, stdout);
            if (!once)
                putchar('\n'); /* a blank line between frames */
            fflush(stdout);
        }
        free(text);
        if (once)
            break;
        /* Sleep the interval, woken early by a key or a signal. */
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            clock_gettime(CLOCK_MONOTONIC, &t1);
            double left = interval - ((double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
            if (left <= 0 || got_quit)
                break;
            struct pollfd pf[2] = {{.fd = live ? t.pipe[0] : -1, .events = POLLIN},
                                   {.fd = keys ? STDIN_FILENO : -1, .events = POLLIN}};
            int n = poll(pf, 2, (int)ceil(left * 1000));
            if (n < 0 && errno != EINTR)
                break;
            if (n > 0 && (pf[0].revents & POLLIN)) {
                char drain[16];
                while (read(t.pipe[0], drain, sizeof drain) > 0)
                    ;
            }
            if (n > 0 && (pf[1].revents & (POLLIN | POLLHUP))) {
                char key[16];
                ssize_t k = read(STDIN_FILENO, key, sizeof key);
                if (k <= 0 && !(k < 0 && (errno == EINTR || errno == EAGAIN))) {
                    keys = false; /* stdin closed: no key can come, keep the interval */
                } else if (k > 0 && (memchr(key, 'q', (size_t)k) || memchr(key, 'Q', (size_t)k))) {
                    got_quit = 1;
                }
            }
            if (got_winch) {
                got_winch = 0;
                break; /* redraw at the new size now */
            }
        }
    }
    if (live) {
        term_leave(&t);
        if (rc != CTL_OK)
            fprintf(stderr, "gradctl top: stopped: no answer from gradd at %s\n", c->socket_path);
    }
    return rc;
}

const ctl_cmd cmd_top = {
    .name = "top",
    .args = "[-n SECONDS] [-1|--once]",
    .summary = "live view of the devices, who holds their memory, the pools and the jobs",
    .run = run,
};
