/* paths.h — where the control socket lives by default. */
#ifndef GRADD_PATHS_H
#define GRADD_PATHS_H

#include <stddef.h>

/* /run/gradd/gradd.sock for root; $XDG_RUNTIME_DIR/gradd.sock otherwise,
 * or /tmp/gradd-UID/gradd.sock when that variable is unset. */
const char *paths_default_socket(char *buf, size_t len);

/* The socket a client should use: $GRADD_SOCKET if set, else the default. */
const char *paths_client_socket(char *buf, size_t len);

#endif
