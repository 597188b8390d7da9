/* dist.h — the ranks of one job, one per device: who this rank is, and
 * the collectives that keep the ranks' training in step.  Two kinds of
 * world:
 *
 *   processes  `gradd run` started by mpirun or srun.  The launcher says
 *              how many ranks there are (OpenMPI's OMPI_COMM_WORLD_SIZE,
 *              PMI_SIZE or PMIX_SIZE of other MPIs' launchers, Slurm's
 *              SLURM_NTASKS); a process started alone is a world of one and
 *              needs none of this.  Collectives run over MPI.
 *   threads    a dist_group: ranks as threads of one process, for a job
 *              over several devices of one server.
 *
 * Collectives work on host memory, what CPU devices hold, until
 * dist_use_cuda: then the float buffers of dist_allreduce_f32,
 * dist_allreduce_start and dist_allgather_f32 are CUDA device memory, and
 * those run over NCCL.  The small agreements (dist_allreduce_f64) and
 * dist_gather_f32 stay on the host, over MPI or between the threads.
 *
 * Every collective has a deadline (dist_open's timeout): a rank that died or
 * hangs makes the others' next collective fail with a message naming the
 * collective and the wait, never wait forever.  The job then fails on every
 * rank (dist_abort tears the world down) and resumes from its checkpoint
 * when started again, at any number of ranks.
 *
 * Errors: 0, or -1 with a message in err.  Not thread-safe: one thread of a
 * process calls these.
 */
#ifndef GRADD_DIST_H
#define GRADD_DIST_H

#include <stdbool.h>
#include <stddef.h>

typedef struct dist dist;
typedef struct dist_group dist_group;

/* The most ranks of a thread group. */
#define DIST_GROUP_MAX 16

typedef enum { DIST_SUM, DIST_MIN, DIST_MAX } dist_op;

/* The number of ranks the launcher started, from the environment; 1 when
 * none did. */
int dist_world_from_env(void);
/* Join the world (MPI_Init).  timeout_s bounds every collective.  -1 when
 * this gradd was built without MPI, or MPI does not start. */
int dist_open(dist **out, double timeout_s, char *err, size_t err_len);
int dist_rank(const dist *d);
int dist_size(const dist *d);
/* The ranks on this machine, this one among them: they share its cores. */
int dist_local_size(const dist *d);
/* Which of this machine's n devices of a kind this rank takes when the job
 * names none: its place among the machine's ranks, modulo n (0 alone, or
 * with n = 0). */
int dist_local_device(const dist *d, int n);
/* "rank R of N on HOST", for messages. */
const char *dist_name(const dist *d);
/* In place, on every rank alike: the element-wise sum (or min, max) over
 * the ranks.  `what` names the collective in a timeout's message. */
int dist_allreduce_f32(dist *d, float *buf, size_t n, const char *what, char *err, size_t err_len);
int dist_allreduce_f64(dist *d, double *buf, size_t n, dist_op op, const char *what, char *err, size_t err_len);
/* Started now, finished by dist_allreduce_finish: a sum like
 * dist_allreduce_f32's, of a bucket of gradients that the backward is done
 * with, while it goes on with the layers below.  Every rank starts the
 * same buckets in the same order.  Over NCCL it runs on a stream of its
 * own; over MPI, dist_progress moves it on (MPI progresses inside its
 * calls); a thread group sums at the finish, as one. */
int dist_allreduce_start(dist *d, float *buf, size_t n, const char *what, char *err, size_t err_len);
void dist_progress(dist *d);
/* Until every started sum is complete (for the device's next work too). */
int dist_allreduce_finish(dist *d, const char *what, char *err, size_t err_len);
/* This rank trains on CUDA device `device`, whose kernels queue their work
 * on `stream` (a cudaStream_t).  `collectives` is the device's (dev.h): the
 * NCCL of its CUDA module, NULL when that was built without.  A collective:
 * the ranks join one NCCL communicator. */
int dist_use_cuda(dist *d, const void *collectives, int device, void *stream, char *err, size_t err_len);
/* The communicator goes, before the device's memory and stream do;
 * `failed` aborts it instead of waiting for the others. */
void dist_release_cuda(dist *d, bool failed);
/* Rank `rank`'s part of n elements split among `size` ranks: contiguous,
 * in rank order, the first n mod size ranks one more. */
void dist_shard(size_t n, int size, int rank, size_t *first, size_t *count);
/* In place over n floats: every rank's dist_shard part to every rank. */
int dist_allgather_f32(dist *d, float *buf, size_t n, const char *what, char *err, size_t err_len);
/* Every rank's dist_shard part of n floats (`part`, this rank's) into
 * `full` (n floats) on rank 0; full is not read elsewhere (may be NULL). */
int dist_gather_f32(dist *d, const float *part, float *full, size_t n, const char *what, char *err, size_t err_len);
/* A world of n ranks as threads of this process (1 to DIST_GROUP_MAX),
 * every collective bounded by timeout_s; NULL with err. */
dist_group *dist_group_new(int n, double timeout_s, char *err, size_t err_len);
/* Rank k's handle, owned by the group: the thread that runs rank k uses it. */
dist *dist_group_rank(dist_group *g, int k);
/* After every rank's thread has ended. */
void dist_group_free(dist_group *g);
/* A thread group's rank: call beat(user) about once a second while it
 * waits for the others, a sign of life for a watchdog that counts a
 * waiting rank's thread as a working one. */
void dist_set_beat(dist *d, void (*beat)(void *user), void *user);
/* This rank gives up (its run failed): the other ranks' collectives fail
 * now instead of at their timeout.  Nothing for ranks as processes, whose
 * launcher ends them all (dist_abort). */
void dist_fail(dist *d, const char *why);
/* End every rank of the world now, with exit status code: the process
 * exits (a thread group's every rank with it). */
void dist_abort(dist *d, int code);
/* Leave the world (MPI_Finalize) and free d; NULL or a group's rank: nothing. */
void dist_close(dist *d);

#endif
