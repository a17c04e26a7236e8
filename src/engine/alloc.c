/* alloc.c - the engine's allocations, with a switch that makes the nth one fail (for tests) */
#define _POSIX_C_SOURCE 200809L
#define OSUB_ALLOC_IMPL
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static long alloc_count;
static long fail_at = -1;

static bool fails(void)
{
    long n = alloc_count++;
    return fail_at >= 0 && n >= fail_at;
}

void *osub__malloc(size_t n)
{
    return fails() ? NULL : malloc(n);
}

void *osub__calloc(size_t n, size_t size)
{
    return fails() ? NULL : calloc(n, size);
}

void *osub__realloc(void *p, size_t n)
{
    return fails() ? NULL : realloc(p, n);
}

char *osub__strdup(const char *s)
{
    return fails() ? NULL : strdup(s);
}

long osub__alloc_fail_at(long n)
{
    long made = alloc_count;
    alloc_count = 0;
    fail_at = n;
    return made;
}
