/* promtext.h — the Prometheus text exposition format (0.0.4), read back
 * into JSON for `gradctl --json metrics`. */
#ifndef GRADCTL_PROMTEXT_H
#define GRADCTL_PROMTEXT_H

#include <jansson.h>

/* {"metrics": [{"name", "labels": {...}, "value", "type", "help"}, ...]},
 * one entry per sample line in the order given; a histogram's _bucket,
 * _sum and _count samples take the type and help of their family.  A value
 * that is not finite (+Inf, NaN) is null.  Lines that are not samples,
 * HELP or TYPE, or samples whose value is not a number, are skipped: the
 * text is the daemon's, and a line this reader does not know must not hide
 * the others. */
json_t *promtext_json(const char *text);

#endif
