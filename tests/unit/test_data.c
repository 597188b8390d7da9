/* test_data.c — the data readers (text, llm.c, IDX plain and gzip'd, .npy)
 * and the seeded sample streams: exact read-back, every refusal naming the
 * file and the problem, determinism, resume, micro-batch split
 * independence, and the real fortunes and fashion-mnist data where present. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <cmocka.h>

#include "io/data.h"

static char dir[64];
static char err[1024];

/* ---- helpers --------------------------------------------------------------- */

static const char *tmp(const char *name)
{
    static char paths[256][512]; /* a ring: a test uses fewer than 256 names */
    static int k;
    char *p = paths[k++ % 256];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}

static const char *write_file(const char *name, const void *data, size_t n)
{
    const char *p = tmp(name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    if (n)
        assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
    return p;
}

static const char *write_gz(const char *name, const void *data, size_t n)
{
    const char *p = tmp(name);
    gzFile g = gzopen(p, "wb");
    assert_non_null(g);
    if (n)
        assert_int_equal(gzwrite(g, data, (unsigned)n), (int)n);
    assert_int_equal(gzclose(g), Z_OK);
    return p;
}

static unsigned char *read_all(const char *p, size_t *n)
{
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

/* rc must be -1 and err must start with "path:" (or "path ") and contain every fragment. */
static void expect_fail_(int rc, const char *path, const char *const *frags, const char *where,
                         int line)
{
    if (rc != -1)
        fail_msg("%s:%d: expected failure, got %d", where, line, rc);
    if (getenv("GRADD_TEST_SHOW_ERRORS")) /* to read the messages */
        print_message("%s\n", err);
    size_t pl = strlen(path);
    if (strncmp(err, path, pl) != 0 || (err[pl] != ':' && err[pl] != ' '))
        fail_msg("%s:%d: error '%s' does not start with the file '%s'", where, line, err, path);
    for (; *frags; frags++)
        if (!strstr(err, *frags))
            fail_msg("%s:%d: error '%s' lacks '%s'", where, line, err, *frags);
}
#define expect_fail(rc, path, ...)                                                         \
    do {                                                                                   \
        err[0] = '\0';                                                                     \
        int rc_ = (rc);                                                                    \
        const char *const frags_[] = {__VA_ARGS__, NULL};                                  \
        expect_fail_(rc_, path, frags_, __FILE__, __LINE__);                               \
    } while (0)

#define ok(call)                                                                           \
    do {                                                                                   \
        err[0] = '\0';                                                                     \
        if ((call) != 0)                                                                   \
            fail_msg("%s failed: %s", #call, err);                                         \
    } while (0)

static void put_le32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* An llm.c file image: header (magic, version, count) then ntok tokens. */
static unsigned char *llmc(int32_t magic, int32_t version, int32_t count, const uint16_t *tok,
                           size_t ntok, size_t *len)
{
    *len = 1024 + 2 * ntok;
    unsigned char *b = calloc(1, *len);
    assert_non_null(b);
    put_le32(b, (uint32_t)magic);
    put_le32(b + 4, (uint32_t)version);
    put_le32(b + 8, (uint32_t)count);
    for (size_t i = 0; i < ntok; i++) {
        b[1024 + 2 * i] = (unsigned char)tok[i];
        b[1024 + 2 * i + 1] = (unsigned char)(tok[i] >> 8);
    }
    return b;
}

/* A .npy image with the given header dict (padded as numpy does) and data. */
static unsigned char *npy(int major, const char *dict, const void *data, size_t dlen, size_t *len)
{
    size_t pre = major == 1 ? 10 : 12;
    size_t hl = strlen(dict) + 1;
    size_t pad = (64 - (pre + hl) % 64) % 64;
    hl += pad;
    *len = pre + hl + dlen;
    unsigned char *b = malloc(*len);
    assert_non_null(b);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (unsigned char)major;
    b[7] = 0;
    if (major == 1) {
        b[8] = (unsigned char)hl;
        b[9] = (unsigned char)(hl >> 8);
    } else {
        put_le32(b + 8, (uint32_t)hl);
    }
    memcpy(b + pre, dict, strlen(dict));
    memset(b + pre + strlen(dict), ' ', pad);
    b[pre + hl - 1] = '\n';
    if (dlen)
        memcpy(b + pre + hl, data, dlen);
    return b;
}

static const char *write_npy(const char *name, const char *dict, const void *data, size_t dlen)
{
    size_t len;
    unsigned char *b = npy(1, dict, data, dlen, &len);
    const char *p = write_file(name, b, len);
    free(b);
    return p;
}

/* IDX images n×r×c with pixel (i, k) = (i * 7 + k) & 255, and labels i % 10. */
static unsigned char *idx_images(uint32_t magic, uint32_t n, uint32_t r, uint32_t c, size_t *len)
{
    *len = 16 + (size_t)n * r * c;
    unsigned char *b = malloc(*len);
    assert_non_null(b);
    put_be32(b, magic);
    put_be32(b + 4, n);
    put_be32(b + 8, r);
    put_be32(b + 12, c);
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < (size_t)r * c; k++)
            b[16 + i * r * c + k] = (unsigned char)((i * 7 + k) & 255);
    return b;
}

static unsigned char *idx_labels(uint32_t magic, uint32_t n, size_t *len)
{
    *len = 8 + n;
    unsigned char *b = malloc(*len);
    assert_non_null(b);
    put_be32(b, magic);
    put_be32(b + 4, n);
    for (size_t i = 0; i < n; i++)
        b[8 + i] = (unsigned char)(i % 10);
    return b;
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/gradd-test-data-XXXXXX");
    assert_non_null(mkdtemp(dir));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---- text ------------------------------------------------------------------ */

static void test_text_file(void **state)
{
    (void)state;
    const char *s = "hello, world\n\xff\x00z";
    const char *p = write_file("t.txt", s, 16);
    data_tokens t;
    ok(data_tokens_load(&t, p, DATA_FMT_AUTO, 256, NULL, err, sizeof err));
    assert_int_equal(t.n, 16);
    for (size_t i = 0; i < 16; i++)
        assert_int_equal(data_token(&t, i), (unsigned char)s[i]);
    assert_int_equal(t.max_token, 255);
    assert_string_equal(t.source, p);
    expect_fail(data_tokens_check_vocab(&t, 128, err, sizeof err), p, "token 255 at index 13",
                "vocab 128");
    data_tokens_free(&t);

    const char *e = write_file("empty.txt", "", 0);
    expect_fail(data_tokens_load(&t, e, DATA_FMT_TEXT, 0, NULL, err, sizeof err), e, "empty");
    assert_null(t.tok);
    expect_fail(data_tokens_load(&t, tmp("missing"), DATA_FMT_AUTO, 0, NULL, err, sizeof err),
                tmp("missing"), "cannot open");
    /* a FIFO is refused, not waited on */
    const char *f = tmp("fifo");
    assert_int_equal(mkfifo(f, 0600), 0);
    expect_fail(data_tokens_load(&t, f, DATA_FMT_AUTO, 0, NULL, err, sizeof err), f,
                "not a regular file");
    data_images d;
    expect_fail(data_images_load(&d, f, f, 0, 0, NULL, err, sizeof err), f, "not a regular file");
}

static void test_text_dir(void **state)
{
    (void)state;
    char d[600];
    snprintf(d, sizeof d, "%s/fort", dir);
    assert_int_equal(mkdir(d, 0700), 0);
    write_file("fort/b", "BBB\n", 4);
    write_file("fort/a", "AA\n", 3);
    write_file("fort/a.dat", "\x01\x02", 2);
    write_file("fort/.hidden", "HID", 3);
    write_file("fort/c-empty", "", 0);
    assert_int_equal(symlink("a", tmp("fort/a.u8")), 0);
    assert_int_equal(symlink("b", tmp("fort/zlink")), 0);  /* followed */
    assert_int_equal(symlink("nowhere", tmp("fort/dangling")), 0);
    assert_int_equal(mkdir(tmp("fort/sub"), 0700), 0);
    write_file("fort/sub/x", "XXX", 3);
    data_tokens t;
    ok(data_tokens_load(&t, d, DATA_FMT_AUTO, 256, NULL, err, sizeof err));
    const char *want = "AA\nBBB\nBBB\n";
    assert_int_equal(t.n, strlen(want));
    for (size_t i = 0; i < t.n; i++)
        assert_int_equal(data_token(&t, i), (unsigned char)want[i]);
    data_tokens_free(&t);
    expect_fail(data_tokens_load(&t, d, DATA_FMT_LLMC, 0, NULL, err, sizeof err), d, "directory");

    char e[600];
    snprintf(e, sizeof e, "%s/emptydir", dir);
    assert_int_equal(mkdir(e, 0700), 0);
    write_file("emptydir/x.dat", "1", 1);
    expect_fail(data_tokens_load(&t, e, DATA_FMT_TEXT, 0, NULL, err, sizeof err), e, "no text");
}

/* ---- llm.c ------------------------------------------------------------------- */

static void test_llmc_valid(void **state)
{
    (void)state;
    uint16_t tok[] = {1, 50256, 300, 0, 65535, 7};
    size_t len;
    unsigned char *b = llmc(20240520, 1, 6, tok, 6, &len);
    const char *p = write_file("ok.bin", b, len);
    data_tokens t;
    ok(data_tokens_load(&t, p, DATA_FMT_AUTO, 0, NULL, err, sizeof err));
    assert_int_equal(t.n, 6);
    for (int i = 0; i < 6; i++)
        assert_int_equal(data_token(&t, i), tok[i]);
    assert_int_equal(t.max_token, 65535);
    data_tokens_free(&t);
    /* vocab known: the first token out of range is named with its offset */
    expect_fail(data_tokens_load(&t, p, DATA_FMT_LLMC, 50257, NULL, err, sizeof err), p,
                "token 65535 at index 4 (byte offset 1032)", "vocab 50257");
    assert_null(t.tok);
    /* the magic, not the name, decides under auto */
    const char *q = write_file("tokens.dat", b, len);
    ok(data_tokens_load(&t, q, DATA_FMT_AUTO, 65536, NULL, err, sizeof err));
    assert_int_equal(t.n, 6);
    assert_int_equal(t.elem_size, 2);
    data_tokens_free(&t);
    free(b);
}

static void test_llmc_invalid(void **state)
{
    (void)state;
    uint16_t tok[4] = {1, 2, 3, 4};
    data_tokens t;
    size_t len;
    unsigned char *b;

    b = llmc(12345, 1, 4, tok, 4, &len);
    const char *p = write_file("magic.bin", b, len);
    expect_fail(data_tokens_load(&t, p, DATA_FMT_AUTO, 0, NULL, err, sizeof err), p,
                "bad magic 12345 (expected 20240520 for an llm.c token file)");
    free(b);

    b = llmc(20240520, 2, 4, tok, 4, &len);
    p = write_file("version.bin", b, len);
    expect_fail(data_tokens_load(&t, p, DATA_FMT_AUTO, 0, NULL, err, sizeof err), p, "bad version 2",
                "expected 1");
    free(b);

    b = llmc(20240520, 1, 5, tok, 4, &len); /* says 5, holds 4 */
    p = write_file("short.bin", b, len);
    expect_fail(data_tokens_load(&t, p, DATA_FMT_AUTO, 0, NULL, err, sizeof err), p, "truncated body",
                "5 tokens", "1034 bytes", "it is 1032 bytes");
    free(b);

    b = llmc(20240520, 1, 3, tok, 4, &len); /* says 3, holds 4 */
    p = write_file("long.bin", b, len);
    expect_fail(data_tokens_load(&t, p, DATA_FMT_AUTO, 0, NULL, err, sizeof err), p, "trailing bytes",
                "1030 bytes", "it is 1032 bytes");
    free(b);

    b = llmc(20240520, 1, 0, tok, 0, &len);
    p = write_file("zero.bin", b, len);
    expect_fail(data_tokens_load(&t, p, DATA_FMT_AUTO, 0, NULL, err, sizeof err), p, "token count 0");
    free(b);

    b = llmc(20240520, 1, -4, tok, 4, &len);
    p = write_file("neg.bin", b, len);
    expect_fail(data_tokens_load(&t, p, DATA_FMT_AUTO, 0, NULL, err, sizeof err), p, "token count -4");
    free(b);

    b = llmc(20240520, 1, 4, tok, 4, &len);
    p = write_file("hdr.bin", b, 100);
    expect_fail(data_tokens_load(&t, p, DATA_FMT_AUTO, 0, NULL, err, sizeof err), p,
                "truncated header", "100 bytes");
    /* forced format: a text file is refused as llm.c with the magic named */
    p = write_file("text.txt", "hello world", 11);
    expect_fail(data_tokens_load(&t, p, DATA_FMT_LLMC, 0, NULL, err, sizeof err), p, "bad magic",
                "20240520");
    /* *.bin under auto is an llm.c file, so a wrong one gets the llm.c message */
    p = write_file("text.bin", "hello world", 11);
    expect_fail(data_tokens_load(&t, p, DATA_FMT_AUTO, 0, NULL, err, sizeof err), p, "bad magic");
    free(b);
    assert_null(t.tok);
}

/* ---- .npy -------------------------------------------------------------------- */

static void test_npy_tokens(void **state)
{
    (void)state;
    data_tokens t;
    uint16_t u16[] = {5, 6, 65535};
    const char *p = write_npy("u2.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }",
                              u16, sizeof u16);
    ok(data_tokens_load(&t, p, DATA_FMT_AUTO, 0, NULL, err, sizeof err));
    assert_int_equal(t.n, 3);
    assert_int_equal(data_token(&t, 2), 65535);
    data_tokens_free(&t);

    int32_t i32[] = {0, 1, 50000, 2};
    p = write_npy("i4.npy", "{\"descr\":\"<i4\",\"fortran_order\":False,\"shape\":(4,)}", i32,
                  sizeof i32);
    ok(data_tokens_load(&t, p, DATA_FMT_NPY, 50257, NULL, err, sizeof err));
    assert_int_equal(t.n, 4);
    assert_int_equal(data_token(&t, 2), 50000);
    data_tokens_free(&t);

    int32_t bad[] = {0, -1};
    p = write_npy("neg.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", bad,
                  sizeof bad);
    expect_fail(data_tokens_load(&t, p, DATA_FMT_NPY, 0, NULL, err, sizeof err), p,
                "token -1 at index 1", "uint16");

    uint8_t u8[] = {'h', 'i'};
    p = write_npy("u1.bin.npy", "{'descr': '|u1', 'fortran_order': False, 'shape': (2,), }", u8, 2);
    ok(data_tokens_load(&t, p, DATA_FMT_AUTO, 256, NULL, err, sizeof err));
    assert_int_equal(data_token(&t, 1), 'i');
    data_tokens_free(&t);

    float f[] = {1, 2};
    p = write_npy("f4.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", f,
                  sizeof f);
    expect_fail(data_tokens_load(&t, p, DATA_FMT_NPY, 0, NULL, err, sizeof err), p, "'<f4'", "1-d");
    p = write_npy("2d.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (1, 2), }", u16, 4);
    expect_fail(data_tokens_load(&t, p, DATA_FMT_NPY, 0, NULL, err, sizeof err), p, "2-d");

    /* v2 header */
    size_t len;
    unsigned char *b = npy(2, "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }", u16,
                           sizeof u16, &len);
    p = write_file("v2.npy", b, len);
    free(b);
    ok(data_tokens_load(&t, p, DATA_FMT_AUTO, 0, NULL, err, sizeof err));
    assert_int_equal(t.n, 3);
    data_tokens_free(&t);
}

static void npy_bad(const char *name, int major, const char *dict, size_t dlen, int cut,
                    const char *frag1, const char *frag2)
{
    static unsigned char zeros[256];
    size_t len;
    unsigned char *b = npy(major, dict, zeros, dlen, &len);
    const char *p = write_file(name, b, cut ? (size_t)cut : len);
    free(b);
    data_npy a;
    expect_fail(data_npy_load(&a, p, NULL, err, sizeof err), p, frag1, frag2);
    assert_null(a.data);
}

static void test_npy_invalid(void **state)
{
    (void)state;
    const char *good = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    data_npy a;
    size_t len;
    float v[6] = {1, 2, 3, 4, 5, 6};
    unsigned char *b = npy(1, good, v, sizeof v, &len);
    const char *p = write_file("good.npy", b, len);
    ok(data_npy_load(&a, p, NULL, err, sizeof err));
    assert_int_equal(a.dtype, DATA_F32);
    assert_int_equal(a.ndim, 2);
    assert_int_equal(a.shape[0], 2);
    assert_int_equal(a.shape[1], 3);
    assert_int_equal(a.count, 6);
    assert_int_equal(a.data_offset, 128); /* numpy pads the header to 64 bytes */
    assert_memory_equal(a.data, v, sizeof v);
    data_npy_free(&a);
    /* damaged copies of the good file */
    b[0] = 'X';
    p = write_file("magic.npy", b, len);
    expect_fail(data_npy_load(&a, p, NULL, err, sizeof err), p, "not a .npy file");
    b[0] = 0x93;
    b[6] = 4;
    p = write_file("ver.npy", b, len);
    expect_fail(data_npy_load(&a, p, NULL, err, sizeof err), p, "version 4.0");
    b[6] = 1;
    b[127] = ' ';
    p = write_file("nl.npy", b, len);
    expect_fail(data_npy_load(&a, p, NULL, err, sizeof err), p, "newline");
    free(b);

    npy_bad("short.npy", 1, good, 20, 0, "truncated data", "needs 24 data bytes");
    npy_bad("long.npy", 1, good, 28, 0, "trailing bytes", "the file has 28");
    npy_bad("hdrcut.npy", 1, good, 24, 30, "truncated .npy header", "");
    npy_bad("pre.npy", 1, good, 24, 8, "truncated .npy preamble", "");
    npy_bad("be.npy", 1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", 24, 0,
            "unsupported .npy dtype '>f4'", "'<f4'");
    npy_bad("f8.npy", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", 24, 0,
            "dtype '<f8'", "");
    npy_bad("fortran.npy", 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24,
            0, "Fortran", "");
    npy_bad("comma.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (6), }", 24, 0,
            "bad .npy header", "trailing comma");
    npy_bad("negdim.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-6,), }", 24,
            0, "bad .npy header", "non-negative integers");
    npy_bad("key.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'x': 1}",
            24, 0, "unknown key", "");
    npy_bad("dup.npy", 1, "{'descr': '<f4', 'descr': '<f4', 'shape': (6,)}", 24, 0,
            "'descr' given twice", "");
    npy_bad("noshape.npy", 1, "{'descr': '<f4', 'fortran_order': False}", 24, 0,
            "lacks 'shape'", "");
    npy_bad("dict.npy", 1, "['descr', '<f4']", 24, 0, "not a Python dict", "");
    npy_bad("junk.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,)} x", 24, 0,
            "junk after", "");
    npy_bad("big.npy", 2,
            "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }",
            24, 0, "too large", "");
    npy_bad("huge.npy", 2,
            "{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000,), }", 24, 0,
            "truncated data", "400000000000");
}

/* ---- IDX --------------------------------------------------------------------- */

static void check_images(const data_images *d, size_t n, size_t r, size_t c)
{
    assert_int_equal(d->n, n);
    assert_int_equal(d->rows, r);
    assert_int_equal(d->cols, c);
    assert_int_equal(d->dim, r * c);
    float *x = malloc(r * c * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++) {
        data_images_get(d, i, x);
        for (size_t k = 0; k < r * c; k++)
            assert_true(x[k] == (float)((i * 7 + k) & 255) / 255.0f);
        assert_int_equal(d->labels[i], (int)(i % 10));
    }
    free(x);
}

static void test_idx_valid(void **state)
{
    (void)state;
    size_t li, ll;
    unsigned char *im = idx_images(0x803, 12, 3, 4, &li);
    unsigned char *lb = idx_labels(0x801, 12, &ll);
    const char *ip = write_file("i.idx", im, li), *lp = write_file("l.idx", lb, ll);
    const char *gi = write_gz("i.idx.gz", im, li), *gl = write_gz("l.idx.gz", lb, ll);
    data_images d;
    ok(data_images_load(&d, ip, lp, 10, 0, NULL, err, sizeof err));
    check_images(&d, 12, 3, 4);
    assert_int_equal(d.classes, 10);
    assert_string_equal(d.source, ip);
    data_images_free(&d);
    ok(data_images_load(&d, gi, gl, 0, 0, NULL, err, sizeof err));
    check_images(&d, 12, 3, 4);
    assert_int_equal(d.classes, 10); /* max label + 1 */
    data_images_free(&d);
    /* plain images, gzip'd labels; subset */
    ok(data_images_load(&d, ip, gl, 10, 5, NULL, err, sizeof err));
    check_images(&d, 5, 3, 4);
    data_images_free(&d);
    ok(data_images_load(&d, gi, lp, 10, 100, NULL, err, sizeof err));
    check_images(&d, 12, 3, 4);
    data_images_free(&d);
    /* concatenated gzip members read on */
    gzFile g = gzopen(tmp("cat.gz"), "wb");
    assert_int_equal(gzwrite(g, im, 100), 100);
    assert_int_equal(gzclose(g), Z_OK);
    const char *gb = write_gz("cat2.gz", im + 100, li - 100);
    size_t n1, n2;
    unsigned char *b1 = read_all(tmp("cat.gz"), &n1), *b2 = read_all(gb, &n2);
    unsigned char *cat = malloc(n1 + n2);
    memcpy(cat, b1, n1);
    memcpy(cat + n1, b2, n2);
    const char *cp = write_file("cat.idx.gz", cat, n1 + n2);
    ok(data_images_load(&d, cp, lp, 10, 0, NULL, err, sizeof err));
    check_images(&d, 12, 3, 4);
    data_images_free(&d);
    free(b1);
    free(b2);
    free(cat);
    free(im);
    free(lb);
}

static void test_idx_invalid(void **state)
{
    (void)state;
    size_t li, ll;
    unsigned char *im = idx_images(0x803, 12, 3, 4, &li);
    unsigned char *lb = idx_labels(0x801, 12, &ll);
    const char *ip = write_file("i.idx", im, li), *lp = write_file("l.idx", lb, ll);
    const char *gi = write_gz("i.gz", im, li);
    data_images d;
    const char *p;

    /* swapped files: each magic named */
    expect_fail(data_images_load(&d, lp, lp, 10, 0, NULL, err, sizeof err), lp, "bad magic 0x00000801",
                "expected 0x00000803 for IDX ubyte images", "labels file");
    expect_fail(data_images_load(&d, ip, ip, 10, 0, NULL, err, sizeof err), ip, "bad magic 0x00000803",
                "expected 0x00000801 for IDX ubyte labels");
    assert_null(d.u8);
    size_t lm;
    unsigned char *m = idx_images(0x0d03, 12, 3, 4, &lm);
    p = write_file("m.idx", m, lm);
    expect_fail(data_images_load(&d, p, lp, 10, 0, NULL, err, sizeof err), p, "bad magic 0x00000d03");
    free(m);
    m = idx_images(0x803, 12, 0, 4, &lm);
    p = write_file("zero.idx", m, lm);
    expect_fail(data_images_load(&d, p, lp, 10, 0, NULL, err, sizeof err), p, "dimension 1 (rows) is 0");
    free(m);
    /* truncated and trailing, plain and gzip'd */
    p = write_file("cut.idx", im, li - 3);
    expect_fail(data_images_load(&d, p, lp, 10, 0, NULL, err, sizeof err), p, "truncated body",
                "12×3×4 images", "160 bytes", "it is 157 bytes");
    p = write_gz("cut.gz", im, li - 3);
    expect_fail(data_images_load(&d, p, lp, 10, 0, NULL, err, sizeof err), p, "truncated body",
                "144 bytes should follow the 16-byte header, but 141 do (decompressed)");
    unsigned char *more = calloc(1, li + 5);
    memcpy(more, im, li);
    p = write_file("more.idx", more, li + 5);
    expect_fail(data_images_load(&d, p, lp, 10, 0, NULL, err, sizeof err), p, "trailing bytes",
                "but 149 do");
    p = write_gz("more.gz", more, li + 5);
    expect_fail(data_images_load(&d, p, lp, 10, 0, NULL, err, sizeof err), p, "trailing bytes",
                "149 do (decompressed)");
    free(more);
    p = write_file("hdr.idx", im, 10);
    expect_fail(data_images_load(&d, p, lp, 10, 0, NULL, err, sizeof err), p, "truncated IDX header");
    p = write_file("tiny.idx", im, 2);
    expect_fail(data_images_load(&d, p, lp, 10, 0, NULL, err, sizeof err), p, "too short", "2 bytes");
    /* labels: out of range, N mismatch */
    lb[8 + 7] = 10;
    p = write_file("l10.idx", lb, ll);
    expect_fail(data_images_load(&d, ip, p, 10, 0, NULL, err, sizeof err), p,
                "label 10 at record 7 (byte offset 15) is out of range for 10 classes");
    lb[8 + 7] = 7;
    unsigned char *l11 = idx_labels(0x801, 11, &ll);
    p = write_file("l11.idx", l11, ll);
    expect_fail(data_images_load(&d, ip, p, 10, 0, NULL, err, sizeof err), p, "11 labels", ip,
                "12 images");
    /* a subset does not hide a mismatch */
    expect_fail(data_images_load(&d, ip, p, 10, 5, NULL, err, sizeof err), p, "11 labels");
    free(l11);
    /* corrupt gzip: flip bytes in the deflate data; cut the stream; append garbage */
    size_t gl;
    unsigned char *gz = read_all(gi, &gl);
    unsigned char *bad = malloc(gl + 8);
    memcpy(bad, gz, gl);
    for (size_t k = 12; k < gl - 8; k += 3)
        bad[k] ^= 0x5a;
    p = write_file("corrupt.gz", bad, gl);
    expect_fail(data_images_load(&d, p, lp, 10, 0, NULL, err, sizeof err), p, "gzip");
    memcpy(bad, gz, gl);
    bad[gl - 4] ^= 1; /* ISIZE, the last 4 bytes */
    p = write_file("isize.gz", bad, gl);
    expect_fail(data_images_load(&d, p, lp, 10, 0, NULL, err, sizeof err), p, "corrupt gzip data",
                "incorrect length check");
    memcpy(bad, gz, gl);
    bad[gl - 8] ^= 1; /* CRC-32, the 4 before */
    p = write_file("crc.gz", bad, gl);
    expect_fail(data_images_load(&d, p, lp, 10, 0, NULL, err, sizeof err), p, "corrupt gzip data",
                "incorrect data check");
    p = write_file("trunc.gz", gz, gl / 2);
    expect_fail(data_images_load(&d, p, lp, 10, 0, NULL, err, sizeof err), p, "truncated gzip stream");
    p = write_file("trunc2.gz", gz, gl - 4);
    expect_fail(data_images_load(&d, p, lp, 10, 0, NULL, err, sizeof err), p, "truncated gzip stream");
    memcpy(bad, gz, gl);
    memcpy(bad + gl, "GARBAGE!", 8);
    p = write_file("garbage.gz", bad, gl + 8);
    expect_fail(data_images_load(&d, p, lp, 10, 0, NULL, err, sizeof err), p,
                "8 bytes of trailing garbage after the gzip stream");
    p = write_file("hdronly.gz", gz, 2);
    expect_fail(data_images_load(&d, p, lp, 10, 0, NULL, err, sizeof err), p, "gzip");
    free(bad);
    free(gz);
    /* not a regular file */
    expect_fail(data_images_load(&d, dir, lp, 10, 0, NULL, err, sizeof err), dir, "directory");
    free(im);
    free(lb);
}

/* ---- .npy images ------------------------------------------------------------- */

static void test_npy_images(void **state)
{
    (void)state;
    float x[4 * 6];
    for (int i = 0; i < 24; i++)
        x[i] = (float)i * 0.5f - 3;
    int32_t y[4] = {3, 0, 2, 1};
    const char *xp = write_npy("x.npy", 
                               "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 6), }",
                               x, sizeof x);
    const char *yp = write_npy("y.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (4,), }",
                               y, sizeof y);
    data_images d;
    ok(data_images_load(&d, xp, yp, 4, 0, NULL, err, sizeof err));
    assert_int_equal(d.n, 4);
    assert_int_equal(d.dim, 6);
    assert_non_null(d.f32);
    float out[6];
    data_images_get(&d, 2, out);
    assert_memory_equal(out, x + 12, sizeof out); /* f32 passes through */
    assert_int_equal(d.labels[3], 1);
    data_images_free(&d);
    ok(data_images_load(&d, xp, yp, 0, 2, NULL, err, sizeof err));
    assert_int_equal(d.n, 2);
    assert_int_equal(d.classes, 4);
    data_images_free(&d);
    expect_fail(data_images_load(&d, xp, yp, 3, 0, NULL, err, sizeof err), yp, "label 3 at record 0",
                "3 classes");
    x[7] = NAN;
    const char *np = write_npy("nan.npy", 
                               "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 6), }",
                               x, sizeof x);
    expect_fail(data_images_load(&d, np, yp, 4, 0, NULL, err, sizeof err), np, "index 7", "image 1",
                "not finite");
    /* u8 (N, r, c) images with IDX labels */
    size_t li, ll;
    unsigned char *im = idx_images(0x803, 3, 2, 2, &li);
    unsigned char *lb = idx_labels(0x801, 3, &ll);
    const char *up = write_npy("u8.npy", 
                               "{'descr': '|u1', 'fortran_order': False, 'shape': (3, 2, 2), }",
                               im + 16, 12);
    const char *lp = write_gz("l.gz", lb, ll);
    ok(data_images_load(&d, up, lp, 10, 0, NULL, err, sizeof err));
    check_images(&d, 3, 2, 2);
    data_images_free(&d);
    expect_fail(data_images_load(&d, up, yp, 10, 0, NULL, err, sizeof err), yp, "4 labels", "3 images");
    expect_fail(data_images_load(&d, yp, yp, 10, 0, NULL, err, sizeof err), yp, "image .npy", "1-d");
    expect_fail(data_images_load(&d, up, xp, 10, 0, NULL, err, sizeof err), xp, "label .npy", "'<f4'");
    free(im);
    free(lb);
}

/* ---- streams ----------------------------------------------------------------- */

static void fake_tokens(data_tokens *t, size_t n)
{
    memset(t, 0, sizeof *t);
    t->tok = malloc(n * sizeof *t->tok);
    assert_non_null(t->tok);
    for (size_t i = 0; i < n; i++)
        t->tok[i] = (uint16_t)(i % 65536);
    t->n = n;
    snprintf(t->source, sizeof t->source, "fake.bin");
}

static void fake_images(data_images *d, size_t n)
{
    memset(d, 0, sizeof *d);
    d->n = n;
    d->rows = 1;
    d->cols = 3;
    d->dim = 3;
    d->classes = 10;
    d->u8 = malloc(n * 3);
    d->labels = malloc(n * sizeof *d->labels);
    for (size_t i = 0; i < n; i++) {
        d->u8[3 * i] = (uint8_t)i;
        d->u8[3 * i + 1] = (uint8_t)(i >> 8);
        d->u8[3 * i + 2] = 0;
        d->labels[i] = (int32_t)(i % 10);
    }
    snprintf(d->source, sizeof d->source, "fake.idx");
}

enum { T = 8 };

/* Draw `steps` batches of `batch` samples, split per `split` (summing to batch). */
static void draw_tokens(data_stream *s, int steps, const int *split, int nsplit, int32_t *in,
                        int32_t *tgt)
{
    size_t at = 0;
    for (int k = 0; k < steps; k++)
        for (int j = 0; j < nsplit; j++) {
            data_stream_next_tokens(s, (size_t)split[j], in + at * T, tgt + at * T);
            at += (size_t)split[j];
        }
}

static void test_stream_tokens(void **state)
{
    (void)state;
    data_tokens t;
    fake_tokens(&t, 1001); /* 1000 / 8 = 125 windows; slack 0, so 124 with shifts */
    data_stream a, b;
    ok(data_stream_tokens(&a, &t, T, 42, NULL, err, sizeof err));
    ok(data_stream_tokens(&b, &t, T, 42, NULL, err, sizeof err));
    uint64_t W = data_stream_epoch_size(&a);
    assert_int_equal(W, 124);
    enum { STEPS = 40, B = 16 };
    static int32_t in1[STEPS * B * T], tg1[STEPS * B * T], in2[STEPS * B * T], tg2[STEPS * B * T];
    int whole[] = {16}, uneven[] = {5, 5, 5, 1}, ones[16];
    for (int i = 0; i < 16; i++)
        ones[i] = 1;
    draw_tokens(&a, STEPS, whole, 1, in1, tg1);
    draw_tokens(&b, STEPS, uneven, 4, in2, tg2);
    assert_memory_equal(in1, in2, sizeof in1);
    assert_memory_equal(tg1, tg2, sizeof tg1);
    uint64_t ea, ia, eb, ib;
    data_stream_state(&a, &ea, &ia);
    data_stream_state(&b, &eb, &ib);
    assert_int_equal(ea, eb);
    assert_int_equal(ia, ib);
    assert_int_equal(ea * W + ia, STEPS * B); /* 640 samples = 5 epochs + 20 */
    assert_int_equal(ea, 5);
    /* each sample: targets are inputs shifted by one, windows start at
     * offset + k*T; each epoch uses every window once */
    for (int e = 0; e < 5; e++) {
        char seen[124] = {0};
        long off = -1;
        for (uint64_t i = 0; i < W; i++) {
            const int32_t *x = in1 + (e * W + i) * T, *y = tg1 + (e * W + i) * T;
            for (int j = 0; j < T; j++)
                assert_int_equal(y[j], x[j] + 1);
            if (off < 0)
                off = x[0] % T;
            assert_int_equal(x[0] % T, off);
            assert_true(off < T);
            long k = (x[0] - off) / T;
            assert_true(k >= 0 && k < 124);
            assert_false(seen[k]);
            seen[k] = 1;
        }
    }
    /* per-sample draws equal too */
    data_stream c;
    ok(data_stream_tokens(&c, &t, T, 42, NULL, err, sizeof err));
    static int32_t in3[STEPS * B * T], tg3[STEPS * B * T];
    draw_tokens(&c, STEPS, ones, 16, in3, tg3);
    assert_memory_equal(in1, in3, sizeof in1);
    /* another seed, another order */
    data_stream_free(&c);
    ok(data_stream_tokens(&c, &t, T, 43, NULL, err, sizeof err));
    draw_tokens(&c, 1, whole, 1, in3, tg3);
    assert_true(memcmp(in1, in3, B * T * sizeof *in1) != 0);
    data_stream_free(&c);
    data_stream_free(&a);
    data_stream_free(&b);
    /* too short */
    t.n = 8;
    expect_fail(data_stream_tokens(&a, &t, T, 1, NULL, err, sizeof err), "fake.bin",
                "8 tokens are too few for context 8");
    t.n = 9; /* exactly one window, no shift */
    ok(data_stream_tokens(&a, &t, T, 1, NULL, err, sizeof err));
    assert_int_equal(data_stream_epoch_size(&a), 1);
    int32_t x[T], y[T];
    for (int i = 0; i < 3; i++) {
        data_stream_next_tokens(&a, 1, x, y);
        assert_int_equal(x[0], 0);
        assert_int_equal(y[T - 1], 8);
    }
    data_stream_free(&a);
    data_tokens_free(&t);
}

static void test_stream_resume(void **state)
{
    (void)state;
    data_tokens t;
    fake_tokens(&t, 500);
    data_stream a, b;
    ok(data_stream_tokens(&a, &t, T, 7, NULL, err, sizeof err));
    uint64_t W = data_stream_epoch_size(&a);
    int32_t x[5 * T], y[5 * T], x2[5 * T], y2[5 * T];
    /* save at several points, including just before an epoch turns */
    for (int round = 0; round < 40; round++) {
        data_stream_next_tokens(&a, (size_t)(round % 5) + 1, x, y);
        uint64_t e, i;
        data_stream_state(&a, &e, &i);
        assert_true(i < W);
        ok(data_stream_tokens(&b, &t, T, 7, NULL, err, sizeof err));
        ok(data_stream_set_state(&b, e, i, err, sizeof err));
        for (int k = 0; k < 3; k++) {
            data_stream_next_tokens(&a, 5, x, y);
            data_stream_next_tokens(&b, 5, x2, y2);
            assert_memory_equal(x, x2, sizeof x);
            assert_memory_equal(y, y2, sizeof y);
        }
        data_stream_free(&b);
    }
    expect_fail(data_stream_set_state(&a, 0, W, err, sizeof err), "fake.bin", "past the epoch");
    /* a restore to an earlier epoch replays it */
    ok(data_stream_set_state(&a, 0, 0, err, sizeof err));
    ok(data_stream_tokens(&b, &t, T, 7, NULL, err, sizeof err));
    data_stream_next_tokens(&a, 5, x, y);
    data_stream_next_tokens(&b, 5, x2, y2);
    assert_memory_equal(x, x2, sizeof x);
    data_stream_free(&a);
    data_stream_free(&b);
    data_tokens_free(&t);
}

static void test_stream_images(void **state)
{
    (void)state;
    data_images d;
    fake_images(&d, 37);
    data_stream a, b;
    ok(data_stream_images(&a, &d, 9, NULL, err, sizeof err));
    ok(data_stream_images(&b, &d, 9, NULL, err, sizeof err));
    assert_int_equal(data_stream_epoch_size(&a), 37);
    enum { N = 16 * 10 };
    static float xa[N * 3], xb[N * 3];
    static int32_t ya[N], yb[N];
    size_t at = 0;
    for (int s = 0; s < 10; s++) {
        data_stream_next_images(&a, 16, xa + at * 3, ya + at);
        int split[] = {5, 5, 5, 1};
        for (int j = 0; j < 4; j++) {
            data_stream_next_images(&b, (size_t)split[j], xb + at * 3, yb + at);
            at += (size_t)split[j];
        }
    }
    assert_memory_equal(xa, xb, sizeof xa);
    assert_memory_equal(ya, yb, sizeof ya);
    /* every epoch is a permutation; labels travel with their images */
    for (int e = 0; e < 4; e++) {
        char seen[37] = {0};
        int same_place = 0;
        for (int i = 0; i < 37; i++) {
            int k = (int)(xa[(e * 37 + i) * 3] * 255.0f + 0.5f);
            assert_true(k >= 0 && k < 37);
            assert_false(seen[k]);
            seen[k] = 1;
            assert_int_equal(ya[e * 37 + i], k % 10);
            same_place += k == i;
        }
        assert_true(same_place < 37); /* shuffled */
    }
    /* epochs differ */
    assert_true(memcmp(ya, ya + 37, 37 * sizeof *ya) != 0);
    uint64_t e, i;
    data_stream_state(&a, &e, &i);
    assert_int_equal(e * 37 + i, N);
    data_stream_free(&a);
    data_stream_free(&b);
    data_images_free(&d);
}

static void test_eval_and_split(void **state)
{
    (void)state;
    data_tokens t, v;
    fake_tokens(&t, 1000);
    expect_fail(data_tokens_split(&t, &v, 1.0, NULL, err, sizeof err), "fake.bin", "fraction 1");
    expect_fail(data_tokens_split(&t, &v, 0.0001, NULL, err, sizeof err), "fake.bin", "too few");
    ok(data_tokens_split(&t, &v, 0.1, NULL, err, sizeof err));
    assert_int_equal(t.n, 900);
    assert_int_equal(v.n, 100);
    assert_int_equal(data_token(&v, 0), 900);
    assert_int_equal(v.max_token, 999);
    assert_int_equal(t.max_token, 899);
    assert_non_null(strstr(v.source, "fake.bin (validation: last 100 tokens)"));
    data_eval e;
    ok(data_eval_tokens(&e, &v, T, err, sizeof err));
    assert_int_equal(e.size, 12); /* (100 - 1) / 8 */
    int32_t x[5 * T], y[5 * T];
    for (int pass = 0; pass < 2; pass++) {
        size_t seen = 0, got;
        while ((got = data_eval_next_tokens(&e, 5, x, y)) > 0) {
            for (size_t i = 0; i < got; i++) {
                assert_int_equal(x[i * T], 900 + (seen + i) * T);
                for (int j = 0; j < T; j++)
                    assert_int_equal(y[i * T + j], x[i * T + j] + 1);
            }
            seen += got;
        }
        assert_int_equal(seen, 12);
        data_eval_reset(&e);
    }
    v.n = 8;
    expect_fail(data_eval_tokens(&e, &v, T, err, sizeof err), "fake.bin (validation",
                "too few for context 8");
    data_tokens_free(&v);
    data_tokens_free(&t);

    data_images d;
    fake_images(&d, 11);
    data_eval_images(&e, &d);
    float xi[4 * 3];
    int32_t yi[4];
    size_t seen = 0, got;
    while ((got = data_eval_next_images(&e, 4, xi, yi)) > 0) {
        for (size_t i = 0; i < got; i++) {
            assert_true(xi[i * 3] == (float)(seen + i) / 255.0f);
            assert_int_equal(yi[i], (seen + i) % 10);
        }
        seen += got;
    }
    assert_int_equal(seen, 11);
    assert_int_equal(data_eval_next_images(&e, 4, xi, yi), 0);
    data_eval_reset(&e);
    assert_int_equal(data_eval_next_images(&e, 4, xi, yi), 4);
    data_images_free(&d);
}

static void test_format_parse(void **state)
{
    (void)state;
    data_format f;
    assert_int_equal(data_format_parse("llmc", &f), 0);
    assert_int_equal(f, DATA_FMT_LLMC);
    assert_int_equal(data_format_parse("auto", &f), 0);
    assert_int_equal(f, DATA_FMT_AUTO);
    assert_int_equal(data_format_parse("gzip", &f), -1);
}

/* ---- real data --------------------------------------------------------------- */

#define FORTUNES "/usr/share/games/fortunes"
#define FASHION "/usr/share/datasets/fashion-mnist"

static void test_real_fortunes(void **state)
{
    (void)state;
    struct stat st;
    if (stat(FORTUNES, &st) != 0) {
        print_message("skipped: %s absent (Debian package fortunes)\n", FORTUNES);
        skip();
    }
    /* the expected size, by the documented rule, counted independently */
    size_t want = 0;
    DIR *d = opendir(FORTUNES);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (e->d_name[0] == '.' || (l > 4 && !strcmp(e->d_name + l - 4, ".dat")) ||
            (l > 3 && !strcmp(e->d_name + l - 3, ".u8")))
            continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", FORTUNES, e->d_name);
        if (stat(p, &st) == 0 && S_ISREG(st.st_mode))
            want += (size_t)st.st_size;
    }
    closedir(d);
    data_tokens t;
    ok(data_tokens_load(&t, FORTUNES, DATA_FMT_AUTO, 256, NULL, err, sizeof err));
    assert_int_equal(t.n, want);
    assert_true(t.n > 2000000); /* ~2.5 MB */
    print_message("fortunes: %zu byte tokens\n", t.n);
    data_tokens v;
    ok(data_tokens_split(&t, &v, 0.1, NULL, err, sizeof err));
    data_stream s;
    ok(data_stream_tokens(&s, &t, 256, 1, NULL, err, sizeof err));
    assert_int_equal(data_stream_epoch_size(&s), (t.n - 1) / 256 - ((t.n - 1) % 256 < 255));
    static int32_t x[16 * 256], y[16 * 256];
    data_stream_next_tokens(&s, 16, x, y);
    data_stream_free(&s);
    data_tokens_free(&v);
    data_tokens_free(&t);
}

static void test_real_fashion(void **state)
{
    (void)state;
    struct stat st;
    if (stat(FASHION "/train-images-idx3-ubyte.gz", &st) != 0) {
        print_message("skipped: %s absent (Debian package dataset-fashion-mnist)\n", FASHION);
        skip();
    }
    data_images tr, te;
    ok(data_images_load(&tr, FASHION "/train-images-idx3-ubyte.gz",
                        FASHION "/train-labels-idx1-ubyte.gz", 10, 0, NULL, err, sizeof err));
    assert_int_equal(tr.n, 60000);
    assert_int_equal(tr.rows, 28);
    assert_int_equal(tr.cols, 28);
    assert_int_equal(tr.classes, 10);
    long count[10] = {0};
    for (size_t i = 0; i < tr.n; i++)
        count[tr.labels[i]]++;
    for (int c = 0; c < 10; c++)
        assert_int_equal(count[c], 6000); /* fashion-mnist is balanced */
    ok(data_images_load(&te, FASHION "/t10k-images-idx3-ubyte.gz",
                        FASHION "/t10k-labels-idx1-ubyte.gz", 10, 0, NULL, err, sizeof err));
    assert_int_equal(te.n, 10000);
    assert_int_equal(te.dim, 784);
    float x[784];
    data_images_get(&te, 0, x);
    float lo = 1, hi = 0;
    for (int k = 0; k < 784; k++) {
        lo = x[k] < lo ? x[k] : lo;
        hi = x[k] > hi ? x[k] : hi;
    }
    assert_true(lo >= 0 && hi <= 1 && hi > 0.5f);
    data_images_free(&te);
    /* the subset keeps the first N */
    data_images sub;
    ok(data_images_load(&sub, FASHION "/train-images-idx3-ubyte.gz",
                        FASHION "/train-labels-idx1-ubyte.gz", 10, 1000, NULL, err, sizeof err));
    assert_int_equal(sub.n, 1000);
    assert_memory_equal(sub.u8, tr.u8, 1000 * 784);
    assert_memory_equal(sub.labels, tr.labels, 1000 * sizeof *sub.labels);
    data_images_free(&sub);
    data_images_free(&tr);
    /* labels and images swapped */
    expect_fail(data_images_load(&tr, FASHION "/t10k-labels-idx1-ubyte.gz",
                                 FASHION "/t10k-images-idx3-ubyte.gz", 10, 0, NULL, err, sizeof err),
                FASHION "/t10k-labels-idx1-ubyte.gz", "bad magic 0x00000801");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_file),       cmocka_unit_test(test_text_dir),
        cmocka_unit_test(test_llmc_valid),      cmocka_unit_test(test_llmc_invalid),
        cmocka_unit_test(test_npy_tokens),      cmocka_unit_test(test_npy_invalid),
        cmocka_unit_test(test_idx_valid),       cmocka_unit_test(test_idx_invalid),
        cmocka_unit_test(test_npy_images),      cmocka_unit_test(test_stream_tokens),
        cmocka_unit_test(test_stream_resume),   cmocka_unit_test(test_stream_images),
        cmocka_unit_test(test_eval_and_split),  cmocka_unit_test(test_format_parse),
        cmocka_unit_test(test_real_fortunes),   cmocka_unit_test(test_real_fashion),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
