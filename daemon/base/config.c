/* config.c — the option table and the libinih handler for gradd.conf. */
#include "config.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "opts.h"

/* ---- the option table ---------------------------------------------------- */

#define D(field) OPTS_FIELD(gradd_config, field)
#define P(field) OPTS_FIELD(pool_config, field)
#define SZ_MAX 1.8e19

static const opts_def opts[] = {
    {"daemon", "socket", OPTS_STRING, D(socket_path), 0, 0, false, "",
     "control socket path (empty: /run/gradd/gradd.sock as root, else $XDG_RUNTIME_DIR/gradd.sock)", NULL},
    {"daemon", "state_dir", OPTS_STRING, D(state_dir), 0, 0, false, "",
     "queue and job state (empty: $STATE_DIRECTORY under systemd, else /var/lib/gradd as root, else "
     "~/.local/state/gradd)",
     NULL},
    {"daemon", "max_frame", OPTS_SIZE, D(max_frame), 64, 1 << 30, false, "1M",
     "largest protocol frame accepted; bigger ones close the connection", NULL},
    {"daemon", "client_timeout", OPTS_DURATION, D(client_timeout_ms), 1, 86400e3, false, "60s",
     "close a connection that sends no complete request for this long", NULL},
    {"daemon", "max_clients", OPTS_COUNT, D(max_clients), 1, 65536, false, "1024",
     "connections served at once; more are closed on accept (the last eighth, at most 16, only for root "
     "and admin_group)", NULL},
    {"daemon", "socket_group", OPTS_STRING, D(socket_group), 0, 0, false, "gradd",
     "the socket's group: its members may use gradd", NULL},
    {"daemon", "admin_group", OPTS_STRING, D(admin_group), 0, 0, false, "gradd-admin",
     "members may cancel and remove every job and read every log", NULL},
    {"daemon", "max_jobs_per_device", OPTS_COUNT, D(max_jobs_per_device), 1, 64, false, "1",
     "jobs that run at once on one device", NULL},
    {"daemon", "max_queued_per_user", OPTS_COUNT, D(max_queued_per_user), 1, 1e6, false, "100",
     "queued and running jobs one user may have", NULL},
    /* Not 0 by default: a resident daemon keeping every finished job
     * grows without bound (about 30 KB of memory each, and gradctl list
     * with them). */
    {"daemon", "keep_finished", OPTS_DURATION, D(keep_finished_ms), 0, 1e15, false, "30d",
     "forget finished jobs (job file, state, log; outputs stay) this long after they end, as gradctl rm (0: never)",
     NULL},
    {"daemon", "max_job_file", OPTS_SIZE, D(max_job_file), 1024, 64 << 20, false, "1M",
     "largest job file accepted by submit", NULL},
    /* A user's share of the daemon's own memory and disk: a record costs
     * both, finished or not, so the records and the bytes kept (job files
     * and job logs) are bounded per user; the oldest finished records go
     * first when a submit needs room. */
    {"daemon", "max_records_per_user", OPTS_COUNT, D(max_records_per_user), 1, 1e6, false, "500",
     "job records one user may have, finished ones included (the oldest finished are forgotten to make room)", NULL},
    {"daemon", "max_bytes_per_user", OPTS_SIZE, D(max_bytes_per_user), 1 << 20, SZ_MAX, false, "1G",
     "bytes of job files and job logs one user may have in the state dir (the oldest finished are forgotten "
     "to make room)",
     NULL},
    /* The accounting file outlives every job record, so it has a bound of
     * its own; 64K at least so that any record fits. */
    {"daemon", "max_accounting", OPTS_SIZE, D(max_accounting), 64 << 10, SZ_MAX, false, "64M",
     "accounting.jsonl in the state dir (gradctl history): past it, it becomes accounting.jsonl.1, replacing "
     "the one before",
     NULL},
    {"daemon", "max_job_log", OPTS_SIZE, D(max_job_log), 64 << 10, SZ_MAX, false, "16M",
     "a job log's size: past it, its first half stays and the rest keeps the newest lines", NULL},
    {"daemon", "max_job_data", OPTS_SIZE, D(max_job_data), 1 << 20, SZ_MAX, true, "8G",
     "host memory one job's training and validation data may take (unlimited: no bound)", NULL},
    {"daemon", "max_clients_per_user", OPTS_COUNT, D(max_clients_per_user), 1, 65536, false, "64",
     "connections one user may hold at once, watches included (root and admin_group: max_clients)", NULL},
    {"daemon", "max_user_priority", OPTS_COUNT, D(max_user_priority), 0, 1000, false, "100",
     "the highest [job] priority a user outside admin_group may ask for", NULL},
    {"daemon", "sample_timeout", OPTS_DURATION, D(sample_timeout_ms), 100, 86400e3, false, "2m",
     "longest a gradctl sample may generate before it is stopped", NULL},
    {"daemon", "stop_timeout", OPTS_DURATION, D(stop_timeout_ms), 100, 3600e3, false, "2m",
     "on SIGTERM, wait this long for jobs to checkpoint and stop, then exit anyway (below the unit's "
     "TimeoutStopSec)",
     NULL},
    {"daemon", "default_time_limit", OPTS_DURATION, D(default_time_limit_ms), 0, 1e15, false, "0",
     "the [job] time_limit of a job that sets none (0: none)", NULL},
    {"daemon", "max_time_limit", OPTS_DURATION, D(max_time_limit_ms), 0, 1e15, false, "0",
     "the longest [job] time_limit a job may ask for; submit refuses more (0: no maximum)", NULL},
    {"daemon", "on_end_timeout", OPTS_DURATION, D(on_end_timeout_ms), 100, 3600e3, false, "60s",
     "a job's [job] on_end command is killed once it has run this long", NULL},
    {"daemon", "log_level", OPTS_CHOICE, D(log_level), 0, 0, false, "info", "error, warning, info or debug",
     "error|warning|info|debug"},
    {"daemon", "log_target", OPTS_CHOICE, D(log_target), 0, 0, false, "auto",
     "auto (journald when stderr is systemd's journal stream), journal or stderr", "auto|journal|stderr"},

    {"cpu", "capacity", OPTS_SIZE, D(cpu_capacity), 1 << 20, SZ_MAX, false, "4G",
     "memory of each simulated cpu device", NULL},
    {"cpu", "devices", OPTS_COUNT, D(cpu_devices), 0, 16, false, "1", "number of simulated cpu devices", NULL},

    {"cuda", "enabled", OPTS_BOOL, D(cuda_enabled), 0, 1, false, "true", "probe for CUDA devices at start", NULL},
    {"cuda", "module_dir", OPTS_STRING, D(cuda_module_dir), 0, 0, false, "",
     "where gradd-cuda.so lives (empty: beside gradd, then the install directory)", NULL},

    {"pool", "memory_fraction", OPTS_DOUBLE, P(memory_fraction), 0.01, 1, false, "1.0",
     "the pool's cap as a fraction of device memory", NULL},
    {"pool", "max_split_size", OPTS_SIZE, P(max_split_size), 1 << 20, SZ_MAX, true, "unlimited",
     "cached blocks this large or larger are never split", NULL},
    {"pool", "expandable_segments", OPTS_BOOL, P(expandable_segments), 0, 1, false, "false",
     "grow one mapped address range instead of allocating separate segments", NULL},
    {"pool", "gc_threshold", OPTS_DOUBLE, P(gc_threshold), 0, 1, false, "0",
     "trim least recently used cache when reserved exceeds this fraction of the cap (0: off)", NULL},
    {"pool", "low_watermark", OPTS_SIZE, P(low_watermark), 0, SZ_MAX, false, "0",
     "trim when the device's free memory falls below this (0: off)", NULL},
    {"pool", "trim_every_steps", OPTS_COUNT, P(trim_every_steps), 0, 1e12, false, "0",
     "trim the cache every N training steps (0: off)", NULL},
    {"pool", "trim_interval", OPTS_DURATION, P(trim_every_ms), 0, 86400e3, false, "0",
     "trim the cache this often (0: off)", NULL},
    {"pool", "idle_trim", OPTS_DURATION, P(idle_trim_ms), 0, 86400e3, false, "60s",
     "give the whole cache back once no job has run on the device this long (0: off)", NULL},
    {"pool", "timeline_events", OPTS_COUNT, P(timeline_capacity), 0, 1 << 24, false, "65536",
     "events kept in the memory timeline ring buffer (0: off)", NULL},
};
#define NOPTS (sizeof opts / sizeof opts[0])

/* ---- defaults --------------------------------------------------------------- */

void config_defaults(gradd_config *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->source, sizeof c->source, "(defaults)");
    opts_defaults(opts, NOPTS, "daemon", c);
    opts_defaults(opts, NOPTS, "cpu", c);
    opts_defaults(opts, NOPTS, "cuda", c);
    pool_config_default(&c->pool);
    opts_defaults(opts, NOPTS, "pool", &c->pool);
}

uint64_t config_job_file_limit(const gradd_config *c)
{
    uint64_t room = c->max_frame > 2 * CONFIG_SUBMIT_ENVELOPE ? c->max_frame - CONFIG_SUBMIT_ENVELOPE : c->max_frame / 2;
    return c->max_job_file < room ? c->max_job_file : room;
}

void config_print_defaults(FILE *f)
{
    opts_print(opts, NOPTS, f);
}

/* ---- the file ---------------------------------------------------------------- */

/* A device id as users write it: cpuN or cudaN. */
static bool device_id_ok(const char *id)
{
    const char *digits = strncmp(id, "cpu", 3) == 0 ? id + 3 : strncmp(id, "cuda", 4) == 0 ? id + 4 : NULL;
    if (!digits || !*digits || strlen(id) >= 16)
        return false;
    for (const char *q = digits; *q; q++)
        if (*q < '0' || *q > '9')
            return false;
    return true;
}

static config_pool_override *override_for(gradd_config *c, const char *dev, int line)
{
    for (int i = 0; i < c->noverrides; i++)
        if (strcmp(c->overrides[i].device, dev) == 0)
            return &c->overrides[i];
    if (c->noverrides == CONFIG_MAX_OVERRIDES)
        return NULL;
    config_pool_override *o = &c->overrides[c->noverrides++];
    memset(o, 0, sizeof *o);
    snprintf(o->device, sizeof o->device, "%s", dev);
    o->line = line;
    return o;
}

static int on_entry(void *user, const char *section, const char *key, const char *value, int line, char *why,
                    size_t why_len, bool *name_key)
{
    gradd_config *c = user;
    if (strncmp(section, "pool.", 5) == 0) {
        const char *dev = section + 5;
        if (!device_id_ok(dev)) {
            snprintf(why, why_len, "unknown section: per-device pool sections are [pool.cpuN] or [pool.cudaN]");
            *name_key = false;
            return -1;
        }
        if (!key)
            return 0; /* an empty [pool.DEV]: nothing to override */
        const opts_def *o = opts_find(opts, NOPTS, "pool", key);
        if (!o) {
            snprintf(why, why_len, "unknown key");
            return -1;
        }
        config_pool_override *ov = override_for(c, dev, line);
        if (!ov) {
            snprintf(why, why_len, "too many [pool.DEV] sections");
            *name_key = false;
            return -1;
        }
        if (opts_set(o, &ov->pool, value, why, why_len) != 0)
            return -1;
        ov->set_mask |= 1ull << (o - opts);
        return 0;
    }
    /* Refused as the file is read, with its line, not when the socket is made. */
    if (key && strcmp(section, "daemon") == 0 && strcmp(key, "socket") == 0 && strlen(value) > CONFIG_SOCKET_PATH_MAX) {
        snprintf(why, why_len, "%zu bytes is too long for a socket path (at most %d)", strlen(value),
                 CONFIG_SOCKET_PATH_MAX);
        return -1;
    }
    opts_simple s = {opts, NOPTS, strcmp(section, "pool") == 0 ? (void *)&c->pool : (void *)c};
    return opts_simple_entry(&s, section, key, value, line, why, why_len, name_key);
}

/* Per-device sections hold only the keys they set; the rest come from
 * [pool], which may appear anywhere in the file, so merge after parsing. */
static void merge_overrides(gradd_config *c)
{
    for (int i = 0; i < c->noverrides; i++) {
        config_pool_override *ov = &c->overrides[i];
        pool_config merged = c->pool;
        for (size_t k = 0; k < NOPTS; k++) {
            if (!(ov->set_mask & (1ull << k)))
                continue;
            memcpy((char *)&merged + opts[k].offset, (char *)&ov->pool + opts[k].offset, opts[k].size);
        }
        ov->pool = merged;
    }
}

int config_load(const char *path, gradd_config *out, char *err, size_t err_len)
{
    gradd_config *tmp = malloc(sizeof *tmp);
    if (!tmp) {
        snprintf(err, err_len, "%s: out of memory", path);
        return -1;
    }
    config_defaults(tmp);
    snprintf(tmp->source, sizeof tmp->source, "%s", path);
    if (opts_parse_file(path, on_entry, tmp, err, err_len) != 0) {
        free(tmp);
        return -1;
    }
    merge_overrides(tmp);
    /* A default no job could be submitted with would refuse every job
     * that sets no time_limit. */
    if (tmp->max_time_limit_ms && tmp->default_time_limit_ms > tmp->max_time_limit_ms) {
        snprintf(err, err_len, "%s: [daemon] default_time_limit: is above [daemon] max_time_limit", path);
        free(tmp);
        return -1;
    }
    *out = *tmp;
    free(tmp);
    return 0;
}

void config_pool_for(const gradd_config *c, const char *device_id, pool_config *out)
{
    *out = c->pool;
    for (int i = 0; i < c->noverrides; i++)
        if (strcmp(c->overrides[i].device, device_id) == 0)
            *out = c->overrides[i].pool;
}
