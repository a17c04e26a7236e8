/* selfaddr.c - the addresses oversubd listens on, and whether an address or a Host is one */
#define _GNU_SOURCE
#include "selfaddr.h"

#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int osubd_self_add_fd(struct osubd_self *t, int fd, const char *what)
{
    if (t->n >= OSUBD_SELF_MAX)
        return -ENOSPC;
    socklen_t len = sizeof(t->addr[t->n]);
    if (getsockname(fd, (struct sockaddr *)&t->addr[t->n], &len) != 0)
        return -errno;
    t->what[t->n] = what;
    t->n++;
    return 0;
}

/* An address reduced to what compares: family (4 or 6), 16 bytes, the port. */
struct norm {
    int fam;
    unsigned char a[16];
    unsigned port;
};

static bool normalize(const struct sockaddr *sa, struct norm *n)
{
    memset(n, 0, sizeof(*n));
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
        n->fam = 4;
        memcpy(n->a, &s4->sin_addr, 4);
        n->port = ntohs(s4->sin_port);
        return true;
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
        n->port = ntohs(s6->sin6_port);
        if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
            n->fam = 4;
            memcpy(n->a, s6->sin6_addr.s6_addr + 12, 4);
        } else {
            n->fam = 6;
            memcpy(n->a, &s6->sin6_addr, 16);
        }
        return true;
    }
    return false;
}

static bool is_any(const struct norm *n)
{
    static const unsigned char zero[16];
    return memcmp(n->a, zero, n->fam == 4 ? 4 : 16) == 0;
}

static bool is_loopback(const struct norm *n)
{
    static const unsigned char one6[16] = {[15] = 1};
    return n->fam == 4 ? n->a[0] == 127 : memcmp(n->a, one6, 16) == 0;
}

/* One of this host's interface addresses (getifaddrs). */
static bool is_local(const struct norm *n)
{
    if (is_loopback(n) || is_any(n))
        return true;
    struct ifaddrs *ifa = NULL;
    if (getifaddrs(&ifa) != 0)
        return true; /* cannot tell: take it as ours (refusing is the safe side) */
    bool found = false;
    for (struct ifaddrs *i = ifa; i != NULL && !found; i = i->ifa_next) {
        struct norm m;
        if (i->ifa_addr != NULL && normalize(i->ifa_addr, &m) && m.fam == n->fam &&
            memcmp(m.a, n->a, n->fam == 4 ? 4 : 16) == 0)
            found = true;
    }
    freeifaddrs(ifa);
    return found;
}

const char *osubd_self_match(const struct osubd_self *t, const struct sockaddr *sa)
{
    struct norm b;
    if (t == NULL || !normalize(sa, &b))
        return NULL;
    for (int i = 0; i < t->n; i++) {
        struct norm l;
        if (!normalize((const struct sockaddr *)&t->addr[i], &l) || l.port != b.port)
            continue;
        if (is_any(&l)) {
            /* a v4 wildcard takes v4 only; a v6 wildcard takes both (unless V6ONLY: refusing
             * then is the safe side) */
            if ((l.fam == 6 || b.fam == 4) && is_local(&b))
                return t->what[i];
            continue;
        }
        if (l.fam != b.fam)
            continue;
        /* a connection to the wildcard address goes to loopback */
        if (memcmp(l.a, b.a, l.fam == 4 ? 4 : 16) == 0 || (is_any(&b) && is_loopback(&l)))
            return t->what[i];
    }
    return NULL;
}

/* Splits HOST[:PORT] or [V6][:PORT] (len bytes) into host and port (def when none). */
static bool split_host(const char *s, size_t len, char *host, size_t hostlen, unsigned *port,
                       unsigned def)
{
    const char *end = s + len, *colon = NULL;
    if (len > 0 && s[0] == '[') {
        const char *rb = memchr(s, ']', len);
        if (rb == NULL || (size_t)(rb - s - 1) >= hostlen)
            return false;
        snprintf(host, hostlen, "%.*s", (int)(rb - s - 1), s + 1);
        if (rb + 1 < end && rb[1] != ':')
            return false;
        colon = rb + 1 < end ? rb + 1 : NULL;
    } else {
        colon = memchr(s, ':', len);
        size_t hl = colon ? (size_t)(colon - s) : len;
        if (hl == 0 || hl >= hostlen ||
            (colon && memchr(colon + 1, ':', (size_t)(end - colon - 1))))
            return false;
        snprintf(host, hostlen, "%.*s", (int)hl, s);
    }
    *port = def;
    if (colon != NULL) {
        unsigned long v = 0;
        const char *p = colon + 1;
        while (p + 1 < end && *p == '0')
            p++; /* "07070" is port 7070 to a resolver */
        if (p == end || end - p > 5)
            return false;
        for (; p < end; p++) {
            if (*p < '0' || *p > '9')
                return false;
            v = v * 10 + (unsigned long)(*p - '0');
        }
        if (v == 0 || v > 65535)
            return false;
        *port = (unsigned)v;
    }
    return true;
}

/* host as an address with port, numeric only; false for a name */
static bool numeric(const char *host, unsigned port, struct sockaddr_storage *ss)
{
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV,
                             .ai_socktype = SOCK_STREAM},
                    *ai = NULL;
    char ps[8];
    snprintf(ps, sizeof(ps), "%u", port);
    if (getaddrinfo(host, ps, &hints, &ai) != 0 || ai == NULL)
        return false;
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    return true;
}

static void loopback_at(struct sockaddr_storage *ss, unsigned port, bool v6)
{
    memset(ss, 0, sizeof(*ss));
    if (v6) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
        s6->sin6_family = AF_INET6;
        s6->sin6_addr = in6addr_loopback;
        s6->sin6_port = htons((uint16_t)port);
    } else {
        struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
        s4->sin_family = AF_INET;
        s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        s4->sin_port = htons((uint16_t)port);
    }
}

const char *osubd_self_url(const struct osubd_self *t, const char *url)
{
    const char *h = url + (strncasecmp(url, "http://", 7) == 0 ? 7 : 0);
    size_t hl = strcspn(h, "/?#");
    const char *at = memchr(h, '@', hl); /* userinfo is not the host */
    if (at != NULL) {
        hl -= (size_t)(at + 1 - h);
        h = at + 1;
    }
    char host[256];
    unsigned port;
    if (!split_host(h, hl, host, sizeof(host), &port, 80))
        return NULL;
    struct sockaddr_storage ss;
    if (strcasecmp(host, "localhost") == 0 || strcasecmp(host, "localhost.") == 0) {
        loopback_at(&ss, port, false);
        const char *w = osubd_self_match(t, (struct sockaddr *)&ss);
        if (w != NULL)
            return w;
        loopback_at(&ss, port, true);
        return osubd_self_match(t, (struct sockaddr *)&ss);
    }
    return numeric(host, port, &ss) ? osubd_self_match(t, (struct sockaddr *)&ss) : NULL;
}

bool osubd_self_host_ok(const struct osubd_self *t, const char *value, const char *names)
{
    if (value == NULL)
        return false;
    char host[256];
    unsigned port;
    if (!split_host(value, strlen(value), host, sizeof(host), &port, 80))
        return false;
    struct sockaddr_storage ss;
    if (numeric(host, port, &ss))
        return osubd_self_match(t, (struct sockaddr *)&ss) != NULL;
    /* a name: localhost, or one configured, at one of the listeners' ports */
    bool named = strcasecmp(host, "localhost") == 0;
    size_t hl = strlen(host);
    for (const char *p = names; !named && p != NULL && *p != '\0';) {
        while (*p == ',' || *p == ' ')
            p++;
        size_t n = strcspn(p, ", ");
        if (n > 0 && n == hl && strncasecmp(p, host, n) == 0)
            named = true;
        p += n;
    }
    if (!named)
        return false;
    for (int i = 0; i < t->n; i++) {
        struct norm l;
        if (normalize((const struct sockaddr *)&t->addr[i], &l) && l.port == port)
            return true;
    }
    return false;
}
