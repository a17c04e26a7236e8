/* selfaddr.h - the addresses oversubd itself listens on (its API, its gateway): a backend that
 * names one is refused (the gateway never forwards to oversubd), and a request's Host header
 * must name one of them (or a configured name): DNS rebinding. Pure functions over a table the
 * caller keeps. */
#ifndef OSUBD_SELFADDR_H
#define OSUBD_SELFADDR_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#define OSUBD_SELF_MAX 8

struct osubd_self {
    int n;
    struct sockaddr_storage addr[OSUBD_SELF_MAX];
    const char *what[OSUBD_SELF_MAX]; /* "the control API", "the gateway": static strings */
};

/* Adds the address listening socket fd is bound to (getsockname). 0, or a negative errno. */
int osubd_self_add_fd(struct osubd_self *t, int fd, const char *what);
/* What of oversubd's a connection to sa would reach (a listener's what), or NULL. A listener
 * on a wildcard address is reached by any of this host's addresses (loopback included); a
 * connection to 0.0.0.0 or :: reaches loopback; IPv4-mapped IPv6 is IPv4. */
const char *osubd_self_match(const struct osubd_self *t, const struct sockaddr *sa);
/* The same for http://HOST[:PORT]/... when HOST is an IP literal or "localhost" (other names
 * are checked when the gateway connects, as they resolve then). NULL when not ours. */
const char *osubd_self_url(const struct osubd_self *t, const char *url);
/* Whether a Host header value (HOST[:PORT], [V6][:PORT]) names one of the listeners: an IP
 * literal that osubd_self_match takes, or "localhost", or one of names (comma-separated,
 * case-insensitive; may be NULL), with the listener's port (80 when none is given). */
bool osubd_self_host_ok(const struct osubd_self *t, const char *host, const char *names);

#endif
