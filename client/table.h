/* table.h — aligned text tables for gradctl's human output. */
#ifndef GRADCTL_TABLE_H
#define GRADCTL_TABLE_H

#include <stdio.h>

#define TABLE_MAX_COLS 16

typedef struct {
    int ncols;
    const char *head[TABLE_MAX_COLS];
    int right[TABLE_MAX_COLS]; /* right-align numbers */
    char **cells;              /* nrows × ncols, owned */
    int ncells, nrows, cap;
} table;

/* Column names; a name starting with '>' is right-aligned. */
void table_init(table *t, int ncols, const char *const *head);
/* Append one cell; every ncols cells make a row. */
void table_cell(table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void table_print(const table *t, FILE *f);
void table_free(table *t);

#endif
