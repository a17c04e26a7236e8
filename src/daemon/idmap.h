/* idmap.h - a table from service id to a module's typed record: each daemon module keeps its
 * per-service state in one (routes, processes, directives), serialised only when saved */
#ifndef OSUB_IDMAP_H
#define OSUB_IDMAP_H

#include <stdbool.h>
#include <stddef.h>

#include "oversub/engine.h"

struct osubd__idmap;

/* free_val frees a record (NULL: records are not freed). NULL on out of memory. */
struct osubd__idmap *osubd__idmap_new(void (*free_val)(void *));
void osubd__idmap_free(struct osubd__idmap *m);
void *osubd__idmap_get(const struct osubd__idmap *m, const char *id);
/* Sets id's record, freeing the one it replaces. -1 on out of memory (val not taken) or an id
 * longer than OSUB_ID_MAX. */
int osubd__idmap_put(struct osubd__idmap *m, const char *id, void *val);
/* Removes and frees id's record; false when there was none. */
bool osubd__idmap_del(struct osubd__idmap *m, const char *id);
size_t osubd__idmap_count(const struct osubd__idmap *m);
/* Iteration: slots 0..osubd__idmap_slots()-1, each empty (NULL) or an id with its record. Do
 * not put or delete while iterating (a deletion moves entries): take osubd__idmap_keys(). */
size_t osubd__idmap_slots(const struct osubd__idmap *m);
const char *osubd__idmap_at(const struct osubd__idmap *m, size_t slot, void **val);
/* The ids, copied (malloc'd array of *n ids; NULL with *n = 0 when empty or out of memory). */
typedef char osubd__idmap_key_t[OSUB_ID_MAX + 1];
osubd__idmap_key_t *osubd__idmap_keys(const struct osubd__idmap *m, size_t *n);

#endif
