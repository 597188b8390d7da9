/* data.c — readers for text, llm.c token files, IDX (gzip'd or not) and
 * .npy, and the seeded sample streams over them.  See data.h. */
#include "data.h"

#include "errmsg.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define CHUNK (64u << 10)

typedef unsigned long long ull;

static int oom(const char *path, char *err, size_t err_len)
{
    return errmsg_set(err, err_len, "%s: out of memory", path);
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[3] | (uint32_t)p[2] << 8 | (uint32_t)p[1] << 16 | (uint32_t)p[0] << 24;
}

static bool host_le(void)
{
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/* ---- a file, read sequentially, gunzipped where it is gzip -------------- */

typedef struct {
    const char *path;
    int fd;
    uint64_t size;     /* st_size */
    bool gz;
    bool zinit;
    bool member_done;  /* the last gzip member ended; more input must be a new member */
    bool fd_eof;
    z_stream z;
    unsigned char *in;
    uint64_t raw_used; /* compressed bytes consumed by inflate before z.next_in */
    uint64_t out;      /* bytes delivered so far (after gunzip) */
    bool failed;       /* src_read reported an error */
} src;

static int src_open(src *s, const char *path, bool gz_ok, char *err, size_t err_len)
{
    memset(s, 0, sizeof *s);
    s->path = path;
    s->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (s->fd < 0)
        return errmsg_set(err, err_len, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(s->fd, &st) != 0) {
        int e = errno;
        close(s->fd);
        s->fd = -1;
        return errmsg_set(err, err_len, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(s->fd);
        s->fd = -1;
        return errmsg_set(err, err_len, "%s: %s", path,
                          S_ISDIR(st.st_mode) ? "is a directory" : "not a regular file");
    }
    s->size = (uint64_t)st.st_size;
    if (!gz_ok)
        return 0;
    unsigned char m[2];
    ssize_t r = pread(s->fd, m, 2, 0);
    if (r == 2 && m[0] == 0x1f && m[1] == 0x8b) {
        s->gz = true;
        s->in = malloc(CHUNK);
        if (!s->in) {
            close(s->fd);
            return oom(path, err, err_len);
        }
        if (inflateInit2(&s->z, 16 + MAX_WBITS) != Z_OK) {
            free(s->in);
            close(s->fd);
            return oom(path, err, err_len);
        }
        s->zinit = true;
    }
    return 0;
}

static void src_close(src *s)
{
    if (s->zinit)
        inflateEnd(&s->z);
    free(s->in);
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    s->in = NULL;
    s->zinit = false;
}

/* read(2) until n bytes or end of file. */
static ssize_t read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* Move unread input to the front of the buffer and read more after it. */
static int src_refill(src *s, char *err, size_t err_len)
{
    if (s->fd_eof)
        return 0;
    size_t keep = s->z.avail_in;
    if (keep)
        memmove(s->in, s->z.next_in, keep);
    ssize_t r = read_full(s->fd, s->in + keep, CHUNK - keep);
    if (r < 0)
        return errmsg_set(err, err_len, "%s: read error: %s", s->path, strerror(errno));
    if ((size_t)r < CHUNK - keep)
        s->fd_eof = true;
    s->z.next_in = s->in;
    s->z.avail_in = (uInt)(keep + (size_t)r);
    return 0;
}

static uint64_t src_raw_pos(const src *s)
{
    return s->raw_used;
}

/* Up to n bytes; fewer only at the end of the data.  -1 on error. */
static ssize_t src_read_(src *s, void *buf, size_t n, char *err, size_t err_len);
static ssize_t src_read(src *s, void *buf, size_t n, char *err, size_t err_len)
{
    ssize_t r = src_read_(s, buf, n, err, err_len);
    if (r < 0)
        s->failed = true;
    return r;
}

static ssize_t src_read_(src *s, void *buf, size_t n, char *err, size_t err_len)
{
    if (!s->gz) {
        ssize_t r = read_full(s->fd, buf, n);
        if (r < 0)
            return errmsg_set(err, err_len, "%s: read error: %s", s->path, strerror(errno));
        s->out += (uint64_t)r;
        return r;
    }
    size_t got = 0;
    while (got < n) {
        if (s->z.avail_in < 2 && src_refill(s, err, err_len) != 0)
            return -1;
        if (s->member_done) {
            if (s->z.avail_in == 0)
                break; /* clean end after the last member */
            if (s->z.avail_in < 2 || s->z.next_in[0] != 0x1f || s->z.next_in[1] != 0x8b) {
                uint64_t rest = s->size > src_raw_pos(s) ? s->size - src_raw_pos(s) : 0;
                return errmsg_set(err, err_len,
                                  "%s: %llu bytes of trailing garbage after the gzip stream "
                                  "(at file offset %llu)",
                                  s->path, (ull)rest, (ull)src_raw_pos(s));
            }
            inflateReset(&s->z);
            s->member_done = false;
        }
        if (s->z.avail_in == 0)
            return errmsg_set(err, err_len,
                              "%s: truncated gzip stream (ends after %llu compressed bytes, "
                              "%llu bytes decompressed)",
                              s->path, (ull)src_raw_pos(s), (ull)(s->out + got));
        size_t chunk = n - got > UINT_MAX ? UINT_MAX : n - got;
        s->z.next_out = (Bytef *)buf + got;
        s->z.avail_out = (uInt)chunk;
        uInt in_before = s->z.avail_in;
        int zr = inflate(&s->z, Z_NO_FLUSH);
        s->raw_used += in_before - s->z.avail_in;
        got += chunk - s->z.avail_out;
        if (zr == Z_STREAM_END) {
            s->member_done = true;
        } else if (zr == Z_BUF_ERROR) {
            /* no progress: inflate wants more input than there is */
            if (s->fd_eof && s->z.avail_in == in_before)
                return errmsg_set(err, err_len,
                                  "%s: truncated gzip stream (ends after %llu compressed bytes, "
                                  "%llu bytes decompressed)",
                                  s->path, (ull)src_raw_pos(s), (ull)(s->out + got));
            if (src_refill(s, err, err_len) != 0)
                return -1;
        } else if (zr == Z_MEM_ERROR) {
            return oom(s->path, err, err_len);
        } else if (zr != Z_OK) {
            return errmsg_set(err, err_len, "%s: corrupt gzip data near compressed offset %llu: %s",
                              s->path, (ull)src_raw_pos(s), s->z.msg ? s->z.msg : "inflate failed");
        }
    }
    s->out += got;
    return (ssize_t)got;
}

/* Read and discard the rest; *rest = how many bytes there were. */
static int src_drain(src *s, uint64_t *rest, char *err, size_t err_len)
{
    unsigned char buf[4096];
    *rest = 0;
    for (;;) {
        ssize_t r = src_read(s, buf, sizeof buf, err, err_len);
        if (r < 0)
            return -1;
        *rest += (uint64_t)r;
        if ((size_t)r < sizeof buf)
            return 0;
    }
}

/* After an error in the content of a gzip'd file: if the gzip stream itself
 * is damaged further on, that is the real cause, so report it instead. */
static void src_blame_gzip(src *s, char *err, size_t err_len)
{
    if (!s->gz || s->failed)
        return;
    char zerr[512];
    uint64_t rest;
    if (src_drain(s, &rest, zerr, sizeof zerr) != 0 && err && err_len)
        snprintf(err, err_len, "%s", zerr);
}

/* Read `total` bytes, keeping the first `keep` (≤ total) in a new buffer;
 * *got = bytes that were there (< total: the data ended early).  The buffer
 * grows as data arrives, so a header claiming more than the file holds
 * costs no more memory than the file. */
static int src_read_body(src *s, uint64_t total, uint64_t keep, unsigned char **out,
                         uint64_t *got, char *err, size_t err_len)
{
    *out = NULL;
    *got = 0;
    if (keep > SIZE_MAX / 2)
        return oom(s->path, err, err_len);
    size_t cap = 0;
    unsigned char *buf = NULL;
    unsigned char scratch[4096];
    while (*got < total) {
        uint64_t want = total - *got;
        unsigned char *dst;
        if (*got < keep) {
            if (*got == cap) {
                size_t ncap = cap ? cap * 2 : (size_t)1 << 20;
                if (!s->gz && s->size > s->out && ncap < s->size - s->out + cap)
                    ncap = (size_t)(s->size - s->out + cap); /* the file says how much */
                if (ncap > keep)
                    ncap = (size_t)keep;
                unsigned char *nb = realloc(buf, ncap ? ncap : 1);
                if (!nb) {
                    free(buf);
                    return oom(s->path, err, err_len);
                }
                buf = nb;
                cap = ncap;
            }
            dst = buf + *got;
            if (want > cap - *got)
                want = cap - *got;
        } else {
            dst = scratch;
            if (want > sizeof scratch)
                want = sizeof scratch;
        }
        ssize_t r = src_read(s, dst, (size_t)want, err, err_len);
        if (r < 0) {
            free(buf);
            return -1;
        }
        *got += (uint64_t)r;
        if ((uint64_t)r < want)
            break;
    }
    if (!buf && keep == 0)
        buf = malloc(1);
    if (!buf)
        return oom(s->path, err, err_len);
    *out = buf;
    return 0;
}

/* ---- text --------------------------------------------------------------- */

typedef struct {
    unsigned char *p;
    size_t n, cap;
} bytes;

static int append_file(bytes *b, const char *path, char *err, size_t err_len)
{
    src s;
    if (src_open(&s, path, false, err, err_len) != 0)
        return -1;
    for (;;) {
        if (b->cap - b->n < CHUNK) {
            size_t want = b->n + (s.size > s.out ? (size_t)(s.size - s.out) : 0) + CHUNK;
            size_t ncap = b->cap * 2 > want ? b->cap * 2 : want;
            unsigned char *np = realloc(b->p, ncap);
            if (!np) {
                src_close(&s);
                return oom(path, err, err_len);
            }
            b->p = np;
            b->cap = ncap;
        }
        size_t want = b->cap - b->n;
        ssize_t r = src_read(&s, b->p + b->n, want, err, err_len);
        if (r < 0) {
            src_close(&s);
            return -1;
        }
        b->n += (size_t)r;
        if ((size_t)r < want)
            break;
    }
    src_close(&s);
    return 0;
}

static bool text_name_ok(const char *name)
{
    size_t l = strlen(name);
    if (name[0] == '.')
        return false;
    if (l >= 4 && strcmp(name + l - 4, ".dat") == 0)
        return false;
    if (l >= 3 && strcmp(name + l - 3, ".u8") == 0)
        return false;
    return true;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int read_text_dir(bytes *b, const char *dir, char *err, size_t err_len)
{
    DIR *d = opendir(dir);
    if (!d)
        return errmsg_set(err, err_len, "%s: cannot open directory: %s", dir, strerror(errno));
    char **names = NULL;
    size_t nn = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!text_name_ok(e->d_name))
            continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, 0) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (nn == cap) {
            size_t ncap = cap ? cap * 2 : 64;
            char **nnames = realloc(names, ncap * sizeof *names);
            if (!nnames) {
                rc = oom(dir, err, err_len);
                break;
            }
            names = nnames;
            cap = ncap;
        }
        names[nn] = strdup(e->d_name);
        if (!names[nn]) {
            rc = oom(dir, err, err_len);
            break;
        }
        nn++;
    }
    closedir(d);
    if (rc == 0 && nn)
        qsort(names, nn, sizeof *names, cmp_names);
    for (size_t i = 0; rc == 0 && i < nn; i++) {
        char path[PATH_MAX];
        int l = snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (l < 0 || (size_t)l >= sizeof path)
            rc = errmsg_set(err, err_len, "%s/%s: path too long", dir, names[i]);
        else
            rc = append_file(b, path, err, err_len);
    }
    for (size_t i = 0; i < nn; i++)
        free(names[i]);
    free(names);
    if (rc == 0 && b->n == 0)
        rc = errmsg_set(err, err_len,
                        "%s: no text in the directory (its regular files, less dotfiles, *.dat "
                        "and *.u8, are empty or absent)",
                        dir);
    return rc;
}

static int load_text(data_tokens *t, const char *path, bool is_dir, char *err, size_t err_len)
{
    bytes b = {0};
    int rc = is_dir ? read_text_dir(&b, path, err, err_len) : append_file(&b, path, err, err_len);
    if (rc == 0 && b.n == 0)
        rc = errmsg_set(err, err_len, "%s: empty file (no tokens)", path);
    if (rc == 0) {
        t->tok = malloc(b.n * sizeof *t->tok);
        if (!t->tok)
            rc = oom(path, err, err_len);
    }
    if (rc == 0) {
        for (size_t i = 0; i < b.n; i++)
            t->tok[i] = b.p[i];
        t->n = b.n;
        t->data_offset = 0;
        t->elem_size = 1;
    }
    free(b.p);
    return rc;
}

/* ---- llm.c token files -------------------------------------------------- */

static int load_llmc(data_tokens *t, const char *path, char *err, size_t err_len)
{
    src s;
    if (src_open(&s, path, false, err, err_len) != 0)
        return -1;
    unsigned char h[DATA_LLMC_HEADER_BYTES];
    int rc = 0;
    ssize_t r = src_read(&s, h, sizeof h, err, err_len);
    if (r < 0) {
        rc = -1;
        goto out;
    }
    if (r >= 4 && le32(h) != DATA_LLMC_MAGIC) {
        rc = errmsg_set(err, err_len, "%s: bad magic %d (expected %d for an llm.c token file)", path,
                        (int32_t)le32(h), DATA_LLMC_MAGIC);
        goto out;
    }
    if ((size_t)r < sizeof h) {
        rc = errmsg_set(err, err_len,
                        "%s: truncated header: %zd bytes (an llm.c token file starts with a "
                        "%d-byte header)",
                        path, r, DATA_LLMC_HEADER_BYTES);
        goto out;
    }
    int32_t version = (int32_t)le32(h + 4), count = (int32_t)le32(h + 8);
    if (version != DATA_LLMC_VERSION) {
        rc = errmsg_set(err, err_len,
                        "%s: bad version %d in header field 1 (expected %d: uint16 tokens%s)", path,
                        version, DATA_LLMC_VERSION,
                        version == 2 ? "; version 2 files hold uint32 tokens, not supported" : "");
        goto out;
    }
    if (count <= 0) {
        rc = errmsg_set(err, err_len, "%s: token count %d in header field 2 (must be positive)", path,
                        count);
        goto out;
    }
    uint64_t want = DATA_LLMC_HEADER_BYTES + 2 * (uint64_t)count;
    if (s.size != want) {
        rc = errmsg_set(err, err_len,
                        "%s: %s: the header says %d tokens, so the file should be %llu bytes "
                        "(%d-byte header + 2 × %d), but it is %llu bytes",
                        path, s.size < want ? "truncated body" : "trailing bytes", count, (ull)want,
                        DATA_LLMC_HEADER_BYTES, count, (ull)s.size);
        goto out;
    }
    t->tok = malloc((size_t)count * sizeof *t->tok);
    if (!t->tok) {
        rc = oom(path, err, err_len);
        goto out;
    }
    r = src_read(&s, t->tok, (size_t)count * 2, err, err_len);
    if (r < 0) {
        rc = -1;
        goto out;
    }
    uint64_t rest = 0;
    if ((uint64_t)r < 2 * (uint64_t)count || src_drain(&s, &rest, err, err_len) != 0 || rest) {
        rc = errmsg_set(err, err_len, "%s: the file changed size while being read", path);
        goto out;
    }
    if (!host_le())
        for (size_t i = 0; i < (size_t)count; i++)
            t->tok[i] = (uint16_t)(t->tok[i] >> 8 | t->tok[i] << 8);
    t->n = (size_t)count;
    t->data_offset = DATA_LLMC_HEADER_BYTES;
    t->elem_size = 2;
out:
    src_close(&s);
    if (rc != 0) {
        free(t->tok);
        t->tok = NULL;
    }
    return rc;
}

/* ---- .npy --------------------------------------------------------------- */

static const struct {
    const char *descr;
    data_dtype dtype;
    unsigned size;
} npy_types[] = {
    {"<f4", DATA_F32, 4},
    {"<i4", DATA_I32, 4},
    {"<u2", DATA_U16, 2},
    {"|u1", DATA_U8, 1},
};

static unsigned dtype_size(data_dtype t)
{
    for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++)
        if (npy_types[i].dtype == t)
            return npy_types[i].size;
    return 0;
}

static const char *dtype_name(data_dtype t)
{
    for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++)
        if (npy_types[i].dtype == t)
            return npy_types[i].descr;
    return "?";
}

typedef struct {
    const char *p, *end;
} cur;

static void skip_ws(cur *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static bool eat(cur *c, char ch)
{
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return true;
    }
    return false;
}

/* A quoted Python string without escapes into out (NUL-terminated). */
static bool parse_str(cur *c, char *out, size_t out_len)
{
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
        return false;
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || (unsigned char)*c->p < 0x20 || n + 1 >= out_len)
            return false;
        out[n++] = *c->p++;
    }
    if (c->p >= c->end)
        return false;
    c->p++;
    out[n] = '\0';
    return true;
}

static bool parse_word(cur *c, const char *w)
{
    skip_ws(c);
    size_t l = strlen(w);
    if ((size_t)(c->end - c->p) >= l && memcmp(c->p, w, l) == 0) {
        c->p += l;
        return true;
    }
    return false;
}

/* Parse the header dict.  Returns NULL or a description of what is wrong. */
static const char *npy_parse_header(cur *c, data_npy *a, char *descr, size_t descr_len,
                                    bool *fortran)
{
    bool have_descr = false, have_fortran = false, have_shape = false;
    if (!eat(c, '{'))
        return "header is not a Python dict literal";
    for (;;) {
        if (eat(c, '}'))
            break;
        char key[32];
        if (!parse_str(c, key, sizeof key))
            return "expected a quoted key";
        if (!eat(c, ':'))
            return "expected ':' after a key";
        if (strcmp(key, "descr") == 0) {
            if (have_descr)
                return "key 'descr' given twice";
            if (!parse_str(c, descr, descr_len))
                return "'descr' is not a simple dtype string";
            have_descr = true;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (have_fortran)
                return "key 'fortran_order' given twice";
            if (parse_word(c, "True"))
                *fortran = true;
            else if (parse_word(c, "False"))
                *fortran = false;
            else
                return "'fortran_order' is not True or False";
            have_fortran = true;
        } else if (strcmp(key, "shape") == 0) {
            if (have_shape)
                return "key 'shape' given twice";
            if (!eat(c, '('))
                return "'shape' is not a tuple";
            a->ndim = 0;
            bool comma = false;
            for (;;) {
                if (eat(c, ')'))
                    break;
                if (a->ndim > 0 && !comma)
                    return "'shape': expected ',' or ')'";
                skip_ws(c);
                if (c->p >= c->end || *c->p < '0' || *c->p > '9')
                    return "'shape' holds something other than non-negative integers";
                if (a->ndim == DATA_NPY_MAX_DIMS)
                    return "'shape' has more than 8 dimensions";
                uint64_t v = 0;
                while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
                    if (v > (UINT64_MAX - 9) / 10)
                        return "'shape' has a dimension too large";
                    v = v * 10 + (uint64_t)(*c->p++ - '0');
                }
                a->shape[a->ndim++] = v;
                comma = eat(c, ',');
            }
            if (a->ndim == 1 && !comma)
                return "'shape': a 1-d shape needs a trailing comma, as in (3,)";
            have_shape = true;
        } else {
            return "unknown key in the header dict (expected only 'descr', 'fortran_order', "
                   "'shape')";
        }
        if (eat(c, ','))
            continue;
        if (eat(c, '}'))
            break;
        return "expected ',' or '}' in the header dict";
    }
    skip_ws(c);
    if (c->p != c->end)
        return "junk after the header dict";
    if (!have_descr)
        return "header lacks 'descr'";
    if (!have_fortran)
        return "header lacks 'fortran_order'";
    if (!have_shape)
        return "header lacks 'shape'";
    return NULL;
}

int data_npy_load(data_npy *a, const char *path, char *err, size_t err_len)
{
    memset(a, 0, sizeof *a);
    src s;
    if (src_open(&s, path, false, err, err_len) != 0)
        return -1;
    int rc = 0;
    char *hdr = NULL;
    unsigned char *body = NULL;
    unsigned char pre[12];
    ssize_t r = src_read(&s, pre, 10, err, err_len);
    if (r < 0) {
        rc = -1;
        goto out;
    }
    if (r < 6 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        rc = errmsg_set(err, err_len, "%s: not a .npy file (no \\x93NUMPY magic at offset 0)", path);
        goto out;
    }
    if (r < 10) {
        rc = errmsg_set(err, err_len, "%s: truncated .npy preamble (%zd bytes)", path, r);
        goto out;
    }
    unsigned major = pre[6], minor = pre[7];
    if ((major != 1 && major != 2 && major != 3) || minor != 0) {
        rc = errmsg_set(err, err_len,
                        "%s: unsupported .npy format version %u.%u (expected 1.0, 2.0 or 3.0)", path,
                        major, minor);
        goto out;
    }
    uint64_t hlen, hstart;
    if (major == 1) {
        hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8;
        hstart = 10;
    } else {
        if (src_read(&s, pre + 10, 2, err, err_len) != 2) {
            rc = errmsg_set(err, err_len, "%s: truncated .npy preamble", path);
            goto out;
        }
        hlen = le32(pre + 8);
        hstart = 12;
    }
    if (hlen > 65536) {
        rc = errmsg_set(err, err_len,
                        "%s: .npy header length %llu at offset 8 is too large (limit 65536)", path,
                        (ull)hlen);
        goto out;
    }
    hdr = malloc(hlen + 1);
    if (!hdr) {
        rc = oom(path, err, err_len);
        goto out;
    }
    r = src_read(&s, hdr, (size_t)hlen, err, err_len);
    if (r < 0) {
        rc = -1;
        goto out;
    }
    if ((uint64_t)r < hlen) {
        rc = errmsg_set(err, err_len, "%s: truncated .npy header: %llu bytes announced, %zd present",
                        path, (ull)hlen, r);
        goto out;
    }
    hdr[hlen] = '\0';
    if (hlen == 0 || hdr[hlen - 1] != '\n') {
        rc = errmsg_set(err, err_len, "%s: .npy header does not end with a newline", path);
        goto out;
    }
    for (uint64_t i = 0; i < hlen; i++)
        if (hdr[i] == '\0') {
            rc = errmsg_set(err, err_len, "%s: .npy header holds a NUL byte at offset %llu", path,
                            (ull)(hstart + i));
            goto out;
        }
    char descr[32] = "";
    bool fortran = false;
    cur c = {hdr, hdr + hlen};
    const char *why = npy_parse_header(&c, a, descr, sizeof descr, &fortran);
    if (why) {
        rc = errmsg_set(err, err_len, "%s: bad .npy header at offset %llu: %s", path,
                        (ull)(hstart + (uint64_t)(c.p - hdr)), why);
        goto out;
    }
    unsigned esize = 0;
    for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++)
        if (strcmp(descr, npy_types[i].descr) == 0) {
            a->dtype = npy_types[i].dtype;
            esize = npy_types[i].size;
        }
    if (!esize) {
        rc = errmsg_set(err, err_len,
                        "%s: unsupported .npy dtype '%s' (supported: '<f4', '<i4', '<u2', '|u1')", path,
                        descr);
        goto out;
    }
    if (fortran && a->ndim > 1) {
        rc = errmsg_set(err, err_len, "%s: Fortran-order .npy arrays are not supported (save in C order)",
                        path);
        goto out;
    }
    uint64_t count = 1;
    for (int i = 0; i < a->ndim; i++)
        if (__builtin_mul_overflow(count, a->shape[i], &count) || count > UINT64_MAX / 8) {
            rc = errmsg_set(err, err_len, "%s: .npy shape is too large (element count overflows)", path);
            goto out;
        }
    a->count = count;
    a->data_offset = hstart + hlen;
    uint64_t want = count * esize;
    uint64_t have = s.size > a->data_offset ? s.size - a->data_offset : 0;
    if (have != want) {
        char shape[200];
        size_t o = 0;
        o += (size_t)snprintf(shape + o, sizeof shape - o, "(");
        for (int i = 0; i < a->ndim && o < sizeof shape; i++)
            o += (size_t)snprintf(shape + o, sizeof shape - o, "%s%llu", i ? ", " : "",
                                  (ull)a->shape[i]);
        if (o < sizeof shape)
            snprintf(shape + o, sizeof shape - o, "%s)", a->ndim == 1 ? "," : "");
        rc = errmsg_set(err, err_len,
                        "%s: %s: shape %s of %s needs %llu data bytes after the %llu-byte header, "
                        "but the file has %llu",
                        path, have < want ? "truncated data" : "trailing bytes", shape, descr,
                        (ull)want, (ull)a->data_offset, (ull)have);
        goto out;
    }
    uint64_t got;
    if (src_read_body(&s, want, want, &body, &got, err, err_len) != 0) {
        rc = -1;
        goto out;
    }
    uint64_t rest = 0;
    if (got != want || src_drain(&s, &rest, err, err_len) != 0 || rest) {
        rc = errmsg_set(err, err_len, "%s: the file changed size while being read", path);
        goto out;
    }
    if (!host_le() && esize > 1)
        for (uint64_t i = 0; i < count; i++) {
            unsigned char *e = body + i * esize;
            for (unsigned k = 0; k < esize / 2; k++) {
                unsigned char x = e[k];
                e[k] = e[esize - 1 - k];
                e[esize - 1 - k] = x;
            }
        }
    a->data = body;
    body = NULL;
out:
    free(hdr);
    free(body);
    src_close(&s);
    if (rc != 0) {
        memset(a, 0, sizeof *a);
    }
    return rc;
}

void data_npy_free(data_npy *a)
{
    if (!a)
        return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

static int64_t npy_int(const data_npy *a, uint64_t i)
{
    switch (a->dtype) {
    case DATA_U8:
        return ((const uint8_t *)a->data)[i];
    case DATA_U16:
        return ((const uint16_t *)a->data)[i];
    case DATA_I32:
        return ((const int32_t *)a->data)[i];
    default:
        return -1;
    }
}

static int load_npy_tokens(data_tokens *t, const char *path, char *err, size_t err_len)
{
    data_npy a;
    if (data_npy_load(&a, path, err, err_len) != 0)
        return -1;
    int rc = 0;
    if (a.ndim != 1 || a.dtype == DATA_F32) {
        rc = errmsg_set(err, err_len,
                        "%s: a token .npy must be 1-d '<u2', '<i4' or '|u1', not %d-d '%s'", path,
                        a.ndim, dtype_name(a.dtype));
        goto out;
    }
    if (a.count == 0) {
        rc = errmsg_set(err, err_len, "%s: empty array (no tokens)", path);
        goto out;
    }
    if (a.dtype == DATA_U16) {
        t->tok = a.data;
        a.data = NULL;
    } else {
        t->tok = malloc((size_t)a.count * sizeof *t->tok);
        if (!t->tok) {
            rc = oom(path, err, err_len);
            goto out;
        }
        for (uint64_t i = 0; i < a.count; i++) {
            int64_t v = npy_int(&a, i);
            if (v < 0 || v > UINT16_MAX) {
                rc = errmsg_set(err, err_len,
                                "%s: token %lld at index %llu (byte offset %llu) does not fit uint16 "
                                "token storage (0..65535)",
                                path, (long long)v, (ull)i,
                                (ull)(a.data_offset + i * dtype_size(a.dtype)));
                free(t->tok);
                t->tok = NULL;
                goto out;
            }
            t->tok[i] = (uint16_t)v;
        }
    }
    t->n = (size_t)a.count;
    t->data_offset = a.data_offset;
    t->elem_size = dtype_size(a.dtype);
out:
    data_npy_free(&a);
    return rc;
}

/* ---- tokens ------------------------------------------------------------- */

int data_format_parse(const char *name, data_format *out)
{
    static const struct {
        const char *name;
        data_format f;
    } names[] = {{"auto", DATA_FMT_AUTO}, {"text", DATA_FMT_TEXT}, {"llmc", DATA_FMT_LLMC},
                 {"npy", DATA_FMT_NPY}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (name && strcmp(name, names[i].name) == 0) {
            *out = names[i].f;
            return 0;
        }
    return -1;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static void set_source(char *dst, const char *path)
{
    snprintf(dst, DATA_SOURCE_MAX, "%s", path);
}

static void tokens_finish(data_tokens *t)
{
    uint32_t m = 0;
    for (size_t i = 0; i < t->n; i++)
        if (t->tok[i] > m)
            m = t->tok[i];
    t->max_token = m;
}

int data_tokens_load(data_tokens *t, const char *path, data_format fmt, uint32_t vocab,
                     char *err, size_t err_len)
{
    memset(t, 0, sizeof *t);
    struct stat st;
    if (stat(path, &st) != 0)
        return errmsg_set(err, err_len, "%s: cannot open: %s", path, strerror(errno));
    bool is_dir = S_ISDIR(st.st_mode);
    if (is_dir && fmt != DATA_FMT_AUTO && fmt != DATA_FMT_TEXT)
        return errmsg_set(err, err_len, "%s: is a directory (only text can be read from a directory)",
                          path);
    if (fmt == DATA_FMT_AUTO) {
        fmt = DATA_FMT_TEXT;
        if (!is_dir) {
            unsigned char m[6] = {0};
            ssize_t r = -1;
            int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
            if (fd >= 0) {
                r = read_full(fd, m, sizeof m);
                close(fd);
            }
            if (r >= 4 && le32(m) == DATA_LLMC_MAGIC)
                fmt = DATA_FMT_LLMC;
            else if (r == 6 && memcmp(m, "\x93NUMPY", 6) == 0)
                fmt = DATA_FMT_NPY;
            else if (ends_with(path, ".bin"))
                fmt = DATA_FMT_LLMC;
            else if (ends_with(path, ".npy"))
                fmt = DATA_FMT_NPY;
        }
    }
    int rc;
    switch (fmt) {
    case DATA_FMT_LLMC:
        rc = load_llmc(t, path, err, err_len);
        break;
    case DATA_FMT_NPY:
        rc = load_npy_tokens(t, path, err, err_len);
        break;
    default:
        rc = load_text(t, path, is_dir, err, err_len);
        break;
    }
    if (rc != 0) {
        memset(t, 0, sizeof *t);
        return -1;
    }
    set_source(t->source, path);
    tokens_finish(t);
    if (vocab && data_tokens_check_vocab(t, vocab, err, err_len) != 0) {
        data_tokens_free(t);
        return -1;
    }
    return 0;
}

int data_tokens_check_vocab(const data_tokens *t, uint32_t vocab, char *err, size_t err_len)
{
    if (t->max_token < vocab)
        return 0;
    for (size_t i = 0; i < t->n; i++)
        if (t->tok[i] >= vocab)
            return errmsg_set(err, err_len,
                              "%s: token %u at index %zu (byte offset %llu) is out of range for vocab %u",
                              t->source, t->tok[i], i,
                              (ull)(t->data_offset + (uint64_t)i * t->elem_size), vocab);
    return 0;
}

int data_tokens_split(data_tokens *train, data_tokens *val, double fraction, char *err,
                      size_t err_len)
{
    memset(val, 0, sizeof *val);
    if (!(fraction > 0 && fraction < 1))
        return errmsg_set(err, err_len, "%s: validation fraction %g is not between 0 and 1",
                          train->source, fraction);
    size_t nv = (size_t)((double)train->n * fraction);
    if (nv == 0 || nv >= train->n)
        return errmsg_set(err, err_len,
                          "%s: %zu tokens are too few to hold out a validation fraction of %g",
                          train->source, train->n, fraction);
    size_t nt = train->n - nv;
    val->tok = malloc(nv * sizeof *val->tok);
    if (!val->tok)
        return oom(train->source, err, err_len);
    memcpy(val->tok, train->tok + nt, nv * sizeof *val->tok);
    val->n = nv;
    val->elem_size = train->elem_size;
    val->data_offset = train->data_offset + (uint64_t)nt * train->elem_size;
    snprintf(val->source, sizeof val->source, "%.*s (validation: last %zu tokens)", PATH_MAX,
             train->source, nv);
    train->n = nt;
    tokens_finish(train);
    tokens_finish(val);
    return 0;
}

void data_tokens_free(data_tokens *t)
{
    if (!t)
        return;
    free(t->tok);
    memset(t, 0, sizeof *t);
}

/* ---- IDX ---------------------------------------------------------------- */

typedef struct {
    uint64_t n, rows, cols; /* rows = cols = 1 for labels */
    unsigned char *data;    /* the first keep records */
} idx_file;

static int load_idx(idx_file *f, const char *path, bool images, uint64_t limit, char *err,
                    size_t err_len)
{
    memset(f, 0, sizeof *f);
    src s;
    if (src_open(&s, path, true, err, err_len) != 0)
        return -1;
    const char *z = s.gz ? " (decompressed)" : "";
    const char *what = images ? "images" : "labels";
    uint32_t want_magic = images ? DATA_IDX_IMAGES_MAGIC : DATA_IDX_LABELS_MAGIC;
    unsigned ndim = images ? 3 : 1;
    unsigned char h[16];
    int rc = 0;
    ssize_t r = src_read(&s, h, 4, err, err_len);
    if (r < 0) {
        rc = -1;
        goto out;
    }
    if (r < 4) {
        rc = errmsg_set(err, err_len, "%s: too short for an IDX %s file: %zd bytes%s", path, what, r, z);
        goto out;
    }
    if (be32(h) != want_magic) {
        rc = errmsg_set(err, err_len, "%s: bad magic 0x%08x (expected 0x%08x for IDX ubyte %s%s)", path,
                        be32(h), want_magic, what,
                        be32(h) == (images ? DATA_IDX_LABELS_MAGIC : DATA_IDX_IMAGES_MAGIC)
                      ? images ? "; this is a labels file" : "; this is an images file"
                      : "");
        goto out;
    }
    r = src_read(&s, h + 4, 4 * ndim, err, err_len);
    if (r < 0) {
        rc = -1;
        goto out;
    }
    if ((size_t)r < 4 * ndim) {
        rc = errmsg_set(err, err_len, "%s: truncated IDX header: %zd of %u bytes%s", path, 4 + r,
                        4 + 4 * ndim, z);
        goto out;
    }
    uint64_t d[3] = {be32(h + 4), 1, 1};
    static const char *dim_names[] = {"count", "rows", "cols"};
    if (images) {
        d[1] = be32(h + 8);
        d[2] = be32(h + 12);
    }
    for (unsigned i = 0; i < ndim; i++)
        if (d[i] == 0) {
            rc = errmsg_set(err, err_len, "%s: IDX dimension %u (%s) is 0", path, i, dim_names[i]);
            goto out;
        }
    uint64_t hbytes = 4 + 4 * (uint64_t)ndim;
    uint64_t rec = d[1] * d[2], total;
    if (__builtin_mul_overflow(d[0], rec, &total) || total > ((uint64_t)1 << 40)) {
        rc = errmsg_set(err, err_len, "%s: IDX dimensions %llu×%llu×%llu are too large", path,
                        (ull)d[0], (ull)d[1], (ull)d[2]);
        goto out;
    }
    char dims[96];
    if (images)
        snprintf(dims, sizeof dims, "%llu×%llu×%llu", (ull)d[0], (ull)d[1], (ull)d[2]);
    else
        snprintf(dims, sizeof dims, "%llu", (ull)d[0]);
    if (!s.gz && s.size < hbytes + total) {
        rc = errmsg_set(err, err_len,
                        "%s: truncated body: the header says %s %s, so the file should be %llu bytes "
                        "(%llu-byte header + %llu), but it is %llu bytes",
                        path, dims, what, (ull)(hbytes + total), (ull)hbytes, (ull)total, (ull)s.size);
        goto out;
    }
    uint64_t keep_n = limit && limit < d[0] ? limit : d[0];
    uint64_t got;
    if (src_read_body(&s, total, keep_n * rec, &f->data, &got, err, err_len) != 0) {
        rc = -1;
        goto out;
    }
    uint64_t rest = 0;
    if (got == total && src_drain(&s, &rest, err, err_len) != 0) {
        rc = -1;
        goto out;
    }
    if (got < total || rest) {
        rc = errmsg_set(err, err_len,
                        "%s: %s: the header says %s %s, so %llu bytes should follow the %llu-byte "
                        "header, but %llu do%s",
                        path, got < total ? "truncated body" : "trailing bytes", dims, what, (ull)total,
                        (ull)hbytes, (ull)(got + rest), z);
        goto out;
    }
    f->n = d[0];
    f->rows = d[1];
    f->cols = d[2];
out:
    if (rc != 0)
        src_blame_gzip(&s, err, err_len);
    src_close(&s);
    if (rc != 0) {
        free(f->data);
        f->data = NULL;
    }
    return rc;
}

static bool is_npy(const char *path)
{
    unsigned char m[6];
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return false;
    ssize_t r = read_full(fd, m, sizeof m);
    close(fd);
    return r == 6 && memcmp(m, "\x93NUMPY", 6) == 0;
}

/* Images into d (n, rows, cols, u8 or f32): the first `limit` (0: all) of
 * *total. */
static int load_image_part(data_images *d, const char *path, uint64_t limit, uint64_t *total,
                           char *err, size_t err_len)
{
    if (!is_npy(path)) {
        idx_file f;
        if (load_idx(&f, path, true, limit, err, err_len) != 0)
            return -1;
        *total = f.n;
        d->n = (size_t)(limit && limit < f.n ? limit : f.n);
        d->rows = (size_t)f.rows;
        d->cols = (size_t)f.cols;
        d->u8 = f.data;
        return 0;
    }
    data_npy a;
    if (data_npy_load(&a, path, err, err_len) != 0)
        return -1;
    int rc = 0;
    if ((a.ndim != 2 && a.ndim != 3) || (a.dtype != DATA_U8 && a.dtype != DATA_F32)) {
        rc = errmsg_set(err, err_len,
                        "%s: an image .npy must be (N, rows, cols) or (N, D) of '|u1' or '<f4', not "
                        "%d-d '%s'",
                        path, a.ndim, dtype_name(a.dtype));
        goto out;
    }
    uint64_t rows = a.ndim == 3 ? a.shape[1] : 1, cols = a.shape[a.ndim - 1];
    if (a.shape[0] == 0 || rows == 0 || cols == 0) {
        rc = errmsg_set(err, err_len, "%s: image .npy has a zero dimension", path);
        goto out;
    }
    uint64_t dim = rows * cols;
    if (a.dtype == DATA_F32) {
        const float *x = a.data;
        for (uint64_t i = 0; i < a.count; i++)
            if (!isfinite(x[i])) {
                rc = errmsg_set(err, err_len,
                                "%s: pixel value %g at index %llu (image %llu, byte offset %llu) is not "
                                "finite",
                                path, (double)x[i], (ull)i, (ull)(i / dim),
                                (ull)(a.data_offset + 4 * i));
                goto out;
            }
    }
    *total = a.shape[0];
    d->n = (size_t)(limit && limit < a.shape[0] ? limit : a.shape[0]);
    d->rows = (size_t)rows;
    d->cols = (size_t)cols;
    if (d->n < a.shape[0]) { /* give back what the subset does not need */
        void *np = realloc(a.data, d->n * (size_t)dim * dtype_size(a.dtype));
        if (np)
            a.data = np;
    }
    if (a.dtype == DATA_F32)
        d->f32 = a.data;
    else
        d->u8 = a.data;
    a.data = NULL;
out:
    data_npy_free(&a);
    return rc;
}

/* Labels: *n of them (all, for the count check), the first keep in *out. */
static int load_label_part(const char *path, uint64_t limit, uint32_t classes, int32_t **out,
                           uint64_t *n, uint32_t *max_label, char *err, size_t err_len)
{
    *out = NULL;
    data_npy a = {0};
    idx_file f = {0};
    uint64_t count;
    int rc = 0;
    if (is_npy(path)) {
        if (data_npy_load(&a, path, err, err_len) != 0)
            return -1;
        if (a.ndim != 1 || a.dtype == DATA_F32) {
            rc = errmsg_set(err, err_len,
                            "%s: a label .npy must be 1-d '|u1', '<u2' or '<i4', not %d-d '%s'", path,
                            a.ndim, dtype_name(a.dtype));
            goto out;
        }
        count = a.count;
    } else {
        if (load_idx(&f, path, false, 0, err, err_len) != 0)
            return -1;
        a.dtype = DATA_U8;
        a.data = f.data;
        a.data_offset = 8;
        f.data = NULL;
        count = f.n;
    }
    if (count == 0) {
        rc = errmsg_set(err, err_len, "%s: no labels", path);
        goto out;
    }
    int64_t m = 0;
    for (uint64_t i = 0; i < count; i++) {
        int64_t v = npy_int(&a, i);
        if (v < 0 || (classes && v >= classes) || v > INT32_MAX - 1) {
            char range[48] = "";
            if (classes)
                snprintf(range, sizeof range, " for %u classes", classes);
            rc = errmsg_set(err, err_len,
                            "%s: label %lld at record %llu (byte offset %llu) is out of range%s", path,
                            (long long)v, (ull)i,
                            (ull)(a.data_offset + i * dtype_size(a.dtype)), range);
            goto out;
        }
        if (v > m)
            m = v;
    }
    uint64_t keep = limit && limit < count ? limit : count;
    *out = malloc((size_t)keep * sizeof **out);
    if (!*out) {
        rc = oom(path, err, err_len);
        goto out;
    }
    for (uint64_t i = 0; i < keep; i++)
        (*out)[i] = (int32_t)npy_int(&a, i);
    *n = count;
    *max_label = (uint32_t)m;
out:
    data_npy_free(&a);
    free(f.data);
    return rc;
}

int data_images_load(data_images *d, const char *images_path, const char *labels_path,
                     uint32_t classes, size_t limit, char *err, size_t err_len)
{
    memset(d, 0, sizeof *d);
    uint64_t total = 0;
    if (load_image_part(d, images_path, limit, &total, err, err_len) != 0)
        return -1;
    int32_t *labels = NULL;
    uint64_t nl = 0;
    uint32_t max_label = 0;
    if (load_label_part(labels_path, limit, classes, &labels, &nl, &max_label, err, err_len) != 0)
        goto fail;
    if (nl != total) {
        errmsg_set(err, err_len, "%s: %llu labels, but %s holds %llu images", labels_path, (ull)nl,
                   images_path, (ull)total);
        goto fail;
    }
    d->dim = d->rows * d->cols;
    d->labels = labels;
    d->classes = classes ? classes : max_label + 1;
    set_source(d->source, images_path);
    return 0;
fail:
    free(labels);
    data_images_free(d);
    return -1;
}

/* v / 255, exactly.  Blocks of a fixed 16 let gcc -O2 vectorise the
 * division (its cheap cost model skips loops that need an epilogue): 4×
 * faster than the plain loop. */
static void scale_u8(const uint8_t *restrict p, float *restrict o, size_t n)
{
    size_t k = 0;
    for (; k + 16 <= n; k += 16)
        for (int j = 0; j < 16; j++)
            o[k + j] = (float)p[k + j] / 255.0f;
    for (; k < n; k++)
        o[k] = (float)p[k] / 255.0f;
}

void data_images_get(const data_images *d, size_t i, float *out)
{
    if (d->u8) {
        scale_u8(d->u8 + i * d->dim, out, d->dim);
    } else {
        memcpy(out, d->f32 + i * d->dim, d->dim * sizeof *out);
    }
}

void data_images_free(data_images *d)
{
    if (!d)
        return;
    free(d->u8);
    free(d->f32);
    free(d->labels);
    memset(d, 0, sizeof *d);
}

/* ---- the seeded stream -------------------------------------------------- */

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, bound), bound > 0, by rejection. */
static uint64_t below(uint64_t *x, uint64_t bound)
{
    uint64_t lim = UINT64_MAX - UINT64_MAX % bound;
    for (;;) {
        uint64_t r = splitmix(x);
        if (r < lim)
            return r % bound;
    }
}

static void stream_epoch(data_stream *s)
{
    uint64_t x = s->seed;
    uint64_t e = s->epoch;
    x = splitmix(&x) ^ splitmix(&e);
    s->offset = s->max_offset ? below(&x, s->max_offset + 1) : 0;
    for (uint64_t i = 0; i < s->size; i++)
        s->order[i] = i;
    for (uint64_t i = s->size; i > 1; i--) {
        uint64_t j = below(&x, i);
        uint64_t t = s->order[i - 1];
        s->order[i - 1] = s->order[j];
        s->order[j] = t;
    }
}

/* Whether t holds one sample of context T (T+1 tokens): 0, or -1 with the
 * reason.  Training windows and evaluation windows alike need one. */
static int tokens_fit(const data_tokens *t, size_t T, char *err, size_t err_len)
{
    if (T == 0)
        return errmsg_set(err, err_len, "%s: context length 0", t->source);
    if (t->n < 2 || t->n - 1 < T)
        return errmsg_set(err, err_len,
                          "%s: %zu tokens are too few for context %zu (a sample needs %zu)",
                          t->source, t->n, T, T + 1);
    return 0;
}

static int stream_init(data_stream *s, uint64_t size, const char *source, char *err,
                       size_t err_len)
{
    if (size > SIZE_MAX / sizeof *s->order)
        return oom(source, err, err_len);
    s->size = size;
    s->order = malloc((size_t)size * sizeof *s->order);
    if (!s->order)
        return oom(source, err, err_len);
    stream_epoch(s);
    return 0;
}

int data_stream_tokens(data_stream *s, const data_tokens *t, size_t T, uint64_t seed,
                       char *err, size_t err_len)
{
    memset(s, 0, sizeof *s);
    if (tokens_fit(t, T, err, err_len) != 0)
        return -1;
    /* Windows of T+1 tokens at stride T; keep room to shift them by up to
     * T-1 per epoch, at the price of one window when the tail is short. */
    uint64_t w = (t->n - 1) / T, slack = (t->n - 1) - w * T;
    if (w >= 2 && slack < T - 1) {
        w--;
        slack += T;
    }
    s->tokens = t;
    s->T = T;
    s->seed = seed;
    s->max_offset = slack < T - 1 ? slack : T - 1;
    return stream_init(s, w, t->source, err, err_len);
}

int data_stream_images(data_stream *s, const data_images *d, uint64_t seed, char *err,
                       size_t err_len)
{
    memset(s, 0, sizeof *s);
    if (d->n == 0)
        return errmsg_set(err, err_len, "%s: no images", d->source);
    s->images = d;
    s->seed = seed;
    return stream_init(s, d->n, d->source, err, err_len);
}

uint64_t data_stream_epoch_size(const data_stream *s)
{
    return s->size;
}

void data_stream_state(const data_stream *s, uint64_t *epoch, uint64_t *index)
{
    *epoch = s->epoch;
    *index = s->index;
}

int data_stream_set_state(data_stream *s, uint64_t epoch, uint64_t index, char *err,
                          size_t err_len)
{
    if (index >= s->size)
        return errmsg_set(err, err_len,
                          "%s: saved data position %llu is past the epoch's %llu samples (did the data "
                          "or the context change since the checkpoint?)",
                          s->tokens ? s->tokens->source : s->images->source, (ull)index, (ull)s->size);
    if (epoch != s->epoch) {
        s->epoch = epoch;
        stream_epoch(s);
    }
    s->index = index;
    return 0;
}

/* The next sample's number within the data; moves the position on. */
static uint64_t stream_take(data_stream *s)
{
    uint64_t k = s->order[s->index++];
    if (s->index == s->size) {
        s->epoch++;
        s->index = 0;
        stream_epoch(s);
    }
    return k;
}

static void copy_window(const data_tokens *t, size_t start, size_t T, int32_t *in, int32_t *tgt)
{
    const uint16_t *p = t->tok + start;
    for (size_t j = 0; j < T; j++) {
        in[j] = p[j];
        tgt[j] = p[j + 1];
    }
}

void data_stream_next_tokens(data_stream *s, size_t n, int32_t *inputs, int32_t *targets)
{
    size_t T = s->T;
    for (size_t i = 0; i < n; i++) {
        uint64_t off = s->offset; /* the epoch may turn inside stream_take */
        uint64_t k = stream_take(s);
        copy_window(s->tokens, (size_t)(off + k * T), T, inputs + i * T, targets + i * T);
    }
}

void data_stream_next_images(data_stream *s, size_t n, float *x, int32_t *y)
{
    const data_images *d = s->images;
    for (size_t i = 0; i < n; i++) {
        uint64_t k = stream_take(s);
        data_images_get(d, (size_t)k, x + i * d->dim);
        y[i] = d->labels[k];
    }
}

void data_stream_free(data_stream *s)
{
    if (!s)
        return;
    free(s->order);
    memset(s, 0, sizeof *s);
}

/* ---- evaluation --------------------------------------------------------- */

int data_eval_tokens(data_eval *e, const data_tokens *t, size_t T, char *err, size_t err_len)
{
    memset(e, 0, sizeof *e);
    if (tokens_fit(t, T, err, err_len) != 0)
        return -1;
    e->tokens = t;
    e->T = T;
    e->size = (t->n - 1) / T;
    return 0;
}

void data_eval_images(data_eval *e, const data_images *d)
{
    memset(e, 0, sizeof *e);
    e->images = d;
    e->size = d->n;
}

size_t data_eval_next_tokens(data_eval *e, size_t max, int32_t *inputs, int32_t *targets)
{
    size_t n = 0;
    for (; n < max && e->pos < e->size; n++, e->pos++)
        copy_window(e->tokens, (size_t)(e->pos * e->T), e->T, inputs + n * e->T,
                    targets + n * e->T);
    return n;
}

size_t data_eval_next_images(data_eval *e, size_t max, float *x, int32_t *y)
{
    const data_images *d = e->images;
    size_t n = 0;
    for (; n < max && e->pos < e->size; n++, e->pos++) {
        data_images_get(d, (size_t)e->pos, x + n * d->dim);
        y[n] = d->labels[e->pos];
    }
    return n;
}

void data_eval_reset(data_eval *e)
{
    e->pos = 0;
}
