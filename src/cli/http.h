/* http.h - a small blocking HTTP/1.1 client for the oversub CLI (TCP or a Unix socket) */
#ifndef OSUB_CLI_HTTP_H
#define OSUB_CLI_HTTP_H

#include <stddef.h>

struct http_target {
    char unix_path[256]; /* used when not empty */
    char host[256];
    int port;
    char token[256]; /* "" = none */
};

struct http_resp {
    int status; /* 0 when the daemon could not be reached */
    char *body; /* malloc'd, NUL-terminated */
    size_t len;
};

/* Picks the daemon: --url (or OVERSUB_URL), else ./var/oversub.sock when present, else
 * http://127.0.0.1:7070. Returns 0 or -1 with a sentence in err. */
int http_target_init(struct http_target *t, const char *url, char *err, size_t errlen);

/* Sends one request (body may be NULL) and reads the whole response. Returns 0 (resp filled),
 * or -1 with a sentence in err when the daemon cannot be reached or answers garbage. */
int http_request(const struct http_target *t, const char *method, const char *path,
                 const char *body, struct http_resp *resp, char *err, size_t errlen);
void http_resp_free(struct http_resp *r);

#endif
