/* data_llmc.c — llm.c token files: a 256-int32 little-endian header (magic
 * 20240520, version 1, token count) then the uint16 tokens; the size must
 * match the count exactly. */
#include "data_internal.h"

#include "errmsg.h"

#include <stdlib.h>

int data_llmc_load(data_tokens *t, const char *path, data_budget *b, char *err, size_t err_len)
{
    data_src s;
    if (data_src_open(&s, path, false, err, err_len) != 0)
        return -1;
    unsigned char h[DATA_LLMC_HEADER_BYTES];
    int rc = 0;
    uint64_t held = 0; /* charged to b */
    ssize_t r = data_src_read(&s, h, sizeof h, err, err_len);
    if (r < 0) {
        rc = -1;
        goto out;
    }
    if (r >= 4 && data_le32(h) != DATA_LLMC_MAGIC) {
        rc = errmsg_set(err, err_len, "%s: bad magic %d (expected %d for an llm.c token file)", path,
                        (int32_t)data_le32(h), DATA_LLMC_MAGIC);
        goto out;
    }
    if ((size_t)r < sizeof h) {
        rc = errmsg_set(err, err_len,
                        "%s: truncated header: %zd bytes (an llm.c token file starts with a "
                        "%d-byte header)",
                        path, r, DATA_LLMC_HEADER_BYTES);
        goto out;
    }
    int32_t version = (int32_t)data_le32(h + 4), count = (int32_t)data_le32(h + 8);
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
    held = 2 * (uint64_t)count;
    if (data_budget_take(b, held, path, err, err_len) != 0) {
        rc = -1;
        goto out;
    }
    t->tok = malloc((size_t)held);
    if (!t->tok) {
        data_budget_give(b, held);
        rc = data_oom(path, err, err_len);
        goto out;
    }
    r = data_src_read(&s, t->tok, (size_t)count * 2, err, err_len);
    if (r < 0) {
        rc = -1;
        goto out;
    }
    uint64_t rest = 0;
    if ((uint64_t)r < held || data_src_drain_some(&s, &rest, err, err_len) != 0 || rest) {
        rc = errmsg_set(err, err_len, "%s: the file changed size while being read", path);
        goto out;
    }
    if (!data_host_le())
        for (size_t i = 0; i < (size_t)count; i++)
            t->tok[i] = (uint16_t)(t->tok[i] >> 8 | t->tok[i] << 8);
    t->n = (size_t)count;
    t->data_offset = DATA_LLMC_HEADER_BYTES;
    t->elem_size = 2;
out:
    data_src_close(&s);
    if (rc != 0 && t->tok) {
        data_budget_give(b, held);
        free(t->tok);
        t->tok = NULL;
    }
    return rc;
}
