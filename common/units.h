/* units.h — human sizes and durations, as users write them in INI files and
 * read them in gradctl's tables. */
#ifndef GRADD_UNITS_H
#define GRADD_UNITS_H

#include <stddef.h>
#include <stdint.h>

/* "4096", "512K", "512M", "4G", "1.5G", "2T"; a trailing "B" or "iB" is
 * accepted.  Multiples are binary (1K = 1024).  Returns 0, or -1 with the
 * reason in err when the text is not a size. */
int units_parse_size(const char *text, uint64_t *out, char *err, size_t err_len);

/* "250ms", "30s", "5m", "1h", or a bare number of seconds. */
int units_parse_duration_ms(const char *text, uint64_t *out_ms, char *err, size_t err_len);

/* "0", "812K", "1.4G": three significant digits, binary multiples. */
const char *units_format_size(uint64_t bytes, char *buf, size_t len);

/* "45s", "12m03s", "3h07m", "2d04h". */
const char *units_format_duration(double seconds, char *buf, size_t len);

#endif
