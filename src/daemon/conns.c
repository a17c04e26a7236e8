/* conns.c - caps on the API's connections per client address and in all, and accept loops that
 * back off when descriptors run out, instead of spinning (docs/security.md).
 *
 * evhttp (libevent 2.1) accepts by itself and offers no hook with the new descriptor; it does
 * let us make each connection's bufferevent. So: the bufferevent is made here (and held by a
 * reference), and once evhttp has given it its descriptor, in the same turn of the loop and
 * before anything is read from it, the descriptor's peer is counted. A connection over a cap is
 * answered 503 and shut down: evhttp sees the end and frees it. Open connections are known by
 * (descriptor, socket inode): an entry whose descriptor no longer is that socket was closed. */
#define _GNU_SOURCE
#include "conns.h"
#include "log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/bufferevent.h>

struct conn {
    int fd;
    ino_t ino;
    char peer[INET6_ADDRSTRLEN];
    time_t opened;
    bool served; /* its first request arrived whole */
};

#define HEAD_DEADLINE_S 10 /* a first request's head must arrive within this (408 otherwise) */

struct osubd_conns {
    struct event_base *base;
    int per_client, total;
    char name[32];
    struct conn *open;
    int n_open, cap_open;
    struct bufferevent **pending;
    int n_pending, cap_pending;
    struct event *check;
    struct event *sweep; /* each second: connections whose first request is late */
    uint64_t refused, slow;
    time_t logged;
    uint64_t refused_logged;
};

static const char busy_client[] =
    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    "Connection: close\r\nRetry-After: 1\r\nContent-Length: 92\r\n\r\n"
    "{\"error\":{\"code\":\"too_many_connections\",\"message\":\"this client "
    "holds too many connections\"}}";
static const char busy_all[] =
    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    "Connection: close\r\nRetry-After: 1\r\nContent-Length: 96\r\n\r\n"
    "{\"error\":{\"code\":\"too_many_connections\",\"message\":\"the API holds all the "
    "connections it takes\"}}";

static void turn_away(int fd, bool all)
{
    const char *busy = all ? busy_all : busy_client;
    size_t n = all ? sizeof(busy_all) - 1 : sizeof(busy_client) - 1;
    ssize_t w = send(fd, busy, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    (void)w;
    shutdown(fd, SHUT_RDWR);
}

static bool still_open(const struct conn *k)
{
    struct stat st;
    return fstat(k->fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == k->ino;
}

static void peer_of(int fd, char *out, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    out[0] = '\0';
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0)
        return;
    if (ss.ss_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, out, (socklen_t)len);
    else if (ss.ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, out, (socklen_t)len);
    else
        snprintf(out, len, "local");
}

static void log_refusals(struct osubd_conns *c, const char *why)
{
    time_t now = time(NULL);
    if (now - c->logged < 10)
        return;
    osubd_log(OSUBD_LOG_WARN, "%s: %llu connection(s) turned away since the last message (%s)",
              c->name, (unsigned long long)(c->refused - c->refused_logged), why);
    c->logged = now;
    c->refused_logged = c->refused;
}

static void on_check(evutil_socket_t unused, short what, void *arg)
{
    (void)unused;
    (void)what;
    struct osubd_conns *c = arg;
    /* forget what closed */
    int keep = 0;
    for (int i = 0; i < c->n_open; i++)
        if (still_open(&c->open[i]))
            c->open[keep++] = c->open[i];
    c->n_open = keep;
    for (int i = 0; i < c->n_pending; i++) {
        struct bufferevent *bev = c->pending[i];
        int fd = (int)bufferevent_getfd(bev);
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0) {
            struct conn k = {.fd = fd, .ino = st.st_ino, .opened = time(NULL)};
            peer_of(fd, k.peer, sizeof(k.peer));
            int mine = 0;
            for (int j = 0; j < c->n_open && c->per_client > 0; j++)
                mine += strcmp(c->open[j].peer, k.peer) == 0;
            const char *over = c->n_open >= c->total                        ? "in all"
                               : c->per_client > 0 && mine >= c->per_client ? "per client"
                                                                            : NULL;
            if (over == NULL && c->n_open == c->cap_open) {
                int nc = c->cap_open ? c->cap_open * 2 : 64;
                struct conn *n = realloc(c->open, (size_t)nc * sizeof(*n));
                if (n != NULL) {
                    c->open = n;
                    c->cap_open = nc;
                } else {
                    over = "out of memory";
                }
            }
            if (over != NULL) {
                c->refused++;
                turn_away(fd, strcmp(over, "per client") != 0);
                char why[120];
                snprintf(why, sizeof(why), "over the cap %s; latest from %s", over, k.peer);
                log_refusals(c, why);
            } else {
                c->open[c->n_open++] = k;
            }
        }
        bufferevent_decref(bev);
    }
    c->n_pending = 0;
}

static const char slow_head[] =
    "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\n"
    "Content-Length: 94\r\n\r\n"
    "{\"error\":{\"code\":\"request_timeout\",\"message\":\"the request's head did not "
    "arrive within 10 s\"}}";

static void on_sweep(evutil_socket_t unused, short what, void *arg)
{
    (void)unused;
    (void)what;
    struct osubd_conns *c = arg;
    time_t now = time(NULL);
    int keep = 0;
    for (int i = 0; i < c->n_open; i++) {
        struct conn *k = &c->open[i];
        if (!still_open(k))
            continue;
        if (!k->served && now - k->opened > HEAD_DEADLINE_S) {
            /* nothing was written on it yet: the answer goes straight to the socket, and
             * evhttp sees the end and frees the connection */
            ssize_t w = send(k->fd, slow_head, sizeof(slow_head) - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
            (void)w;
            shutdown(k->fd, SHUT_RDWR);
            c->slow++;
            continue;
        }
        c->open[keep++] = *k;
    }
    c->n_open = keep;
}

void osubd_conns_served(struct osubd_conns *c, int fd)
{
    if (c == NULL || fd < 0)
        return;
    for (int i = 0; i < c->n_open; i++)
        if (c->open[i].fd == fd && !c->open[i].served && still_open(&c->open[i])) {
            c->open[i].served = true;
            return;
        }
}

uint64_t osubd_conns_slow(const struct osubd_conns *c)
{
    return c ? c->slow : 0;
}

static struct bufferevent *make_bev(struct event_base *base, void *arg)
{
    struct osubd_conns *c = arg;
    struct bufferevent *bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (bev == NULL)
        return NULL;
    if (c->n_pending == c->cap_pending) {
        int nc = c->cap_pending ? c->cap_pending * 2 : 16;
        struct bufferevent **n = realloc(c->pending, (size_t)nc * sizeof(*n));
        if (n == NULL)
            return bev; /* not counted: the caps are a defence, not a correctness need */
        c->pending = n;
        c->cap_pending = nc;
    }
    bufferevent_incref(bev);
    c->pending[c->n_pending++] = bev;
    event_active(c->check, 0, 0);
    return bev;
}

struct osubd_conns *osubd_conns_new(struct event_base *base, struct evhttp *http, int per_client,
                                    int total, const char *name)
{
    struct osubd_conns *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->base = base;
    c->per_client = per_client;
    c->total = total;
    snprintf(c->name, sizeof(c->name), "%s", name);
    c->check = event_new(base, -1, 0, on_check, c);
    c->sweep = event_new(base, -1, EV_PERSIST, on_sweep, c);
    struct timeval second = {1, 0};
    if (c->check == NULL || c->sweep == NULL || event_add(c->sweep, &second) != 0) {
        if (c->check)
            event_free(c->check);
        if (c->sweep)
            event_free(c->sweep);
        free(c);
        return NULL;
    }
    evhttp_set_bevcb(http, make_bev, c);
    return c;
}

void osubd_conns_listen(struct osubd_conns *c, struct evhttp_bound_socket *bound)
{
    struct evconnlistener *lis = bound ? evhttp_bound_socket_get_listener(bound) : NULL;
    if (lis != NULL)
        osubd_listener_guard(lis, c->name, &c->refused);
}

void osubd_conns_free(struct osubd_conns *c)
{
    if (c == NULL)
        return;
    for (int i = 0; i < c->n_pending; i++)
        bufferevent_decref(c->pending[i]);
    event_free(c->check);
    event_free(c->sweep);
    free(c->pending);
    free(c->open);
    free(c);
}

int osubd_conns_open(const struct osubd_conns *c)
{
    return c ? c->n_open : 0;
}

uint64_t osubd_conns_refused(const struct osubd_conns *c)
{
    return c ? c->refused : 0;
}

/* ---- parked requests whose client left ---------------------------------------------------- */

static void on_client_readable(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct osubd_client_watch *w = arg;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR)))
        return; /* not re-armed: one look is enough, the wait's own timer still ends it */
    if (w->gone != NULL)
        (*w->gone)++;
    evhttp_connection_free(w->evcon); /* its close callback frees w's owner, and w->ev */
}

void osubd_client_watch(struct osubd_client_watch *w, struct event_base *base,
                        struct evhttp_request *req, uint64_t *gone)
{
    w->ev = NULL;
    w->gone = gone;
    w->evcon = evhttp_request_get_connection(req);
    struct bufferevent *bev = w->evcon ? evhttp_connection_get_bufferevent(w->evcon) : NULL;
    evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
    if (fd >= 0 && (w->ev = event_new(base, fd, EV_READ, on_client_readable, w)) != NULL)
        event_add(w->ev, NULL);
}

void osubd_client_unwatch(struct osubd_client_watch *w)
{
    if (w->ev != NULL)
        event_free(w->ev);
    w->ev = NULL;
}

/* ---- accepting without descriptors --------------------------------------------------------- */

struct guard {
    struct evconnlistener *lis;
    struct event *resume;
    char name[32];
    int spare; /* a descriptor kept to be given up, so that one pending client can be told */
    uint64_t *counter;
    uint64_t since_log;
    time_t logged;
};

static void on_resume(evutil_socket_t unused, short what, void *arg)
{
    (void)unused;
    (void)what;
    struct guard *g = arg;
    if (g->spare < 0)
        g->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    evconnlistener_enable(g->lis);
}

#define MAX_GUARDS 8
static struct guard *guards[MAX_GUARDS];
static int n_guards;

static void on_accept_error(struct evconnlistener *lis, void *unused)
{
    (void)unused;
    struct guard *g = NULL;
    for (int i = 0; i < n_guards && g == NULL; i++)
        if (guards[i]->lis == lis)
            g = guards[i];
    int e = EVUTIL_SOCKET_ERROR();
    if (g == NULL)
        return;
    if (e != EMFILE && e != ENFILE && e != ENOBUFS && e != ENOMEM) {
        osubd_log(OSUBD_LOG_WARN, "%s: accept: %s", g->name, strerror(e));
        return;
    }
    evconnlistener_disable(lis);
    if (g->spare >= 0) {
        close(g->spare);
        g->spare = -1;
        int fd = accept4((int)evconnlistener_get_fd(lis), NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) {
            static const char full[] =
                "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\n"
                "Content-Length: 0\r\n\r\n";
            ssize_t w = send(fd, full, sizeof(full) - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
            (void)w;
            close(fd);
        }
    }
    g->since_log++;
    if (g->counter != NULL)
        (*g->counter)++;
    time_t now = time(NULL);
    if (now - g->logged >= 10) {
        osubd_log(OSUBD_LOG_INFO,
                  "%s: out of file descriptors (%s): accepting pauses for 250 ms at a "
                  "time; %llu pause(s) since the last message",
                  g->name, strerror(e), (unsigned long long)g->since_log);
        g->logged = now;
        g->since_log = 0;
    }
    struct timeval tv = {0, 250000};
    evtimer_add(g->resume, &tv);
}

void osubd_listener_guard(struct evconnlistener *lis, const char *name, uint64_t *counter)
{
    struct guard *g = calloc(1, sizeof(*g));
    if (g == NULL)
        return;
    g->lis = lis;
    g->counter = counter;
    snprintf(g->name, sizeof(g->name), "%s", name);
    g->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    g->resume = evtimer_new(evconnlistener_get_base(lis), on_resume, g);
    if (g->resume == NULL) {
        if (g->spare >= 0)
            close(g->spare);
        free(g);
        return;
    }
    /* the error callback gets the listener's own argument (evhttp's, the gateway's): the
     * guard is found by its listener. Guards live as long as the process's listeners. */
    if (n_guards == MAX_GUARDS) {
        event_free(g->resume);
        if (g->spare >= 0)
            close(g->spare);
        free(g);
        return;
    }
    guards[n_guards++] = g;
    evconnlistener_set_error_cb(lis, on_accept_error);
}

void osubd_listener_unguard(struct evconnlistener *lis)
{
    for (int i = 0; i < n_guards; i++)
        if (guards[i]->lis == lis) {
            struct guard *g = guards[i];
            event_free(g->resume);
            if (g->spare >= 0)
                close(g->spare);
            free(g);
            guards[i] = guards[--n_guards];
            return;
        }
}
