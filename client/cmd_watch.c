/* cmd_watch.c — gradctl watch: follow one job until it ends.
 *
 * On a terminal, one status line redrawn in place; otherwise plain lines
 * (logs, pipes), at most one a second; with --json, one JSON object per
 * event. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "jobfmt.h"
#include "table.h"
#include "units.h"

#define BAR_MIN 10
#define BAR_MAX 30

/* Piped, a small job changes about a hundred times a second: a log or a
 * `| tail` wants a line a second at most, like vmstat's. */
#define PIPED_EVERY_S 1.0

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int term_columns(void)
{
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        return ws.ws_col;
    return 80;
}

/* "[##########----------] 120/600 20% loss 2.134 val 2.301 41.2k tok/s
 * eta 1m03s mem 1.40G": the bar takes what the figures leave of the
 * terminal's width, and the line is cut so that it never wraps (a wrapped
 * line could not be redrawn in place). */
static void live_line(char *buf, size_t len, const Gradd__JobInfo *j)
{
    int cols = term_columns();
    if (jobfmt_is_program(j) && strcmp(j->state, "queued") != 0) {
        /* No number of steps: no bar to fill. */
        jobfmt_progress(buf, len, j);
    } else if (strcmp(j->state, "queued") == 0) {
        /* Made safe before the line is cut to the terminal's width. */
        char dev[128];
        snprintf(buf, len, "job %u queued for %s, waiting for its turn", j->id,
                 j->device && *j->device ? table_text(j->device, dev, sizeof dev) : "a device");
    } else {
        char loss[32], val[48] = "", speed[48], eta[32], mem[16], figures[256];
        if (isfinite(j->val_loss))
            snprintf(val, sizeof val, " val %.3f", j->val_loss);
        snprintf(figures, sizeof figures, " %llu/%llu %.0f%% loss %s%s %s eta %s mem %s",
                 (unsigned long long)j->step, (unsigned long long)j->steps,
                 j->steps ? 100.0 * (double)j->step / (double)j->steps : 0.0,
                 jobfmt_loss(j->step ? j->loss : NAN, loss, sizeof loss), val, jobfmt_speed(j, speed, sizeof speed),
                 jobfmt_eta(j, eta, sizeof eta), units_format_size(j->mem_allocated, mem, sizeof mem));
        /* Room for a val loss from the start, so the bar keeps its width
         * when the first validation comes in. */
        int width = cols - 1 - 2 - (int)strlen(figures) - (val[0] ? 0 : (int)strlen(" val 0.000"));
        width = width < BAR_MIN ? BAR_MIN : width > BAR_MAX ? BAR_MAX : width;
        char bar[BAR_MAX + 1];
        int fill = j->steps ? (int)((double)width * (double)j->step / (double)j->steps) : 0;
        fill = fill > width ? width : fill;
        memset(bar, '#', (size_t)fill);
        memset(bar + fill, '-', (size_t)(width - fill));
        bar[width] = '\0';
        snprintf(buf, len, "[%s]%s", bar, figures);
    }
    if (cols > 1 && strlen(buf) >= (size_t)cols)
        buf[cols - 1] = '\0';
}

/* How the job ended.  A reason can be several lines (an OOM report): the
 * line breaks are kept, anything else unsafe is shown escaped. */
static void final_line(const Gradd__JobInfo *j)
{
    char line[1024];
    jobfmt_final(line, sizeof line, j);
    table_put_text(stdout, line, strlen(line), TABLE_TEXT_LINES);
    putchar('\n');
}

static int run(ctl *c, int argc, char **argv)
{
    bool live = !c->json && isatty(STDOUT_FILENO);
    /* The live line is printed with its newline and redrawn by moving up
     * one line: the cursor always rests on an empty line, so an error from
     * ctl_next or a ^C never lands in the middle of the bar. */
    bool drawn = false, shown = false;
    uint64_t shown_step = 0;
    double shown_at = 0;
    char shown_state[16] = "";
    Gradd__Response *resp;
    int rc = jobfmt_id_call(c, argc, argv, GRADD__REQUEST__BODY_WATCH, NULL, &resp);
    while (rc == CTL_OK) {
        if (!resp->watch->job)
            return ctl_unexpected(c, resp);
        const Gradd__WatchEvent *e = resp->watch;
        const Gradd__JobInfo *j = e->job;
        char line[512];
        if (c->json) {
            jout_print(json_pack("{s:b, s:o}", "final", (int)e->final, "job", jobfmt_json(j)));
        } else if (live) {
            if (drawn)
                fputs("\033[1A\r\033[K", stdout);
            if (e->final) {
                final_line(j);
            } else {
                live_line(line, sizeof line, j);
                printf("%s\n", line);
            }
            drawn = true;
        } else {
            /* A line a second at most, and one for each change of state;
             * the final event repeats the last step, with the job no
             * longer running (no eta, its memory freed): a step already
             * shown is not shown again, and one skipped is shown now. */
            double now = mono_s();
            bool state_changed = strncmp(shown_state, j->state ? j->state : "", sizeof shown_state - 1) != 0;
            bool due = !shown || state_changed || now - shown_at >= PIPED_EVERY_S;
            if (e->final ? !shown || j->step != shown_step : due) {
                jobfmt_progress(line, sizeof line, j);
                table_puts(stdout, line);
                putchar('\n');
                shown = true;
                shown_step = j->step;
                shown_at = now;
                snprintf(shown_state, sizeof shown_state, "%s", j->state ? j->state : "");
            }
            if (e->final)
                final_line(j);
        }
        fflush(stdout);
        if (e->final) {
            rc = strcmp(j->state, "completed") == 0 ? CTL_OK : CTL_ERR_DAEMON;
            ctl_free(resp);
            return rc;
        }
        ctl_free(resp);
        rc = ctl_next(c, &resp);
    }
    return rc;
}

const ctl_cmd cmd_watch = {
    .name = "watch",
    .args = "ID",
    .summary = "follow a job's progress live until it ends",
    .run = run,
};
