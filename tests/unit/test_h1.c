/* test_h1.c - the HTTP/1.1 codec, table-driven: requests, responses, chunked bodies; every
 * framing finding of the gateway's review has a row */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "h1.h"

struct req_case {
    const char *name;
    const char *in;
    size_t len; /* 0: strlen */
    int rc;
    int status;     /* H1_BAD: the status */
    size_t headlen; /* H1_DONE: the head's length (0: all of in) */
};

#define CRLF "\r\n"
#define H "Host: x" CRLF
#define NUL_REQ "GET / HTTP/1.1" CRLF H "X-A: a\0b" CRLF CRLF

static const struct req_case reqs[] = {
    {"simple", "GET / HTTP/1.1" CRLF H CRLF, 0, H1_DONE, 0, 0},
    {"HTTP/1.0 without Host", "GET /a?b=c HTTP/1.0" CRLF CRLF, 0, H1_DONE, 0, 0},
    {"bare LF head", "GET / HTTP/1.1\nHost: x\n\n", 0, H1_DONE, 0, 0},
    {"partial", "GET / HTTP/1.1" CRLF "Host: x" CRLF, 0, H1_PARTIAL, 0, 0},
    {"partial line", "GET / HT", 0, H1_PARTIAL, 0, 0},
    /* a bare-LF request pipelined before a CRLF one: the first head ends at its own empty line */
    {"LF head then a CRLF one", "GET /1 HTTP/1.1\nHost: x\n\nGET /2 HTTP/1.1" CRLF H CRLF, 0,
     H1_DONE, 0, 25},
    {"mixed line ends (LF in CRLF head)", "GET / HTTP/1.1" CRLF "Host: x\n" CRLF, 0, H1_BAD, 400,
     0},
    {"mixed line ends (CRLF in LF head)", "GET / HTTP/1.1\nHost: x" CRLF "\n", 0, H1_BAD, 400, 0},
    {"bare CR in a value", "GET / HTTP/1.1" CRLF H "X-A: a\rX-Injected: yes" CRLF CRLF, 0, H1_BAD,
     400, 0},
    {"bare CR smuggling TE",
     "POST / HTTP/1.1" CRLF H "X-A: z\rTransfer-Encoding: chunked" CRLF
     "Content-Length: 4" CRLF CRLF "abcd",
     0, H1_BAD, 400, 0},
    {"NUL in a value", NUL_REQ, sizeof(NUL_REQ) - 1, H1_BAD, 400, 0},
    {"control char in a value", "GET / HTTP/1.1" CRLF H "X-A: a\x01" CRLF CRLF, 0, H1_BAD, 400, 0},
    {"obs-fold", "GET / HTTP/1.1" CRLF H "X-A: a" CRLF " b" CRLF CRLF, 0, H1_BAD, 400, 0},
    {"space before colon", "GET / HTTP/1.1" CRLF H "X-A : a" CRLF CRLF, 0, H1_BAD, 400, 0},
    {"name not a token", "GET / HTTP/1.1" CRLF H "X(A): a" CRLF CRLF, 0, H1_BAD, 400, 0},
    {"empty name", "GET / HTTP/1.1" CRLF H ": a" CRLF CRLF, 0, H1_BAD, 400, 0},
    {"no colon", "GET / HTTP/1.1" CRLF H "garbage" CRLF CRLF, 0, H1_BAD, 400, 0},
    {"two Content-Length",
     "POST / HTTP/1.1" CRLF H "Content-Length: 1" CRLF "Content-Length: 1" CRLF CRLF, 0, H1_BAD,
     400, 0},
    {"CL list", "POST / HTTP/1.1" CRLF H "Content-Length: 1, 1" CRLF CRLF, 0, H1_BAD, 400, 0},
    {"CL sign", "POST / HTTP/1.1" CRLF H "Content-Length: +1" CRLF CRLF, 0, H1_BAD, 400, 0},
    {"CL huge", "POST / HTTP/1.1" CRLF H "Content-Length: 99999999999999999999" CRLF CRLF, 0,
     H1_BAD, 400, 0},
    {"CL and TE",
     "POST / HTTP/1.1" CRLF H "Content-Length: 1" CRLF "Transfer-Encoding: chunked" CRLF CRLF, 0,
     H1_BAD, 400, 0},
    {"TE twice",
     "POST / HTTP/1.1" CRLF H "Transfer-Encoding: chunked" CRLF
     "Transfer-Encoding: chunked" CRLF CRLF,
     0, H1_BAD, 400, 0},
    {"TE gzip", "POST / HTTP/1.1" CRLF H "Transfer-Encoding: gzip" CRLF CRLF, 0, H1_BAD, 501, 0},
    {"TE chunked not last", "POST / HTTP/1.1" CRLF H "Transfer-Encoding: chunked, gzip" CRLF CRLF,
     0, H1_BAD, 400, 0},
    {"TE in HTTP/1.0", "POST / HTTP/1.0" CRLF "Transfer-Encoding: chunked" CRLF CRLF, 0, H1_BAD,
     400, 0},
    {"TE chunked ok", "POST / HTTP/1.1" CRLF H "Transfer-Encoding:  Chunked " CRLF CRLF, 0, H1_DONE,
     0, 0},
    {"no Host in 1.1", "GET / HTTP/1.1" CRLF CRLF, 0, H1_BAD, 400, 0},
    {"two Hosts", "GET / HTTP/1.1" CRLF H H CRLF, 0, H1_BAD, 400, 0},
    {"HTTP/2.0", "GET / HTTP/2.0" CRLF H CRLF, 0, H1_BAD, 505, 0},
    {"HTTP/1.2? no: 505 only for digits", "GET / HTTP/1.x" CRLF H CRLF, 0, H1_BAD, 400, 0},
    {"lower-case version", "GET / http/1.1" CRLF H CRLF, 0, H1_BAD, 400, 0},
    {"method not a token", "G(T / HTTP/1.1" CRLF H CRLF, 0, H1_BAD, 400, 0},
    {"two spaces", "GET  / HTTP/1.1" CRLF H CRLF, 0, H1_BAD, 400, 0},
    {"absolute form", "GET http://x/ HTTP/1.1" CRLF H CRLF, 0, H1_BAD, 400, 0},
    {"control char in target", "GET /\x01 HTTP/1.1" CRLF H CRLF, 0, H1_BAD, 400, 0},
    {"DEL in target", "GET /\x7f HTTP/1.1" CRLF H CRLF, 0, H1_BAD, 400, 0},
    {"empty line first", CRLF "GET / HTTP/1.1" CRLF H CRLF, 0, H1_BAD, 400, 0},
    {"trailing whitespace in value", "GET / HTTP/1.1" CRLF "Host: x  \t" CRLF CRLF, 0, H1_DONE, 0,
     0},
};

static void test_requests(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(reqs) / sizeof(reqs[0]); i++) {
        const struct req_case *c = &reqs[i];
        size_t len = c->len ? c->len : strlen(c->in);
        struct h1_head h;
        int rc = h1_parse_request(c->in, len, &h);
        if (rc != c->rc)
            fail_msg("%s: rc %d, want %d (%s)", c->name, rc, c->rc, h.err_why ? h.err_why : "");
        if (rc == H1_BAD) {
            if (h.err_status != c->status)
                fail_msg("%s: status %d, want %d (%s)", c->name, h.err_status, c->status,
                         h.err_why);
            assert_non_null(h.err_why);
        }
        if (rc == H1_DONE) {
            size_t want = c->headlen ? c->headlen : len;
            if (h.len != want)
                fail_msg("%s: head length %zu, want %zu", c->name, h.len, want);
        }
    }
}

static void test_request_fields(void **state)
{
    (void)state;
    const char *in =
        "POST /v1/chat?x=1 HTTP/1.1" CRLF "Host: gw" CRLF "Content-Length: 12" CRLF "X-Empty:" CRLF
        "Connection: keep-alive, Upgrade" CRLF "Expect: 100-continue" CRLF CRLF "hello world!";
    struct h1_head h;
    assert_int_equal(h1_parse_request(in, strlen(in), &h), H1_DONE);
    assert_int_equal(h.mlen, 4);
    assert_memory_equal(h.method, "POST", 4);
    assert_int_equal(h.tlen, strlen("/v1/chat?x=1"));
    assert_int_equal(h.minor, 1);
    assert_int_equal(h.content_length, 12);
    assert_false(h.chunked);
    assert_true(h.keepalive);
    assert_true(h.expect_continue);
    assert_int_equal(h.nh, 5);
    assert_int_equal(h.len, strlen(in) - 12);
    const struct h1_header *e = h1_find(&h, "x-empty");
    assert_non_null(e);
    assert_int_equal(e->vlen, 0);
    const struct h1_header *conn = h1_find(&h, "connection");
    assert_true(h1_hop_by_hop("Upgrade", 7, conn));
    assert_true(h1_hop_by_hop("keep-alive", 10, conn));
    assert_false(h1_hop_by_hop("Host", 4, conn));
    /* Connection may not make the framing or the target hop-by-hop */
    const char *cc = "POST / HTTP/1.1" CRLF H "Content-Length: 3" CRLF
                     "Connection: Content-Length, Host" CRLF CRLF;
    assert_int_equal(h1_parse_request(cc, strlen(cc), &h), H1_DONE);
    const struct h1_header *cn = h1_find(&h, "Connection");
    assert_false(h1_hop_by_hop("Content-Length", 14, cn));
    assert_false(h1_hop_by_hop("Host", 4, cn));
    /* Connection: close in 1.1, keep-alive in 1.0 */
    const char *c1 = "GET / HTTP/1.1" CRLF H "Connection: Close" CRLF CRLF;
    assert_int_equal(h1_parse_request(c1, strlen(c1), &h), H1_DONE);
    assert_false(h.keepalive);
    const char *c0 = "GET / HTTP/1.0" CRLF "Connection: keep-alive" CRLF CRLF;
    assert_int_equal(h1_parse_request(c0, strlen(c0), &h), H1_DONE);
    assert_true(h.keepalive);
    /* rebase: the same head parsed, copied, pointers moved */
    char copy[256];
    assert_int_equal(h1_parse_request(in, strlen(in), &h), H1_DONE);
    memcpy(copy, in, h.len);
    h1_head_rebase(&h, in, copy);
    assert_ptr_equal(h.method, copy);
    assert_true(h.h[0].name >= copy && h.h[0].name < copy + h.len);
}

static void test_request_limits(void **state)
{
    (void)state;
    static char buf[H1_HEAD_MAX + 4096];
    struct h1_head h;
    /* a request line over 8 KiB: 414, whole or not */
    memset(buf, 'a', sizeof(buf));
    memcpy(buf, "GET /", 5);
    assert_int_equal(h1_parse_request(buf, H1_LINE_MAX + 10, &h), H1_BAD);
    assert_int_equal(h.err_status, 414);
    /* a head over 16 KiB: 431 */
    size_t n = (size_t)snprintf(buf, sizeof(buf), "GET / HTTP/1.1" CRLF H);
    while (n < H1_HEAD_MAX + 100)
        n += (size_t)snprintf(buf + n, sizeof(buf) - n, "X-Pad: 0123456789012345678901234567" CRLF);
    assert_int_equal(h1_parse_request(buf, n, &h), H1_BAD);
    assert_int_equal(h.err_status, 431);
    /* 101 fields: 431 */
    n = (size_t)snprintf(buf, sizeof(buf), "GET / HTTP/1.1" CRLF H);
    for (int i = 0; i < 100; i++)
        n += (size_t)snprintf(buf + n, sizeof(buf) - n, "X-%d: v" CRLF, i);
    n += (size_t)snprintf(buf + n, sizeof(buf) - n, CRLF);
    assert_int_equal(h1_parse_request(buf, n, &h), H1_BAD);
    assert_int_equal(h.err_status, 431);
}

struct resp_case {
    const char *name;
    const char *in;
    bool head;
    int rc;
    bool chunked, until_close, no_body, keepalive;
    int64_t cl;
};

static const struct resp_case resps[] = {
    {"200 CL", "HTTP/1.1 200 OK" CRLF "Content-Length: 5" CRLF CRLF, false, H1_DONE, false, false,
     false, true, 5},
    {"200 chunked", "HTTP/1.1 200 OK" CRLF "Transfer-Encoding: chunked" CRLF CRLF, false, H1_DONE,
     true, false, false, true, -1},
    {"gzip then chunked", "HTTP/1.1 200 OK" CRLF "Transfer-Encoding: gzip, chunked" CRLF CRLF,
     false, H1_DONE, true, false, false, true, -1},
    {"until close", "HTTP/1.1 200 OK" CRLF CRLF, false, H1_DONE, false, true, false, false, -1},
    {"1.0 keep-alive CL",
     "HTTP/1.0 200 OK" CRLF "Connection: keep-alive" CRLF "Content-Length: 0" CRLF CRLF, false,
     H1_DONE, false, false, false, true, 0},
    {"204", "HTTP/1.1 204 No Content" CRLF CRLF, false, H1_DONE, false, false, true, true, -1},
    {"304", "HTTP/1.1 304 Not Modified" CRLF "Content-Length: 10" CRLF CRLF, false, H1_DONE, false,
     false, true, true, 10},
    {"HEAD", "HTTP/1.1 200 OK" CRLF "Content-Length: 10" CRLF CRLF, true, H1_DONE, false, false,
     true, true, 10},
    {"no reason", "HTTP/1.1 200" CRLF "Content-Length: 0" CRLF CRLF, false, H1_DONE, false, false,
     false, true, 0},
    {"bad status", "HTTP/1.1 2x0 OK" CRLF CRLF, false, H1_BAD, false, false, false, false, -1},
    {"CL and TE",
     "HTTP/1.1 200 OK" CRLF "Content-Length: 1" CRLF "Transfer-Encoding: chunked" CRLF CRLF, false,
     H1_BAD, false, false, false, false, -1},
    {"bare CR", "HTTP/1.1 200 OK" CRLF "X: a\rb" CRLF CRLF, false, H1_BAD, false, false, false,
     false, -1},
    {"HTTP/2", "HTTP/2 200 OK" CRLF CRLF, false, H1_BAD, false, false, false, false, -1},
};

static void test_responses(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(resps) / sizeof(resps[0]); i++) {
        const struct resp_case *c = &resps[i];
        struct h1_head h;
        int rc = h1_parse_response(c->in, strlen(c->in), c->head, &h);
        if (rc != c->rc)
            fail_msg("%s: rc %d, want %d (%s)", c->name, rc, c->rc, h.err_why ? h.err_why : "");
        if (rc == H1_BAD) {
            assert_int_equal(h.err_status, 502);
            continue;
        }
        if (h.chunked != c->chunked || h.until_close != c->until_close || h.no_body != c->no_body ||
            h.keepalive != c->keepalive || h.content_length != c->cl)
            fail_msg("%s: chunked %d until_close %d no_body %d keepalive %d cl %lld", c->name,
                     h.chunked, h.until_close, h.no_body, h.keepalive, (long long)h.content_length);
    }
}

struct chunk_case {
    const char *name;
    const char *in;
    int st;           /* the state after feeding all of in */
    const char *data; /* H1C_DONE: the de-chunked data */
    size_t used;      /* H1C_DONE: bytes that belonged to the body (0: all) */
};

static const struct chunk_case chunks[] = {
    {"two chunks", "5" CRLF "hello" CRLF "1" CRLF "!" CRLF "0" CRLF CRLF, H1C_DONE, "hello!", 0},
    {"extension", "5;name=v" CRLF "hello" CRLF "0" CRLF CRLF, H1C_DONE, "hello", 0},
    {"BWS then extension", "5 ;x" CRLF "hello" CRLF "0" CRLF CRLF, H1C_DONE, "hello", 0},
    {"trailer fields", "1" CRLF "a" CRLF "0" CRLF "X-T: 1" CRLF CRLF, H1C_DONE, "a", 0},
    {"then the next request", "0" CRLF CRLF "GET / HTTP/1.1" CRLF, H1C_DONE, "", 5},
    {"upper hex", "A" CRLF "0123456789" CRLF "0" CRLF CRLF, H1C_DONE, "0123456789", 0},
    {"empty size line", CRLF "0" CRLF CRLF, H1C_BAD, NULL, 0},
    {"space-led size", " 5" CRLF "hello" CRLF "0" CRLF CRLF, H1C_BAD, NULL, 0},
    {"huge size", "ffffffffffffffffff" CRLF, H1C_BAD, NULL, 0},
    {"over 2^40", "20000000000" CRLF, H1C_BAD, NULL, 0},
    {"sign", "+5" CRLF, H1C_BAD, NULL, 0},
    {"junk after size", "5 x" CRLF, H1C_BAD, NULL, 0},
    {"data without CRLF", "5" CRLF "helloX" CRLF, H1C_BAD, NULL, 0},
    {"bare LF (CRLF message)", "5\nhello\n0\n\n", H1C_BAD, NULL, 0},
    {"bare CR in size line", "5\rX", H1C_BAD, NULL, 0},
    {"trailer holding a request line", "0" CRLF "GET /admin HTTP/1.1" CRLF CRLF, H1C_BAD, NULL, 0},
    {"trailer bare CR", "0" CRLF "X: a\rb" CRLF CRLF, H1C_BAD, NULL, 0},
    {"control char in extension", "5;\x01" CRLF, H1C_BAD, NULL, 0},
    {"partial", "5" CRLF "hel", H1C_DATA, NULL, 0},
};

struct sink {
    char buf[256];
    size_t n;
};

static void collect(void *arg, const char *p, size_t n)
{
    struct sink *s = arg;
    assert_true(s->n + n < sizeof(s->buf));
    memcpy(s->buf + s->n, p, n);
    s->n += n;
}

static void test_chunked(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(chunks) / sizeof(chunks[0]); i++) {
        const struct chunk_case *c = &chunks[i];
        size_t len = strlen(c->in);
        /* whole, and one byte at a time: the same answer */
        for (int bytewise = 0; bytewise < 2; bytewise++) {
            struct h1_chunked cs;
            h1_chunked_init(&cs, 0, false);
            struct sink s = {.n = 0};
            size_t used = 0;
            if (!bytewise) {
                used = h1_chunked_feed(&cs, c->in, len, collect, &s);
            } else {
                for (size_t k = 0; k < len && cs.st != H1C_DONE && cs.st != H1C_BAD; k++)
                    used += h1_chunked_feed(&cs, c->in + k, 1, collect, &s);
            }
            if (cs.st != c->st)
                fail_msg("%s (%s): state %d, want %d (%s)", c->name,
                         bytewise ? "bytewise" : "whole", cs.st, c->st, cs.why ? cs.why : "");
            if (c->st == H1C_DONE) {
                assert_int_equal(s.n, strlen(c->data));
                assert_memory_equal(s.buf, c->data, s.n);
                assert_int_equal(used, c->used ? c->used : len);
            }
            if (c->st == H1C_BAD)
                assert_non_null(cs.why);
        }
    }
}

static void test_chunked_limits(void **state)
{
    (void)state;
    struct h1_chunked cs;
    /* a chunked body over the limit is refused at the size line, before its data */
    h1_chunked_init(&cs, 10, false);
    const char *in = "8" CRLF "01234567" CRLF "8" CRLF;
    h1_chunked_feed(&cs, in, strlen(in), NULL, NULL);
    assert_int_equal(cs.st, H1C_BAD);
    assert_true(cs.too_large);
    /* bare LF accepted when the head had bare LFs */
    h1_chunked_init(&cs, 0, true);
    const char *lf = "5\nhello\n0\n\n";
    assert_int_equal(h1_chunked_feed(&cs, lf, strlen(lf), NULL, NULL), strlen(lf));
    assert_int_equal(cs.st, H1C_DONE);
    /* a chunk extension over 4 KiB: not a way around the body limit */
    h1_chunked_init(&cs, 10, false);
    static char ext[6000];
    memset(ext, 'a', sizeof(ext));
    memcpy(ext, "1;", 2);
    h1_chunked_feed(&cs, ext, sizeof(ext), NULL, NULL);
    assert_int_equal(cs.st, H1C_BAD);
    /* a trailer section over 8 KiB */
    h1_chunked_init(&cs, 0, false);
    static char big[H1_TRAILER_MAX + 100];
    size_t n = (size_t)snprintf(big, sizeof(big), "0" CRLF);
    while (n < sizeof(big) - 40)
        n += (size_t)snprintf(big + n, sizeof(big) - n, "X-Trailer: abcdefghijklmnop" CRLF);
    h1_chunked_feed(&cs, big, n, NULL, NULL);
    assert_int_equal(cs.st, H1C_BAD);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_requests),       cmocka_unit_test(test_request_fields),
        cmocka_unit_test(test_request_limits), cmocka_unit_test(test_responses),
        cmocka_unit_test(test_chunked),        cmocka_unit_test(test_chunked_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
