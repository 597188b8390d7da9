/* config.h — gradd.conf: the daemon's settings, parsed with libinih.
 *
 * Every option is one row of a table in config.c (section, key, type,
 * default, bounds), so defaults live in one place and every error can name
 * file:line, section and key.  Sections:
 *   [daemon]      socket, state_dir, max_frame, client_timeout, max_clients,
 *                 socket_group, admin_group, log_level, and the per-user
 *                 limits (records, bytes, clients, priority, job log, data)
 *   [cpu]         capacity, devices
 *   [cuda]        enabled, module_dir
 *   [pool]        defaults for every device's memory pool
 *   [pool.DEV]    overrides for one device (e.g. [pool.cpu0], [pool.cuda1])
 */
#ifndef GRADD_CONFIG_H
#define GRADD_CONFIG_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "pool/pool.h"

#define CONFIG_MAX_OVERRIDES 16

/* The longest socket path: sun_path's 108 bytes less the NUL and the
 * suffix of the temporary name the socket is made under before it is
 * linked into place (".PID.new", PID up to 7 digits). */
#define CONFIG_SOCKET_PATH_MAX 95

typedef struct {
    char device[16];     /* "cpu0", "cuda1" */
    pool_config pool;    /* defaults with this section's keys applied */
    uint64_t set_mask;   /* which pool options the section set (bit = table row) */
    int line;            /* where the section started, for unknown-device errors */
} config_pool_override;

typedef enum { CONFIG_LOG_AUTO = 0, CONFIG_LOG_JOURNAL = 1, CONFIG_LOG_STDERR = 2 } config_log_target;
/* In the order of the choice's spelling in config.c. */
typedef enum { CONFIG_LOG_ERROR = 0, CONFIG_LOG_WARNING, CONFIG_LOG_INFO, CONFIG_LOG_DEBUG } config_log_level;

typedef struct gradd_config {
    char source[PATH_MAX];   /* the file these came from, or "(defaults)" */

    /* [daemon] */
    char socket_path[PATH_MAX]; /* empty: the default for this user */
    char state_dir[PATH_MAX];   /* empty: the default for this user */
    uint64_t max_frame;
    uint64_t client_timeout_ms;
    uint64_t keep_finished_ms; /* 0: keep finished jobs for good */
    uint64_t max_clients;
    char socket_group[64]; /* who may connect: the socket is 0660 to it */
    char admin_group[64];  /* who may act on any job */
    int log_level;       /* config_log_level */
    int log_target;      /* config_log_target: auto | journal | stderr */
    uint64_t max_jobs_per_device;
    uint64_t max_queued_per_user;
    uint64_t max_job_file;
    uint64_t max_records_per_user;
    uint64_t max_bytes_per_user;
    uint64_t max_job_log;
    uint64_t max_accounting; /* the accounting file's bound, before it rotates */
    uint64_t max_job_data; /* UINT64_MAX: unlimited */
    uint64_t max_clients_per_user;
    uint64_t max_user_priority;
    uint64_t sample_timeout_ms;
    uint64_t stop_timeout_ms;
    uint64_t default_time_limit_ms; /* [job] time_limit = 0 gets this (0: none) */
    uint64_t max_time_limit_ms;     /* 0: no maximum */
    uint64_t on_end_timeout_ms;     /* a [job] on_end command's bound */

    /* [cpu] */
    uint64_t cpu_capacity;
    uint64_t cpu_devices;

    /* [cuda] */
    bool cuda_enabled;
    char cuda_module_dir[PATH_MAX]; /* empty: beside the binary, then the install dir */

    /* [pool] and [pool.DEV] */
    pool_config pool;
    config_pool_override overrides[CONFIG_MAX_OVERRIDES];
    int noverrides;
} gradd_config;

/* Built-in defaults (what an empty file gives). */
void config_defaults(gradd_config *c);

/* Parse `path` over the defaults.  On any error nothing is written to *out
 * and err holds "FILE:LINE: [section] key: what is wrong". */
int config_load(const char *path, gradd_config *out, char *err, size_t err_len);

/* The pool settings for one device: [pool] with [pool.DEV] applied. */
void config_pool_for(const gradd_config *c, const char *device_id, pool_config *out);

/* Print every option with its default, as a commented gradd.conf. */
void config_print_defaults(FILE *f);

/* A submit request carries the job file with its path and name: this much
 * room is left for them in a frame. */
#define CONFIG_SUBMIT_ENVELOPE 8192
/* The largest job file a submit can bring: max_job_file, but no more than
 * fits in a frame of max_frame with its envelope, so that every file under
 * the limit can be sent and one over it is told so by name. */
uint64_t config_job_file_limit(const gradd_config *c);

#endif
