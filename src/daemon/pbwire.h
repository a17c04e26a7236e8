/* pbwire.h - protocol buffers' wire format by hand: the few shapes the device plugin speaks
 * (varints, length-delimited fields, nested messages, map entries) */
#ifndef OSUB_DAEMON_PBWIRE_H
#define OSUB_DAEMON_PBWIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A growable output buffer with a hard cap: past max (or out of memory) it stops growing, sets
 * failed and ignores further writes; the caller checks failed once at the end. */
struct osubd_pb {
    uint8_t *p;
    size_t len, cap, max;
    bool failed;
};

void osubd_pb_init(struct osubd_pb *b, size_t max);
void osubd_pb_free(struct osubd_pb *b); /* NULL-safe; leaves b empty */
void osubd_pb_raw(struct osubd_pb *b, const void *data, size_t n);
void osubd_pb_varint(struct osubd_pb *b, uint64_t v);
/* Field `field` as length-delimited bytes (a string, or a nested message already encoded). */
void osubd_pb_bytes(struct osubd_pb *b, uint32_t field, const void *data, size_t n);
void osubd_pb_string(struct osubd_pb *b, uint32_t field, const char *s);
/* A bool field; false is proto3's default and is not written. */
void osubd_pb_bool(struct osubd_pb *b, uint32_t field, bool v);
/* One entry of a map<string, string> field. */
void osubd_pb_map_entry(struct osubd_pb *b, uint32_t field, const char *k, const char *v);
/* Bytes a varint of v takes. */
size_t osubd_pb_varint_len(uint64_t v);

/* Reading: a message is a run of fields; osubd_pb_next() walks them. */
struct osubd_pb_reader {
    const uint8_t *p, *end;
};
struct osubd_pb_field {
    uint32_t num;
    uint32_t wire;       /* 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32 */
    uint64_t varint;     /* wire 0 (and the value of 1 and 5) */
    const uint8_t *data; /* wire 2: borrowed from the message */
    size_t len;
};
/* 1 and the next field in f, 0 at the end, -1 when the bytes are not a valid message
 * (truncated, a varint over 10 bytes, field number 0, groups, lengths past the end). */
int osubd_pb_next(struct osubd_pb_reader *r, struct osubd_pb_field *f);

#endif
