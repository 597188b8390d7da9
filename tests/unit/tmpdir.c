/* tmpdir.c — see tmpdir.h. */
#include "tmpdir.h"

#include <dirent.h>
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

int td_remove(void)
{
    chmod(td_path, 0700);
    DIR *d = opendir(td_path);
    if (d) {
        struct dirent *e;
        char p[512];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", td_path, e->d_name);
                unlink(p);
            }
        closedir(d);
    }
    rmdir(td_path);
    return 0;
}
