/* table.h — aligned text tables for gradctl's human output (laid out by
 * libsmartcols, as lsblk's are), the columns a script picks, and the
 * terminal-safe form that every daemon-supplied string takes there. */
#ifndef GRADCTL_TABLE_H
#define GRADCTL_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define TABLE_MAX_COLS 16

typedef struct {
    int ncols;
    const char *head[TABLE_MAX_COLS];
    int right[TABLE_MAX_COLS]; /* right-align numbers */
    char **cells;              /* nrows × ncols, owned, already made safe */
    int ncells, nrows, cap;
    int show[TABLE_MAX_COLS];  /* the columns printed, in order (table_select) */
    int nshow;
    bool noheadings;
} table;

/* Column names; a name starting with '>' is right-aligned. */
void table_init(table *t, int ncols, const char *const *head);
/* Append one cell, made safe as table_text does; every ncols cells make a
 * row. */
void table_cell(table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Print only the columns that spec names, in its order: a comma-separated
 * list of headings, in any case, a space in one also written '_' or '-'
 * ("id,state,last_change").  0, or -1 with err saying which name is not a
 * column and listing those that are (a usage error for the caller). */
int table_select(table *t, const char *spec, char *err, size_t err_len);
/* Print the rows without the line of headings, for scripts. */
void table_noheadings(table *t);
/* Columns are as wide as their widest cell on the screen, so that names
 * with accents line up too; two spaces between them. */
void table_print(const table *t, FILE *f);
void table_free(table *t);

/* ---- terminal-safe text --------------------------------------------------- */

/* Job names, paths and reasons come from the daemon and, through it, from
 * other users and old state: printed raw, an ESC sequence or a BEL in one
 * would act on the reader's terminal, and a bidi override would make it
 * read as something else.  The safe form is utf8_safe_step's: valid UTF-8
 * kept, C0 controls and DEL shown as "\x1b", C1 and bidi controls as
 * "\u202e", and each byte that is not part of a valid UTF-8 sequence as
 * "\xff". */
enum {
    TABLE_TEXT_LINES = 1, /* keep \n and \t (log text is multi-line) */
    TABLE_TEXT_MORE = 2,  /* more text follows: leave a sequence cut at the end */
};

/* Write the safe form of s[0..n) to f.  Returns the bytes consumed: n, or
 * with TABLE_TEXT_MORE, less by a UTF-8 sequence that the end cuts short
 * (the caller puts it in front of the next piece). */
size_t table_put_text(FILE *f, const char *s, size_t n, unsigned flags);
/* The safe form of the NUL-terminated s (NULL prints as ""), one line. */
void table_puts(FILE *f, const char *s);
/* The safe form of s, one line, into buf (always terminated, cut before an
 * escape or character that does not fit); returns buf. */
const char *table_text(const char *s, char *buf, size_t len);

#endif
