/* sim_int.h - what the simulator's files share (sim.c: the engine's replay and the figures;
 * sim_ref.c: the policies it is compared with): not for the CLI */
#ifndef OSUB_CLI_SIM_INT_H
#define OSUB_CLI_SIM_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "sim.h"
#include "trace.h"

/* The level of a class name: online 0, batch 1, anything else (experiment) 2. */
static inline int sim__level_of(const char *cls)
{
    return strcmp(cls, "online") == 0 ? 0 : strcmp(cls, "batch") == 0 ? 1 : 2;
}

/* ---- per-service run state --------------------------------------------------------- */

enum rs { RS_FUTURE = 0, RS_WAITING, RS_PLACED, RS_GONE };

struct run_svc {
    enum rs st;
    size_t cur;         /* sample cursor */
    int64_t wait_since; /* s, when waiting to (re)start; -1 if not */
    bool started_once;
    bool refused_p0;
    /* the engine refused it as larger than any GPU, or than the pool (osub__empty_pool_fit:
     * a check of the spec against the pool alone that changes nothing): not asked again */
    bool never_fits;
    size_t reported_k; /* step + 1 of its last usage report */
};

/* Service ids to their index in the trace (the keys are the trace's, borrowed). */
struct idmap {
    const char **keys;
    int32_t *vals;
    size_t cap;
};

int sim__idmap_init(struct idmap *m, const struct trace *tr);  /* 0, or -1: out of memory */
int32_t sim__idmap_get(const struct idmap *m, const char *id); /* -1: unknown */
void sim__idmap_free(struct idmap *m);

/* Shared bookkeeping of one run. */
struct acc {
    double used_sum, held_sum, logical_sum;
    double *used; /* per step, for the p95 (and the plot) */
    double *held;
    uint32_t *events;
    size_t steps;
    int64_t demand, unmet;
    double lost_min;
    int64_t wait_max, wait_total, wait_n;
};

/* The figures of a run from its bookkeeping, and whether it met the budgets; the series go to
 * r when keep (else they are freed). */
void sim__finish(const struct trace *tr, const struct sim_budget *b, struct acc *a,
                 struct sim_result *r, bool keep);
/* The end of a replay: who never started, who is still waiting, then sim__finish. */
void sim__end_run(const struct trace *tr, const struct sim_budget *b, struct acc *a,
                  struct run_svc *rs, struct sim_result *r, bool timeline);
/* A wait that ends at t (s), if rs was waiting. */
void sim__note_wait(struct acc *a, struct run_svc *rs, int64_t t);
size_t sim__n_steps(const struct trace *tr);
/* Latest sample at or before t (advances the cursor). Returns the demand, -1 if not active. */
int64_t sim__demand_at(const struct trace_svc *s, struct run_svc *rs, int64_t t);
/* Every 64 steps: a progress line when one is due. */
void sim__step_progress(struct progress *pg, const struct sim_opts *o, size_t k, size_t steps);

/* The reference policies (sim_ref.c). */
int sim__brief(const struct trace *tr, const struct sim_opts *o, const struct sim_budget *b,
               struct sim_result *r, struct progress *pg, char *err, size_t errlen);
int sim__hindsight(const struct trace *tr, const struct sim_opts *o, const struct sim_budget *b,
                   struct sim_result *r, char *err, size_t errlen);

#endif
