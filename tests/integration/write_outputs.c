/* write_outputs.c — helper for test_outputs.py: gradd's output writers on
 * known values, and gradd's safetensors reader on files from elsewhere.
 *
 *   write_outputs write DIR
 *       DIR/model.safetensors  tensors of every numpy-loadable dtype with
 *                              values given by the formulas below, metadata
 *       DIR/bf16.safetensors   one BF16 tensor (numpy has no bfloat16)
 *       DIR/tb/events.out...   a loss and an lr curve (steps 0..49)
 *   write_outputs read FILE
 *       st_open FILE and print one JSON line per tensor, in header order:
 *       {"name": ..., "dtype": ..., "shape": [...], "hex": "<bytes>"}
 *       then {"metadata": {...}}.  On a refused file: the message on
 *       stderr, exit status 1.
 *
 * The values must stay in step with test_outputs.py, which recomputes them.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/safetensors.h"
#include "engine/tboard.h"

#define ADD(w, name, dt, nd, shp, ptr, sz)                                                   \
    do {                                                                                 \
        if (st_writer_add(w, name, dt, nd, (uint64_t[])shp, ptr, sz, err, sizeof err)) { \
            fprintf(stderr, "%s\n", err);                                                \
            return 1;                                                                    \
        }                                                                                \
    } while (0)
#define SHAPE(...) {__VA_ARGS__}

static int write_all_outputs(const char *dir)
{
    char err[1024], path[4096];

    /* model.safetensors */
    float f32[12], scalar = -2.5f, wte[8 * 4];
    double f64[5];
    uint16_t f16[4] = {0x3C00, 0xC000, 0x3555, 0x7BFF}; /* 1, -2, 0.33325, 65504 */
    int32_t i32[4] = {-2147483647 - 1, -1, 0, 2147483647};
    int64_t i64[2] = {-9007199254740993LL, 4611686018427387904LL};
    uint8_t u8[3] = {0, 128, 255}, boolv[4] = {1, 0, 0, 1};
    int8_t i8[3] = {-128, -1, 127};
    uint16_t u16[2] = {1, 65535};
    for (int i = 0; i < 12; i++)
        f32[i] = (float)i * 0.5f - 1.0f;
    for (int i = 0; i < 5; i++)
        f64[i] = (double)i / 3.0;
    for (int i = 0; i < 32; i++)
        wte[i] = (float)(i % 7) / 8.0f - (float)(i / 7);

    st_writer *w = st_writer_new();
    ADD(w, "f32", ST_F32, 2, SHAPE(3, 4), f32, sizeof f32);
    ADD(w, "f64", ST_F64, 1, SHAPE(5), f64, sizeof f64);
    ADD(w, "f16", ST_F16, 2, SHAPE(2, 2), f16, sizeof f16);
    ADD(w, "i32", ST_I32, 1, SHAPE(4), i32, sizeof i32);
    ADD(w, "i64", ST_I64, 1, SHAPE(2), i64, sizeof i64);
    ADD(w, "u8", ST_U8, 1, SHAPE(3), u8, sizeof u8);
    ADD(w, "i8", ST_I8, 1, SHAPE(3), i8, sizeof i8);
    ADD(w, "u16", ST_U16, 1, SHAPE(2), u16, sizeof u16);
    ADD(w, "bool", ST_BOOL, 2, SHAPE(2, 2), boolv, sizeof boolv);
    ADD(w, "scalar", ST_F32, 0, SHAPE(0), &scalar, sizeof scalar);
    ADD(w, "empty", ST_F32, 2, SHAPE(0, 3), NULL, 0);
    ADD(w, "wte.weight", ST_F32, 2, SHAPE(8, 4), wte, sizeof wte);
    ADD(w, "h.0.attn.c_attn.weight", ST_F32, 2, SHAPE(3, 4), f32, sizeof f32);
    if (st_writer_meta(w, "format", "pt", err, sizeof err) ||
        st_writer_meta(w, "step", "100", err, sizeof err) ||
        st_writer_meta(w, "note", "quote \" backslash \\ newline \n ünïcødé 😀", err,
                       sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st_write_atomic(w, path, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    st_writer_free(w);

    /* bf16.safetensors: bf16 of i/4 - 2 for i in 0..5 (exact in bf16) */
    uint16_t bf16[6];
    for (int i = 0; i < 6; i++) {
        float v = (float)i / 4.0f - 2.0f;
        uint32_t bits;
        memcpy(&bits, &v, 4);
        bf16[i] = (uint16_t)(bits >> 16);
    }
    w = st_writer_new();
    ADD(w, "bf", ST_BF16, 2, SHAPE(2, 3), bf16, sizeof bf16);
    snprintf(path, sizeof path, "%s/bf16.safetensors", dir);
    if (st_write_atomic(w, path, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    st_writer_free(w);

    /* tb/: train/loss = (1000 - 7 s) / 256, train/lr = s / 1024, exact in
     * float32; step 49 logs a loss of exactly 0. */
    snprintf(path, sizeof path, "%s/tb", dir);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        return 1;
    }
    tb_writer *tb;
    if (tb_open(path, &tb, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    for (int s = 0; s < 50; s++) {
        float loss = s == 49 ? 0.0f : (float)(1000 - 7 * s) / 256.0f;
        tb_scalar(tb, "train/loss", s, loss, 1700000000.0 + s);
        tb_scalar(tb, "train/lr", s, (float)s / 1024.0f, 1700000000.0 + s);
    }
    if (tb_close(tb, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    return 0;
}

static void json_str(const char *s)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    }
    putchar('"');
}

static int read_file(const char *file)
{
    char err[1024];
    st_file *f;
    if (st_open(file, &f, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor *t = st_tensor_at(f, i);
        unsigned char *buf = malloc(t->bytes ? (size_t)t->bytes : 1);
        if (!buf || st_read_tensor(f, t, buf, (size_t)t->bytes, err, sizeof err) != 0) {
            fprintf(stderr, "%s\n", buf ? err : "out of memory");
            return 1;
        }
        printf("{\"name\": ");
        json_str(t->name);
        printf(", \"dtype\": \"%s\", \"shape\": [", st_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++)
            printf("%s%llu", d ? ", " : "", (unsigned long long)t->shape[d]);
        printf("], \"hex\": \"");
        for (uint64_t k = 0; k < t->bytes; k++)
            printf("%02x", buf[k]);
        printf("\"}\n");
        free(buf);
    }
    printf("{\"metadata\": {");
    for (size_t i = 0; i < st_meta_count(f); i++) {
        const char *k, *v;
        st_meta_at(f, i, &k, &v);
        printf("%s", i ? ", " : "");
        json_str(k);
        printf(": ");
        json_str(v);
    }
    printf("}}\n");
    st_close(f);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "write") == 0)
        return write_all_outputs(argv[2]);
    if (argc == 3 && strcmp(argv[1], "read") == 0)
        return read_file(argv[2]);
    fprintf(stderr, "usage: %s write DIR | read FILE\n", argv[0]);
    return 2;
}
