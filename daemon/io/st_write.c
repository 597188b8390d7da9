/* st_write.c — the safetensors writer: tensors and metadata collected by
 * st_writer, the header encoded by jansson, the file written atomically.
 * See safetensors.h for the format and the contracts. */
#include "safetensors.h"

#include "errmsg.h"
#include "fileio.h"
#include "utf8.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- writer ---------------------------------------------------------------- */

/* The header bytes: length prefix, JSON, padding. */
typedef struct {
    char *p;
    size_t n;
} header;

typedef struct {
    char *name;
    st_dtype dtype;
    int ndim;
    uint64_t shape[ST_MAX_DIMS];
    const void *data;
    uint64_t bytes;
} w_tensor;

typedef struct {
    char *key, *value;
} w_meta;

struct st_writer {
    w_tensor *t;
    size_t nt, capt;
    w_meta *m;
    size_t nm, capm;
    bool failed;
    char first_err[512];
    st_stage fail_stage;
    int fail_errno;
};

st_writer *st_writer_new(void)
{
    return calloc(1, sizeof(st_writer));
}

void st_writer_free(st_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->nt; i++)
        free(w->t[i].name);
    for (size_t i = 0; i < w->nm; i++) {
        free(w->m[i].key);
        free(w->m[i].value);
    }
    free(w->t);
    free(w->m);
    free(w);
}

void st_writer_fail_at(st_writer *w, st_stage stage, int errnum)
{
    w->fail_stage = stage;
    w->fail_errno = errnum;
}

/* Record an add-time error: returned to the caller and kept (first one). */
__attribute__((format(printf, 4, 5))) static int add_fail(st_writer *w, char *err,
                                                          size_t len, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!w->failed) {
        w->failed = true;
        snprintf(w->first_err, sizeof w->first_err, "%s", msg);
    }
    errmsg_set(err, len, "%s", msg);
    return -1;
}

int st_writer_add(st_writer *w, const char *name, st_dtype dtype, int ndim,
                  const uint64_t *shape, const void *data, size_t bytes, char *err,
                  size_t err_len)
{
    char qn[200], sh[200];
    if (!name || !*name)
        return add_fail(w, err, err_len, "empty tensor name");
    st_quote(qn, sizeof qn, name);
    if (!utf8_valid(name))
        return add_fail(w, err, err_len, "tensor '%s': name is not valid UTF-8", qn);
    if (strcmp(name, "__metadata__") == 0)
        return add_fail(w, err, err_len, "tensor '%s': name is reserved", qn);
    if ((unsigned)dtype >= ST_DTYPE_COUNT)
        return add_fail(w, err, err_len, "tensor '%s': invalid dtype %d", qn, (int)dtype);
    if (ndim < 0 || ndim > ST_MAX_DIMS)
        return add_fail(w, err, err_len, "tensor '%s': %d dimensions (0 to %d allowed)", qn,
                        ndim, ST_MAX_DIMS);
    if (ndim > 0 && !shape)
        return add_fail(w, err, err_len, "tensor '%s': no shape", qn);
    uint64_t nelem, want;
    if (!st_shape_bytes(ndim, shape, st_dtype_size(dtype), &nelem, &want)) {
        st_shape_str(sh, sizeof sh, ndim, shape);
        return add_fail(w, err, err_len, "tensor '%s': shape %s overflows", qn, sh);
    }
    if (want != (uint64_t)bytes) {
        st_shape_str(sh, sizeof sh, ndim, shape);
        return add_fail(w, err, err_len,
                        "tensor '%s': %zu bytes given for shape %s of %s (%llu bytes)", qn,
                        bytes, sh, st_dtype_name(dtype), (unsigned long long)want);
    }
    /* A dimension over 2^63 - 1 passes the size checks only in an empty
     * tensor; the header's integers are signed 64-bit, for jansson and for
     * the reader. */
    for (int i = 0; i < ndim; i++)
        if (shape[i] > INT64_MAX)
            return add_fail(w, err, err_len, "tensor '%s': dimension %llu exceeds %lld", qn,
                            (unsigned long long)shape[i], (long long)INT64_MAX);
    if (bytes > 0 && !data)
        return add_fail(w, err, err_len, "tensor '%s': no data", qn);
    if (w->nt == w->capt) {
        size_t cap = w->capt ? 2 * w->capt : 16;
        w_tensor *t = realloc(w->t, cap * sizeof *t);
        if (!t)
            return add_fail(w, err, err_len, "tensor '%s': out of memory", qn);
        w->t = t;
        w->capt = cap;
    }
    w_tensor *t = &w->t[w->nt];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name)
        return add_fail(w, err, err_len, "tensor '%s': out of memory", qn);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->data = data;
    t->bytes = bytes;
    w->nt++;
    return 0;
}

int st_writer_meta(st_writer *w, const char *key, const char *value, char *err,
                   size_t err_len)
{
    char qk[200];
    if (!key || !value)
        return add_fail(w, err, err_len, "metadata: NULL key or value");
    st_quote(qk, sizeof qk, key);
    if (!utf8_valid(key))
        return add_fail(w, err, err_len, "metadata '%s': key is not valid UTF-8", qk);
    if (!utf8_valid(value))
        return add_fail(w, err, err_len, "metadata '%s': value is not valid UTF-8", qk);
    if (w->nm == w->capm) {
        size_t cap = w->capm ? 2 * w->capm : 8;
        w_meta *m = realloc(w->m, cap * sizeof *m);
        if (!m)
            return add_fail(w, err, err_len, "metadata '%s': out of memory", qk);
        w->m = m;
        w->capm = cap;
    }
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return add_fail(w, err, err_len, "metadata '%s': out of memory", qk);
    }
    w->m[w->nm].key = k;
    w->m[w->nm].value = v;
    w->nm++;
    return 0;
}

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* First duplicate among n strings, or NULL. */
static const char *find_dup(const char **v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_str_ptr);
    for (size_t i = 1; i < n; i++)
        if (strcmp(v[i - 1], v[i]) == 0)
            return v[i];
    return NULL;
}

/* One tensor's entry, {"dtype":..,"shape":[..],"data_offsets":[begin,end]};
 * NULL when out of memory.  The json_*_new calls take their argument's
 * reference even when they fail, so nothing leaks on the way out. */
static json_t *tensor_entry(const w_tensor *t, uint64_t begin, uint64_t end)
{
    json_t *e = json_object(), *shape = json_array(), *offsets = json_array();
    int bad = !e || !shape || !offsets;
    for (int d = 0; d < t->ndim; d++)
        bad |= json_array_append_new(shape, json_integer((json_int_t)t->shape[d]));
    bad |= json_array_append_new(offsets, json_integer((json_int_t)begin));
    bad |= json_array_append_new(offsets, json_integer((json_int_t)end));
    bad |= json_object_set_new(e, "dtype", json_string(st_dtype_name(t->dtype)));
    bad |= json_object_set_new(e, "shape", shape);
    bad |= json_object_set_new(e, "data_offsets", offsets);
    if (bad) {
        json_decref(e);
        return NULL;
    }
    return e;
}

/* Build the header (length prefix included, padded) into *out.  order
 * receives the tensors' write order.  The message does not name the file. */
static int build_header(st_writer *w, header *out, size_t *order, char *err, size_t len)
{
    char q[200];
    if (w->failed) {
        errmsg_set(err, len, "%s", w->first_err);
        return -1;
    }
    size_t nn = w->nt > w->nm ? w->nt : w->nm;
    const char **names = malloc((nn ? nn : 1) * sizeof *names);
    if (!names) {
        errmsg_set(err, len, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < w->nt; i++)
        names[i] = w->t[i].name;
    const char *dup = find_dup(names, w->nt);
    if (dup) {
        errmsg_set(err, len, "tensor '%s': added twice", st_quote(q, sizeof q, dup));
        free(names);
        return -1;
    }
    for (size_t i = 0; i < w->nm; i++)
        names[i] = w->m[i].key;
    dup = find_dup(names, w->nm);
    free(names);
    if (dup) {
        errmsg_set(err, len, "metadata '%s': added twice", st_quote(q, sizeof q, dup));
        return -1;
    }

    /* Largest elements first, otherwise in order of addition: every tensor
     * then starts at a multiple of its element size. */
    size_t k = 0;
    for (size_t sz = 8; sz >= 1; sz /= 2)
        for (size_t i = 0; i < w->nt; i++)
            if (st_dtype_size(w->t[i].dtype) == sz)
                order[k++] = i;

    /* Members are dumped in the order they are set: __metadata__ first,
     * then the tensors in the order of their data. */
    json_t *root = json_object();
    int bad = !root;
    if (w->nm > 0) {
        json_t *meta = json_object();
        for (size_t i = 0; i < w->nm; i++)
            bad |= json_object_set_new(meta, w->m[i].key, json_string(w->m[i].value));
        bad |= json_object_set_new(root, "__metadata__", meta);
    }
    uint64_t off = 0;
    for (size_t j = 0; j < w->nt; j++) {
        const w_tensor *t = &w->t[order[j]];
        uint64_t begin = off;
        /* jansson's integers are signed 64-bit. */
        if (__builtin_add_overflow(off, t->bytes, &off) || off > INT64_MAX) {
            json_decref(root);
            errmsg_set(err, len, "tensor '%s': total size overflows",
                       st_quote(q, sizeof q, t->name));
            return -1;
        }
        bad |= json_object_set_new(root, t->name, tensor_entry(t, begin, off));
    }
    char *json = bad ? NULL : json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!json) {
        errmsg_set(err, len, "out of memory building the header");
        return -1;
    }
    /* Spaces pad the header so that the data starts at a multiple of 8. */
    size_t jlen = strlen(json), hlen = (jlen + 7) / 8 * 8;
    if (hlen > ST_MAX_HEADER) {
        free(json);
        errmsg_set(err, len, "header of %zu bytes exceeds the limit of %u bytes", hlen,
                   ST_MAX_HEADER);
        return -1;
    }
    out->p = malloc(8 + hlen);
    if (!out->p) {
        free(json);
        errmsg_set(err, len, "out of memory building the header");
        return -1;
    }
    for (int i = 0; i < 8; i++)
        out->p[i] = (char)((uint64_t)hlen >> (8 * i));
    memcpy(out->p + 8, json, jlen);
    memset(out->p + 8 + jlen, ' ', hlen - jlen);
    out->n = 8 + hlen;
    free(json);
    return 0;
}

/* Write a prepared header and the data.  fail_errno != 0: fail with it
 * right after the header (test hook).  0, or -1 with errno set. */
static int emit(const st_writer *w, int fd, const header *hdr, const size_t *order,
                int fail_errno)
{
    if (fileio_write_all(fd, hdr->p, hdr->n) != 0)
        return -1;
    if (fail_errno) {
        errno = fail_errno;
        return -1;
    }
    for (size_t j = 0; j < w->nt; j++) {
        const w_tensor *t = &w->t[order[j]];
        if (t->bytes && fileio_write_all(fd, t->data, (size_t)t->bytes) != 0)
            return -1;
    }
    return 0;
}

/* Validate and lay out: the header in *hdr, the write order in *order
 * (both to be freed).  Messages are prefixed with NAME. */
static int prepare(st_writer *w, const char *name, header *hdr, size_t **order, char *err,
                   size_t len)
{
    char msg[512];
    *hdr = (header){0};
    *order = malloc((w->nt ? w->nt : 1) * sizeof **order);
    if (!*order) {
        errmsg_set(err, len, "%s: out of memory", name);
        return -1;
    }
    if (build_header(w, hdr, *order, msg, sizeof msg) != 0) {
        errmsg_set(err, len, "%s: %s", name, msg);
        free(hdr->p);
        free(*order);
        *hdr = (header){0};
        *order = NULL;
        return -1;
    }
    return 0;
}

int st_write_fd(st_writer *w, int fd, const char *name, char *err, size_t err_len)
{
    header hdr;
    size_t *order;
    if (prepare(w, name, &hdr, &order, err, err_len) != 0)
        return -1;
    int rc = emit(w, fd, &hdr, order, 0);
    if (rc != 0)
        errmsg_set(err, err_len, "%s: write: %s", name, strerror(errno));
    free(hdr.p);
    free(order);
    return rc;
}

static int injected(const st_writer *w, st_stage stage)
{
    if (w->fail_stage == stage) {
        errno = w->fail_errno ? w->fail_errno : EIO;
        return 1;
    }
    return 0;
}

int st_clear_temps(const char *path)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t blen = strlen(base);
    char *dir = !slash ? strdup(".") : slash == path ? strdup("/") : strndup(path, (size_t)(slash - path));
    DIR *d = dir ? opendir(dir) : NULL;
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        /* Exactly the names st_write_atomic gives: BASE.tmp.DIGITS. */
        const char *s = e->d_name;
        if (strncmp(s, base, blen) != 0 || strncmp(s + blen, ".tmp.", 5) != 0 || !s[blen + 5])
            continue;
        if (strspn(s + blen + 5, "0123456789") != strlen(s + blen + 5))
            continue;
        if (unlinkat(dirfd(d), s, 0) == 0)
            n++;
    }
    if (d)
        closedir(d);
    free(dir);
    return n;
}

int st_write_atomic(st_writer *w, const char *path, char *err, size_t err_len)
{
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 32);
    char *dir = malloc(plen + 2);
    if (!tmp || !dir) {
        free(tmp);
        free(dir);
        errmsg_set(err, err_len, "%s: out of memory", path);
        return -1;
    }
    snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, plen + 2, ".");
    else if (slash == path)
        snprintf(dir, plen + 2, "/");
    else
        snprintf(dir, plen + 2, "%.*s", (int)(slash - path), path);

    int rc = -1, fd = -1;
    bool created = false;
    header hdr = {0};
    size_t *order = NULL;
    /* Everything that can be refused is refused before a file exists. */
    if (prepare(w, path, &hdr, &order, err, err_len) != 0)
        goto out;
    if (injected(w, ST_STAGE_OPEN)) {
        errmsg_set(err, err_len, "%s: cannot create %s: %s", path, tmp, strerror(errno));
        goto out;
    }
    for (int attempt = 0; attempt < 2; attempt++) {
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
        if (fd >= 0 || errno != EEXIST || attempt == 1)
            break;
        /* Left over by an earlier process with our pid: it is stale. */
        if (unlink(tmp) != 0)
            break;
    }
    if (fd < 0) {
        errmsg_set(err, err_len, "%s: cannot create %s: %s", path, tmp, strerror(errno));
        goto out;
    }
    created = true;
    int fail_write = w->fail_stage != ST_STAGE_WRITE ? 0 : w->fail_errno ? w->fail_errno : EIO;
    if (emit(w, fd, &hdr, order, fail_write) != 0) {
        errmsg_set(err, err_len, "%s: write %s: %s", path, tmp, strerror(errno));
        goto out;
    }
    if (injected(w, ST_STAGE_FSYNC) || fsync(fd) != 0) {
        errmsg_set(err, err_len, "%s: fsync %s: %s", path, tmp, strerror(errno));
        goto out;
    }
    int crc = close(fd);
    fd = -1;
    if (injected(w, ST_STAGE_CLOSE) || crc != 0) {
        errmsg_set(err, err_len, "%s: close %s: %s", path, tmp, strerror(errno));
        goto out;
    }
    if (injected(w, ST_STAGE_RENAME) || rename(tmp, path) != 0) {
        errmsg_set(err, err_len, "%s: rename from %s: %s", path, tmp, strerror(errno));
        goto out;
    }
    created = false;
    int dfd = -1;
    if (injected(w, ST_STAGE_DIRSYNC) ||
        (dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0 || fsync(dfd) != 0) {
        errmsg_set(err, err_len,
                   "%s: written, but syncing directory %s failed (%s): it may not survive a "
                   "crash",
                   path, dir, strerror(errno));
        if (dfd >= 0)
            close(dfd);
        goto out;
    }
    close(dfd);
    rc = 0;
out:
    if (fd >= 0)
        close(fd);
    if (created)
        unlink(tmp);
    free(tmp);
    free(dir);
    free(hdr.p);
    free(order);
    return rc;
}
