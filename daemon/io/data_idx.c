/* data_idx.c — MNIST-style IDX files, big-endian: images (magic 0x803,
 * N × rows × cols ubyte) and labels (magic 0x801, N ubyte), gzip'd or not
 * (data_src gunzips where it sees the gzip magic).  A gzip'd file can
 * inflate a thousandfold, so its header's sizes are what is charged to the
 * job's budget, before anything is inflated past the header, and the
 * stream is not inflated far past what the header declares. */
#include "data_internal.h"

#include "errmsg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[3] | (uint32_t)p[2] << 8 | (uint32_t)p[1] << 16 | (uint32_t)p[0] << 24;
}

typedef struct {
    uint64_t n, rows, cols; /* rows = cols = 1 for labels */
    unsigned char *data;    /* the first keep records */
    uint64_t held;          /* bytes of data, charged to the budget */
} idx_file;

static int load_idx(idx_file *f, const char *path, bool images, uint64_t limit, data_budget *b,
                    char *err, size_t err_len)
{
    memset(f, 0, sizeof *f);
    data_src s;
    if (data_src_open(&s, path, true, err, err_len) != 0)
        return -1;
    /* Whether an error is worth reading on for damage in the gzip stream
     * further on (data_src_blame_gzip): not when the rest is not wanted. */
    bool blame = true;
    const char *z = s.gz ? " (decompressed)" : "";
    const char *what = images ? "images" : "labels";
    uint32_t want_magic = images ? DATA_IDX_IMAGES_MAGIC : DATA_IDX_LABELS_MAGIC;
    unsigned ndim = images ? 3 : 1;
    unsigned char h[16];
    int rc = 0;
    ssize_t r = data_src_read(&s, h, 4, err, err_len);
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
    r = data_src_read(&s, h + 4, 4 * ndim, err, err_len);
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
    if (data_budget_take(b, keep_n * rec, path, err, err_len) != 0) {
        rc = -1;
        blame = false;
        goto out;
    }
    f->held = keep_n * rec;
    uint64_t got;
    if (data_src_read_body(&s, total, keep_n * rec, &f->data, &got, err, err_len) != 0) {
        rc = -1;
        goto out;
    }
    uint64_t rest = 0;
    if (got == total && data_src_drain_some(&s, &rest, err, err_len) != 0) {
        rc = -1;
        goto out;
    }
    if (rest > DATA_CHUNK) {
        char more[96];
        if (s.gz)
            snprintf(more, sizeof more, "the gzip stream inflates past them (stopped %u bytes on)",
                     DATA_CHUNK);
        else
            snprintf(more, sizeof more, "the file is %llu bytes", (ull)s.size);
        rc = errmsg_set(err, err_len,
                        "%s: trailing bytes: the header says %s %s, so %llu bytes should follow the "
                        "%llu-byte header, but %s",
                        path, dims, what, (ull)total, (ull)hbytes, more);
        blame = false;
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
    if (rc != 0 && blame)
        data_src_blame_gzip(&s, err, err_len);
    data_src_close(&s);
    if (rc != 0) {
        data_budget_give(b, f->held);
        free(f->data);
        f->data = NULL;
        f->held = 0;
    }
    return rc;
}

int data_idx_images_load(data_images *d, const char *path, uint64_t limit, uint64_t *total,
                         data_budget *b, char *err, size_t err_len)
{
    idx_file f;
    if (load_idx(&f, path, true, limit, b, err, err_len) != 0)
        return -1;
    *total = f.n;
    d->n = (size_t)(limit && limit < f.n ? limit : f.n);
    d->rows = (size_t)f.rows;
    d->cols = (size_t)f.cols;
    d->u8 = f.data;
    return 0;
}

/* The labels' data starts after the 8-byte header: their byte offsets in
 * messages count from there. */
int data_idx_labels_load(data_npy *a, const char *path, data_budget *b, char *err,
                         size_t err_len)
{
    memset(a, 0, sizeof *a);
    idx_file f;
    if (load_idx(&f, path, false, 0, b, err, err_len) != 0)
        return -1;
    a->dtype = DATA_U8;
    a->ndim = 1;
    a->shape[0] = f.n;
    a->count = f.n;
    a->data_offset = 8;
    a->data = f.data;
    return 0;
}
