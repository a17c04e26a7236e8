/* sus.h - the suspend mechanisms' own header, shared by suspender.c (the jobs, the HTTP
 * methods) and sus_cuda.c (the CUDA driver's checkpoint API on a worker thread). Not for other
 * modules (scripts/check-layers.py). */
#ifndef OSUBD_SUS_H
#define OSUBD_SUS_H

#include "suspender.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "oversub/engine.h"

struct event;
struct evdns_base;
struct osubd_httpc;
struct osubd__sus_cuda;

struct sus_job {
    struct osubd_sus *s;
    struct sus_job *next;
    char id[OSUB_ID_MAX + 1];
    bool resume;
    struct osubd_sus_spec spec;
    int64_t deadline_ms; /* CLOCK_MONOTONIC */
    struct event *timer; /* the deadline */
    bool reported;       /* done was called (the job lives on until its call returns) */
    /* HTTP: the step under way, a request in flight */
    int step;
    bool inflight;
    struct osubd_httpc *call; /* while inflight */
    /* cuda: the worker and what it found */
    pid_t pids[OSUBD_SUS_PIDS_MAX];
    int npids;
    pthread_t thread;
    bool has_thread;
    struct osubd__sus_cuda *cuda; /* the worker's own copies: it may outlive s (a hung lock) */
    int wake_fd;
    _Atomic bool finished;
    bool ok;
    char why[400];
};

struct osubd_sus {
    struct event_base *base;
    struct evdns_base *dns;
    osubd_sus_done_fn done;
    void *arg;
    struct sus_job *jobs;
    char cuda_lib[512];
    struct osubd__sus_cuda *cuda; /* loaded when first asked for */
    bool cuda_tried;
    char cuda_why[300];
    int wake[2];           /* the workers' pipe: a byte when a job finished */
    bool hung;             /* a worker was left running at free: the driver and pipe kept */
    struct event *wake_ev; /* its reading end on the loop */
};

int64_t osubd__sus_now_ms(void);
/* Ends a job: done called once (unless reported already), the job freed when nothing of it
 * is under way. */
void osubd__sus_finish(struct sus_job *j, bool ok, const char *why);

/* sus_cuda.c: the driver loaded (NULL with why); the job's operation started on a thread that
 * fills j->ok and j->why, sets j->finished and writes a byte to s->wake[1] (0, or -1 with
 * why). */
struct osubd__sus_cuda *osubd__sus_cuda_load(const char *lib, char *why, size_t whylen);
void osubd__sus_cuda_unload(struct osubd__sus_cuda *c);
/* cuDriverGetVersion's answer (12080: CUDA 12.8), 0 when it has none */
int osubd__sus_cuda_version(const struct osubd__sus_cuda *c);
int osubd__sus_cuda_start(struct osubd_sus *s, struct sus_job *j, char *why, size_t whylen);

#endif
