/* jsonmem.h - jansson's allocations watched: a dump made while one of them failed is no dump.
 * jansson 2.14 drops what it cannot allocate in a dump (an object key, say) and still returns a
 * string; a command logged from it would not load again. */
#ifndef OSUBD_JSONMEM_H
#define OSUBD_JSONMEM_H

#include <stddef.h>

#include <jansson.h>

/* Routes jansson's allocations through a watcher (once, before any JSON is made). */
void osubd_json_init(void);

/* json_dumps, or NULL when it failed or any allocation failed while it ran (in this thread). */
char *osubd_json_dumps(const json_t *j, size_t flags);

#endif
