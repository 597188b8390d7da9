/* fill.c — CPU reference of fill_pattern. */
#include "kernels.h"

void kern_cpu_fill_pattern(uint32_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = kern_pattern(seed, i);
}

size_t kern_cpu_check_pattern(const uint32_t *p, size_t n, uint32_t seed)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += p[i] != kern_pattern(seed, i);
    return bad;
}
