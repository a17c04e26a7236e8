/* internal.h - the engine's private data model, shared by the engine's own files only */
#ifndef OVERSUB_ENGINE_INTERNAL_H
#define OVERSUB_ENGINE_INTERNAL_H

#include <stdint.h>

#include "oversub/engine.h"

__extension__ typedef __int128 osub_i128;
__extension__ typedef unsigned __int128 osub_u128;

#define OSUB__HIDDEN __attribute__((visibility("hidden")))

enum { T_LOAD = 0, T_DEADLINE = 1, T__KINDS = 2 };

/* One service's presence on one GPU. Invariant: gpu->held includes exactly `held`. */
struct slot {
    int32_t gpu;
    int64_t grant;      /* quota counted against logical capacity */
    int64_t held_grant; /* grant as held sees it (the old one while a directive is unacked) */
    int64_t used;       /* last measured */
    int64_t held;       /* cached result of slot_held() */
};

struct svc {
    osub_spec_t spec;
    uint64_t seq; /* submit order; ties after submit time */
    int32_t level;
    bool backed, preemptible, degradable, requeue_on_evict, queue_ok;
    int64_t full_total, floor_total;
    int32_t full_batch, floor_batch;
    int64_t grace_ms, restart_cost_ms;
    int32_t k;
    int64_t size_mib; /* the GPU size its set must have, 0 = any size with k GPUs */
    struct slot *slots; /* k, in GPU index order when placed */
    int32_t n_slots;    /* 0 unless placed (pending or later) */

    osub_state_t state;
    bool loading, ack_pending, used_capped, resumed, evicted_before;
    int32_t batch;
    int32_t compute_used;
    int64_t submit_ms, since_ms, start_ms, resume_ms;
    int64_t deadline_ms; /* ack deadline or grace end, 0 if none */
    int64_t room_since_ms; /* restore hysteresis; -1 when no room */
    bool overdue_requeued;
    uint32_t n_evictions, n_degrades;
    char checkpoint[128];
    char preemptor[OSUB_ID_MAX + 1]; /* who a directive was for ("" for pressure) */
    int32_t preemptor_level;

    osub_victim_t *waits; /* pending: the victims it waits for */
    int32_t n_waits;

    int32_t heap_pos[T__KINDS];
    int64_t timer_at[T__KINDS];
    uint64_t plan_stamp;
    int32_t plan_idx;

    struct svc *prev, *next; /* live list in submit order */
    osub_slot_info_t *slot_info; /* scratch for service_info */
};

/* A victim candidate on one GPU, as gpu_agg() last saw it (eligible services only, in
 * victim order: level desc, submit desc). */
struct vinfo {
    const struct svc *s;
    int32_t level;
    bool degradable;
    int32_t comp;
    int64_t rg_d, rh_d; /* grant and held a degrade frees */
    int64_t rg_e, rh_e; /* grant and held an eviction frees */
    int64_t restart_ms;
};

struct gpu {
    char name[OSUB_GPU_NAME_MAX + 1];
    int64_t vram, usable, logical;
    int64_t granted, backed, held, used, system;
    int32_t compute_all, compute_backed;
    bool cordoned, lost;
    struct svc *excl; /* exclusive owner */
    struct svc **svcs; /* services placed here, sorted by (level desc, submit desc, seq desc) */
    struct vinfo *vic; /* capsvc entries; the first nvic valid after gpu_agg() */
    int32_t nvic;
    int32_t nsvc, capsvc;
    /* what victims could give back, per level (an upper bound: minimum-runtime protection
     * is ignored), recomputed lazily when agg_dirty; used to prune victim planning */
    bool agg_dirty;
    int64_t ev_held[OSUB_MAX_LEVEL + 1], ev_grant[OSUB_MAX_LEVEL + 1];
    int64_t dg_held[OSUB_MAX_LEVEL + 1], dg_grant[OSUB_MAX_LEVEL + 1];
    int64_t dg_max_held[OSUB_MAX_LEVEL + 1], dg_max_grant[OSUB_MAX_LEVEL + 1];
    int64_t ex_max_held[OSUB_MAX_LEVEL + 1], ex_max_grant[OSUB_MAX_LEVEL + 1];
    int32_t ev_comp[OSUB_MAX_LEVEL + 1], ev_cnt[OSUB_MAX_LEVEL + 1];
    /* placement history: per-minute maxima of held in a ring of hist_n slots */
    int64_t *hist;
    int64_t hist_minute; /* minute of the newest slot */
    int64_t hist_peak;   /* max over the ring */
};

struct timer_ent {
    int64_t at;
    struct svc *s;
    int kind;
};

struct osub_engine {
    osub_pool_config_t cfg;
    osub_class_t classes[OSUB_MAX_CLASSES];
    size_t n_classes;
    struct gpu *gpus;
    int32_t n_gpus;
    int32_t hist_n;
    int64_t now;
    uint64_t next_seq;
    bool overcommitted;

    /* live services: hash by id + list in submit order */
    struct svc **tab;
    size_t tab_cap, n_live;
    struct svc *head, *tail;

    struct svc **queue; /* sorted by level, submit time, seq */
    size_t n_queue, cap_queue;
    struct svc **pending; /* in seq order */
    size_t n_pending, cap_pending;

    struct timer_ent *heap;
    size_t n_heap, cap_heap;

    osub_event_t *events;
    size_t n_events, cap_events;
    bool mute; /* dry run: no events */
    bool dirty; /* something freed: look at pending and queue */

    uint64_t plan_stamp;
    struct cand *cand_buf; /* n_gpus scratch entries for planning */
    int32_t *miss_buf;     /* n_gpus scratch entries for planning */
    int32_t max_level;     /* the largest level of the classes */
    uint64_t admissions, rejections, degrades, evictions, restores, resumes;
};

/* plan.c: admission planning */
struct cand {
    int32_t gpu;
    bool victims;
    int32_t top_level, n_evict, n_degrade;
    int64_t restart_sum, score;
};

struct req {
    int32_t level;
    bool backed, exclusive;
    int64_t total;
    int32_t k;
    int32_t compute;
    int64_t size_mib; /* 0: any */
    const struct svc *self;
    bool pressure; /* min runtime protection overridden */
};

enum act { ACT_NONE = 0, ACT_DEGRADE = 1, ACT_EVICT = 2 };

struct plan {
    bool ok;
    int32_t k;
    int32_t gpus[64];
    int64_t shares[64];
    int32_t n_victims;
    struct svc *victims[OSUB_PLAN_MAX_VICTIMS];
    uint8_t acts[OSUB_PLAN_MAX_VICTIMS];
    /* key */
    int32_t top_level; /* highest priority (lowest level) touched, INT32_MAX if none */
    int32_t n_evict, n_degrade;
    int64_t restart_sum;
    int64_t score;
    /* failure detail */
    osub_check_t check;
    int32_t check_gpu;
    int64_t shortfall;
};

OSUB__HIDDEN int osub__plan_admission(osub_engine_t *e, const struct req *r, struct plan *out);
OSUB__HIDDEN int osub__plan_pressure(osub_engine_t *e, int32_t gpu, struct plan *out);
OSUB__HIDDEN int64_t osub__gpu_peak(osub_engine_t *e, struct gpu *g);
OSUB__HIDDEN int64_t osub__slot_held_after(const osub_engine_t *e, const struct svc *s,
                                           const struct slot *sl, int act);
OSUB__HIDDEN int64_t osub__floor_share(const struct svc *s, int32_t i);
OSUB__HIDDEN int64_t osub__share(int64_t total, int32_t k, int32_t i);
OSUB__HIDDEN bool osub__svc_victim_eligible(const struct svc *s);

#endif
