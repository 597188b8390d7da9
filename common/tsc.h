/* tsc.h — whether the CPU's time-stamp counter can serve as a clock.
 * The pool's event timeline stamps with it, and the pool benchmarks time
 * single calls with it; both ask here so that they agree. */
#ifndef GRADD_TSC_H
#define GRADD_TSC_H

#include <stdbool.h>

/* True where the TSC is invariant: it ticks at one constant rate through
 * frequency changes and sleep states, so ticks map to time by a straight
 * line.  False on CPUs other than x86. */
bool tsc_invariant(void);

#endif
