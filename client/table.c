/* table.c — collect cells, then print with each column as wide as its
 * widest cell. */
#include "table.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

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
    if (vasprintf(&t->cells[n], fmt, ap) < 0)
        t->cells[n] = NULL;
    va_end(ap);
    t->ncells = n + 1;
    t->nrows = t->ncells / t->ncols;
}

void table_print(const table *t, FILE *f)
{
    int w[TABLE_MAX_COLS];
    for (int c = 0; c < t->ncols; c++) {
        w[c] = (int)strlen(t->head[c]);
        for (int r = 0; r < t->nrows; r++) {
            const char *s = t->cells[r * t->ncols + c];
            int l = s ? (int)strlen(s) : 0;
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
            if (t->right[c])
                fprintf(f, "%*s%s", w[c], s, last ? "" : "  ");
            else if (last)
                fputs(s, f);
            else
                fprintf(f, "%-*s  ", w[c], s);
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
