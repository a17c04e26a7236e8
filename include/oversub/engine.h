/* engine.h - liboversub's engine: oversell ratio, priority preemption and degradation */
#ifndef OVERSUB_ENGINE_H
#define OVERSUB_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "oversub/errors.h"
#include "oversub/visibility.h"

/*
 * The engine is a pure, deterministic state machine (DESIGN.md, "The engine"). It owns the
 * pool, the classes, the services and the queue; it takes commands with a caller-supplied
 * monotonic time in ms and returns decisions as events. It does no I/O, reads no clock,
 * never sleeps and never exits. Same commands and times in, same decisions out.
 *
 * Units: VRAM in integer MiB, compute in integer percent of one GPU, time in integer ms,
 * ratios in thousandths. No floating point is used in accounting.
 *
 * Thread safety: an engine is not thread-safe; one thread (the daemon's event loop, the
 * simulator) drives it. Distinct engines are independent.
 *
 * Ownership: every pointer argument is borrowed for the call unless said otherwise. Pointers
 * the engine returns (events, info structs' arrays) are owned by the engine and stay valid
 * until the next command on that engine.
 *
 * Errors: 0 or a negative OSUB_E* code (osub_strerror()). A command that fails changes
 * nothing: the engine's state afterwards is byte for byte what it was before.
 */

#define OSUB_ID_MAX 63
#define OSUB_CLASS_NAME_MAX 31
#define OSUB_MAX_CLASSES 8
#define OSUB_MAX_LEVEL 7
#define OSUB_GPU_NAME_MAX 47
#define OSUB_EVENT_MSG_MAX 320
#define OSUB_POOL_GPUS_MAX 4096  /* GPUs in one engine */
#define OSUB_SERVICE_GPUS_MAX 64 /* GPUs one service may span */
#define OSUB_GPU_SIZES_MAX 64    /* distinct GPU sizes in one pool */

typedef struct osub_engine osub_engine_t;

/* Pool-wide settings. Fill with osub_pool_config_default() and change what you need. */
typedef struct {
    int32_t ratio_milli;          /* oversell ratio in thousandths (1300 = 1.3x) */
    int32_t compute_ratio_milli;  /* all compute claims per GPU <= 100 x this (2000) */
    int64_t margin_mib;           /* usable = vram - margin (0 simulated, 1024 under NVML) */
    int32_t high_watermark_pct;   /* pressure starts above this % of usable held (95) */
    int32_t low_watermark_pct;    /* pressure relieves down to this % of usable (90) */
    int64_t hysteresis_ms;        /* room must last this long before a restore (60 s) */
    int64_t ack_timeout_ms;       /* a degrade not acknowledged by then escalates (10 s) */
    int64_t grace_ms;             /* eviction grace period, pool default (30 s) */
    int64_t min_runtime_ms;       /* a resumed service is not evicted before this (10 min) */
    int64_t history_window_ms;    /* placement looks at held peaks over this window (1 h) */
    int64_t restart_cost_ms;      /* default restart cost / loading period (60 s) */
    int64_t queue_aging_ms;       /* after this wait the queue head blocks backfill (5 min) */
    int64_t prediction_trust_ms;  /* a usage history this long weighs as much as the request
                                     in a service's predicted peak (1 h) */
    int64_t floor_start_after_ms; /* a degradable service that has waited this long may start
                                     at its floor (2 min; -1: never) */
    /* suspend (DESIGN.md "Suspend: preemption without a reload") */
    int64_t suspend_host_mib;       /* host memory suspended services may fill (0: no suspend) */
    int64_t suspend_mib_per_s;      /* default resume cost: grant at this rate + 1 s (4096) */
    int64_t suspend_timeout_ms;     /* a suspend not done by then escalates to eviction (30 s) */
    int64_t suspend_min_runtime_ms; /* a resumed service is not suspended again before (60 s) */
} osub_pool_config_t;

/* One priority class. level 0 is the highest priority. */
typedef struct {
    char name[OSUB_CLASS_NAME_MAX + 1];
    int32_t level;    /* 0..OSUB_MAX_LEVEL */
    bool preemptible; /* false: backed by physical VRAM, never preempted */
    int64_t grace_ms; /* -1: the pool's default */
} osub_class_t;

typedef enum {
    OSUB_ON_EVICT_DEFAULT = 0, /* requeue if resumable, else release */
    OSUB_ON_EVICT_REQUEUE,
    OSUB_ON_EVICT_RELEASE,
} osub_on_evict_t;

/* How a suspendable service is suspended and resumed. The mechanisms are the daemon's; so are
 * their details (a vllm, sglang or http method's URL and paths live with the daemon's other
 * per-service settings, as a managed command or backends do, and are checked there): the
 * engine knows the method, so that the service may be suspended, and the residual expected. */
typedef enum {
    OSUB_SUSPEND_NONE = 0, /* not suspendable */
    OSUB_SUSPEND_CUDA,     /* the CUDA driver's process checkpoint API, every process */
    OSUB_SUSPEND_VLLM,     /* POST url/sleep?level=1, POST url/wake_up */
    OSUB_SUSPEND_SGLANG,   /* url/release_memory_occupation, url/resume_memory_occupation */
    OSUB_SUSPEND_HTTP,     /* POST url + suspend_path, POST url + resume_path */
} osub_suspend_method_t;

typedef struct {
    osub_suspend_method_t method;
    int64_t residual_mib; /* what is expected to stay on its GPUs once suspended (total; 0 =
                             nothing known: the last measured residual replaces it) */
    /* method cuda, one GPU: its checkpoint may be restored onto another GPU of the same chip
     * and size when its own has no room (the driver's GPU remap, 580+; the process sees every
     * GPU: docs/actuation.md), a resume elsewhere with no reload */
    bool relocate;
} osub_suspend_spec_t;

typedef enum {
    OSUB_TRI_DEFAULT = -1,
    OSUB_TRI_NO = 0,
    OSUB_TRI_YES = 1,
} osub_tri_t;

/* A service spec as submitted. Fill with osub_spec_init() first: it sets the defaults. */
typedef struct {
    char id[OSUB_ID_MAX + 1];
    char class_name[OSUB_CLASS_NAME_MAX + 1];
    int64_t vram_mib;       /* total request, > 0 */
    int32_t gpus;           /* 0: ceil(vram_mib / largest usable) */
    int32_t compute_pct;    /* per GPU, 0 = no claim */
    int64_t min_vram_mib;   /* degraded floor (total); 0 = vram_mib (not degradable) */
    int32_t batch_size;     /* 0 = unspecified */
    int32_t min_batch_size; /* 0 = batch_size */
    bool exclusive;         /* whole GPUs, never shared or oversold */
    osub_tri_t preemptible; /* default: the class's */
    bool resumable;
    osub_on_evict_t on_evict;
    int64_t restart_cost_ms;     /* -1: the pool's default */
    osub_tri_t queue;            /* default: queue if preemptible, else reject */
    int64_t grace_ms;            /* -1: the class's */
    osub_suspend_spec_t suspend; /* method NONE: never suspended; backed services may not */
    int64_t resume_cost_ms;      /* -1: its request at the pool's suspend_mib_per_s, plus 1 s */
} osub_spec_t;

typedef enum {
    OSUB_STATE_QUEUED = 0,
    OSUB_STATE_PENDING,
    OSUB_STATE_LOADING,
    OSUB_STATE_RUNNING,
    OSUB_STATE_DEGRADED,
    OSUB_STATE_DRAINING,
    OSUB_STATE_OVERDUE,
    OSUB_STATE_FAILED,
    OSUB_STATE_RELEASED,
    /* suspend (appended: the numbers above are stored in snapshots) */
    OSUB_STATE_SUSPENDING, /* told to suspend; holds its memory until it is seen free */
    OSUB_STATE_SUSPENDED,  /* its GPU memory is in host memory; keeps its logical grant and
                              holds only its measured residual */
    OSUB_STATE_RESUMING,   /* given its GPUs back; holds like loading until resumed */
    OSUB_STATE__COUNT
} osub_state_t;

/* Event kinds: decisions (admit ... resume) and the events around them. */
#define OSUB_EVENT_MAP(XX)                                                                         \
    XX(ADMIT, "admit")                                                                             \
    XX(PEND, "pend")                                                                               \
    XX(QUEUE, "queue")                                                                             \
    XX(REJECT, "reject")                                                                           \
    XX(DEGRADE, "degrade")                                                                         \
    XX(EVICT, "evict")                                                                             \
    XX(START, "start")                                                                             \
    XX(RESTORE, "restore")                                                                         \
    XX(RESUME, "resume")                                                                           \
    XX(READY, "ready")                                                                             \
    XX(ACK, "ack")                                                                                 \
    XX(ESCALATE, "escalate")                                                                       \
    XX(OVERDUE, "overdue")                                                                         \
    XX(EXITED, "exited")                                                                           \
    XX(REQUEUE, "requeue")                                                                         \
    XX(RELEASE, "release")                                                                         \
    XX(RESIZE, "resize")                                                                           \
    XX(RATIO, "ratio")                                                                             \
    XX(OVERCOMMIT, "overcommit")                                                                   \
    XX(CORDON, "cordon")                                                                           \
    XX(UNCORDON, "uncordon")                                                                       \
    XX(GPU_LOST, "gpu_lost")                                                                       \
    XX(FAIL, "fail")                                                                               \
    XX(SUSPEND, "suspend")     /* decision: suspend it (its memory to the host) */                 \
    XX(SUSPENDED, "suspended") /* its mechanism is done and its memory seen free */                \
    XX(WAKE, "wake")           /* decision: resume a suspended service on its GPUs */              \
    XX(RESUMED, "resumed")     /* its memory is back: it runs again */

typedef enum {
#define OSUB__EV_ENUM(name, str) OSUB_EV_##name,
    OSUB_EVENT_MAP(OSUB__EV_ENUM)
#undef OSUB__EV_ENUM
        OSUB_EV__COUNT
} osub_event_kind_t;

/* Reason codes: why a decision was taken. */
#define OSUB_REASON_MAP(XX)                                                                        \
    XX(FITS, "fits")                           /* placed without victims */                        \
    XX(PREEMPTION, "preemption")               /* victim of a higher-priority arrival */           \
    XX(WAIT_VICTIMS, "wait_victims")           /* placed; waits for victims' memory */             \
    XX(NO_ROOM, "no_room")                     /* nothing fits, even with victims */               \
    XX(EMPTY_POOL, "empty_pool")               /* could not fit even on an empty pool */           \
    XX(OVERCOMMITTED, "overcommitted")         /* ratio lowered below the grants */                \
    XX(PRESSURE, "pressure")                   /* held above the high watermark */                 \
    XX(ACK_TIMEOUT, "ack_timeout")             /* a degrade was not acknowledged in time */        \
    XX(GRACE_OVER, "grace_over")               /* an eviction's grace period ended */              \
    XX(VICTIM_OVERDUE, "victim_overdue")       /* a pending service gave up waiting */             \
    XX(ROOM_FREED, "room_freed")               /* memory came free */                              \
    XX(ROOM_STABLE, "room_stable")             /* room lasted the hysteresis window */             \
    XX(USER, "user")                           /* asked for by a command */                        \
    XX(ACKNOWLEDGED, "acknowledged")           /* the service acknowledged */                      \
    XX(USAGE_UNDER_GRANT, "usage_under_grant") /* usage at or under the new grant: an ack */       \
    XX(LOADED, "loaded")                       /* loading period over */                           \
    XX(GPU_LOST, "gpu_lost")                   /* a GPU disappeared */                             \
    XX(EVICTED, "evicted")                     /* an eviction completed */                         \
    XX(COMPUTE, "compute")                     /* compute contention */                            \
    XX(START_FLOOR, "start_floor")             /* admitted at its floor: no room for more yet */   \
    XX(IDLE, "idle")                           /* suspended for want of requests */                \
    XX(SUSPEND_TIMEOUT, "suspend_timeout")     /* a suspend was not done in time */                \
    XX(SUSPEND_FAILED, "suspend_failed")       /* its mechanism failed to suspend or resume it */  \
    XX(RESIDUAL, "residual")                   /* a suspended victim kept more than planned */     \
    XX(MIGRATE, "migrate")                     /* suspended too long: restarted elsewhere */       \
    XX(RELOCATE, "relocate")                   /* resumed on another GPU from its checkpoint */

typedef enum {
#define OSUB__RS_ENUM(name, str) OSUB_R_##name,
    OSUB_REASON_MAP(OSUB__RS_ENUM)
#undef OSUB__RS_ENUM
        OSUB_R__COUNT
} osub_reason_t;

/* One decision or event. `msg` is a sentence naming the services, GPUs and MiB involved. */
typedef struct {
    int64_t time_ms;
    osub_event_kind_t kind;
    osub_reason_t reason;
    char service[OSUB_ID_MAX + 1]; /* "" for pool-level events */
    char cause[OSUB_ID_MAX + 1];   /* the preemptor, for preemption decisions; else "" */
    int32_t cause_level;           /* the preemptor's level, -1 if none */
    int32_t level;                 /* the service's level, -1 if none */
    int32_t gpu;                   /* first GPU involved, -1 if none */
    int64_t vram_mib;              /* new grant (degrade, restore, start), else 0 */
    int32_t batch_size;            /* new batch size (degrade, restore), else 0 */
    int64_t deadline_ms;           /* ack deadline (degrade), grace end (evict), else 0 */
    char msg[OSUB_EVENT_MSG_MAX];
} osub_event_t;

/* What a submit did. */
typedef enum {
    OSUB_SUBMIT_STARTED = 0, /* 201: loading now */
    OSUB_SUBMIT_PENDING,     /* 202: placed, waits for victims */
    OSUB_SUBMIT_QUEUED,      /* 202: waits in the queue */
    OSUB_SUBMIT_EXISTS,      /* 200: the same spec is already live */
    OSUB_SUBMIT_REJECTED,    /* 409: refused; see check and shortfall */
} osub_submit_outcome_t;

typedef enum {
    OSUB_CHECK_NONE = 0,
    OSUB_CHECK_LOGICAL,   /* all grants + share <= logical capacity */
    OSUB_CHECK_BACKED,    /* backed grants + share <= usable */
    OSUB_CHECK_HELD,      /* held + share <= usable */
    OSUB_CHECK_COMPUTE,   /* compute claims */
    OSUB_CHECK_EXCLUSIVE, /* GPU not empty for an exclusive service */
    OSUB_CHECK_GPUS,      /* not enough GPUs of one size that may take it */
    OSUB_CHECK_FLOORS,    /* what everyone keeps under pressure + its share <= the held limit */
} osub_check_t;

#define OSUB_PLAN_MAX_VICTIMS 64

typedef struct {
    char service[OSUB_ID_MAX + 1];
    bool evict;   /* false: degrade, or suspend when `suspend` */
    bool suspend; /* suspend (never with evict) */
    int64_t deadline_ms;
} osub_victim_t;

typedef struct {
    osub_submit_outcome_t outcome;
    int rc;                /* for REJECTED: the error code (OSUB_ENO_ROOM, OSUB_ETOO_BIG...) */
    osub_check_t check;    /* the failing check for REJECTED/QUEUED */
    int32_t check_gpu;     /* the GPU where it failed (best candidate), -1 if none */
    int64_t shortfall_mib; /* MiB missing on that GPU */
    int32_t n_gpus;
    int32_t gpus[64]; /* placement (STARTED/PENDING/dry-run), first n_gpus */
    int32_t n_victims;
    osub_victim_t victims[OSUB_PLAN_MAX_VICTIMS];
    int32_t queue_position; /* 1-based, QUEUED only */
} osub_submit_result_t;

/* Per GPU figures. */
typedef struct {
    int32_t index;
    char name[OSUB_GPU_NAME_MAX + 1];
    int64_t vram_mib, usable_mib, logical_mib;
    int64_t granted_mib, backed_mib, held_mib, used_mib, system_mib;
    int32_t compute_claimed_pct, compute_backed_pct;
    int32_t n_services;
    bool cordoned, lost, exclusive;
} osub_gpu_info_t;

/* Pool figures (lost GPUs excluded). Utilisations as per-mille fractions are left to the
 * caller: used/vram, held/vram, granted/logical. */
typedef struct {
    int32_t ratio_milli;
    int32_t n_gpus, n_lost;
    int64_t vram_mib, usable_mib, logical_mib;
    int64_t granted_mib, held_mib, used_mib, system_mib;
    int32_t n_services, n_queued, n_pending;
    bool overcommitted;
    uint64_t admissions, rejections, degrades, evictions, restores, resumes;
    uint64_t events_lost; /* events not recorded for want of memory (the decisions stand) */
    /* suspend: decisions and wakes (counted apart from evictions), services suspended now,
     * and the host memory their suspends count against the budget */
    uint64_t suspends, wakes;
    int32_t n_suspended;
    int64_t host_used_mib, host_budget_mib;
} osub_pool_info_t;

typedef struct {
    int32_t gpu;
    int64_t grant_mib, held_mib, used_mib;
} osub_slot_info_t;

typedef struct {
    const osub_spec_t *spec; /* as submitted (defaults resolved) */
    osub_state_t state;
    int32_t level;
    bool backed, preemptible, degradable, loading, ack_pending, resumed;
    int64_t grant_mib, held_mib, used_mib;
    int64_t predicted_peak_mib; /* its own usage's predicted peak (its request: no history) */
    int64_t charge_mib;         /* what an admission now would count physically for it */
    uint32_t usage_reports;     /* reports its prediction has learned from */
    /* its last placement: the projected peak, with it there, of the fullest GPU of its set
     * (held peak over the history window, or held plus the largest predicted rise, plus its
     * charge), the limit placement aims under (high watermark; usable for backed services),
     * and the charge admission counted for its (first, largest) share on one GPU; 0 when
     * never placed */
    int64_t place_projected_mib, place_limit_mib, place_charge_mib;
    int32_t batch_size;
    int64_t submitted_ms, since_ms, deadline_ms; /* deadline: ack or grace end, else 0 */
    int32_t n_slots;
    const osub_slot_info_t *slots;
    int32_t queue_position; /* 1-based when queued, else 0 */
    int32_t n_waits;        /* pending: the victims it waits for */
    const osub_victim_t *waits;
    uint32_t evictions, degrades;
    char checkpoint[128];
    /* suspend */
    bool suspendable;  /* its spec declares a method */
    bool suspend_hold; /* suspended by an operator or for idleness: stays until resumed */
    bool suspend_idle; /* held for idleness: a gateway request resumes it */
    int64_t woke_ms;   /* when it last resumed from a suspend (0: never) */
    uint32_t suspends; /* times it was suspended */
    int64_t host_mib;  /* what its suspend counts against the host budget (0: none) */
    int64_t resume_cost_ms;
    int64_t residual_mib; /* what planning expects to stay on its GPUs when suspended */
    /* resuming onto another GPU (reason relocate): the GPU its checkpoint was taken on, for the
     * mechanism's remap; -1 otherwise */
    int32_t relocated_from;
} osub_service_info_t;

/* Fills the defaults of DESIGN.md (ratio 1.3, margin 0, ...). */
OSUB_API void osub_pool_config_default(osub_pool_config_t *cfg);
/* Sets spec to defaults with the given id and class (both copied; may be NULL). */
OSUB_API void osub_spec_init(osub_spec_t *spec, const char *id, const char *class_name);
/* Returns the three default classes: online (0, backed), batch (1), experiment (2). */
OSUB_API const osub_class_t *osub_default_classes(size_t *n_out);

/*
 * Creates an engine for `n_gpus` GPUs of the given sizes (vram_mib[i], names may be NULL
 * for "gpu<i>"), config and classes (NULL, 0 for the defaults). Validates everything:
 * OSUB_EBAD_CONFIG, OSUB_EBAD_CLASS, OSUB_ENOMEM. On success *out is owned by the caller
 * and freed with osub_engine_free().
 */
OSUB_API int osub_engine_new(const osub_pool_config_t *cfg, const int64_t *vram_mib,
                             const char *const *names, size_t n_gpus, const osub_class_t *classes,
                             size_t n_classes, osub_engine_t **out);
OSUB_API void osub_engine_free(osub_engine_t *e);

/*
 * Commands. Each takes now_ms (monotonic; earlier than the last command's time:
 * OSUB_ETIME_BACKWARDS) and has the same three steps: it checks its arguments against the
 * state as the last command left it (a refusal returns here and changes nothing: no timer
 * runs, time does not move); then time moves to now_ms and the timers due by then run (ack
 * timeouts, grace ends, loading periods); then the command applies. Events produced are read
 * with osub_engine_events(). A dry-run submit runs the real submit on a copy of the engine at
 * the same time (timers included) and answers what it would decide, GPUs and victims included.
 * Out of memory: OSUB_ENOMEM before anything changed where the memory can be reserved first;
 * an event that cannot be recorded is counted in osub_pool_info_t.events_lost.
 */
#define OSUB_SUBMIT_DRY_RUN 1u
/* The service is already running and loaded (adopted after a restart, or present when a
 * simulated trace begins): if it starts at once it starts `running`, with no loading period. */
#define OSUB_SUBMIT_RUNNING 2u
OSUB_API int osub_engine_submit(osub_engine_t *e, const osub_spec_t *spec, int64_t now_ms,
                                unsigned flags, osub_submit_result_t *res);
OSUB_API int osub_engine_release(osub_engine_t *e, const char *id, int64_t now_ms);
/* As osub_engine_release(), but what the service measured on each of its GPUs stays counted
 * there as system memory: its process has not exited yet and still holds it (the next
 * osub_engine_system_usage() of that GPU, from a measurement, says what is left). Nothing is
 * woken or started into memory that is still in use. */
OSUB_API int osub_engine_release_measured(osub_engine_t *e, const char *id, int64_t now_ms);
/* Resize: new totals (vram_mib, min_vram_mib; 0 keeps) and batch size (0 keeps). Growth passes
 * the checks a submit of the new size would make on the service's own GPUs, without victims: a
 * share above a GPU's usable VRAM is OSUB_ETOO_BIG; the logical, backed, physical (the GPU's
 * held without the service plus its new charge, under admission's limit) and floor checks are
 * OSUB_ENO_ROOM. A service without GPUs of its own (queued; draining or overdue, on its way
 * out) is refused only a size that no GPU of the pool could hold (OSUB_ETOO_BIG,
 * OSUB_ETOO_MANY_GPUS). A shrink always succeeds, at once, down to the floor. An exclusive
 * service's request cannot change (OSUB_EBAD_STATE); it keeps its GPUs' whole usable VRAM. */
OSUB_API int osub_engine_resize(osub_engine_t *e, const char *id, int64_t vram_mib,
                                int64_t min_vram_mib, int32_t batch_size, int64_t now_ms);
/* Usage: the total (split in proportion to per-GPU grants), compute_pct < 0 = unknown. */
OSUB_API int osub_engine_usage(osub_engine_t *e, const char *id, int64_t used_mib,
                               int32_t compute_pct, int64_t now_ms);
/* Usage per GPU: used_mib[i] on the service's i-th GPU of its placement (n = its GPU count). */
OSUB_API int osub_engine_usage_per_gpu(osub_engine_t *e, const char *id, const int64_t *used_mib,
                                       size_t n, int64_t now_ms);
/* Memory on GPU `gpu` that belongs to no service (driver, contexts, unknown processes). */
OSUB_API int osub_engine_system_usage(osub_engine_t *e, int32_t gpu, int64_t used_mib,
                                      int64_t now_ms);
OSUB_API int osub_engine_ready(osub_engine_t *e, const char *id, int64_t now_ms);
/* Acknowledges the outstanding directive; checkpoint (may be NULL) is remembered. */
OSUB_API int osub_engine_ack(osub_engine_t *e, const char *id, const char *checkpoint,
                             int64_t now_ms);
/* The service's processes are gone and its memory is free. */
OSUB_API int osub_engine_exited(osub_engine_t *e, const char *id, const char *checkpoint,
                                int64_t now_ms);
/* A managed service could not start or kept crashing: failed, holds nothing. */
OSUB_API int osub_engine_fail(osub_engine_t *e, const char *id, const char *why, int64_t now_ms);
OSUB_API int osub_engine_set_ratio(osub_engine_t *e, int32_t ratio_milli, int64_t now_ms);
OSUB_API int osub_engine_cordon(osub_engine_t *e, int32_t gpu, bool cordon, int64_t now_ms);
/* Evicts (with grace) every preemptible service on a cordoned GPU. */
OSUB_API int osub_engine_drain_gpu(osub_engine_t *e, int32_t gpu, int64_t now_ms);
OSUB_API int osub_engine_gpu_lost(osub_engine_t *e, int32_t gpu, int64_t now_ms);
/*
 * Suspend (DESIGN.md "Suspend: preemption without a reload"). The engine decides; the daemon's
 * mechanisms carry out and report:
 *   - a SUSPEND event (decision, a victim's or an operator's): run the service's suspend
 *     mechanism; when it is done and its memory is seen to fall, osub_engine_suspended() with
 *     what is still measured on its GPUs; when it fails, osub_engine_suspend_failed(). Not done
 *     within suspend_timeout_ms: the engine escalates to an eviction with grace (ESCALATE,
 *     reason suspend_timeout), as for an ignored degrade.
 *   - a WAKE event (decision): run its resume mechanism (restore + unlock, wake_up, ...); when
 *     its memory is back, osub_engine_resumed() (or osub_engine_ready()); when it fails,
 *     osub_engine_suspend_failed() (evicted with grace). Not reported within its resume cost,
 *     it is taken as resumed (a READY event), as a loading period ends.
 */
/* Operator or idle suspend (flags: OSUB_SUSPEND_IDLE for reason idle, else user): a running or
 * degraded suspendable service is told to suspend and stays suspended, held, until
 * osub_engine_resume(). Already suspending or suspended: it is held (0). Errors:
 * OSUB_ENOT_SUSPENDABLE (no method in its spec), OSUB_EBAD_STATE (not running or degraded, or a
 * degrade not yet acknowledged), OSUB_EHOST_FULL (its memory would exceed suspend_host_mib). */
#define OSUB_SUSPEND_IDLE 1u
OSUB_API int osub_engine_suspend(osub_engine_t *e, const char *id, unsigned flags, int64_t now_ms);
/* Lets a held suspended (or suspending) service come back: at once when its GPUs have room
 * (a WAKE event, reason user), else as soon as they do. Resuming already: 0. Other states:
 * OSUB_EBAD_STATE. */
OSUB_API int osub_engine_resume(osub_engine_t *e, const char *id, int64_t now_ms);
/* Report: the suspend of a suspending service is done; residual_mib (total, >= 0) is what is
 * still measured on its GPUs (a CUDA context, engine buffers): it holds that, keeps its logical
 * grant, and planning counts that residual for its next suspend. OSUB_EBAD_STATE when it is
 * not suspending. */
OSUB_API int osub_engine_suspended(osub_engine_t *e, const char *id, int64_t residual_mib,
                                   int64_t now_ms);
/* Report: its resume is done; it runs again (running, or degraded if it was). OSUB_EBAD_STATE
 * when it is not resuming. */
OSUB_API int osub_engine_resumed(osub_engine_t *e, const char *id, int64_t now_ms);
/* Report: its mechanism failed to suspend or to resume it (why may be NULL): evicted with its
 * grace (ESCALATE, reason suspend_failed). OSUB_EBAD_STATE when neither suspending nor
 * resuming. */
OSUB_API int osub_engine_suspend_failed(osub_engine_t *e, const char *id, const char *why,
                                        int64_t now_ms);
/* Periodic: timers, pressure, restores, queue. */
OSUB_API int osub_engine_tick(osub_engine_t *e, int64_t now_ms);

/* Events of the last command (owned by the engine; valid until the next command). */
OSUB_API const osub_event_t *osub_engine_events(const osub_engine_t *e, size_t *n_out);
/* Earliest time a timer is due (ack timeout, grace end, loading end), INT64_MAX if none. */
OSUB_API int64_t osub_engine_next_deadline(const osub_engine_t *e);

/* Queries (no state change). */
OSUB_API void osub_engine_config(const osub_engine_t *e, osub_pool_config_t *cfg);
OSUB_API const osub_class_t *osub_engine_classes(const osub_engine_t *e, size_t *n_out);
OSUB_API size_t osub_engine_gpu_count(const osub_engine_t *e);
OSUB_API int osub_engine_gpu_info(const osub_engine_t *e, int32_t gpu, osub_gpu_info_t *out);
OSUB_API void osub_engine_pool_info(const osub_engine_t *e, osub_pool_info_t *out);
/* Live (not released) services, in submit order. */
OSUB_API size_t osub_engine_service_count(const osub_engine_t *e);
OSUB_API const char *osub_engine_service_id(const osub_engine_t *e, size_t i);
OSUB_API int osub_engine_service_info(osub_engine_t *e, const char *id, osub_service_info_t *out);
/* The queue in service order: ids (owned by the engine), n written to *n_out. */
OSUB_API size_t osub_engine_queue_length(const osub_engine_t *e);
OSUB_API const char *osub_engine_queue_at(const osub_engine_t *e, size_t pos);

/*
 * Snapshots. osub_engine_save() writes the engine's whole state (configuration, classes,
 * GPUs with their placement history, every live service with its timers, the queue, the
 * counters) as versioned text (malloc'd, owned by the caller; NULL on out of memory).
 * osub_engine_load() rebuilds an engine from it that decides exactly as the saved one would:
 * the same commands at the same times give the same events. Errors: OSUB_EBAD_SNAPSHOT (with
 * the 1-based line in *err_line when not NULL), OSUB_ENOMEM. The daemon keeps its state as a
 * snapshot plus the commands since.
 */
OSUB_API char *osub_engine_save(const osub_engine_t *e);
OSUB_API int osub_engine_load(const char *text, osub_engine_t **out, size_t *err_line);

/* A full textual dump of the state (malloc'd, owned by the caller), for comparisons. */
OSUB_API char *osub_engine_dump(const osub_engine_t *e);
/* Checks DESIGN.md's state invariants (3, 4, 5; exclusive services included) and that no
 * service's share on a GPU exceeds that GPU's usable VRAM; for suspend: a suspended service
 * holds only its measured residual and keeps its logical grant, only preemptible suspendable
 * services are ever suspending, suspended or resuming, and the host memory counted for them
 * equals the sum of theirs and stays within suspend_host_mib. Returns 0, or OSUB_EINVAL with a
 * sentence in `why`. */
OSUB_API int osub_engine_check(const osub_engine_t *e, char *why, size_t why_len);

OSUB_API const char *osub_state_name(osub_state_t s);
OSUB_API const char *osub_event_name(osub_event_kind_t k);
OSUB_API const char *osub_reason_name(osub_reason_t r);
OSUB_API const char *osub_check_name(osub_check_t c);
/* Validates an id: 1-63 chars of [a-z0-9-] starting with a letter. */
OSUB_API bool osub_id_valid(const char *id);

#endif
