/* test_safetensors.c — safetensors writer and strict reader: round trips of
 * every dtype, metadata, empty and 0-d tensors; every malformed header is
 * refused with a message naming the file and the tensor or field; the atomic
 * write leaves an existing file intact whatever stage fails. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "tmpdir.h"

/* ---- helpers ---------------------------------------------------------------- */

static int setup_dir(void **state)
{
    (void)state;
    return td_make("st");
}

static int teardown_dir(void **state)
{
    (void)state;
    return td_remove();
}

static const char *tpath(const char *name)
{
    static char p[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", td_path, name);
    return p[k];
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, n), (ssize_t)n);
    close(fd);
}

static unsigned char *read_bytes(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* A file from a raw header string and `data_len` data bytes (pattern). */
static void write_raw(const char *path, const char *header, size_t hlen, size_t data_len)
{
    size_t n = 8 + hlen + data_len;
    unsigned char *b = malloc(n);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    memcpy(b + 8, header, hlen);
    for (size_t i = 0; i < data_len; i++)
        b[8 + hlen + i] = (unsigned char)(i * 7 + 1);
    write_bytes(path, b, n);
    free(b);
}

static size_t count_tmp_files(void)
{
    size_t n = 0;
    DIR *d = opendir(td_path);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp."))
            n++;
    closedir(d);
    return n;
}

/* ---- dtypes ------------------------------------------------------------------ */

static void test_dtype_table(void **state)
{
    (void)state;
    static const char *const names[] = {"BOOL", "U8",  "I8",  "F8_E5M2", "F8_E4M3",
                                        "U16",  "I16", "F16", "BF16",    "U32",
                                        "I32",  "F32", "U64", "I64",     "F64"};
    static const size_t sizes[] = {1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8};
    assert_int_equal(sizeof names / sizeof *names, ST_DTYPE_COUNT);
    for (int i = 0; i < ST_DTYPE_COUNT; i++) {
        st_dtype d;
        assert_int_equal(st_dtype_from_name(names[i], &d), 0);
        assert_int_equal(d, i);
        assert_string_equal(st_dtype_name(d), names[i]);
        assert_int_equal(st_dtype_size(d), sizes[i]);
    }
    st_dtype d;
    assert_int_equal(st_dtype_from_name("f32", &d), -1);
    assert_int_equal(st_dtype_from_name("F4", &d), -1);
    assert_null(st_dtype_name(ST_DTYPE_COUNT));
    assert_int_equal(st_dtype_size(ST_DTYPE_COUNT), 0);
}

/* ---- round trip ------------------------------------------------------------- */

typedef struct {
    char name[64];
    st_dtype dtype;
    int ndim;
    uint64_t shape[ST_MAX_DIMS];
    unsigned char *data;
    size_t bytes;
} ref_tensor;

static void check_file_against(const char *path, const ref_tensor *ref, size_t nref)
{
    st_file *f;
    char err[512];
    if (st_open(path, &f, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(st_count(f), nref);
    assert_int_equal(st_data_offset(f) % 8, 0);
    uint64_t pos = 0;
    for (size_t i = 0; i < st_count(f); i++) {
        /* header order is data order, contiguous */
        const st_tensor *t = st_tensor_at(f, i);
        assert_int_equal(t->begin, pos);
        pos = t->end;
        /* aligned to the element size */
        assert_int_equal(t->begin % st_dtype_size(t->dtype), 0);
    }
    for (size_t i = 0; i < nref; i++) {
        const ref_tensor *r = &ref[i];
        const st_tensor *t = st_find(f, r->name);
        if (!t)
            fail_msg("tensor %s missing", r->name);
        assert_string_equal(t->name, r->name);
        assert_int_equal(t->dtype, r->dtype);
        assert_int_equal(t->ndim, r->ndim);
        for (int d = 0; d < r->ndim; d++)
            assert_int_equal(t->shape[d], r->shape[d]);
        assert_int_equal(t->bytes, r->bytes);
        unsigned char *buf = malloc(r->bytes + 1);
        if (st_read(f, r->name, buf, r->bytes, err, sizeof err) != 0)
            fail_msg("%s", err);
        if (r->bytes)
            assert_memory_equal(buf, r->data, r->bytes);
        free(buf);
        const void *p = st_data(f, t, err, sizeof err);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % st_dtype_size(t->dtype), 0);
        if (r->bytes)
            assert_memory_equal(p, r->data, r->bytes);
        assert_non_null(st_expect(f, r->name, r->dtype, r->ndim, r->shape, err, sizeof err));
    }
    assert_null(st_find(f, "nope"));
    st_close(f);
}

static void test_round_trip_all_dtypes(void **state)
{
    (void)state;
    ref_tensor ref[ST_DTYPE_COUNT + 4];
    size_t n = 0;
    /* Every dtype, odd element counts so that naive packing would misalign. */
    for (int d = 0; d < ST_DTYPE_COUNT; d++) {
        ref_tensor *r = &ref[n++];
        snprintf(r->name, sizeof r->name, "t.%s", st_dtype_name((st_dtype)d));
        r->dtype = (st_dtype)d;
        r->ndim = 2;
        r->shape[0] = 3;
        r->shape[1] = (uint64_t)(d % 3 + 1);
        r->bytes = (size_t)(r->shape[0] * r->shape[1]) * st_dtype_size(r->dtype);
        r->data = malloc(r->bytes);
        for (size_t i = 0; i < r->bytes; i++)
            r->data[i] = (unsigned char)(d * 31 + i * 13 + 5);
    }
    /* 0-d scalar, empty tensors, and a 8-d tensor. */
    float scalar = 3.25f;
    ref[n] = (ref_tensor){.name = "scalar", .dtype = ST_F32, .ndim = 0, .bytes = 4};
    ref[n].data = malloc(4);
    memcpy(ref[n].data, &scalar, 4);
    n++;
    ref[n] = (ref_tensor){.name = "empty", .dtype = ST_F32, .ndim = 1, .shape = {0}};
    n++;
    ref[n] = (ref_tensor){.name = "empty2", .dtype = ST_BF16, .ndim = 2, .shape = {3, 0}};
    n++;
    ref[n] = (ref_tensor){.name = "eight", .dtype = ST_I16, .ndim = 8,
                          .shape = {1, 2, 1, 2, 1, 2, 1, 3}, .bytes = 24 * 2};
    ref[n].data = malloc(ref[n].bytes);
    for (size_t i = 0; i < ref[n].bytes; i++)
        ref[n].data[i] = (unsigned char)i;
    n++;

    st_writer *w = st_writer_new();
    char err[512];
    for (size_t i = 0; i < n; i++)
        assert_int_equal(st_writer_add(w, ref[i].name, ref[i].dtype, ref[i].ndim, ref[i].shape,
                                       ref[i].data, ref[i].bytes, err, sizeof err),
                         0);
    assert_int_equal(st_writer_meta(w, "step", "1234", err, sizeof err), 0);
    assert_int_equal(st_writer_meta(w, "format", "pt", err, sizeof err), 0);
    assert_int_equal(st_writer_meta(w, "odd \"key\"\\", "line\nbreak\ttab\x01 ünï€😀", err,
                                    sizeof err),
                     0);
    assert_int_equal(st_writer_meta(w, "empty", "", err, sizeof err), 0);
    const char *path = tpath("rt.safetensors");
    if (st_write_atomic(w, path, err, sizeof err) != 0)
        fail_msg("%s", err);
    check_file_against(path, ref, n);

    st_file *f;
    assert_int_equal(st_open(path, &f, err, sizeof err), 0);
    assert_int_equal(st_meta_count(f), 4);
    assert_string_equal(st_meta(f, "step"), "1234");
    assert_string_equal(st_meta(f, "format"), "pt");
    assert_string_equal(st_meta(f, "odd \"key\"\\"), "line\nbreak\ttab\x01 ünï€😀");
    assert_string_equal(st_meta(f, "empty"), "");
    assert_null(st_meta(f, "missing"));
    const char *k, *v;
    st_meta_at(f, 0, &k, &v);
    assert_string_equal(k, "step");
    assert_string_equal(v, "1234");
    st_close(f);

    /* st_write_fd produces the very same bytes. */
    int mfd = memfd_create("st", 0);
    assert_true(mfd >= 0);
    assert_int_equal(st_write_fd(w, mfd, "memfd", err, sizeof err), 0);
    size_t flen;
    unsigned char *fb = read_bytes(path, &flen);
    assert_int_equal(lseek(mfd, 0, SEEK_END), (off_t)flen);
    unsigned char *mb = malloc(flen);
    assert_int_equal(pread(mfd, mb, flen, 0), (ssize_t)flen);
    assert_memory_equal(mb, fb, flen);
    /* the header is space-padded to a multiple of 8 and ends in '}' + spaces */
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | fb[i];
    assert_int_equal((8 + hl) % 8, 0);
    size_t e = 8 + (size_t)hl;
    while (fb[e - 1] == ' ')
        e--;
    assert_int_equal(fb[e - 1], '}');
    free(mb);
    free(fb);
    close(mfd);

    st_writer_free(w);
    for (size_t i = 0; i < n; i++)
        free(ref[i].data);
}

static void test_round_trip_no_tensors(void **state)
{
    (void)state;
    char err[512];
    st_writer *w = st_writer_new();
    const char *path = tpath("none.safetensors");
    assert_int_equal(st_write_atomic(w, path, err, sizeof err), 0);
    st_file *f;
    assert_int_equal(st_open(path, &f, err, sizeof err), 0);
    assert_int_equal(st_count(f), 0);
    assert_int_equal(st_meta_count(f), 0);
    assert_null(st_tensor_at(f, 0));
    st_close(f);
    size_t n;
    unsigned char *b = read_bytes(path, &n);
    assert_int_equal(n, 16);
    assert_memory_equal(b + 8, "{}      ", 8);
    free(b);
    st_writer_free(w);
}

static void test_many_tensors_lookup(void **state)
{
    (void)state;
    enum { N = 2000 };
    char err[512];
    st_writer *w = st_writer_new();
    static float vals[N];
    char name[64];
    for (int i = 0; i < N; i++) {
        vals[i] = (float)i * 0.5f;
        snprintf(name, sizeof name, "h.%d.mlp.c_fc.weight", (i * 7919) % N);
        assert_int_equal(st_writer_add(w, name, ST_F32, 1, (uint64_t[]){1}, &vals[i], 4, err,
                                       sizeof err),
                         0);
    }
    const char *path = tpath("many.safetensors");
    assert_int_equal(st_write_atomic(w, path, err, sizeof err), 0);
    st_writer_free(w);
    st_file *f;
    assert_int_equal(st_open(path, &f, err, sizeof err), 0);
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "h.%d.mlp.c_fc.weight", (i * 7919) % N);
        float v;
        assert_int_equal(st_read(f, name, &v, 4, err, sizeof err), 0);
        assert_true(v == vals[i]);
    }
    st_close(f);
}

/* ---- writer errors ----------------------------------------------------------- */

static void test_writer_rejects_bad_tensors(void **state)
{
    (void)state;
    char err[512];
    float x[12] = {0};
    struct {
        const char *name;
        st_dtype dt;
        int ndim;
        uint64_t shape[9];
        const void *data;
        size_t bytes;
        const char *frag;
    } cases[] = {
        {"w", ST_F32, 2, {3, 4}, x, 44, "tensor 'w': 44 bytes given for shape [3,4] of F32 (48 bytes)"},
        {"", ST_F32, 1, {1}, x, 4, "empty tensor name"},
        {"__metadata__", ST_F32, 1, {1}, x, 4, "reserved"},
        {"bad\xff", ST_F32, 1, {1}, x, 4, "'bad\\xff': name is not valid UTF-8"},
        {"w", ST_F32, 9, {1, 1, 1, 1, 1, 1, 1, 1, 1}, x, 4, "9 dimensions"},
        {"w", ST_F32, -1, {0}, x, 4, "-1 dimensions"},
        {"w", ST_DTYPE_COUNT, 1, {1}, x, 4, "invalid dtype"},
        {"w", ST_F32, 1, {3}, NULL, 12, "no data"},
        {"w", ST_F32, 3, {1u << 31, 1u << 31, 1u << 31}, x, 4, "overflows"},
        {"w", ST_F32, 2, {1ull << 63, 0}, x, 0, "dimension 9223372036854775808 exceeds"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        st_writer *w = st_writer_new();
        err[0] = 0;
        assert_int_equal(st_writer_add(w, cases[i].name, cases[i].dt, cases[i].ndim,
                                       cases[i].shape, cases[i].data, cases[i].bytes, err,
                                       sizeof err),
                         -1);
        if (!strstr(err, cases[i].frag))
            fail_msg("case %zu: '%s' lacks '%s'", i, err, cases[i].frag);
        /* The error sticks: writing refuses, names the file, creates nothing. */
        assert_int_equal(st_writer_add(w, "ok", ST_F32, 1, (uint64_t[]){1}, x, 4, err,
                                       sizeof err),
                         0);
        const char *path = tpath("never.safetensors");
        assert_int_equal(st_write_atomic(w, path, err, sizeof err), -1);
        char want[300];
        snprintf(want, sizeof want, "%s: ", path);
        if (strncmp(err, want, strlen(want)) != 0 || !strstr(err, cases[i].frag))
            fail_msg("case %zu: '%s'", i, err);
        assert_int_equal(access(path, F_OK), -1);
        assert_int_equal(count_tmp_files(), 0);
        st_writer_free(w);
    }

    /* metadata with invalid UTF-8 */
    st_writer *w = st_writer_new();
    assert_int_equal(st_writer_meta(w, "k", "\xc0\x80", err, sizeof err), -1);
    assert_non_null(strstr(err, "metadata 'k': value is not valid UTF-8"));
    st_writer_free(w);

    /* duplicates are found at write time and name the tensor / key */
    w = st_writer_new();
    assert_int_equal(st_writer_add(w, "a", ST_F32, 1, (uint64_t[]){1}, x, 4, err, sizeof err), 0);
    assert_int_equal(st_writer_add(w, "a", ST_F32, 1, (uint64_t[]){1}, x, 4, err, sizeof err), 0);
    assert_int_equal(st_write_atomic(w, tpath("dup.safetensors"), err, sizeof err), -1);
    assert_non_null(strstr(err, "dup.safetensors: tensor 'a': added twice"));
    st_writer_free(w);
    w = st_writer_new();
    assert_int_equal(st_writer_meta(w, "k", "1", err, sizeof err), 0);
    assert_int_equal(st_writer_meta(w, "k", "2", err, sizeof err), 0);
    assert_int_equal(st_write_atomic(w, tpath("dup.safetensors"), err, sizeof err), -1);
    assert_non_null(strstr(err, "dup.safetensors: metadata 'k': added twice"));
    st_writer_free(w);
    assert_int_equal(access(tpath("dup.safetensors"), F_OK), -1);
}

/* ---- malformed headers --------------------------------------------------------- */

typedef struct {
    const char *header; /* NULL: use raw below */
    size_t data_len;
    const char *frag;   /* must appear after "PATH: " */
} bad_case;

#define W "\"w\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,48]}"

static const bad_case bad_cases[] = {
    /* syntax */
    {"hello", 0, "header byte 0: expected '{', found 'h'"},
    {"[]", 0, "expected '{', found '['"},
    {"{", 0, "expected a string, found the end of the header"},
    {"{" W, 48, "expected ',' or '}', found the end of the header"},
    {"{" W "} x", 48, "unexpected data after the JSON object"},
    {"{" W "}\n\0", 48, "unexpected data after the JSON object"},
    {"{" W ",}", 48, "expected a string, found '}'"},
    {"{" W " " W "}", 48, "expected ',' or '}', found '\"'"},
    {"{\"w\" {}}", 0, "expected ':', found '{'"},
    {"{\"w:{}}", 0, "unterminated string"},
    {"{\"w\\q\":{}}", 0, "invalid escape '\\q'"},
    {"{\"w\\u12\":{}}", 0, "bad hex digit"},
    {"{\"w\\udc00\":{}}", 0, "lone low surrogate"},
    {"{\"w\\ud800x\":{}}", 0, "high surrogate \\ud800 not followed by a low one"},
    {"{\"w\\ud800\\u0041\":{}}", 0, "not followed by a low one"},
    {"{\"w\\u0000\":{}}", 0, "NUL character"},
    {"{\"w\x01\":{}}", 0, "control character 0x01 in string"},
    {"{\"w\xff\":{}}", 0, "invalid UTF-8"},
    {"{\"w\xc0\x80\":{}}", 0, "invalid UTF-8"},
    {"{\"w\xed\xa0\x80\":{}}", 0, "invalid UTF-8"},
    {"{\"w\xf4\x90\x80\x80\":{}}", 0, "invalid UTF-8"},
    {"{\"w\":5}", 0, "tensor 'w': header byte 5: expected an object, found '5'"},
    {"{\"w\":null}", 0, "tensor 'w': header byte 5: expected an object, found 'n'"},
    /* fields */
    {"{\"w\":{\"dtype\":\"F33\",\"shape\":[3,4],\"data_offsets\":[0,48]}}", 48,
     "tensor 'w': field 'dtype': header byte 14: unknown dtype 'F33'"},
    {"{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
     "tensor 'w': field 'dtype': header byte 14: unknown dtype 'f32'"},
    {"{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
     "tensor 'w': field 'dtype': header byte 14: expected a string, found '4'"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
     "tensor 'w': field 'shape': header byte 29: negative number"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[-0],\"data_offsets\":[0,0]}}", 0,
     "tensor 'w': field 'shape': header byte 29: negative number"},
    {"{\"a-b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-0,4]}}", 4,
     "tensor 'a-b': field 'data_offsets': header byte 50: negative number"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8,
     "tensor 'w': field 'shape': header byte 30: not an integer"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1e1],\"data_offsets\":[0,40]}}", 40,
     "field 'shape': header byte 30: not an integer"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[02],\"data_offsets\":[0,8]}}", 8,
     "field 'shape': header byte 29: integer with a leading zero"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8,
     "field 'shape': header byte 29: expected an integer, found '\"'"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1,],\"data_offsets\":[0,4]}}", 4,
     "field 'shape': header byte 31: expected an integer, found ']'"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1 1],\"data_offsets\":[0,4]}}", 4,
     "field 'shape': header byte 31: expected ',' or ']', found '1'"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":3,\"data_offsets\":[0,12]}}", 12,
     "field 'shape': header byte 28: expected '[', found '3'"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
     "tensor 'w': field 'shape': header byte 45: more than 8 entries"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[18446744073709551616],\"data_offsets\":[0,4]}}", 4,
     "field 'shape': header byte 29: integer does not fit in 64 bits"},
    /* the header's integers are signed 64-bit (jansson's, and the writer's) */
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[9223372036854775808,0],\"data_offsets\":[0,0]}}", 0,
     "field 'shape': header byte 29: integer does not fit in 64 bits"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4,
     "tensor 'w': shape [4294967296,4294967296] of F32 overflows 64 bits"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8,
     "tensor 'w': field 'data_offsets': header byte 52: more than 2 entries"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4]}}", 4,
     "tensor 'w': field 'data_offsets': header byte 50: has 1 entries, not 2"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[8,4]}}", 8,
     "tensor 'w': data_offsets [8,4] end before they begin"},
    {"{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
     "tensor 'w': field 'dtype': header byte 27: appears twice"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"extra\":1}}", 4,
     "tensor 'w': header byte 60: unknown field 'extra'"},
    {"{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4,
     "tensor 'w': field 'shape': header byte 41: missing"},
    {"{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'w': field 'dtype': header byte 39: missing"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor 'w': field 'data_offsets': header byte 32: missing"},
    {"{\"w\":{}}", 0, "tensor 'w': field 'dtype': header byte 7: missing"},
    {"{\"\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, "empty tensor name"},
    /* sizes and offsets */
    {"{\"h.0.attn.c_attn.weight\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,100]}}",
     100,
     "tensor 'h.0.attn.c_attn.weight': data_offsets [0,100] do not match shape [3,4] of F32 "
     "(48 bytes)"},
    {"{\"w\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[0,4]}}", 4,
     "tensor 'w': data_offsets [0,4] do not match shape [] of BF16 (2 bytes)"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,48]}}", 40,
     "tensor 'w': data_offsets [0,48] lie beyond the end of the data (40 bytes after the header)"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[4,52]}}", 52,
     "tensor 'w': data_offsets [4,52] leave a gap: the first tensor must start at 0"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
     12, "tensor 'b': data_offsets [4,12] overlap tensor 'a' [0,8]"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}",
     8, "tensor 'b': data_offsets [4,4] overlap tensor 'a' [0,8]"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
     8, "tensor 'b': data_offsets [0,8] overlap tensor 'a' [0,8]"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
     20, "tensor 'b': data_offsets [12,20] leave a gap after tensor 'a', which ends at 8"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,48]}}", 50,
     "the file has 50 data bytes after the header but its tensors cover 48"},
    {"{}", 1, "the file has 1 data bytes after the header but its tensors cover 0"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
     8, "tensor 'w': appears twice in the header"},
    /* metadata */
    {"{\"__metadata__\":{\"a\":1}}", 0, "metadata 'a': header byte 21: value is not a string"},
    {"{\"__metadata__\":{\"a\":{}}}", 0, "metadata 'a': header byte 21: value is not a string"},
    {"{\"__metadata__\":[]}", 0, "__metadata__: header byte 16: expected an object of strings"},
    {"{\"__metadata__\":{},\"__metadata__\":{}}", 0, "__metadata__: header byte 34: appears twice"},
    {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, "metadata 'k': appears twice in the header"},
    {"{\"__metadata__\":{\"k\":\"1\" \"j\":\"2\"}}", 0, "expected ',' or '}', found '\"'"},
    /* names in messages are escaped */
    {"{\"a\\n'b\":{\"dtype\":\"F33\",\"shape\":[],\"data_offsets\":[0,4]}}", 4,
     "tensor 'a\\x0a\\x27b': field 'dtype'"},
};

static void expect_refused(const char *path, const char *frag)
{
    st_file *f = (st_file *)(uintptr_t)1;
    char err[1024] = "";
    assert_int_equal(st_open(path, &f, err, sizeof err), -1);
    assert_null(f);
    if (getenv("TEST_VERBOSE"))
        printf("%s\n", err);
    char want[512];
    snprintf(want, sizeof want, "%s: ", path);
    if (strncmp(err, want, strlen(want)) != 0 || !strstr(err, frag))
        fail_msg("error '%s' lacks '%s' or '%s'", err, want, frag);
}

static void test_malformed_headers_refused(void **state)
{
    (void)state;
    const char *path = tpath("bad.safetensors");
    for (size_t i = 0; i < sizeof bad_cases / sizeof *bad_cases; i++) {
        const bad_case *c = &bad_cases[i];
        size_t hlen = strlen(c->header);
        if (strstr(c->frag, "after the JSON object") && strchr(c->header, '\n'))
            hlen += 1; /* keep the embedded NUL */
        write_raw(path, c->header, hlen, c->data_len);
        expect_refused(path, c->frag);
    }
}

static void test_bad_lengths_refused(void **state)
{
    (void)state;
    const char *path = tpath("len.safetensors");
    write_bytes(path, "", 0);
    expect_refused(path, "file is 0 bytes, too short for the 8-byte header length");
    write_bytes(path, "\x02\0\0\0", 4);
    expect_refused(path, "file is 4 bytes");
    write_bytes(path, "\0\0\0\0\0\0\0\0", 8);
    expect_refused(path, "header length is 0");
    write_bytes(path, "\x01\0\0\0\0\0\0\0{", 9);
    expect_refused(path, "header byte 1: expected a string, found the end of the header");
    write_bytes(path, "\x10\0\0\0\0\0\0\0{}", 10);
    expect_refused(path, "header length 16 exceeds the file size (10 bytes)");
    unsigned char big[16] = {0, 0x10, 0x40, 6, 0, 0, 0, 0, '{', '}'}; /* 100 MiB + 4 KiB */
    write_bytes(path, big, sizeof big);
    expect_refused(path, "header length 104861696 exceeds the limit of 104857600 bytes");
    unsigned char huge[16] = {0, 0, 0, 0, 0, 0, 0, 0x80, '{', '}'};
    write_bytes(path, huge, sizeof huge);
    expect_refused(path, "header length 9223372036854775808 exceeds the limit");
    expect_refused(tpath("missing.safetensors"), "cannot open: No such file or directory");
    expect_refused(td_path, "not a regular file");
}

static void test_lenient_but_valid_headers_accepted(void **state)
{
    (void)state;
    char err[512];
    const char *path = tpath("ok.safetensors");
    /* whitespace anywhere, any field order, tensors out of data order,
     * escapes in names, empty metadata, tensors of zero size */
    const char *h = " {\n\t\"b\\u00e9\\ud83d\\ude00\\/\" : { \"data_offsets\" : [ 8 , 12 ] ,"
                    "\"shape\":[1],\"dtype\":\"I32\"} ,\r\n \"__metadata__\":{},"
                    "\"a\":{\"shape\":[2],\"dtype\":\"U8\",\"data_offsets\":[0,2]},"
                    "\"z\":{\"shape\":[0, 5],\"dtype\":\"F64\",\"data_offsets\":[12,12]},"
                    "\"pad\":{\"shape\":[6],\"dtype\":\"BOOL\",\"data_offsets\":[2,8]}}   \t";
    write_raw(path, h, strlen(h), 12);
    st_file *f;
    if (st_open(path, &f, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(st_count(f), 4);
    assert_string_equal(st_tensor_at(f, 0)->name, "bé😀/");
    const st_tensor *t = st_find(f, "bé😀/");
    assert_non_null(t);
    assert_int_equal(t->dtype, ST_I32);
    assert_int_equal(t->begin, 8);
    int32_t v;
    assert_int_equal(st_read(f, "bé😀/", &v, 4, err, sizeof err), 0);
    unsigned char expect[4] = {8 * 7 + 1, 9 * 7 + 1, 10 * 7 + 1, 11 * 7 + 1};
    assert_memory_equal(&v, expect, 4);
    t = st_find(f, "z");
    assert_int_equal(t->nelem, 0);
    assert_int_equal(t->bytes, 0);
    assert_int_equal(st_read(f, "z", NULL, 0, err, sizeof err), 0);
    assert_int_equal(st_meta_count(f), 0);
    st_close(f);
}

static void test_reader_api_errors(void **state)
{
    (void)state;
    char err[512];
    const char *path = tpath("api.safetensors");
    st_writer *w = st_writer_new();
    float x[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    assert_int_equal(st_writer_add(w, "w", ST_F32, 2, (uint64_t[]){3, 4}, x, 48, err, sizeof err), 0);
    assert_int_equal(st_write_atomic(w, path, err, sizeof err), 0);
    st_writer_free(w);

    st_file *f;
    assert_int_equal(st_open(path, &f, err, sizeof err), 0);
    float y[12];
    assert_int_equal(st_read(f, "v", y, 48, err, sizeof err), -1);
    assert_non_null(strstr(err, "api.safetensors: no tensor 'v'"));
    assert_int_equal(st_read(f, "w", y, 44, err, sizeof err), -1);
    assert_non_null(strstr(err, "api.safetensors: tensor 'w': has 48 bytes, the buffer 44"));
    assert_null(st_expect(f, "w", ST_F32, 2, (uint64_t[]){4, 3}, err, sizeof err));
    assert_non_null(strstr(err, "tensor 'w': expected F32 [4,3], the file has F32 [3,4]"));
    assert_null(st_expect(f, "w", ST_BF16, 2, (uint64_t[]){3, 4}, err, sizeof err));
    assert_non_null(strstr(err, "expected BF16 [3,4], the file has F32 [3,4]"));
    assert_null(st_expect(f, "q", ST_F32, 0, NULL, err, sizeof err));
    assert_non_null(strstr(err, "no tensor 'q'"));
    st_tensor fake = *st_find(f, "w");
    assert_int_equal(st_read_tensor(f, &fake, y, 48, err, sizeof err), -1);
    assert_null(st_data(f, &fake, err, sizeof err));

    /* The file shrinks after st_open: st_read reports it instead of
     * returning garbage. */
    assert_int_equal(truncate(path, (off_t)st_data_offset(f) + 20), 0);
    assert_int_equal(st_read(f, "w", y, 48, err, sizeof err), -1);
    assert_non_null(strstr(err, "tensor 'w': read: the file ends before its data"));
    st_close(f);
}

/* ---- atomic write --------------------------------------------------------------- */

static void test_atomic_failures_leave_old_file(void **state)
{
    (void)state;
    char err[512];
    const char *path = tpath("ckpt.safetensors");
    write_bytes(path, "OLD CONTENT", 11);
    float x[256];
    for (int i = 0; i < 256; i++)
        x[i] = (float)i;
    static const struct {
        st_stage stage;
        int errnum;
        const char *frag;
    } cases[] = {
        {ST_STAGE_OPEN, EACCES, "cannot create"},
        {ST_STAGE_WRITE, ENOSPC, ": No space left on device"},
        {ST_STAGE_FSYNC, EIO, "fsync"},
        {ST_STAGE_CLOSE, EIO, "close"},
        {ST_STAGE_RENAME, EXDEV, "rename from"},
    };
    st_writer *w = st_writer_new();
    assert_int_equal(st_writer_add(w, "x", ST_F32, 1, (uint64_t[]){256}, x, sizeof x, err, sizeof err), 0);
    assert_int_equal(st_writer_meta(w, "step", "7", err, sizeof err), 0);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        st_writer_fail_at(w, cases[i].stage, cases[i].errnum);
        assert_int_equal(st_write_atomic(w, path, err, sizeof err), -1);
        char want[300];
        snprintf(want, sizeof want, "%s: ", path);
        if (strncmp(err, want, strlen(want)) != 0 || !strstr(err, cases[i].frag))
            fail_msg("stage %d: '%s'", (int)cases[i].stage, err);
        size_t n;
        unsigned char *b = read_bytes(path, &n);
        assert_int_equal(n, 11);
        assert_memory_equal(b, "OLD CONTENT", 11);
        free(b);
        assert_int_equal(count_tmp_files(), 0);
    }
    /* Failing only the directory sync: the new file is in place, and the
     * caller is told its durability is not guaranteed. */
    st_writer_fail_at(w, ST_STAGE_DIRSYNC, EIO);
    assert_int_equal(st_write_atomic(w, path, err, sizeof err), -1);
    assert_non_null(strstr(err, "written, but syncing directory"));
    assert_int_equal(count_tmp_files(), 0);
    /* Clearing the hook: it writes, and the result reads back. */
    write_bytes(path, "OLD CONTENT", 11);
    st_writer_fail_at(w, ST_STAGE_NONE, 0);
    assert_int_equal(st_write_atomic(w, path, err, sizeof err), 0);
    st_file *f;
    assert_int_equal(st_open(path, &f, err, sizeof err), 0);
    assert_string_equal(st_meta(f, "step"), "7");
    st_close(f);
    /* A stale temporary of our pid (an earlier crash) is replaced. */
    char stale[300];
    snprintf(stale, sizeof stale, "%s.tmp.%ld", path, (long)getpid());
    write_bytes(stale, "junk", 4);
    assert_int_equal(st_write_atomic(w, path, err, sizeof err), 0);
    assert_int_equal(count_tmp_files(), 0);
    st_writer_free(w);
}

static void test_atomic_real_failures(void **state)
{
    (void)state;
    char err[512];
    st_writer *w = st_writer_new();
    float x = 1;
    assert_int_equal(st_writer_add(w, "x", ST_F32, 0, NULL, &x, 4, err, sizeof err), 0);
    /* Directory missing. */
    const char *missing = tpath("no/such/dir/m.safetensors");
    assert_int_equal(st_write_atomic(w, missing, err, sizeof err), -1);
    assert_non_null(strstr(err, "no/such/dir/m.safetensors: cannot create"));
    /* Target is a directory: rename fails; nothing is left behind. */
    char sub[300];
    snprintf(sub, sizeof sub, "%s/adir", td_path);
    assert_int_equal(mkdir(sub, 0700), 0);
    char inner[320];
    snprintf(inner, sizeof inner, "%s/keep", sub);
    write_bytes(inner, "k", 1);
    assert_int_equal(st_write_atomic(w, sub, err, sizeof err), -1);
    assert_non_null(strstr(err, "adir: rename from"));
    assert_int_equal(count_tmp_files(), 0);
    unlink(inner);
    rmdir(sub);
    /* Read-only directory (meaningless for root, who may write anyway). */
    if (geteuid() != 0) {
        const char *path = tpath("ro.safetensors");
        write_bytes(path, "OLD", 3);
        assert_int_equal(chmod(td_path, 0500), 0);
        assert_int_equal(st_write_atomic(w, path, err, sizeof err), -1);
        assert_non_null(strstr(err, "ro.safetensors: cannot create"));
        assert_non_null(strstr(err, "Permission denied"));
        assert_int_equal(chmod(td_path, 0700), 0);
        size_t n;
        unsigned char *b = read_bytes(path, &n);
        assert_int_equal(n, 3);
        free(b);
    }
    /* A relative path (directory ".") works too. */
    char cwd[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(td_path), 0);
    assert_int_equal(st_write_atomic(w, "rel.safetensors", err, sizeof err), 0);
    assert_int_equal(chdir(cwd), 0);
    assert_int_equal(access(tpath("rel.safetensors"), F_OK), 0);
    st_writer_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_table),
        cmocka_unit_test_setup_teardown(test_round_trip_all_dtypes, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_round_trip_no_tensors, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_many_tensors_lookup, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_writer_rejects_bad_tensors, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_malformed_headers_refused, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_bad_lengths_refused, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_lenient_but_valid_headers_accepted, setup_dir,
                                        teardown_dir),
        cmocka_unit_test_setup_teardown(test_reader_api_errors, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_atomic_failures_leave_old_file, setup_dir,
                                        teardown_dir),
        cmocka_unit_test_setup_teardown(test_atomic_real_failures, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
