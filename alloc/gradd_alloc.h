/* gradd_alloc.h — libgradd-alloc, gradd's memory pool as a program's CUDA
 * allocator.
 *
 * PyTorch loads the library with torch.cuda.memory.CUDAPluggableAllocator
 * (the entry points gradd_alloc_throwing / gradd_free, which gradd's shim
 * installs), and the shim serves torch.cuda.memory_stats() and its
 * relatives from the getters below, because PyTorch cannot ask a pluggable
 * allocator for them.  Every block comes from one gradd pool per device
 * (daemon/pool/), so a program's memory is placed, cached, trimmed and
 * counted as an engine job's is.
 *
 * The environment, read at the first call (gradd sets it for a program job;
 * a bad value makes every allocation fail with a message naming it):
 *   GRADD_ALLOC_BACKEND     cuda (the default where the library was built
 *                           with CUDA) or cpu: the simulated device, for tests
 *   GRADD_ALLOC_CPU_CAPACITY  the simulated device's size (default 1G)
 *   GRADD_ALLOC_CPU_EXTERNAL  how much of it other processes hold (tests of
 *                           a shared device; default 0)
 *   GRADD_ALLOC_LIMIT       the budget: the job's [memory] limit (a size;
 *                           unset or 0: none).  The page's budget word, when
 *                           the daemon sets one, replaces it.
 *   GRADD_ALLOC_EXPANDABLE  1: expandable segments, where the device can
 *   GRADD_ALLOC_GC_THRESHOLD, GRADD_ALLOC_LOW_WATERMARK, GRADD_ALLOC_MAX_SPLIT,
 *   GRADD_ALLOC_TRIM_EVERY_MS  the daemon's [pool] gc_threshold (0 to 1),
 *                           low_watermark and max_split_size (sizes) and
 *                           trim_every (milliseconds), applied to the
 *                           program's pool as to the daemon's
 *   GRADD_JOB_ID            the job the pool counts every block for
 *   GRADD_POOL_FD           the shared page (daemon/pool/pool_shm.h): the
 *                           statistics, trim and reclaim requests
 *   GRADD_POOL_EVENTFD      an eventfd to wake the daemon for a reclaim
 *   GRADD_RECLAIM_MS        how long a reclaim may take (default 200, at
 *                           most 10000)
 *
 * Threads: every function may be called from any thread.  Fork: a child
 * of a process that used the library refuses to allocate (CUDA cannot be
 * used across fork, and the child must not write the parent's page); its
 * frees are ignored.  Sizes are rounded up to 512 bytes; 0 bytes gets NULL
 * and no error.  Streams are opaque handles: a freed block is reused only
 * on the stream it was allocated on.
 */
#ifndef GRADD_ALLOC_H
#define GRADD_ALLOC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GRADD_ALLOC_API __attribute__((visibility("default")))

/* Read the environment and open the backend now rather than at the first
 * allocation.  0, or -1 with gradd_alloc_last_error() saying why. */
GRADD_ALLOC_API int gradd_alloc_init(void);
/* Return every device's memory and forget the environment; the next call
 * starts afresh.  For tests: nothing may be allocated from other threads
 * meanwhile. */
GRADD_ALLOC_API void gradd_alloc_shutdown(void);

/* The C entry points.  On failure gradd_alloc returns NULL and the
 * calling thread's gradd_alloc_last_error() says why; an out-of-memory
 * message starts "CUDA out of memory." and names the budget when that was
 * the cause.  Freeing NULL, or a pointer the pool did not hand out, does
 * nothing (the latter is counted as an invalid free). */
GRADD_ALLOC_API void *gradd_alloc(ssize_t size, int device, void *stream);
GRADD_ALLOC_API void gradd_free(void *ptr, ssize_t size, int device, void *stream);
/* The same allocation for PyTorch, which takes NULL for success: it throws
 * std::runtime_error with gradd_alloc_last_error()'s message instead
 * (alloc_throw.cc). */
GRADD_ALLOC_API void *gradd_alloc_throwing(ssize_t size, int device, void *stream);

/* The calling thread's last error ("" when none). */
GRADD_ALLOC_API const char *gradd_alloc_last_error(void);

/* Statistics of one device's pool, as torch.cuda's functions of the same
 * names report them (0 for a device never used). */
GRADD_ALLOC_API uint64_t gradd_memory_allocated(int device);
GRADD_ALLOC_API uint64_t gradd_memory_reserved(int device);
GRADD_ALLOC_API uint64_t gradd_max_memory_allocated(int device);
GRADD_ALLOC_API uint64_t gradd_max_memory_reserved(int device);
GRADD_ALLOC_API void gradd_reset_peak_memory_stats(int device);
/* torch.cuda.memory_stats(device) as one JSON object of integers under
 * PyTorch's key names ("allocated_bytes.all.current", "num_ooms", ...),
 * plus gradd's own under "gradd.": cache hits, trims, largest free block,
 * fragmentation in parts per million.  Writes at most len bytes, always
 * NUL-terminated when len > 0; returns the length of the whole text, like
 * snprintf, so a caller whose buffer was short can retry with more. */
GRADD_ALLOC_API size_t gradd_memory_stats_json(int device, char *buf, size_t len);
/* torch.cuda.empty_cache(): give every device's cached free memory back. */
GRADD_ALLOC_API void gradd_empty_cache(void);

#ifdef __cplusplus
}
#endif

#endif
