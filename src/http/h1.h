/* h1.h - an HTTP/1.1 codec: request and response heads and chunked bodies, scanned as pure
 * functions over a buffer (no I/O, no allocation), strict to RFC 9110 and RFC 9112 */
#ifndef OSUB_H1_H
#define OSUB_H1_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define H1_HEAD_MAX (16 * 1024) /* a head, its empty line included: beyond it, 431 */
#define H1_LINE_MAX (8 * 1024)  /* a request line: beyond it, 414 */
#define H1_HEADERS_MAX 100      /* header fields in one head: beyond, 431 */
#define H1_CHUNK_MAX (INT64_C(1) << 40)
#define H1_TRAILER_MAX (8 * 1024) /* the trailer section of a chunked body */
#define H1_CHUNK_EXT_MAX 4096     /* the extensions of one chunk */

enum { H1_DONE = 0, H1_PARTIAL = 1, H1_BAD = -1 };

struct h1_header {
    const char *name, *value; /* into the parsed buffer; the value without surrounding OWS */
    uint32_t nlen, vlen;
};

struct h1_head {
    /* a request's line */
    const char *method, *target;
    size_t mlen, tlen;
    /* a response's line */
    int status;
    int minor; /* HTTP/1.<minor>: 0 or 1 */
    struct h1_header h[H1_HEADERS_MAX];
    int nh;
    size_t len;             /* the head's bytes, its empty line included */
    int64_t content_length; /* -1: none given */
    bool chunked;           /* the body is chunked (the final transfer coding) */
    bool until_close;       /* a response whose body ends when the connection closes */
    bool no_body;           /* a response that has no body (HEAD, 1xx, 204, 304) */
    bool keepalive;         /* the connection stays open after this message */
    bool lf_only;           /* every line of the head ends in a bare LF (else all in CRLF) */
    bool expect_continue;   /* Expect: 100-continue */
    bool has_host;
    /* H1_BAD: the status to answer (400, 413, 414, 431, 501, 505) and why, in words */
    int err_status;
    const char *err_why;
};

/*
 * Parses a request head at the start of buf (len bytes; leading empty lines are the caller's
 * to skip). H1_DONE: out->len bytes form a whole head, parsed into out (its pointers into
 * buf). H1_PARTIAL: no whole head yet (and len <= H1_HEAD_MAX). H1_BAD: out->err_status and
 * out->err_why say why.
 *
 * Strict: the request line is METHOD SP origin-form SP HTTP/1.0|1.1; the method a token;
 * one line ending for the whole head (CRLF, or bare LF when the request line ends in one); no
 * bare CR, NUL or other control character (HTAB aside) anywhere; field names are tokens
 * followed at once by ':'; no obs-fold; Content-Length is digits, once; Transfer-Encoding only
 * in HTTP/1.1, once, ending in chunked (other codings: 501); not both; HTTP/1.1 needs exactly
 * one Host.
 */
int h1_parse_request(const char *buf, size_t len, struct h1_head *out);

/*
 * Parses a response head (HTTP/1.x SP 3DIGIT [SP reason]) with the same rules for lines and
 * fields. request_was_head: the request was HEAD (the response has no body). Sets no_body,
 * chunked, content_length or until_close for the body.
 */
int h1_parse_response(const char *buf, size_t len, bool request_was_head, struct h1_head *out);

/* Moves a parsed head's pointers from buffer `from` to a copy of it at `to`. */
void h1_head_rebase(struct h1_head *h, const char *from, const char *to);

/* The first field named name (case-insensitive), or NULL. */
const struct h1_header *h1_find(const struct h1_head *h, const char *name);
/* Whether a comma-separated field value holds token (case-insensitive). */
bool h1_list_has(const char *v, size_t vlen, const char *token);
/* Whether a field is hop-by-hop (RFC 9110 7.6.1's list, or named by the Connection field,
 * which may never name Content-Length or Host). */
bool h1_hop_by_hop(const char *name, size_t nlen, const struct h1_header *connection);
bool h1_is_tchar(unsigned char c);

/* A chunked body, scanned as it passes. */
enum {
    H1C_SIZE,
    H1C_EXT,
    H1C_SIZE_LF,
    H1C_DATA,
    H1C_DATA_CR,
    H1C_DATA_LF,
    H1C_TRAILER,
    H1C_DONE,
    H1C_BAD
};
struct h1_chunked {
    int st;
    int64_t left;      /* the chunk's data still to come */
    int64_t total;     /* data seen so far */
    int64_t max_total; /* 0: no limit; beyond it: H1C_BAD with too_large */
    int ndigits;
    bool lf_ok; /* bare LF line endings accepted (the head had them) */
    bool too_large;
    int tline;  /* bytes of the current trailer line */
    int tbytes; /* bytes of the trailer section */
    bool tline_colon, tline_bad;
    const char *why; /* H1C_BAD: why */
};

void h1_chunked_init(struct h1_chunked *cs, int64_t max_total, bool lf_ok);
/*
 * Scans up to n bytes of a chunked body. Returns how many belong to the body (fewer than n
 * when it ended: cs->st == H1C_DONE; or when the framing is bad: H1C_BAD, cs->why). on_data,
 * when not NULL, gets each piece of the chunks' data (to de-chunk).
 * Strict: a chunk size is 1 to 16 hex digits (no sign, no leading space), at most H1_CHUNK_MAX;
 * extensions may follow after ';' (no control characters); data is followed by CRLF; the
 * trailer section holds field lines (a name token and ':') and ends with an empty line.
 */
size_t h1_chunked_feed(struct h1_chunked *cs, const char *p, size_t n,
                       void (*on_data)(void *arg, const char *p, size_t n), void *arg);

#endif
