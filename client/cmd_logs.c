/* cmd_logs.c — gradctl logs: the job's log, as the daemon streams it; its
 * last lines (--tail N), and with -f what the job writes until it ends. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "jobfmt.h"
#include "table.h"

/* --json: the whole log as one string, {"id":N,"log":"..."}.  JSON strings
 * cannot hold NUL, so NUL bytes are dropped. */
static int append(char **buf, size_t *len, size_t *cap, const uint8_t *data, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t ncap = *cap ? *cap : 4096;
        while (ncap < *len + n + 1)
            ncap *= 2;
        char *nb = realloc(*buf, ncap);
        if (!nb)
            return -1;
        *buf = nb;
        *cap = ncap;
    }
    for (size_t i = 0; i < n; i++)
        if (data[i])
            (*buf)[(*len)++] = (char)data[i];
    (*buf)[*len] = '\0';
    return 0;
}

/* Following ended: the job's outcome decides the exit code, as watch's
 * does (0 only for a completed job).  CTL_OK with *completed set, or the
 * request's error (reported). */
static int outcome(ctl *c, uint32_t id, bool *completed)
{
    Gradd__JobRequest jr = GRADD__JOB_REQUEST__INIT;
    jr.id = id;
    Gradd__Response *resp;
    int rc = ctl_call(c, "logs", GRADD__REQUEST__BODY_JOB, &jr, &resp);
    if (rc != CTL_OK)
        return rc;
    *completed = resp->job->state && strcmp(resp->job->state, "completed") == 0;
    ctl_free(resp);
    return CTL_OK;
}

static int run(ctl *c, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"follow", no_argument, NULL, 'f'},
        {"tail", required_argument, NULL, 'n'},
        {NULL, 0, NULL, 0},
    };
    Gradd__LogsRequest lr = GRADD__LOGS_REQUEST__INIT;
    int ch;
    while ((ch = ctl_getopt(c, argc, argv, "fn:", longopts)) != -1) {
        switch (ch) {
        case 'f': lr.follow = true; break;
        case 'n': {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(optarg, &end, 10);
            if (!*optarg || *optarg == '-' || *end || errno || v < 1 || v > UINT32_MAX)
                return ctl_usage(c, "--tail: '%s' is not a number of lines (1 or more)", optarg);
            lr.tail = (uint32_t)v;
            break;
        }
        default: return CTL_ERR_USAGE; /* ctl_getopt said why */
        }
    }
    int rc = jobfmt_id_arg(c, argc, argv, &lr.id);
    if (rc != CTL_OK)
        return rc;
    uint32_t id = lr.id;
    char *all = NULL;
    size_t len = 0, cap = 0;
    /* Text: the log made safe for the terminal, its lines kept.  A chunk
     * may end inside a UTF-8 character; those bytes wait in `cut` for the
     * rest, so that an "é" split in two is not shown as two bad bytes. */
    char cut[8];
    size_t ncut = 0;
    Gradd__Response *resp;
    rc = ctl_call(c, "logs", GRADD__REQUEST__BODY_LOGS, &lr, &resp);
    while (rc == CTL_OK) {
        const Gradd__LogsResponse *l = resp->logs;
        if (c->json) {
            if (append(&all, &len, &cap, l->chunk.data, l->chunk.len) != 0) {
                ctl_free(resp);
                rc = ctl_error(c, CTL_ERR_DAEMON, "internal", NULL, "out of memory");
                break;
            }
        } else if (ncut + l->chunk.len) {
            char *text = malloc(ncut + l->chunk.len);
            if (!text) {
                ctl_free(resp);
                rc = ctl_error(c, CTL_ERR_DAEMON, "internal", NULL, "out of memory");
                break;
            }
            memcpy(text, cut, ncut);
            memcpy(text + ncut, l->chunk.data, l->chunk.len);
            size_t n = ncut + l->chunk.len;
            size_t done = table_put_text(stdout, text, n, TABLE_TEXT_LINES | (l->last ? 0 : TABLE_TEXT_MORE));
            ncut = n - done; /* at most 3: the start of one character */
            memcpy(cut, text + done, ncut);
            free(text);
            if (lr.follow)
                fflush(stdout); /* each piece as it comes, as tail -f */
        }
        bool last = l->last;
        ctl_free(resp);
        if (last)
            break;
        rc = ctl_next(c, &resp);
    }
    bool completed = true;
    if (rc == CTL_OK && lr.follow)
        rc = outcome(c, id, &completed);
    if (rc == CTL_OK && c->json)
        rc = jout_print(json_pack("{s:o, s:o}", "id", jout_uint(id), "log", jout_str(all)));
    if (rc == CTL_OK && !completed)
        rc = CTL_ERR_DAEMON;
    free(all);
    fflush(stdout);
    return rc;
}

const ctl_cmd cmd_logs = {
    .name = "logs",
    .args = "[-f] [--tail N] ID",
    .summary = "print a job's log, or its last lines; -f follows it until the job ends",
    .run = run,
};
