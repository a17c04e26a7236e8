/* brief_policy.c - the founding brief's sample algorithm, transcribed with its defects */
#include "brief_policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct brief_pool {
    double total, ratio, logical, allocated, actual;
    brief_service_t *svcs;
    size_t n, cap;
    int32_t *tab; /* open addressing: index+1 into svcs, 0 empty */
    size_t tab_cap;
};

static uint64_t hash(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;
    }
    return h;
}

static size_t find_slot(const brief_pool_t *p, const char *id)
{
    size_t m = p->tab_cap - 1;
    size_t i = hash(id) & m;
    while (p->tab[i] != 0 && strcmp(p->svcs[p->tab[i] - 1].id, id) != 0)
        i = (i + 1) & m;
    return i;
}

static int rehash(brief_pool_t *p, size_t cap)
{
    int32_t *t = calloc(cap, sizeof(*t));
    if (t == NULL)
        return -1;
    free(p->tab);
    p->tab = t;
    p->tab_cap = cap;
    for (size_t i = 0; i < p->n; i++)
        p->tab[find_slot(p, p->svcs[i].id)] = (int32_t)(i + 1);
    return 0;
}

brief_pool_t *brief_new(double total_gb, double ratio)
{
    brief_pool_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    p->total = total_gb;
    p->ratio = ratio;
    p->logical = total_gb * ratio;
    if (rehash(p, 64) != 0) {
        free(p);
        return NULL;
    }
    return p;
}

void brief_free(brief_pool_t *p)
{
    if (p == NULL)
        return;
    free(p->svcs);
    free(p->tab);
    free(p);
}

bool brief_can_allocate(const brief_pool_t *p, int priority, double request_gb, bool preemptible)
{
    (void)priority;
    (void)preemptible;
    if (p->allocated + request_gb > p->logical) {
        double reclaim = 0; /* defect: every preemptible service, whatever its priority */
        for (size_t i = 0; i < p->n; i++)
            if (p->svcs[i].preemptible)
                reclaim += p->svcs[i].request_gb;
        return p->allocated - reclaim + request_gb <= p->logical;
    }
    double free_gb = p->total - p->actual;
    if (request_gb > free_gb) {
        double act = 0;
        for (size_t i = 0; i < p->n; i++)
            if (p->svcs[i].preemptible)
                act += p->svcs[i].actual_gb;
        if (request_gb > free_gb + act)
            return false;
    }
    return true;
}

static void remove_at(brief_pool_t *p, size_t idx)
{
    brief_service_t *s = &p->svcs[idx];
    p->allocated -= s->request_gb;
    p->actual -= s->actual_gb; /* only the reported usage comes back out */
    size_t m = p->tab_cap - 1;
    size_t i = find_slot(p, s->id);
    p->tab[i] = 0;
    /* backward-shift deletion keeps the probe chains intact */
    for (size_t j = (i + 1) & m; p->tab[j] != 0; j = (j + 1) & m) {
        size_t home = hash(p->svcs[p->tab[j] - 1].id) & m;
        bool move = (i <= j) ? (home <= i || home > j) : (home <= i && home > j);
        if (move) {
            p->tab[i] = p->tab[j];
            p->tab[j] = 0;
            i = j;
        }
    }
    if (idx != p->n - 1) {
        p->svcs[idx] = p->svcs[p->n - 1];
        p->tab[find_slot(p, p->svcs[idx].id)] = (int32_t)(idx + 1);
    }
    p->n--;
}

static int cmp_prio_then_newest(const void *a, const void *b)
{
    const brief_service_t *x = *(const brief_service_t *const *)a;
    const brief_service_t *y = *(const brief_service_t *const *)b;
    if (x->priority != y->priority) /* defect: ascending = highest priority first */
        return x->priority < y->priority ? -1 : 1;
    return (x->created < y->created) - (x->created > y->created);
}

int brief_allocate(brief_pool_t *p, const char *id, int priority, double request_gb,
                   bool preemptible, int64_t created, char (*victims)[64], int cap)
{
    if (p->tab[find_slot(p, id)] != 0)
        return -1;
    int nv = 0;
    double free_gb = p->total - p->actual;
    char(*marked)[64] = NULL;
    size_t n_marked = 0;
    if (request_gb > free_gb) {
        double shortage = request_gb - free_gb;
        brief_service_t **sorted = malloc((p->n + 1) * sizeof(*sorted));
        marked = malloc((p->n + 1) * sizeof(*marked));
        if (sorted == NULL || marked == NULL) {
            free(sorted);
            free(marked);
            return -1;
        }
        for (size_t i = 0; i < p->n; i++)
            sorted[i] = &p->svcs[i];
        qsort(sorted, p->n, sizeof(*sorted), cmp_prio_then_newest);
        for (size_t i = 0; i < p->n && shortage > 0; i++) {
            brief_service_t *s = sorted[i];
            if (s->priority <= priority || !s->preemptible)
                continue;
            snprintf(marked[n_marked++], 64, "%s", s->id);
            shortage -= s->actual_gb;
        }
        free(sorted);
        /* defect: nothing checks that shortage reached 0 */
    }
    if (p->n == p->cap) {
        size_t c = p->cap ? p->cap * 2 : 64;
        brief_service_t *ns = realloc(p->svcs, c * sizeof(*ns));
        if (ns == NULL) {
            free(marked);
            return -1;
        }
        p->svcs = ns;
        p->cap = c;
    }
    if ((p->n + 1) * 2 > p->tab_cap && rehash(p, p->tab_cap * 2) != 0) {
        free(marked);
        return -1;
    }
    brief_service_t *s = &p->svcs[p->n];
    memset(s, 0, sizeof(*s));
    snprintf(s->id, sizeof(s->id), "%s", id);
    s->priority = priority;
    s->request_gb = request_gb;
    s->actual_gb = 0; /* defect: its own usage starts at 0 ... */
    s->preemptible = preemptible;
    s->created = created;
    p->tab[find_slot(p, id)] = (int32_t)(p->n + 1);
    p->n++;
    p->allocated += request_gb; /* defect: logical capacity is not checked here */
    p->actual += request_gb;    /* ... while the pool counts the request as used, for ever */
    for (size_t i = 0; i < n_marked; i++) {
        size_t slot = find_slot(p, marked[i]);
        if (p->tab[slot] == 0)
            continue;
        if (nv < cap)
            snprintf(victims[nv], 64, "%s", marked[i]);
        nv++;
        remove_at(p, (size_t)(p->tab[slot] - 1));
    }
    free(marked);
    return nv;
}

int brief_update_usage(brief_pool_t *p, const char *id, double actual_gb)
{
    size_t slot = find_slot(p, id);
    if (p->tab[slot] == 0)
        return -1;
    brief_service_t *s = &p->svcs[p->tab[slot] - 1];
    p->actual += actual_gb - s->actual_gb;
    s->actual_gb = actual_gb;
    return 0;
}

int brief_release(brief_pool_t *p, const char *id)
{
    size_t slot = find_slot(p, id);
    if (p->tab[slot] == 0)
        return -1;
    remove_at(p, (size_t)(p->tab[slot] - 1));
    return 0;
}

double brief_total(const brief_pool_t *p)
{
    return p->total;
}
double brief_allocated(const brief_pool_t *p)
{
    return p->allocated;
}
double brief_actual(const brief_pool_t *p)
{
    return p->actual;
}
double brief_logical(const brief_pool_t *p)
{
    return p->logical;
}
size_t brief_count(const brief_pool_t *p)
{
    return p->n;
}
const brief_service_t *brief_at(const brief_pool_t *p, size_t i)
{
    return i < p->n ? &p->svcs[i] : NULL;
}
