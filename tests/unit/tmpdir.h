/* tmpdir.h — a unit test's scratch directory, /tmp/gradd-test-TAG-XXXXXX:
 * flat (files only), made by a cmocka setup and removed by its teardown.
 * For the tests of the file formats; the engine's tests have fixture.h. */
#ifndef GRADD_TEST_TMPDIR_H
#define GRADD_TEST_TMPDIR_H

extern char td_path[64];

/* Make td_path.  0, or -1 (a cmocka setup's return). */
int td_make(const char *tag);
/* Remove the files in td_path and then it; a test may have made it
 * read-only.  0 (a cmocka teardown's return). */
int td_remove(void);

#endif
