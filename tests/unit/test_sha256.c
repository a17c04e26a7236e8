/* test_sha256.c - SHA-256 and HMAC-SHA256 (src/daemon/sha256.c): the seven test cases of
 * RFC 4231, messages at every padding boundary of a block, keys around the block size, and the
 * output not depending on where the input lies in memory (Python's hashlib for the figures) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sha256.h"

static void hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static void test_rfc4231(void **state)
{
    (void)state;
    uint8_t k0b[20], kaa20[20], k0c[20], kaa131[131], k25[25], dd[50], cd[50];
    memset(k0b, 0x0b, sizeof(k0b));
    memset(kaa20, 0xaa, sizeof(kaa20));
    memset(k0c, 0x0c, sizeof(k0c));
    memset(kaa131, 0xaa, sizeof(kaa131));
    for (int i = 0; i < 25; i++)
        k25[i] = (uint8_t)(i + 1);
    memset(dd, 0xdd, sizeof(dd));
    memset(cd, 0xcd, sizeof(cd));
    static const char big_data[] =
        "This is a test using a larger than block-size key and a larger than block-size data. "
        "The key needs to be hashed before being used by the HMAC algorithm.";
    const struct {
        const void *key;
        size_t key_len;
        const void *msg;
        size_t msg_len;
        const char *mac; /* case 5 is truncated to 128 bits */
    } c[] = {
        {k0b, 20, "Hi There", 8,
         "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
        {"Jefe", 4, "what do ya want for nothing?", 28,
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
        {kaa20, 20, dd, 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
        {k25, 25, cd, 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
        {k0c, 20, "Test With Truncation", 20, "a3b6167473100ee06e0c796c2955552b"},
        {kaa131, 131, "Test Using Larger Than Block-Size Key - Hash Key First", 54,
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
        {kaa131, 131, big_data, sizeof(big_data) - 1,
         "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        uint8_t mac[32];
        char h[65];
        osubd__hmac_sha256(c[i].key, c[i].key_len, c[i].msg, c[i].msg_len, mac);
        hex(mac, 32, h);
        if (strncmp(h, c[i].mac, strlen(c[i].mac)) != 0)
            fail_msg("RFC 4231 case %zu: %s, wanted %s", i + 1, h, c[i].mac);
    }
}

/* 0x03, 0x0a, 0x11, ...: byte i is i*7+3 */
static uint8_t *pattern(size_t n, unsigned mul, unsigned add)
{
    uint8_t *p = malloc(n ? n : 1);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * mul + add);
    return p;
}

static void test_padding_boundaries(void **state)
{
    (void)state;
    /* 55/56: the length still fits the last block or not; 63/64/65: a whole block */
    static const struct {
        size_t n;
        const char *digest;
    } c[] = {
        {1, "084fed08b978af4d7d196a7446a86b58009e636b611db16211b65a9aadff29c5"},
        {55, "e7313d333c272e639f790978283f9eb392e843d0f29b7016828bb1daa4aac70b"},
        {56, "4324d65f3c103567f5589c710bc08f8523f929a9272e3af36fc968e52abc6c27"},
        {57, "35df609437dcfea3279283ab79fd554e2bf78f8f7ae2de532d8ee300b09e8f73"},
        {63, "81c80242132f230c3bd41b3e63bbcff16107339549214a99614ff26664625055"},
        {64, "39e3d7b6b5d075d37d053ad89b24b41bef4f3c29760c84447cab3f3be1882241"},
        {65, "aacca6ff74fdbb296d165a45cecfa04e5127bc008770fbbdd48006f2d2fae95e"},
        {111, "67d9492e628fd376e0b2efec8ca2b99b123e202cf620deb270728df979b2f73e"},
        {112, "96b928cff8528dbb99602c709a65b846cb6467acb8b722f0d758e4dc27bfc508"},
        {119, "9ce7368e4daf32341631b492e80359dc9f594b48453cd0dd5bf0b19279cc177e"},
        {120, "7836b787757e95e58b3ca5aec90b1b004e8deba1e50e9675af9cabf1a13a04b5"},
        {127, "a8d23e75d936f303d248888d9b165ee543f4cbafcad3c9dd2a79bd84faa11d07"},
        {128, "d2742f1f4ac6bb7ca2b239ee18402ba8b3f9f8e652d2a72973c2b9ba11c08cf6"},
        {129, "307f8fc2c1622b92762e818d39a185d4d667ad49a4b07ceae1f4afa008a93ec4"},
        {1000, "1e9bc38cbf860b9ec31918b065f9b52476c549a782e0e7990bed8ce3868d2371"},
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        uint8_t *m = pattern(c[i].n, 7, 3);
        uint8_t d[32];
        char h[65];
        osubd__sha256(m, c[i].n, d);
        hex(d, 32, h);
        if (strcmp(h, c[i].digest) != 0)
            fail_msg("%zu bytes: %s, wanted %s", c[i].n, h, c[i].digest);
        /* the same bytes at another alignment: the same digest */
        uint8_t *shifted = malloc(c[i].n + 3);
        assert_non_null(shifted);
        memcpy(shifted + 3, m, c[i].n);
        uint8_t d2[32];
        osubd__sha256(shifted + 3, c[i].n, d2);
        assert_memory_equal(d, d2, 32);
        free(shifted);
        free(m);
    }
}

static void test_hmac_key_sizes(void **state)
{
    (void)state;
    /* keys shorter than, equal to and longer than the 64-byte block (hashed first) */
    static const struct {
        size_t key_len;
        const char *mac;
    } c[] = {
        {0, "9b6048cbdcc6cfefb912a7010360f1f4bdc9df9d4498273bdecb20504072fcf6"},
        {1, "10d60a5ab9c7fcd8c67947b211feb4808171bd0d23c4ba13871d8a6b68e4e717"},
        {32, "84931a02467fe9a3b45ceee22466a6418ba49027e5b25bb1e094b70cb214519f"},
        {63, "5dc481fcec8a56f04484926554d17481b36069c45a9abc26308f88d160eb0e2c"},
        {64, "90a284ea6e9db4cd3f930b125cfb1ad69f5c8b5e1c548c4d87016638362acce2"},
        {65, "a6fc91ab7e16415d250e5eee64afdaf08ebfecdf1191b455f99aa69efc0c6838"},
        {200, "68e76b64b0888a1bc76f3e9c38b66ede1deeffd1371ad6c2cccb431f4e4128fd"},
    };
    const char *msg = "message of the test";
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        uint8_t *k = pattern(c[i].key_len, 13, 1);
        uint8_t mac[32];
        char h[65];
        osubd__hmac_sha256(k, c[i].key_len, msg, strlen(msg), mac);
        hex(mac, 32, h);
        if (strcmp(h, c[i].mac) != 0)
            fail_msg("a key of %zu bytes: %s, wanted %s", c[i].key_len, h, c[i].mac);
        free(k);
    }
    /* a key longer than a block is its hash: HMAC(k) == HMAC(sha256(k)) */
    uint8_t *k = pattern(200, 13, 1);
    uint8_t kh[32], a[32], b[32];
    osubd__sha256(k, 200, kh);
    osubd__hmac_sha256(k, 200, msg, strlen(msg), a);
    osubd__hmac_sha256(kh, 32, msg, strlen(msg), b);
    assert_memory_equal(a, b, 32);
    free(k);
    /* one bit of the message or the key changes the MAC */
    uint8_t x[32];
    osubd__hmac_sha256("key", 3, "message of the tesu", 19, x);
    osubd__hmac_sha256("key", 3, msg, strlen(msg), a);
    assert_memory_not_equal(a, x, 32);
    osubd__hmac_sha256("kez", 3, msg, strlen(msg), x);
    assert_memory_not_equal(a, x, 32);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rfc4231),
        cmocka_unit_test(test_padding_boundaries),
        cmocka_unit_test(test_hmac_key_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
