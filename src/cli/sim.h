/* sim.h - replay usage traces through the engine (and the comparison policies) offline */
#ifndef OSUB_CLI_SIM_H
#define OSUB_CLI_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

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
    /* static, oversub: every engine event and every OOM of the run, a JSON object a line
     * (--events FILE); NULL: none */
    FILE *events;
};

struct sim_budget {
    int32_t evict_budget_per_week; /* P1+P2 evictions a week (5) */
    int32_t unmet_budget_milli;    /* unmet demand / all demand, thousandths (10 = 1%) */
    int64_t max_wait_s;            /* no service waits longer to start (300) */
    /* the engine's prediction settings for the replay (0: the engine's defaults) */
    int64_t trust_ms;       /* prediction_trust_ms */
    int64_t floor_start_ms; /* floor_start_after_ms; -1: never */
    /* the pool's host budget for suspended services (suspend_host_mib), used when a service of
     * the trace is suspendable (sim_mark_suspend, or its own spec): -1 the pool's VRAM, 0 none */
    int64_t suspend_host_mib;
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
    /* suspend: the engine's decisions by level (counted apart from evictions), its wakes, the
     * part of lost_service_minutes spent suspending, suspended or resuming (to the ms), the
     * longest suspension, and beside them what evictions cost (to the ms, from the decision
     * until the service ran again, loaded); suspend_on: the run had suspendable services and a
     * host budget */
    uint64_t suspends[3], wakes;
    uint64_t migrations;  /* of the evictions: suspended services restarted elsewhere */
    uint64_t relocations; /* of the wakes: onto another GPU from the checkpoint (no reload) */
    double suspends_per_week[3];
    double suspend_lost_minutes;
    double suspend_transit_minutes; /* of which moving: suspend decision to done, wake to back */
    double evict_lost_minutes; /* from each eviction until it ran again loaded (not in lost_min) */
    int64_t max_suspended_s;
    bool suspend_on;
    double unmet_fraction;
    double lost_service_minutes; /* to eviction, queueing, restarts and suspends */
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

/* Keeps the floor (min_vram_mib, min_batch_size) of the trace's batch and experiment services
 * that answer a degrade, milli of 1000 of them (1000: all, 0: none, else picked by FNV-1a 64
 * of "degrade:" + id, modulo 1000, below milli), and drops the others' (what a spec for vLLM,
 * SGLang or a PyTorch job declares: they never answer one). Returns how many keep a floor. */
size_t sim_mark_degrade(struct trace *tr, int32_t milli);
/* Marks the trace's preemptible services (batch and experiment, not exclusive) suspendable
 * (method cuda, resume cost by DESIGN.md's default) when sim_suspend_picked(): milli 1000 is
 * all, 0 none, else that share of them picked by a hash of the id; each is expected to keep
 * residual_mib per GPU once suspended (at most its request). Specs that declare suspend
 * already keep theirs. Returns how many services of the trace are suspendable. */
size_t sim_mark_suspend(struct trace *tr, int32_t milli, int64_t residual_mib);
/* Marks the trace's suspendable services of method cuda on one GPU (not exclusive) as
 * relocatable (suspend.relocate: a checkpoint restored onto another GPU of the same chip).
 * Returns how many services of the trace are relocatable. */
size_t sim_mark_relocate(struct trace *tr);
/* Whether service id is among the share milli (of 1000) marked: FNV-1a 64 of "suspend:" + id,
 * modulo 1000, below milli (the salt keeps it apart from the class and --pods hashes). */
bool sim_suspend_picked(const char *id, int32_t milli);

/* ceil(peak over time of the summed demand / gpu_mib). */
int32_t sim_lower_bound(const struct trace *tr, int64_t gpu_mib);

#endif
