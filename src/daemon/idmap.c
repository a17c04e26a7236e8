/* idmap.c - open addressing with linear probing and backward-shift deletion, keyed by id */
#include "idmap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct ent {
    char id[OSUB_ID_MAX + 1];
    void *val; /* NULL: empty slot */
};

struct osub_idmap {
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

struct osub_idmap *osub_idmap_new(void (*free_val)(void *))
{
    struct osub_idmap *m = calloc(1, sizeof(*m));
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

void osub_idmap_free(struct osub_idmap *m)
{
    if (m == NULL)
        return;
    for (size_t i = 0; i < m->cap; i++)
        if (m->tab[i].val != NULL && m->free_val != NULL)
            m->free_val(m->tab[i].val);
    free(m->tab);
    free(m);
}

static size_t find(const struct osub_idmap *m, const char *id)
{
    size_t i = (size_t)hash(id) & (m->cap - 1);
    while (m->tab[i].val != NULL && strcmp(m->tab[i].id, id) != 0)
        i = (i + 1) & (m->cap - 1);
    return i;
}

void *osub_idmap_get(const struct osub_idmap *m, const char *id)
{
    return id != NULL ? m->tab[find(m, id)].val : NULL;
}

static int grow(struct osub_idmap *m)
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

int osub_idmap_put(struct osub_idmap *m, const char *id, void *val)
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

bool osub_idmap_del(struct osub_idmap *m, const char *id)
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

size_t osub_idmap_count(const struct osub_idmap *m)
{
    return m->n;
}

size_t osub_idmap_slots(const struct osub_idmap *m)
{
    return m->cap;
}

const char *osub_idmap_at(const struct osub_idmap *m, size_t slot, void **val)
{
    if (slot >= m->cap || m->tab[slot].val == NULL)
        return NULL;
    if (val != NULL)
        *val = m->tab[slot].val;
    return m->tab[slot].id;
}

osub_idmap_key_t *osub_idmap_keys(const struct osub_idmap *m, size_t *n)
{
    *n = 0;
    if (m->n == 0)
        return NULL;
    osub_idmap_key_t *k = malloc(m->n * sizeof(*k));
    if (k == NULL)
        return NULL;
    for (size_t i = 0; i < m->cap; i++)
        if (m->tab[i].val != NULL)
            memcpy(k[(*n)++], m->tab[i].id, sizeof(*k));
    return k;
}
