/* netpolicy.c - the destinations a client may point oversubd at (webhooks, gateway backends),
 * and the webhooks' signature (docs/security.md). */
#include "netpolicy.h"

#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/http.h>

#include "sha256.h"

#define MAX_RULES 64

struct rule {
    int family; /* AF_INET, AF_INET6, or 0 for a host name */
    uint8_t addr[16];
    int bits;
    char name[256];
};

struct osubd_destinations {
    struct rule r[MAX_RULES];
    int n;
};

static int parse_one(const char *item, struct rule *r, char *err, size_t errlen)
{
    char buf[300];
    snprintf(buf, sizeof(buf), "%s", item);
    char *slash = strchr(buf, '/');
    int bits = -1;
    if (slash != NULL) {
        char *end;
        long b = strtol(slash + 1, &end, 10);
        if (*end != '\0' || slash[1] == '\0' || b < 0 || b > 128) {
            snprintf(err, errlen, "'%.100s': the prefix length must be 0 to 128", item);
            return -1;
        }
        bits = (int)b;
        *slash = '\0';
    }
    memset(r, 0, sizeof(*r));
    if (inet_pton(AF_INET, buf, r->addr) == 1) {
        r->family = AF_INET;
        r->bits = bits < 0 ? 32 : bits;
        if (r->bits > 32) {
            snprintf(err, errlen, "'%.100s': an IPv4 prefix is at most 32 bits", item);
            return -1;
        }
        return 0;
    }
    if (inet_pton(AF_INET6, buf, r->addr) == 1) {
        r->family = AF_INET6;
        r->bits = bits < 0 ? 128 : bits;
        return 0;
    }
    if (bits >= 0 || buf[0] == '\0' || strlen(buf) > 253 ||
        strspn(buf, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-") !=
            strlen(buf)) {
        snprintf(err, errlen, "'%.100s' is neither an address, a CIDR (10.0.0.0/8) nor a host name",
                 item);
        return -1;
    }
    r->family = 0;
    snprintf(r->name, sizeof(r->name), "%.253s", buf);
    return 0;
}

int osubd_parse_destinations(const char *text, struct osubd_destinations **out, char *err,
                             size_t errlen)
{
    if (text == NULL || text[0] == '\0')
        text = OSUBD_DESTINATIONS_DEFAULT;
    struct osubd_destinations *d = calloc(1, sizeof(*d));
    if (d == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    const char *p = text;
    while (*p) {
        while (*p == ' ' || *p == ',')
            p++;
        if (!*p)
            break;
        size_t l = strcspn(p, ", ");
        char item[300];
        if (l >= sizeof(item)) { /* never cut: a cut CIDR could widen to everything */
            snprintf(err, errlen, "'%.40s...' is longer than %zu characters", p, sizeof(item) - 1);
            free(d);
            return -1;
        }
        snprintf(item, sizeof(item), "%.*s", (int)l, p);
        if (d->n == MAX_RULES) {
            snprintf(err, errlen, "at most %d destinations", MAX_RULES);
            free(d);
            return -1;
        }
        if (parse_one(item, &d->r[d->n], err, errlen) != 0) {
            free(d);
            return -1;
        }
        d->n++;
        p += l;
    }
    if (out != NULL)
        *out = d;
    else
        free(d);
    return 0;
}

void osubd_destinations_free(struct osubd_destinations *d)
{
    free(d);
}

static bool prefix_match(const uint8_t *a, const uint8_t *b, int bits)
{
    int full = bits / 8, rest = bits % 8;
    if (memcmp(a, b, (size_t)full) != 0)
        return false;
    if (rest == 0)
        return true;
    uint8_t mask = (uint8_t)(0xff << (8 - rest));
    return (a[full] & mask) == (b[full] & mask);
}

bool osubd_url_allowed(const struct osubd_destinations *d, const char *url, char *why,
                       size_t whylen)
{
    struct evhttp_uri *u = evhttp_uri_parse_with_flags(url, 0);
    const char *host = u ? evhttp_uri_get_host(u) : NULL;
    if (u == NULL || host == NULL || host[0] == '\0' || evhttp_uri_get_userinfo(u) != NULL) {
        snprintf(why, whylen, "'%.200s' is not http://HOST[:PORT]/PATH (no user info)", url);
        if (u)
            evhttp_uri_free(u);
        return false;
    }
    char h[300];
    snprintf(h, sizeof(h), "%s", host);
    size_t hl = strlen(h);
    if (h[0] == '[' && hl > 1 && h[hl - 1] == ']') {
        memmove(h, h + 1, hl - 2);
        h[hl - 2] = '\0';
    }
    evhttp_uri_free(u);
    uint8_t a[16] = {0};
    int fam = inet_pton(AF_INET, h, a) == 1    ? AF_INET
              : inet_pton(AF_INET6, h, a) == 1 ? AF_INET6
                                               : 0;
    if (fam == AF_INET6 && memcmp(a, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12) == 0) {
        memmove(a, a + 12, 4); /* ::ffff:a.b.c.d is a.b.c.d */
        fam = AF_INET;
    }
    for (int i = 0; i < d->n; i++) {
        const struct rule *r = &d->r[i];
        if (fam == 0 && r->family == 0 && strcasecmp(r->name, h) == 0)
            return true;
        if (fam != 0 && r->family == fam && prefix_match(a, r->addr, r->bits))
            return true;
    }
    snprintf(why, whylen,
             "'%.200s' is not an allowed destination (allowed_destinations in oversubd's "
             "configuration: loopback unless set)",
             h);
    return false;
}

void osubd_sign(const char *key, long long unix_s, const char *body, size_t len, char *out,
                size_t outlen)
{
    char ts[32];
    int tl = snprintf(ts, sizeof(ts), "%lld.", unix_s);
    size_t ml = (size_t)tl + len;
    char *msg = malloc(ml + 1);
    uint8_t mac[32];
    if (msg == NULL) {
        snprintf(out, outlen, "t=%lld,v1=", unix_s);
        return;
    }
    memcpy(msg, ts, (size_t)tl);
    memcpy(msg + tl, body, len);
    osubd__hmac_sha256(key, strlen(key), msg, ml, mac);
    free(msg);
    int n = snprintf(out, outlen, "t=%lld,v1=", unix_s);
    for (int i = 0; i < 32 && n + 2 < (int)outlen; i++, n += 2)
        snprintf(out + n, outlen - (size_t)n, "%02x", mac[i]);
}
