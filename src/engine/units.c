/* units.c - exact conversion of typed ratios, sizes and pools to integers (no floating point) */
#include "oversub/units.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "oversub/errors.h"
#include "internal.h"

__extension__ typedef unsigned __int128 osub_u128;

/* Parses "123.456" into an integer part and up to `max_frac` fractional digits, scaled by
 * 10^max_frac. Returns the number of characters consumed, 0 on no digits, -1 on overflow,
 * and sets *extra_nonzero when digits beyond max_frac were not all zero. */
static int parse_decimal(const char *s, int max_frac, osub_u128 *scaled, int *extra_nonzero,
                         int *frac_digits)
{
    const char *p = s;
    int64_t ip = 0;
    int any = 0;
    *extra_nonzero = 0;
    *frac_digits = 0;
    while (isdigit((unsigned char)*p)) {
        if (ip > (INT64_C(1) << 40))
            return -1;
        ip = ip * 10 + (*p - '0');
        p++;
        any = 1;
    }
    int64_t frac = 0;
    int nf = 0;
    if (*p == '.') {
        p++;
        while (isdigit((unsigned char)*p)) {
            if (nf < max_frac) {
                frac = frac * 10 + (*p - '0');
                nf++;
            } else if (*p != '0') {
                *extra_nonzero = 1;
            }
            (*frac_digits)++;
            p++;
            any = 1;
        }
    }
    if (!any)
        return 0;
    for (int i = nf; i < max_frac; i++)
        frac *= 10;
    /* in 128 bits: ip (< 2^44) times 10^9 does not fit in 64 (issue 23: "18446744074GiB"
     * wrapped to 298 MiB) */
    osub_u128 scale = 1;
    for (int i = 0; i < max_frac; i++)
        scale *= 10;
    *scaled = (osub_u128)ip * scale + (osub_u128)frac;
    return (int)(p - s);
}

int osub_parse_ratio(const char *s, int32_t *milli_out)
{
    if (s == NULL || milli_out == NULL)
        return OSUB_EINVAL;
    while (isspace((unsigned char)*s))
        s++;
    osub_u128 v;
    int extra, nfrac;
    int n = parse_decimal(s, 3, &v, &extra, &nfrac);
    if (n <= 0)
        return OSUB_EBAD_RATIO;
    const char *rest = s + n;
    if (*rest == 'x' || *rest == 'X')
        rest++;
    while (isspace((unsigned char)*rest))
        rest++;
    if (*rest != '\0')
        return OSUB_EBAD_RATIO;
    if (extra || nfrac > 3) {
        /* "1.3000" is still three decimals' worth; only non-zero digits beyond are refused */
        if (extra)
            return OSUB_ERATIO_PRECISION;
    }
    if (v < 1000 || v > 100000)
        return OSUB_ERATIO_RANGE;
    *milli_out = (int32_t)v;
    return 0;
}

void osub_format_ratio(int32_t milli, char *buf, size_t len)
{
    int32_t ip = milli / 1000, fp = milli % 1000;
    if (fp == 0)
        snprintf(buf, len, "%d", ip);
    else if (fp % 100 == 0)
        snprintf(buf, len, "%d.%d", ip, fp / 100);
    else if (fp % 10 == 0)
        snprintf(buf, len, "%d.%02d", ip, fp / 10);
    else
        snprintf(buf, len, "%d.%03d", ip, fp);
}

struct unit {
    const char *name;
    int64_t num; /* bytes per unit = num / den, exact */
};

static const struct unit units[] = {
    {"", 1048576},         {"mib", 1048576},      {"mi", 1048576},   {"m", 1048576},
    {"gib", 1073741824},   {"gi", 1073741824},    {"g", 1073741824}, {"tib", 1099511627776},
    {"ti", 1099511627776}, {"kib", 1024},         {"ki", 1024},      {"mb", 1000000},
    {"gb", 1000000000},    {"tb", 1000000000000}, {"kb", 1000},      {"b", 1},
};

int osub_parse_size_mib(const char *s, int allow_zero, int64_t *mib_out)
{
    if (s == NULL || mib_out == NULL)
        return OSUB_EINVAL;
    while (isspace((unsigned char)*s))
        s++;
    osub_u128 v; /* value x 10^9 */
    int extra, nfrac;
    int n = parse_decimal(s, 9, &v, &extra, &nfrac);
    if (n <= 0 || extra)
        return OSUB_EBAD_SIZE;
    const char *u = s + n;
    while (*u == ' ')
        u++;
    char ub[8];
    size_t ul = strlen(u);
    while (ul > 0 && isspace((unsigned char)u[ul - 1]))
        ul--;
    if (ul >= sizeof(ub))
        return OSUB_EBAD_SIZE;
    memcpy(ub, u, ul);
    ub[ul] = '\0';
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcasecmp(ub, units[i].name) != 0)
            continue;
        /* bytes = v * num / 1e9; MiB = ceil(bytes / 2^20) -- in 128-bit to stay exact */
        osub_u128 bytes_num = (osub_u128)v * (osub_u128)units[i].num;
        osub_u128 den = (osub_u128)1000000000 * 1048576;
        osub_u128 mib = (bytes_num + den - 1) / den;
        if (mib > (osub_u128)(INT64_C(1) << 40))
            return OSUB_EBAD_SIZE;
        if (mib == 0 && !allow_zero)
            return OSUB_EBAD_SIZE;
        *mib_out = (int64_t)mib;
        return 0;
    }
    return OSUB_EBAD_SIZE;
}

struct alias {
    const char *name;
    int64_t mib;
};

static const struct alias gpu_aliases[] = {
    {"A100-80GB", 81920}, {"A100-40GB", 40960}, {"H100-80GB", 81920}, {"H100", 81920},
    {"H200", 143771},     {"L40S", 46068},      {"L4", 23034},        {"A10", 23028},
    {"V100-32GB", 32768}, {"V100-16GB", 16384}, {"T4", 15360},        {"A30", 24576},
};

int osub_parse_gpu_size(const char *s, int64_t *mib_out)
{
    if (s == NULL || mib_out == NULL)
        return OSUB_EINVAL;
    for (size_t i = 0; i < sizeof(gpu_aliases) / sizeof(gpu_aliases[0]); i++) {
        if (strcasecmp(s, gpu_aliases[i].name) == 0) {
            *mib_out = gpu_aliases[i].mib;
            return 0;
        }
    }
    int64_t v;
    if (osub_parse_size_mib(s, 0, &v) != 0 || v > (INT64_C(1) << 24))
        return OSUB_EBAD_POOL;
    *mib_out = v;
    return 0;
}

int osub_parse_pool(const char *s, int64_t *vram_out, size_t cap, size_t *n_out)
{
    if (s == NULL || vram_out == NULL || n_out == NULL)
        return OSUB_EINVAL;
    size_t n = 0;
    const char *p = s;
    if (*p == '\0')
        return OSUB_EBAD_POOL;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char part[64];
        if (len == 0 || len >= sizeof(part))
            return OSUB_EBAD_POOL;
        memcpy(part, p, len);
        part[len] = '\0';
        char *x = strchr(part, 'x');
        if (x == NULL)
            x = strchr(part, 'X');
        if (x == NULL || x == part)
            return OSUB_EBAD_POOL;
        *x = '\0';
        for (char *c = part; *c; c++)
            if (!isdigit((unsigned char)*c))
                return OSUB_EBAD_POOL;
        if (strlen(part) > 4)
            return OSUB_EBAD_POOL;
        long count = strtol(part, NULL, 10);
        int64_t mib;
        if (count <= 0 || osub_parse_gpu_size(x + 1, &mib) != 0)
            return OSUB_EBAD_POOL;
        if (n + (size_t)count > 4096 || n + (size_t)count > cap)
            return OSUB_EBAD_POOL;
        for (long i = 0; i < count; i++)
            vram_out[n++] = mib;
        p += len;
        if (*p == ',') {
            p++;
            if (*p == '\0')
                return OSUB_EBAD_POOL;
        }
    }
    *n_out = n;
    return 0;
}
