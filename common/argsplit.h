/* argsplit.h — a command line split into words the way a shell would quote
 * them, without a shell: no variables, globs, redirections or pipes.
 *
 * Outside quotes, spaces and tabs separate words and a backslash keeps the
 * next character as it is.  'single quotes' keep everything up to the next
 * single quote.  "double quotes" keep everything up to the next unescaped
 * double quote; inside them a backslash escapes only \" \\ and \$ and is
 * kept before any other character, as in sh.  '' and "" make an empty word.
 * A job file's [program] command and env are read this way.
 */
#ifndef GRADD_ARGSPLIT_H
#define GRADD_ARGSPLIT_H

#include <stddef.h>

/* Split `s` into words, written one after another into out, each ending in
 * a NUL; out never needs more than strlen(s) + 1 bytes.  The number of
 * words (0 for blank input), or -1 with why ("unterminated double quote
 * starting at column 5") when the quoting is wrong or out is too small. */
int argsplit(const char *s, char *out, size_t out_len, char *why, size_t why_len);

/* The word after `word` in argsplit's output. */
const char *argsplit_next(const char *word);

#endif
