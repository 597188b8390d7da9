/* test_data_budget.c — a job's host memory for its data (data_budget in
 * io/data.h): each format counts exactly what it holds, a load that would
 * pass the bound is refused before it allocates (a sparse file, a gzip
 * bomb whose header declares more than it may hold) with a message naming
 * the file and the key, a gzip stream that inflates past its header is
 * not inflated to its end, and a refusal leaves nothing charged. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <cmocka.h>

#include "io/data.h"
#include "tmpdir.h"

#define KEY "[daemon] max_job_data"

static char err[1024];

/* The tests run in the scratch directory: a file's name is its path. */
static const char *put(const char *name, const void *data, size_t n)
{
    FILE *f = fopen(name, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
    return name;
}

static void be32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (24 - 8 * i));
}

/* An IDX images header (n × r × c) then `body` zero bytes, gzip'd. */
static const char *idx_gz_zeros(const char *name, uint32_t n, uint32_t r, uint32_t c, size_t body)
{
    const char *p = name;
    gzFile g = gzopen(p, "wb9");
    assert_non_null(g);
    unsigned char h[16];
    be32(h, DATA_IDX_IMAGES_MAGIC);
    be32(h + 4, n);
    be32(h + 8, r);
    be32(h + 12, c);
    assert_int_equal(gzwrite(g, h, sizeof h), (int)sizeof h);
    static const unsigned char zeros[1 << 16];
    for (size_t left = body; left;) {
        unsigned k = left < sizeof zeros ? (unsigned)left : (unsigned)sizeof zeros;
        assert_int_equal(gzwrite(g, zeros, k), (int)k);
        left -= k;
    }
    assert_int_equal(gzclose(g), Z_OK);
    return p;
}

static const char *idx_labels_file(const char *name, uint32_t n)
{
    unsigned char *b = malloc(8 + n);
    assert_non_null(b);
    be32(b, DATA_IDX_LABELS_MAGIC);
    be32(b + 4, n);
    for (uint32_t i = 0; i < n; i++)
        b[8 + i] = (unsigned char)(i % 3);
    const char *p = put(name, b, 8 + n);
    free(b);
    return p;
}

/* rc is a refusal of path naming every fragment. */
static void refused(int rc, const char *path, const char *a, const char *b)
{
    assert_int_equal(rc, -1);
    if (strncmp(err, path, strlen(path)) != 0 || !strstr(err, a) || (b && !strstr(err, b)))
        fail_msg("unexpected message '%s' (want %s, '%s', '%s')", err, path, a, b ? b : "");
}

/* ---- tokens ------------------------------------------------------------------ */

static void test_text_counts_bytes(void **state)
{
    (void)state;
    char text[1000];
    for (size_t i = 0; i < sizeof text; i++)
        text[i] = (char)('a' + i % 26);
    const char *p = put("t.txt", text, sizeof text);
    data_budget b = {0};
    data_tokens t;
    assert_int_equal(data_tokens_load(&t, p, DATA_FMT_TEXT, 256, &b, err, sizeof err), 0);
    /* one byte a token, the file's bytes themselves */
    assert_non_null(t.u8);
    assert_null(t.tok);
    assert_int_equal(b.used, 1000);
    assert_int_equal(data_token(&t, 27), 'b');
    data_tokens v;
    assert_int_equal(data_tokens_split(&t, &v, 0.1, &b, err, sizeof err), 0);
    assert_int_equal(b.used, 1000); /* the tail moved, it was not copied for good */
    assert_int_equal(v.n, 100);
    assert_int_equal(data_token(&v, 0), 'a' + 900 % 26);
    data_stream s;
    assert_int_equal(data_stream_tokens(&s, &t, 8, 1, &b, err, sizeof err), 0);
    assert_int_equal(b.used, 1000 + data_stream_epoch_size(&s) * 8);
    data_stream_free(&s);
    data_tokens_free(&v);
    data_tokens_free(&t);

    /* one byte over: refused, and nothing stays charged */
    data_budget tight = {.limit = 999, .key = KEY};
    refused(data_tokens_load(&t, p, DATA_FMT_TEXT, 256, &tight, err, sizeof err), p, KEY " = 999",
            "1000 bytes");
    assert_int_equal(tight.used, 0);
    assert_null(t.u8);
    data_budget exact = {.limit = 1000, .key = KEY};
    assert_int_equal(data_tokens_load(&t, p, DATA_FMT_TEXT, 256, &exact, err, sizeof err), 0);
    assert_int_equal(exact.used, 1000);
    assert_int_equal(exact.peak, 1000); /* no slack past the file's size */
    data_tokens_free(&t);
}

/* A sparse file: large on paper, nothing on disk.  Refused from its size,
 * before a byte is read or allocated, and at once. */
static void test_sparse_text_refused(void **state)
{
    (void)state;
    const char *p = put("sparse.txt", "", 0);
    assert_int_equal(truncate(p, (off_t)1 << 32), 0);
    data_budget b = {.limit = 1 << 20, .key = KEY};
    data_tokens t;
    refused(data_tokens_load(&t, p, DATA_FMT_AUTO, 256, &b, err, sizeof err), p,
            "4294967296 bytes", KEY " = 1.00M");
    assert_int_equal(b.used, 0);
    assert_int_equal(b.peak, 0);
    /* the same in a directory: the file that overflows is named */
    assert_int_equal(mkdir("dir", 0755), 0);
    char small[100] = {'x'};
    put("dir/a", small, sizeof small);
    const char *big = put("dir/b", "", 0);
    assert_int_equal(truncate(big, (off_t)1 << 32), 0);
    refused(data_tokens_load(&t, "dir", DATA_FMT_AUTO, 256, &b, err, sizeof err), big,
            KEY, NULL);
    assert_int_equal(b.used, 0);
}

static void test_llmc_and_npy_tokens(void **state)
{
    (void)state;
    enum { N = 50000 };
    unsigned char *f = calloc(1, 1024 + 2 * N);
    assert_non_null(f);
    uint32_t h[3] = {DATA_LLMC_MAGIC, DATA_LLMC_VERSION, N};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++)
            f[4 * i + k] = (unsigned char)(h[i] >> (8 * k));
    const char *p = put("t.bin", f, 1024 + 2 * N);
    free(f);
    data_budget b = {0};
    data_tokens t;
    assert_int_equal(data_tokens_load(&t, p, DATA_FMT_AUTO, 0, &b, err, sizeof err), 0);
    assert_int_equal(b.used, 2 * N);
    data_tokens_free(&t);
    data_budget tight = {.limit = 2 * N - 1, .key = KEY};
    refused(data_tokens_load(&t, p, DATA_FMT_AUTO, 0, &tight, err, sizeof err), p, KEY, NULL);
    assert_int_equal(tight.used, 0);

    /* '<i4' tokens become uint16 a chunk at a time: never 4 bytes a token held */
    char hdr[128];
    int hl = snprintf(hdr, sizeof hdr, "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }", N);
    memset(hdr + hl, ' ', sizeof hdr - 10 - (size_t)hl);
    hdr[sizeof hdr - 10 - 1] = '\n';
    unsigned char *n4 = malloc(128 + 4 * (size_t)N);
    assert_non_null(n4);
    memcpy(n4, "\x93NUMPY\x01\x00", 8);
    n4[8] = 118;
    n4[9] = 0;
    memcpy(n4 + 10, hdr, 118);
    for (uint32_t i = 0; i < N; i++)
        for (int k = 0; k < 4; k++)
            n4[128 + 4 * i + k] = (unsigned char)(((i * 3) & 0xffff) >> (8 * k));
    p = put("t.npy", n4, 128 + 4 * (size_t)N);
    b = (data_budget){0};
    assert_int_equal(data_tokens_load(&t, p, DATA_FMT_AUTO, 0, &b, err, sizeof err), 0);
    assert_int_equal(b.used, 2 * N);
    assert_int_equal(b.peak, 2 * N);
    assert_int_equal(data_token(&t, N - 1), (3u * (N - 1)) & 0xffff);
    data_tokens_free(&t);
    /* a bad token late in the file gives back what was charged */
    n4[128 + 4 * (N - 2) + 3] = 0x80;
    p = put("bad.npy", n4, 128 + 4 * (size_t)N);
    b = (data_budget){0};
    refused(data_tokens_load(&t, p, DATA_FMT_AUTO, 0, &b, err, sizeof err), p, "does not fit uint16",
            NULL);
    assert_int_equal(b.used, 0);
    free(n4);
}

/* ---- images ------------------------------------------------------------------ */

static void test_images_counted(void **state)
{
    (void)state;
    const char *ip = idx_gz_zeros("i.gz", 30, 4, 5, 30 * 20);
    const char *lp = idx_labels_file("l.idx", 30);
    data_budget b = {0};
    data_images d;
    assert_int_equal(data_images_load(&d, ip, lp, 0, 0, &b, err, sizeof err), 0);
    assert_int_equal(b.used, 30 * 20 + 30 * 4); /* pixels as bytes, labels as int32 */
    assert_int_equal(d.labels[29], 29 % 3);       /* widened in place, from the back */
    data_stream s;
    assert_int_equal(data_stream_images(&s, &d, 1, &b, err, sizeof err), 0);
    assert_int_equal(b.used, 30 * 20 + 30 * 4 + 30 * 8);
    data_stream_free(&s);
    data_images_free(&d);
    /* a subset holds only itself */
    b = (data_budget){0};
    assert_int_equal(data_images_load(&d, ip, lp, 0, 7, &b, err, sizeof err), 0);
    assert_int_equal(b.used, 7 * 20 + 7 * 4);
    assert_int_equal(d.labels[6], 0);
    data_images_free(&d);
    /* the labels are what passes the bound: the images go back too */
    data_budget tight = {.limit = 30 * 20 + 30, .key = KEY};
    refused(data_images_load(&d, ip, lp, 0, 0, &tight, err, sizeof err), lp, KEY, NULL);
    assert_int_equal(tight.used, 0);
    assert_null(d.u8);
    /* counts that disagree give back what each part took, not a guess from
     * the other: 30 images against 12 or 50 labels, whole and limited */
    const char *few = idx_labels_file("l12.idx", 12), *many = idx_labels_file("l50.idx", 50);
    const char *lps[] = {few, many};
    size_t limits[] = {0, 7, 40};
    for (size_t i = 0; i < 2; i++)
        for (size_t k = 0; k < 3; k++) {
            b = (data_budget){0};
            refused(data_images_load(&d, ip, lps[i], 0, limits[k], &b, err, sizeof err), lps[i],
                    "labels, but", ip);
            assert_int_equal(b.used, 0);
        }
}

/* A gzip bomb: a small file whose header declares far more than the job
 * may hold.  Refused from the header, before the body is inflated. */
static void test_gzip_bomb_refused(void **state)
{
    (void)state;
    const char *p = idx_gz_zeros("bomb.gz", 60000, 28, 28, 4 << 20);
    const char *lp = idx_labels_file("l60k.idx", 60000);
    data_budget b = {.limit = 1 << 20, .key = KEY};
    data_images d;
    refused(data_images_load(&d, p, lp, 0, 0, &b, err, sizeof err), p, "47040000 bytes",
            KEY " = 1.00M");
    assert_int_equal(b.peak, 0);
    /* a header of 4G images of 1×1 */
    p = idx_gz_zeros("dims.gz", 0xffffffffu, 1, 1, 0);
    refused(data_images_load(&d, p, lp, 0, 0, &b, err, sizeof err), p, "4294967295 bytes", KEY);
    assert_int_equal(b.used, 0);
}

/* A stream that goes on inflating past what its header declares stops
 * being read a chunk past it: garbage at the file's end, which reading on
 * would find and report, goes unread. */
static void test_gzip_past_header(void **state)
{
    (void)state;
    const char *p = idx_gz_zeros("long.gz", 3, 2, 2, 4 << 20);
    FILE *f = fopen(p, "ab");
    assert_non_null(f);
    assert_int_equal(fputs("GARBAGE!", f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
    const char *lp = idx_labels_file("l3.idx", 3);
    data_images d;
    refused(data_images_load(&d, p, lp, 0, 0, NULL, err, sizeof err), p, "trailing bytes",
            "inflates past them");
    assert_null(strstr(err, "garbage"));
}

static int setup(void **state)
{
    (void)state;
    return td_make("data-budget") != 0 || chdir(td_path) != 0 ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    return chdir("/") != 0 ? -1 : td_remove();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_counts_bytes), cmocka_unit_test(test_sparse_text_refused),
        cmocka_unit_test(test_llmc_and_npy_tokens), cmocka_unit_test(test_images_counted),
        cmocka_unit_test(test_gzip_bomb_refused),  cmocka_unit_test(test_gzip_past_header),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
