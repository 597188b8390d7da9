/* dist_id_probe.c — one rank of `mpirun -np N dist_id_probe MODE`: how
 * ranks that are processes share NCCL's unique id (dist_use_cuda over MPI),
 * with a stand-in for the NCCL interface that only makes and receives the
 * id.  test_dist.py runs it; the GPU path itself needs a GPU.
 *
 * MODE ok:   rank 0 makes an id; every rank must open with those bytes.
 * MODE fail: rank 0 cannot make one; every rank must fail, none wait.
 * Prints "rank R: ..." and exits 0 when the rank saw what it should. */
#include <stdio.h>
#include <string.h>

#include "dist/dist_internal.h"

static const char *mode = "ok";
static unsigned char opened[DIST_NCCL_ID_BYTES];
static int opens;
static int comm_token; /* what open hands out: any address will do */

static unsigned char pattern(size_t i) { return (unsigned char)(i * 7 + 3); }

static int unique_id(unsigned char id[DIST_NCCL_ID_BYTES], char *err, size_t err_len)
{
    if (strcmp(mode, "fail") == 0) {
        snprintf(err, err_len, "the stand-in makes no id");
        return -1;
    }
    for (size_t i = 0; i < DIST_NCCL_ID_BYTES; i++)
        id[i] = pattern(i);
    return 0;
}

static dist_nccl_comm *open_comm(int device, int rank, int size, const unsigned char id[DIST_NCCL_ID_BYTES],
                                 void *stream, const dist_nccl_wait *w, char *err, size_t err_len)
{
    (void)device, (void)rank, (void)size, (void)stream, (void)w, (void)err, (void)err_len;
    memcpy(opened, id, sizeof opened);
    opens++;
    return (dist_nccl_comm *)&comm_token;
}

static void close_comm(dist_nccl_comm *c, bool abort)
{
    (void)c, (void)abort;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        mode = argv[1];
    dist_nccl_ops ops = {.abi = DIST_NCCL_ABI, .unique_id = unique_id, .open = open_comm, .close = close_comm};
    char err[512] = "";
    dist *d = NULL;
    if (dist_open(&d, 20, err, sizeof err) != 0) {
        fprintf(stderr, "cannot join the ranks: %s\n", err);
        return 2;
    }
    int rank = d->rank, rc = dist_use_cuda(d, &ops, 0, NULL, err, sizeof err), bad = 0;
    if (strcmp(mode, "ok") == 0) {
        for (size_t i = 0; i < DIST_NCCL_ID_BYTES; i++)
            bad |= opened[i] != pattern(i);
        if (rc != 0 || opens != 1 || bad)
            fprintf(stderr, "rank %d: rc %d, opened %d times, id %s: %s\n", rank, rc, opens,
                    bad ? "differs from rank 0's" : "as made", err);
        else
            printf("rank %d: opened with rank 0's id\n", rank);
        bad |= rc != 0 || opens != 1;
        dist_release_cuda(d, false);
    } else {
        const char *want = rank == 0 ? "the stand-in makes no id" : "rank 0 could not make NCCL's id";
        bad = rc == 0 || opens != 0 || !strstr(err, want);
        if (bad)
            fprintf(stderr, "rank %d: rc %d, opened %d times, err '%s' (wanted '%s')\n", rank, rc, opens, err, want);
        else
            printf("rank %d: failed as it should: %s\n", rank, err);
    }
    fflush(stdout);
    dist_close(d);
    return bad ? 1 : 0;
}
