/* dist_internal.h — what dist.c and its two backends share: ranks as
 * processes over MPI (dist_mpi.c), and ranks as threads of one process
 * (dist_threads.c). */
#ifndef GRADD_DIST_INTERNAL_H
#define GRADD_DIST_INTERNAL_H

#include "dist.h"

/* ---- NCCL, in the gradd-cuda module (dist_nccl.c) ---------------------------------------
 * The core never links CUDA or NCCL: the module exports one table of this
 * type under DIST_NCCL_ENTRY, dev_cuda_probe hands it to each CUDA device
 * (dev.h's `collectives`), and dist_use_cuda takes it from there. */
#define DIST_NCCL_ENTRY "gradd_dist_nccl_v1"
#define DIST_NCCL_ABI 1
#define DIST_NCCL_ID_BYTES 128

typedef struct dist_nccl_comm dist_nccl_comm;

/* How a rank waits for NCCL: at most timeout_s, asking given_up (may be
 * NULL) whether another rank already failed, and beating while it waits. */
typedef struct {
    double timeout_s;
    const char *name; /* the rank, for messages */
    int (*given_up)(void *user, char *why, size_t why_len);
    void *user;
    void (*beat)(void *user);
    void *beat_user;
} dist_nccl_wait;

typedef struct {
    int abi; /* DIST_NCCL_ABI */
    /* Rank 0 makes the id; every rank opens with it. */
    int (*unique_id)(unsigned char id[DIST_NCCL_ID_BYTES], char *err, size_t err_len);
    /* Rank `rank` of `size` on CUDA device `device`, whose work runs on
     * `stream` (the kernel context's): NULL with err. */
    dist_nccl_comm *(*open)(int device, int rank, int size, const unsigned char id[DIST_NCCL_ID_BYTES], void *stream,
                            const dist_nccl_wait *w, char *err, size_t err_len);
    /* Queue an in-place sum of n floats of device memory over the ranks
     * after the stream's work so far, on the communicator's own stream:
     * the stream goes on with its next work meanwhile.  Queueing may wait
     * for the other ranks (NCCL connects lazily), as w says. */
    int (*allreduce_start)(dist_nccl_comm *c, float *buf, size_t n, const dist_nccl_wait *w, char *err,
                           size_t err_len);
    /* Queue, after the stream's work so far, rank k's part [first[k],
     * first[k] + count[k]) of buf from rank k to every rank. */
    int (*bcast_parts_start)(dist_nccl_comm *c, float *buf, const size_t *first, const size_t *count,
                             const dist_nccl_wait *w, char *err, size_t err_len);
    /* Wait for everything started: the stream's later work waits for it
     * too.  On a failure or timeout the communicator is aborted. */
    int (*finish)(dist_nccl_comm *c, const dist_nccl_wait *w, const char *what, char *err, size_t err_len);
    /* Destroy; `abort` when a rank failed (a plain destroy would wait for
     * work that never completes). */
    void (*close)(dist_nccl_comm *c, bool abort);
} dist_nccl_ops;

struct dist {
    int rank, size, local_size, local_rank;
    double timeout_s;
    char name[128];
    dist_group *group; /* a rank of a thread group; NULL: of the MPI world */
    void (*beat)(void *user); /* dist_set_beat's */
    void *beat_user;
    /* dist_use_cuda's: the f32 collectives then run over NCCL. */
    const dist_nccl_ops *nccl;
    dist_nccl_comm *comm;
    /* dist_allreduce_start's, not yet finished (NCCL's are in the
     * communicator): their buffers, and MPI's requests. */
    int npending, pending_cap;
    float **pending_buf;
    size_t *pending_n;
    void *pending_req; /* MPI_Request[pending_cap] */
};

/* Room for one more pending start: 0, or -1 with err. */
int dist_pending_grow(dist *d, size_t req_bytes, char *err, size_t err_len);

/* The message of a collective that timed out. */
void dist_timed_out(const dist *d, const char *what, char *err, size_t err_len);

/* MPI: 0, or -1 with err.  Without MPI these fail saying so. */
int dist_mpi_open(dist *d, char *err, size_t err_len);
int dist_mpi_allreduce(dist *d, void *buf, size_t n, bool f64, dist_op op, const char *what, char *err,
                       size_t err_len);
int dist_mpi_allgather_f32(dist *d, float *buf, size_t n, const char *what, char *err, size_t err_len);
int dist_mpi_gather_f32(dist *d, const float *part, float *full, size_t n, const char *what, char *err,
                        size_t err_len);
int dist_mpi_bcast(dist *d, void *buf, size_t bytes, const char *what, char *err, size_t err_len);
/* Start an in-place sum of n floats; the request goes into d->pending. */
int dist_mpi_allreduce_start(dist *d, float *buf, size_t n, const char *what, char *err, size_t err_len);
/* Let MPI move the started ones on (it progresses inside its calls). */
void dist_mpi_progress(dist *d);
int dist_mpi_finish(dist *d, const char *what, char *err, size_t err_len);
void dist_mpi_abort(int code);
void dist_mpi_close(void);

/* Threads of one process. */
int dist_thr_allreduce(dist *d, void *buf, size_t n, bool f64, dist_op op, const char *what, char *err,
                       size_t err_len);
int dist_thr_allgather_f32(dist *d, float *buf, size_t n, const char *what, char *err, size_t err_len);
int dist_thr_gather_f32(dist *d, const float *part, float *full, size_t n, const char *what, char *err,
                        size_t err_len);
int dist_thr_bcast(dist *d, void *buf, size_t bytes, const char *what, char *err, size_t err_len);
void dist_thr_fail(dist *d, const char *why);
/* 1 with why when a rank of the group gave up or timed out. */
int dist_thr_given_up(dist *d, char *why, size_t why_len);

#endif
