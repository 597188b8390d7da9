/* commands.c — the one list of gradctl commands.  A new command is a new
 * cmd_NAME.c defining `const ctl_cmd cmd_NAME` plus one line here. */
#include "ctl.h"

extern const ctl_cmd cmd_status, cmd_stats, cmd_trim, cmd_timeline, cmd_test_pressure,
    cmd_test_alloc, cmd_test_hang, cmd_sample, cmd_submit, cmd_list, cmd_cancel, cmd_rm, cmd_watch, cmd_logs, cmd_metrics,
    cmd_top, cmd_history;
extern const ctl_cmd cmd_hold, cmd_release, cmd_requeue;

const ctl_cmd *const ctl_commands[] = {
    &cmd_submit,
    &cmd_list,
    &cmd_status,
    &cmd_top,
    &cmd_watch,
    &cmd_cancel,
    &cmd_rm,
    &cmd_history,
    &cmd_hold,
    &cmd_release,
    &cmd_requeue,
    &cmd_logs,
    &cmd_sample,
    &cmd_metrics,
    &cmd_stats,
    &cmd_trim,
    &cmd_timeline,
    &cmd_test_pressure,
    &cmd_test_alloc,
    &cmd_test_hang,
    NULL,
};
