/* config.c - oversubd's settings: defaults, the admin token's file */
#define _POSIX_C_SOURCE 200809L
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

void osubd_config_default(struct osubd_config *c)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->listen_host, sizeof(c->listen_host), "127.0.0.1");
    c->listen_port = 7070;
    snprintf(c->socket_path, sizeof(c->socket_path), "var/oversub.sock");
    snprintf(c->state_path, sizeof(c->state_path), "var/oversub.db");
    snprintf(c->gpus, sizeof(c->gpus), "auto");
    snprintf(c->kube_api, sizeof(c->kube_api), "auto");
    const char *node = getenv("NODE_NAME"); /* the DaemonSet's, from the downward API */
    if (node != NULL && strlen(node) < sizeof(c->kube_node))
        snprintf(c->kube_node, sizeof(c->kube_node), "%s", node);
    c->ratio_milli = 1300;
    c->tick_ms = 1000;
    c->snapshot_every = 1000;
    c->events_keep = 100000;
    c->poll_ms = 1000;
    c->service_log_max = 10 * 1024 * 1024;
    c->shutdown_grace_ms = 30000;
    c->api_conns_per_client = 64;
    c->api_conns_max = 1024;
    osub_pool_config_default(&c->engine);
    c->suspend_host_auto = true;
}

int64_t osubd_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int osubd_read_token(const char *path, char *out, size_t outlen, char *err, size_t errlen)
{
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & 0077) != 0) {
        snprintf(err, errlen,
                 "%s: the token file must be a regular file that only its owner can read or "
                 "write (chmod 600 %s)",
                 path, path);
        fclose(f);
        return -1;
    }
    char buf[4096];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f); /* more than a token holds: refused below */
    fclose(f);
    buf[n] = '\0';
    char *s = buf;
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
        s++;
    size_t l = strlen(s);
    while (l > 0 && (s[l - 1] == ' ' || s[l - 1] == '\t' || s[l - 1] == '\n' || s[l - 1] == '\r'))
        s[--l] = '\0';
    if (l == 0 || l >= outlen) {
        snprintf(err, errlen, "%s: the token must be 1 to %zu characters", path, outlen - 1);
        return -1;
    }
    memcpy(out, s, l + 1);
    return 0;
}
