/* jsonmem.c - see jsonmem.h */
#include "jsonmem.h"

#include <stdbool.h>
#include <stdlib.h>

static _Thread_local bool failed;

static void *watched_malloc(size_t n)
{
    void *p = malloc(n);
    if (p == NULL)
        failed = true;
    return p;
}

void osubd_json_init(void)
{
    json_set_alloc_funcs(watched_malloc, free);
}

char *osubd_json_dumps(const json_t *j, size_t flags)
{
    failed = false;
    char *text = json_dumps(j, flags);
    if (failed) {
        free(text);
        return NULL;
    }
    return text;
}
