/* spawn.h — starting a process as a job's owner, for a program job
 * (runner_program.c) and a job's on_end command (jobend.c).
 *
 * The child gets the owner's groups, gid and uid and no capabilities (the
 * daemon may be root, or a service user with CAP_SETUID and CAP_SETGID in
 * its ambient set, which setresuid alone would pass on), a session and
 * process group of its own, the given stdin and stdout/stderr, a working
 * directory and an environment built here beforehand.  After the fork, in
 * a multithreaded daemon, the child may only make async-signal-safe calls
 * (another thread may hold malloc's lock): ids and capabilities change by
 * raw system calls, and a failure before execve comes back through a
 * close-on-exec pipe as a stage and an errno.
 */
#ifndef GRADD_SPAWN_H
#define GRADD_SPAWN_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>
#include <sys/wait.h>

/* ---- a clean environment ---- */

typedef struct spawn_env {
    char **envp; /* NULL-terminated; each malloc'd "NAME=VALUE" */
    size_t n, cap;
} spawn_env;

/* Room for `cap` variables.  0, or -1 (out of memory). */
int spawn_env_init(spawn_env *e, size_t cap);
void spawn_env_free(spawn_env *e);
/* Set NAME=VALUE, replacing an earlier NAME.  0, or -1 (no room, or out
 * of memory). */
int spawn_env_set(spawn_env *e, const char *name_value);
int spawn_env_setf(spawn_env *e, const char *name, const char *value);
/* What a process needs to find its way as uid: PATH (the clean one,
 * access.h's ACCESS_DEFAULT_PATH), HOME, USER, LOGNAME and LANG.  0, or -1. */
int spawn_env_base(spawn_env *e, uid_t uid);

/* ---- the process ---- */

typedef struct spawn_req {
    const char *exe;   /* the file to execute, found beforehand */
    char **argv;
    char **envp;
    bool switch_ids;   /* the owner is not the daemon's own user */
    uid_t uid;
    gid_t gid;
    const gid_t *groups; /* the owner's (access_groups), when switch_ids */
    int ngroups;
    const char *workdir;
    int in_fd, out_fd; /* become 0, and 1 and 2 */
    int fd3, fd4;      /* become 3 and 4 (both above 4), or -1: none */
} spawn_req;

/* Fork and execute it.  Its pid (also its process group's id, once this
 * returns), or -1 with err saying which step failed and why. */
pid_t spawn_start(const spawn_req *r, char *err, size_t err_len);

/* Wait up to poll_ms for fd (-1: none) to be readable, then look whether
 * pid has exited: seen, not reaped, so that its pid, and its group's id,
 * is given to no other process before spawn_reap.  SPAWN_READABLE and
 * SPAWN_EXITED (with *si) or'd together. */
enum { SPAWN_READABLE = 1, SPAWN_EXITED = 2 };
int spawn_wait(pid_t pid, int fd, int poll_ms, siginfo_t *si);
/* SIGKILL what is left of its process group (uid owner's), and reap it. */
void spawn_reap(pid_t pid, uid_t owner);

/* "exited with status N" or "killed by signal SIGX" from waitid's answer. */
void spawn_describe_exit(const siginfo_t *si, char *buf, size_t len);

#endif
