/* jobfmt.h — how gradctl shows a job (gradd.JobInfo): one table row, the
 * detail view, the progress line and the JSON object, in one place so that
 * list, status, watch and cancel always agree. */
#ifndef GRADCTL_JOBFMT_H
#define GRADCTL_JOBFMT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ctl.h"
#include "jout.h"
#include "table.h"

/* The five states a job can be in, NULL-terminated. */
extern const char *const jobfmt_states[];
bool jobfmt_state_valid(const char *state);
/* completed, failed or cancelled: nothing more will happen to the job. */
bool jobfmt_state_final(const char *state);

/* ---- arguments ------------------------------------------------------------ */

/* Parse a job id (a decimal number from 1 to 2^32-1).  0, or -1. */
int jobfmt_parse_id(const char *text, uint32_t *id);
/* cancel, rm, logs, watch and status ID: the one argument is a job id
 * (options and more arguments are usage errors), and the request (the
 * message of field `body`) is that id alone.  Parse it, send it and read the
 * first reply, as ctl_call does, its messages naming the command.  *id
 * (where not NULL) gets the id. */
/* After a command's options (getopt's optind), exactly one job id. */
int jobfmt_id_arg(ctl *c, int argc, char **argv, uint32_t *id);
int jobfmt_id_call(ctl *c, int argc, char **argv, Gradd__Request__BodyCase body, uint32_t *id, Gradd__Response **out);

/* ---- the list -------------------------------------------------------------- */

/* Every job a list request returns, gathered from its frames (a long list
 * comes in several, gradd.ListResponse.more).  jobs point into frames. */
typedef struct {
    Gradd__Response **frames;
    size_t nframes;
    const Gradd__JobInfo **jobs;
    size_t n;
} jobfmt_list;

/* List the jobs of `user` and `state` (NULL or "": all).  CTL_OK, or the
 * error's exit code (said on stderr). */
int jobfmt_list_fetch(ctl *c, const char *user, const char *state, jobfmt_list *out);
void jobfmt_list_free(jobfmt_list *l);

/* ---- pieces --------------------------------------------------------------- */

/* "2.134", or "-" before the first step or when not a number. */
const char *jobfmt_loss(double loss, char *buf, size_t len);
/* "41.2k tok/s", "812 samples/s", or "-" when nothing is measured. */
const char *jobfmt_speed(const Gradd__JobInfo *j, char *buf, size_t len);
/* Time left at the pace so far: "1m03s", or "-" when unknown. */
const char *jobfmt_eta(const Gradd__JobInfo *j, char *buf, size_t len);
/* "4×4"; "auto×-" while an automatic micro-batch is not yet chosen. */
const char *jobfmt_batch(const Gradd__JobInfo *j, char *buf, size_t len);

/* A process on a device as status and top name it: its command, and the
 * jobs it runs, "gradd (jobs 3, 5)"; not yet made safe. */
const char *jobfmt_process(const Gradd__GpuProcess *p, char *buf, size_t len);

/* ---- views ---------------------------------------------------------------- */

/* The columns of `gradctl list`, for table_init; JOBFMT_COLS of them. */
#define JOBFMT_COLS 14
extern const char *const jobfmt_head[JOBFMT_COLS];
/* One row of that table; `now` in unix seconds gives the AGE. */
void jobfmt_row(table *t, const Gradd__JobInfo *j, double now);

/* The full detail view of `gradctl status ID`. */
void jobfmt_detail(FILE *f, const Gradd__JobInfo *j, double now);

/* Whether j is a program job ([job] type = program): its own steps, if it
 * reports them, and no total. */
bool jobfmt_is_program(const Gradd__JobInfo *j);

/* One line, no newline: "step 120/500 loss 2.134 val 2.301 42.1k tok/s
 * eta 1m03s mem 1.40G"; for a queued job "queued for DEVICE"; for a
 * program job "running 1m02s mem 1.40G", with its reported step, loss and
 * batch when it reports them. */
void jobfmt_progress(char *buf, size_t len, const Gradd__JobInfo *j);

/* How the job ended, no newline: "job 7 completed: 500 steps in 12m03s,
 * loss 1.234, val 1.301" or "job 7 failed: REASON". */
void jobfmt_final(char *buf, size_t len, const Gradd__JobInfo *j);

/* The job as one JSON object (the caller places or prints it).  Doubles
 * that are not numbers, losses before the first step and times that have
 * not happened are null. */
json_t *jobfmt_json(const Gradd__JobInfo *j);
/* Memory by tag, {"TAG":{"current":N,"peak":N},...}, added to obj: a job's
 * and a pool's (stats) read the same. */
void jobfmt_tags_json(json_t *obj, Gradd__TagUsage *const *tags, size_t n);

/* What submit and rm say of the job they acted on: "job 7 queued (NAME)",
 * or with --json {"id":7,"name":NAME}.  CTL_OK, or jout_print's code. */
int jobfmt_done(const ctl *c, uint32_t id, const char *name, const char *done);

/* The current time in unix seconds. */
double jobfmt_now(void);

#endif
