/* acct.h — job accounting, like sacct's: one JSON line per job end in
 * STATE_DIR/accounting.jsonl, kept when the job itself is forgotten (gradctl
 * rm, keep_finished) and across restarts.
 *
 * The file is the daemon's (0640, written with its identity, never the
 * owner's); each line is one write(2) on an O_APPEND descriptor, so lines
 * from several job threads never interleave.  Past [daemon] max_accounting
 * it is renamed to accounting.jsonl.1 (replacing the one before) and a new
 * one starts: at most twice max_accounting on disk.  A line is written
 * before the state file that records the end, so a crash between the two
 * runs the job again and accounts it twice rather than not at all.
 *
 * Reading treats the files as untrusted input: a line that is not exactly
 * a record is skipped, and its file and line are said.
 */
#ifndef GRADD_ACCT_H
#define GRADD_ACCT_H

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "queue.h"

#define ACCT_FILE "accounting.jsonl"
/* The longest line read back: a record is at most a few KiB (the reason is
 * 1 KiB, escaped at most 6 bytes a byte), so anything longer is damage. */
#define ACCT_LINE_MAX ((size_t)16 << 10)

typedef struct acct_log {
    pthread_mutex_t lock; /* orders writes, rotation and acct_open_read */
    char path[PATH_MAX];  /* STATE_DIR/accounting.jsonl */
    uint64_t max_bytes;   /* [daemon] max_accounting; 0: nothing is written */
    bool warned;          /* a failed write is logged once until one succeeds */
} acct_log;

/* One accounting record. */
typedef struct acct_record {
    uint32_t id, uid, resumes, devices;
    char name[64], user[64], type[16], state[16], device[16], reason[1024];
    double submitted_at, started_at, finished_at, elapsed_s, device_hours;
    uint64_t steps_done, steps, oom_recoveries, mem_peak;
    uint64_t tag_peak[POOL_TAG_COUNT];
} acct_record;

void acct_init(acct_log *a, const char *state_dir, uint64_t max_bytes);
void acct_destroy(acct_log *a);

/* The record of finished job j. */
void acct_from_job(const job *j, acct_record *r);
/* r as one line, newline included: malloc'd, its length in *len; NULL when
 * out of memory. */
char *acct_format(const acct_record *r, size_t *len);
/* Append j's record (rotating first when it would pass max_bytes).  On
 * the daemon's identity.  0, or -1 with errno (logged once). */
int acct_append(acct_log *a, const job *j);

/* Parse one line, buf[0..len) without its newline.  0, or -1 with err
 * saying what is wrong (without the file and line). */
int acct_parse_line(const char *buf, size_t len, acct_record *out, char *err, size_t err_len);

/* The files to read, oldest first: accounting.jsonl.1 then
 * accounting.jsonl, each NULL where missing, opened together under the
 * lock so that a rotation cannot make a record appear twice or not at
 * all.  paths[i] gets each one's path. */
void acct_open_read(acct_log *a, FILE *f[2], char paths[2][PATH_MAX + 8]);

/* Read the next line of f into buf (cap bytes, at least ACCT_LINE_MAX + 2; terminated),
 * without its newline.  1 with *len set; 0 at the end, where a last line
 * without its newline (one being written as it is read) counts as not
 * there yet; -1 for a line longer than ACCT_LINE_MAX (skipped up to the
 * next newline).  *lineno counts lines. */
int acct_next_line(FILE *f, char *buf, size_t cap, size_t *len, unsigned *lineno);

#endif
