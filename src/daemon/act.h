/* act.h - the actuators' parts share this (actuator.h is the way in from outside): their state, a
 * managed process, and what the parts call of each other */
#ifndef OSUBD_ACT_H
#define OSUBD_ACT_H

#include "actuator.h"
#include "log.h"
#include "pod.h"

#include <linux/close_range.h>

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <sys/queue.h>

#include "conns.h"
#include "jsonmem.h"
#include "idmap.h"
#include "netpolicy.h"
#include "segment.h"
#include "sha256.h"

extern char **environ;

#define DIRECTIVES_KEPT 8
#define FAST_EXIT_MS 2000 /* a process that dies sooner "exits at once" */
#define WATCH_MS 200      /* adopted processes are checked this often */
#define HOOK_TIMEOUT_S 2  /* one webhook attempt */
#define HOOK_ATTEMPTS 4   /* then the directive waits for a long-poll */
#define MAX_ARGS 64
#define MAX_ENV 64

/* A managed service's process: the leader of its own process group (setsid). */
struct osub_proc {
    struct osub_proc *next;
    char id[OSUB_ID_MAX + 1];
    pid_t pid;                    /* 0: none now */
    unsigned long long starttime; /* /proc/PID/stat's starttime: a reused PID is not ours */
    bool child;                   /* ours to wait for; false when adopted after a restart */
    bool term_sent;
    bool failed;      /* gave up on it: no more starts until it is submitted again */
    int64_t grace_ms; /* its grace (spec, class or pool), kept for its release; 0: not known */
    int64_t spawned_unix_ms;
    int64_t kill_at_unix_ms; /* the grace end */
    int restarts;
    struct event *kill_ev;    /* SIGKILL to the group when the grace period ends */
    struct event *restart_ev; /* a restart waiting out its backoff */
    struct osub_segment seg;  /* its CUDA shim's grant segment (seg.s NULL: none) */
    char seg_path[700];
    uint64_t seg_reported[OSUB_SEG_DEVICES]; /* the usage last reported from it, MiB */
    bool seg_faulty; /* its segment said something impossible last look (said once an episode) */
    struct osubd_act *d;
};

/* The actuators' own state: nobody else reads or writes it (actuator.h is the way in). */
struct osubd_sus;

struct osubd_act {
    struct osubd_core *core;
    struct osubd_sus *sus; /* the suspend mechanisms (borrowed; NULL: none) */
    const struct osubd_config *cfg;
    struct event_base *base;
    osub_engine_t *e;
    const struct osubd_gpus *gpus;         /* each GPU's UUID (CUDA_VISIBLE_DEVICES) */
    const struct osubd_destinations *dest; /* where webhooks may connect */
    osubd_directive_fn on_directive;       /* told of each directive posted (pods) */
    void *on_directive_arg;
    uint64_t waiters_gone; /* long-polls whose client left before the answer */
    json_t *execs;         /* service id -> how to run it: the submitted fields, as osubd_act_take
                            * validated them (an exec is the user's document, shown back as given) */
    struct osubd__idmap *pids; /* service id -> struct act_pid: NVML's memory of that process */
    struct osubd__idmap *sus_falls;  /* service id -> struct act_sus_fall: a suspend its mechanism
                                      * says is done, until its memory is seen to fall */
    struct osubd__idmap *wake_waits; /* service id -> struct act_wake_wait: a CUDA restore held
                                      * until NVML shows its GPUs the room for it */
    json_t *saved_procs; /* the processes saved by the last run, until adopted at start */
    struct osubd__idmap *directives; /* service id -> struct act_ring (in memory) */
    bool dirty;                      /* execs, pids or processes changed since the last save */
    int64_t directive_seq;
    struct osub_proc *proc_list;
    struct act_waiter *act_waiters;
    struct act_item *act_q; /* events waiting for the actuators, each with its command's ticket */
    size_t act_n, act_cap;
    struct event *act_ev, *sigchld_ev, *watch_ev;
    char cg_base[600]; /* the cgroup v2 folder holding one folder per service; "" = subreaper */
    char cg_why[300];  /* why there is none */
    uint64_t proc_starts, proc_exits[3]; /* exits: code 0, other code, signal */
    uint64_t directives_sent[4];         /* degrade, restore, evict, resume */
    uint64_t webhook_failures;
    struct evdns_base *dns;   /* webhooks to host names, made when first needed */
    char shim_path[PATH_MAX]; /* liboversub-cuda.so, "" when services run without it */
};

/* A directive as posted: the service reads it back (long-poll) or gets it (webhook). */
struct act_directive {
    int64_t seq;
    char action[8]; /* degrade, restore, evict, resume */
    char service[OSUB_ID_MAX + 1];
    int64_t vram_mib;
    int32_t batch_size;
    osub_reason_t reason;
    char message[OSUB_EVENT_MSG_MAX + 1];
    int64_t deadline_unix_ms;  /* 0: none */
    char checkpoint[128];      /* the checkpoint it resumes from ("": none) */
    char checkpoint_dir[1024]; /* a managed service's checkpoint folder ("": not managed) */
};

/* A service's last DIRECTIVES_KEPT directives, a ring (act_directives.c). */
struct act_ring {
    struct act_directive dir[DIRECTIVES_KEPT];
    size_t first, n;
};

struct act_pid {
    pid_t pid;
};

/* A suspend the mechanism says is done, waiting for the memory to be seen to fall. */
struct act_sus_fall {
    int64_t before_mib; /* measured when the suspend began (-1: nothing measured then) */
    bool cuda;          /* a checkpoint: the shim's count does not fall (the addresses stay) */
    bool done;          /* its mechanism said so: from then on the fall is looked for */
    bool said;          /* "still holds N MiB" logged once */
};

/* A restore waiting for NVML to show the room its checkpoint needs (a restore that runs out of
 * memory cannot be undone: the driver leaves the process broken). */
struct act_wake_wait {
    int64_t until_ms;   /* the engine's clock: past it, the wake fails */
    int32_t reloc_from; /* relocated: the GPU it was checkpointed on (-1: none) */
    bool said;          /* the wait said as an event once */
};

struct act_waiter {
    struct act_waiter *next;
    struct osubd_act *d;
    struct evhttp_request *req;
    char id[OSUB_ID_MAX + 1];
    int64_t after;
    struct event *timer;
    struct osubd_client_watch watch; /* freed at once when the client leaves */
};

struct osub_proc *osubd__act_proc_find(struct osubd_act *d, const char *id);

struct osub_proc *osubd__act_proc_get(struct osubd_act *d, const char *id);

void osubd__act_proc_drop(struct osubd_act *d, struct osub_proc *p);

unsigned long long osubd__act_proc_starttime(pid_t pid);

void osubd__act_state_dir(const struct osubd_act *d, char *out, size_t len);

void osubd__act_log_path(const struct osubd_act *d, const char *id, char *out, size_t len);

void osubd__act_checkpoint_dir(const struct osubd_act *d, const char *id, char *out, size_t len);

int osubd__act_mkdirs(const char *path, mode_t mode);

int osubd__act_service_dir(const char *path, uid_t uid, gid_t gid, bool give, char *why,
                           size_t len);

int osubd__act_child_dir(const char *path);

void osubd__act_save_proc(struct osubd_act *d, struct osub_proc *p);

void osubd__act_apply(struct osubd_act *d, json_t *cmd);
/* act_suspend.c: a suspend (resume false) or wake run by the service's mechanism; the ones under
 * way when oversubd stopped, again; why cuda cannot be used (NULL: it can) */
void osubd__act_suspend_start(struct osubd_act *d, const char *id, bool resume, int64_t timeout_ms);
void osubd__act_suspend_restart(struct osubd_act *d);
/* The service's processes: its cgroup's, or without one the subreaper's sweep from its leader
 * (as signals reach them). At most max; -1 when its cgroup cannot be read. */
int osubd__act_service_procs(const struct osubd_act *d, const char *id, pid_t leader, pid_t *out,
                             int max);
/* Every watch round: suspends whose memory was waited for, seen to fall now, are reported. */
void osubd__act_sus_falls(struct osubd_act *d);
/* Whether the service is suspended by a CUDA checkpoint. */
bool osubd__act_sus_cuda(struct osubd_act *d, const char *id);
const char *osubd__act_cuda_unusable(const struct osubd_act *d, char *why, size_t whylen);
const char *osubd__act_relocate_unusable(const struct osubd_act *d, char *why, size_t whylen);
/* The monitor polled NVML: restores waiting for room are tried again. */
void osubd__act_wake_waits(struct osubd_act *d);

void osubd__act_apply_fail(struct osubd_act *d, struct osub_proc *p, const char *why);

bool osubd__act_live_state(osub_state_t s);
/* suspending, suspended, resuming: its processes live on, and are left alone */
bool osubd__act_suspend_state(osub_state_t s);

bool osubd__act_draining_state(osub_state_t s);

void osubd__act_cg_setup(struct osubd_act *d);

void osubd__act_cg_path(const struct osubd_act *d, const char *id, char *out, size_t len);

int osubd__act_cg_pids(const struct osubd_act *d, const char *id, pid_t *out, int max);

void osubd__act_signal_service(struct osubd_act *d, const char *id, pid_t leader, int sig);

void osubd__act_cg_remove(struct osubd_act *d, const char *id);

void osubd__act_terminate(struct osubd_act *d, struct osub_proc *p, int64_t deadline_unix_ms,
                          const char *why);

void osubd__act_spawn(struct osubd_act *d, struct osub_proc *p, const osub_service_info_t *si);

void osubd__act_waiter_free(struct osubd_act *d, struct act_waiter *w);

void osubd__act_post_directive(struct osubd_act *d, const osub_event_t *ev, const char *action);

void osubd__act_exited_cmd(struct osubd_act *d, const char *id);

void osubd__act_on_exit_of(struct osubd_act *d, struct osub_proc *p, int status, const char *how);

void osubd__act_on_sigchld(evutil_socket_t fd, short what, void *arg);

void osubd__act_rotate_log(struct osubd_act *d, const char *id);

void osubd__act_on_sigbus(int sig, siginfo_t *info, void *ctx);

bool osubd__act_seg_look(struct osubd_act *d, struct osub_proc *p, const osub_service_info_t *si,
                         struct osub_seg_view *v);

int osubd__act_seg_open_guarded(struct osub_segment *g, const char *path, char *err, size_t errlen);
void osubd__act_shim_adopt(struct osubd_act *d, struct osub_proc *p);

bool osubd__act_seg_zero_guarded(struct osub_segment *g);

uint64_t osubd__act_to_mib(uint64_t bytes);

void osubd__act_on_watch(evutil_socket_t fd, short what, void *arg);

void osubd__act_reconcile(struct osubd_act *d);

#endif
