/* suspender.h - the suspend mechanisms (issue 25; DESIGN.md "Suspend"): how a service's GPU
 * memory is sent to the host and brought back without a reload. One interface, four methods:
 *   cuda    the CUDA driver's process checkpoint API, loaded with dlopen, applied to every
 *           process of the service that holds a CUDA context (lock, checkpoint; to resume,
 *           restore, unlock), off the event loop (a checkpoint of 40 GiB takes seconds)
 *   vllm    POST URL/sleep?level=1&mode=wait (the requests in flight finish first: vLLM's
 *           default, abort, would cut them off with a 200), then GET URL/is_sleeping must say
 *           true; POST URL/wake_up, then GET URL/is_sleeping must say false (vLLM with
 *           --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1; a vLLM older than mode= ignores it)
 *   sglang  POST URL/pause_generation, POST URL/release_memory_occupation; to resume, POST
 *           URL/resume_memory_occupation, POST URL/continue_generation (--enable-memory-saver,
 *           --enable-weights-cpu-backup)
 *   http    POST URL+suspend, POST URL+resume (any 2xx is done)
 * An operation ends once, with ok or a sentence (what failed, in the mechanism's words); the
 * memory seen to fall is the caller's to check (NVML or the shim's count). */
#ifndef OSUBD_SUSPENDER_H
#define OSUBD_SUSPENDER_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include <jansson.h>

#define OSUBD_SUS_URL_MAX 255
#define OSUBD_SUS_PATH_MAX 127
#define OSUBD_SUS_PIDS_MAX 64
#define OSUBD_SUS_REMAP_MAX 64 /* GPUs a remapping restore names (a machine's, as NVML's) */

enum osubd_sus_method {
    OSUBD_SUS_NONE = 0,
    OSUBD_SUS_CUDA,
    OSUBD_SUS_VLLM,
    OSUBD_SUS_SGLANG,
    OSUBD_SUS_HTTP,
};

struct osubd_sus_spec {
    enum osubd_sus_method method;
    char url[OSUBD_SUS_URL_MAX + 1]; /* vllm, sglang, http: http://HOST:PORT[/PREFIX] */
    char suspend_path[OSUBD_SUS_PATH_MAX + 1], resume_path[OSUBD_SUS_PATH_MAX + 1]; /* http */
    /* cuda, a resume onto other GPUs (the engine's relocate): the driver's remap, each pair the
     * 16 bytes of an old GPU's UUID and of the new one, every GPU the process sees named; 0:
     * restored where it was taken. Not part of the spec's JSON: set for one resume */
    int n_remap;
    unsigned char remap[OSUBD_SUS_REMAP_MAX][2][16];
};

const char *osubd_sus_method_name(enum osubd_sus_method m);

struct osubd_destinations;
/* A spec's "suspend" value ({"method": "cuda"}, {"method": "vllm", "url": U}, ...; unknown
 * fields refused) into out. dest: where url may point (NULL: anywhere, for a spec already in
 * the state). 0, or -1 with a sentence naming the field. */
int osubd_sus_parse(const json_t *v, const struct osubd_destinations *dest,
                    struct osubd_sus_spec *out, char *err, size_t errlen);
/* The spec as osubd_sus_parse reads it (new reference, NULL on out of memory). */
json_t *osubd_sus_spec_json(const struct osubd_sus_spec *s);

struct event_base;
struct osubd_sus;

/* An operation ended: ok, or why (a sentence). Called on the loop, once per started one. */
typedef void (*osubd_sus_done_fn)(void *arg, const char *id, bool resume, bool ok, const char *why);

/* cuda_lib: the CUDA driver to load for the cuda method ("" : libcuda.so.1), loaded when first
 * asked for. */
struct osubd_sus *osubd_sus_new(struct event_base *base, const char *cuda_lib,
                                osubd_sus_done_fn done, void *arg);
/* Waits for the CUDA operations under way (a lock has its timeout), then frees; an HTTP one
 * under way is dropped unanswered. */
void osubd_sus_free(struct osubd_sus *s);

/* Whether the cuda method can be used: the driver loads and has the checkpoint API (driver
 * 550+); false with a sentence. */
bool osubd_sus_cuda_ok(struct osubd_sus *s, char *why, size_t whylen);
/* Whether a cuda restore can remap GPUs (suspend.relocate): the method usable and the driver
 * CUDA 13.0 (580) or later; false with a sentence. */
bool osubd_sus_cuda_remap_ok(struct osubd_sus *s, char *why, size_t whylen);
/* An NVML UUID ("GPU-8f4022ba-e0cb-1298-286e-225c953a7feb") as the driver's 16 bytes; -1 when it
 * is not one. */
int osubd_sus_uuid_bytes(const char *uuid, unsigned char out[16]);

/* Starts suspending (resume false) or resuming service id (copied) by spec; pids: its
 * processes (the cuda method; copied). The operation fails past timeout_ms. 0, or -1 with a
 * sentence (one under way for id already, no process, the method unusable): done is then not
 * called. */
int osubd_sus_start(struct osubd_sus *s, const char *id, bool resume,
                    const struct osubd_sus_spec *spec, const pid_t *pids, int npids, int timeout_ms,
                    char *err, size_t errlen);
bool osubd_sus_busy(const struct osubd_sus *s, const char *id);
/* Whether what is under way for it is a suspend (false: a wake, or nothing). */
bool osubd_sus_busy_suspending(const struct osubd_sus *s, const char *id);
/* The service is gone: its operation under way is dropped, done never called for it (a CUDA
 * worker in the driver finishes on its own), so that a new service of the same id starts
 * afresh. */
void osubd_sus_cancel(struct osubd_sus *s, const char *id);

#endif
