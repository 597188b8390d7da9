/* paths.c — default socket locations. */
#include "paths.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

const char *paths_default_socket(char *buf, size_t len)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (geteuid() == 0)
        snprintf(buf, len, "%s", PATHS_SYSTEM_SOCKET);
    else if (xdg && *xdg == '/')
        snprintf(buf, len, "%s/gradd.sock", xdg);
    else if (len)
        buf[0] = '\0'; /* not in a shared directory such as /tmp, which another user could make first */
    return buf;
}

const char *paths_client_socket(char *buf, size_t len)
{
    const char *env = getenv("GRADD_SOCKET");
    if (env && *env) {
        snprintf(buf, len, "%s", env);
        return buf;
    }
    paths_default_socket(buf, len);
    /* An ordinary user's own gradd, when one has made its socket; else the
     * system's (gradd.socket), which is where an installed gradd serves
     * every member of its socket group. */
    struct stat st;
    if (geteuid() != 0 &&
        (!buf[0] || (lstat(buf, &st) != 0 && errno == ENOENT && lstat(PATHS_SYSTEM_SOCKET, &st) == 0)))
        snprintf(buf, len, "%s", PATHS_SYSTEM_SOCKET);
    return buf;
}
