/* table.c — collect cells, then print with each column as wide as its
 * widest cell; and the terminal-safe form of daemon-supplied text. */
#include "table.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

/* ---- terminal-safe text --------------------------------------------------- */

/* One step of the safe form (utf8_safe_step) for table_* flags. */
static size_t text_step(const unsigned char *s, size_t n, unsigned flags, char out[UTF8_SAFE_MAX], size_t *out_len)
{
    return utf8_safe_step(s, n, (flags & TABLE_TEXT_LINES) ? UTF8_SAFE_LINES : 0, out, out_len);
}

size_t table_put_text(FILE *f, const char *s, size_t n, unsigned flags)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if ((flags & TABLE_TEXT_MORE) && utf8_cut_short(p + i, n - i))
            break;
        char out[UTF8_SAFE_MAX];
        size_t len;
        i += text_step(p + i, n - i, flags, out, &len);
        fwrite(out, 1, len, f);
    }
    return i;
}

void table_puts(FILE *f, const char *s)
{
    if (s)
        table_put_text(f, s, strlen(s), 0);
}

const char *table_text(const char *s, char *buf, size_t len)
{
    return len ? utf8_safe(s ? s : "", 0, buf, len) : buf;
}

/* ---- tables --------------------------------------------------------------- */

void table_init(table *t, int ncols, const char *const *head)
{
    memset(t, 0, sizeof *t);
    t->ncols = ncols > TABLE_MAX_COLS ? TABLE_MAX_COLS : ncols;
    for (int i = 0; i < t->ncols; i++) {
        t->right[i] = head[i][0] == '>';
        t->head[i] = head[i] + t->right[i];
    }
}

void table_cell(table *t, const char *fmt, ...)
{
    int n = t->ncells;
    if (n + 1 > t->cap) {
        int ncap = t->cap ? t->cap * 2 : 64;
        char **nc = realloc(t->cells, (size_t)ncap * sizeof *nc);
        if (!nc)
            return;
        memset(nc + t->cap, 0, (size_t)(ncap - t->cap) * sizeof *nc);
        t->cells = nc;
        t->cap = ncap;
    }
    va_list ap;
    va_start(ap, fmt);
    char *raw;
    if (vasprintf(&raw, fmt, ap) < 0)
        raw = NULL;
    va_end(ap);
    /* Made safe here, once, so that the widths below measure what prints:
     * each byte becomes at most 4 (utf8_safe_step). */
    t->cells[n] = NULL;
    if (raw) {
        size_t len = strlen(raw) * 4 + 1;
        t->cells[n] = malloc(len);
        if (t->cells[n])
            table_text(raw, t->cells[n], len);
        free(raw);
    }
    t->ncells = n + 1;
    t->nrows = t->ncells / t->ncols;
}

/* Characters, not bytes: cells are valid UTF-8 once made safe. */
static int text_width(const char *s)
{
    int w = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        w += (*p & 0xC0) != 0x80;
    return w;
}

static void pad(FILE *f, int n)
{
    for (; n > 0; n--)
        fputc(' ', f);
}

void table_print(const table *t, FILE *f)
{
    int w[TABLE_MAX_COLS];
    for (int c = 0; c < t->ncols; c++) {
        w[c] = text_width(t->head[c]);
        for (int r = 0; r < t->nrows; r++) {
            const char *s = t->cells[r * t->ncols + c];
            int l = s ? text_width(s) : 0;
            if (l > w[c])
                w[c] = l;
        }
    }
    for (int r = -1; r < t->nrows; r++) {
        for (int c = 0; c < t->ncols; c++) {
            const char *s = r < 0 ? t->head[c] : t->cells[r * t->ncols + c];
            if (!s)
                s = "";
            int last = c == t->ncols - 1;
            int gap = w[c] - text_width(s);
            if (t->right[c])
                pad(f, gap);
            fputs(s, f);
            if (!last)
                pad(f, (t->right[c] ? 0 : gap) + 2);
        }
        fputc('\n', f);
    }
}

void table_free(table *t)
{
    for (int i = 0; i < t->cap; i++)
        free(t->cells[i]);
    free(t->cells);
    memset(t, 0, sizeof *t);
}
