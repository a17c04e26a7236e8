/* loop_client.h - a tiny loopback HTTP/1.1 client for the unit tests of the modules that serve
 * on the fake core's event loop (the API, the gateway): a blocking connect, one request sent
 * whole, and the answer read while the test turns the loop (EVLOOP_NONBLOCK, bounded by a
 * count: never a sleep, never a timer window). */
#ifndef OSUB_TEST_LOOP_CLIENT_H
#define OSUB_TEST_LOOP_CLIENT_H

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

/* Turns of the loop a test waits at most for something that is already on its way (a
 * loopback connection, bytes written): far more than any answer needs. */
#define LOOP_TURNS_MAX 200000

/* A connected socket to 127.0.0.1:port, or -1. */
static inline int lc_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Sends all of text: 0, or -1. */
static inline int lc_send(int fd, const char *text, size_t len)
{
    while (len > 0) {
        ssize_t w = send(fd, text, len, MSG_NOSIGNAL);
        if (w <= 0)
            return -1;
        text += w;
        len -= (size_t)w;
    }
    return 0;
}

/* An answer as read: its bytes (NUL-terminated), whether the server closed the connection. */
struct lc_answer {
    char buf[65536];
    size_t len;
    bool closed;
};

/* Reads what fd has now without waiting; true when something arrived or the server closed. */
static inline bool lc_read_now(int fd, struct lc_answer *a)
{
    bool any = false;
    for (;;) {
        if (a->len + 1 >= sizeof(a->buf))
            return any;
        ssize_t n = recv(fd, a->buf + a->len, sizeof(a->buf) - 1 - a->len, MSG_DONTWAIT);
        if (n > 0) {
            a->len += (size_t)n;
            a->buf[a->len] = '\0';
            any = true;
            continue;
        }
        if (n == 0) {
            a->closed = true;
            return true;
        }
        return any; /* EAGAIN: nothing more now */
    }
}

/* Turns the loop until the server has closed fd's connection (the answers here carry
 * Connection: close) or turns ran out: whether it closed. */
static inline bool lc_wait_closed(struct event_base *base, int fd, struct lc_answer *a, int turns)
{
    for (int i = 0; i < turns && !a->closed; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        lc_read_now(fd, a);
    }
    return a->closed;
}

/* The status code of an HTTP/1.x answer, or -1. */
static inline int lc_status(const struct lc_answer *a)
{
    int code = -1;
    if (a->len < 12 || sscanf(a->buf, "HTTP/1.%*c %d", &code) != 1)
        return -1;
    return code;
}

/* The body (after the blank line), or NULL. */
static inline const char *lc_body(const struct lc_answer *a)
{
    const char *p = strstr(a->buf, "\r\n\r\n");
    return p != NULL ? p + 4 : NULL;
}

#endif
