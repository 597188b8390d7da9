/* cmd_logs.c — gradctl logs: the job's log, as the daemon streams it. */
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

static int run(ctl *c, int argc, char **argv)
{
    char *all = NULL;
    size_t len = 0, cap = 0;
    /* Text: the log made safe for the terminal, its lines kept.  A chunk
     * may end inside a UTF-8 character; those bytes wait in `cut` for the
     * rest, so that an "é" split in two is not shown as two bad bytes. */
    char cut[8];
    size_t ncut = 0;
    uint32_t id;
    Gradd__Response *resp;
    int rc = jobfmt_id_call(c, argc, argv, GRADD__REQUEST__BODY_LOGS, &id, &resp);
    while (rc == CTL_OK) {
        const Gradd__LogsResponse *l = resp->logs;
        if (c->json) {
            if (append(&all, &len, &cap, l->chunk.data, l->chunk.len) != 0) {
                fprintf(stderr, "gradctl: out of memory\n");
                ctl_free(resp);
                rc = CTL_ERR_DAEMON;
                break;
            }
        } else if (ncut + l->chunk.len) {
            char *text = malloc(ncut + l->chunk.len);
            if (!text) {
                fprintf(stderr, "gradctl: out of memory\n");
                ctl_free(resp);
                rc = CTL_ERR_DAEMON;
                break;
            }
            memcpy(text, cut, ncut);
            memcpy(text + ncut, l->chunk.data, l->chunk.len);
            size_t n = ncut + l->chunk.len;
            size_t done = table_put_text(stdout, text, n, TABLE_TEXT_LINES | (l->last ? 0 : TABLE_TEXT_MORE));
            ncut = n - done; /* at most 3: the start of one character */
            memcpy(cut, text + done, ncut);
            free(text);
        }
        bool last = l->last;
        ctl_free(resp);
        if (last)
            break;
        rc = ctl_next(c, &resp);
    }
    if (rc == CTL_OK && c->json)
        rc = jout_print(json_pack("{s:o, s:o}", "id", jout_uint(id), "log", jout_str(all)));
    free(all);
    fflush(stdout);
    return rc;
}

const ctl_cmd cmd_logs = {
    .name = "logs",
    .args = "ID",
    .summary = "print a job's log",
    .run = run,
};
