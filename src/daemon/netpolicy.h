/* netpolicy.h - where oversubd may connect on a client's word (webhooks, gateway backends),
 * and how it signs what it sends there. */
#ifndef OSUBD_NETPOLICY_H
#define OSUBD_NETPOLICY_H

#include <stdbool.h>
#include <stddef.h>

#define OSUBD_DESTINATIONS_DEFAULT "127.0.0.0/8,::1/128,localhost"

struct osubd_destinations;

/* Parses "CIDR,CIDR,name,..." ("" = the default: loopback). out may be NULL (check only);
 * else *out is allocated (free with osubd_destinations_free). 0, or -1 with err. */
int osubd_parse_destinations(const char *text, struct osubd_destinations **out, char *err,
                             size_t errlen);
void osubd_destinations_free(struct osubd_destinations *d);

/* Is http://HOST[:PORT]/... a destination the list allows? Host names are allowed only when
 * listed by name (they are not resolved here: a name resolves differently later); IP literals
 * by the CIDRs. false with why. */
bool osubd_url_allowed(const struct osubd_destinations *d, const char *url, char *why,
                       size_t whylen);

/* The signature headers' value for a body sent at unix_s with key: "t=UNIX,v1=HEX" where HEX is
 * HMAC-SHA256(key, "UNIX." + body). out holds at least 100 bytes. */
void osubd_sign(const char *key, long long unix_s, const char *body, size_t len, char *out,
                size_t outlen);

#endif
