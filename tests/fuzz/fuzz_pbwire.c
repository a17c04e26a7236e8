/* fuzz_pbwire.c - libFuzzer target: the device plugin's protobuf wire format (src/daemon/pbwire.c).
 * The input, read as a message (what the kubelet sends), must be walked without a read past its
 * end, every field inside it; the fields read, written again, must read back the same, and the
 * rewrite must be canonical (no longer than the input, and a fixed point). The input, read as a
 * script of writes under a cap, must read back as written, or fail without passing the cap. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pbwire.h"

#define MAX_FIELDS 4096
#define MAX_DEPTH 4

struct field {
    uint32_t num, wire;
    uint64_t v;
    const uint8_t *data;
    size_t len;
};

static void check(bool ok)
{
    if (!ok)
        abort();
}

/* Reads a whole message into fs (at most MAX_FIELDS). Returns the count, or -1 when refused.
 * Length-delimited fields are walked as nested messages too (a refusal there is fine: not
 * every string is a message), down to MAX_DEPTH. */
static int read_all(const uint8_t *p, size_t n, struct field *fs, int depth)
{
    struct osubd_pb_reader r = {.p = p, .end = p + n};
    struct osubd_pb_field f;
    const uint8_t *last = r.p;
    int count = 0, rc;
    while ((rc = osubd_pb_next(&r, &f)) == 1) {
        check(r.p > last && r.p <= p + n); /* progress, and inside the message */
        last = r.p;
        check(f.num >= 1 && f.num <= 0x1fffffff);
        check(f.wire == 0 || f.wire == 1 || f.wire == 2 || f.wire == 5);
        if (f.wire == 2) {
            check(f.data >= p && f.len <= (size_t)(p + n - f.data));
            check(f.data + f.len == r.p); /* the bytes end where the next field starts */
            if (depth < MAX_DEPTH)
                (void)read_all(f.data, f.len, NULL, depth + 1);
        } else {
            check(f.data == NULL && f.len == 0);
            if (f.wire == 5)
                check(f.varint <= UINT32_MAX);
        }
        if (fs != NULL && count < MAX_FIELDS)
            fs[count] = (struct field){f.num, f.wire, f.varint, f.data, f.len};
        count++;
    }
    check(rc == 0 || rc == -1);
    check(r.p <= p + n);
    return rc == 0 ? count : -1;
}

static void write_field(struct osubd_pb *b, const struct field *f)
{
    switch (f->wire) {
    case 0:
        osubd_pb_varint(b, (uint64_t)f->num << 3);
        osubd_pb_varint(b, f->v);
        break;
    case 2:
        osubd_pb_bytes(b, f->num, f->data, f->len);
        break;
    default: {
        uint8_t le[8];
        size_t k = f->wire == 1 ? 8 : 4;
        for (size_t i = 0; i < k; i++)
            le[i] = (uint8_t)(f->v >> (8 * i));
        osubd_pb_varint(b, (uint64_t)f->num << 3 | f->wire);
        osubd_pb_raw(b, le, k);
    }
    }
}

static bool same(const struct field *a, const struct field *b)
{
    return a->num == b->num && a->wire == b->wire && a->v == b->v && a->len == b->len &&
           (a->len == 0 || memcmp(a->data, b->data, a->len) == 0);
}

static void as_message(const uint8_t *data, size_t size)
{
    /* an exact-size copy: the fuzzer's own buffer may have slack after it */
    uint8_t *p = malloc(size ? size : 1);
    if (p == NULL)
        return;
    memcpy(p, data, size);
    static struct field in[MAX_FIELDS], out[MAX_FIELDS], again[MAX_FIELDS];
    int n = read_all(p, size, in, 0);
    if (n < 0 || n > MAX_FIELDS) {
        free(p);
        return;
    }
    struct osubd_pb b;
    osubd_pb_init(&b, size + 16);
    for (int i = 0; i < n; i++)
        write_field(&b, &in[i]);
    check(!b.failed);
    check(b.len <= size); /* canonical varints are never longer than what was read */
    uint8_t *w = malloc(b.len ? b.len : 1);
    check(w != NULL);
    if (b.len)
        memcpy(w, b.p, b.len);
    check(read_all(w, b.len, out, 0) == n);
    for (int i = 0; i < n; i++)
        check(same(&in[i], &out[i]));
    /* written once more, the same bytes */
    struct osubd_pb b2;
    osubd_pb_init(&b2, size + 16);
    for (int i = 0; i < n; i++)
        write_field(&b2, &out[i]);
    check(!b2.failed && b2.len == b.len && (b.len == 0 || memcmp(b2.p, b.p, b.len) == 0));
    check(b2.len == 0 || read_all(b2.p, b2.len, again, 0) == n);
    osubd_pb_free(&b2);
    osubd_pb_free(&b);
    free(w);
    free(p);
}

/* The input as a script: a cap, then writes; each write is recorded and read back. */
struct cursor {
    const uint8_t *p, *end;
};

static uint64_t take(struct cursor *c, size_t k)
{
    uint64_t v = 0;
    for (size_t i = 0; i < k && c->p < c->end; i++)
        v |= (uint64_t)*c->p++ << (8 * i);
    return v;
}

static void as_script(const uint8_t *data, size_t size)
{
    if (size == 0)
        return; /* data may be NULL */
    struct cursor c = {data, data + size};
    size_t max = (size_t)take(&c, 2);
    struct osubd_pb b;
    osubd_pb_init(&b, max);
    static struct field want[MAX_FIELDS];
    static char keys[MAX_FIELDS][32], vals[MAX_FIELDS][32];
    int n = 0;
    while (c.p < c.end && n < MAX_FIELDS) {
        uint8_t op = (uint8_t)take(&c, 1);
        uint32_t num = (uint32_t)take(&c, 4) % 0x1fffffff + 1;
        size_t before = b.len;
        struct field f = {.num = num};
        switch (op % 5) {
        case 0: {
            f.wire = 0;
            f.v = take(&c, (size_t)(op >> 4) % 9);
            osubd_pb_varint(&b, (uint64_t)num << 3);
            osubd_pb_varint(&b, f.v);
            if (!b.failed)
                check(b.len - before ==
                      osubd_pb_varint_len((uint64_t)num << 3) + osubd_pb_varint_len(f.v));
            break;
        }
        case 1: {
            f.wire = 2;
            f.len = (size_t)take(&c, 1);
            if (f.len > (size_t)(c.end - c.p))
                f.len = (size_t)(c.end - c.p);
            f.data = c.p;
            c.p += f.len;
            osubd_pb_bytes(&b, num, f.data, f.len);
            break;
        }
        case 2:
            f.wire = 0;
            f.v = 1;
            if ((op >> 4) & 1) {
                osubd_pb_bool(&b, num, false);
                check(b.len == before); /* false is not written */
                continue;
            }
            osubd_pb_bool(&b, num, true);
            break;
        case 3: {
            /* a map entry: its key and value as C strings (no NUL inside) */
            size_t kl = (size_t)take(&c, 1) % 32, vl = (size_t)take(&c, 1) % 32;
            char *k = keys[n], *v = vals[n];
            for (size_t i = 0; i < kl; i++)
                k[i] = (char)('a' + take(&c, 1) % 26);
            k[kl] = '\0';
            for (size_t i = 0; i < vl; i++)
                v[i] = (char)('0' + take(&c, 1) % 10);
            v[vl] = '\0';
            osubd_pb_map_entry(&b, num, k, v);
            f.wire = 3; /* checked as an entry below */
            f.data = (const uint8_t *)k;
            f.len = kl;
            break;
        }
        default: {
            f.wire = (op >> 4) & 1 ? 1 : 5;
            f.v = take(&c, f.wire == 1 ? 8 : 4);
            write_field(&b, &f);
            break;
        }
        }
        check(b.len <= max);
        check(b.len >= before);
        if (b.failed) {
            /* failure is sticky: nothing more is written */
            size_t at = b.len;
            osubd_pb_string(&b, 1, "");
            osubd_pb_varint(&b, 0);
            check(b.failed && b.len == at);
            break;
        }
        want[n++] = f;
    }
    check(b.len <= max && (b.len <= b.cap || b.len == 0));
    if (!b.failed) {
        uint8_t *w = malloc(b.len ? b.len : 1);
        check(w != NULL);
        if (b.len)
            memcpy(w, b.p, b.len);
        struct osubd_pb_reader r = {.p = w, .end = w + b.len};
        struct osubd_pb_field f;
        for (int i = 0; i < n; i++) {
            check(osubd_pb_next(&r, &f) == 1);
            check(f.num == want[i].num);
            if (want[i].wire == 3) {
                check(f.wire == 2);
                struct osubd_pb_reader er = {.p = f.data, .end = f.data + f.len};
                struct osubd_pb_field k, v;
                check(osubd_pb_next(&er, &k) == 1 && k.num == 1 && k.wire == 2);
                check(k.len == want[i].len && memcmp(k.data, keys[i], k.len) == 0);
                check(osubd_pb_next(&er, &v) == 1 && v.num == 2 && v.wire == 2);
                check(v.len == strlen(vals[i]) && memcmp(v.data, vals[i], v.len) == 0);
                check(osubd_pb_next(&er, &v) == 0);
                continue;
            }
            struct field got = {f.num, f.wire, f.varint, f.data, f.len};
            check(same(&got, &want[i]));
        }
        check(osubd_pb_next(&r, &f) == 0);
        free(w);
    }
    osubd_pb_free(&b);
    check(b.p == NULL && b.len == 0 && !b.failed);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    as_message(data, size);
    as_script(data, size);
    return 0;
}
