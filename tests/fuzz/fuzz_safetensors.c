/* fuzz_safetensors.c — libFuzzer harness for daemon/io/safetensors.c.
 *
 * The input is a whole file: it is written to a memfd and st_open reads it
 * through /proc/self/fd/N.  Properties (abort() on violation):
 *   - on failure *out is NULL and err starts with "PATH: ";
 *   - on success every tensor is consistent: known dtype, ndim ≤ 8,
 *     bytes == nelem × element size == end - begin, the tensors tile the data
 *     region exactly (sorted by offset: contiguous from 0 to its end);
 *     st_find finds each by name; st_read and st_data return exactly the
 *     input's bytes at data_offset + begin; st_expect accepts the tensor's own
 *     dtype and shape; st_meta finds each metadata key;
 *   - round trip: the parsed tensors and metadata given to st_writer and
 *     written with st_write_fd to a second memfd open again, with the same
 *     names, dtypes, shapes, bytes and metadata.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "io/safetensors.h"

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "fuzz_safetensors: property failed at %s:%d: %s\n", __FILE__, \
                    __LINE__, #cond);                                                    \
            abort();                                                                     \
        }                                                                                \
    } while (0)

static int memfd_a = -1, memfd_b = -1;
static char path_a[64], path_b[64];

static void refill(int fd, const uint8_t *data, size_t size)
{
    CHECK(ftruncate(fd, 0) == 0);
    CHECK(lseek(fd, 0, SEEK_SET) == 0);
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(fd, data + off, size - off);
        CHECK(w > 0);
        off += (size_t)w;
    }
}

static int cmp_off(const void *a, const void *b)
{
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static void check_file(st_file *f, const uint8_t *data, size_t size)
{
    char err[512];
    uint64_t doff = st_data_offset(f);
    CHECK(doff >= 9 && doff <= size);
    size_t n = st_count(f);
    const st_tensor **sorted = malloc((n ? n : 1) * sizeof *sorted);
    CHECK(sorted);
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = st_tensor_at(f, i);
        CHECK(t && t->name && t->name[0]);
        CHECK((unsigned)t->dtype < ST_DTYPE_COUNT);
        CHECK(t->ndim >= 0 && t->ndim <= ST_MAX_DIMS);
        uint64_t ne = 1;
        for (int d = 0; d < t->ndim; d++)
            ne *= t->shape[d]; /* cannot overflow: st_open checked it */
        CHECK(ne == t->nelem);
        CHECK(t->bytes == t->nelem * st_dtype_size(t->dtype));
        CHECK(t->end >= t->begin && t->end - t->begin == t->bytes);
        CHECK(t->end <= size - doff);
        CHECK(st_find(f, t->name) == t);
        CHECK(st_expect(f, t->name, t->dtype, t->ndim, t->shape, err, sizeof err) == t);
        uint8_t *buf = malloc(t->bytes ? (size_t)t->bytes : 1);
        CHECK(buf);
        CHECK(st_read(f, t->name, buf, (size_t)t->bytes, err, sizeof err) == 0);
        CHECK(t->bytes == 0 || memcmp(buf, data + doff + t->begin, (size_t)t->bytes) == 0);
        const void *p = st_data(f, t, err, sizeof err);
        CHECK(p);
        CHECK(t->bytes == 0 || memcmp(p, buf, (size_t)t->bytes) == 0);
        if (t->bytes > 0) /* wrong buffer size is refused */
            CHECK(st_read(f, t->name, buf, (size_t)t->bytes - 1, err, sizeof err) == -1);
        free(buf);
        sorted[i] = t;
    }
    qsort(sorted, n, sizeof *sorted, cmp_off);
    uint64_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        CHECK(sorted[i]->begin == pos);
        pos = sorted[i]->end;
    }
    CHECK(doff + pos == size);
    free(sorted);
    for (size_t i = 0; i < st_meta_count(f); i++) {
        const char *k, *v;
        st_meta_at(f, i, &k, &v);
        CHECK(k && v && st_meta(f, k) == v);
    }
}

static void round_trip(st_file *f, const uint8_t *data)
{
    char err[512];
    st_writer *w = st_writer_new();
    CHECK(w);
    uint64_t doff = st_data_offset(f);
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor *t = st_tensor_at(f, i);
        if (st_writer_add(w, t->name, t->dtype, t->ndim, t->shape,
                          t->bytes ? data + doff + t->begin : NULL, (size_t)t->bytes, err,
                          sizeof err) != 0) {
            fprintf(stderr, "fuzz_safetensors: writer refused a tensor the reader took: %s\n",
                    err);
            abort();
        }
    }
    for (size_t i = 0; i < st_meta_count(f); i++) {
        const char *k, *v;
        st_meta_at(f, i, &k, &v);
        CHECK(st_writer_meta(w, k, v, err, sizeof err) == 0);
    }
    CHECK(ftruncate(memfd_b, 0) == 0);
    CHECK(lseek(memfd_b, 0, SEEK_SET) == 0);
    if (st_write_fd(w, memfd_b, path_b, err, sizeof err) != 0) {
        /* Only an over-long header may fail: re-encoding can grow it
         * (e.g. metadata is now written before tensors), never otherwise. */
        CHECK(strstr(err, "exceeds the limit"));
        st_writer_free(w);
        return;
    }
    st_writer_free(w);
    st_file *g;
    if (st_open(path_b, &g, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_safetensors: re-encoded file refused: %s\n", err);
        abort();
    }
    CHECK(st_count(g) == st_count(f));
    CHECK(st_meta_count(g) == st_meta_count(f));
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor *a = st_tensor_at(f, i), *b = st_find(g, a->name);
        CHECK(b && b->dtype == a->dtype && b->ndim == a->ndim && b->bytes == a->bytes);
        CHECK(memcmp(a->shape, b->shape, sizeof a->shape[0] * (size_t)a->ndim) == 0);
        const void *pa = st_data(f, a, err, sizeof err), *pb = st_data(g, b, err, sizeof err);
        CHECK(pa && pb && (a->bytes == 0 || memcmp(pa, pb, (size_t)a->bytes) == 0));
        /* the writer aligns every tensor to its element size */
        CHECK(b->begin % st_dtype_size(b->dtype) == 0);
    }
    for (size_t i = 0; i < st_meta_count(f); i++) {
        const char *k, *v;
        st_meta_at(f, i, &k, &v);
        const char *v2 = st_meta(g, k);
        CHECK(v2 && strcmp(v, v2) == 0);
    }
    st_close(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (memfd_a < 0) {
        memfd_a = memfd_create("fuzz-st-a", 0);
        memfd_b = memfd_create("fuzz-st-b", 0);
        CHECK(memfd_a >= 0 && memfd_b >= 0);
        snprintf(path_a, sizeof path_a, "/proc/self/fd/%d", memfd_a);
        snprintf(path_b, sizeof path_b, "/proc/self/fd/%d", memfd_b);
    }
    refill(memfd_a, data, size);

    st_file *f = (st_file *)(uintptr_t)1;
    char err[1024] = "";
    if (st_open(path_a, &f, err, sizeof err) != 0) {
        CHECK(f == NULL);
        size_t pl = strlen(path_a);
        CHECK(strncmp(err, path_a, pl) == 0 && err[pl] == ':' && err[pl + 1] == ' ');
        CHECK(strlen(err) > pl + 2);
        return 0;
    }
    CHECK(f != NULL);
    check_file(f, data, size);
    round_trip(f, data);
    st_close(f);
    return 0;
}
