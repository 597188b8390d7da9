/* tmpdir.c — see tmpdir.h. */
#include "tmpdir.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char td_path[64];

int td_make(const char *tag)
{
    snprintf(td_path, sizeof td_path, "/tmp/gradd-test-%s-XXXXXX", tag);
    return mkdtemp(td_path) ? 0 : -1;
}

/* Directories are visited on the way in too (no FTW_DEPTH there) so that
 * one a test made read-only is opened up before its entries are removed. */
static int td_open_up(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if (type == FTW_D || type == FTW_DNR)
        chmod(path, 0700);
    return 0;
}

static int td_unlink(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if (type == FTW_DP)
        rmdir(path);
    else
        unlink(path);
    return 0;
}

int td_remove(void)
{
    chmod(td_path, 0700);
    nftw(td_path, td_open_up, 16, FTW_PHYS);
    nftw(td_path, td_unlink, 16, FTW_PHYS | FTW_DEPTH);
    return 0;
}
