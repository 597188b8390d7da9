/* fuzz_jsonl.c — libFuzzer harness for daemon/io/data_jsonl.c: fine-tuning
 * samples (JSON Lines) as a job loads them, then their rows and stream.
 *
 * Input layout: byte 0 flags, byte 1 the context T = 1 + b1 % 32, byte 2
 * the vocab = 2 + b2 × 4; the payload follows, written to a memfd read
 * back through /proc/self/fd/N.
 *   flags 0x01: [data] overlong = truncate; 0x02: pack the rows; 0x04: gzip
 *   the payload first; 0x08: a data budget of (b2 + 1) × 64 bytes.
 *
 * Properties (abort() on violation):
 *   - a failure leaves an error that starts with the path then ':', and
 *     when it names a line, a line the file has; *d is zeroed and the
 *     budget holds nothing;
 *   - what loads is consistent: every sample 1..T tokens, ids below vocab,
 *     its shift's targets -100 or below vocab, the last one -100, their
 *     count the sample's `targets` and at least 1; the budget holds exactly
 *     the arrays (4 a token, a bit a token, 12 a sample, 8 more, and 4 a
 *     token for explicit labels), never more than its limit;
 *   - rows: at most one a sample, every token's start at or before it and
 *     its position its distance from there, padding ignored, the targets
 *     and tokens summed over the samples laid;
 *   - the stream: counting ahead moves nothing and counts what is then
 *     taken; a saved position continues identically.
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

#define CHECK(cond)                                                                                     \
    do {                                                                                                \
        if (!(cond)) {                                                                                  \
            fprintf(stderr, "fuzz_jsonl: property failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                                    \
        }                                                                                               \
    } while (0)

#define MAX_T 32

static int fd = -1;
static char path[64];
static char err[1024];

/* The payload as the file, gzip'd through zlib's own writer when gz. */
static void put(const uint8_t *data, size_t size, bool gz)
{
    if (fd < 0) {
        fd = memfd_create("fuzz-jsonl", MFD_CLOEXEC);
        CHECK(fd >= 0);
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    CHECK(ftruncate(fd, 0) == 0 && lseek(fd, 0, SEEK_SET) == 0);
    if (gz) {
        gzFile g = gzdopen(dup(fd), "wb1");
        CHECK(g != NULL);
        CHECK(size == 0 || gzwrite(g, data, (unsigned)size) == (int)size);
        CHECK(gzclose(g) == Z_OK);
        return;
    }
    for (size_t off = 0; off < size;) {
        ssize_t n = pwrite(fd, data + off, size - off, (off_t)off);
        CHECK(n > 0);
        off += (size_t)n;
    }
}

static void check_failure(const data_sft *d, const data_budget *b, size_t lines)
{
    size_t pl = strlen(path);
    CHECK(strncmp(err, path, pl) == 0 && err[pl] == ':');
    if (err[pl + 1] >= '0' && err[pl + 1] <= '9') {
        unsigned long long line = strtoull(err + pl + 1, NULL, 10);
        CHECK(line >= 1 && line <= lines);
    }
    static const data_sft zero;
    CHECK(memcmp(d, &zero, sizeof zero) == 0);
    CHECK(b->used == 0);
}

static void check_rows(const data_sft *d, size_t T, bool pack)
{
    int32_t x[8 * MAX_T], y[8 * MAX_T], pos[8 * MAX_T], start[8 * MAX_T];
    for (size_t i = 0; i < d->n;) {
        size_t k = d->n - i < 8 ? d->n - i : 8;
        data_rows r;
        data_rows_begin(&r, x, y, pos, start, T, pack);
        uint64_t targets = 0, tokens = 0;
        for (size_t s = 0; s < k; s++) {
            data_rows_add(&r, d, i + s);
            targets += d->targets[i + s];
            tokens += data_sft_len(d, i + s);
        }
        uint32_t rows = data_rows_end(&r);
        CHECK(rows >= 1 && rows <= k);
        CHECK(r.targets == targets && r.tokens == tokens);
        uint64_t seen = 0;
        for (size_t t = 0; t < rows * T; t++) {
            seen += y[t] != -100;
            if (!pack)
                continue;
            /* Padding too: its own start, position 0. */
            size_t col = t % T;
            CHECK(start[t] >= 0 && (size_t)start[t] <= col);
            CHECK(pos[t] >= 0 && (size_t)pos[t] == col - (size_t)start[t]);
        }
        CHECK(seen == targets);
        i += k;
    }
}

static void check_stream(const data_sft *d, uint64_t seed, size_t T)
{
    data_stream a, b;
    CHECK(data_stream_sft(&a, d, seed, NULL, err, sizeof err) == 0);
    CHECK(data_stream_sft(&b, d, seed, NULL, err, sizeof err) == 0);
    int32_t x1[4 * MAX_T], y1[4 * MAX_T], x2[4 * MAX_T], y2[4 * MAX_T];
    for (int step = 0; step < 3; step++) {
        uint64_t e0, i0, e1, i1, tg, tk;
        data_stream_state(&a, &e0, &i0);
        data_stream_sft_count(&a, 4, &tg, &tk);
        data_stream_state(&a, &e1, &i1);
        CHECK(e0 == e1 && i0 == i1);
        CHECK(data_stream_set_state(&b, e0, i0, err, sizeof err) == 0);
        data_rows r1, r2;
        data_rows_begin(&r1, x1, y1, NULL, NULL, T, false);
        data_rows_begin(&r2, x2, y2, NULL, NULL, T, false);
        uint32_t n1 = data_stream_next_sft(&a, 4, &r1), n2 = data_stream_next_sft(&b, 4, &r2);
        CHECK(n1 == 4 && n2 == 4);
        CHECK(r1.targets == tg && r1.tokens == tk);
        CHECK(memcmp(x1, x2, 4 * T * sizeof *x1) == 0 && memcmp(y1, y2, 4 * T * sizeof *y1) == 0);
    }
    data_stream_free(&a);
    data_stream_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    uint8_t flags = data[0];
    size_t T = 1 + data[1] % MAX_T;
    uint32_t vocab = 2 + (uint32_t)data[2] * 4;
    const uint8_t *body = data + 3;
    size_t len = size - 3, lines = 1;
    for (size_t i = 0; i < len; i++)
        lines += body[i] == '\n';
    put(body, len, flags & 0x04);
    data_budget b = {.limit = flags & 0x08 ? ((uint64_t)data[2] + 1) * 64 : 0, .key = "limit"};
    data_sft d;
    err[0] = 0;
    if (data_sft_load(&d, path, vocab, (uint32_t)T, flags & 0x01, &b, err, sizeof err) != 0) {
        check_failure(&d, &b, lines);
        return 0;
    }
    CHECK(d.n >= 1 && d.off[0] == 0 && d.off[d.n] == d.ntok);
    uint64_t held = d.ntok * 4 + (d.ntok + 7) / 8 + (d.n + 1) * 8 + d.n * 4 + (d.labels ? d.ntok * 4 : 0);
    CHECK(b.used == held);
    CHECK(!b.limit || b.used <= b.limit);
    uint64_t total = 0;
    for (size_t i = 0; i < d.n; i++) {
        uint32_t n = data_sft_len(&d, i);
        CHECK(n >= 1 && n <= T);
        int32_t x[MAX_T], y[MAX_T];
        data_sft_shift(&d, i, x, y);
        uint32_t targets = 0;
        for (uint32_t t = 0; t < n; t++) {
            CHECK(x[t] >= 0 && (uint32_t)x[t] < vocab);
            CHECK(y[t] == -100 || (y[t] >= 0 && (uint32_t)y[t] < vocab));
            targets += y[t] != -100;
        }
        CHECK(y[n - 1] == -100);
        CHECK(targets >= 1 && targets == d.targets[i]);
        total += targets;
    }
    CHECK(total == d.ntargets);
    check_rows(&d, T, flags & 0x02);
    check_stream(&d, data[1], T);
    if (d.n >= 2) {
        data_sft val;
        size_t n = d.n;
        CHECK(data_sft_split(&d, &val, 0.5, err, sizeof err) == 0);
        CHECK(d.n + val.n == n && d.ntargets + val.ntargets == total);
        data_sft_free(&val);
    }
    data_sft_free(&d);
    return 0;
}
