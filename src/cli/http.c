/* http.c - a small blocking HTTP/1.1 client for the oversub CLI */
#define _POSIX_C_SOURCE 200809L
#include "http.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

int http_target_init(struct http_target *t, const char *url, char *err, size_t errlen)
{
    memset(t, 0, sizeof(*t));
    const char *tok = getenv("OVERSUB_TOKEN");
    if (tok != NULL)
        snprintf(t->token, sizeof(t->token), "%s", tok);
    if (url == NULL)
        url = getenv("OVERSUB_URL");
    struct stat st;
    if (url == NULL && stat("var/oversub.sock", &st) == 0 && S_ISSOCK(st.st_mode)) {
        snprintf(t->unix_path, sizeof(t->unix_path), "var/oversub.sock");
        return 0;
    }
    if (url == NULL)
        url = "http://127.0.0.1:7070";
    if (strncmp(url, "unix:", 5) == 0) {
        snprintf(t->unix_path, sizeof(t->unix_path), "%s", url + 5);
        return 0;
    }
    if (strncmp(url, "http://", 7) != 0) {
        snprintf(err, errlen, "'%s' is not an http:// URL or unix:PATH", url);
        return -1;
    }
    const char *h = url + 7;
    const char *colon = strrchr(h, ':');
    const char *slash = strchr(h, '/');
    size_t hl = colon ? (size_t)(colon - h) : slash ? (size_t)(slash - h) : strlen(h);
    if (hl == 0 || hl >= sizeof(t->host)) {
        snprintf(err, errlen, "'%s' has no host", url);
        return -1;
    }
    memcpy(t->host, h, hl);
    t->host[hl] = '\0';
    t->port = colon ? atoi(colon + 1) : 80;
    if (t->port <= 0 || t->port > 65535) {
        snprintf(err, errlen, "'%s' has no valid port", url);
        return -1;
    }
    return 0;
}

static int connect_to(const struct http_target *t, char *err, size_t errlen)
{
    if (t->unix_path[0]) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un sa;
        memset(&sa, 0, sizeof(sa));
        sa.sun_family = AF_UNIX;
        if (strlen(t->unix_path) >= sizeof(sa.sun_path)) {
            snprintf(err, errlen, "unix:%s: path too long", t->unix_path);
            if (fd >= 0)
                close(fd);
            return -1;
        }
        memcpy(sa.sun_path, t->unix_path, strlen(t->unix_path) + 1);
        if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
            snprintf(err, errlen, "cannot reach oversubd at unix:%s: %s", t->unix_path,
                     strerror(errno));
            if (fd >= 0)
                close(fd);
            return -1;
        }
        return fd;
    }
    struct addrinfo hints, *res;
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    char port[16];
    snprintf(port, sizeof(port), "%d", t->port);
    if (getaddrinfo(t->host, port, &hints, &res) != 0) {
        snprintf(err, errlen, "cannot resolve %s", t->host);
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) == 0)
            break;
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        snprintf(err, errlen, "cannot reach oversubd at http://%s:%d: %s", t->host, t->port,
                 strerror(errno));
    return fd;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int http_request(const struct http_target *t, const char *method, const char *path,
                 const char *body, struct http_resp *resp, char *err, size_t errlen)
{
    memset(resp, 0, sizeof(*resp));
    int fd = connect_to(t, err, errlen);
    if (fd < 0)
        return -1;
    char head[1024];
    size_t bl = body ? strlen(body) : 0;
    char auth[300] = "";
    if (t->token[0])
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s\r\n", t->token);
    /* Host: the address connected to (oversubd refuses a Host that is not one of its own) */
    char host[300];
    if (t->unix_path[0])
        snprintf(host, sizeof(host), "localhost");
    else if (strchr(t->host, ':') != NULL)
        snprintf(host, sizeof(host), "[%s]:%d", t->host, t->port);
    else
        snprintf(host, sizeof(host), "%s:%d", t->host, t->port);
    int hl = snprintf(head, sizeof(head),
                      "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n%s"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                      method, path, host, auth, bl);
    if (hl < 0 || (size_t)hl >= sizeof(head) || write_all(fd, head, (size_t)hl) != 0 ||
        (bl > 0 && write_all(fd, body, bl) != 0)) {
        snprintf(err, errlen, "cannot send the request: %s", strerror(errno));
        close(fd);
        return -1;
    }
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (buf == NULL)
            break;
        if (n == cap) {
            if (cap >= (64u << 20))
                break;
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (nb == NULL)
                break;
            buf = nb;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    if (buf == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    buf[n] = '\0';
    int status = 0;
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1) {
        snprintf(err, errlen, "oversubd answered something that is not HTTP");
        free(buf);
        return -1;
    }
    char *b = strstr(buf, "\r\n\r\n");
    b = b ? b + 4 : buf + n;
    resp->status = status;
    resp->len = (size_t)(buf + n - b);
    resp->body = malloc(resp->len + 1);
    if (resp->body != NULL) {
        memcpy(resp->body, b, resp->len);
        resp->body[resp->len] = '\0';
    }
    free(buf);
    return 0;
}

void http_resp_free(struct http_resp *r)
{
    free(r->body);
    r->body = NULL;
}
