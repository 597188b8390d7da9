/* paths.c — default socket locations. */
#include "paths.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

const char *paths_default_socket(char *buf, size_t len)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (geteuid() == 0)
        snprintf(buf, len, "/run/gradd/gradd.sock");
    else if (xdg && *xdg == '/')
        snprintf(buf, len, "%s/gradd.sock", xdg);
    else
        snprintf(buf, len, "/tmp/gradd-%u/gradd.sock", (unsigned)geteuid());
    return buf;
}

const char *paths_client_socket(char *buf, size_t len)
{
    const char *env = getenv("GRADD_SOCKET");
    if (env && *env) {
        snprintf(buf, len, "%s", env);
        return buf;
    }
    return paths_default_socket(buf, len);
}
