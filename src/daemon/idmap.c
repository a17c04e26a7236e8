/* idmap.c - open addressing with linear probing and backward-shift deletion, keyed by id */
#include "idmap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct ent {
    char id[OSUB_ID_MAX + 1];
    void *val; /* NULL: empty slot */
};

struct osubd__idmap {
    struct ent *tab;
    size_t cap, n; /* cap: a power of two */
    void (*free_val)(void *);
};

static uint64_t hash(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

struct osubd__idmap *osubd__idmap_new(void (*free_val)(void *))
{
    struct osubd__idmap *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return NULL;
    m->cap = 16;
    m->tab = calloc(m->cap, sizeof(*m->tab));
    if (m->tab == NULL) {
        free(m);
        return NULL;
    }
    m->free_val = free_val;
    return m;
}

void osubd__idmap_free(struct osubd__idmap *m)
{
    if (m == NULL)
        return;
    for (size_t i = 0; i < m->cap; i++)
        if (m->tab[i].val != NULL && m->free_val != NULL)
            m->free_val(m->tab[i].val);
    free(m->tab);
    free(m);
}

static size_t find(const struct osubd__idmap *m, const char *id)
{
    size_t i = (size_t)hash(id) & (m->cap - 1);
    while (m->tab[i].val != NULL && strcmp(m->tab[i].id, id) != 0)
        i = (i + 1) & (m->cap - 1);
    return i;
}

void *osubd__idmap_get(const struct osubd__idmap *m, const char *id)
{
    return id != NULL ? m->tab[find(m, id)].val : NULL;
}

static int grow(struct osubd__idmap *m)
{
    size_t cap = m->cap * 2;
    struct ent *t = calloc(cap, sizeof(*t));
    if (t == NULL)
        return -1;
    struct ent *old = m->tab;
    size_t oc = m->cap;
    m->tab = t;
    m->cap = cap;
    for (size_t i = 0; i < oc; i++)
        if (old[i].val != NULL)
            m->tab[find(m, old[i].id)] = old[i];
    free(old);
    return 0;
}

int osubd__idmap_put(struct osubd__idmap *m, const char *id, void *val)
{
    if (id == NULL || val == NULL || strlen(id) > OSUB_ID_MAX)
        return -1;
    size_t i = find(m, id);
    if (m->tab[i].val != NULL) {
        if (m->tab[i].val != val && m->free_val != NULL)
            m->free_val(m->tab[i].val);
        m->tab[i].val = val;
        return 0;
    }
    if ((m->n + 1) * 4 > m->cap * 3) {
        if (grow(m) != 0)
            return -1;
        i = find(m, id);
    }
    memcpy(m->tab[i].id, id, strlen(id) + 1);
    m->tab[i].val = val;
    m->n++;
    return 0;
}

bool osubd__idmap_del(struct osubd__idmap *m, const char *id)
{
    size_t i = find(m, id);
    if (m->tab[i].val == NULL)
        return false;
    if (m->free_val != NULL)
        m->free_val(m->tab[i].val);
    m->tab[i].val = NULL;
    m->n--;
    /* shift back the entries of the run after i that would no longer be found */
    size_t j = i;
    for (;;) {
        j = (j + 1) & (m->cap - 1);
        if (m->tab[j].val == NULL)
            break;
        size_t home = (size_t)hash(m->tab[j].id) & (m->cap - 1);
        /* j's entry may stay unless its home lies cyclically in (i, j] */
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (stays)
            continue;
        m->tab[i] = m->tab[j];
        m->tab[j].val = NULL;
        i = j;
    }
    return true;
}

size_t osubd__idmap_count(const struct osubd__idmap *m)
{
    return m->n;
}

size_t osubd__idmap_slots(const struct osubd__idmap *m)
{
    return m->cap;
}

const char *osubd__idmap_at(const struct osubd__idmap *m, size_t slot, void **val)
{
    if (slot >= m->cap || m->tab[slot].val == NULL)
        return NULL;
    if (val != NULL)
        *val = m->tab[slot].val;
    return m->tab[slot].id;
}

osubd__idmap_key_t *osubd__idmap_keys(const struct osubd__idmap *m, size_t *n)
{
    *n = 0;
    if (m->n == 0)
        return NULL;
    osubd__idmap_key_t *k = malloc(m->n * sizeof(*k));
    if (k == NULL)
        return NULL;
    for (size_t i = 0; i < m->cap; i++)
        if (m->tab[i].val != NULL)
            memcpy(k[(*n)++], m->tab[i].id, sizeof(*k));
    return k;
}
