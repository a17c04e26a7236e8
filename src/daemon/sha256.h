/* sha256.h - SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for per-service tokens */
#ifndef OSUB_DAEMON_SHA256_H
#define OSUB_DAEMON_SHA256_H

#include <stddef.h>
#include <stdint.h>

void osubd__sha256(const void *data, size_t len, uint8_t out[32]);
void osubd__hmac_sha256(const void *key, size_t key_len, const void *msg, size_t msg_len,
                        uint8_t out[32]);

#endif
