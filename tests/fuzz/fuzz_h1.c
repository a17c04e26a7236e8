/* fuzz_h1.c - libFuzzer target for the HTTP/1.1 codec (clang -fsanitize=fuzzer): every input
 * as a request head, a response head and a chunked body; properties checked, not only "no
 * crash": a head is never found in a shorter prefix, a parsed head lies inside the input and
 * parses the same again, and a chunked body fed whole or split gives the same answer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "h1.h"

static void check_head(const char *buf, size_t n, const struct h1_head *h)
{
    if (h->len == 0 || h->len > n || h->len > H1_HEAD_MAX)
        abort();
    for (int i = 0; i < h->nh; i++) {
        const struct h1_header *f = &h->h[i];
        if (f->name < buf || f->name + f->nlen > buf + h->len || f->nlen == 0)
            abort();
        if (f->value < buf || f->value + f->vlen > buf + h->len)
            abort();
        for (uint32_t k = 0; k < f->vlen; k++)
            if (f->value[k] == '\r' || f->value[k] == '\n' || f->value[k] == '\0')
                abort(); /* the smuggling vectors never reach a parsed value */
    }
}

static size_t sink_n;
static void sink(void *arg, const char *p, size_t n)
{
    (void)arg;
    (void)p;
    sink_n += n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *buf = (const char *)data;
    static struct h1_head h, h2;
    if (h1_parse_request(buf, size, &h) == H1_DONE) {
        check_head(buf, size, &h);
        if (h1_parse_request(buf, h.len, &h2) != H1_DONE || h2.len != h.len || h2.nh != h.nh)
            abort();
        if (h.len > 1 && h1_parse_request(buf, h.len - 1, &h2) == H1_DONE)
            abort(); /* a shorter prefix is never a whole head */
        if (h.chunked && h.content_length >= 0)
            abort();
    }
    if (h1_parse_response(buf, size, size > 0 && (data[0] & 1), &h) == H1_DONE) {
        check_head(buf, size, &h);
        if (h.until_close && h.keepalive)
            abort();
    }
    /* chunked: whole vs split at a point the input chooses */
    struct h1_chunked a, b;
    bool lf = size > 0 && (data[size - 1] & 1);
    h1_chunked_init(&a, 1 << 20, lf);
    h1_chunked_init(&b, 1 << 20, lf);
    sink_n = 0;
    size_t ua = h1_chunked_feed(&a, buf, size, sink, NULL);
    size_t da = sink_n;
    size_t cut = size > 0 ? data[0] % (size + 1) : 0;
    sink_n = 0;
    size_t ub = h1_chunked_feed(&b, buf, cut, sink, NULL);
    if (b.st != H1C_DONE && b.st != H1C_BAD)
        ub += h1_chunked_feed(&b, buf + cut, size - cut, sink, NULL);
    if (a.st != b.st || ua != ub || da != sink_n || ua > size)
        abort();
    if (a.st == H1C_DONE && a.total > (1 << 20))
        abort();
    return 0;
}
