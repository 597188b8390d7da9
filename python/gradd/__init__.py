"""gradd's Python package for program jobs (the allocator shim is gradd._alloc)."""
