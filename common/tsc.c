/* tsc.c — the invariant-TSC test (see tsc.h).
 *
 * It asks the CPU, CPUID leaf 0x80000007 EDX bit 8 ("invariant TSC"),
 * rather than reading /proc/cpuinfo's constant_tsc and nonstop_tsc flags:
 * Linux derives nonstop_tsc (and constant_tsc with it) from this very bit,
 * also in a virtual machine, where both see the guest's CPUID.  So the file
 * says nothing the instruction does not, while reading it costs a file open
 * and a text scan on every pool created and fails where /proc is not
 * mounted (a chroot, a bare container). */
#include "tsc.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

bool tsc_invariant(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(0x80000000u, &a, &b, &c, &d) || a < 0x80000007u)
        return false;
    if (!__get_cpuid(0x80000007u, &a, &b, &c, &d))
        return false;
    return (d >> 8) & 1u;
}
#else
bool tsc_invariant(void)
{
    return false;
}
#endif
