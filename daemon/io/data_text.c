/* data_text.c — text as tokens: one token per byte, from one file or from
 * a directory of text files read in name order (see data.h for which
 * entries count).  The bytes read are the tokens: one buffer, grown as the
 * files come and charged to the job's budget before it grows. */
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
    size_t n, cap; /* cap bytes charged to budget */
    data_budget *budget;
} bytes;

/* Room for `more` bytes past the n held: twice the buffer where the
 * budget allows, so that many small files cost few reallocations, but
 * never refused for the doubling alone. */
static int grow(bytes *b, uint64_t more, const char *path, char *err, size_t err_len)
{
    uint64_t want = (uint64_t)b->n + more;
    if (want <= b->cap)
        return 0;
    uint64_t ncap = (uint64_t)b->cap * 2 > want ? (uint64_t)b->cap * 2 : want;
    uint64_t room = data_budget_room(b->budget);
    if (ncap > want && ncap - b->cap > room)
        ncap = want > b->cap + room ? want : b->cap + room;
    if (ncap > SIZE_MAX / 2)
        return data_oom(path, err, err_len);
    if (data_budget_take(b->budget, ncap - b->cap, path, err, err_len) != 0)
        return -1;
    unsigned char *np = realloc(b->p, (size_t)ncap);
    if (!np) {
        data_budget_give(b->budget, ncap - b->cap);
        return data_oom(path, err, err_len);
    }
    b->p = np;
    b->cap = (size_t)ncap;
    return 0;
}

/* The file's bytes after those held.  Its size says how many to make room
 * for, so that a file is refused before any of it is read; a byte past
 * them (it grew meanwhile) makes room for more. */
static int append_file(bytes *b, const char *path, char *err, size_t err_len)
{
    data_src s;
    if (data_src_open(&s, path, false, err, err_len) != 0)
        return -1;
    int rc = grow(b, s.size, path, err, err_len);
    while (rc == 0) {
        size_t want = b->cap - b->n;
        ssize_t r = want ? data_src_read(&s, b->p + b->n, want, err, err_len) : 0;
        if (r < 0) {
            rc = -1;
            break;
        }
        b->n += (size_t)r;
        if ((size_t)r < want)
            break;
        unsigned char c; /* full: does the file end here? */
        r = data_src_read(&s, &c, 1, err, err_len);
        if (r < 0)
            rc = -1;
        if (r <= 0)
            break;
        rc = grow(b, 1 + DATA_CHUNK, path, err, err_len);
        if (rc == 0)
            b->p[b->n++] = c;
    }
    data_src_close(&s);
    return rc;
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

int data_text_load(data_tokens *t, const char *path, bool is_dir, data_budget *budget, char *err,
                   size_t err_len)
{
    bytes b = {.budget = budget};
    int rc = is_dir ? read_text_dir(&b, path, err, err_len) : append_file(&b, path, err, err_len);
    if (rc == 0 && b.n == 0)
        rc = errmsg_set(err, err_len, "%s: empty file (no tokens)", path);
    if (rc != 0) {
        data_budget_give(budget, b.cap);
        free(b.p);
        return rc;
    }
    unsigned char *fit = realloc(b.p, b.n);
    if (fit) {
        data_budget_give(budget, b.cap - b.n);
        b.p = fit;
    }
    t->u8 = b.p;
    t->n = b.n;
    t->data_offset = 0;
    t->elem_size = 1;
    return 0;
}
