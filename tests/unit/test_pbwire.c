/* test_pbwire.c - the device plugin's protobuf wire format (src/daemon/pbwire.c): varints and
 * their lengths, fields written and read back, nested messages and map entries, the writer's
 * cap, and every kind of bad message the reader must refuse without reading past its end */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pbwire.h"

/* The message in a heap block of exactly its size, so that ASan sees a read past the end. */
static uint8_t *exact(const void *data, size_t n)
{
    uint8_t *p = malloc(n ? n : 1);
    assert_non_null(p);
    if (n)
        memcpy(p, data, n);
    return p;
}

static struct osubd_pb_reader reader(const uint8_t *p, size_t n)
{
    return (struct osubd_pb_reader){.p = p, .end = p + n};
}

/* Walks a message to its end: the number of fields, or -1 when it is refused. */
static int walk(const void *data, size_t n)
{
    uint8_t *p = exact(data, n);
    struct osubd_pb_reader r = reader(p, n);
    struct osubd_pb_field f;
    int count = 0, rc;
    while ((rc = osubd_pb_next(&r, &f)) == 1) {
        assert_true(r.p <= p + n);
        if (f.wire == 2)
            assert_true(f.data >= p && f.data + f.len <= p + n);
        count++;
    }
    free(p);
    return rc == 0 ? count : -1;
}

static void test_varint_encodings(void **state)
{
    (void)state;
    static const struct {
        uint64_t v;
        size_t n;
        uint8_t bytes[10];
    } cases[] = {
        {0, 1, {0x00}},
        {1, 1, {0x01}},
        {127, 1, {0x7f}},
        {128, 2, {0x80, 0x01}},
        {150, 2, {0x96, 0x01}}, /* protobuf's own example */
        {300, 2, {0xac, 0x02}},
        {16383, 2, {0xff, 0x7f}},
        {16384, 3, {0x80, 0x80, 0x01}},
        {UINT32_MAX, 5, {0xff, 0xff, 0xff, 0xff, 0x0f}},
        {(uint64_t)1 << 63, 10, {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}},
        {UINT64_MAX, 10, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct osubd_pb b;
        osubd_pb_init(&b, 64);
        osubd_pb_varint(&b, cases[i].v);
        assert_false(b.failed);
        assert_int_equal(b.len, cases[i].n);
        assert_memory_equal(b.p, cases[i].bytes, cases[i].n);
        assert_int_equal(osubd_pb_varint_len(cases[i].v), cases[i].n);
        /* as a field's value: key (field 1, varint) then the value, read back */
        struct osubd_pb m;
        osubd_pb_init(&m, 64);
        osubd_pb_varint(&m, 1 << 3);
        osubd_pb_varint(&m, cases[i].v);
        uint8_t *p = exact(m.p, m.len);
        struct osubd_pb_reader r = reader(p, m.len);
        struct osubd_pb_field f;
        assert_int_equal(osubd_pb_next(&r, &f), 1);
        assert_int_equal(f.num, 1);
        assert_int_equal(f.wire, 0);
        assert_true(f.varint == cases[i].v);
        assert_null(f.data);
        assert_int_equal(osubd_pb_next(&r, &f), 0);
        free(p);
        osubd_pb_free(&m);
        osubd_pb_free(&b);
    }
}

static void test_varint_len_boundaries(void **state)
{
    (void)state;
    for (unsigned bits = 1; bits < 64; bits++) {
        uint64_t v = (uint64_t)1 << bits;
        /* 7 bits a byte: 2^bits needs bits+1 of them */
        assert_int_equal(osubd_pb_varint_len(v), bits / 7 + 1);
        assert_int_equal(osubd_pb_varint_len(v - 1), (bits - 1) / 7 + 1);
        struct osubd_pb b;
        osubd_pb_init(&b, 16);
        osubd_pb_varint(&b, v);
        assert_int_equal(b.len, osubd_pb_varint_len(v));
        osubd_pb_free(&b);
    }
}

static void test_fields_round_trip(void **state)
{
    (void)state;
    struct osubd_pb b;
    osubd_pb_init(&b, 4096);
    osubd_pb_string(&b, 1, "nvidia.com/gpu");
    osubd_pb_bool(&b, 2, true);
    osubd_pb_bool(&b, 3, false); /* proto3's default: not written */
    osubd_pb_bytes(&b, 4, "\x00\x01\x02", 3);
    osubd_pb_string(&b, 5, "");
    osubd_pb_bytes(&b, 0x1fffffff, "max", 3); /* the largest field number */
    osubd_pb_varint(&b, 6 << 3 | 5);          /* fixed32, little-endian */
    osubd_pb_raw(&b, "\x78\x56\x34\x12", 4);
    osubd_pb_varint(&b, 7 << 3 | 1); /* fixed64 */
    osubd_pb_raw(&b, "\x08\x07\x06\x05\x04\x03\x02\x01", 8);
    assert_false(b.failed);

    uint8_t *p = exact(b.p, b.len);
    struct osubd_pb_reader r = reader(p, b.len);
    struct osubd_pb_field f;
    assert_int_equal(osubd_pb_next(&r, &f), 1);
    assert_int_equal(f.num, 1);
    assert_int_equal(f.wire, 2);
    assert_int_equal(f.len, 14);
    assert_memory_equal(f.data, "nvidia.com/gpu", 14);
    assert_true(f.data >= p && f.data + f.len <= p + b.len); /* borrowed from the message */
    assert_int_equal(osubd_pb_next(&r, &f), 1);
    assert_int_equal(f.num, 2);
    assert_int_equal(f.wire, 0);
    assert_int_equal(f.varint, 1);
    assert_int_equal(osubd_pb_next(&r, &f), 1);
    assert_int_equal(f.num, 4);
    assert_int_equal(f.len, 3);
    assert_memory_equal(f.data, "\x00\x01\x02", 3);
    assert_int_equal(osubd_pb_next(&r, &f), 1);
    assert_int_equal(f.num, 5);
    assert_int_equal(f.wire, 2);
    assert_int_equal(f.len, 0);
    assert_int_equal(osubd_pb_next(&r, &f), 1);
    assert_int_equal(f.num, 0x1fffffff);
    assert_int_equal(f.len, 3);
    assert_int_equal(osubd_pb_next(&r, &f), 1);
    assert_int_equal(f.num, 6);
    assert_int_equal(f.wire, 5);
    assert_int_equal(f.varint, 0x12345678);
    assert_int_equal(osubd_pb_next(&r, &f), 1);
    assert_int_equal(f.num, 7);
    assert_int_equal(f.wire, 1);
    assert_true(f.varint == 0x0102030405060708ULL);
    assert_int_equal(osubd_pb_next(&r, &f), 0);
    assert_ptr_equal(r.p, p + b.len);
    assert_int_equal(osubd_pb_next(&r, &f), 0); /* the end stays the end */
    free(p);
    osubd_pb_free(&b);
}

/* A map entry's declared length is what its key and value take: read as a nested message. */
static void test_nested_and_map_entries(void **state)
{
    (void)state;
    static const char *const kv[][2] = {
        {"a", "b"},
        {"", ""},
        {"OVERSUB_SEGMENT", "/run/oversub/shim/pods/x"},
        {NULL, NULL}, /* a 200-byte value: a two-byte length */
    };
    char big[201];
    memset(big, 'v', 200);
    big[200] = '\0';
    struct osubd_pb inner;
    osubd_pb_init(&inner, 4096);
    for (size_t i = 0; i < 4; i++)
        osubd_pb_map_entry(&inner, 3, kv[i][0] ? kv[i][0] : "k", kv[i][1] ? kv[i][1] : big);
    assert_false(inner.failed);
    struct osubd_pb outer;
    osubd_pb_init(&outer, 4096);
    osubd_pb_string(&outer, 1, "before");
    osubd_pb_bytes(&outer, 2, inner.p, inner.len);
    osubd_pb_string(&outer, 4, "after");
    assert_false(outer.failed);

    uint8_t *p = exact(outer.p, outer.len);
    struct osubd_pb_reader r = reader(p, outer.len);
    struct osubd_pb_field f;
    assert_int_equal(osubd_pb_next(&r, &f), 1);
    assert_int_equal(f.num, 1);
    assert_int_equal(osubd_pb_next(&r, &f), 1);
    assert_int_equal(f.num, 2);
    assert_int_equal(f.len, inner.len);
    struct osubd_pb_reader ir = reader(f.data, f.len);
    struct osubd_pb_field e;
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(osubd_pb_next(&ir, &e), 1);
        assert_int_equal(e.num, 3);
        assert_int_equal(e.wire, 2);
        struct osubd_pb_reader er = reader(e.data, e.len);
        struct osubd_pb_field k, v;
        assert_int_equal(osubd_pb_next(&er, &k), 1);
        assert_int_equal(osubd_pb_next(&er, &v), 1);
        assert_int_equal(osubd_pb_next(&er, &v), 0); /* nothing past the value */
        const char *want_k = kv[i][0] ? kv[i][0] : "k", *want_v = kv[i][1] ? kv[i][1] : big;
        assert_int_equal(k.num, 1);
        assert_int_equal(k.len, strlen(want_k));
        assert_memory_equal(k.data, want_k, k.len);
        assert_int_equal(v.num, 2);
        assert_int_equal(v.len, strlen(want_v));
        assert_memory_equal(v.data, want_v, v.len);
    }
    assert_int_equal(osubd_pb_next(&ir, &e), 0);
    assert_int_equal(osubd_pb_next(&r, &f), 1);
    assert_int_equal(f.num, 4);
    assert_memory_equal(f.data, "after", 5);
    assert_int_equal(osubd_pb_next(&r, &f), 0);
    free(p);
    osubd_pb_free(&outer);
    osubd_pb_free(&inner);
}

/* What the header says the reader refuses, each in a block of its exact size. */
static void test_bad_messages_refused(void **state)
{
    (void)state;
    static const struct {
        const char *what;
        size_t n;
        uint8_t bytes[16];
    } bad[] = {
        {"a key cut short", 1, {0x80}},
        {"a varint value cut short", 3, {0x08, 0xff, 0xff}},
        {"a key of 11 bytes",
         11,
         {0x88, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00}},
        {"a value of 11 bytes",
         12,
         {0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
        {"a value of 10 bytes still continued",
         11,
         {0x08, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80}},
        {"field number 0, varint", 2, {0x00, 0x01}},
        {"field number 0, bytes", 2, {0x02, 0x00}},
        {"field number 2^29", 6, {0x80, 0x80, 0x80, 0x80, 0x10, 0x00}},
        {"field number 2^32 + 1 (not truncated to 1)",
         7,
         {0x88, 0x80, 0x80, 0x80, 0x80, 0x01, 0x00}},
        {"a group's start", 1, {0x0b}},
        {"a group's end", 1, {0x0c}},
        {"wire type 6", 2, {0x0e, 0x00}},
        {"wire type 7", 2, {0x0f, 0x00}},
        {"a length past the end", 4, {0x0a, 0x05, 'a', 'b'}},
        {"a length of 2^64-1",
         11,
         {0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
        {"a length cut short", 2, {0x0a, 0x80}},
        {"a fixed32 cut short", 4, {0x0d, 0x01, 0x02, 0x03}},
        {"a fixed64 cut short", 8, {0x09, 1, 2, 3, 4, 5, 6, 7}},
        {"a good field, then a bad one", 4, {0x08, 0x01, 0x0a, 0x01}},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (walk(bad[i].bytes, bad[i].n) != -1)
            fail_msg("%s: accepted", bad[i].what);
    /* and their neighbours that are fine */
    assert_int_equal(walk("", 0), 0);
    assert_int_equal(walk("\x0a\x00", 2), 1);
    assert_int_equal(walk("\x0d\x01\x02\x03\x04", 5), 1);
    assert_int_equal(walk("\x09\x01\x02\x03\x04\x05\x06\x07\x08", 9), 1);
    assert_int_equal(walk("\xf8\xff\xff\xff\x0f\x00", 6), 1); /* field 2^29-1 */
    /* a ten-byte value ending the varint is read (its bits past 64 dropped, as protobuf does) */
    assert_int_equal(walk("\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11), 1);
}

/* Every prefix of a good message is either a shorter good message or refused, never a read
 * past its end (ASan watches the exact-size copies). */
static void test_every_prefix(void **state)
{
    (void)state;
    struct osubd_pb b;
    osubd_pb_init(&b, 4096);
    osubd_pb_string(&b, 1, "Allocate");
    osubd_pb_varint(&b, 2 << 3);
    osubd_pb_varint(&b, UINT64_MAX);
    osubd_pb_map_entry(&b, 3, "key", "value");
    osubd_pb_varint(&b, 4 << 3 | 1);
    osubd_pb_raw(&b, "12345678", 8);
    osubd_pb_varint(&b, 5 << 3 | 5);
    osubd_pb_raw(&b, "1234", 4);
    osubd_pb_bool(&b, 6, true);
    assert_false(b.failed);
    assert_int_equal(walk(b.p, b.len), 6);
    /* the field boundaries, where a prefix is still a whole message */
    size_t ends[7] = {0};
    {
        struct osubd_pb_reader r = reader(b.p, b.len);
        struct osubd_pb_field f;
        for (int k = 1; k <= 6; k++) {
            assert_int_equal(osubd_pb_next(&r, &f), 1);
            ends[k] = (size_t)(r.p - b.p);
        }
    }
    int boundary = 0;
    for (size_t n = 0; n <= b.len; n++) {
        int got = walk(b.p, n);
        if (ends[boundary] == n) {
            assert_int_equal(got, boundary);
            boundary++;
        } else {
            assert_int_equal(got, -1);
        }
    }
    assert_int_equal(boundary, 7);
    osubd_pb_free(&b);
}

static void test_writer_cap(void **state)
{
    (void)state;
    /* exactly the cap fits */
    struct osubd_pb b;
    osubd_pb_init(&b, 10);
    osubd_pb_raw(&b, "0123456789", 10);
    assert_false(b.failed);
    assert_int_equal(b.len, 10);
    assert_true(b.cap >= b.len);
    /* one byte more fails, and then every write is ignored */
    osubd_pb_raw(&b, "x", 1);
    assert_true(b.failed);
    assert_int_equal(b.len, 10);
    osubd_pb_varint(&b, 1);
    osubd_pb_string(&b, 1, "");
    assert_int_equal(b.len, 10);
    assert_memory_equal(b.p, "0123456789", 10);
    /* free leaves it empty, keeping the cap, and it can be used again */
    osubd_pb_free(&b);
    assert_null(b.p);
    assert_int_equal(b.len, 0);
    assert_int_equal(b.cap, 0);
    assert_int_equal(b.max, 10);
    assert_false(b.failed);
    osubd_pb_string(&b, 1, "12345678"); /* key, length, 8 bytes: 10 */
    assert_false(b.failed);
    assert_int_equal(b.len, 10);
    osubd_pb_free(&b);
    osubd_pb_free(NULL);

    /* a field that does not fit is not half written: the failure is sticky and len <= max */
    osubd_pb_init(&b, 5);
    osubd_pb_string(&b, 1, "abcdef");
    assert_true(b.failed);
    assert_true(b.len <= 5);
    osubd_pb_free(&b);

    /* a cap of 0 takes nothing; an empty write never fails */
    osubd_pb_init(&b, 0);
    osubd_pb_raw(&b, "", 0);
    assert_false(b.failed);
    osubd_pb_bool(&b, 1, false);
    assert_false(b.failed);
    osubd_pb_varint(&b, 0);
    assert_true(b.failed);
    assert_int_equal(b.len, 0);
    osubd_pb_free(&b);

    /* growth past the first block, up to a large cap, keeps every byte */
    osubd_pb_init(&b, 1 << 20);
    size_t want = 0;
    for (uint32_t i = 0; i < 20000; i++) {
        osubd_pb_varint(&b, 1 << 3); /* field 1, a varint */
        osubd_pb_varint(&b, (uint64_t)i * 7919);
        want += 1 + osubd_pb_varint_len((uint64_t)i * 7919);
    }
    assert_false(b.failed);
    assert_int_equal(b.len, want);
    struct osubd_pb_reader r = reader(b.p, b.len);
    struct osubd_pb_field f;
    for (uint32_t i = 0; i < 20000; i++) {
        assert_int_equal(osubd_pb_next(&r, &f), 1);
        assert_true(f.varint == (uint64_t)i * 7919);
    }
    assert_int_equal(osubd_pb_next(&r, &f), 0);
    osubd_pb_free(&b);

    /* a length-delimited field larger than the cap fails before copying anything */
    osubd_pb_init(&b, 64);
    static const char huge[100] = {0};
    osubd_pb_bytes(&b, 1, huge, sizeof(huge));
    assert_true(b.failed);
    assert_true(b.len <= 64);
    osubd_pb_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_varint_encodings),     cmocka_unit_test(test_varint_len_boundaries),
        cmocka_unit_test(test_fields_round_trip),    cmocka_unit_test(test_nested_and_map_entries),
        cmocka_unit_test(test_bad_messages_refused), cmocka_unit_test(test_every_prefix),
        cmocka_unit_test(test_writer_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
