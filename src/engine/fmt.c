/* fmt.c - the engine's bounded formatting: snprintf's contract for the conversions its event
 * sentences use, without stdio's per-call setup */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* What has been written so far: at most len - 1 bytes land in p; n counts them all, as
 * snprintf's return value does. */
struct fmt_out {
    char *p;
    size_t len, n;
};

static void put(struct fmt_out *o, const char *s, size_t k)
{
    if (o->n < o->len) {
        size_t room = o->len - 1 - o->n;
        memcpy(o->p + o->n, s, k < room ? k : room);
    }
    o->n += k;
}

static void put_u(struct fmt_out *o, unsigned long long v, bool neg)
{
    char d[24];
    size_t i = sizeof(d);
    do {
        d[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    if (neg)
        d[--i] = '-';
    put(o, d + i, sizeof(d) - i);
}

static void put_s(struct fmt_out *o, long long v)
{
    /* the magnitude in unsigned arithmetic: LLONG_MIN has no positive counterpart */
    put_u(o, v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v, v < 0);
}

/* One conversion at f (just past its '%'): returns the character after it, or NULL when it is
 * one this formatter does not do (flags, widths, precisions, floating point...). */
static const char *convert(struct fmt_out *o, const char *f, va_list *ap)
{
    int longs = 0;
    bool size = false;
    while (*f == 'l' && longs < 2) {
        longs++;
        f++;
    }
    if (longs == 0 && *f == 'z') {
        size = true;
        f++;
    }
    switch (*f) {
    case 'd':
    case 'i':
        if (size)
            return NULL; /* %zd: ssize_t, not needed */
        put_s(o, longs == 2   ? va_arg(*ap, long long)
                 : longs == 1 ? va_arg(*ap, long)
                              : va_arg(*ap, int));
        return f + 1;
    case 'u':
        put_u(o,
              size         ? va_arg(*ap, size_t)
              : longs == 2 ? va_arg(*ap, unsigned long long)
              : longs == 1 ? va_arg(*ap, unsigned long)
                           : va_arg(*ap, unsigned int),
              false);
        return f + 1;
    case 's': {
        if (longs || size)
            return NULL;
        const char *s = va_arg(*ap, const char *);
        if (s == NULL)
            s = "(null)"; /* as glibc prints it */
        put(o, s, strlen(s));
        return f + 1;
    }
    case 'c':
        if (longs || size)
            return NULL;
        {
            char c = (char)va_arg(*ap, int);
            put(o, &c, 1);
        }
        return f + 1;
    case '%':
        if (longs || size)
            return NULL;
        put(o, "%", 1);
        return f + 1;
    default:
        return NULL;
    }
}

int osub__vfmt(char *buf, size_t len, const char *fmt, va_list ap)
{
    struct fmt_out o = {.p = buf, .len = len, .n = 0};
    va_list ap2, cp;
    va_copy(ap2, ap);
    va_copy(cp, ap);
    const char *f = fmt;
    while (*f != '\0') {
        const char *pct = strchr(f, '%');
        if (pct == NULL) {
            put(&o, f, strlen(f));
            break;
        }
        put(&o, f, (size_t)(pct - f));
        f = convert(&o, pct + 1, &cp);
        if (f == NULL) {
            /* a conversion it does not do: stdio does the whole string */
            va_end(cp);
            int rc = vsnprintf(buf, len, fmt, ap2);
            va_end(ap2);
            return rc;
        }
    }
    va_end(cp);
    va_end(ap2);
    if (len > 0)
        buf[o.n < len ? o.n : len - 1] = '\0';
    return (int)o.n;
}

int osub__fmt(char *buf, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = osub__vfmt(buf, len, fmt, ap);
    va_end(ap);
    return rc;
}
