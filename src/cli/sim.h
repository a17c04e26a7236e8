/* sim.h - replay usage traces through the engine (and the comparison policies) offline */
#ifndef OSUB_CLI_SIM_H
#define OSUB_CLI_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trace.h"

enum sim_policy { POL_STATIC = 0, POL_BRIEF, POL_OVERSUB, POL_HINDSIGHT, POL__COUNT };

const char *sim_policy_name(enum sim_policy p);

struct sim_opts {
    enum sim_policy policy;
    int32_t ratio_milli;
    const int64_t *pool; /* GPU sizes, MiB */
    size_t n_pool;
    bool timeline; /* keep per-step series (for plots) */
    /* static, oversub: compare the replay's view of every service and GPU with the engine's
     * answer at each use, counting differences in sim_result.verify_mismatches (slow; tests) */
    bool verify;
};

struct sim_budget {
    int32_t evict_budget_per_week; /* P1+P2 evictions a week (5) */
    int32_t unmet_budget_milli;    /* unmet demand / all demand, thousandths (10 = 1%) */
    int64_t max_wait_s;            /* no service waits longer to start (300) */
    /* the engine's prediction settings for the replay (0: the engine's defaults) */
    int64_t trust_ms;       /* prediction_trust_ms */
    int64_t floor_start_ms; /* floor_start_after_ms; -1: never */
};

struct sim_result {
    enum sim_policy policy;
    int32_t ratio_milli;
    int32_t n_gpus;
    int64_t samples, steps;
    double span_days;
    double mean_used_util, p95_used_util, mean_held_util, mean_logical_util;
    uint64_t oom_events;                /* GPU-steps whose real demand exceeded the GPU's VRAM */
    uint64_t p0_disruptions;            /* online services refused, delayed, degraded or evicted */
    uint64_t degrades[3], evictions[3]; /* by level: online, batch, experiment */
    double degrades_per_week[3], evictions_per_week[3];
    double unmet_fraction;
    double lost_service_minutes; /* to eviction, queueing and restarts */
    int64_t max_wait_s;
    double mean_wait_s;
    uint32_t never_started;
    uint32_t too_big;      /* services whose request (hindsight: whose peak) fits no GPU at all */
    int64_t service_steps; /* steps on the replay's grid with a service present */
    bool feasible;         /* within the budgets */
    const char *why_infeasible;
    /* timeline, when asked for */
    double *used_series, *held_series;
    uint32_t *event_series;
    size_t n_series;
    int64_t lower_bound_gpus;   /* hindsight: ceil(peak of the summed demand / VRAM) */
    uint64_t verify_mismatches; /* opts.verify: reads where the replay's view was wrong */
};

/* Runs one policy on one pool. Returns 0, or -1 with a sentence in err. result's series are
 * owned by the caller (sim_result_free). */
int sim_run(const struct trace *tr, const struct sim_opts *o, const struct sim_budget *b,
            struct sim_result *res, char *err, size_t errlen);
void sim_result_free(struct sim_result *r);

/* The smallest number of GPUs of size gpu_mib on which the policy meets the budgets, searched
 * between lo and hi (both inclusive); 0 if none. The result of that run is left in res. */
int32_t sim_min_gpus(const struct trace *tr, enum sim_policy p, int32_t ratio_milli,
                     int64_t gpu_mib, int32_t lo, int32_t hi, const struct sim_budget *b,
                     bool timeline, struct sim_result *res, char *err, size_t errlen);

/* ceil(peak over time of the summed demand / gpu_mib). */
int32_t sim_lower_bound(const struct trace *tr, int64_t gpu_mib);

#endif
