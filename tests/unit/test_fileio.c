/* test_fileio.c — fileio_open_regular: a regular file opens as asked;
 * a FIFO, a directory, a device, a socket or (under O_NOFOLLOW) a link is
 * refused by name, at once, without waiting for another end. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <cmocka.h>

#include "fileio.h"
#include "tmpdir.h"

static char path_buf[4][256];

static const char *tpath(int slot, const char *name)
{
    snprintf(path_buf[slot], sizeof path_buf[slot], "%s/%s", td_path, name);
    return path_buf[slot];
}

/* fileio_open_regular(path, flags) fails with EINVAL and exactly
 * "PATH: not a regular file (KIND)". */
static void expect_refused(const char *path, int flags, const char *kind)
{
    char err[512], want[512];
    errno = 0;
    int fd = fileio_open_regular(path, flags, 0600, err, sizeof err);
    if (fd >= 0)
        close(fd);
    assert_int_equal(fd, -1);
    assert_int_equal(errno, EINVAL);
    snprintf(want, sizeof want, "%s: not a regular file (%s)", path, kind);
    assert_string_equal(err, want);
}

static int setup(void **state)
{
    (void)state;
    return td_make("fileio");
}

static int teardown(void **state)
{
    (void)state;
    return td_remove();
}

static void test_regular(void **state)
{
    (void)state;
    char err[512];
    const char *p = tpath(0, "plain");
    int fd = fileio_open_regular(p, O_WRONLY | O_CREAT | O_TRUNC, 0600, err, sizeof err);
    assert_true(fd >= 0);
    /* What the caller did not ask for is not left on the descriptor. */
    assert_int_equal(fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
    assert_int_equal(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
    assert_int_equal(write(fd, "abc", 3), 3);
    close(fd);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_true(S_ISREG(st.st_mode));

    fd = fileio_open_regular(p, O_RDONLY | O_NONBLOCK, 0, err, sizeof err);
    assert_true(fd >= 0);
    assert_int_equal(fcntl(fd, F_GETFL) & O_NONBLOCK, O_NONBLOCK);
    char buf[4] = {0};
    assert_int_equal(read(fd, buf, sizeof buf), 3);
    assert_string_equal(buf, "abc");
    close(fd);

    /* Followed through a link unless O_NOFOLLOW says not to. */
    const char *l = tpath(1, "link");
    assert_int_equal(symlink(p, l), 0);
    fd = fileio_open_regular(l, O_RDONLY, 0, err, sizeof err);
    assert_true(fd >= 0);
    close(fd);
    expect_refused(l, O_RDONLY | O_NOFOLLOW, "a symbolic link");
    expect_refused(l, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, "a symbolic link");

    /* Missing: open(2)'s reason, and its errno. */
    const char *m = tpath(2, "missing");
    errno = 0;
    assert_int_equal(fileio_open_regular(m, O_RDONLY, 0, err, sizeof err), -1);
    assert_int_equal(errno, ENOENT);
    char want[512];
    snprintf(want, sizeof want, "%s: cannot open: %s", m, strerror(ENOENT));
    assert_string_equal(err, want);
    /* No buffer for the reason is fine. */
    assert_int_equal(fileio_open_regular(m, O_RDONLY, 0, NULL, 0), -1);
}

static void test_fifo(void **state)
{
    (void)state;
    /* Nobody at the other end: open(2) would wait for ever to read, and
     * fail (ENXIO) or, without O_NONBLOCK, wait to write. */
    const char *f = tpath(0, "fifo");
    assert_int_equal(mkfifo(f, 0600), 0);
    expect_refused(f, O_RDONLY, "a FIFO");
    expect_refused(f, O_WRONLY | O_APPEND, "a FIFO");
    expect_refused(f, O_WRONLY | O_CREAT | O_TRUNC, "a FIFO");
    expect_refused(f, O_RDWR, "a FIFO");
    /* The same through a link, which is followed to what it names. */
    const char *l = tpath(1, "to-fifo");
    assert_int_equal(symlink(f, l), 0);
    expect_refused(l, O_RDONLY, "a FIFO");
    /* With a writer holding the other end the open itself would not
     * block, and is still refused. */
    int w = open(f, O_RDWR | O_NONBLOCK);
    assert_true(w >= 0);
    expect_refused(f, O_RDONLY, "a FIFO");
    close(w);
}

static void test_other_kinds(void **state)
{
    (void)state;
    expect_refused(td_path, O_RDONLY, "a directory");
    expect_refused("/dev/null", O_RDONLY, "a character device");
    expect_refused("/dev/null", O_WRONLY | O_APPEND, "a character device");

    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", tpath(0, "sock"));
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(s >= 0);
    assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
    expect_refused(a.sun_path, O_RDONLY, "a socket");
    close(s);
}

int main(void)
{
    /* A regression here blocks in open(2): fail, rather than hang. */
    alarm(30);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regular),
        cmocka_unit_test(test_fifo),
        cmocka_unit_test(test_other_kinds),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
