/* internal.h - the engine's private data model, shared by the engine's own files only */
#ifndef OVERSUB_ENGINE_INTERNAL_H
#define OVERSUB_ENGINE_INTERNAL_H

#include <stdarg.h>
#include <stdint.h>
#include <string.h>

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
    int64_t charge;     /* what admission counted physically for it here (<= grant) */
};

/* A service's usage predictor (predict.c), fed by its own usage reports: integer state only,
 * so decisions stay exact and deterministic. mean16 and dev16 are 16ths of a MiB. */
struct pred {
    uint32_t n;       /* reports seen (saturates) */
    int64_t first_ms; /* time of the first report, -1 if none */
    int64_t mean16;   /* moving mean of the total used */
    int64_t dev16;    /* moving mean absolute deviation from it */
    int64_t peak;     /* the largest total used reported */
    int64_t jump;     /* the largest rise between two consecutive reports */
    int64_t last;     /* the last total reported */
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
    int64_t size_mib;   /* the GPU size its set must have, 0 = any size with k GPUs */
    struct slot *slots; /* k, in GPU index order when placed */
    int32_t n_slots;    /* 0 unless placed (pending or later) */

    osub_state_t state;
    bool loading, ack_pending, used_capped, resumed, evicted_before;
    bool adopted; /* submitted already running: its first start skips the loading period */
    int32_t batch;
    int32_t compute_used;        /* last measured compute_pct per GPU (0 until reported) */
    bool batch_degraded;         /* batch cut for compute contention (memory untouched) */
    int64_t batch_room_since_ms; /* compute restore hysteresis; -1 when contended */
    int64_t submit_ms, since_ms, start_ms, resume_ms;
    int64_t deadline_ms;   /* ack deadline or grace end, 0 if none */
    int64_t room_since_ms; /* restore hysteresis; -1 when no room */
    bool overdue_requeued;
    uint32_t n_evictions, n_degrades;
    struct pred pred;
    /* why it was placed where it is (the last admission): the projected peak of its first GPU
     * with it there, the limit that peak was held to, and what it was counted as */
    int64_t place_projected, place_limit, place_charge;
    char checkpoint[128];
    char preemptor[OSUB_ID_MAX + 1]; /* who a directive was for ("" for pressure) */
    int32_t preemptor_level;

    osub_victim_t *waits; /* pending: the victims it waits for */
    int32_t n_waits;

    /* suspend (suspend.c). Invariant: host_mib > 0 exactly while suspending, suspended or
     * resuming, and the engine's host_used is the sum of them. */
    bool suspendable;       /* preemptible and its spec names a method */
    bool susp_hold;         /* suspended by an operator or for idleness: no wake by the pass */
    bool susp_idle;         /* held for idleness: a gateway request resumes it */
    bool woke;              /* resumed from a suspend at least once (wake_ms then) */
    osub_state_t susp_from; /* running or degraded: what it returns to */
    int64_t resume_cost_ms;
    int64_t host_mib;     /* what its suspend counts against the host budget */
    int64_t residual_est; /* what planning expects to stay on its GPUs once suspended (total) */
    int64_t wake_ms;      /* when it last woke */
    uint32_t n_suspends;
    bool floor_now; /* evicted to migrate at its floor: its next start may be at its floor at once
                       (it waited in its suspend), not after floor_start_after_ms in the queue */
    int32_t reloc_from1;       /* resuming onto another GPU (reason relocate): 1 + the GPU its
                                  checkpoint was taken on; 0 otherwise (any other state) */
    struct svc *sprev, *snext; /* the engine's list of suspended services, while suspended */

    int32_t heap_pos[T__KINDS];
    int64_t timer_at[T__KINDS];
    uint64_t plan_stamp;

    struct svc *prev, *next;     /* live list in submit order */
    osub_slot_info_t *slot_info; /* scratch for service_info */
};

/* A victim candidate on one GPU, as gpu_agg() last saw it (eligible services only, in
 * victim order: level desc, submit desc). */
struct vinfo {
    const struct svc *s;
    int32_t level;
    bool degradable;
    bool evictable; /* outside pressure (osub__evictable()): fixed until agg_valid_until */
    int32_t comp;
    int64_t rg_d, rh_d; /* grant and held a degrade frees */
    int64_t rg_e, rh_e; /* grant and held an eviction frees */
    int64_t rf_e;       /* floor room an eviction frees (a degrade frees none) */
    int64_t restart_ms;
    bool suspendable;  /* may be suspended, its minimum runtime and the host budget aside */
    int64_t rh_s;      /* held a suspend frees (its grant stays; its floor goes) */
    int64_t host;      /* what its suspend would count against the host budget */
    int64_t resume_ms; /* its resume cost (a suspend's restart cost) */
};

/* What victims on one GPU could give back (recomputed lazily by gpu_agg()). Each entry L is
 * over the victims of the levels >= L (sums, maxima, the minimum restart cost): what a plan
 * that touches no level above L may use, read without a walk over the levels. */
/* One level's figures, laid out so that optimistic() reads the first check's sums from one cache
 * line and the rest of the level from the next two. */
struct agg_level {
    int64_t ev_held, ev_grant;
    int64_t ev_floor; /* floor room evictions free */
    int32_t ev_comp, ev_cnt;
    int64_t dg_held, dg_grant;
    int64_t ev_min_restart; /* the cheapest eviction's restart cost */
    /* the three largest amounts one victim frees (top3_add() in plan.h): of held and grant by
     * a degrade, and of held, grant and floor by an eviction beyond its degrade; lower bounds
     * on how many victims a shortfall needs (optimistic()) */
    int64_t ex_top_held[3], ex_top_grant[3], ex_top_floor[3];
    int64_t dg_top_held[3], dg_top_grant[3];
} __attribute__((aligned(64)));

struct gpu_aggs {
    struct agg_level lv[OSUB_MAX_LEVEL + 1];
    uint32_t sp_mask;  /* bit L: a victim of level L may be suspended */
    uint32_t lvl_mask; /* bit L: level L's own victims give some held, grant or floor, or one
                          may be evicted */
};

struct gpu {
    /* hot: read for every GPU by every admission (the first two cache lines) */
    int64_t vram, usable, logical;
    int64_t hw_lim; /* usable x high watermark / 100, fixed at creation */
    int64_t granted, backed, held;
    int64_t hist_peak; /* max over the history ring */
    int32_t compute_all, compute_backed;
    int64_t hist_minute; /* minute of the newest history slot */
    struct svc *excl;    /* exclusive owner */
    int32_t nsvc;
    int32_t n_preempt; /* preemptible services placed here */
    /* cached by plan.c, recomputed when the GPU was touched or the minute changed: the
     * largest predicted rise of its oversold services, and what its services keep under
     * pressure */
    bool cache_dirty, floors_dirty;
    int64_t cache_minute, rise_cache, floors_cache;
    bool cordoned, lost, agg_dirty, tree_dirty;
    int64_t agg_valid_until; /* a victim's minimum-runtime protection ends then */
    /* cold */
    int32_t tree_size, tree_pos; /* its size group and leaf in the room trees */
    int32_t n_pending;           /* pending services placed here */
    int32_t compute_measured;    /* sum of the services' last measured compute_pct */
    int64_t used, system;
    struct svc **svcs; /* services placed here, sorted by (level desc, submit desc, seq desc) */
    struct vinfo *vic; /* capsvc entries; the first nvic valid after gpu_agg() */
    int32_t nvic, capsvc;
    /* what victims could give back (an upper bound used to prune victim planning) */
    struct gpu_aggs *a;
    /* placement history: per-minute maxima of held in a ring of hist_n slots */
    int64_t *hist;
    char name[OSUB_GPU_NAME_MAX + 1];
};

struct room_tree {
    int64_t vram, usable;
    int32_t n, leaves;
    int32_t *gpus;                  /* the group's GPU indices, ascending */
    int64_t *t[OSUB_MAX_LEVEL + 1]; /* 2 * leaves entries each, root at 1 */
    int64_t *d[OSUB_MAX_LEVEL + 1]; /* the same with degrades only (no eviction) */
    /* the same two for a backed request (also capped by usable - backed grants) and for a
     * preemptible one (held measured against the high watermark) */
    int64_t *bt[OSUB_MAX_LEVEL + 1], *bd[OSUB_MAX_LEVEL + 1];
    int64_t *pt[OSUB_MAX_LEVEL + 1], *pd[OSUB_MAX_LEVEL + 1];
    /* floor room (plan.c, floor_room()): under the held limit, what the services there keep
     * under pressure leaves, plus what evicting every level below L frees (ft), or with
     * degrades only, which free none (fd) */
    int64_t *ft[OSUB_MAX_LEVEL + 1], *fd;
    /* twins of bt and pt, indexed as t, d, bt, bd, pt, pd are (2 and 4): per GPU the smaller of
     * the room and the floor room ft[L] it is read with, so that a walk that needs both skips
     * the subtrees where no single GPU has enough of the two (osub__tree_collect()); NULL for
     * the other kinds, whose twins cost more to keep than they saved */
    int64_t *mt[6][OSUB_MAX_LEVEL + 1];
    /* best-fit index: a treap of the group's placeable GPUs keyed by (projected free room,
     * position), so the tightest fit is a lower-bound search, not a scan */
    int32_t root;
    int32_t *left, *right;
    uint32_t *prio;
    int64_t *pfree; /* the key each node is filed under */
    bool *in;       /* filed there: in service, not exclusive's (the trees' "out" is !in) */
    int32_t *stk;   /* n entries: the path of an in-order walk (osub__treap_first()) */
    int32_t n_in;   /* positions filed there */
    /* per position, as of the last refresh, clamped to +-2^30 (osub__clamp_row()), in rows of
     * n rounded up to 4: logical - granted, held, what the services there keep under pressure,
     * backed grants, and a mask (-1 or 0) of the GPUs where nothing preemptible is placed.
     * osub__note_closest() reads them four GPUs at a time; `sf` is its scratch row. A position
     * not filed in the index (and the padding) holds OSUB__ROW_PASS as logical room and its
     * negation as the rest: every check passes there. */
    int32_t *r_logical, *r_held, *r_floors, *r_backed, *r_nopre, *sf;
};

#define OSUB__ROW_PASS (INT32_C(1) << 30)

/* A row value of the room trees' group (struct room_tree): v clamped to +-2^30, which keeps
 * every comparison with a threshold within +-2^29 exact. */
static inline int32_t osub__clamp_row(int64_t v)
{
    const int64_t c = INT64_C(1) << 30;
    return (int32_t)(v > c ? c : v < -c ? -c : v);
}

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
    struct gpu_aggs *aggs; /* n_gpus, gpus[i].a points into it */
    int32_t n_gpus;
    int32_t hist_n;
    int64_t now;
    uint64_t next_seq;
    bool overcommitted;

    /* live services: hash by id + list in submit order */
    struct svc **tab;
    size_t tab_cap, n_live;
    struct svc *head, *tail;

    /* sorted by level, submit time, seq (osub__queue_before()); queue_off free slots lie
     * before its first entry (so that an entry near the head moves those ahead of it, not the
     * thousands behind), cap_queue counts the slots from the first entry on */
    struct svc **queue;
    size_t n_queue, cap_queue, queue_off;
    struct svc **pending; /* in seq order */
    size_t n_pending, cap_pending;

    struct timer_ent *heap;
    size_t n_heap, cap_heap;

    osub_event_t *events;
    size_t n_events, cap_events;
    bool dirty; /* something freed: look at pending and queue */
    /* whether every placed service is measured (admit.c, degraded starts): 1 or 0 as last
     * scanned, -1 to scan again (each command, and whenever a service changes state, ends its
     * loading or first reports) */
    int8_t measured_memo;
    bool in_tick;
    bool pending_check; /* held dropped where a pending service waits */

    uint64_t plan_stamp;
    uint64_t cmd_no; /* commands begun */
    /* the queue head's reservation, cached for one command */
    uint64_t resv_cmd;
    const struct svc *resv_head;
    int32_t resv_n;
    int32_t resv_gpus[OSUB_SERVICE_GPUS_MAX];
    struct opt_ent *opt_buf; /* n_gpus scratch entries for planning: plan.c's best-first heap */
    int32_t *miss_buf;       /* n_gpus + 8 scratch entries for planning */
    int64_t *promise_buf;    /* n_gpus scratch: room promised to restores in one pass */
    uint64_t *gpu_stamp;     /* n_gpus: which plan last looked at a GPU */
    int32_t max_level;       /* the largest level of the classes */
    /* GPU sizes of the pool (lost GPUs excluded), refreshed when a GPU is lost */
    int32_t n_sizes, n_live_gpus;
    int64_t size_vram[OSUB_GPU_SIZES_MAX], size_usable[OSUB_GPU_SIZES_MAX];
    int32_t size_count[OSUB_GPU_SIZES_MAX];
    int64_t largest_usable;
    /* room trees: per size group (fixed at creation) and request level, the max over the
     * group's GPUs of what a request of that level could at best get on one GPU (free room
     * plus everything lower levels could give back); refreshed lazily from tdirty */
    struct room_tree *trees;
    int32_t n_trees;
    int32_t *tdirty;
    int32_t n_tdirty;
    int64_t trees_valid_until;
    int64_t trees_minute; /* projected free room moves with the history: refreshed each minute */
    /* tests: compare every admission plan with the unpruned reference planner */
    bool verify_plans;
    uint64_t verify_mismatches;
    char verify_last[256];
    uint64_t admissions, rejections, degrades, evictions, restores, resumes;
    uint64_t events_lost; /* events not recorded for want of memory (decisions stand) */
    /* suspend: counters, services suspended and not held (the wake pass looks only when
     * there are some), the host memory counted for suspends */
    uint64_t suspends, wakes;
    int32_t n_suspended, n_suspendable;
    struct svc *suspended; /* the services in state suspended (any order; n_suspended) */
    int64_t host_used;
};

/* plan.c: admission planning */
/* A candidate GPU's optimistic key in the planner's best-first heap: its GPU is the low 12 bits
 * of klo and its placement score the rest (cand_pack(); OSUB_POOL_GPUS_MAX is 4096). */
struct opt_ent {
    uint64_t khi, klo;
};

struct cand {
    uint64_t khi, klo; /* the key packed for comparison (cand_pack) */
    int32_t gpu;
    bool victims;
    int32_t top_level, n_evict, n_suspend, n_degrade;
    int64_t restart_sum, score;
};

struct req {
    int32_t level;
    bool backed, exclusive;
    int64_t total;
    int64_t charge; /* what the physical (held) checks count, <= total: DESIGN's share for
                       backed services, the predicted peak for oversold ones (predict.c) */
    int64_t floor;  /* what it keeps under pressure (total): its request if backed, its floor
                       if degradable, 0 if it can only be evicted */
    /* plan.c: charge and floor of one share, computed once per plan (c_share 0: none) */
    int64_t c_share, c_charge, c_floor;
    int32_t k;
    int32_t compute;
    int64_t size_mib; /* 0: any */
    const struct svc *self;
    bool pressure;          /* min runtime protection overridden */
    bool quiet;             /* no failure details wanted (queue passes) */
    int32_t held_limit_pct; /* held + share must stay under this % of usable (0 = 100) */
    int64_t fit_share;      /* the largest share its GPUs must be able to hold (its full
                               request's, for a start at its floor); 0: the first share */
};

enum act { ACT_NONE = 0, ACT_DEGRADE = 1, ACT_EVICT = 2, ACT_SUSPEND = 3 };

struct plan {
    bool ok;
    int32_t k;
    int32_t gpus[OSUB_SERVICE_GPUS_MAX];
    int64_t shares[64];
    int64_t charges[64];
    bool degraded_start; /* admitted at its floor (engine.c) */
    int32_t n_victims;
    struct svc *victims[OSUB_PLAN_MAX_VICTIMS];
    uint8_t acts[OSUB_PLAN_MAX_VICTIMS];
    /* key */
    int32_t top_level; /* highest priority (lowest level) touched, INT32_MAX if none */
    int32_t n_evict, n_suspend, n_degrade;
    int64_t restart_sum; /* restart costs of evictions plus resume costs of suspends */
    int64_t score;
    /* failure detail */ osub_check_t check;
    int32_t check_gpu;
    int64_t shortfall;
    int32_t fit_gpus, need_gpus; /* a multi-GPU failure: GPUs that could take a share, of k */
};

/* Marks a GPU changed: its victim aggregates and room-tree leaves are recomputed lazily. */
static inline void osub__gpu_touch(struct osub_engine *e, struct gpu *g);

/* What held plus a newcomer counted at `charge` MiB may reach on g: usable, or (pct of 1-99)
 * the high watermark, g->hw_lim, except for a backed newcomer where nothing preemptible shares
 * the GPU (it pushes nobody into pressure), and for a charge above the watermark, which may
 * still go to an otherwise empty GPU. Admission's physical check (plan.c) and the start of a
 * pending service (admit.c) use this one rule, so that a pending service starts under the
 * limit its admission planned for. */
static inline int64_t osub__held_limit(const struct gpu *g, int32_t pct, bool backed,
                                       int64_t charge)
{
    if (pct >= 100 || pct <= 0)
        return g->usable;
    if (backed && g->n_preempt == 0)
        return g->usable;
    int64_t lim = g->hw_lim;
    return charge > lim ? (charge < g->usable ? charge : g->usable) : lim;
}

OSUB__HIDDEN int osub__trees_init(osub_engine_t *e);
OSUB__HIDDEN void osub__trees_free(osub_engine_t *e);
/* False when no GPU could give a request of this level `share` MiB even with every lower
 * level evicted: then no admission plan can work and none need be made. */
OSUB__HIDDEN bool osub__may_fit(osub_engine_t *e, const struct req *r, int64_t share);
/* Resize growth (DESIGN.md "Commands"): may placed service s take the totals nv (request) and
 * nm (floor) on its own GPUs? The checks a submit of the new size would make there, with what
 * s itself counts there taken out. Returns 0 and fills charges[i] (what the physical check
 * counted for its i-th slot), OSUB_ETOO_BIG (a share above its GPU's usable) or
 * OSUB_ENO_ROOM. Changes nothing. */
OSUB__HIDDEN int osub__resize_check(const osub_engine_t *e, const struct svc *s, int64_t nv,
                                    int64_t nm, int64_t *charges);
OSUB__HIDDEN int osub__plan_admission(osub_engine_t *e, const struct req *r, struct plan *out);
/* snapshot.c: wires a service read from a snapshot into e (its slots, GPU sums, lists and
 * timers); the queue and pending lists are rebuilt by the caller in saved order. Returns 0 or
 * OSUB_ENOMEM. The svc is taken. */
OSUB__HIDDEN int osub__restore_service(osub_engine_t *e, struct svc *s);
OSUB__HIDDEN int osub__restore_lists(osub_engine_t *e, struct svc **queue, size_t nq,
                                     struct svc **pending, size_t np);
OSUB__HIDDEN void osub__restore_done(osub_engine_t *e);
OSUB__HIDDEN struct svc *osub__lookup(const osub_engine_t *e, const char *id);

/* Tests: turn on plan verification; returns the mismatches seen so far and the last one. */
OSUB__HIDDEN uint64_t osub__verify_plans(osub_engine_t *e, bool on, const char **last);
/* What loading preemptible services hold on a GPU beyond what they use: a reservation that
 * admission granted, not memory at risk, so it does not make pressure. */
OSUB__HIDDEN int64_t osub__loading_reserve(const osub_engine_t *e, int32_t gpu);
OSUB__HIDDEN int osub__plan_pressure(osub_engine_t *e, int32_t gpu, struct plan *out);
OSUB__HIDDEN int64_t osub__gpu_peak(osub_engine_t *e, struct gpu *g);
/* Forgets g's held history (every slot becomes what it holds now): called when a service
 * leaves it or a loading period there ends, so that peaks of what is no longer there (a
 * reservation, a departed service) do not keep the GPU looking full for the window. */
OSUB__HIDDEN void osub__hist_reset(osub_engine_t *e, struct gpu *g);
OSUB__HIDDEN int64_t osub__slot_held_after(const osub_engine_t *e, const struct svc *s,
                                           const struct slot *sl, int act);
OSUB__HIDDEN int64_t osub__floor_share(const struct svc *s, int32_t i);
OSUB__HIDDEN int64_t osub__share(int64_t total, int32_t k, int32_t i);
OSUB__HIDDEN bool osub__svc_victim_eligible(const struct svc *s);

/* predict.c: the usage predictor */
OSUB__HIDDEN void osub__pred_init(struct pred *p);
OSUB__HIDDEN void osub__pred_observe(struct pred *p, int64_t used_total, int64_t now_ms);
/* The predicted peak of the service's total use over the coming hours, capped by cap (its
 * full request); cap itself when it has no history. */
OSUB__HIDDEN int64_t osub__pred_peak(const struct pred *p, int64_t cap, int64_t now_ms,
                                     int64_t trust_ms);
/* What an admission of s counts physically (total): backed services their request, oversold
 * ones their predicted peak. */
OSUB__HIDDEN int64_t osub__charge_total(const osub_engine_t *e, const struct svc *s);
/* How far s's slot on GPU gpu may still rise above what it holds, to its share of its
 * predicted peak (capped by its grant); 0 if it has no slot there or holds that much. */
OSUB__HIDDEN int64_t osub__slot_rise(const osub_engine_t *e, const struct svc *s, int32_t gpu);

static inline void osub__gpu_touch(struct osub_engine *e, struct gpu *g)
{
    g->agg_dirty = true;
    g->cache_dirty = true;
    g->floors_dirty = true;
    if (!g->tree_dirty) {
        g->tree_dirty = true;
        e->tdirty[e->n_tdirty++] = (int32_t)(g - e->gpus);
    }
}

/* fmt.c: snprintf's contract (truncated to len - 1 bytes and terminated when len > 0; returns
 * the length the whole string has) for %d, %i, %u, %s, %c and %% with the l, ll and z (u only)
 * modifiers; any other conversion goes to vsnprintf. Event sentences are formatted with these:
 * vsnprintf's setup cost more than the sentences. */
OSUB_PRINTF(3, 4)
OSUB__HIDDEN int osub__fmt(char *buf, size_t len, const char *fmt, ...);
OSUB__HIDDEN int osub__vfmt(char *buf, size_t len, const char *fmt, va_list ap);

/* snprintf(dst, len, "%s", src) for len > 0: what fits of src, always terminated. */
static inline void osub__str_copy(char *dst, size_t len, const char *src)
{
    const char *end = memchr(src, '\0', len - 1);
    size_t n = end != NULL ? (size_t)(end - src) : len - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* Frees a service record and what it owns (engine.c); NULL is fine. */
void osub_svc_free(struct svc *s);

/* A growing string (engine.c): dumps and snapshots print into it; oom once set stays set. */
struct osub_sbuf {
    char *p;
    size_t n, cap;
    bool oom;
};
OSUB_PRINTF(2, 3)
void osub_sb_printf(struct osub_sbuf *b, const char *fmt, ...);

static inline int32_t osub__max32(int32_t a, int32_t b)
{
    return a > b ? a : b;
}

static inline int64_t osub__max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}
static inline int64_t osub__min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* The engine split along its seams: what each part offers the others (the comments at the
 * definitions say what each does). */
/* engine.c: containers, accounting and transitions */
OSUB__HIDDEN void osub__end_loading(osub_engine_t *e, struct svc *s);
OSUB__HIDDEN const char *osub__class_of(const osub_engine_t *e, const struct svc *s);
OSUB_PRINTF(4, 5)
OSUB__HIDDEN osub_event_t *osub__emit(osub_engine_t *e, osub_event_kind_t kind,
                                      osub_reason_t reason, const char *fmt, ...);
OSUB__HIDDEN void osub__ev_svc(osub_event_t *ev, const struct svc *s);
OSUB__HIDDEN const osub_class_t *osub__find_class(const osub_engine_t *e, const char *name);
OSUB__HIDDEN void osub__fmt_gpus(const struct svc *s, char *buf, size_t len);
OSUB__HIDDEN void osub__gpu_add_held(osub_engine_t *e, struct gpu *g, int64_t delta);
OSUB__HIDDEN void osub__gpu_list_add(osub_engine_t *e, struct gpu *g, struct svc *s);
OSUB__HIDDEN int osub__gpu_list_reserve(struct gpu *g);
OSUB__HIDDEN int64_t osub__grant_total(const struct svc *s);
OSUB__HIDDEN void osub__heap_down(osub_engine_t *e, size_t i);
OSUB__HIDDEN void osub__heap_set(osub_engine_t *e, size_t i, struct timer_ent t);
OSUB__HIDDEN int64_t osub__held_total(const struct svc *s);
OSUB__HIDDEN struct svc *osub__e_lookup(const osub_engine_t *e, const char *id);
OSUB__HIDDEN int osub__place_reserve(osub_engine_t *e, const int32_t *gpus, int32_t k);
OSUB__HIDDEN bool osub__queue_before(const struct svc *a, const struct svc *b);
OSUB__HIDDEN size_t osub__queue_pos(const osub_engine_t *e, const struct svc *s);
OSUB__HIDDEN size_t osub__queue_push(osub_engine_t *e, struct svc *s);
OSUB__HIDDEN int osub__queue_reserve(osub_engine_t *e, size_t n);
OSUB__HIDDEN void osub__queue_remove(osub_engine_t *e, struct svc *s);
OSUB__HIDDEN void osub__queue_remove_at(osub_engine_t *e, size_t i);
OSUB__HIDDEN void osub__set_state(osub_engine_t *e, struct svc *s, osub_state_t st);
OSUB__HIDDEN int64_t osub__slot_held(const struct svc *s, const struct slot *sl);
OSUB__HIDDEN void osub__slot_set_grant(osub_engine_t *e, struct svc *s, struct slot *sl, int64_t g);
OSUB__HIDDEN void osub__slot_set_used(osub_engine_t *e, struct slot *sl, int64_t u);
OSUB__HIDDEN bool osub__svc_before(const struct svc *a, const struct svc *b);
OSUB__HIDDEN void osub__svc_degrade(osub_engine_t *e, struct svc *s, const char *cause,
                                    int32_t cause_level, osub_reason_t reason);
OSUB__HIDDEN void osub__svc_destroy(osub_engine_t *e, struct svc *s);
OSUB__HIDDEN void osub__svc_evict(osub_engine_t *e, struct svc *s, const char *cause,
                                  int32_t cause_level, osub_reason_t reason);
OSUB__HIDDEN void osub__svc_gone(osub_engine_t *e, struct svc *s, osub_reason_t reason,
                                 bool by_eviction);
OSUB__HIDDEN void osub__svc_place(osub_engine_t *e, struct svc *s, const int32_t *gpus,
                                  const int64_t *shares, const int64_t *charges, int32_t k);
OSUB__HIDDEN void osub__svc_start(osub_engine_t *e, struct svc *s, osub_reason_t reason);
OSUB__HIDDEN void osub__svc_move(osub_engine_t *e, struct svc *s, int32_t j, int32_t gpu);
OSUB__HIDDEN void osub__svc_sync(osub_engine_t *e, struct svc *s);
OSUB__HIDDEN void osub__svc_to_queue(osub_engine_t *e, struct svc *s);
OSUB__HIDDEN void osub__tab_insert_raw(struct svc **tab, size_t cap, struct svc *s);
OSUB__HIDDEN int osub__tab_reserve(osub_engine_t *e);
OSUB__HIDDEN void osub__timer_cancel(osub_engine_t *e, struct svc *s, int kind);
OSUB__HIDDEN int osub__timer_reserve(osub_engine_t *e, size_t more);
OSUB__HIDDEN void osub__timer_set(osub_engine_t *e, struct svc *s, int kind, int64_t at);
OSUB__HIDDEN int64_t osub__used_total(const struct svc *s);
OSUB__HIDDEN void osub__vec_remove(struct svc **v, size_t *n, struct svc *s);
OSUB__HIDDEN int osub__vec_reserve(struct svc ***v, size_t *cap, size_t n);

/* admit.c: spec resolution and admission */
OSUB__HIDDEN void osub__admit_apply(osub_engine_t *e, struct svc *s, const struct plan *p,
                                    osub_reason_t why);
OSUB__HIDDEN int osub__admit_reserve(osub_engine_t *e, struct svc *s, const struct plan *p);
OSUB__HIDDEN bool osub__backfill_ok(osub_engine_t *e, const struct plan *p, int32_t lvl);
OSUB__HIDDEN void osub__describe_failure(const struct plan *p, char *buf, size_t len);
OSUB__HIDDEN int osub__empty_pool_fit(const osub_engine_t *e, const osub_spec_t *s);
OSUB__HIDDEN void osub__fill_req(const osub_engine_t *e, const struct svc *s, struct req *r);
OSUB__HIDDEN void osub__fill_victims(const osub_engine_t *e, const struct plan *p,
                                     osub_submit_result_t *res);
OSUB__HIDDEN int64_t osub__min_share(osub_engine_t *e, const struct svc *s, const struct req *r);
OSUB__HIDDEN bool osub__pending_can_start(const osub_engine_t *e, const struct svc *s);
OSUB__HIDDEN void osub__plan_for(osub_engine_t *e, const struct svc *s, const struct req *r,
                                 struct plan *p);
OSUB__HIDDEN bool osub__plan_floor_start(osub_engine_t *e, const struct svc *s, const struct req *r,
                                         struct plan *p);
OSUB__HIDDEN void osub__refresh_sizes(osub_engine_t *e);
OSUB__HIDDEN int osub__resolve_spec(const osub_engine_t *e, const osub_spec_t *in, osub_spec_t *o,
                                    const osub_class_t **cls_out);
OSUB__HIDDEN bool osub__spec_equal(const osub_spec_t *a, const osub_spec_t *b);

/* commands.c: the command discipline */
OSUB__HIDDEN void osub__advance(osub_engine_t *e, int64_t now_ms);
OSUB__HIDDEN int osub__check_time(const osub_engine_t *e, int64_t now_ms);
OSUB__HIDDEN void osub__clear_events(osub_engine_t *e);
OSUB__HIDDEN void osub__finish(osub_engine_t *e);
OSUB__HIDDEN int osub__get_svc(osub_engine_t *e, const char *id, struct svc **out);

/* suspend.c: suspend and wake */
/* Whether v may be suspended now as a victim (its host memory aside): suspendable, running or
 * degraded with no directive outstanding, and (unless under pressure) not within its
 * suspend_min_runtime_ms after a wake. */
OSUB__HIDDEN bool osub__suspendable_now(const osub_engine_t *e, const struct svc *v, bool pressure);
/* Whether v's state lets it be suspended at all (running or degraded, loaded, nothing
 * outstanding). */
static inline bool osub__susp_state_ok(const struct svc *v)
{
    return v->suspendable && !v->ack_pending && !v->loading &&
           (v->state == OSUB_STATE_RUNNING || v->state == OSUB_STATE_DEGRADED);
}
static inline bool osub__in_suspend(const struct svc *s)
{
    return s->state == OSUB_STATE_SUSPENDING || s->state == OSUB_STATE_SUSPENDED ||
           s->state == OSUB_STATE_RESUMING;
}
/* Resolves and checks the suspend part of spec `in` into o (preemptible `pre`): 0,
 * OSUB_EBACKED_SUSPEND, OSUB_EBAD_SUSPEND or OSUB_EBAD_TIME. */
OSUB__HIDDEN int osub__resolve_suspend(const osub_engine_t *e, const osub_spec_t *in, bool pre,
                                       osub_spec_t *o);
/* Sets the derived suspend fields of a service from its (resolved) spec. */
OSUB__HIDDEN void osub__susp_derive(struct svc *s);
/* What a suspend of s counts against the host budget: what it holds or is granted, the more. */
OSUB__HIDDEN int64_t osub__host_need(const struct svc *s);
/* What slot i of s is expected to keep on its GPU once suspended. */
OSUB__HIDDEN int64_t osub__residual_share(const struct svc *s, int32_t i);
OSUB__HIDDEN void osub__svc_suspend(osub_engine_t *e, struct svc *s, const char *cause,
                                    int32_t cause_level, osub_reason_t reason);
/* Files s in the engine's list of suspended services, or takes it out (engine.c calls these
 * as s enters or leaves the suspended state). */
OSUB__HIDDEN void osub__susp_list_add(osub_engine_t *e, struct svc *s);
OSUB__HIDDEN void osub__susp_list_remove(osub_engine_t *e, struct svc *s);
/* Frees what s counted against the host budget (it left the suspend states). */
OSUB__HIDDEN void osub__susp_clear(osub_engine_t *e, struct svc *s);
/* A suspending service's deadline passed: evicted with grace. */
OSUB__HIDDEN void osub__suspend_timeout(osub_engine_t *e, struct svc *s);
/* The wake pass: suspended services back on their GPUs, by level then submit time. */
OSUB__HIDDEN void osub__process_wakes(osub_engine_t *e);

/* passes.c: timers and passes */
OSUB__HIDDEN void osub__check_compute(osub_engine_t *e, int32_t gi);
OSUB__HIDDEN void osub__check_pressure(osub_engine_t *e, int32_t gi);
OSUB__HIDDEN void osub__process(osub_engine_t *e);
OSUB__HIDDEN void osub__process_restores(osub_engine_t *e);
OSUB__HIDDEN void osub__run_timers(osub_engine_t *e);

/* Every allocation in the engine goes through these (engine.c), so that a test can make the
 * nth one fail (osub__alloc_fail_at) and check that each command refuses cleanly. */
void *osub__malloc(size_t n);
void *osub__calloc(size_t n, size_t size);
void *osub__realloc(void *p, size_t n);
char *osub__strdup(const char *s);
/* From now on, allocation number n (0 = the next) fails, and every one after it until the
 * next call; n < 0 turns failures off. Returns how many allocations were made since the last
 * call. Not thread safe: for tests. */
long osub__alloc_fail_at(long n);
#ifndef OSUB_ALLOC_IMPL
#define malloc(n) osub__malloc(n)
#define calloc(n, size) osub__calloc(n, size)
#define realloc(p, n) osub__realloc(p, n)
#define strdup(s) osub__strdup(s)
#endif

#endif
