/* tboard.h — TensorBoard event files (scalars) and TFRecord framing.
 *
 * An event file is a sequence of TFRecords:
 *   uint64 length (little-endian)
 *   uint32 masked CRC32C of the 8 length bytes
 *   length bytes of data (here: one serialized Event, proto/tensorboard.proto)
 *   uint32 masked CRC32C of the data
 * where mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8.
 *
 * tb_open creates DIR/events.out.tfevents.<unix time>.<hostname>.<pid>.gradd
 * (".N" appended if that name exists) and writes the first record, an Event
 * with file_version "brain.Event:2".  Each tb_scalar call appends one Event
 * whose Summary holds one simple_value.  Records are buffered; tb_flush hands
 * them to the kernel (so a reader, or a kill -9, sees them), tb_close also
 * fsyncs.  After a resume, open a new file and start it with
 * tb_session_start: TensorBoard reads every event file in the directory.
 *
 * A tb_writer is not thread-safe; use one per job.  After a write error the
 * writer stays failed: every later call returns -1 and tb_error tells why.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef struct tb_writer tb_writer;

/* Create the event file in DIR (which must exist).  0, or -1 with a message
 * naming the directory or file in err (*out is NULL then). */
int tb_open(const char *dir, tb_writer **out, char *err, size_t err_len);

/* Path of the event file. */
const char *tb_path(const tb_writer *w);

/* One scalar.  tag: non-empty UTF-8 (e.g. "train/loss").  wall_time in
 * seconds since the epoch; a value ≤ 0 or NaN means now. */
int tb_scalar(tb_writer *w, const char *tag, int64_t step, float value, double wall_time);

/* Several scalars of one step in one Event (n ≥ 1). */
int tb_scalars(tb_writer *w, int64_t step, double wall_time, size_t n, const char *const *tags,
               const float *values);

/* The run starts (or resumes) at step: an Event with SessionLog START, on
 * which TensorBoard discards what earlier event files hold for steps at or
 * past it (written after the checkpoint the run resumes from, then lost
 * to a crash, and now done again).  Flushed at once. */
int tb_session_start(tb_writer *w, int64_t step, double wall_time);

/* Write buffered records to the file (no fsync). */
int tb_flush(tb_writer *w);

/* The writer's first error ("" if none). */
const char *tb_error(const tb_writer *w);

/* Flush, fsync, close and free (w may be NULL).  0, or -1 with the first
 * error of the writer's life in err. */
int tb_close(tb_writer *w, char *err, size_t err_len);

/* ---- TFRecord reading ---------------------------------------------------- */

/* Called for each record; return 0 to go on, anything else to stop. */
typedef int (*tb_record_fn)(void *ctx, const uint8_t *data, size_t len);

/* Flags for tb_read_records. */
enum {
    /* A truncated last record (a file still being written, or cut by a
     * crash) ends the read quietly instead of being an error. */
    TB_READ_ALLOW_TRUNCATED_TAIL = 1,
};

/* Read every record of PATH, checking both CRCs of each, and call fn (may
 * be NULL to just validate and count).  Returns the number of records
 * delivered, or -1 with a message naming the file, the record index and its
 * byte offset (bad CRC, truncated record, length beyond the file, I/O). */
long tb_read_records(const char *path, unsigned flags, tb_record_fn fn, void *ctx, char *err,
                     size_t err_len);

/* ---- CRC32C (Castagnoli) -------------------------------------------------- */

/* crc32c of data continuing from crc (0 to start): tb_crc32c(0, "123456789",
 * 9) == 0xE3069283.  Uses SSE4.2 where the CPU has it. */
uint32_t tb_crc32c(uint32_t crc, const void *data, size_t n);
/* The table-driven path alone (to test the two against each other). */
uint32_t tb_crc32c_portable(uint32_t crc, const void *data, size_t n);
uint32_t tb_crc_mask(uint32_t crc);
uint32_t tb_crc_unmask(uint32_t masked);
