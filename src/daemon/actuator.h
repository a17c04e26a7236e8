/* actuator.h - makes services obey the engine: managed processes (spawn, signals, exits,
 * restarts, adoption after a restart), directives (long-poll and webhooks), per-service logs */
#ifndef OSUB_DAEMON_ACTUATOR_H
#define OSUB_DAEMON_ACTUATOR_H

#include <stdbool.h>
#include <stddef.h>

#include <event2/http.h>
#include <jansson.h>

#include <sys/types.h>

#include "idmap.h"
#include "oversub/engine.h"

#include "core.h"
#include "gpus.h"

struct osubd_act;
struct osubd_destinations;

/* Told of each directive the actuators post (the pods' evictions listen): id, the action
 * ("degrade", "restore", "evict", "resume"), its cause. */
typedef void (*osubd_directive_fn)(void *arg, const char *id, const char *action,
                                   const char *cause);

/*
 * Takes the actuation fields (command, env, workdir, user, checkpoint_dir, restart,
 * max_restarts, control_url) out of a submitted spec. *exec: a new object, or NULL when none
 * was given. Returns 0, or -1 with a sentence in err (the field and why), or
 * OSUBD_ACT_FORBIDDEN when it would run a program and the request may not: trusted says
 * whether it may (the Unix socket, or the admin token). pod_cut_mib: what the device plugin
 * can advertise when its list is cut (osubd_dp_cut_mib; -1: no cut): a pod past it is refused
 * (osubd_act_pod_fits).
 */
#define OSUBD_ACT_FORBIDDEN (-2)
/* The same, as a pure function of the rules it checks against (the fuzzer's way in): where
 * control_url may point (dest, NULL: anywhere), this node's name for a pod's record ("":
 * unchecked), whether a program may run as root. No pod capacity check. */
struct osubd_take_rules {
    const char *kube_node;
    bool allow_root_services;
    const struct osubd_destinations *dest;
    const char *cuda_unusable;     /* why suspend method cuda cannot be used here; NULL: it can */
    const char *relocate_unusable; /* why suspend.relocate cannot; NULL: it can */
};
int osubd_exec_take(const struct osubd_take_rules *r, json_t *spec, bool trusted, json_t **exec,
                    char *err, size_t errlen);
/* The extended resource pods ask for (the device plugin advertises it). */
#define OSUBD_DP_RESOURCE "oversub.io/vram-mib"
int osubd_act_take(const struct osubd_act *a, json_t *spec, bool trusted, int64_t pod_cut_mib,
                   json_t **exec, char *err, size_t errlen);

/* The suspend mechanisms the actuators run on SUSPEND and WAKE events (borrowed; set before
 * osubd_act_start), and the suspender's report back (its done callback, arg: the actuators). */
struct osubd_sus;
void osubd_act_set_suspender(struct osubd_act *a, struct osubd_sus *s);
void osubd_act_sus_done(void *arg, const char *id, bool resume, bool ok, const char *why);

/* The actuators' settings that can be checked before anything is touched (cuda_shim a
 * readable file, an absolute cgroup inside a cgroup v2 hierarchy): 0, or -1 with a sentence. */
struct osubd_config;
int osubd_act_check_config(const struct osubd_config *cfg, char *err, size_t errlen);

/* Makes the actuators (a subreaper, cgroups, the shim found): NULL with a sentence in err.
 * gpus and dest are borrowed for its lifetime. */
struct osubd_act *osubd_act_new(struct osubd_core *c, const struct osubd_gpus *gpus,
                                const struct osubd_destinations *dest, char *err, size_t errlen);
/* The actuators as the core's module "actuators": load reads what the last run saved (how
 * services run, their PIDs, their processes; a state that cannot be read is an error, never
 * "nothing saved"), save keeps them (service_exec, managed_procs, service_pids), events queue
 * the directives and signals that durable then sends, forget drops a gone service's PID and
 * directives, metrics. */
struct osubd_module osubd_act_module(struct osubd_act *a);
/* Who hears of each directive posted (one listener). */
void osubd_act_listen(struct osubd_act *a, osubd_directive_fn fn, void *arg);
/* Long-polls for directives whose client left before the answer. */
uint64_t osubd_act_waiters_gone(const struct osubd_act *a);

/* Starts the actuators once the loop and the writer run: adopts live processes, treats dead
 * ones as exited, starts what should run. Returns 0 or -1 with a sentence in err. */
int osubd_act_start(struct osubd_act *a, char *err, size_t errlen);
void osubd_act_free(struct osubd_act *a);

/* The events of the command just applied: the actuators act on them from the loop, once the
 * command is durable (never from inside osubd_apply). With n 0: a commit happened, act on what
 * waited for it. */
void osubd_act_events(struct osubd_act *a, const osub_event_t *ev, size_t n);

/* What a service's JSON shows of its actuation (never env's values): merged into o. */
void osubd_act_describe(struct osubd_act *a, const struct osubd_caller *who, const char *id,
                        json_t *o);

/* GET /v1/services/{id}/directives?wait=SECONDS&after=SEQ */
void osubd_act_directives(struct osubd_act *a, struct evhttp_request *req, const char *id,
                          const char *query);

/* The actuators' series for /metrics. */
struct evbuffer;
void osubd_act_metrics(struct osubd_act *a, struct evbuffer *b);

/* A submit the engine accepted: how the service runs (exec as osubd_act_take made it). */
int osubd_act_commit_exec(struct osubd_act *a, const char *id, json_t *exec);
/* A service's processes (at most max): its managed process and every other process of its
 * cgroup, or the PID an external service reported (POST .../ready {"pid"}). */
int osubd_act_service_pids(struct osubd_act *a, const char *id, pid_t *out, int max);
/* The monitor has read NVML (gpus' free memory): CUDA restores waiting for room are tried. */
void osubd_act_gpus_polled(struct osubd_act *a);
/* Whether its spec suspends it by a CUDA checkpoint. */
bool osubd_act_sus_is_cuda(struct osubd_act *a, const char *id);
/* The process whose GPU memory is the service's usage (POST .../ready {"pid"}, or its managed
 * process); 0 when none. The ids with one, copied (free()). */
int osubd_act_set_pid(struct osubd_act *a, const char *id, pid_t pid);
pid_t osubd_act_pid(const struct osubd_act *a, const char *id);
osubd__idmap_key_t *osubd_act_pid_ids(const struct osubd_act *a, size_t *n);
/* Whether a retry's exec is the live service's. */
bool osubd_act_exec_equal(const struct osubd_act *a, const char *id, const json_t *exec);
/* The pod a service is (the spec's "kubernetes" record: namespace, name, uid, node,
 * grace_seconds, containers), or NULL when it is no pod. Borrowed. */
const json_t *osubd_act_kube(const struct osubd_act *a, const char *id);
/* The ids of the services that are pods: a new array (NULL out of memory). */
json_t *osubd_act_pod_ids(const struct osubd_act *a);
/* Whether oversubd runs the service's program. */
bool osubd_act_managed(const struct osubd_act *a, const char *id);
/* Processes of the service using the CUDA shim now (its usage then comes from the shim). */
int osubd_act_shim_processes(struct osubd_act *a, const char *id);
/* The shim's counts read now into the services' usage (as the watch does every 200 ms): the
 * monitor reads them beside NVML's, so that memory NVML already shows is not taken for system
 * memory because the count had not been read yet. */
void osubd_act_shim_sync(struct osubd_act *a);
/* The service is gone from the engine: its PID and directives are forgotten (its process, if
 * oversubd runs one, is stopped and forgotten by the reconcile). */
void osubd_act_forget(struct osubd_act *a, const char *id);

/* ---- pods (device plugin) ---- */
/* The grant segment of a pod service (the device plugin mounts it into the pod's containers):
 * made at the first call (one device per GPU of its placement, as CUDA_VISIBLE_DEVICES numbers
 * them; mode 0666 under an unguessable name in the state's shim/ folder), or the one made
 * before oversubd restarted. While the service is pending (its victims still hold its memory)
 * the segment grants 0 on every GPU and is left unmapped, so the watch round does not write
 * the engine's grant into it; once the service runs, a call (or the sweep) maps it, writes its
 * grants at once, and the watch round then keeps its grants and reads its usage as for a
 * managed service. Its path is copied into path. 0, or -1 with a sentence in why (the service
 * is neither running nor pending, or has no placement the shim can grant). */
int osubd_act_pod_segment(struct osubd_act *a, const char *id, char *path, size_t pathlen,
                          char *why, size_t whylen);
/* liboversub-cuda.so's path ("" when services run without it). Borrowed. */
const char *osubd_act_shim_path(const struct osubd_act *a);
/* The shim as pods mount it: liboversub-cuda.so copied into the state's folder
 * (STATE_DIR/lib/liboversub-cuda.so, mode 0755; a temporary file renamed over it, only when
 * its content differs), since oversubd's own copy may be inside its container image where the
 * kubelet cannot see it. Its path into path ("" when services run without the shim). 0, or -1
 * with a sentence in why. */
int osubd_act_pod_shim(struct osubd_act *a, char *path, size_t pathlen, char *why, size_t whylen);
/* For osubd_act_take: a pod's spec (the submit's, without the exec fields) that would take the
 * pods' MiB on this node past what the device plugin advertises when its list is cut
 * (osubd_dp_cut_mib): -1 with the sentence in err. 0 otherwise (no plugin, no cut, it fits,
 * or a spec the submit refuses anyway). */
int osubd_act_pod_fits(const struct osubd_act *a, const json_t *spec, int64_t cut_mib, char *err,
                       size_t errlen);
/* Drops the segments of pods the engine no longer knows (in memory and on disk), and opens
 * again those of running pods made before oversubd restarted. */
void osubd_act_pods_sweep(struct osubd_act *a);
/* At exit, before osubd_act_free(): pods' segments are unmapped but kept on disk (running
 * containers have them mounted; the next oversubd opens them again). */
void osubd_act_pods_close(struct osubd_act *a);

#endif
