/* csv.c - the CSV reader of the trace importers: buffered lines, fields, numbers */
#define _POSIX_C_SOURCE 200809L
#include "csv.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Read in large blocks (a month of samples is gigabytes: fgets and a strlen per line were
 * most of an import's time). */
#define CSV_BUF (1u << 20)

int csv_errf(char *err, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return -1;
}

void csv_close(struct csv *c)
{
    if (c->buf != NULL) {
        close(c->fd);
        free(c->buf);
    }
    c->buf = NULL;
}

/* Moves what is left of the buffer to its front and reads more. Returns 0 or -1 (errno). */
static int refill(struct csv *c)
{
    if (c->beg > 0) {
        memmove(c->buf, c->buf + c->beg, c->end - c->beg);
        c->end -= c->beg;
        c->beg = 0;
    }
    while (!c->eof && c->end < CSV_BUF) {
        ssize_t n = read(c->fd, c->buf + c->end, CSV_BUF - c->end);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0)
            c->eof = true;
        c->end += (size_t)n;
        c->bytes += (uint64_t)n;
        if (c->end - c->beg > CSV_LINE_MAX + 2)
            break; /* a whole line's worth at least */
    }
    /* a NUL byte is looked for once a block, not once a line */
    const char *z = memchr(c->buf + c->beg, '\0', c->end - c->beg);
    c->nul = z != NULL ? (size_t)(z - c->buf) : c->end;
    return 0;
}

int csv_next(struct csv *c, char *err, size_t errlen)
{
    for (;;) {
        char *p = c->buf + c->beg;
        char *nl = memchr(p, '\n', c->end - c->beg);
        if (nl == NULL && !c->eof && c->end - c->beg <= CSV_LINE_MAX) {
            if (refill(c) != 0)
                return csv_errf(err, errlen, "%s: line %zu: %s", c->path, c->line + 1,
                                strerror(errno));
            continue;
        }
        if (nl == NULL && c->beg == c->end)
            return 0;
        size_t n = nl != NULL ? (size_t)(nl - p) : c->end - c->beg;
        c->line++;
        if (n > CSV_LINE_MAX)
            return csv_errf(err, errlen, "%s: line %zu: line too long", c->path, c->line);
        size_t at = c->beg;
        c->beg += n + (nl != NULL);
        const char *nul = c->nul < at + n ? c->buf + c->nul : NULL;
        if (nul != NULL && nl != NULL)
            return csv_errf(err, errlen, "%s: line %zu: malformed line", c->path, c->line);
        if (nul != NULL) /* the last line, without its newline, ends there (as fgets read it) */
            n = (size_t)(nul - p);
        while (n > 0 && (p[n - 1] == '\r' || p[n - 1] == '\n'))
            n--;
        if (n == 0)
            continue;
        p[n] = '\0'; /* the newline, or the byte past the data (the buffer has room) */
        c->nf = 0;
        for (;;) {
            if (c->nf == CSV_FIELDS_MAX)
                return csv_errf(err, errlen, "%s: line %zu: too many fields", c->path, c->line);
            c->fields[c->nf++] = p;
            char *comma = strchr(p, ',');
            if (comma == NULL)
                break;
            *comma = '\0';
            p = comma + 1;
        }
        return 1;
    }
}

int csv_open(struct csv *c, const char *path, const char *header, char *err, size_t errlen)
{
    memset(c, 0, sizeof(*c));
    c->path = path;
    c->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (c->fd < 0)
        return csv_errf(err, errlen, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(c->fd, &st) == 0 && S_ISREG(st.st_mode))
        c->size = (uint64_t)st.st_size;
    c->buf = malloc(CSV_BUF + 1); /* + 1: the last line's terminator */
    if (c->buf == NULL) {
        close(c->fd);
        return csv_errf(err, errlen, "out of memory");
    }
#ifdef POSIX_FADV_SEQUENTIAL
    (void)posix_fadvise(c->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
    int r = csv_next(c, err, errlen);
    if (r <= 0) {
        csv_close(c);
        return r < 0 ? -1
                     : csv_errf(err, errlen, "%s: empty file (expected the header '%s')", path,
                                header);
    }
    /* rebuild the header to compare it */
    char got[512] = "";
    for (int i = 0; i < c->nf; i++) {
        strncat(got, c->fields[i], sizeof(got) - strlen(got) - 2);
        if (i + 1 < c->nf)
            strncat(got, ",", sizeof(got) - strlen(got) - 1);
    }
    if (strncmp(got, header, strlen(header)) != 0) {
        csv_close(c);
        return csv_errf(err, errlen, "%s: line 1: expected the header '%s', found '%s'", path,
                        header, got);
    }
    return 0;
}

/* '0'..'9' (isdigit, without the locale table's lookup per character). */
static inline bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

int csv_parse_ceil(const char *s, int64_t div, int64_t *out)
{
    const char *p = s;
    while (*p == ' ')
        p++;
    if (!is_digit(*p))
        return -1;
    int64_t ip = 0;
    /* before its 17th digit a number is below 10^16 < 2^55: the check starts after it */
    for (const char *d0 = p; is_digit(*p) && p - d0 < 17; p++)
        ip = ip * 10 + (*p - '0');
    while (is_digit(*p)) {
        if (ip > (INT64_C(1) << 55))
            return -1;
        ip = ip * 10 + (*p - '0');
        p++;
    }
    bool frac = false;
    if (*p == '.') {
        p++;
        if (!is_digit(*p))
            return -1;
        while (is_digit(*p)) {
            frac = frac || *p != '0';
            p++;
        }
    }
    while (*p == ' ')
        p++;
    if (*p != '\0')
        return -1;
    /* ceil((ip + frac?) / div): a fractional part only ever rounds up */
    int64_t q = ip / div, r = ip % div;
    *out = q + ((r > 0 || frac) ? 1 : 0);
    return 0;
}

int csv_parse_int(const char *s, int64_t *out)
{
    /* the common case, 1 to 18 digits, without strtoll */
    int64_t v = 0;
    const char *p = s;
    while (*p >= '0' && *p <= '9' && p - s < 18)
        v = v * 10 + (*p++ - '0');
    if (*p == '\0' && p > s) {
        *out = v;
        return 0;
    }
    char *end;
    errno = 0;
    long long w = strtoll(s, &end, 10);
    if (end == s || *end != '\0' || errno != 0 || w < 0)
        return -1;
    *out = w;
    return 0;
}
