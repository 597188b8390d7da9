/* data_text.c — text as tokens: one token per byte, from one file or from
 * a directory of text files read in name order (see data.h for which
 * entries count). */
#include "data_internal.h"

#include "errmsg.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    unsigned char *p;
    size_t n, cap;
} bytes;

static int append_file(bytes *b, const char *path, char *err, size_t err_len)
{
    data_src s;
    if (data_src_open(&s, path, false, err, err_len) != 0)
        return -1;
    for (;;) {
        if (b->cap - b->n < DATA_CHUNK) {
            size_t want = b->n + (s.size > s.out ? (size_t)(s.size - s.out) : 0) + DATA_CHUNK;
            size_t ncap = b->cap * 2 > want ? b->cap * 2 : want;
            unsigned char *np = realloc(b->p, ncap);
            if (!np) {
                data_src_close(&s);
                return data_oom(path, err, err_len);
            }
            b->p = np;
            b->cap = ncap;
        }
        size_t want = b->cap - b->n;
        ssize_t r = data_src_read(&s, b->p + b->n, want, err, err_len);
        if (r < 0) {
            data_src_close(&s);
            return -1;
        }
        b->n += (size_t)r;
        if ((size_t)r < want)
            break;
    }
    data_src_close(&s);
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
                rc = data_oom(dir, err, err_len);
                break;
            }
            names = nnames;
            cap = ncap;
        }
        names[nn] = strdup(e->d_name);
        if (!names[nn]) {
            rc = data_oom(dir, err, err_len);
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

int data_text_load(data_tokens *t, const char *path, bool is_dir, char *err, size_t err_len)
{
    bytes b = {0};
    int rc = is_dir ? read_text_dir(&b, path, err, err_len) : append_file(&b, path, err, err_len);
    if (rc == 0 && b.n == 0)
        rc = errmsg_set(err, err_len, "%s: empty file (no tokens)", path);
    if (rc == 0) {
        t->tok = malloc(b.n * sizeof *t->tok);
        if (!t->tok)
            rc = data_oom(path, err, err_len);
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
