/* kern_check.h — what the CPU kernel tests (test_kernels_*.c) share: the
 * ops table under test, reproducible random vectors, comparison against a
 * reference computed in double, and gradient checks by central finite
 * differences.
 *
 * Gradient checks.  For an op f and random weights w, the scalar loss is
 * L = Σ w ⊙ f(x), summed in double; the analytic gradient is the op's
 * backward with dout = w.  The numeric one is (L(x+h) - L(x-h)) / (2h) with
 * h = 1e-2 (the actual float difference of the perturbed inputs is used).
 * With fp32 forwards of O(1) values, rounding in L is ~1e-7 relative, i.e.
 * ~1e-5 in the quotient, and the O(h²) truncation is ~1e-5 relative; the
 * worst errors measured are 2e-5·max|g| and 1.5e-4 relative.  An element
 * passes when |analytic - numeric| <= 1e-3·max(|a|,|n|) + 2e-4·max_j |n_j|,
 * tight enough to catch a 0.5% error in a derivative term.
 *
 * One test process, one random stream: each test executable starts it from
 * the same seed, so its inputs are the same on every run. */
#ifndef GRADD_TEST_KERN_CHECK_H
#define GRADD_TEST_KERN_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

/* The cpu ops table; each test's main sets it from kern_cpu_ops(). */
extern const kern_ops *ops;

/* splitmix64 from a fixed seed: 32 random bits. */
uint32_t rng_u32(void);
/* uniform in [-1, 1) */
float rng_f(void);
/* n floats scale·uniform[-1,1), zeros, or a copy of src: malloc'd, a cmocka
 * failure when there is no memory. */
float *randv(size_t n, float scale);
float *zerov(size_t n);
float *dupv(const float *src, size_t n);
/* n zeroed 16-bit values (calloc'd). */
uint16_t *h16(size_t n);
/* Σ a[i]·b[i] in double. */
double dotd(const float *a, const float *b, size_t n);

/* max_i |got - want| <= atol + rtol·|want|, or a cmocka failure naming
 * `what` and the first element out of tolerance. */
void assert_close(const char *what, const float *got, const double *want, size_t n, double rtol, double atol);

/* The loss of a gradient check: runs the op's forward on the case c and
 * returns Σ w ⊙ out in double. */
typedef double (*loss_fn)(void *c);
/* Compares analytic (n) with the central difference of loss over x (n).
 * `skip` (may be NULL) marks elements where the loss is not differentiable. */
void check_grad(const char *what, float *x, const float *analytic, size_t n, loss_fn loss, void *c,
                const unsigned char *skip);

/* An fp32 cpu kernel context with that many threads (a cmocka failure when
 * it cannot be made). */
kern_ctx *ctx(int threads);

#endif
