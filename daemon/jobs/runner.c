/* runner.c — the table of job kinds, first match wins. */
#include "runner.h"

#include <stddef.h>

static const runner *const runners[] = {
    &runner_program,
    &runner_engine,
};

const runner *runner_for(const job_config *cfg)
{
    for (size_t i = 0; i < sizeof runners / sizeof runners[0]; i++)
        if (runners[i]->takes(cfg))
            return runners[i];
    return NULL;
}

void runner_note(const runner_env *env, const char *fmt, ...)
{
    if (!env->note)
        return;
    va_list ap;
    va_start(ap, fmt);
    env->note(env->note_user, fmt, ap);
    va_end(ap);
}
