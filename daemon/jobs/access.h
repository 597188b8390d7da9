/* access.h — acting on files with the job owner's permissions.
 *
 * gradd may run as root or as a service user; either way it must not read a
 * data file or write an output directory for a user who could not do so
 * themselves.  Linux keeps the filesystem identity (fsuid, fsgid,
 * supplementary groups) per thread, so the thread that runs a job takes its
 * owner's identity for the whole run: every open, mkdir and rename of the
 * trainer is checked as the owner, and what it creates belongs to them —
 * also when the job resumes after a daemon restart.  The same switch, done
 * briefly on the event loop's thread, checks a job's paths at submit.
 *
 * Needs CAP_SETUID and CAP_SETGID (root has them) unless the owner is the
 * daemon's own user, in which case nothing changes.
 *
 * The umask is the owner's too, but it belongs to the filesystem context
 * (cwd, root, umask) that threads share: a thread that creates a job's
 * files first takes a context of its own (access_own_fs), so that setting
 * the job's umask there leaves the daemon's own files private.
 */
#ifndef GRADD_ACCESS_H
#define GRADD_ACCESS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "jobcfg.h"

typedef struct {
    bool switched;
    uid_t fsuid;
    gid_t fsgid;
    int ngroups;
    gid_t *groups; /* the thread's own, malloc'd: as many as it has */
} access_saved;

/* Take uid/gid (and every one of uid's supplementary groups, up to the
 * kernel's NGROUPS_MAX) as this thread's filesystem identity.  0, or -1
 * with err (e.g. the daemon lacks the capability). */
int access_become(uid_t uid, gid_t gid, access_saved *saved, char *err, size_t err_len);
/* Back to the identity saved by access_become, and free what it kept. */
void access_restore(access_saved *saved);

/* Give the calling thread its own filesystem context (unshare CLONE_FS),
 * so that its umask() changes no other thread's.  Once per thread.  0, or
 * -1 with err. */
int access_own_fs(char *err, size_t err_len);

/* As the owner, with umask `mask`: every data file of the job is readable,
 * and the output directory exists (created if needed) and is writable; for
 * a program job, its workdir may be entered and its command executed.
 * Done on a short-lived thread of its own, so the caller's umask stays.
 * 0, or -1 with a message naming the file, line, key and path
 * (jobcfg_where). */
int access_check_job(uid_t uid, gid_t gid, mode_t mask, const job_config *j, char *err, size_t err_len);

/* uid's supplementary groups with primary group gid (just gid for a uid
 * without a passwd entry), malloc'd into *out.  0, or -1 with err. */
int access_groups(uid_t uid, gid_t gid, gid_t **out, int *n, char *err, size_t err_len);

/* The PATH a program job's command is looked up on, and that it sees:
 * its [program] env's PATH, else this. */
#define ACCESS_DEFAULT_PATH "/usr/local/bin:/usr/bin:/bin"
void access_program_path(const job_config *j, char *out, size_t out_len);
/* Where argv0 (the command's first word) runs from, as execvp would find
 * it on that PATH, relative names against the job's workdir: an
 * executable regular file for the current filesystem identity.  0 with
 * the path in out, or -1 with err naming the file, line and the command. */
int access_find_command(const job_config *j, const char *argv0, char *out, size_t out_len, char *err,
                        size_t err_len);
/* The same for any command: looked up on path_var (a PATH), relative
 * names against workdir; `where` ("FILE:LINE: [section] key") starts err. */
int access_find_executable(const char *where, const char *path_var, const char *workdir, const char *argv0,
                           char *out, size_t out_len, char *err, size_t err_len);

/* Is uid root or a member of `group` (by name)? */
bool access_is_admin(uid_t uid, gid_t gid, const char *group);

#endif
