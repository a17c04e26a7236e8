/* h1.c - the HTTP/1.1 codec (h1.h): heads and chunked bodies, strict */
#include "h1.h"

#include <string.h>
#include <strings.h>

/* RFC 9110 5.6.2: tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." / "^" /
 * "_" / "`" / "|" / "~" / DIGIT / ALPHA */
bool h1_is_tchar(unsigned char c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return true;
    return c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* field-vchar, obs-text, SP and HTAB: what a field value may hold */
static bool value_char(unsigned char c)
{
    return (c >= 0x21 && c <= 0x7e) || c >= 0x80 || c == ' ' || c == '\t';
}

static int bad(struct h1_head *out, int status, const char *why)
{
    out->err_status = status;
    out->err_why = why;
    return H1_BAD;
}

static bool name_is(const struct h1_header *h, const char *name, size_t n)
{
    return h->nlen == n && strncasecmp(h->name, name, n) == 0;
}

bool h1_list_has(const char *v, size_t vlen, const char *token)
{
    size_t tlen = strlen(token), i = 0;
    while (i < vlen) {
        while (i < vlen && (v[i] == ' ' || v[i] == ',' || v[i] == '\t'))
            i++;
        size_t s = i;
        while (i < vlen && v[i] != ',')
            i++;
        size_t e = i;
        while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t'))
            e--;
        if (e - s == tlen && strncasecmp(v + s, token, tlen) == 0)
            return true;
    }
    return false;
}

const struct h1_header *h1_find(const struct h1_head *h, const char *name)
{
    size_t n = strlen(name);
    for (int i = 0; i < h->nh; i++)
        if (name_is(&h->h[i], name, n))
            return &h->h[i];
    return NULL;
}

bool h1_hop_by_hop(const char *name, size_t n, const struct h1_header *conn)
{
    static const char *const hop[] = {"Connection",
                                      "Keep-Alive",
                                      "Proxy-Connection",
                                      "TE",
                                      "Trailer",
                                      "Transfer-Encoding",
                                      "Upgrade",
                                      "Proxy-Authenticate",
                                      "Proxy-Authorization"};
    for (size_t i = 0; i < sizeof(hop) / sizeof(hop[0]); i++)
        if (strlen(hop[i]) == n && strncasecmp(name, hop[i], n) == 0)
            return true;
    if (conn == NULL)
        return false;
    /* a message's framing and target are never the Connection field's to remove (a client
     * naming Content-Length there would make its body the next request on a pooled connection) */
    if ((n == 14 && strncasecmp(name, "Content-Length", 14) == 0) ||
        (n == 4 && strncasecmp(name, "Host", 4) == 0))
        return false;
    char tok[64];
    if (n >= sizeof(tok))
        return false;
    memcpy(tok, name, n);
    tok[n] = '\0';
    return h1_list_has(conn->value, conn->vlen, tok);
}

/* The codings of a Transfer-Encoding value: 1 when chunked is the last (and only once), 0 when
 * it is absent, -1 when it appears elsewhere or twice. *others: a coding other than chunked. */
static int te_chunked_last(const char *v, size_t vlen, bool *others)
{
    int seen = 0, last = 0;
    *others = false;
    size_t i = 0;
    while (i <= vlen) {
        size_t s = i;
        while (i < vlen && v[i] != ',')
            i++;
        size_t e = i;
        while (s < e && (v[s] == ' ' || v[s] == '\t'))
            s++;
        while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t'))
            e--;
        if (e > s) {
            bool ch = e - s == 7 && strncasecmp(v + s, "chunked", 7) == 0;
            if (ch)
                seen++;
            else
                *others = true;
            last = ch;
        }
        i++;
    }
    if (seen == 0)
        return 0;
    return seen == 1 && last ? 1 : -1;
}

/* Parses the field lines after the start line (p: the first of them). */
static int parse_fields(const char *buf, const char *p, const char *end, bool crlf, bool request,
                        struct h1_head *out)
{
    int n_cl = 0, n_te = 0, n_host = 0;
    const struct h1_header *te = NULL;
    for (;;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL)
            return H1_PARTIAL;
        bool cr = nl > p && nl[-1] == '\r';
        if (cr != crlf)
            return bad(out, 400,
                       crlf ? "a line ends in a bare LF where the head's lines end in CRLF"
                            : "a CR before LF where the head's lines end in a bare LF");
        const char *le = cr ? nl - 1 : nl;
        if (le == p) {
            out->len = (size_t)(nl + 1 - buf);
            break;
        }
        if (*p == ' ' || *p == '\t')
            return bad(out, 400, "folded header lines (obs-fold) are not accepted");
        const char *q = p;
        while (q < le && h1_is_tchar((unsigned char)*q))
            q++;
        if (q == p || q == le || *q != ':')
            return bad(out, 400,
                       q == p ? "a header line without a field name"
                       : q < le && (*q == ' ' || *q == '\t')
                           ? "whitespace between a field name and its colon"
                           : "a field name holds a character that is not a token");
        const char *v = q + 1, *ve = le;
        while (v < ve && (*v == ' ' || *v == '\t'))
            v++;
        for (const char *c = v; c < ve; c++)
            if (!value_char((unsigned char)*c))
                return bad(out, 400,
                           *c == '\r'   ? "a bare CR in a field value"
                           : *c == '\0' ? "a NUL in a field value"
                                        : "a control character in a field value");
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        if (out->nh == H1_HEADERS_MAX)
            return bad(out, 431, "more than 100 header fields");
        struct h1_header *h = &out->h[out->nh++];
        h->name = p;
        h->nlen = (uint32_t)(q - p);
        h->value = v;
        h->vlen = (uint32_t)(ve - v);
        if (name_is(h, "Content-Length", 14)) {
            if (++n_cl > 1)
                return bad(out, 400, "more than one Content-Length");
            if (h->vlen == 0 || h->vlen > 18)
                return bad(out, 400, "a malformed Content-Length");
            int64_t cl = 0;
            for (uint32_t i = 0; i < h->vlen; i++) {
                if (v[i] < '0' || v[i] > '9')
                    return bad(out, 400, "a malformed Content-Length");
                cl = cl * 10 + (v[i] - '0');
            }
            out->content_length = cl;
        } else if (name_is(h, "Transfer-Encoding", 17)) {
            if (++n_te > 1)
                return bad(out, 400, "more than one Transfer-Encoding field");
            te = h;
        } else if (name_is(h, "Host", 4)) {
            n_host++;
        } else if (name_is(h, "Expect", 6)) {
            out->expect_continue = h->vlen == 12 && strncasecmp(v, "100-continue", 12) == 0;
        }
        p = nl + 1;
    }
    if (n_cl > 0 && n_te > 0)
        return bad(out, 400, "both Content-Length and Transfer-Encoding");
    if (te != NULL) {
        if (out->minor == 0)
            return bad(out, 400, "Transfer-Encoding in an HTTP/1.0 message");
        bool others;
        int c = te_chunked_last(te->value, te->vlen, &others);
        if (request) {
            if (c < 0)
                return bad(out, 400, "chunked is not the final transfer coding");
            /* exactly "chunked": no other coding, no empty list element */
            if (others || c == 0 || te->vlen != 7)
                return bad(out, 501, "the only transfer coding accepted is chunked");
            out->chunked = true;
        } else {
            if (c < 0)
                return bad(out, 502, "chunked is not the final transfer coding");
            out->chunked = c == 1;
            out->until_close = c == 0;
        }
    }
    out->has_host = n_host > 0;
    if (request && n_host > 1)
        return bad(out, 400, "more than one Host"); /* RFC 9112 3.2: in any request */
    if (request && out->minor == 1 && n_host == 0)
        return bad(out, 400, "an HTTP/1.1 request without Host");
    const struct h1_header *conn = h1_find(out, "Connection");
    if (out->minor == 0)
        out->keepalive = conn != NULL && h1_list_has(conn->value, conn->vlen, "keep-alive");
    else
        out->keepalive = conn == NULL || !h1_list_has(conn->value, conn->vlen, "close");
    return H1_DONE;
}

static void head_init(struct h1_head *out)
{
    out->method = out->target = NULL;
    out->mlen = out->tlen = 0;
    out->status = 0;
    out->minor = 1;
    out->nh = 0;
    out->len = 0;
    out->content_length = -1;
    out->chunked = out->until_close = out->no_body = out->keepalive = false;
    out->lf_only = out->expect_continue = out->has_host = false;
    out->err_status = 0;
    out->err_why = NULL;
}

/* The start line: [p, le) with its line end at nl. NULL when there is no whole line yet. */
static const char *start_line(const char *buf, size_t len, const char **le, bool *crlf)
{
    size_t lim = len < H1_HEAD_MAX ? len : H1_HEAD_MAX;
    const char *nl = lim > 0 ? memchr(buf, '\n', lim) : NULL;
    if (nl == NULL)
        return NULL;
    *crlf = nl > buf && nl[-1] == '\r';
    *le = *crlf ? nl - 1 : nl;
    return nl;
}

int h1_parse_request(const char *buf, size_t len, struct h1_head *out)
{
    head_init(out);
    const char *le;
    bool crlf;
    const char *nl = start_line(buf, len, &le, &crlf);
    if (nl == NULL) {
        if (len > H1_LINE_MAX)
            return bad(out, 414, "the request line is over 8 KiB");
        return H1_PARTIAL;
    }
    if (le - buf > H1_LINE_MAX)
        return bad(out, 414, "the request line is over 8 KiB");
    out->lf_only = !crlf;
    const char *p = buf;
    while (p < le && h1_is_tchar((unsigned char)*p))
        p++;
    if (p == buf || p == le || *p != ' ')
        return bad(out, 400, "the request line is not METHOD SP target SP HTTP/1.x");
    out->method = buf;
    out->mlen = (size_t)(p - buf);
    const char *t = ++p;
    while (p < le && (unsigned char)*p > ' ' && (unsigned char)*p < 0x7f)
        p++;
    if (p == le || *p != ' ' || p == t)
        return bad(out, 400,
                   p < le && *p != ' ' ? "the request target holds a control character"
                                       : "the request line is not METHOD SP target SP HTTP/1.x");
    if (*t != '/')
        return bad(out, 400, "the request target must be a path (origin-form: /...)");
    out->target = t;
    out->tlen = (size_t)(p - t);
    const char *ver = p + 1;
    size_t vl = (size_t)(le - ver);
    if (vl == 8 && memcmp(ver, "HTTP/1.1", 8) == 0)
        out->minor = 1;
    else if (vl == 8 && memcmp(ver, "HTTP/1.0", 8) == 0)
        out->minor = 0;
    else if (vl == 8 && memcmp(ver, "HTTP/", 5) == 0 && ver[5] >= '0' && ver[5] <= '9' &&
             ver[6] == '.' && ver[7] >= '0' && ver[7] <= '9')
        return bad(out, 505, "only HTTP/1.0 and HTTP/1.1");
    else
        return bad(out, 400, "the request line does not end in HTTP/1.x");
    size_t lim = len < H1_HEAD_MAX ? len : H1_HEAD_MAX;
    int rc = parse_fields(buf, nl + 1, buf + lim, crlf, true, out);
    if (rc == H1_PARTIAL && len >= H1_HEAD_MAX)
        return bad(out, 431, "the request's head is over 16 KiB");
    return rc;
}

int h1_parse_response(const char *buf, size_t len, bool request_was_head, struct h1_head *out)
{
    head_init(out);
    const char *le;
    bool crlf;
    const char *nl = start_line(buf, len, &le, &crlf);
    if (nl == NULL)
        return len >= H1_HEAD_MAX ? bad(out, 502, "the response's head is over 16 KiB")
                                  : H1_PARTIAL;
    out->lf_only = !crlf;
    size_t ll = (size_t)(le - buf);
    if (ll < 12 || memcmp(buf, "HTTP/1.", 7) != 0 || (buf[7] != '0' && buf[7] != '1') ||
        buf[8] != ' ')
        return bad(out, 502, "the status line is not HTTP/1.x SP code");
    out->minor = buf[7] - '0';
    for (int i = 9; i < 12; i++)
        if (buf[i] < '0' || buf[i] > '9')
            return bad(out, 502, "the status code is not three digits");
    out->status = (buf[9] - '0') * 100 + (buf[10] - '0') * 10 + (buf[11] - '0');
    if (out->status < 100)
        return bad(out, 502, "the status code is under 100");
    if (ll > 12 && buf[12] != ' ')
        return bad(out, 502, "the status code is not followed by SP");
    for (const char *c = buf + 12; c < le; c++)
        if (!value_char((unsigned char)*c))
            return bad(out, 502, "a control character in the reason phrase");
    size_t lim = len < H1_HEAD_MAX ? len : H1_HEAD_MAX;
    int rc = parse_fields(buf, nl + 1, buf + lim, crlf, false, out);
    if (rc == H1_PARTIAL && len >= H1_HEAD_MAX)
        return bad(out, 502, "the response's head is over 16 KiB");
    if (rc != H1_DONE) {
        if (rc == H1_BAD && out->err_status < 500)
            out->err_status = 502; /* a backend's bad framing is a bad gateway to the client */
        return rc;
    }
    if (request_was_head || out->status < 200 || out->status == 204 || out->status == 304) {
        out->no_body = true;
        out->chunked = out->until_close = false;
    } else if (!out->chunked && out->content_length < 0) {
        out->until_close = true;
    }
    if (out->until_close)
        out->keepalive = false;
    return H1_DONE;
}

void h1_head_rebase(struct h1_head *h, const char *from, const char *to)
{
#define REBASE(ptr)                                                                                \
    do {                                                                                           \
        if ((ptr) != NULL)                                                                         \
            (ptr) = to + ((ptr)-from);                                                             \
    } while (0)
    REBASE(h->method);
    REBASE(h->target);
    for (int i = 0; i < h->nh; i++) {
        REBASE(h->h[i].name);
        REBASE(h->h[i].value);
    }
#undef REBASE
}

/* ---- chunked bodies ------------------------------------------------------------------------ */

void h1_chunked_init(struct h1_chunked *cs, int64_t max_total, bool lf_ok)
{
    memset(cs, 0, sizeof(*cs));
    cs->st = H1C_SIZE;
    cs->max_total = max_total;
    cs->lf_ok = lf_ok;
}

static size_t cbad(struct h1_chunked *cs, size_t i, const char *why)
{
    cs->st = H1C_BAD;
    cs->why = why;
    return i;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* The end of a chunk-size line: into the data, or the trailer section after the last chunk. */
static void size_line_done(struct h1_chunked *cs)
{
    if (cs->left == 0) {
        cs->st = H1C_TRAILER;
        cs->tline = 0;
        cs->tbytes = 0;
        cs->tline_colon = cs->tline_bad = false;
    } else {
        cs->st = H1C_DATA;
    }
}

size_t h1_chunked_feed(struct h1_chunked *cs, const char *p, size_t n,
                       void (*on_data)(void *arg, const char *p, size_t n), void *arg)
{
    size_t i = 0;
    while (i < n) {
        char ch = p[i];
        switch (cs->st) {
        case H1C_SIZE: {
            int v = hexval(ch);
            if (v >= 0) {
                if (++cs->ndigits > 16 || cs->left > H1_CHUNK_MAX / 16)
                    return cbad(cs, i, "a chunk size over 2^40");
                cs->left = cs->left * 16 + v;
                if (cs->left > H1_CHUNK_MAX)
                    return cbad(cs, i, "a chunk size over 2^40");
                i++;
                break;
            }
            if (cs->ndigits == 0)
                return cbad(cs, i, "a chunk size must start with a hex digit");
            if (cs->max_total > 0 && cs->left > cs->max_total - cs->total) {
                cs->too_large = true;
                return cbad(cs, i, "the body is over the limit");
            }
            if (ch == ';' || ch == ' ' || ch == '\t') {
                cs->st = H1C_EXT;
                cs->tline = 0;
                cs->tline_colon = ch == ';'; /* reused: the extension's ';' was seen */
            } else if (ch == '\r') {
                cs->st = H1C_SIZE_LF;
            } else if (ch == '\n' && cs->lf_ok) {
                cs->total += cs->left;
                size_line_done(cs);
            } else {
                return cbad(cs, i, "a chunk size line holds something else than hex digits");
            }
            i++;
            break;
        }
        case H1C_EXT:
            if (++cs->tline > H1_CHUNK_EXT_MAX)
                return cbad(cs, i, "a chunk extension over 4 KiB");
            if (ch == '\r') {
                if (!cs->tline_colon)
                    return cbad(cs, i, "whitespace after a chunk size without an extension");
                cs->st = H1C_SIZE_LF;
            } else if (ch == '\n' && cs->lf_ok && cs->tline_colon) {
                cs->total += cs->left;
                size_line_done(cs);
            } else if (ch == ';') {
                cs->tline_colon = true;
            } else if (ch != ' ' && ch != '\t' && !cs->tline_colon) {
                return cbad(cs, i, "a chunk size followed by something else than an extension");
            } else if (!value_char((unsigned char)ch)) {
                return cbad(cs, i, "a control character in a chunk extension");
            }
            i++;
            break;
        case H1C_SIZE_LF:
            if (ch != '\n')
                return cbad(cs, i, "a bare CR in a chunk size line");
            cs->total += cs->left;
            size_line_done(cs);
            i++;
            break;
        case H1C_DATA: {
            size_t k = n - i < (size_t)cs->left ? n - i : (size_t)cs->left;
            if (on_data != NULL)
                on_data(arg, p + i, k);
            i += k;
            cs->left -= (int64_t)k;
            if (cs->left == 0)
                cs->st = H1C_DATA_CR;
            break;
        }
        case H1C_DATA_CR:
            if (ch == '\r')
                cs->st = H1C_DATA_LF;
            else if (ch == '\n' && cs->lf_ok)
                cs->st = H1C_SIZE, cs->ndigits = 0, cs->left = 0;
            else
                return cbad(cs, i, "chunk data not followed by CRLF");
            i++;
            break;
        case H1C_DATA_LF:
            if (ch != '\n')
                return cbad(cs, i, "chunk data not followed by CRLF");
            cs->st = H1C_SIZE;
            cs->ndigits = 0;
            cs->left = 0;
            i++;
            break;
        case H1C_TRAILER:
            if (++cs->tbytes > H1_TRAILER_MAX)
                return cbad(cs, i, "the trailer section is over 8 KiB");
            if (ch == '\n') {
                bool had_cr = cs->tline > 0 && cs->tline_bad; /* tline_bad: the last was CR */
                int content = cs->tline - (had_cr ? 1 : 0);
                if (!had_cr && !cs->lf_ok)
                    return cbad(cs, i, "a trailer line ends in a bare LF");
                if (content == 0) {
                    cs->st = H1C_DONE;
                    return i + 1;
                }
                if (!cs->tline_colon)
                    return cbad(cs, i, "a trailer line that is not a field");
                cs->tline = 0;
                cs->tline_colon = cs->tline_bad = false;
                i++;
                break;
            }
            if (cs->tline_bad) /* a CR not followed by LF */
                return cbad(cs, i, "a bare CR in the trailer section");
            if (ch == '\r') {
                cs->tline_bad = true;
            } else if (!cs->tline_colon) {
                if (ch == ':' && cs->tline > 0)
                    cs->tline_colon = true;
                else if (!h1_is_tchar((unsigned char)ch))
                    return cbad(cs, i, "a trailer line that is not a field");
            } else if (!value_char((unsigned char)ch)) {
                return cbad(cs, i, "a control character in a trailer field");
            }
            cs->tline++;
            i++;
            break;
        default: /* H1C_DONE, H1C_BAD: nothing more belongs to the body */
            return i;
        }
    }
    return i;
}
