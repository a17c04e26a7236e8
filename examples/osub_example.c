/* osub_example.c - the example services' shared helpers (see osub_example.h) */
#define _POSIX_C_SOURCE 200809L
#include "osub_example.h"

#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

void osx_env_read(struct osx_env *e)
{
    e->service = getenv("OVERSUB_SERVICE");
    e->control_url = getenv("OVERSUB_CONTROL_URL");
    e->token = getenv("OVERSUB_TOKEN");
    e->checkpoint_dir = getenv("OVERSUB_CHECKPOINT_DIR");
    e->resume_from = getenv("OVERSUB_RESUME_FROM");
    const char *v = getenv("OVERSUB_VRAM_MIB");
    e->vram_mib = v ? strtol(v, NULL, 10) : 0;
    v = getenv("OVERSUB_BATCH_SIZE");
    e->batch_size = v ? strtol(v, NULL, 10) : 0;
}

void osx_log(const char *fmt, ...)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "%02d:%02d:%02d.%03ld [%d] %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
            ts.tv_nsec / 1000000, (int)getpid(), line);
    fflush(stderr);
}

int osx_http(const char *url, const char *method, const char *path, const char *token,
             const char *body, int timeout_s, char *out, size_t outlen)
{
    if (out != NULL && outlen > 0)
        out[0] = '\0';
    if (url == NULL || strncmp(url, "http://", 7) != 0) {
        errno = EINVAL;
        return -1;
    }
    char host[256], port[16] = "80";
    const char *h = url + 7;
    const char *colon = strchr(h, ':');
    const char *end = h + strcspn(h, "/");
    if (colon != NULL && colon < end) {
        snprintf(host, sizeof(host), "%.*s", (int)(colon - h), h);
        snprintf(port, sizeof(port), "%.*s", (int)(end - colon - 1), colon + 1);
    } else {
        snprintf(host, sizeof(host), "%.*s", (int)(end - h), h);
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
    if (getaddrinfo(host, port, &hints, &ai) != 0) {
        errno = EHOSTUNREACH;
        return -1;
    }
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    struct timeval tv = {timeout_s, 0};
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    }
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        errno = e;
        return -1;
    }
    freeaddrinfo(ai);
    size_t blen = body ? strlen(body) : 0;
    char head[1024];
    int hl = snprintf(head, sizeof(head),
                      "%s %s HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\n"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n%s%s%s\r\n",
                      method, path, host, port, blen, token ? "Authorization: Bearer " : "",
                      token ? token : "", token ? "\r\n" : "");
    if (write(fd, head, (size_t)hl) != hl || (blen && write(fd, body, blen) != (ssize_t)blen)) {
        close(fd);
        return -1;
    }
    static char buf[1 << 16];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof(buf) - 1 && (r = read(fd, buf + n, sizeof(buf) - 1 - n)) > 0)
        n += (size_t)r;
    close(fd);
    buf[n] = '\0';
    int status = 0;
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1) {
        errno = EPROTO;
        return -1;
    }
    char *b = strstr(buf, "\r\n\r\n");
    if (b != NULL && out != NULL && outlen > 0)
        snprintf(out, outlen, "%s", b + 4);
    return status;
}

int osx_write_atomic(const char *path, const char *text)
{
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL)
        return -1;
    int ok = fputs(text, f) >= 0;
    ok = fflush(f) == 0 && ok;
    ok = fsync(fileno(f)) == 0 && ok;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}
