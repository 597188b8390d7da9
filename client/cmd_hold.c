/* cmd_hold.c — gradctl hold, release and requeue: when a job of one's own
 * runs.  A held job stays queued, shown as held, until it is released;
 * requeue puts a finished job back in the queue, or stops a running one
 * (after a final checkpoint, which it resumes from) and queues it again. */
#include <stdio.h>
#include <string.h>

#include "ctl.h"
#include "jobfmt.h"

/* Send the request of `body` for the job named in argv and say what became
 * of it, as `done` ("held") or, with --json, as the job's object. */
static int job_action(ctl *c, int argc, char **argv, Gradd__Request__BodyCase body, const char *done)
{
    Gradd__Response *resp;
    int rc = jobfmt_id_call(c, argc, argv, body, NULL, &resp);
    if (rc != CTL_OK)
        return rc;
    const Gradd__JobInfo *j = body == GRADD__REQUEST__BODY_HOLD      ? resp->hold->job
                              : body == GRADD__REQUEST__BODY_RELEASE ? resp->release->job
                                                                     : resp->requeue->job;
    if (!j)
        return ctl_unexpected(c, resp);
    if (c->json)
        rc = jout_print(jobfmt_json(j));
    else if (strcmp(j->state, "running") == 0)
        printf("job %u stopping, to be queued again (a final checkpoint is being written)\n", j->id);
    else
        printf("job %u %s\n", j->id, done);
    ctl_free(resp);
    return rc;
}

static int run_hold(ctl *c, int argc, char **argv)
{
    return job_action(c, argc, argv, GRADD__REQUEST__BODY_HOLD, "held");
}

static int run_release(ctl *c, int argc, char **argv)
{
    return job_action(c, argc, argv, GRADD__REQUEST__BODY_RELEASE, "released");
}

static int run_requeue(ctl *c, int argc, char **argv)
{
    return job_action(c, argc, argv, GRADD__REQUEST__BODY_REQUEUE, "requeued");
}

const ctl_cmd cmd_hold = {
    .name = "hold",
    .args = "ID",
    .summary = "keep a queued job from starting until it is released",
    .run = run_hold,
};

const ctl_cmd cmd_release = {
    .name = "release",
    .args = "ID",
    .summary = "let a held job start",
    .run = run_release,
};

const ctl_cmd cmd_requeue = {
    .name = "requeue",
    .args = "ID",
    .summary = "queue a finished job again, or stop a running one and queue it",
    .run = run_requeue,
};
