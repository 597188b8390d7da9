/* fuzz_data.c — libFuzzer harness for daemon/io/data*.c: llm.c token files,
 * .npy, text, and IDX image/label pairs (plain or gzip'd), then the sample
 * streams over whatever loads.
 *
 * Input layout: byte 0 picks the target and flags, byte 1 is a parameter
 * (the context T = 1 + p % 32), bytes 2-3 (little-endian) split the rest
 * into two files for the image/label pair; the payload follows.
 *   mode = (byte0 & 7) % 5:  0 llm.c tokens   1 .npy tokens   2 auto-detected tokens
 *                      3 images + labels (IDX or .npy each, by magic)
 *                      4 generic .npy
 *   byte0 & 0x08: gzip the images part first (so the fuzzer reaches the IDX
 *                 parser behind gzip as easily as without); 0x10: the labels
 *                 part; 0x20: check tokens against vocab 50257 / 10 classes;
 *                 0x40: a data budget of bytes 2-3 × 16 bytes (tokens) or
 *                 byte 1 × 64 bytes (images).
 * Files are memfds read back through /proc/self/fd/N.
 *
 * Properties (abort() on violation):
 *   - a failure leaves a non-empty error that starts with the path of one of
 *     the files involved, followed by ':' or ' ', and leaves the output
 *     struct zeroed;
 *   - what loads is consistent: counts, shapes, tokens < vocab, labels <
 *     classes, u8 pixels scaled into [0, 1], targets = inputs shifted by one;
 *   - a stream's position saved and restored continues identically; the
 *     evaluation pass yields exactly its size;
 *   - the budget holds exactly what was loaded (one byte a byte token, two
 *     a uint16 one, pixels as stored, four a label, eight a stream sample),
 *     never more than its limit, and nothing after a failure.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include "io/data.h"

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "fuzz_data: property failed at %s:%d: %s\n", __FILE__,     \
                    __LINE__, #cond);                                                    \
            abort();                                                                     \
        }                                                                                \
    } while (0)

static int fds[2] = {-1, -1};
static char paths[2][64];
static char err[1024];

static void put(int k, const uint8_t *data, size_t size)
{
    if (fds[k] < 0) {
        fds[k] = memfd_create(k ? "fuzz-data-b" : "fuzz-data-a", MFD_CLOEXEC);
        CHECK(fds[k] >= 0);
        snprintf(paths[k], sizeof paths[k], "/proc/self/fd/%d", fds[k]);
    }
    CHECK(ftruncate(fds[k], 0) == 0);
    size_t off = 0;
    while (off < size) {
        ssize_t n = pwrite(fds[k], data + off, size - off, (off_t)off);
        CHECK(n > 0);
        off += (size_t)n;
    }
}

/* gzip data into a malloc'd buffer. */
static uint8_t *gzip(const uint8_t *data, size_t size, size_t *out_len)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    CHECK(deflateInit2(&z, 1, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    size_t cap = deflateBound(&z, (uLong)size) + 32;
    uint8_t *out = malloc(cap);
    CHECK(out);
    z.next_in = (Bytef *)data;
    z.avail_in = (uInt)size;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    CHECK(deflate(&z, Z_FINISH) == Z_STREAM_END);
    *out_len = cap - z.avail_out;
    deflateEnd(&z);
    return out;
}

static void check_err(int npaths)
{
    size_t l = strlen(err);
    CHECK(l > 0);
    for (int k = 0; k < npaths; k++) {
        size_t pl = strlen(paths[k]);
        if (strncmp(err, paths[k], pl) == 0 && (err[pl] == ':' || err[pl] == ' '))
            return;
    }
    fprintf(stderr, "fuzz_data: error does not name the file: \"%s\"\n", err);
    abort();
}

static int zeroed(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return 0;
    return 1;
}

static void streams_tokens(const data_tokens *t, size_t T)
{
    if (t->n < T + 1)
        return;
    data_stream s, r;
    CHECK(data_stream_tokens(&s, t, T, 1234, NULL, err, sizeof err) == 0);
    uint64_t size = data_stream_epoch_size(&s);
    CHECK(size >= 1 && size <= (t->n - 1) / T);
    enum { MAXN = 8 };
    int32_t in[MAXN * 32], tg[MAXN * 32], in2[MAXN * 32], tg2[MAXN * 32];
    uint64_t draws = size * 2 + 3;
    if (draws > 64)
        draws = 64;
    for (uint64_t d = 0; d < draws;) {
        size_t n = (size_t)(d % MAXN) + 1;
        data_stream_next_tokens(&s, n, in, tg);
        for (size_t i = 0; i < n * T; i++) {
            CHECK(in[i] >= 0 && (uint32_t)in[i] <= t->max_token);
            CHECK(tg[i] >= 0 && (uint32_t)tg[i] <= t->max_token);
            if (i % T)
                CHECK(in[i] == tg[i - 1]);
        }
        d += n;
    }
    uint64_t e, i;
    data_stream_state(&s, &e, &i);
    CHECK(i < size);
    CHECK(data_stream_tokens(&r, t, T, 1234, NULL, err, sizeof err) == 0);
    CHECK(data_stream_set_state(&r, e, i, err, sizeof err) == 0);
    data_stream_next_tokens(&s, MAXN, in, tg);
    data_stream_next_tokens(&r, MAXN, in2, tg2);
    CHECK(memcmp(in, in2, MAXN * T * sizeof *in) == 0);
    CHECK(memcmp(tg, tg2, MAXN * T * sizeof *tg) == 0);
    CHECK(data_stream_set_state(&r, 0, size, err, sizeof err) == -1);
    data_stream_free(&s);
    data_stream_free(&r);

    data_eval ev;
    CHECK(data_eval_tokens(&ev, t, T, err, sizeof err) == 0);
    CHECK(ev.size == (t->n - 1) / T);
    if (ev.size <= 4096) {
        uint64_t seen = 0;
        size_t got;
        while ((got = data_eval_next_tokens(&ev, MAXN, in, tg)) > 0) {
            CHECK(got <= MAXN);
            CHECK(in[0] == data_token(t, seen * T));
            seen += got;
        }
        CHECK(seen == ev.size);
    }
}

static void fuzz_tokens(data_format fmt, uint32_t vocab, size_t T, uint64_t limit)
{
    data_tokens t;
    memset(&t, 0xa5, sizeof t);
    err[0] = '\0';
    data_budget b = {.limit = limit, .key = "[fuzz] limit"};
    if (data_tokens_load(&t, paths[0], fmt, vocab, &b, err, sizeof err) != 0) {
        check_err(1);
        CHECK(zeroed(&t, sizeof t));
        CHECK(b.used == 0 && (!limit || b.peak <= limit));
        return;
    }
    CHECK(t.n > 0 && (t.tok != NULL) != (t.u8 != NULL));
    CHECK(b.used == t.n * (t.u8 ? 1 : 2) && (!limit || b.peak <= limit));
    CHECK(strcmp(t.source, paths[0]) == 0);
    uint32_t m = 0;
    for (size_t i = 0; i < t.n; i++)
        m = data_token(&t, i) > m ? data_token(&t, i) : m;
    CHECK(m == t.max_token);
    if (vocab)
        CHECK(m < vocab);
    CHECK(data_tokens_check_vocab(&t, m + 1, err, sizeof err) == 0);
    if (m > 0) {
        err[0] = '\0';
        CHECK(data_tokens_check_vocab(&t, m, err, sizeof err) == -1);
        check_err(1);
    }
    streams_tokens(&t, T);
    data_tokens v;
    size_t n = t.n;
    uint64_t held = b.used;
    if (data_tokens_split(&t, &v, 0.25, &b, err, sizeof err) == 0) {
        CHECK(t.n + v.n == n && t.n > 0 && v.n > 0);
        CHECK(b.used == held);
        streams_tokens(&v, T);
        data_tokens_free(&v);
    } else {
        check_err(1);
        CHECK(b.used == held);
    }
    data_tokens_free(&t);
}

static void fuzz_images(uint32_t classes, uint64_t budget)
{
    data_images d;
    memset(&d, 0xa5, sizeof d);
    err[0] = '\0';
    size_t limit = classes ? 3 : 0;
    data_budget b = {.limit = budget};
    if (data_images_load(&d, paths[0], paths[1], classes, limit, &b, err, sizeof err) != 0) {
        check_err(2);
        CHECK(zeroed(&d, sizeof d));
        CHECK(b.used == 0 && (!budget || b.peak <= budget));
        return;
    }
    CHECK(b.used == d.n * d.dim * (d.u8 ? 1 : 4) + d.n * 4 && (!budget || b.peak <= budget));
    CHECK(d.n > 0 && d.dim == d.rows * d.cols && d.dim > 0);
    CHECK(!limit || d.n <= limit);
    CHECK((d.u8 != NULL) != (d.f32 != NULL));
    CHECK(d.classes > 0 && (!classes || d.classes == classes));
    for (size_t i = 0; i < d.n; i++)
        CHECK(d.labels[i] >= 0 && (uint32_t)d.labels[i] < d.classes);
    size_t per = d.dim <= (1u << 16) ? 4 : 1;
    float *x = malloc(per * d.dim * sizeof *x);
    int32_t y[4];
    CHECK(x);
    data_stream s;
    uint64_t held = b.used;
    if (data_stream_images(&s, &d, 99, &b, err, sizeof err) != 0) {
        check_err(2);
        CHECK(budget && b.used == held);
        free(x);
        data_images_free(&d);
        return;
    }
    CHECK(b.used == held + d.n * 8);
    CHECK(data_stream_epoch_size(&s) == d.n);
    for (int k = 0; k < 6; k++) {
        data_stream_next_images(&s, per, x, y);
        for (size_t i = 0; i < per; i++)
            CHECK(y[i] >= 0 && (uint32_t)y[i] < d.classes);
        if (d.u8)
            for (size_t i = 0; i < per * d.dim; i++)
                CHECK(x[i] >= 0.0f && x[i] <= 1.0f);
    }
    data_stream_free(&s);
    data_eval e;
    data_eval_images(&e, &d);
    size_t seen = 0, got;
    while ((got = data_eval_next_images(&e, per, x, y)) > 0)
        seen += got;
    CHECK(seen == d.n);
    free(x);
    data_images_free(&d);
}

static void fuzz_npy(void)
{
    data_npy a;
    memset(&a, 0xa5, sizeof a);
    err[0] = '\0';
    if (data_npy_load(&a, paths[0], NULL, err, sizeof err) != 0) {
        check_err(1);
        CHECK(zeroed(&a, sizeof a));
        return;
    }
    CHECK(a.ndim >= 0 && a.ndim <= DATA_NPY_MAX_DIMS);
    uint64_t c = 1;
    for (int i = 0; i < a.ndim; i++)
        c *= a.shape[i];
    CHECK(c == a.count && a.data);
    data_npy_free(&a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4)
        return 0;
    unsigned mode = (data[0] & 7) % 5, flags = data[0];
    size_t T = 1 + data[1] % 32;
    bool strict = flags & 0x20;
    uint64_t tok_budget = flags & 0x40 ? ((uint64_t)data[2] | (uint64_t)data[3] << 8) * 16 + 1 : 0;
    uint64_t img_budget = flags & 0x40 ? (uint64_t)data[1] * 64 + 1 : 0;
    const uint8_t *p = data + 4;
    size_t n = size - 4;
    switch (mode) {
    case 0:
        put(0, p, n);
        fuzz_tokens(DATA_FMT_LLMC, strict ? 50257 : 0, T, tok_budget);
        break;
    case 1:
        put(0, p, n);
        fuzz_tokens(DATA_FMT_NPY, strict ? 50257 : 0, T, tok_budget);
        break;
    case 2:
        put(0, p, n);
        fuzz_tokens(DATA_FMT_AUTO, strict ? 256 : 0, T, tok_budget);
        break;
    case 3: {
        size_t split = (size_t)data[2] | (size_t)data[3] << 8;
        if (split > n)
            split = n;
        const uint8_t *part[2] = {p, p + split};
        size_t len[2] = {split, n - split};
        for (int k = 0; k < 2; k++) {
            if (flags & (k ? 0x10 : 0x08)) {
                size_t zl;
                uint8_t *z = gzip(part[k], len[k], &zl);
                put(k, z, zl);
                free(z);
            } else {
                put(k, part[k], len[k]);
            }
        }
        fuzz_images(strict ? 10 : 0, img_budget);
        break;
    }
    default:
        put(0, p, n);
        fuzz_npy();
        break;
    }
    return 0;
}
