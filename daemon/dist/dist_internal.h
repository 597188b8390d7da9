/* dist_internal.h — what dist.c and its two backends share: ranks as
 * processes over MPI (dist_mpi.c), and ranks as threads of one process
 * (dist_threads.c). */
#ifndef GRADD_DIST_INTERNAL_H
#define GRADD_DIST_INTERNAL_H

#include "dist.h"

struct dist {
    int rank, size, local_size;
    double timeout_s;
    char name[128];
    dist_group *group; /* a rank of a thread group; NULL: of the MPI world */
    void (*beat)(void *user); /* dist_set_beat's */
    void *beat_user;
};

/* The message of a collective that timed out. */
void dist_timed_out(const dist *d, const char *what, char *err, size_t err_len);

/* MPI: 0, or -1 with err.  Without MPI these fail saying so. */
int dist_mpi_open(dist *d, char *err, size_t err_len);
int dist_mpi_allreduce(dist *d, void *buf, size_t n, bool f64, dist_op op, const char *what, char *err,
                       size_t err_len);
int dist_mpi_allgather_f32(dist *d, float *buf, size_t n, const char *what, char *err, size_t err_len);
int dist_mpi_gather_f32(dist *d, const float *part, float *full, size_t n, const char *what, char *err,
                        size_t err_len);
void dist_mpi_abort(int code);
void dist_mpi_close(void);

/* Threads of one process. */
int dist_thr_allreduce(dist *d, void *buf, size_t n, bool f64, dist_op op, const char *what, char *err,
                       size_t err_len);
int dist_thr_allgather_f32(dist *d, float *buf, size_t n, const char *what, char *err, size_t err_len);
int dist_thr_gather_f32(dist *d, const float *part, float *full, size_t n, const char *what, char *err,
                        size_t err_len);
void dist_thr_fail(dist *d, const char *why);

#endif
