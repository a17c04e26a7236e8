/* brief_policy.h - a faithful C transcription of the founding brief's pool-level sample
 * algorithm, defects included, used as the comparison policy by bench/ and simulate */
#ifndef OSUB_BRIEF_POLICY_H
#define OSUB_BRIEF_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * As ../shared/brief/README.md spells it out: pool level only, floats in GB, victims walked
 * highest priority first, logical capacity ignored by allocate, admission despite an
 * unresolved shortage, equal or higher priorities counted as reclaimable by can_allocate,
 * the request added to the pool's actual usage at admission and never taken out.
 * Not thread-safe. Ids are borrowed for the call and copied.
 */
typedef struct brief_pool brief_pool_t;

typedef struct {
    char id[64];
    int priority;
    double request_gb, actual_gb;
    bool preemptible;
    int64_t created;
} brief_service_t;

/* Returns NULL on out of memory. Free with brief_free(). */
brief_pool_t *brief_new(double total_gb, double ratio);
void brief_free(brief_pool_t *p);
bool brief_can_allocate(const brief_pool_t *p, int priority, double request_gb, bool preemptible);
/* Registers the service (caller checked brief_can_allocate first, as the sample does).
 * Preempted services' ids are copied to victims (up to cap); returns their count, or -1 on
 * out of memory or a duplicate id. */
int brief_allocate(brief_pool_t *p, const char *id, int priority, double request_gb,
                   bool preemptible, int64_t created, char (*victims)[64], int cap);
/* Returns -1 for an unknown id. */
int brief_update_usage(brief_pool_t *p, const char *id, double actual_gb);
int brief_release(brief_pool_t *p, const char *id);
double brief_total(const brief_pool_t *p);
double brief_allocated(const brief_pool_t *p);
double brief_actual(const brief_pool_t *p);
double brief_logical(const brief_pool_t *p);
size_t brief_count(const brief_pool_t *p);
/* The i-th live service (unspecified order), NULL past the end. */
const brief_service_t *brief_at(const brief_pool_t *p, size_t i);

#endif
