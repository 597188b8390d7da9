/* hf.c — reading a Hugging Face model directory (config.json, the
 * safetensors weights, sharded or not) and writing its config.json.  See
 * hf.h for what is checked and why this layer knows no models. */
#include "hf.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errmsg.h"
#include "fileio.h"
#include "safetensors.h"

/* ---- JSON files -------------------------------------------------------------------- */

/* The whole of a small regular file (opened so that it cannot block) into
 * a new buffer: 0 with *out and *len, or -1 with "PATH: why". */
static int read_small(const char *path, char **out, size_t *len, char *err, size_t err_len)
{
    int fd = fileio_open_regular(path, O_RDONLY, 0, err, err_len);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return errmsg_set(err, err_len, "%s: cannot read: %s", path, strerror(e));
    }
    if ((uint64_t)st.st_size > HF_MAX_JSON) {
        close(fd);
        return errmsg_set(err, err_len, "%s: %lld bytes is more than the %u this reader takes", path,
                          (long long)st.st_size, HF_MAX_JSON);
    }
    char *buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        close(fd);
        return errmsg_set(err, err_len, "%s: out of memory", path);
    }
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            free(buf);
            close(fd);
            return errmsg_set(err, err_len, "%s: cannot read: %s", path, r < 0 ? strerror(e) : "it shrank");
        }
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    *out = buf;
    *len = got;
    return 0;
}

/* Strict JSON with an object at the top. */
static int parse_object(const char *text, size_t len, const char *path, json_t **out, char *err, size_t err_len)
{
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return errmsg_set(err, err_len, "%s:%d: not valid JSON: %s", path, je.line, je.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return errmsg_set(err, err_len, "%s: expected a JSON object at the top", path);
    }
    *out = root;
    return 0;
}

int hf_config_parse(const char *text, size_t len, const char *path, json_t **out, char *err, size_t err_len)
{
    return parse_object(text, len, path, out, err, err_len);
}

int hf_config_read(const char *dir, json_t **out, char *err, size_t err_len)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, HF_CONFIG) >= (int)sizeof path)
        return errmsg_set(err, err_len, "%s: path is too long", dir);
    char *text;
    size_t len;
    if (read_small(path, &text, &len, err, err_len) != 0)
        return -1;
    int rc = parse_object(text, len, path, out, err, err_len);
    free(text);
    return rc;
}

void hf_index_free(hf_index *ix)
{
    for (size_t i = 0; i < ix->n; i++) {
        free(ix->tensor[i]);
        free(ix->shard[i]);
    }
    free(ix->tensor);
    free(ix->shard);
    memset(ix, 0, sizeof *ix);
}

int hf_index_parse(const char *text, size_t len, const char *path, hf_index *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    json_t *root;
    if (parse_object(text, len, path, &root, err, err_len) != 0)
        return -1;
    json_t *map = json_object_get(root, "weight_map");
    int rc = -1;
    char q[160];
    if (!json_is_object(map)) {
        errmsg_set(err, err_len, "%s: weight_map: expected an object of tensor names and their shard files", path);
        goto out;
    }
    size_t n = json_object_size(map);
    out->tensor = calloc(n ? n : 1, sizeof *out->tensor);
    out->shard = calloc(n ? n : 1, sizeof *out->shard);
    if (!out->tensor || !out->shard) {
        errmsg_set(err, err_len, "%s: out of memory", path);
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(map, key, val) {
        const char *file = json_string_value(val);
        st_quote(q, sizeof q, key);
        if (!file || !file[0] || strchr(file, '/') || !strcmp(file, ".") || !strcmp(file, "..") ||
            strlen(file) != json_string_length(val)) {
            errmsg_set(err, err_len, "%s: weight_map: tensor '%s': expected the name of a file in this directory",
                       path, q);
            goto out;
        }
        if (!key[0] || strlen(key) >= 256) {
            errmsg_set(err, err_len, "%s: weight_map: tensor '%s': a name of 1 to 255 bytes expected", path, q);
            goto out;
        }
        out->tensor[out->n] = strdup(key);
        out->shard[out->n] = strdup(file);
        if (!out->tensor[out->n] || !out->shard[out->n]) {
            free(out->tensor[out->n]);
            free(out->shard[out->n]);
            errmsg_set(err, err_len, "%s: out of memory", path);
            goto out;
        }
        out->n++;
    }
    rc = 0;
out:
    json_decref(root);
    if (rc != 0)
        hf_index_free(out);
    return rc;
}

/* ---- weights ------------------------------------------------------------------------ */

struct hf_weights {
    size_t nfiles;
    st_file **files;
    char **names; /* each file's name within the directory, for messages */
    size_t n;
    const st_tensor **at; /* want[i]'s tensor */
    size_t *file;         /* and the file it is in */
    bool *transpose;
};

void hf_weights_close(hf_weights *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->nfiles; i++) {
        st_close(w->files[i]);
        free(w->names[i]);
    }
    free(w->files);
    free(w->names);
    free(w->at);
    free(w->file);
    free(w->transpose);
    free(w);
}

/* The file index of a shard name, opening it when new. */
static int shard_file(hf_weights *w, const char *dir, const char *name, size_t *out, char *err, size_t err_len)
{
    for (size_t i = 0; i < w->nfiles; i++)
        if (!strcmp(w->names[i], name)) {
            *out = i;
            return 0;
        }
    if (w->nfiles == HF_MAX_SHARDS)
        return errmsg_set(err, err_len, "%s/%s: more than %d shards", dir, HF_INDEX, HF_MAX_SHARDS);
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return errmsg_set(err, err_len, "%s/%s: path is too long", dir, name);
    w->names[w->nfiles] = strdup(name);
    if (!w->names[w->nfiles])
        return errmsg_set(err, err_len, "%s: out of memory", path);
    if (st_open(path, &w->files[w->nfiles], err, err_len) != 0) {
        free(w->names[w->nfiles]);
        return -1;
    }
    *out = w->nfiles++;
    return 0;
}

/* Open the shards an index names, checking that each tensor it lists is
 * where it says. */
static int open_index(hf_weights *w, const char *dir, const char *ipath, char *err, size_t err_len)
{
    char *text;
    size_t len;
    if (read_small(ipath, &text, &len, err, err_len) != 0)
        return -1;
    hf_index ix;
    int rc = hf_index_parse(text, len, ipath, &ix, err, err_len);
    free(text);
    if (rc != 0)
        return -1;
    w->files = calloc(HF_MAX_SHARDS, sizeof *w->files);
    w->names = calloc(HF_MAX_SHARDS, sizeof *w->names);
    if (!w->files || !w->names) {
        hf_index_free(&ix);
        return errmsg_set(err, err_len, "%s: out of memory", ipath);
    }
    char q[160];
    for (size_t i = 0; i < ix.n && rc == 0; i++) {
        size_t f;
        rc = shard_file(w, dir, ix.shard[i], &f, err, err_len);
        if (rc == 0 && !st_find(w->files[f], ix.tensor[i]))
            rc = errmsg_set(err, err_len, "%s: tensor '%s': %s names %s, which does not hold it", ipath,
                            st_quote(q, sizeof q, ix.tensor[i]), HF_INDEX, ix.shard[i]);
    }
    hf_index_free(&ix);
    return rc;
}

static bool dtype_ok(st_dtype d)
{
    return d == ST_F32 || d == ST_BF16 || d == ST_F16;
}

/* Where name is among the open files: the first file's index, or -1; a
 * tensor in two files is refused. */
static int locate(const hf_weights *w, const char *dir, const char *name, size_t *file, const st_tensor **t,
                  char *err, size_t err_len)
{
    *t = NULL;
    for (size_t i = 0; i < w->nfiles; i++) {
        const st_tensor *x = st_find(w->files[i], name);
        if (!x)
            continue;
        if (*t) {
            char q[160];
            return errmsg_set(err, err_len, "%s: tensor '%s' is in both %s and %s", dir, st_quote(q, sizeof q, name),
                              w->names[*file], w->names[i]);
        }
        *t = x;
        *file = i;
    }
    return 0;
}

int hf_weights_open(const char *dir, const hf_want *want, size_t n, const char *prefix,
                    bool (*ignore)(void *user, const char *name), void *user, const char *expect, hf_weights **out,
                    char *err, size_t err_len)
{
    *out = NULL;
    hf_weights *w = calloc(1, sizeof *w);
    if (!w)
        return errmsg_set(err, err_len, "%s: out of memory", dir);
    char ipath[PATH_MAX], q[160];
    int rc = -1;
    if (snprintf(ipath, sizeof ipath, "%s/%s", dir, HF_INDEX) >= (int)sizeof ipath) {
        errmsg_set(err, err_len, "%s: path is too long", dir);
        goto out;
    }
    struct stat st;
    if (lstat(ipath, &st) == 0) {
        if (open_index(w, dir, ipath, err, err_len) != 0)
            goto out;
    } else {
        w->files = calloc(1, sizeof *w->files);
        w->names = calloc(1, sizeof *w->names);
        size_t f;
        if (!w->files || !w->names) {
            errmsg_set(err, err_len, "%s: out of memory", dir);
            goto out;
        }
        if (shard_file(w, dir, HF_WEIGHTS, &f, err, err_len) != 0)
            goto out;
    }
    w->n = n;
    w->at = calloc(n ? n : 1, sizeof *w->at);
    w->file = calloc(n ? n : 1, sizeof *w->file);
    w->transpose = calloc(n ? n : 1, sizeof *w->transpose);
    if (!w->at || !w->file || !w->transpose) {
        errmsg_set(err, err_len, "%s: out of memory", dir);
        goto out;
    }
    size_t plen = prefix ? strlen(prefix) : 0;
    for (size_t i = 0; i < n; i++) {
        const hf_want *h = &want[i];
        char alt[512] = "";
        if (locate(w, dir, h->name, &w->file[i], &w->at[i], err, err_len) != 0)
            goto out;
        if (!w->at[i] && plen) {
            snprintf(alt, sizeof alt, "%s%s", prefix, h->name);
            if (locate(w, dir, alt, &w->file[i], &w->at[i], err, err_len) != 0)
                goto out;
        }
        if (!w->at[i]) {
            char q2[160];
            st_quote(q, sizeof q, h->name);
            st_quote(q2, sizeof q2, alt);
            errmsg_set(err, err_len, "%s: tensor '%s'%s%s%s is missing: the model (%s) needs it", dir, q,
                       plen ? " (or '" : "", plen ? q2 : "", plen ? "')" : "", expect);
            goto out;
        }
        const st_tensor *t = w->at[i];
        const char *fname = w->names[w->file[i]];
        st_quote(q, sizeof q, t->name);
        if (!dtype_ok(t->dtype)) {
            errmsg_set(err, err_len, "%s/%s: tensor '%s': dtype %s; only F32, BF16 and F16 are read", dir, fname, q,
                       st_dtype_name(t->dtype));
            goto out;
        }
        bool same = t->ndim == h->ndim;
        for (int d = 0; same && d < h->ndim; d++)
            same = t->shape[d] == h->shape[d];
        if (!same) {
            char got[96], exp[96];
            st_shape_str(got, sizeof got, t->ndim, t->shape);
            st_shape_str(exp, sizeof exp, h->ndim, h->shape);
            errmsg_set(err, err_len, "%s/%s: tensor '%s': shape %s but the config (%s) says %s", dir, fname, q, got,
                       expect, exp);
            goto out;
        }
        for (size_t k = 0; k < i; k++)
            if (w->at[k] == t) {
                errmsg_set(err, err_len, "%s/%s: tensor '%s' stands for two of the model's tensors", dir, fname, q);
                goto out;
            }
        w->transpose[i] = h->transpose && h->ndim == 2;
    }
    /* Whatever else the files hold must be excused: a tensor nobody reads
     * is most often a sign of the wrong model or config. */
    for (size_t f = 0; f < w->nfiles; f++) {
        for (size_t k = 0; k < st_count(w->files[f]); k++) {
            const st_tensor *t = st_tensor_at(w->files[f], k);
            bool used = false;
            for (size_t i = 0; i < n && !used; i++)
                used = w->at[i] == t;
            if (used)
                continue;
            size_t other;
            const st_tensor *dup;
            if (locate(w, dir, t->name, &other, &dup, err, err_len) != 0)
                goto out;
            bool excused = ignore && (ignore(user, t->name) ||
                                      (plen && !strncmp(t->name, prefix, plen) && ignore(user, t->name + plen)));
            if (!excused) {
                errmsg_set(err, err_len, "%s/%s: tensor '%s': the model (%s) has no such tensor", dir, w->names[f],
                           st_quote(q, sizeof q, t->name), expect);
                goto out;
            }
        }
    }
    rc = 0;
    *out = w;
out:
    if (rc != 0)
        hf_weights_close(w);
    return rc;
}

float hf_f16_to_f32(uint16_t h)
{
    int exp = (h >> 10) & 0x1f;
    int mant = h & 0x3ff;
    float v;
    if (exp == 0)
        v = ldexpf((float)mant, -24);
    else if (exp == 31)
        v = mant ? NAN : INFINITY;
    else
        v = ldexpf((float)(mant | 0x400), exp - 25);
    return (h & 0x8000) ? -v : v;
}

float hf_bf16_to_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* A weight that is not a number: the job would fail at its first step
 * with a "diverged" loss that names neither the file nor the tensor. */
static int finite_weights(const st_file *f, const st_tensor *t, const float *x, char *err, size_t err_len)
{
    for (size_t k = 0; k < t->nelem; k++)
        if (!isfinite(x[k]))
            return errmsg_set(err, err_len, "%s: tensor '%s' holds %g: a model to start from has finite weights",
                              st_path(f), t->name, (double)x[k]);
    return 0;
}

int hf_weights_read(hf_weights *w, size_t i, float *dst, char *err, size_t err_len)
{
    const st_tensor *t = w->at[i];
    st_file *f = w->files[w->file[i]];
    size_t elem = st_dtype_size(t->dtype);
    bool convert = t->dtype != ST_F32;
    /* fp32 that needs no transpose goes straight to dst; the rest through
     * one tensor's worth of staging. */
    void *buf = (!convert && !w->transpose[i]) ? (void *)dst : malloc(t->nelem * elem + 1);
    if (!buf)
        return errmsg_set(err, err_len, "%s: out of memory reading tensor '%s'", st_path(f), t->name);
    if (st_read_tensor(f, t, buf, t->bytes, err, err_len) != 0) {
        if (buf != dst)
            free(buf);
        return -1;
    }
    if (buf == dst)
        return finite_weights(f, t, dst, err, err_len);
    size_t rows = t->ndim == 2 ? t->shape[0] : 1, cols = t->ndim == 2 ? t->shape[1] : t->nelem;
    for (size_t k = 0; k < t->nelem; k++) {
        float v;
        if (t->dtype == ST_F32) {
            memcpy(&v, (char *)buf + 4 * k, 4);
        } else {
            uint16_t h;
            memcpy(&h, (char *)buf + 2 * k, 2);
            v = t->dtype == ST_BF16 ? hf_bf16_to_f32(h) : hf_f16_to_f32(h);
        }
        /* The file's (rows,cols) element k lands at (col,row) when kept
         * the other way round. */
        size_t to = w->transpose[i] ? (k % cols) * rows + k / cols : k;
        dst[to] = v;
    }
    free(buf);
    return finite_weights(f, t, dst, err, err_len);
}

/* ---- writing config.json --------------------------------------------------------------- */

int hf_write_json(const char *path, const json_t *obj, char *err, size_t err_len)
{
    char *text = json_dumps(obj, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (!text)
        return errmsg_set(err, err_len, "%s: out of memory", path);
    char tmp[PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0666);
    int rc = -1;
    if (fd < 0) {
        errmsg_set(err, err_len, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    size_t len = strlen(text);
    text[len] = '\n'; /* json_dumps' NUL becomes the file's last newline */
    if (fileio_write_all(fd, text, len + 1) != 0 || fsync(fd) != 0) {
        errmsg_set(err, err_len, "%s: cannot write: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        goto out;
    }
    if (close(fd) != 0 || rename(tmp, path) != 0) {
        errmsg_set(err, err_len, "%s: cannot write: %s", path, strerror(errno));
        unlink(tmp);
        goto out;
    }
    char dcopy[PATH_MAX];
    snprintf(dcopy, sizeof dcopy, "%s", path);
    int dfd = open(dirname(dcopy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    rc = 0;
out:
    free(text);
    return rc;
}
