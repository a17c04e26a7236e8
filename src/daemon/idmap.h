/* idmap.h - a table from service id to a module's typed record: each daemon module keeps its
 * per-service state in one (routes, processes, directives), serialised only when saved */
#ifndef OSUB_IDMAP_H
#define OSUB_IDMAP_H

#include <stdbool.h>
#include <stddef.h>

#include "oversub/engine.h"

struct osub_idmap;

/* free_val frees a record (NULL: records are not freed). NULL on out of memory. */
struct osub_idmap *osub_idmap_new(void (*free_val)(void *));
void osub_idmap_free(struct osub_idmap *m);
void *osub_idmap_get(const struct osub_idmap *m, const char *id);
/* Sets id's record, freeing the one it replaces. -1 on out of memory (val not taken) or an id
 * longer than OSUB_ID_MAX. */
int osub_idmap_put(struct osub_idmap *m, const char *id, void *val);
/* Removes and frees id's record; false when there was none. */
bool osub_idmap_del(struct osub_idmap *m, const char *id);
size_t osub_idmap_count(const struct osub_idmap *m);
/* Iteration: slots 0..osub_idmap_slots()-1, each empty (NULL) or an id with its record. Do
 * not put or delete while iterating (a deletion moves entries): take osub_idmap_keys(). */
size_t osub_idmap_slots(const struct osub_idmap *m);
const char *osub_idmap_at(const struct osub_idmap *m, size_t slot, void **val);
/* The ids, copied (malloc'd array of *n ids; NULL with *n = 0 when empty or out of memory). */
typedef char osub_idmap_key_t[OSUB_ID_MAX + 1];
osub_idmap_key_t *osub_idmap_keys(const struct osub_idmap *m, size_t *n);

#endif
