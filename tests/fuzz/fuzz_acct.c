/* fuzz_acct.c — libFuzzer harness for daemon/jobs/acct_parse.c: the
 * accounting file as `gradctl history` reads it, line by line
 * (acct_next_line over a memfd, acct_parse_line on each line).
 * Properties (abort() on violation):
 *   - a line is at most ACCT_LINE_MAX bytes and terminated;
 *   - on failure err is non-empty and the output is untouched;
 *   - on success id is not 0, every string is terminated inside its
 *     field, state is completed, failed or cancelled, type is engine or
 *     program, and every time is finite, at least 0 and below 1e12;
 *   - what parses, written again by acct_format (what the daemon
 *     appends), parses back to the same record, and writing that gives
 *     the same line again.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "jobs/acct.h"

#define CHECK(cond)                                                                                         \
    do {                                                                                                    \
        if (!(cond)) {                                                                                      \
            fprintf(stderr, "fuzz_acct: property failed at %s:%d: %s\n", __FILE__, __LINE__, #cond);        \
            abort();                                                                                        \
        }                                                                                                   \
    } while (0)

static int terminated(const char *s, size_t size)
{
    return memchr(s, '\0', size) != NULL;
}

static int time_ok(double t)
{
    return isfinite(t) && t >= 0 && t < 1e12;
}

static void check_line(const char *line, size_t len)
{
    static acct_record r, canary, back;
    memset(&r, 0x5A, sizeof r);
    memset(&canary, 0x5A, sizeof canary);
    char err[256] = "";
    if (acct_parse_line(line, len, &r, err, sizeof err) != 0) {
        CHECK(err[0] != '\0');
        CHECK(memcmp(&r, &canary, sizeof r) == 0);
        return;
    }
    CHECK(r.id != 0);
    CHECK(terminated(r.name, sizeof r.name) && terminated(r.user, sizeof r.user));
    CHECK(terminated(r.type, sizeof r.type) && terminated(r.device, sizeof r.device));
    CHECK(terminated(r.reason, sizeof r.reason) && terminated(r.state, sizeof r.state));
    CHECK(!strcmp(r.state, "completed") || !strcmp(r.state, "failed") || !strcmp(r.state, "cancelled"));
    CHECK(!strcmp(r.type, "engine") || !strcmp(r.type, "program"));
    const double t[] = {r.submitted_at, r.started_at, r.finished_at, r.elapsed_s, r.device_hours};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        CHECK(time_ok(t[i]));
    size_t n1, n2;
    char *a = acct_format(&r, &n1);
    CHECK(a && n1 > 0 && a[n1 - 1] == '\n');
    CHECK(acct_parse_line(a, n1 - 1, &back, err, sizeof err) == 0);
    char *b = acct_format(&back, &n2);
    CHECK(b && n1 == n2 && memcmp(a, b, n1) == 0);
    free(a);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("acct", MFD_CLOEXEC);
    if (fd < 0)
        return 0;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    lseek(fd, 0, SEEK_SET);
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return 0;
    }
    static char buf[ACCT_LINE_MAX + 2];
    size_t len;
    unsigned lineno = 0;
    int rc;
    while ((rc = acct_next_line(f, buf, sizeof buf, &len, &lineno)) != 0) {
        CHECK(len <= ACCT_LINE_MAX + 1 && buf[len] == '\0');
        if (rc > 0)
            check_line(buf, len);
    }
    fclose(f);
    return 0;
}
