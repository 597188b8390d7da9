/* table.c — collect cells, then print them through libsmartcols with each
 * column as wide as its widest cell; and the terminal-safe form of
 * daemon-supplied text. */
#include "table.h"

#include <ctype.h>
#include <libsmartcols.h>
#include <locale.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

/* libsmartcols reads "\x1b" in a cell as one escaped byte, one column
 * wide, while the safe form (table_text) writes it as four characters to
 * show: widths would be off by three.  So each backslash goes to it as
 * this private-use character, as wide as a backslash, and back on the way
 * out; a cell's own U+E000 was shown escaped by table_cell, so the only
 * ones in the output are these. */
#define BACKSLASH_STANDIN "\xEE\x80\x80"

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
        t->show[i] = i;
    }
    t->nshow = t->ncols;
}

/* Whether the n bytes at name are heading h, ignoring ASCII case, with '_'
 * or '-' for a space. */
static bool heading_is(const char *h, const char *name, size_t n)
{
    size_t i = 0, k = 0;
    for (; h[i] && k < n; k++) {
        char b = name[k];
        if (h[i] == ' ' && (b == '_' || b == '-')) {
            i++;
            continue;
        }
        /* MICRO×ACC's sign, typed as a shell user can: x or _. */
        if (strncmp(h + i, "\u00d7", 2) == 0 && (b == 'x' || b == 'X' || b == '_')) {
            i += 2;
            continue;
        }
        if (tolower((unsigned char)h[i]) != tolower((unsigned char)b))
            return false;
        i++;
    }
    return !h[i] && k == n;
}

int table_select(table *t, const char *spec, char *err, size_t err_len)
{
    int show[TABLE_MAX_COLS], n = 0;
    for (const char *p = spec;; p++) {
        size_t len = strcspn(p, ",");
        int col = -1;
        for (int c = 0; c < t->ncols && col < 0; c++)
            if (heading_is(t->head[c], p, len))
                col = c;
        if (col < 0 || n == TABLE_MAX_COLS) {
            int w = snprintf(err, err_len, "%s '%.*s'; the columns are ", col < 0 ? "no column" : "too many columns at",
                             (int)len, p);
            for (int c = 0; c < t->ncols && w >= 0 && (size_t)w < err_len; c++)
                w += snprintf(err + w, err_len - (size_t)w, "%s%s", c ? "," : "", t->head[c]);
            return -1;
        }
        show[n++] = col;
        p += len;
        if (!*p)
            break;
    }
    memcpy(t->show, show, sizeof show);
    t->nshow = n;
    return 0;
}

void table_noheadings(table *t)
{
    t->noheadings = true;
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
        /* U+E000 stands for a backslash when laid out (table_print):
         * a cell's own is shown escaped, as the control characters are. */
        for (char *u; t->cells[n] && (u = strstr(t->cells[n], BACKSLASH_STANDIN));) {
            size_t at = (size_t)(u - t->cells[n]), rest = strlen(u + 3);
            char *grown = realloc(t->cells[n], at + 6 + rest + 1);
            if (!grown)
                break;
            memmove(grown + at + 6, grown + at + 3, rest + 1);
            memcpy(grown + at, "\\uE000", 6);
            t->cells[n] = grown;
        }
    }
    t->ncells = n + 1;
    t->nrows = t->ncells / t->ncols;
}


static char *standin(const char *s)
{
    size_t n = 0;
    for (const char *p = s; *p; p++)
        n += *p == '\\' ? 3 : 1;
    char *out = malloc(n + 1), *o = out;
    if (!out)
        return NULL;
    for (const char *p = s; *p; p++) {
        if (*p == '\\') {
            memcpy(o, BACKSLASH_STANDIN, 3);
            o += 3;
        } else {
            *o++ = *p;
        }
    }
    *o = '\0';
    return out;
}

/* Lay the table out with libsmartcols into a buffer; NULL if out of
 * memory. */
static char *layout(const table *t, size_t *len)
{
    char *text = NULL;
    FILE *mem = open_memstream(&text, len);
    struct libscols_table *tb = mem ? scols_new_table() : NULL;
    if (!tb) {
        if (mem)
            fclose(mem);
        free(text);
        return NULL;
    }
    scols_table_set_stream(tb, mem);
    scols_table_set_column_separator(tb, "  ");
    /* Never cut or wrap to a terminal's width: a row is one line, as grep
     * and awk want it; no padding after the last column. */
    scols_table_set_termforce(tb, SCOLS_TERMFORCE_NEVER);
    scols_table_enable_minout(tb, 1);
    scols_table_enable_noheadings(tb, t->noheadings);
    bool ok = true;
    for (int i = 0; i < t->nshow && ok; i++) {
        int c = t->show[i];
        /* Without headings, no column is as wide as its heading. */
        ok = scols_table_new_column(tb, t->noheadings ? "" : t->head[c], 0, t->right[c] ? SCOLS_FL_RIGHT : 0) != NULL;
    }
    for (int r = 0; r < t->nrows && ok; r++) {
        struct libscols_line *ln = scols_table_new_line(tb, NULL);
        ok = ln != NULL;
        for (int i = 0; i < t->nshow && ok; i++) {
            const char *s = t->cells[r * t->ncols + t->show[i]];
            char *cell = standin(s ? s : "");
            /* set_data copies; refer_data would take it. */
            ok = cell && scols_line_refer_data(ln, (size_t)i, cell) == 0;
            if (!ok)
                free(cell);
        }
    }
    if (ok) {
        /* Cells are UTF-8 (table_cell made them so) whatever the locale:
         * measured and passed on as such, not escaped as bytes that the
         * C locale would call unprintable. */
        char old[64];
        const char *cur = setlocale(LC_CTYPE, NULL);
        snprintf(old, sizeof old, "%s", cur ? cur : "C");
        bool utf8 = setlocale(LC_CTYPE, "C.UTF-8") != NULL;
        ok = scols_print_table(tb) == 0;
        if (utf8)
            setlocale(LC_CTYPE, old);
    }
    scols_unref_table(tb);
    if (fclose(mem) != 0 || !ok) {
        free(text);
        return NULL;
    }
    return text;
}

void table_print(const table *t, FILE *f)
{
    /* libsmartcols prints nothing for a table without rows; the headings
     * tell a person that the answer is "none", not that nothing ran. */
    if (t->nrows == 0) {
        if (!t->noheadings && t->nshow > 0) {
            for (int i = 0; i < t->nshow; i++)
                fprintf(f, "%s%s", i ? "  " : "", t->head[t->show[i]]);
            fputc('\n', f);
        }
        return;
    }
    size_t len = 0;
    char *text = layout(t, &len);
    if (!text) {
        fputs("gradctl: out of memory for a table\n", stderr);
        return;
    }
    const char *p = text;
    for (const char *m; (m = strstr(p, BACKSLASH_STANDIN));) {
        fwrite(p, 1, (size_t)(m - p), f);
        fputc('\\', f);
        p = m + 3;
    }
    fputs(p, f);
    free(text);
}

void table_free(table *t)
{
    for (int i = 0; i < t->cap; i++)
        free(t->cells[i]);
    free(t->cells);
    memset(t, 0, sizeof *t);
}
