/* pbwire.c - protocol buffers' wire format by hand (pbwire.h) */
#include "pbwire.h"

#include <stdlib.h>
#include <string.h>

void osubd_pb_init(struct osubd_pb *b, size_t max)
{
    memset(b, 0, sizeof(*b));
    b->max = max;
}

void osubd_pb_free(struct osubd_pb *b)
{
    if (b == NULL)
        return;
    free(b->p);
    size_t max = b->max;
    osubd_pb_init(b, max);
}

static bool room(struct osubd_pb *b, size_t n)
{
    if (b->failed)
        return false;
    if (n > b->max - b->len) {
        b->failed = true;
        return false;
    }
    if (b->len + n <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n)
        cap = cap > b->max / 2 ? b->max : cap * 2;
    uint8_t *np = realloc(b->p, cap);
    if (np == NULL) {
        b->failed = true;
        return false;
    }
    b->p = np;
    b->cap = cap;
    return true;
}

void osubd_pb_raw(struct osubd_pb *b, const void *data, size_t n)
{
    if (n == 0 || !room(b, n))
        return;
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

size_t osubd_pb_varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

void osubd_pb_varint(struct osubd_pb *b, uint64_t v)
{
    uint8_t t[10];
    size_t n = 0;
    while (v >= 0x80) {
        t[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    t[n++] = (uint8_t)v;
    osubd_pb_raw(b, t, n);
}

void osubd_pb_bytes(struct osubd_pb *b, uint32_t field, const void *data, size_t n)
{
    osubd_pb_varint(b, (uint64_t)field << 3 | 2);
    osubd_pb_varint(b, n);
    osubd_pb_raw(b, data, n);
}

void osubd_pb_string(struct osubd_pb *b, uint32_t field, const char *s)
{
    osubd_pb_bytes(b, field, s, strlen(s));
}

void osubd_pb_bool(struct osubd_pb *b, uint32_t field, bool v)
{
    if (!v)
        return;
    osubd_pb_varint(b, (uint64_t)field << 3);
    osubd_pb_varint(b, 1);
}

void osubd_pb_map_entry(struct osubd_pb *b, uint32_t field, const char *k, const char *v)
{
    size_t kl = strlen(k), vl = strlen(v);
    size_t n = 1 + osubd_pb_varint_len(kl) + kl + 1 + osubd_pb_varint_len(vl) + vl;
    osubd_pb_varint(b, (uint64_t)field << 3 | 2);
    osubd_pb_varint(b, n);
    osubd_pb_string(b, 1, k);
    osubd_pb_string(b, 2, v);
}

static int get_varint(struct osubd_pb_reader *r, uint64_t *v)
{
    uint64_t x = 0;
    for (unsigned i = 0; i < 10; i++) {
        if (r->p >= r->end)
            return -1;
        uint8_t c = *r->p++;
        x |= (uint64_t)(c & 0x7f) << (7 * i);
        if ((c & 0x80) == 0) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

int osubd_pb_next(struct osubd_pb_reader *r, struct osubd_pb_field *f)
{
    if (r->p >= r->end)
        return 0;
    uint64_t key;
    if (get_varint(r, &key) != 0 || (key >> 3) == 0 || (key >> 3) > 0x1fffffff)
        return -1;
    memset(f, 0, sizeof(*f));
    f->num = (uint32_t)(key >> 3);
    f->wire = (uint32_t)(key & 7);
    size_t left;
    switch (f->wire) {
    case 0:
        return get_varint(r, &f->varint) == 0 ? 1 : -1;
    case 1:
    case 5:
        left = (size_t)(r->end - r->p);
        if (left < (f->wire == 1 ? 8u : 4u))
            return -1;
        for (unsigned i = 0; i < (f->wire == 1 ? 8u : 4u); i++)
            f->varint |= (uint64_t)r->p[i] << (8 * i);
        r->p += f->wire == 1 ? 8 : 4;
        return 1;
    case 2: {
        uint64_t n;
        if (get_varint(r, &n) != 0 || n > (uint64_t)(r->end - r->p))
            return -1;
        f->data = r->p;
        f->len = (size_t)n;
        r->p += n;
        return 1;
    }
    default:
        return -1;
    }
}
