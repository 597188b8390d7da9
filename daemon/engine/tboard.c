/* tboard.c — see tboard.h. */
#include "tboard.h"

#include "errmsg.h"
#include "fileio.h"
#include "utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tensorboard.pb-c.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define TB_HAVE_SSE42 1
#endif

/* ---- CRC32C ----------------------------------------------------------------- */

#define CRC32C_POLY 0x82F63B78u /* Castagnoli, reflected */
#define CRC_MASK_DELTA 0xa282ead8u

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;
static bool crc_hw_ok;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (CRC32C_POLY & (0u - (c & 1)));
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] =
                (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
#ifdef TB_HAVE_SSE42
    __builtin_cpu_init();
    crc_hw_ok = __builtin_cpu_supports("sse4.2");
#endif
}

/* Slicing-by-8 with explicit byte loads: independent of host endianness. */
static uint32_t crc_sw(uint32_t crc, const uint8_t *p, size_t n)
{
    crc = ~crc;
    while (n >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                             (uint32_t)p[3] << 24);
        crc = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
              crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^ crc_table[3][p[4]] ^
              crc_table[2][p[5]] ^ crc_table[1][p[6]] ^ crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
    return ~crc;
}

#ifdef TB_HAVE_SSE42
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p,
                                                          size_t n)
{
    uint64_t c = ~crc;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = _mm_crc32_u8(c32, *p++);
    return ~c32;
}
#endif

uint32_t tb_crc32c_portable(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&crc_once, crc_init);
    return crc_sw(crc, data, n);
}

uint32_t tb_crc32c(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&crc_once, crc_init);
#ifdef TB_HAVE_SSE42
    if (crc_hw_ok)
        return crc_hw(crc, data, n);
#endif
    return crc_sw(crc, data, n);
}

uint32_t tb_crc_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + CRC_MASK_DELTA;
}

uint32_t tb_crc_unmask(uint32_t masked)
{
    uint32_t r = masked - CRC_MASK_DELTA;
    return (r >> 17) | (r << 15);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* ---- writer ------------------------------------------------------------------ */

#define TB_BUF_FLUSH (64u << 10) /* hand records to the kernel past this */

struct tb_writer {
    char *path;
    int fd;
    uint8_t *buf;
    size_t n, cap;
    bool failed;
    char err[512];
};

__attribute__((format(printf, 2, 3))) static int wfail(tb_writer *w, const char *fmt, ...)
{
    if (!w->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->err, sizeof w->err, fmt, ap);
        va_end(ap);
        w->failed = true;
    }
    return -1;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int tb_flush(tb_writer *w)
{
    if (w->failed)
        return -1;
    if (w->n == 0)
        return 0;
    if (fileio_write_all(w->fd, w->buf, w->n) != 0)
        return wfail(w, "%s: write: %s", w->path, strerror(errno));
    w->n = 0;
    return 0;
}

/* Append one framed record holding the packed event. */
static int append_event(tb_writer *w, const Gradd__Tb__Event *ev)
{
    if (w->failed)
        return -1;
    size_t len = gradd__tb__event__get_packed_size(ev);
    size_t need = 12 + len + 4;
    if (w->n + need > w->cap) {
        size_t cap = w->cap;
        while (cap < w->n + need)
            cap *= 2;
        uint8_t *b = realloc(w->buf, cap);
        if (!b)
            return wfail(w, "%s: out of memory for a %zu-byte record", w->path, len);
        w->buf = b;
        w->cap = cap;
    }
    uint8_t *r = w->buf + w->n;
    put_u64(r, (uint64_t)len);
    put_u32(r + 8, tb_crc_mask(tb_crc32c(0, r, 8)));
    size_t packed = gradd__tb__event__pack(ev, r + 12);
    if (packed != len)
        return wfail(w, "%s: protobuf packed %zu bytes, expected %zu", w->path, packed, len);
    put_u32(r + 12 + len, tb_crc_mask(tb_crc32c(0, r + 12, len)));
    w->n += need;
    if (w->n >= TB_BUF_FLUSH)
        return tb_flush(w);
    return 0;
}

int tb_scalars(tb_writer *w, int64_t step, double wall_time, size_t n, const char *const *tags,
               const float *values)
{
    if (w->failed)
        return -1;
    if (n == 0)
        return wfail(w, "%s: tb_scalars with no values", w->path);
    for (size_t i = 0; i < n; i++)
        if (!tags[i] || !*tags[i] || !utf8_valid(tags[i]))
            return wfail(w, "%s: scalar tag %zu is empty or not UTF-8", w->path, i);
    Gradd__Tb__Summary__Value *vals = calloc(n, sizeof *vals);
    Gradd__Tb__Summary__Value **ptrs = calloc(n, sizeof *ptrs);
    if (!vals || !ptrs) {
        free(vals);
        free(ptrs);
        return wfail(w, "%s: out of memory", w->path);
    }
    for (size_t i = 0; i < n; i++) {
        gradd__tb__summary__value__init(&vals[i]);
        vals[i].tag = (char *)tags[i];
        vals[i].value_case = GRADD__TB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
        vals[i].simple_value = values[i];
        ptrs[i] = &vals[i];
    }
    Gradd__Tb__Summary sum = GRADD__TB__SUMMARY__INIT;
    sum.n_value = n;
    sum.value = ptrs;
    Gradd__Tb__Event ev = GRADD__TB__EVENT__INIT;
    ev.wall_time = (wall_time > 0) ? wall_time : now(); /* NaN fails the test too */
    ev.step = step;
    ev.what_case = GRADD__TB__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    int rc = append_event(w, &ev);
    free(vals);
    free(ptrs);
    return rc;
}

int tb_session_start(tb_writer *w, int64_t step, double wall_time)
{
    if (w->failed)
        return -1;
    Gradd__Tb__SessionLog log = GRADD__TB__SESSION_LOG__INIT;
    log.status = GRADD__TB__SESSION_LOG__SESSION_STATUS__START;
    Gradd__Tb__Event ev = GRADD__TB__EVENT__INIT;
    ev.wall_time = (wall_time > 0) ? wall_time : now();
    ev.step = step;
    ev.what_case = GRADD__TB__EVENT__WHAT_SESSION_LOG;
    ev.session_log = &log;
    if (append_event(w, &ev) != 0)
        return -1;
    return tb_flush(w);
}

int tb_scalar(tb_writer *w, const char *tag, int64_t step, float value, double wall_time)
{
    return tb_scalars(w, step, wall_time, 1, &tag, &value);
}

const char *tb_path(const tb_writer *w)
{
    return w->path;
}

const char *tb_error(const tb_writer *w)
{
    return w->failed ? w->err : "";
}

static void free_writer(tb_writer *w)
{
    if (w->fd >= 0)
        close(w->fd);
    free(w->buf);
    free(w->path);
    free(w);
}

int tb_open(const char *dir, tb_writer **out, char *err, size_t err_len)
{
    *out = NULL;
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0 || !host[0])
        snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    for (char *c = host; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
              (*c >= '0' && *c <= '9') || *c == '.' || *c == '-' || *c == '_'))
            *c = '_';

    tb_writer *w = calloc(1, sizeof *w);
    size_t plen = strlen(dir) + strlen(host) + 96;
    if (!w || !(w->path = malloc(plen)) || !(w->buf = malloc(TB_BUF_FLUSH))) {
        if (w)
            free(w->path);
        free(w);
        errmsg_set(err, err_len, "%s: out of memory", dir);
        return -1;
    }
    w->fd = -1;
    w->cap = TB_BUF_FLUSH;
    long long t = (long long)time(NULL);
    long pid = (long)getpid();
    for (int k = 0; k < 100; k++) {
        if (k == 0)
            snprintf(w->path, plen, "%s/events.out.tfevents.%lld.%s.%ld.gradd", dir, t, host,
                     pid);
        else
            snprintf(w->path, plen, "%s/events.out.tfevents.%lld.%s.%ld.gradd.%d", dir, t,
                     host, pid, k);
        w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC | O_NOFOLLOW,
                     0666);
        if (w->fd >= 0 || errno != EEXIST)
            break;
    }
    if (w->fd < 0) {
        errmsg_set(err, err_len, "%s: cannot create event file: %s", w->path, strerror(errno));
        free_writer(w);
        return -1;
    }
    Gradd__Tb__Event ev = GRADD__TB__EVENT__INIT;
    ev.wall_time = now();
    ev.what_case = GRADD__TB__EVENT__WHAT_FILE_VERSION;
    ev.file_version = (char *)"brain.Event:2";
    if (append_event(w, &ev) != 0 || tb_flush(w) != 0) {
        errmsg_set(err, err_len, "%s", w->err);
        unlink(w->path);
        free_writer(w);
        return -1;
    }
    *out = w;
    return 0;
}

int tb_close(tb_writer *w, char *err, size_t err_len)
{
    if (!w)
        return 0;
    if (tb_flush(w) == 0 && fsync(w->fd) != 0 && errno != EINVAL && errno != EROFS)
        wfail(w, "%s: fsync: %s", w->path, strerror(errno));
    int c = close(w->fd);
    w->fd = -1;
    if (c != 0)
        wfail(w, "%s: close: %s", w->path, strerror(errno));
    int rc = w->failed ? -1 : 0;
    if (rc)
        errmsg_set(err, err_len, "%s", w->err);
    free_writer(w);
    return rc;
}

/* ---- reader ---------------------------------------------------------------- */

long tb_read_records(const char *path, unsigned flags, tb_record_fn fn, void *ctx, char *err,
                     size_t err_len)
{
    int fd = fileio_open_regular(path, O_RDONLY, 0, err, err_len);
    if (fd < 0)
        return -1;
    FILE *fp = fdopen(fd, "rb");
    struct stat sb;
    if (!fp || fstat(fd, &sb) != 0) {
        errmsg_set(err, err_len, "%s: cannot read: %s", path, strerror(errno));
        if (fp)
            fclose(fp);
        else
            close(fd);
        return -1;
    }
    uint64_t size = (uint64_t)sb.st_size;
    bool allow_tail = flags & TB_READ_ALLOW_TRUNCATED_TAIL;
    long count = 0;
    uint64_t off = 0;
    uint8_t *data = NULL;
    long rc = -1;
    for (;;) {
        uint8_t hdr[12];
        size_t got = fread(hdr, 1, sizeof hdr, fp);
        if (got == 0 && !ferror(fp))
            break; /* clean end */
        if (got < sizeof hdr) {
            if (ferror(fp)) {
                errmsg_set(err, err_len, "%s: record %ld at byte %llu: read: %s", path, count,
                           (unsigned long long)off, strerror(errno));
                goto out;
            }
            if (allow_tail)
                break;
            errmsg_set(err, err_len, "%s: record %ld at byte %llu: truncated header (%zu of 12 bytes)",
                       path, count, (unsigned long long)off, got);
            goto out;
        }
        uint64_t len = get_u64(hdr);
        uint32_t want = tb_crc_unmask(get_u32(hdr + 8)), have = tb_crc32c(0, hdr, 8);
        if (want != have) {
            errmsg_set(err, err_len,
                       "%s: record %ld at byte %llu: length CRC mismatch (stored 0x%08x, computed "
                       "0x%08x)",
                       path, count, (unsigned long long)off, want, have);
            goto out;
        }
        /* Never allocate more than the file could hold. */
        if (size < off + 12 || len > size - off - 12 || size - off - 12 - len < 4) {
            if (allow_tail)
                break;
            errmsg_set(err, err_len,
                       "%s: record %ld at byte %llu: length %llu runs past the end of the file "
                       "(%llu bytes)",
                       path, count, (unsigned long long)off, (unsigned long long)len,
                       (unsigned long long)size);
            goto out;
        }
        uint8_t *d = realloc(data, (size_t)len + 4);
        if (!d) {
            errmsg_set(err, err_len, "%s: record %ld at byte %llu: out of memory (%llu bytes)",
                       path, count, (unsigned long long)off, (unsigned long long)len);
            goto out;
        }
        data = d;
        got = fread(data, 1, (size_t)len + 4, fp);
        if (got < (size_t)len + 4) {
            if (!ferror(fp) && allow_tail)
                break;
            errmsg_set(err, err_len, "%s: record %ld at byte %llu: %s", path, count,
                       (unsigned long long)off,
                       ferror(fp) ? strerror(errno) : "truncated data");
            goto out;
        }
        want = tb_crc_unmask(get_u32(data + len));
        have = tb_crc32c(0, data, (size_t)len);
        if (want != have) {
            errmsg_set(err, err_len,
                       "%s: record %ld at byte %llu: data CRC mismatch (stored 0x%08x, computed "
                       "0x%08x)",
                       path, count, (unsigned long long)off, want, have);
            goto out;
        }
        count++;
        off += 12 + len + 4;
        if (fn && fn(ctx, data, (size_t)len) != 0)
            break;
    }
    rc = count;
out:
    free(data);
    fclose(fp);
    return rc;
}
