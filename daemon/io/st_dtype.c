/* st_dtype.c — what the safetensors reader (safetensors.c) and writer
 * (st_write.c) share: the dtype table, shape arithmetic, and how names and
 * shapes are shown in messages. */
#include "safetensors.h"

#include "utf8.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtypes[ST_DTYPE_COUNT] = {
    [ST_BOOL] = {"BOOL", 1},    [ST_U8] = {"U8", 1},
    [ST_I8] = {"I8", 1},        [ST_F8_E5M2] = {"F8_E5M2", 1},
    [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_U16] = {"U16", 2},
    [ST_I16] = {"I16", 2},      [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2},    [ST_U32] = {"U32", 4},
    [ST_I32] = {"I32", 4},      [ST_F32] = {"F32", 4},
    [ST_U64] = {"U64", 8},      [ST_I64] = {"I64", 8},
    [ST_F64] = {"F64", 8},
};

const char *st_dtype_name(st_dtype d)
{
    return (unsigned)d < ST_DTYPE_COUNT ? dtypes[d].name : NULL;
}

size_t st_dtype_size(st_dtype d)
{
    return (unsigned)d < ST_DTYPE_COUNT ? dtypes[d].size : 0;
}

int st_dtype_from_name(const char *name, st_dtype *out)
{
    for (int i = 0; i < ST_DTYPE_COUNT; i++)
        if (strcmp(name, dtypes[i].name) == 0) {
            *out = (st_dtype)i;
            return 0;
        }
    return -1;
}

const char *st_quote(char *buf, size_t cap, const char *s)
{
    enum { MAXSHOWN = 160 };
    bool valid = utf8_valid(s);
    size_t o = 0, i = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (; u[i] && o + 8 < cap; i++) {
        if (i >= MAXSHOWN && (u[i] & 0xC0) != 0x80) {
            memcpy(buf + o, "...", 3);
            o += 3;
            i = strlen(s);
            break;
        }
        unsigned c = u[i];
        if (c < 0x20 || c == 0x7f || c == '\'' || c == '\\' || (c >= 0x80 && !valid))
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
        else
            buf[o++] = (char)c;
    }
    if (u[i] && o + 4 <= cap) { /* ran out of room */
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = 0;
    return buf;
}

void st_shape_str(char *buf, size_t cap, int ndim, const uint64_t *shape)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%llu", i ? "," : "",
                              (unsigned long long)shape[i]);
    if (o < cap)
        snprintf(buf + o, cap - o, "]");
}

bool st_shape_bytes(int ndim, const uint64_t *shape, size_t elem, uint64_t *nelem,
                    uint64_t *bytes)
{
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(n, shape[i], &n))
            return false;
    uint64_t b;
    if (__builtin_mul_overflow(n, (uint64_t)elem, &b))
        return false;
    *nelem = n;
    *bytes = b;
    return true;
}
