/* paths.h — where the control socket lives by default. */
#ifndef GRADD_PATHS_H
#define GRADD_PATHS_H

#include <stddef.h>

/* The system-wide socket: gradd.socket's ListenStream, and root's default. */
#define PATHS_SYSTEM_SOCKET "/run/gradd/gradd.sock"

/* /run/gradd/gradd.sock for root; $XDG_RUNTIME_DIR/gradd.sock otherwise,
 * or "" (none) when that variable is unset. */
const char *paths_default_socket(char *buf, size_t len);

/* The socket a client should use: $GRADD_SOCKET if set, else the default;
 * for an ordinary user without one, or whose default socket does not
 * exist, the system socket when that one does (an installed gradd serving
 * everyone). */
const char *paths_client_socket(char *buf, size_t len);

#endif
