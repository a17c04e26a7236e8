/* trace.h - usage traces for simulate/advise: per-service specs and usage time series */
#ifndef OSUB_CLI_TRACE_H
#define OSUB_CLI_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "oversub/engine.h"

/* 16 bytes: a week of minutes for 1,000 services is 10 million of these */
struct sample {
    int64_t t_s;
    int32_t vram_mib;    /* up to 2 PiB */
    int16_t compute_pct; /* -1 unknown */
};

struct trace_svc {
    osub_spec_t spec;
    struct sample *samples; /* sorted by time */
    size_t n, cap;
    int64_t peak_mib;
};

struct trace {
    struct trace_svc *svcs;
    size_t n, cap;
    int64_t t0, t1; /* first and last sample time, s */
    int64_t step_s; /* the most common gap between a service's samples */
};

/* How --genai turns pods into services. */
struct genai_opts {
    int32_t buffer_milli; /* request = peak x (1000 + buffer) / 1000, rounded up (300) */
    int32_t floor_pct;    /* floor = this percentile of the pod's usage (50) */
    int32_t classes[3];   /* online:batch:experiment percentages (20:40:40) */
    /* a part of the pods: keep those whose FNV-1a 64 of "split:" + pod id modulo parts is
     * part (parts 0: every pod) -- a tuning half and a held-back half */
    int32_t part, parts;
    /* a time window, seconds from the trace's first sample: [from_s, to_s), when window */
    bool window;
    int64_t from_s, to_s;
};

void genai_opts_default(struct genai_opts *o);

/* Imports a folder laid out like ../shared/traces/. Writes warnings (skipped pods) to stderr.
 * Errors name the file and line in err. Returns 0 or -1. The trace is owned by the caller
 * (trace_free). */
int trace_import_genai(const char *dir, const struct genai_opts *o, struct trace *tr, char *err,
                       size_t errlen);

/* Imports a services file (JSON, or YAML when it ends in .yaml/.yml) and a usage CSV
 * (timestamp_s,service,vram_mib[,compute_pct]). */
int trace_import_files(const char *services, const char *usage, struct trace *tr, char *err,
                       size_t errlen);

/* Total samples. */
size_t trace_samples(const struct trace *tr);
void trace_free(struct trace *tr);

/* FNV-1a 64 of s. */
uint64_t fnv1a64(const char *s);

/* Progress of long imports and replays: once one has run 3 s, a line every 5 s on the file set
 * here, and at the end of a replay that said any, one with its rate and the peak RSS. NULL
 * (the default): nothing is said. f is borrowed; not thread-safe (the CLI sets it once). */
void trace_set_progress(FILE *f);
FILE *progress_file(void);

struct progress {
    double t0, next; /* s, CLOCK_MONOTONIC */
    bool said;       /* a line was printed */
};

void progress_begin(struct progress *p);
/* True when a line is due (it reads the clock: call it every so many rows or steps). */
bool progress_due(struct progress *p);
double progress_elapsed(const struct progress *p);
/* The process's peak resident memory so far, MiB. */
double peak_rss_mib(void);

#endif
