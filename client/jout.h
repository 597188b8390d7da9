/* jout.h — gradctl's --json output: jansson values made from what the
 * daemon sends, and one way to print a document. */
#ifndef GRADCTL_JOUT_H
#define GRADCTL_JOUT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* Make jansson's allocations (and jout_utf8's) infallible: out of memory,
 * gradctl says so and exits 1 (CTL_ERR_DAEMON), so that no document goes
 * out with a part missing and no caller checks for NULL.  Call once, first. */
void jout_init(void);

/* JSON text must be UTF-8, and strings from the daemon need not be (a path
 * from an old job, a name in another encoding).  A copy in which each byte
 * that does not start a valid UTF-8 sequence, and each NUL, is U+FFFD; the
 * rest kept.  malloc'd. */
char *jout_utf8(const void *s, size_t n);

json_t *jout_str(const char *s); /* NULL reads as ""; made valid UTF-8 */
json_t *jout_uint(uint64_t v);   /* the whole range, not only json_int_t's */
json_t *jout_real(double v);     /* null where not finite: JSON has no inf/nan */
/* obj[key] = v (the reference taken), key made valid UTF-8 too: for keys
 * that come from the daemon, such as tag names. */
void jout_set(json_t *obj, const char *key, json_t *v);

/* Write doc on one line of stdout and flush; the reference is taken.
 * DEL, C1 and bidi controls (utf8_unsafe_cp) in its strings go out as
 * \uXXXX escapes, as jansson writes C0 controls.
 * CTL_OK, so that a command can end with `return jout_print(doc)`;
 * CTL_ERR_DAEMON for a document that jansson did not make (a bug). */
int jout_print(json_t *doc);

#endif
