/* tmpdir.h — a unit test's scratch directory, /tmp/gradd-test-TAG-XXXXXX,
 * made by a cmocka setup and removed, with everything under it, by its
 * teardown.  For the tests of the file formats and the job queue's state
 * dir; the engine's tests have fixture.h. */
#ifndef GRADD_TEST_TMPDIR_H
#define GRADD_TEST_TMPDIR_H

extern char td_path[64];

/* Make td_path.  0, or -1 (a cmocka setup's return). */
int td_make(const char *tag);
/* Remove td_path and everything under it; a test may have made it or a
 * directory in it read-only.  0 (a cmocka teardown's return). */
int td_remove(void);

#endif
