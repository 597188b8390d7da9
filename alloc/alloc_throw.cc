// alloc_throw.cc — the allocation entry point PyTorch gets.  PyTorch takes
// a NULL from a pluggable allocator for success, so a failure must leave as
// an exception: std::runtime_error carrying gradd_alloc_last_error(), whose
// "CUDA out of memory." opening is what batch-size finders (accelerate,
// the Hugging Face Trainer) look for.  Without PyTorch's headers c10's own
// error type is out of reach; PyTorch turns any std::exception from an
// allocator into a Python RuntimeError carrying the message.
#include <stdexcept>

#include "gradd_alloc.h"

extern "C" GRADD_ALLOC_API void *gradd_alloc_throwing(ssize_t size, int device, void *stream)
{
    void *p = gradd_alloc(size, device, stream);
    if (!p && size != 0)
        throw std::runtime_error(gradd_alloc_last_error());
    return p;
}
